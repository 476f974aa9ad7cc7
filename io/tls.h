/* tls.h - TLS for every listener (GnuTLS): the one home of certificates,
 * keys, the client CA, the priority string, reloading them (SIGHUP), and
 * naming a peer by its client certificate. The connection layer (conn.c,
 * beanstalk and Gearman ports) and the HTTPS gateway (libmicrohttpd, through
 * its certificate callback) both take their credentials from here, so a
 * reload reaches every listener at once. Outbound TLS (HTTPS push) is
 * libcurl's, built on the same GnuTLS.
 *
 * Contract (issue 23; implementation in io/tls.c):
 * - TLS 1.2 and 1.3 only; no renegotiation; TLS_DEFAULT_PRIORITY unless
 *   --tls-priority says otherwise (checked at start: a bad string refuses it).
 * - A reload reads every file again; if any is missing or bad, the old
 *   credentials stay in use and the reason is returned. Sessions already
 *   open keep what they began with; new handshakes use the new files.
 * - With a CA file, a client certificate is asked for and, when
 *   verify_client is set, required; a presented one must verify against the
 *   CA, else the handshake fails.
 */
#ifndef BEANGATE_TLS_H
#define BEANGATE_TLS_H

#include <stddef.h>
#include <gnutls/gnutls.h>
#include <gnutls/abstract.h>

#define TLS_IDENTITY_MAX 16      /* names taken from one client certificate at most */
#define TLS_IDENTITY_NAME_MAX 256 /* bytes of one name, its "cn:" prefix included */

/* The priority without --tls-priority: GnuTLS's NORMAL choice of ciphers,
 * TLS 1.3 and 1.2 only. A --tls-priority string is checked at start: one
 * GnuTLS cannot parse, or one enabling a version below TLS 1.2 (or neither
 * 1.2 nor 1.3), refuses the start. */
#define TLS_DEFAULT_PRIORITY "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2"

/* What one listener is configured with (the flags --tls-* and --http-tls-*). */
struct tls_files {
    const char *cert;          /* PEM certificate chain */
    const char *key;           /* PEM private key */
    const char *ca;            /* PEM CAs for client certificates; NULL: none asked */
    const char *priority;      /* GnuTLS priority string; NULL: TLS_DEFAULT_PRIORITY */
    int verify_client;         /* with ca: a client without a certificate is refused */
};

/* One listener's credentials; reloadable. */
struct tls_listener;

/* Load f's files (the strings are copied): 0, or -1 with why in err. */
int tls_listener_new(struct tls_listener **out, const struct tls_files *f, char *err, size_t errlen);
void tls_listener_free(struct tls_listener *l);
/* Read the files again: 0, or -1 with why in err (the old ones stay). */
int tls_listener_reload(struct tls_listener *l, char *err, size_t errlen);

/* Reload every live listener (SIGHUP): each logs tls_reloaded, or
 * tls_reload_failed path=... error=... and keeps its old credentials.
 * 0, or -1 if any failed. */
int tls_reload_all(void);

/* A new non-blocking server session on l's current credentials and
 * priority, asking for (with a CA) or requiring (verify_client) a client
 * certificate: 0, or -1. The caller gnutls_deinit()s it. */
int tls_listener_session_new(struct tls_listener *l, gnutls_session_t *out);
/* Give a server session made elsewhere (libmicrohttpd's, before its
 * handshake) l's current credentials and certificate request, as
 * tls_listener_session_new does: its chain, key, client CA, and so the CA
 * names its certificate request lists, are those of the last reload.
 * 0, or -1. */
int tls_listener_session_adopt(struct tls_listener *l, gnutls_session_t s);

/* A verified client certificate's names: "cn:NAME" for the subject's
 * common name, then "dns:", "email:", "uri:" for each subjectAltName, at
 * most TLS_IDENTITY_MAX. count 0: no client certificate. */
struct tls_identity {
    size_t count;
    char names[TLS_IDENTITY_MAX][TLS_IDENTITY_NAME_MAX];
};

/* The credentials and priorities a new server session takes now (conn.c:
 * gnutls_credentials_set, gnutls_priority_set). Valid while l lives, across
 * reloads (a session keeps what it began with). */
gnutls_certificate_credentials_t tls_listener_credentials(struct tls_listener *l);
gnutls_priority_t tls_listener_priority(struct tls_listener *l);
/* The priority string in use (libmicrohttpd: MHD_OPTION_HTTPS_PRIORITIES). */
const char *tls_listener_priority_string(const struct tls_listener *l);
/* For libmicrohttpd's certificate callback (MHD_OPTION_HTTPS_CERT_CALLBACK,
 * gnutls_certificate_retrieve_function2): the current chain and key, valid
 * while l lives. 0, or -1 if none is loaded. */
int tls_listener_current_cert(struct tls_listener *l, gnutls_pcert_st **certs, unsigned int *count,
                              gnutls_privkey_t *key);
/* The client CA file's PEM text as loaded last (NULL: no CA), for
 * MHD_OPTION_HTTPS_MEM_TRUST. */
const char *tls_listener_ca_pem(const struct tls_listener *l);

/* For a session whose credentials are not a listener's (libmicrohttpd's,
 * whose trust is read once at start): verify the presented client
 * certificate chain, if any, against l's current CA, so that a reload
 * reaches it too. 0, or GNUTLS_E_CERTIFICATE_ERROR (a GnuTLS verify
 * function's answer: the handshake fails). */
int tls_listener_verify_client(struct tls_listener *l, gnutls_session_t s);

/* The names of the verified client certificate of an established session
 * into *out (count 0: none was presented, or it did not verify). */
void tls_session_identity(gnutls_session_t s, struct tls_identity *out);

#endif
