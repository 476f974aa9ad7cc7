/* auth.c - optional bearer tokens for the HTTP gateway: the token lines of
 * the access file (core/core.h's scope section), each with its scope.
 *
 * A presented token is compared with every configured token over the same
 * fixed number of bytes (GW_AUTH_TOKEN_MAX, zero-padded), with a length
 * mismatch folded into the difference, and the results are combined without
 * a branch; the matched token's index is selected with a mask, not a
 * branch. So the time taken depends neither on where the first differing
 * byte is, nor on a configured token's length, nor on which token matched. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "gateway.h"

struct gw_auth {
    size_t count;
    size_t *lens;
    unsigned char (*tokens)[GW_AUTH_TOKEN_MAX]; /* zero-padded */
    const struct bg_scope **scopes;             /* token i's scope (NULL: unscoped) */
};

struct gw_auth *gw_auth_new(const struct bg_scopes *sc)
{
    size_t n = sc ? bg_scopes_token_count(sc) : 0;
    struct gw_auth *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->lens = calloc(n ? n : 1, sizeof *a->lens);
    a->tokens = calloc(n ? n : 1, sizeof *a->tokens);
    a->scopes = calloc(n ? n : 1, sizeof *a->scopes);
    if (!a->lens || !a->tokens || !a->scopes) {
        gw_auth_free(a);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        size_t len = 0;
        const char *token = bg_scopes_token(sc, i, &len);
        if (!token || len == 0 || len > GW_AUTH_TOKEN_MAX) {
            gw_auth_free(a);
            return NULL;
        }
        memcpy(a->tokens[i], token, len);
        a->lens[i] = len;
        a->scopes[i] = bg_scopes_token_scope(sc, i);
    }
    a->count = n;
    return a;
}

int gateway_set_scopes(struct gateway *gw, const struct bg_scopes *sc)
{
    if (!gw) return 0;
    struct gw_auth *a = sc && bg_scopes_token_count(sc) ? gw_auth_new(sc) : NULL;
    if (sc && bg_scopes_token_count(sc) && !a) return BG_OUT_OF_MEMORY;
    /* the table is read only inside gw_auth_check: nothing holds the old one */
    gw_auth_free(gw->auth);
    gw->auth = a;
    gw->cfg.scopes = sc;
    return 0;
}

void gw_auth_free(struct gw_auth *a)
{
    if (!a) return;
    if (a->tokens) memset(a->tokens, 0, a->count * sizeof *a->tokens);
    free(a->tokens);
    free(a->lens);
    free(a->scopes);
    free(a);
}

int gw_auth_match(const struct gw_auth *a, const char *token, size_t len,
                  const struct bg_scope **scope)
{
    if (scope) *scope = NULL;
    /* Longer than any token can be: the bound is public, so this early
     * answer tells nothing about the configured tokens. */
    if (!a || len == 0 || len > GW_AUTH_TOKEN_MAX) return 0;
    unsigned char given[GW_AUTH_TOKEN_MAX];
    memset(given, 0, sizeof given);
    memcpy(given, token, len);
    uint32_t matched = 0;
    uintptr_t which = 0; /* the matched token's scope, as an integer */
    for (size_t i = 0; i < a->count; i++) {
        uint32_t diff = (uint32_t)(a->lens[i] ^ len); /* both <= GW_AUTH_TOKEN_MAX */
        for (size_t k = 0; k < GW_AUTH_TOKEN_MAX; k++) diff |= (uint32_t)(a->tokens[i][k] ^ given[k]);
        /* keep the compiler from turning this into an early exit */
        __asm__ __volatile__("" : "+r"(diff));
        /* (diff | -diff) has its top bit set exactly when diff != 0 */
        uint32_t same = ((diff | (0u - diff)) >> 31) ^ 1u;
        uint32_t first = same & (matched ^ 1u); /* matched is 0 or 1 */
        matched |= same;
        /* all ones for the first match, else zero: no branch on a secret */
        uintptr_t take = (uintptr_t)0 - (uintptr_t)first;
        which |= take & (uintptr_t)a->scopes[i];
    }
    memset(given, 0, sizeof given);
    __asm__ __volatile__("" : : "r"(given) : "memory");
    if (scope) *scope = (const struct bg_scope *)which;
    return (int)matched;
}

int gw_auth_check(const struct gw_auth *a, const char *authorization,
                  const struct bg_scope **scope)
{
    if (scope) *scope = NULL;
    if (!authorization) return 0;
    /* credentials = auth-scheme 1*SP token68 (RFC 6750 2.1); the scheme is
     * case-insensitive */
    if (strncasecmp(authorization, "Bearer", 6) != 0 || authorization[6] != ' ') return 0;
    const char *t = authorization + 6;
    while (*t == ' ') t++;
    size_t len = strlen(t);
    while (len && (t[len - 1] == ' ' || t[len - 1] == '\t')) len--;
    return gw_auth_match(a, t, len, scope);
}
