/* auth.c - optional bearer tokens for the HTTP gateway.
 *
 * A presented token is compared with every configured token over the same
 * fixed number of bytes (GW_AUTH_TOKEN_MAX, zero-padded), with a length
 * mismatch folded into the difference, and the results are combined without
 * a branch. So the time taken depends neither on where the first differing
 * byte is, nor on a configured token's length, nor on which token matched. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "gateway.h"

struct gw_auth {
    size_t count;
    size_t *lens;
    unsigned char (*tokens)[GW_AUTH_TOKEN_MAX]; /* zero-padded */
};

struct gw_auth *gw_auth_new(const char *const *tokens, size_t n)
{
    struct gw_auth *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->lens = calloc(n ? n : 1, sizeof *a->lens);
    a->tokens = calloc(n ? n : 1, sizeof *a->tokens);
    if (!a->lens || !a->tokens) {
        gw_auth_free(a);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(tokens[i]);
        if (len == 0 || len > GW_AUTH_TOKEN_MAX) {
            gw_auth_free(a);
            return NULL;
        }
        memcpy(a->tokens[i], tokens[i], len);
        a->lens[i] = len;
    }
    a->count = n;
    return a;
}

void gw_auth_free(struct gw_auth *a)
{
    if (!a) return;
    if (a->tokens) memset(a->tokens, 0, a->count * sizeof *a->tokens);
    free(a->tokens);
    free(a->lens);
    free(a);
}

int gw_auth_match(const struct gw_auth *a, const char *token, size_t len)
{
    /* Longer than any token can be: the bound is public, so this early
     * answer tells nothing about the configured tokens. */
    if (!a || len == 0 || len > GW_AUTH_TOKEN_MAX) return 0;
    unsigned char given[GW_AUTH_TOKEN_MAX];
    memset(given, 0, sizeof given);
    memcpy(given, token, len);
    uint32_t matched = 0;
    for (size_t i = 0; i < a->count; i++) {
        uint32_t diff = (uint32_t)(a->lens[i] ^ len); /* both <= GW_AUTH_TOKEN_MAX */
        for (size_t k = 0; k < GW_AUTH_TOKEN_MAX; k++) diff |= (uint32_t)(a->tokens[i][k] ^ given[k]);
        /* keep the compiler from turning this into an early exit */
        __asm__ __volatile__("" : "+r"(diff));
        /* (diff | -diff) has its top bit set exactly when diff != 0 */
        matched |= ((diff | (0u - diff)) >> 31) ^ 1u;
    }
    memset(given, 0, sizeof given);
    __asm__ __volatile__("" : : "r"(given) : "memory");
    return (int)matched;
}

int gw_auth_check(const struct gw_auth *a, const char *authorization)
{
    if (!authorization) return 0;
    /* credentials = auth-scheme 1*SP token68 (RFC 6750 2.1); the scheme is
     * case-insensitive */
    if (strncasecmp(authorization, "Bearer", 6) != 0 || authorization[6] != ' ') return 0;
    const char *t = authorization + 6;
    while (*t == ' ') t++;
    size_t len = strlen(t);
    while (len && (t[len - 1] == ' ' || t[len - 1] == '\t')) len--;
    return gw_auth_match(a, t, len);
}
