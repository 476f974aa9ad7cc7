/* test_tls.c - io/tls.c on its own: a listener's server sessions against a
 * GnuTLS client in the same thread, over a non-blocking socketpair, with
 * certificates this test makes itself (GnuTLS's API, ECDSA P-256, into a
 * temporary directory: offline, nothing expires). Handshakes, a wrong CA on
 * either side, client certificates asked for and required, record I/O over
 * a transport that gives one byte per call and EAGAIN every other call (as
 * io/conn.c drives it: a send cut by EAGAIN is finished with (NULL, 0)), a
 * record larger than the reader's buffer, close_notify, reloads, and the
 * limits tls.c enforces, at the limit and one past it. */
#define _GNU_SOURCE /* strchrnul */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <gnutls/x509.h>

#include "../../io/tls.h"
#include "tempdir.h"

static char dir[40];

/* ---- certificates ----------------------------------------------------- */

struct issued {
    gnutls_x509_crt_t crt;
    gnutls_x509_privkey_t key;
};

/* dir/name as a path (a static ring of 4). */
static const char *path_of(const char *name)
{
    static char paths[4][128];
    static int next;
    char *p = paths[next++ % 4];
    snprintf(p, sizeof paths[0], "%s/%s", dir, name);
    return p;
}

static void write_datum(const char *name, const gnutls_datum_t *d)
{
    FILE *f = fopen(path_of(name), "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(d->data, 1, d->size, f), d->size);
    fclose(f);
}

/* A certificate for cn signed by issuer (NULL: self-signed CA), written as
 * name.crt and name.key. dns: DNS subjectAltNames, comma-separated (NULL:
 * none); extra_sans:
 * that many more DNS names "sanNN.example". */
static struct issued issue(const char *name, const char *cn, const struct issued *issuer, const char *dns,
                           int extra_sans)
{
    static unsigned serial = 1;
    struct issued out;
    assert_int_equal(gnutls_x509_privkey_init(&out.key), 0);
    assert_int_equal(gnutls_x509_privkey_generate(out.key, GNUTLS_PK_ECDSA,
                                                  GNUTLS_CURVE_TO_BITS(GNUTLS_ECC_CURVE_SECP256R1), 0), 0);
    assert_int_equal(gnutls_x509_crt_init(&out.crt), 0);
    gnutls_x509_crt_t c = out.crt;
    unsigned char sn[4] = {0, 0, (unsigned char)(serial >> 8), (unsigned char)serial};
    serial++;
    time_t now = time(NULL);
    assert_int_equal(gnutls_x509_crt_set_version(c, 3), 0);
    assert_int_equal(gnutls_x509_crt_set_serial(c, sn, sizeof sn), 0);
    assert_int_equal(gnutls_x509_crt_set_activation_time(c, now - 3600), 0);
    assert_int_equal(gnutls_x509_crt_set_expiration_time(c, now + 86400), 0);
    assert_int_equal(gnutls_x509_crt_set_dn_by_oid(c, GNUTLS_OID_X520_COMMON_NAME, 0, cn, strlen(cn)), 0);
    assert_int_equal(gnutls_x509_crt_set_key(c, out.key), 0);
    assert_int_equal(gnutls_x509_crt_set_basic_constraints(c, issuer == NULL, -1), 0);
    assert_int_equal(gnutls_x509_crt_set_key_usage(c, issuer ? GNUTLS_KEY_DIGITAL_SIGNATURE
                                                            : GNUTLS_KEY_KEY_CERT_SIGN | GNUTLS_KEY_CRL_SIGN), 0);
    for (const char *d = dns, *end; d && *d; d = *end ? end + 1 : end) {
        end = strchrnul(d, ',');
        assert_int_equal(gnutls_x509_crt_set_subject_alt_name(c, GNUTLS_SAN_DNSNAME, d, (unsigned)(end - d),
                                                              GNUTLS_FSAN_APPEND), 0);
    }
    for (int i = 0; i < extra_sans; i++) {
        char san[32];
        int n = snprintf(san, sizeof san, "san%02d.example", i);
        assert_int_equal(gnutls_x509_crt_set_subject_alt_name(c, GNUTLS_SAN_DNSNAME, san, (unsigned)n,
                                                              GNUTLS_FSAN_APPEND), 0);
    }
    if (issuer)
        assert_int_equal(gnutls_x509_crt_sign2(c, issuer->crt, issuer->key, GNUTLS_DIG_SHA256, 0), 0);
    else
        assert_int_equal(gnutls_x509_crt_sign2(c, c, out.key, GNUTLS_DIG_SHA256, 0), 0);
    char file[64];
    gnutls_datum_t d;
    assert_int_equal(gnutls_x509_crt_export2(c, GNUTLS_X509_FMT_PEM, &d), 0);
    snprintf(file, sizeof file, "%s.crt", name);
    write_datum(file, &d);
    gnutls_free(d.data);
    assert_int_equal(gnutls_x509_privkey_export2(out.key, GNUTLS_X509_FMT_PEM, &d), 0);
    snprintf(file, sizeof file, "%s.key", name);
    write_datum(file, &d);
    gnutls_free(d.data);
    return out;
}

static void issued_free(struct issued *i)
{
    gnutls_x509_crt_deinit(i->crt);
    gnutls_x509_privkey_deinit(i->key);
}

/* The whole text of dir/name into a malloc'd buffer (*len its size). */
static char *slurp(const char *name, size_t *len)
{
    FILE *f = fopen(path_of(name), "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)n + 1);
    assert_non_null(text);
    assert_int_equal(fread(text, 1, (size_t)n, f), (size_t)n);
    text[n] = 0;
    fclose(f);
    *len = (size_t)n;
    return text;
}

/* dir/to = dir/from with a comment block in front so that it is `size`
 * bytes long (PEM parsers skip text outside the markers). */
static void pad_to(const char *from, const char *to, size_t size)
{
    size_t len;
    char *text = slurp(from, &len);
    assert_true(size >= len + 1);
    FILE *f = fopen(path_of(to), "wb");
    assert_non_null(f);
    for (size_t i = 0; i < size - len - 1; i++) fputc(i % 64 == 63 ? '\n' : 'x', f);
    fputc('\n', f);
    fwrite(text, 1, len, f);
    fclose(f);
    free(text);
}

/* dir/to = dir/first followed by `copies` copies of dir/then. */
static void chain_of(const char *first, const char *then, int copies, const char *to)
{
    size_t a_len, b_len;
    char *a = slurp(first, &a_len), *b = slurp(then, &b_len);
    FILE *f = fopen(path_of(to), "wb");
    assert_non_null(f);
    fwrite(a, 1, a_len, f);
    for (int i = 0; i < copies; i++) fwrite(b, 1, b_len, f);
    fclose(f);
    free(a);
    free(b);
}

static int setup_files(void **state)
{
    (void)state;
    tempdir_make(dir, sizeof dir, "tls");
    struct issued ca = issue("ca", "test CA", NULL, NULL, 0);
    struct issued other = issue("other-ca", "other CA", NULL, NULL, 0);
    struct issued server = issue("server", "server one", &ca, "localhost", 0);
    struct issued server2 = issue("server2", "server two", &ca, "localhost", 0);
    struct issued alice = issue("alice", "alice", &ca, NULL, 0);
    struct issued mallory = issue("mallory", "mallory", &other, NULL, 0);
    struct issued many = issue("many", "many", &ca, NULL, TLS_IDENTITY_MAX + 4);
    /* names of 255 bytes with "dns:" (the most that fits) and of 256 */
    char long_names[2 * TLS_IDENTITY_NAME_MAX];
    memset(long_names, 'a', sizeof long_names);
    size_t fits = TLS_IDENTITY_NAME_MAX - 1 - strlen("dns:");
    long_names[fits] = ',';
    long_names[2 * fits + 2] = 0;
    memcpy(long_names + fits + 1, "b", 1);
    struct issued longest = issue("longest", "longest", &ca, long_names, 0);
    issued_free(&longest);
    issued_free(&ca);
    issued_free(&other);
    issued_free(&server);
    issued_free(&server2);
    issued_free(&alice);
    issued_free(&mallory);
    issued_free(&many);
    return 0;
}

static int teardown_files(void **state)
{
    (void)state;
    tempdir_remove(dir);
    return 0;
}

/* ---- a server session of tls.c against a GnuTLS client ------------------- */

/* A transport that gives at most one byte per call, and EAGAIN every
 * other call (io/conn.c's non-blocking socket at its worst). */
struct trickle {
    gnutls_session_t session;
    int fd;
    unsigned calls;
};

static ssize_t trickle_push(gnutls_transport_ptr_t p, const void *data, size_t len)
{
    struct trickle *t = p;
    if (t->calls++ % 2 == 0 || len == 0) {
        gnutls_transport_set_errno(t->session, EAGAIN);
        return -1;
    }
    ssize_t n = send(t->fd, data, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) gnutls_transport_set_errno(t->session, errno);
    return n;
}

static ssize_t trickle_pull(gnutls_transport_ptr_t p, void *data, size_t len)
{
    struct trickle *t = p;
    if (t->calls++ % 2 == 0 || len == 0) {
        gnutls_transport_set_errno(t->session, EAGAIN);
        return -1;
    }
    ssize_t n = recv(t->fd, data, 1, MSG_DONTWAIT);
    if (n < 0) gnutls_transport_set_errno(t->session, errno);
    return n;
}

struct pair {
    int fds[2];                  /* [0] the server's end, [1] the client's */
    gnutls_session_t server, client;
    gnutls_certificate_credentials_t client_cred;
    struct trickle trickle;
    int server_rc, client_rc;    /* the handshakes' results */
};

/* A server session of l and a client session trusting ca_file (and
 * presenting name.crt/.key when client_cert is not NULL), over a
 * socketpair; trickle: the server's side goes a byte at a time. */
static void pair_open(struct pair *p, struct tls_listener *l, const char *ca_file, const char *client_cert,
                      int trickle)
{
    memset(p, 0, sizeof *p);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, p->fds), 0);
    assert_int_equal(tls_listener_session_new(l, &p->server), 0);
    if (trickle) {
        p->trickle = (struct trickle){p->server, p->fds[0], 0};
        gnutls_transport_set_ptr(p->server, &p->trickle);
        gnutls_transport_set_push_function(p->server, trickle_push);
        gnutls_transport_set_pull_function(p->server, trickle_pull);
    } else {
        gnutls_transport_set_int(p->server, p->fds[0]);
    }
    assert_int_equal(gnutls_certificate_allocate_credentials(&p->client_cred), 0);
    assert_true(gnutls_certificate_set_x509_trust_file(p->client_cred, path_of(ca_file), GNUTLS_X509_FMT_PEM) > 0);
    if (client_cert) {
        char crt[64], key[64];
        snprintf(crt, sizeof crt, "%s.crt", client_cert);
        snprintf(key, sizeof key, "%s.key", client_cert);
        const char *crt_path = path_of(crt), *key_path = path_of(key);
        assert_int_equal(gnutls_certificate_set_x509_key_file(p->client_cred, crt_path, key_path,
                                                              GNUTLS_X509_FMT_PEM), 0);
    }
    assert_int_equal(gnutls_init(&p->client, GNUTLS_CLIENT | GNUTLS_NONBLOCK | GNUTLS_NO_SIGNAL), 0);
    assert_int_equal(gnutls_set_default_priority(p->client), 0);
    assert_int_equal(gnutls_credentials_set(p->client, GNUTLS_CRD_CERTIFICATE, p->client_cred), 0);
    assert_int_equal(gnutls_server_name_set(p->client, GNUTLS_NAME_DNS, "localhost", 9), 0);
    gnutls_session_set_verify_cert(p->client, "localhost", 0);
    gnutls_transport_set_int(p->client, p->fds[1]);
}

static void pair_close(struct pair *p)
{
    gnutls_deinit(p->server);
    gnutls_deinit(p->client);
    gnutls_certificate_free_credentials(p->client_cred);
    close(p->fds[0]);
    close(p->fds[1]);
}

/* Step a non-blocking handshake: 1 while it is under way, else its end
 * (0, or a fatal GnuTLS error) in *rc. */
static int handshake_step(gnutls_session_t s, int *rc)
{
    if (*rc != GNUTLS_E_AGAIN) return 0;
    int r = gnutls_handshake(s);
    if (r == GNUTLS_E_INTERRUPTED || (r < 0 && r != GNUTLS_E_AGAIN && !gnutls_error_is_fatal(r))) r = GNUTLS_E_AGAIN;
    *rc = r;
    return r == GNUTLS_E_AGAIN;
}

/* Both sides take turns until both are done or one has failed; the other
 * side then sees the socket end (as at a real close). */
static void pair_handshake(struct pair *p)
{
    p->server_rc = p->client_rc = GNUTLS_E_AGAIN;
    for (int turn = 0; turn < 100000; turn++) {
        int server_busy = handshake_step(p->server, &p->server_rc);
        int client_busy = handshake_step(p->client, &p->client_rc);
        if (p->server_rc < 0 && p->server_rc != GNUTLS_E_AGAIN) shutdown(p->fds[0], SHUT_RDWR);
        if (p->client_rc < 0 && p->client_rc != GNUTLS_E_AGAIN) shutdown(p->fds[1], SHUT_RDWR);
        if (!server_busy && !client_busy) return;
    }
    fail_msg("the handshake did not end");
}

static struct tls_listener *listener(const char *cert, const char *key, const char *ca, int verify_client)
{
    char c[64], k[64], a[64];
    snprintf(c, sizeof c, "%s", path_of(cert));
    snprintf(k, sizeof k, "%s", path_of(key));
    if (ca) snprintf(a, sizeof a, "%s", path_of(ca));
    struct tls_files f = {c, k, ca ? a : NULL, NULL, verify_client};
    struct tls_listener *l;
    char err[256] = "";
    int rc = tls_listener_new(&l, &f, err, sizeof err);
    if (rc != 0) fail_msg("tls_listener_new: %s", err);
    return l;
}

/* The common name of the certificate the client was shown. */
static void server_cn(gnutls_session_t client, char *out, size_t size)
{
    unsigned n = 0;
    const gnutls_datum_t *peers = gnutls_certificate_get_peers(client, &n);
    assert_non_null(peers);
    gnutls_x509_crt_t crt;
    assert_int_equal(gnutls_x509_crt_init(&crt), 0);
    assert_int_equal(gnutls_x509_crt_import(crt, &peers[0], GNUTLS_X509_FMT_DER), 0);
    assert_int_equal(gnutls_x509_crt_get_dn_by_oid(crt, GNUTLS_OID_X520_COMMON_NAME, 0, 0, out, &size), 0);
    gnutls_x509_crt_deinit(crt);
}

/* Send all of data[0..len) from s, as io/conn.c does: after GNUTLS_E_AGAIN
 * the same record is finished with (NULL, 0); `other` (may be NULL) reads
 * meanwhile into sink so that the socket never fills. */
static void send_all(gnutls_session_t s, const char *data, size_t len, gnutls_session_t other, char *sink,
                     size_t *sunk)
{
    int resend = 0;
    size_t sent = 0;
    for (int turn = 0; sent < len && turn < 10000000; turn++) {
        ssize_t n = resend ? gnutls_record_send(s, NULL, 0) : gnutls_record_send(s, data + sent, len - sent);
        resend = n == GNUTLS_E_AGAIN || n == GNUTLS_E_INTERRUPTED;
        if (n > 0) sent += (size_t)n;
        else if (!resend) fail_msg("gnutls_record_send: %s", gnutls_strerror((int)n));
        if (other) {
            ssize_t r = gnutls_record_recv(other, sink + *sunk, 65536);
            if (r > 0) *sunk += (size_t)r;
        }
    }
    assert_int_equal(sent, len);
}

/* Receive from s until `want` bytes are in out (at most chunk per call). */
static void recv_all(gnutls_session_t s, char *out, size_t want, size_t *got, size_t chunk)
{
    for (int turn = 0; *got < want && turn < 10000000; turn++) {
        ssize_t n = gnutls_record_recv(s, out + *got, chunk);
        if (n > 0) *got += (size_t)n;
        else if (n != GNUTLS_E_AGAIN && n != GNUTLS_E_INTERRUPTED)
            fail_msg("gnutls_record_recv: %s", n == 0 ? "end of stream" : gnutls_strerror((int)n));
    }
    assert_int_equal(*got, want);
}

/* One short request and its reply through an open pair. */
static void exchange(struct pair *p, const char *request, const char *reply)
{
    char buf[256];
    size_t got = 0;
    send_all(p->client, request, strlen(request), NULL, NULL, NULL);
    recv_all(p->server, buf, strlen(request), &got, sizeof buf);
    assert_memory_equal(buf, request, strlen(request));
    send_all(p->server, reply, strlen(reply), NULL, NULL, NULL);
    got = 0;
    recv_all(p->client, buf, strlen(reply), &got, sizeof buf);
    assert_memory_equal(buf, reply, strlen(reply));
}

/* ---- handshakes --------------------------------------------------------- */

static void test_handshake_and_records(void **state)
{
    (void)state;
    struct tls_listener *l = listener("server.crt", "server.key", NULL, 0);
    struct pair p;
    pair_open(&p, l, "ca.crt", NULL, 0);
    pair_handshake(&p);
    assert_int_equal(p.server_rc, 0);
    assert_int_equal(p.client_rc, 0);
    unsigned v = gnutls_protocol_get_version(p.server);
    assert_true(v == GNUTLS_TLS1_3 || v == GNUTLS_TLS1_2);
    char cn[64];
    server_cn(p.client, cn, sizeof cn);
    assert_string_equal(cn, "server one");
    exchange(&p, "put 0 0 1 1\r\nx\r\n", "INSERTED 1\r\n");
    struct tls_identity id;
    tls_session_identity(p.server, &id);
    assert_int_equal(id.count, 0); /* no client certificate asked for */
    pair_close(&p);
    tls_listener_free(l);
}

/* The client trusts another CA: it refuses the server's certificate. */
static void test_client_with_wrong_ca(void **state)
{
    (void)state;
    struct tls_listener *l = listener("server.crt", "server.key", NULL, 0);
    struct pair p;
    pair_open(&p, l, "other-ca.crt", NULL, 0);
    pair_handshake(&p);
    assert_int_equal(p.client_rc, GNUTLS_E_CERTIFICATE_VERIFICATION_ERROR);
    assert_true(p.server_rc < 0);
    pair_close(&p);
    tls_listener_free(l);
}

/* With a CA: a certificate is asked for, not required; one that verifies
 * names the peer, one from another CA fails the handshake. */
static void test_client_certificate_asked(void **state)
{
    (void)state;
    struct tls_listener *l = listener("server.crt", "server.key", "ca.crt", 0);
    struct pair p;
    struct tls_identity id;

    pair_open(&p, l, "ca.crt", NULL, 0);
    pair_handshake(&p);
    assert_int_equal(p.server_rc, 0);
    exchange(&p, "ping\r\n", "pong\r\n");
    tls_session_identity(p.server, &id);
    assert_int_equal(id.count, 0);
    pair_close(&p);

    pair_open(&p, l, "ca.crt", "alice", 0);
    pair_handshake(&p);
    assert_int_equal(p.server_rc, 0);
    exchange(&p, "ping\r\n", "pong\r\n");
    tls_session_identity(p.server, &id);
    assert_int_equal(id.count, 1);
    assert_string_equal(id.names[0], "cn:alice");
    pair_close(&p);

    /* the server's request names its CA, so a GnuTLS client keeps a
     * certificate of another CA to itself: not naming it makes it send */
    pair_open(&p, l, "ca.crt", "mallory", 0);
    gnutls_certificate_send_x509_rdn_sequence(p.server, 1);
    pair_handshake(&p);
    assert_int_equal(p.server_rc, GNUTLS_E_CERTIFICATE_ERROR);
    pair_close(&p);
    tls_listener_free(l);
}

/* verify_client: a client without a certificate is refused; with one of
 * the CA it gets in. */
static void test_client_certificate_required(void **state)
{
    (void)state;
    struct tls_listener *l = listener("server.crt", "server.key", "ca.crt", 1);
    struct pair p;
    pair_open(&p, l, "ca.crt", NULL, 0);
    pair_handshake(&p);
    assert_true(p.server_rc < 0);
    assert_int_not_equal(p.server_rc, GNUTLS_E_AGAIN);
    /* in TLS 1.3 the client may finish first: then its first read fails */
    if (p.client_rc == 0) {
        char buf[16];
        ssize_t n;
        do n = gnutls_record_recv(p.client, buf, sizeof buf);
        while (n == GNUTLS_E_AGAIN || n == GNUTLS_E_INTERRUPTED);
        assert_true(n <= 0);
    }
    pair_close(&p);

    pair_open(&p, l, "ca.crt", "alice", 0);
    pair_handshake(&p);
    assert_int_equal(p.server_rc, 0);
    exchange(&p, "ping\r\n", "pong\r\n");
    pair_close(&p);
    tls_listener_free(l);
}

/* For sessions whose credentials are not the listener's (libmicrohttpd's):
 * tls_listener_verify_client checks the chain against the current CA. */
static void test_verify_client_for_foreign_sessions(void **state)
{
    (void)state;
    struct tls_listener *l = listener("server.crt", "server.key", "ca.crt", 0);
    struct tls_listener *other = listener("server.crt", "server.key", "other-ca.crt", 0);
    struct tls_listener *no_ca = listener("server.crt", "server.key", NULL, 0);
    struct pair p;
    pair_open(&p, l, "ca.crt", "alice", 0);
    pair_handshake(&p);
    assert_int_equal(p.server_rc, 0);
    assert_int_equal(tls_listener_verify_client(l, p.server), 0);
    assert_int_equal(tls_listener_verify_client(other, p.server), GNUTLS_E_CERTIFICATE_ERROR);
    assert_int_equal(tls_listener_verify_client(no_ca, p.server), GNUTLS_E_CERTIFICATE_ERROR);
    pair_close(&p);
    pair_open(&p, l, "ca.crt", NULL, 0);
    pair_handshake(&p);
    assert_int_equal(tls_listener_verify_client(other, p.server), 0); /* none presented: not refused here */
    pair_close(&p);
    tls_listener_free(no_ca);
    tls_listener_free(other);
    tls_listener_free(l);
}

/* A session made on other credentials (libmicrohttpd's) takes a
 * listener's when adopted: its certificate, and its client certificate
 * request (required here: a client without one is refused). */
static void test_session_adopt(void **state)
{
    (void)state;
    struct tls_listener *first = listener("server.crt", "server.key", NULL, 0);
    struct tls_listener *second = listener("server2.crt", "server2.key", "ca.crt", 1);
    struct pair p;
    char cn[64];
    pair_open(&p, first, "ca.crt", "alice", 0);
    assert_int_equal(tls_listener_session_adopt(second, p.server), 0);
    pair_handshake(&p);
    assert_int_equal(p.server_rc, 0);
    server_cn(p.client, cn, sizeof cn);
    assert_string_equal(cn, "server two");
    struct tls_identity id;
    tls_session_identity(p.server, &id);
    assert_int_equal(id.count, 1);
    pair_close(&p);
    pair_open(&p, first, "ca.crt", NULL, 0);
    assert_int_equal(tls_listener_session_adopt(second, p.server), 0);
    pair_handshake(&p);
    assert_true(p.server_rc < 0 && p.server_rc != GNUTLS_E_AGAIN);
    pair_close(&p);
    tls_listener_free(second);
    tls_listener_free(first);
}

/* ---- records -------------------------------------------------------------- */

/* The server's transport gives one byte per call and EAGAIN every other
 * call: the handshake completes, a large reply goes out through sends cut
 * by EAGAIN (finished with NULL, 0), a request comes in a byte at a time. */
static void test_short_reads_and_writes(void **state)
{
    (void)state;
    struct tls_listener *l = listener("server.crt", "server.key", "ca.crt", 0);
    struct pair p;
    pair_open(&p, l, "ca.crt", "alice", 1);
    pair_handshake(&p);
    assert_int_equal(p.server_rc, 0);
    assert_int_equal(p.client_rc, 0);
    assert_true(p.trickle.calls > 1000); /* it really went a byte at a time */

    size_t len = 40000; /* three records */
    char *out = malloc(len), *in = malloc(len + 65536);
    for (size_t i = 0; i < len; i++) out[i] = (char)('a' + i % 26);
    size_t got = 0;
    send_all(p.server, out, len, p.client, in, &got);
    recv_all(p.client, in, len, &got, 65536);
    assert_memory_equal(in, out, len);

    got = 0;
    send_all(p.client, out, 1000, NULL, NULL, NULL);
    recv_all(p.server, in, 1000, &got, 4096);
    assert_memory_equal(in, out, 1000);
    free(out);
    free(in);
    pair_close(&p);
    tls_listener_free(l);
}

/* A 16 KB record read through a 100-byte buffer: each read gives what
 * fits, the rest is pending in GnuTLS (not in the socket: io/conn.c must
 * ask gnutls_record_check_pending, as it does). */
static void test_record_larger_than_read_buffer(void **state)
{
    (void)state;
    struct tls_listener *l = listener("server.crt", "server.key", NULL, 0);
    struct pair p;
    pair_open(&p, l, "ca.crt", NULL, 0);
    pair_handshake(&p);
    assert_int_equal(p.server_rc, 0);
    size_t len = 16384;
    char *out = malloc(len), *in = malloc(len);
    for (size_t i = 0; i < len; i++) out[i] = (char)(i * 7);
    send_all(p.client, out, len, NULL, NULL, NULL);
    size_t got = 0;
    ssize_t n;
    do n = gnutls_record_recv(p.server, in, 100);
    while (n == GNUTLS_E_AGAIN);
    assert_int_equal(n, 100);
    got = 100;
    assert_int_equal(gnutls_record_check_pending(p.server), len - 100);
    char peek;
    assert_true(recv(p.fds[0], &peek, 1, MSG_PEEK) < 0); /* the socket has nothing for a poll to see */
    recv_all(p.server, in, len, &got, 100);
    assert_memory_equal(in, out, len);
    assert_int_equal(gnutls_record_check_pending(p.server), 0);
    free(out);
    free(in);
    pair_close(&p);
    tls_listener_free(l);
}

/* close_notify either way reads as the end of the stream (0); a TCP end
 * without one is GNUTLS_E_PREMATURE_TERMINATION (io/conn.c: the end too). */
static void test_close_notify(void **state)
{
    (void)state;
    struct tls_listener *l = listener("server.crt", "server.key", NULL, 0);
    struct pair p;
    char buf[64];
    ssize_t n;

    pair_open(&p, l, "ca.crt", NULL, 0);
    pair_handshake(&p);
    exchange(&p, "quit\r\n", "bye\r\n");
    assert_int_equal(gnutls_bye(p.client, GNUTLS_SHUT_WR), 0);
    do n = gnutls_record_recv(p.server, buf, sizeof buf);
    while (n == GNUTLS_E_AGAIN);
    assert_int_equal(n, 0);
    /* and the server's own, as io/conn.c sends it at a close */
    assert_int_equal(gnutls_bye(p.server, GNUTLS_SHUT_WR), 0);
    do n = gnutls_record_recv(p.client, buf, sizeof buf);
    while (n == GNUTLS_E_AGAIN);
    assert_int_equal(n, 0);
    pair_close(&p);

    pair_open(&p, l, "ca.crt", NULL, 0);
    pair_handshake(&p);
    exchange(&p, "x\r\n", "y\r\n");
    shutdown(p.fds[1], SHUT_WR);
    do n = gnutls_record_recv(p.server, buf, sizeof buf);
    while (n == GNUTLS_E_AGAIN);
    assert_int_equal(n, GNUTLS_E_PREMATURE_TERMINATION);
    pair_close(&p);
    tls_listener_free(l);
}

/* ---- reload --------------------------------------------------------------- */

static void copy_file(const char *from, const char *to)
{
    size_t len;
    char *text = slurp(from, &len);
    FILE *f = fopen(path_of(to), "wb");
    assert_non_null(f);
    fwrite(text, 1, len, f);
    fclose(f);
    free(text);
}

/* A reload: new handshakes get the new pair, a session open before keeps
 * going on the old; a bad file keeps the old pair and names the file. */
static void test_reload(void **state)
{
    (void)state;
    copy_file("server.crt", "live.crt");
    copy_file("server.key", "live.key");
    struct tls_listener *l = listener("live.crt", "live.key", NULL, 0);
    struct pair before, after;
    char cn[64], err[256];

    pair_open(&before, l, "ca.crt", NULL, 0);
    pair_handshake(&before);
    assert_int_equal(before.server_rc, 0);
    exchange(&before, "one\r\n", "1\r\n");

    copy_file("server2.crt", "live.crt");
    copy_file("server2.key", "live.key");
    assert_int_equal(tls_listener_reload(l, err, sizeof err), 0);
    pair_open(&after, l, "ca.crt", NULL, 0);
    pair_handshake(&after);
    assert_int_equal(after.server_rc, 0);
    server_cn(after.client, cn, sizeof cn);
    assert_string_equal(cn, "server two");
    exchange(&after, "two\r\n", "2\r\n");
    exchange(&before, "still\r\n", "here\r\n"); /* the old session goes on */
    server_cn(before.client, cn, sizeof cn);
    assert_string_equal(cn, "server one");
    pair_close(&after);

    /* a key that does not match the certificate: refused, the old pair stays */
    copy_file("server.key", "live.key");
    assert_int_equal(tls_listener_reload(l, err, sizeof err), -1);
    assert_non_null(strstr(err, "certificate and key"));
    unlink(path_of("live.key"));
    assert_int_equal(tls_listener_reload(l, err, sizeof err), -1);
    assert_non_null(strstr(err, "live.key"));
    assert_int_equal(tls_reload_all(), -1);
    pair_open(&after, l, "ca.crt", NULL, 0);
    pair_handshake(&after);
    assert_int_equal(after.server_rc, 0);
    server_cn(after.client, cn, sizeof cn);
    assert_string_equal(cn, "server two");
    exchange(&before, "and\r\n", "on\r\n");
    pair_close(&after);
    pair_close(&before);
    tls_listener_free(l);
}

/* ---- limits --------------------------------------------------------------- */

/* tls_listener_new's answer for these files: 0, or -1 with err. */
static int try_listener(const char *cert, const char *key, const char *ca, const char *priority, char *err,
                        size_t errlen)
{
    char c[64], k[64], a[64];
    snprintf(c, sizeof c, "%s", path_of(cert));
    snprintf(k, sizeof k, "%s", path_of(key));
    if (ca) snprintf(a, sizeof a, "%s", path_of(ca));
    struct tls_files f = {c, k, ca ? a : NULL, priority, 0};
    struct tls_listener *l = NULL;
    int rc = tls_listener_new(&l, &f, err, errlen);
    if (rc == 0) {
        struct pair p; /* and it serves */
        pair_open(&p, l, "ca.crt", NULL, 0);
        pair_handshake(&p);
        assert_int_equal(p.server_rc, 0);
        pair_close(&p);
        tls_listener_free(l);
    } else {
        assert_null(l);
    }
    return rc;
}

/* A PEM file of 1 MiB is read, one byte more is refused. */
static void test_file_size_limit(void **state)
{
    (void)state;
    char err[256];
    pad_to("server.crt", "big.crt", 1u << 20);
    assert_int_equal(try_listener("big.crt", "server.key", NULL, NULL, err, sizeof err), 0);
    pad_to("server.crt", "big.crt", (1u << 20) + 1);
    assert_int_equal(try_listener("big.crt", "server.key", NULL, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "big.crt"));
    assert_non_null(strstr(err, "larger than 1 MiB"));
    FILE *f = fopen(path_of("empty.crt"), "wb");
    fclose(f);
    assert_int_equal(try_listener("empty.crt", "server.key", NULL, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "empty file"));
    assert_int_equal(try_listener("missing.crt", "server.key", NULL, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "missing.crt"));
    assert_int_equal(try_listener("server.crt", "server.key", "empty.crt", NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "empty.crt"));
}

/* A chain of 16 certificates is taken, 17 are refused (GnuTLS alone
 * would take the first 16 of them). */
static void test_chain_limit(void **state)
{
    (void)state;
    char err[256];
    chain_of("server.crt", "ca.crt", 15, "chain16.crt");
    assert_int_equal(try_listener("chain16.crt", "server.key", NULL, NULL, err, sizeof err), 0);
    chain_of("server.crt", "ca.crt", 16, "chain17.crt");
    assert_int_equal(try_listener("chain17.crt", "server.key", NULL, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "chain17.crt"));
    assert_non_null(strstr(err, "more than 16 certificates"));
}

/* Priority strings: TLS 1.3 alone or 1.2 alone are taken; one that enables
 * TLS 1.1 or nothing modern, or that GnuTLS cannot parse, is refused. */
static void test_priority_limits(void **state)
{
    (void)state;
    char err[256];
    assert_int_equal(try_listener("server.crt", "server.key", NULL, "NORMAL:-VERS-ALL:+VERS-TLS1.3", err, sizeof err), 0);
    assert_int_equal(try_listener("server.crt", "server.key", NULL, "NORMAL:-VERS-ALL:+VERS-TLS1.2", err, sizeof err), 0);
    assert_int_equal(try_listener("server.crt", "server.key", NULL, "NORMAL:+VERS-TLS1.1", err, sizeof err), -1);
    assert_non_null(strstr(err, "nothing older"));
    assert_int_equal(try_listener("server.crt", "server.key", NULL, "NORMAL:-VERS-ALL:+VERS-DTLS1.2", err, sizeof err), -1);
    assert_int_equal(try_listener("server.crt", "server.key", NULL, "NOT-A-PRIORITY", err, sizeof err), -1);
    assert_non_null(strstr(err, "bad priority string"));
}

/* A client certificate's names: at most TLS_IDENTITY_MAX (16) of its 21,
 * each at most TLS_IDENTITY_NAME_MAX - 1 bytes. */
static void test_identity_limit(void **state)
{
    (void)state;
    struct tls_listener *l = listener("server.crt", "server.key", "ca.crt", 1);
    struct pair p;
    pair_open(&p, l, "ca.crt", "many", 0);
    pair_handshake(&p);
    assert_int_equal(p.server_rc, 0);
    struct tls_identity id;
    tls_session_identity(p.server, &id);
    assert_int_equal(id.count, TLS_IDENTITY_MAX);
    assert_string_equal(id.names[0], "cn:many");
    assert_string_equal(id.names[1], "dns:san00.example");
    assert_string_equal(id.names[TLS_IDENTITY_MAX - 1], "dns:san14.example");
    pair_close(&p);

    /* a name of TLS_IDENTITY_NAME_MAX - 1 bytes is kept, one more is skipped */
    pair_open(&p, l, "ca.crt", "longest", 0);
    pair_handshake(&p);
    assert_int_equal(p.server_rc, 0);
    tls_session_identity(p.server, &id);
    assert_int_equal(id.count, 2);
    assert_string_equal(id.names[0], "cn:longest");
    assert_int_equal(strlen(id.names[1]), TLS_IDENTITY_NAME_MAX - 1);
    assert_memory_equal(id.names[1], "dns:aaaa", 8);
    pair_close(&p);
    tls_listener_free(l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_handshake_and_records),
        cmocka_unit_test(test_client_with_wrong_ca),
        cmocka_unit_test(test_client_certificate_asked),
        cmocka_unit_test(test_client_certificate_required),
        cmocka_unit_test(test_verify_client_for_foreign_sessions),
        cmocka_unit_test(test_session_adopt),
        cmocka_unit_test(test_short_reads_and_writes),
        cmocka_unit_test(test_record_larger_than_read_buffer),
        cmocka_unit_test(test_close_notify),
        cmocka_unit_test(test_reload),
        cmocka_unit_test(test_file_size_limit),
        cmocka_unit_test(test_chain_limit),
        cmocka_unit_test(test_priority_limits),
        cmocka_unit_test(test_identity_limit),
    };
    return cmocka_run_group_tests(tests, setup_files, teardown_files);
}
