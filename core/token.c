/* token.c - SipHash-2-4, the core's one keyed hash, and with it
 * unguessable reservation tokens for clients that hold no connection (HTTP). A token names one reservation of one job:
 *   hex(id) "-" hex(reserve count) "-" hex(MAC)
 * where MAC is SipHash-2-4 of (id, reserve count) under a secret key chosen
 * at start. Nothing is stored: checking a token recomputes the MAC and
 * compares in constant time. A new reservation of the same job has a new
 * reserve count, so an old token stops working. */
#include <stdio.h>
#include <string.h>

#include "core.h"

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))

static void sip_round(uint64_t v[4])
{
    v[0] += v[1]; v[1] = ROTL(v[1], 13); v[1] ^= v[0]; v[0] = ROTL(v[0], 32);
    v[2] += v[3]; v[3] = ROTL(v[3], 16); v[3] ^= v[2];
    v[0] += v[3]; v[3] = ROTL(v[3], 21); v[3] ^= v[0];
    v[2] += v[1]; v[1] = ROTL(v[1], 17); v[1] ^= v[2]; v[2] = ROTL(v[2], 32);
}

/* The 64-bit little-endian word at p. */
static uint64_t load_le64(const unsigned char *p)
{
    uint64_t w = 0;
    for (int i = 7; i >= 0; i--) w = (w << 8) | p[i];
    return w;
}

uint64_t bg_siphash(const uint64_t key[2], const void *data, size_t len)
{
    const unsigned char *in = data;
    uint64_t v[4] = {key[0] ^ 0x736f6d6570736575ull, key[1] ^ 0x646f72616e646f6dull,
                     key[0] ^ 0x6c7967656e657261ull, key[1] ^ 0x7465646279746573ull};
    size_t full = len & ~(size_t)7;
    unsigned char last[8] = {0};
    if (len > full) memcpy(last, in + full, len - full); /* data may be NULL when len is 0 */
    last[7] = (unsigned char)len;
    for (size_t i = 0; i <= full; i += 8) {
        uint64_t m = load_le64(i < full ? in + i : last);
        v[3] ^= m;
        sip_round(v);
        sip_round(v);
        v[0] ^= m;
    }
    v[2] ^= 0xff;
    for (int i = 0; i < 4; i++) sip_round(v);
    return v[0] ^ v[1] ^ v[2] ^ v[3];
}

/* SipHash-2-4 of two 64-bit words (16 bytes, little-endian) under key k. */
static uint64_t siphash_2words(const uint64_t k[2], uint64_t a, uint64_t b)
{
    unsigned char buf[16];
    for (int i = 0; i < 8; i++) {
        buf[i] = (unsigned char)(a >> (8 * i));
        buf[8 + i] = (unsigned char)(b >> (8 * i));
    }
    return bg_siphash(k, buf, sizeof buf);
}

void bg_token_make(const struct bg_token_key *key, uint64_t id, uint32_t reserves,
                   char out[BG_TOKEN_MAX])
{
    uint64_t mac1 = siphash_2words(key->k, id, reserves);
    uint64_t mac2 = siphash_2words(key->k + 2, id, reserves);
    snprintf(out, BG_TOKEN_MAX, "%llx-%x-%016llx%016llx", (unsigned long long)id, reserves,
             (unsigned long long)mac1, (unsigned long long)mac2);
}

int bg_token_check(const struct bg_token_key *key, const char *token, uint64_t id,
                   uint32_t reserves)
{
    char want[BG_TOKEN_MAX];
    bg_token_make(key, id, reserves, want);
    size_t n = strlen(want);
    if (strnlen(token, BG_TOKEN_MAX) != n) return BG_NOT_FOUND;
    unsigned char diff = 0; /* constant time over the whole token */
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)(want[i] ^ token[i]);
    return diff == 0 ? 0 : BG_NOT_FOUND;
}
