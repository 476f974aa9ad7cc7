#!/usr/bin/env bash
# The HTTP contract check: the server must answer exactly as
# openapi/openapi.yaml says.
#
#   tests/http/run_contract.sh build/beangate
#
# 1. lints openapi/openapi.yaml with Redocly CLI (recommended rules);
# 2. starts beangate on free loopback ports and `prism proxy --errors` in
#    front of its HTTP port, and runs tests/http/test_http.py through the
#    proxy (--base-url). Prism checks every request and response against the
#    document; a response that breaks it comes back as 500 with an
#    `sl-violations` header, which the test runner reports as a failure.
#
# Tools are pinned and installed once with npm into
# build/contract-tools (CONTRACT_TOOLS_DIR overrides); node and npm come from
# apt if missing. Ends with `contract: N passed, M failed`; exits 1 on failure.
set -uo pipefail

PRISM_VERSION=5.14.2          # 5.15+ wants node >= 24
REDOCLY_VERSION=2.77.0        # needs node >= 20.19 (else the 1.x line below)
REDOCLY_VERSION_OLD_NODE=1.34.20   # 1.34.21 cannot be installed (a dependency was never published)

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
if [ $# -ne 1 ] || [ ! -x "$1" ]; then
    echo "usage: $0 PATH/TO/beangate" >&2
    exit 2
fi
binary="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
spec="$repo/openapi/openapi.yaml"
tools="${CONTRACT_TOOLS_DIR:-$repo/build/contract-tools}"
work="$(mktemp -d)"
passed=0
failed=0
server_pid=""
prism_pid=""

# shellcheck disable=SC2317  # called through the trap
cleanup() {
    if [ -n "$prism_pid" ] && kill -0 "$prism_pid" 2>/dev/null; then
        kill "$prism_pid" 2>/dev/null
        wait "$prism_pid" 2>/dev/null
    fi
    if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
        kill -KILL "$server_pid" 2>/dev/null
        wait "$server_pid" 2>/dev/null
    fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

pass() { passed=$((passed + 1)); echo "PASS $1"; }
fail() { failed=$((failed + 1)); echo "FAIL $1"; }
finish() {
    echo "contract: $passed passed, $failed failed"
    [ "$failed" -eq 0 ]
    exit $?
}

# ---- tools --------------------------------------------------------------------
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "== installing node and npm with apt"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null
fi
node_ok_for_redocly2="$(node -e '
    const [a, b] = process.versions.node.split(".").map(Number);
    console.log(a >= 22 || (a === 20 && b >= 19) ? 1 : 0)')"
if [ "$node_ok_for_redocly2" != 1 ]; then
    REDOCLY_VERSION="$REDOCLY_VERSION_OLD_NODE"
fi

# npm_install DIR PACKAGE VERSION: install once into DIR (kept between runs)
npm_install() {
    local dir="$1" pkg="$2" version="$3" have
    have="$(node -e "try{console.log(require('$dir/node_modules/$pkg/package.json').version)}catch(e){}" 2>/dev/null)"
    if [ "$have" = "$version" ]; then
        return 0
    fi
    echo "== installing $pkg@$version into $dir"
    mkdir -p "$dir"
    npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "$pkg@$version" >"$work/npm.log" 2>&1 ||
        { cat "$work/npm.log"; return 1; }
}
prism_dir="$tools/prism-$PRISM_VERSION"
redocly_dir="$tools/redocly-$REDOCLY_VERSION"
if ! npm_install "$prism_dir" @stoplight/prism-cli "$PRISM_VERSION"; then
    fail "install @stoplight/prism-cli@$PRISM_VERSION"
    finish
fi
if ! npm_install "$redocly_dir" @redocly/cli "$REDOCLY_VERSION"; then
    fail "install @redocly/cli@$REDOCLY_VERSION"
    finish
fi
prism="$prism_dir/node_modules/.bin/prism"
redocly="$redocly_dir/node_modules/.bin/redocly"

# ---- 1. lint ----------------------------------------------------------------------
echo "== redocly lint ($REDOCLY_VERSION)"
lint_args=(lint --format=stylish)
[ -f "$repo/openapi/redocly.yaml" ] && lint_args+=(--config "$repo/openapi/redocly.yaml")
if REDOCLY_TELEMETRY=off NO_UPDATE_NOTIFIER=1 "$redocly" "${lint_args[@]}" "$spec" >"$work/lint.log" 2>&1 &&
    ! grep -qE 'You have [0-9]+ warnings?|Validation failed' "$work/lint.log"; then
    grep -E 'valid|validated' "$work/lint.log"
    pass "redocly_lint"
else
    grep -vE '^\s*(║|╔|╚)' "$work/lint.log"
    fail "redocly_lint (warnings count as failures)"
fi

# ---- 2. server and proxy -------------------------------------------------------------
# three_free_ports: three distinct free loopback ports on one line (testlib.free_port)
three_free_ports() {
    python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); from testlib import free_port
print(free_port(), free_port(), free_port())' "$here/../lib"
}
# wait_http URL SECONDS: until GET URL answers 200
wait_http() {
    python3 - "$1" "$2" <<'EOF'
import sys, time, urllib.request
url, limit = sys.argv[1], float(sys.argv[2])
deadline = time.monotonic() + limit
while time.monotonic() < deadline:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            if r.status == 200:
                sys.exit(0)
    except Exception:
        pass
    time.sleep(0.1)
sys.exit(1)
EOF
}

started=0
for _attempt in 1 2 3; do
    read -r tcp_port http_port proxy_port < <(three_free_ports)
    "$binary" -l 127.0.0.1 -p "$tcp_port" --http-listen 127.0.0.1 --http-port "$http_port" \
        --push "tube=http-push url=http://127.0.0.1:1/ attempts=1" \
        </dev/null >"$work/server.out" 2>"$work/server.err" &
    server_pid=$!
    if wait_http "http://127.0.0.1:$http_port/stats" 10; then
        started=1
        break
    fi
    kill -KILL "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; server_pid=""
done
if [ "$started" != 1 ]; then
    cat "$work/server.err"
    fail "start beangate"
    finish
fi
echo "== beangate pid $server_pid: TCP $tcp_port, HTTP $http_port"

"$prism" proxy "$spec" "http://127.0.0.1:$http_port" --errors --host 127.0.0.1 --port "$proxy_port" \
    </dev/null >"$work/prism.log" 2>&1 &
prism_pid=$!
if ! wait_http "http://127.0.0.1:$proxy_port/stats" 60; then
    tail -n 40 "$work/prism.log"
    fail "start prism proxy"
    finish
fi
echo "== prism $PRISM_VERSION proxy on $proxy_port"

# ---- 3. the HTTP tests through the proxy ---------------------------------------------------
timeout 900 python3 "$here/test_http.py" "$binary" --base-url "http://127.0.0.1:$proxy_port" \
    --direct-url "http://127.0.0.1:$http_port" --tcp-port "$tcp_port" --server-pid "$server_pid" \
    2>&1 | tee "$work/tests.log"
summary="$(grep -E '^http: [0-9]+ passed, [0-9]+ failed' "$work/tests.log" | tail -n 1)"
if [ -z "$summary" ]; then
    fail "test_http.py printed no summary"
else
    p="$(echo "$summary" | sed -E 's/^http: ([0-9]+) passed.*/\1/')"
    f="$(echo "$summary" | sed -E 's/^http: [0-9]+ passed, ([0-9]+) failed.*/\1/')"
    passed=$((passed + p))
    failed=$((failed + f))
fi

# Prism also logs every violation it saw (errors and warnings); any at all fails.
if grep -qE 'Violation|stoplight.io/prism/errors#' "$work/prism.log"; then
    echo "prism logged violations:"
    grep -E 'Violation|stoplight.io/prism/errors#' "$work/prism.log" | sed -E 's/\x1b\[[0-9;]*m//g' | sort | uniq -c | sed 's/^/  /'
    fail "no_prism_violations"
else
    pass "no_prism_violations"
fi

# ---- 4. stop -----------------------------------------------------------------------------
kill "$prism_pid" 2>/dev/null; wait "$prism_pid" 2>/dev/null; prism_pid=""
kill -TERM "$server_pid" 2>/dev/null
status=""
for _ in $(seq 50); do
    if ! kill -0 "$server_pid" 2>/dev/null; then
        wait "$server_pid"; status=$?
        break
    fi
    sleep 0.1
done
if [ "$status" = 0 ]; then
    server_pid=""
    pass "server_stops_cleanly"
else
    tail -n 20 "$work/server.err"
    fail "server_stops_cleanly (exit status ${status:-none within 5 s})"
fi
finish
