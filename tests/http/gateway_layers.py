#!/usr/bin/env python3
"""The layers inside gateway/: a file may use only what files of a lower
layer define, never a file of its own layer or one above, so the gateway's
files form no circle. Also: only http.c speaks libmicrohttpd's MHD_Result,
and no gateway file reads a decimal number with a C library parser (they all
go through core's bg_parse_u64).

Usage: python3 tests/http/gateway_layers.py [GATEWAY_DIR]
Prints each violation and exits 1 if there is any; a .c file not placed in
LAYERS is a violation too, so that a new file gets a place.
"""

import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
GATEWAY = os.path.join(HERE, "..", "..", "gateway")

# From the top down. The route table (router.c) names the handlers; http.c
# runs the request and calls the handler the table gave it.
LAYERS = [
    ["http.c"],                                     # daemon, libevent, request lifecycle
    ["admit.c"],                                    # accept, limits, deadlines, the first head
    ["router.c"],                                   # the route table and matching
    ["routes.c", "metrics.c", "ui.c", "guard.c"],   # handlers; the browser guards
    ["bulk.c"],                                     # bulk kicks and deletes in steps
    ["clients.c"],                                  # GET /clients; lists routes.c's long-polls
    ["request.c"],                                  # what handlers ask of a request
    ["reply.c", "json.c", "idempotency.c", "auth.c",   # responses, rendering, tables,
     "tube_page.c", "framing.c"],                    # pages of tubes, body framing
    ["cors.c"],                                     # the origins that reply.c answers with CORS
]

DECIMAL_PARSERS = r"\b(strtoul|strtoull|strtol|strtoll|atoi|atol|atoll|sscanf)\s*\("


def strip(text):
    """The text without comments, string and character literals (kept as
    empty quotes, so that line starts stay put)."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r'"(\\.|[^"\\\n])*"', '""', text)
    return re.sub(r"'(\\.|[^'\\\n])*'", "''", text)


def definitions(code):
    """gw_* functions and variables a file defines for other files: a line
    that starts at column 0, is not static, and names one before '(' or '='
    (a prototype ends in ';' and is not a definition)."""
    out = set()
    for m in re.finditer(r"^(?!static\b)[A-Za-z_][^;{}()=\n]*?\b(gw_\w+)\s*(\(|=|\[)([^;{]*)(\{|=|;)",
                         code, flags=re.M):
        if m.group(2) == "=" or m.group(4) in ("{", "="):
            out.add(m.group(1))
    return out


def main():
    gateway = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else GATEWAY)
    layer_of = {name: i for i, names in enumerate(LAYERS) for name in names}
    files = sorted(f for f in os.listdir(gateway) if f.endswith(".c"))
    code = {}
    for f in files:
        with open(os.path.join(gateway, f)) as fh:
            code[f] = strip(fh.read())
    errors = []
    defined_in = {}
    for f in files:
        if f not in layer_of:
            errors.append("%s: not placed in a layer (add it to LAYERS in %s)" % (f, __file__))
        for name in definitions(code[f]):
            defined_in[name] = f
    for f in files:
        if f not in layer_of:
            continue
        used = set(re.findall(r"\bgw_\w+\b", code[f]))
        for name in sorted(used):
            g = defined_in.get(name)
            if g is None or g == f:
                continue
            if layer_of[g] <= layer_of[f]:
                errors.append("%s uses %s of %s: %s" % (
                    f, name, g, "a file of the same layer" if layer_of[g] == layer_of[f]
                    else "a layer above"))
        if f != "http.c" and re.search(r"\bMHD_Result\b", code[f]):
            errors.append("%s speaks MHD_Result: only http.c does (handlers return outcomes)" % f)
        for m in re.finditer(DECIMAL_PARSERS, code[f]):
            errors.append("%s reads a number with %s: use bg_parse_u64" % (f, m.group(1)))
    checked = len(defined_in)
    if checked < 30:
        errors.append("found only %d gw_* definitions: the check no longer reads the files" % checked)
    for e in errors:
        print("FAIL %s" % e)
    print("gateway_layers: %d files, %d definitions, %d violations" % (len(files), checked, len(errors)))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
