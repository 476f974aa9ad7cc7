/* fuzz_scopes.h - the scopes the codec and Gearman harnesses give one of
 * their sessions (docs/security.md, Scopes): as a TLS client certificate's
 * identity line would, so that every refusal path of core/scope.c's
 * callers runs under the fuzzer too. Header-only: each harness is one
 * program. */
#ifndef FUZZ_SCOPES_H
#define FUZZ_SCOPES_H

#include <assert.h>
#include <stdlib.h>

#include "core.h"

/* Prefixes, exact names, every kind, and grants that overlap; the tube
 * and function names the harnesses use ("default", "a...", "f", "g"). */
static const char fuzz_access_file[] =
    "t1 produce:default,a*,f\n"
    "t2 consume,read:default,a*,g manage:b,f$\n"
    "t3 *:*\n"
    "t4 read:* produce:b*,g\n"
    "t5 manage:default,f consume:a,f\n"
    "t6 produce,consume:default,f*\n";
#define FUZZ_ACCESS_TOKENS 6

/* The scope picked by choice (0..7): NULL (unscoped) for 0, token choice's
 * of fuzz_access_file for 1..6, the scope of nothing for 7. */
static const struct bg_scope *fuzz_pick_scope(unsigned choice)
{
    static struct bg_scopes *access; /* parsed once, kept for the process */
    if (!access) {
        char why[128];
        if (bg_scopes_parse(&access, fuzz_access_file, sizeof fuzz_access_file - 1, why, sizeof why) != 0)
            abort();
        assert(bg_scopes_token_count(access) == FUZZ_ACCESS_TOKENS);
    }
    if (choice == 0) return NULL;
    if (choice <= FUZZ_ACCESS_TOKENS) return bg_scopes_token_scope(access, choice - 1);
    return bg_scope_nothing();
}

#endif
