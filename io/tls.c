/* tls.c - GnuTLS credentials for every listener (see tls.h).
 *
 * A listener holds generations of credentials: the newest serves new
 * handshakes; a reload that reads every file well puts a new one in front.
 * Older generations are kept until the listener is freed, not reference
 * counted: a GnuTLS session keeps pointers into the credentials it began
 * with for its whole life, and libmicrohttpd's certificate callback hands
 * GnuTLS our certificate chain and key without telling us when it is done
 * with them, so there is no moment at which an old generation is known to
 * be unused. A generation costs the size of its files (a few KB), so even
 * a reload every minute for a year stays within a few MB.
 *
 * Every live listener is on one list, so that SIGHUP (server/main.c) can
 * reload them all with tls_reload_all().
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <gnutls/x509.h>

#include "eventlog.h"
#include "tls.h"

#define TLS_FILE_MAX (1u << 20)  /* bytes of one PEM file at most */
#define TLS_CHAIN_MAX 16         /* certificates in one chain at most */

/* One loading of the files. */
struct tls_generation {
    struct tls_generation *older;
    gnutls_certificate_credentials_t cred;
    gnutls_pcert_st chain[TLS_CHAIN_MAX];
    unsigned int chain_len;
    gnutls_privkey_t key;
    char *ca_pem;                /* NULL: no CA file */
};

struct tls_listener {
    struct tls_listener *prev, *next; /* every live listener */
    char *cert, *key, *ca, *priority_string;
    int verify_client;
    gnutls_priority_t priority;
    struct tls_generation *current;   /* the newest; ->older the ones before */
};

static struct tls_listener *live_listeners;

static char *copy_string(const char *s)
{
    return s ? strdup(s) : NULL;
}

/* Read the whole file at path into *out (NUL-terminated; free() it): 0, or
 * -1 with why in err. */
static int read_pem(const char *path, gnutls_datum_t *out, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s", strerror(errno));
        return -1;
    }
    unsigned char *data = malloc(TLS_FILE_MAX + 1);
    size_t n = data ? fread(data, 1, TLS_FILE_MAX + 1, f) : 0;
    int failed = !data || ferror(f);
    fclose(f);
    if (failed || n > TLS_FILE_MAX || n == 0) {
        snprintf(err, errlen, "%s", !data ? "out of memory" : failed ? "read error"
                                    : n == 0 ? "empty file" : "file larger than 1 MiB");
        free(data);
        return -1;
    }
    data[n] = 0;
    out->data = data;
    out->size = (unsigned int)n;
    return 0;
}

/* A presented client certificate must verify against the CA (GnuTLS calls
 * this during the handshake; nonzero fails it). Whether one is required at
 * all is the session's certificate request (tls_listener_session_new). */
static int verify_client_cert(gnutls_session_t s)
{
    unsigned int n = 0;
    if (!gnutls_certificate_get_peers(s, &n) || n == 0)
        return 0;
    unsigned int status = 0;
    if (gnutls_certificate_verify_peers2(s, &status) != 0 || status != 0)
        return GNUTLS_E_CERTIFICATE_ERROR;
    return 0;
}

int tls_listener_verify_client(struct tls_listener *l, gnutls_session_t s)
{
    unsigned int n = 0;
    const gnutls_datum_t *peers = gnutls_certificate_get_peers(s, &n);
    if (!peers || n == 0)
        return 0;
    if (!l->current || !l->current->ca_pem || n > TLS_CHAIN_MAX)
        return GNUTLS_E_CERTIFICATE_ERROR;
    gnutls_x509_trust_list_t trust;
    gnutls_certificate_get_trust_list(l->current->cred, &trust);
    gnutls_x509_crt_t chain[TLS_CHAIN_MAX];
    unsigned int imported = 0, status = 1;
    int r = 0;
    while (imported < n && r >= 0) {
        r = gnutls_x509_crt_init(&chain[imported]);
        if (r < 0)
            break;
        r = gnutls_x509_crt_import(chain[imported], &peers[imported], GNUTLS_X509_FMT_DER);
        imported++;
    }
    if (r >= 0)
        r = gnutls_x509_trust_list_verify_crt2(trust, chain, n, NULL, 0, 0, &status, NULL);
    for (unsigned int i = 0; i < imported; i++)
        gnutls_x509_crt_deinit(chain[i]);
    return r < 0 || status != 0 ? GNUTLS_E_CERTIFICATE_ERROR : 0;
}

static void generation_free(struct tls_generation *g)
{
    if (!g)
        return;
    if (g->cred)
        gnutls_certificate_free_credentials(g->cred);
    for (unsigned int i = 0; i < g->chain_len; i++)
        gnutls_pcert_deinit(&g->chain[i]);
    if (g->key)
        gnutls_privkey_deinit(g->key);
    free(g->ca_pem);
    free(g);
}

/* Load l's files as a new generation into *out: 0, or -1 with the failing
 * file in *bad_path and why in err. */
static int generation_load(const struct tls_listener *l, struct tls_generation **out,
                           const char **bad_path, char *err, size_t errlen)
{
    gnutls_datum_t cert = {0}, key = {0}, ca = {0};
    struct tls_generation *g = calloc(1, sizeof *g);
    int rc = -1, r;
    if (!g) {
        *bad_path = l->cert;
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    *bad_path = l->cert;
    if (read_pem(l->cert, &cert, err, errlen) != 0)
        goto done;
    g->chain_len = TLS_CHAIN_MAX;
    /* a longer chain is refused, not cut (GnuTLS's default): the
     * HTTPS gateway serves this list, the other listeners the file */
    r = gnutls_pcert_list_import_x509_raw(g->chain, &g->chain_len, &cert, GNUTLS_X509_FMT_PEM,
                                          GNUTLS_X509_CRT_LIST_IMPORT_FAIL_IF_EXCEED);
    if (r < 0) {
        g->chain_len = 0;
        if (r == GNUTLS_E_SHORT_MEMORY_BUFFER)
            snprintf(err, errlen, "more than %d certificates in the chain", TLS_CHAIN_MAX);
        else
            snprintf(err, errlen, "no certificate: %s", gnutls_strerror(r));
        goto done;
    }
    *bad_path = l->key;
    if (read_pem(l->key, &key, err, errlen) != 0)
        goto done;
    if ((r = gnutls_privkey_init(&g->key)) < 0 ||
        (r = gnutls_privkey_import_x509_raw(g->key, &key, GNUTLS_X509_FMT_PEM, NULL, 0)) < 0) {
        snprintf(err, errlen, "no private key: %s", gnutls_strerror(r));
        goto done;
    }
    if ((r = gnutls_certificate_allocate_credentials(&g->cred)) < 0 ||
        (r = gnutls_certificate_set_x509_key_mem2(g->cred, &cert, &key, GNUTLS_X509_FMT_PEM, NULL, 0)) < 0) {
        snprintf(err, errlen, "certificate and key: %s", gnutls_strerror(r));
        goto done;
    }
    if (l->ca) {
        *bad_path = l->ca;
        if (read_pem(l->ca, &ca, err, errlen) != 0)
            goto done;
        r = gnutls_certificate_set_x509_trust_mem(g->cred, &ca, GNUTLS_X509_FMT_PEM);
        if (r <= 0) {
            snprintf(err, errlen, "no CA certificate: %s", r < 0 ? gnutls_strerror(r) : "none found");
            goto done;
        }
        g->ca_pem = (char *)ca.data; /* NUL-terminated by read_pem */
        ca.data = NULL;
        gnutls_certificate_set_verify_function(g->cred, verify_client_cert);
    }
    rc = 0;
done:
    free(cert.data);
    if (key.data) {
        gnutls_memset(key.data, 0, key.size);
        free(key.data);
    }
    free(ca.data);
    if (rc != 0) {
        generation_free(g);
        g = NULL;
    }
    *out = g;
    return rc;
}

/* Parse a priority string into *out: 0, or -1 with why in err. One that
 * enables a protocol older than TLS 1.2, or neither 1.2 nor 1.3, is
 * refused too. */
static int priority_load(const char *s, gnutls_priority_t *out, char *err, size_t errlen)
{
    const char *where = NULL;
    int r = gnutls_priority_init(out, s, &where);
    if (r < 0) {
        *out = NULL;
        snprintf(err, errlen, "bad priority string near \"%.40s\": %s", where ? where : s, gnutls_strerror(r));
        return -1;
    }
    const unsigned int *list = NULL;
    int n = gnutls_priority_protocol_list(*out, &list);
    int modern = 0, old = 0;
    for (int i = 0; i < n; i++) {
        if (list[i] == GNUTLS_TLS1_2 || list[i] == GNUTLS_TLS1_3)
            modern = 1;
        else if (list[i] == GNUTLS_SSL3 || list[i] == GNUTLS_TLS1_0 || list[i] == GNUTLS_TLS1_1)
            old = 1;
    }
    if (old || !modern) {
        gnutls_priority_deinit(*out);
        *out = NULL;
        snprintf(err, errlen, "priority string must enable TLS 1.2 or 1.3 and nothing older");
        return -1;
    }
    return 0;
}

int tls_listener_new(struct tls_listener **out, const struct tls_files *f, char *err, size_t errlen)
{
    *out = NULL;
    if (!f->cert || !f->key) {
        snprintf(err, errlen, "a TLS listener needs a certificate and a key file");
        return -1;
    }
    struct tls_listener *l = calloc(1, sizeof *l);
    if (!l || !(l->cert = copy_string(f->cert)) || !(l->key = copy_string(f->key)) ||
        (f->ca && !(l->ca = copy_string(f->ca))) ||
        !(l->priority_string = copy_string(f->priority ? f->priority : TLS_DEFAULT_PRIORITY))) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    l->verify_client = f->verify_client;
    char why[256];
    if (priority_load(l->priority_string, &l->priority, why, sizeof why) != 0) {
        snprintf(err, errlen, "--tls-priority: %s", why);
        goto fail;
    }
    const char *bad_path;
    if (generation_load(l, &l->current, &bad_path, why, sizeof why) != 0) {
        snprintf(err, errlen, "%s: %s", bad_path, why);
        goto fail;
    }
    l->next = live_listeners;
    if (live_listeners)
        live_listeners->prev = l;
    live_listeners = l;
    *out = l;
    return 0;
fail:
    tls_listener_free(l);
    return -1;
}

void tls_listener_free(struct tls_listener *l)
{
    if (!l)
        return;
    if (l->prev)
        l->prev->next = l->next;
    else if (live_listeners == l)
        live_listeners = l->next;
    if (l->next)
        l->next->prev = l->prev;
    while (l->current) {
        struct tls_generation *older = l->current->older;
        generation_free(l->current);
        l->current = older;
    }
    if (l->priority)
        gnutls_priority_deinit(l->priority);
    free(l->cert);
    free(l->key);
    free(l->ca);
    free(l->priority_string);
    free(l);
}

/* As tls_listener_reload, with the failing file in *bad_path. */
static int listener_reload(struct tls_listener *l, const char **bad_path, char *err, size_t errlen)
{
    struct tls_generation *g;
    if (generation_load(l, &g, bad_path, err, errlen) != 0)
        return -1;
    g->older = l->current;
    l->current = g;
    return 0;
}

int tls_listener_reload(struct tls_listener *l, char *err, size_t errlen)
{
    const char *bad_path;
    char why[256];
    if (listener_reload(l, &bad_path, why, sizeof why) != 0) {
        snprintf(err, errlen, "%s: %s", bad_path, why);
        return -1;
    }
    return 0;
}

int tls_reload_all(void)
{
    int failed = 0;
    for (struct tls_listener *l = live_listeners; l; l = l->next) {
        const char *bad_path;
        char why[256];
        if (listener_reload(l, &bad_path, why, sizeof why) == 0) {
            log_event(BG_LOG_INFO, "tls_reloaded", "cert=%s", log_str(l->cert));
        } else {
            failed++;
            log_event(BG_LOG_ERROR, "tls_reload_failed", "path=%s error=%s", log_str(bad_path), log_str(why));
        }
    }
    return failed ? -1 : 0;
}

gnutls_certificate_credentials_t tls_listener_credentials(struct tls_listener *l)
{
    return l->current->cred;
}

gnutls_priority_t tls_listener_priority(struct tls_listener *l)
{
    return l->priority;
}

const char *tls_listener_priority_string(const struct tls_listener *l)
{
    return l->priority_string;
}

int tls_listener_current_cert(struct tls_listener *l, gnutls_pcert_st **certs, unsigned int *count,
                              gnutls_privkey_t *key)
{
    if (!l->current || l->current->chain_len == 0)
        return -1;
    *certs = l->current->chain;
    *count = l->current->chain_len;
    *key = l->current->key;
    return 0;
}

const char *tls_listener_ca_pem(const struct tls_listener *l)
{
    return l->current ? l->current->ca_pem : NULL;
}

int tls_listener_session_adopt(struct tls_listener *l, gnutls_session_t s)
{
    if (gnutls_credentials_set(s, GNUTLS_CRD_CERTIFICATE, l->current->cred) < 0)
        return -1;
    if (l->ca)
        gnutls_certificate_server_set_request(s, l->verify_client ? GNUTLS_CERT_REQUIRE : GNUTLS_CERT_REQUEST);
    return 0;
}

int tls_listener_session_new(struct tls_listener *l, gnutls_session_t *out)
{
    gnutls_session_t s;
    if (gnutls_init(&s, GNUTLS_SERVER | GNUTLS_NONBLOCK | GNUTLS_NO_SIGNAL) < 0)
        return -1;
    if (gnutls_priority_set(s, l->priority) < 0 || tls_listener_session_adopt(l, s) != 0) {
        gnutls_deinit(s);
        return -1;
    }
    *out = s;
    return 0;
}

/* Append one name "prefix" + value[0..len) to out, if it fits and is
 * printable without spaces (a name goes into logs and scope lookups). */
static void identity_add(struct tls_identity *out, const char *prefix, const char *value, size_t len)
{
    size_t plen = strlen(prefix);
    if (out->count >= TLS_IDENTITY_MAX || len == 0 || plen + len >= TLS_IDENTITY_NAME_MAX)
        return;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)value[i] <= 0x20 || (unsigned char)value[i] == 0x7f)
            return;
    memcpy(out->names[out->count], prefix, plen);
    memcpy(out->names[out->count] + plen, value, len);
    out->names[out->count][plen + len] = 0;
    out->count++;
}

void tls_session_identity(gnutls_session_t s, struct tls_identity *out)
{
    out->count = 0;
    unsigned int n = 0, status = 0;
    const gnutls_datum_t *peers = gnutls_certificate_get_peers(s, &n);
    if (!peers || n == 0 || gnutls_certificate_type_get(s) != GNUTLS_CRT_X509)
        return;
    if (gnutls_certificate_verify_peers2(s, &status) != 0 || status != 0)
        return;
    gnutls_x509_crt_t crt;
    if (gnutls_x509_crt_init(&crt) < 0)
        return;
    if (gnutls_x509_crt_import(crt, &peers[0], GNUTLS_X509_FMT_DER) < 0) {
        gnutls_x509_crt_deinit(crt);
        return;
    }
    char buf[TLS_IDENTITY_NAME_MAX];
    size_t size = sizeof buf;
    if (gnutls_x509_crt_get_dn_by_oid(crt, GNUTLS_OID_X520_COMMON_NAME, 0, 0, buf, &size) == 0)
        identity_add(out, "cn:", buf, strnlen(buf, size));
    for (unsigned int seq = 0; seq < 4 * TLS_IDENTITY_MAX; seq++) {
        size = sizeof buf;
        int type = gnutls_x509_crt_get_subject_alt_name(crt, seq, buf, &size, NULL);
        if (type == GNUTLS_E_REQUESTED_DATA_NOT_AVAILABLE)
            break;
        if (type == GNUTLS_SAN_DNSNAME)
            identity_add(out, "dns:", buf, size);
        else if (type == GNUTLS_SAN_RFC822NAME)
            identity_add(out, "email:", buf, size);
        else if (type == GNUTLS_SAN_URI)
            identity_add(out, "uri:", buf, size);
        /* other kinds, and names too long for buf, are skipped */
    }
    gnutls_x509_crt_deinit(crt);
}
