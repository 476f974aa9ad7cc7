#!/usr/bin/env bash
# Run real beanstalk client libraries' OWN test suites, unchanged, against a
# server binary that takes beanstalkd-style flags (-l ADDR -p PORT).
#
#   tests/client/run_client_suite.sh [--install-only] SERVER_BINARY [SUITE...]
#
# SUITE is one or more of: fivebeans jackd   (default: all of them)
#
# Both libraries' tests hard-code the server address (127.0.0.1:11300 /
# localhost:11300), so the server is started on 127.0.0.1:11300.  So that a
# server already there (say, scripts/run.sh) does not matter, the suites run
# in a private network namespace with its own loopback: `unshare --net` as
# root, `unshare -rn` (a user namespace) otherwise.  Where neither works, the
# host's 127.0.0.1:11300 is used, and if it is taken the script says which
# process holds it and stops.  Each suite gets a fresh server process (the
# suites assume an empty server).  The pinned library and its test
# devDependencies are installed from the npm registry with `npm ci` into
# $CLIENT_SUITE_DIR (default: <repo>/build/client-suite), never into the
# source tree, before entering the namespace (which has no network).
# --install-only installs and exits.  See tests/client/README.md.
#
# Environment:
#   CLIENT_SUITE_DIR      install/cache/log directory (default <repo>/build/client-suite)
#   CLIENT_SUITE_TIMEOUT  hard wall-clock limit per suite in seconds (default 120)
#   CLIENT_SUITE_NETNS    auto (default): a private network namespace where
#                         possible; off: always the host's network
#
# Exit status: 0 if every selected suite passed, 1 if any test failed or a
# suite did not complete, 2 on usage/setup errors.
# The last line of output is:  client-suite: N passed, M failed, K skipped

set -u -o pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
HOST=127.0.0.1
PORT=11300          # hard-coded in both client test suites
ALL_SUITES="fivebeans jackd"
SUITE_TIMEOUT="${CLIENT_SUITE_TIMEOUT:-120}"
WORK="${CLIENT_SUITE_DIR:-$REPO/build/client-suite}"

die() { echo "run_client_suite: ERROR: $*" >&2; echo "client-suite: 0 passed, 1 failed"; exit 2; }
log() { echo "run_client_suite: $*"; }

# ---------------------------------------------------------------- arguments
INSTALL_ONLY=0
[ "${1:-}" = --install-only ] && { INSTALL_ONLY=1; shift; }
[ $# -ge 1 ] || { echo "usage: $0 [--install-only] SERVER_BINARY [fivebeans|jackd ...]" >&2; exit 2; }
SERVER="$1"; shift
case "$SERVER" in /*) ;; *) SERVER="$(pwd)/$SERVER" ;; esac
[ -x "$SERVER" ] || die "server binary '$SERVER' does not exist or is not executable"
SUITES="${*:-$ALL_SUITES}"
for s in $SUITES; do
    case " $ALL_SUITES " in *" $s "*) ;; *) die "unknown suite '$s' (known: $ALL_SUITES)";; esac
done

# ---------------------------------------------------------------- node / npm
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    log "node/npm not found; installing Debian packages nodejs npm"
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nodejs npm >/dev/null \
        || die "apt-get install nodejs npm failed"
fi
command -v node >/dev/null 2>&1 || die "node still not available"
log "node $(node -v), npm $(npm -v 2>/dev/null)"
# Both suites connect to "localhost"/127.0.0.1; make name resolution prefer
# IPv4 so "localhost" always reaches the server we bind on 127.0.0.1.
export NODE_OPTIONS="${NODE_OPTIONS:+$NODE_OPTIONS }--dns-result-order=ipv4first"
export npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false

mkdir -p "$WORK" || die "cannot create $WORK"

# ---------------------------------------------------------------- helpers
port_open() {   # true if something accepts TCP connections on $HOST:$PORT
    (exec 3<>"/dev/tcp/$HOST/$PORT") 2>/dev/null
}

port_holder() {  # "NAME PID" of the process listening on $PORT, or nothing
    ss -ltnpH "sport = :$PORT" 2>/dev/null |
        sed -n 's/.*users:(("\([^"]*\)",pid=\([0-9]*\),.*/\1 \2/p' | head -n 1
}

port_taken() {  # the end of the run: say which process holds $HOST:$PORT
    local name="" pid="" who
    read -r name pid < <(port_holder) || true
    if [ -n "$pid" ]; then
        who="$name (pid $pid) holds it: stop it (kill $pid, or Ctrl-C where scripts/run.sh runs)"
    else
        who="a process of another user holds it (sudo ss -ltnp 'sport = :$PORT' names it): stop it"
    fi
    die "$HOST:$PORT is in use, and this machine cannot give the client suites a private network namespace ($NETNS_WHY). The suites hard-code port $PORT; $who, and retry."
}

SERVER_PID=""
stop_server() {
    if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -TERM "$SERVER_PID" 2>/dev/null
        for _ in $(seq 1 30); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$SERVER_PID" 2>/dev/null && kill -KILL "$SERVER_PID" 2>/dev/null
        wait "$SERVER_PID" 2>/dev/null
    fi
    SERVER_PID=""
}
trap 'stop_server' EXIT
trap 'stop_server; echo "client-suite: 0 passed, 1 failed (interrupted)"; exit 130' INT TERM

start_server() {  # $1 = log file
    port_open && port_taken
    # SERVER_ARGS: extra flags for the server under test, e.g. --no-http
    # shellcheck disable=SC2086
    "$SERVER" -l "$HOST" -p "$PORT" ${SERVER_ARGS:-} >"$1" 2>&1 &
    SERVER_PID=$!
    for _ in $(seq 1 100); do
        kill -0 "$SERVER_PID" 2>/dev/null || { cat "$1" >&2; die "server exited during startup"; }
        port_open && return 0
        sleep 0.05
    done
    cat "$1" >&2
    die "server did not accept connections on $HOST:$PORT within 5s"
}

install_suite() {  # $1 = suite name; installs pinned deps into $WORK/$1
    local src="$HERE/$1" dst="$WORK/$1" stamp
    mkdir -p "$dst"
    stamp="$(cat "$src/package.json" "$src/package-lock.json" | sha256sum | cut -d' ' -f1)"
    if [ -f "$dst/.installed" ] && [ "$(cat "$dst/.installed")" = "$stamp" ] && [ -d "$dst/node_modules" ]; then
        log "$1: using cached install in $dst"
        return 0
    fi
    log "$1: installing pinned packages into $dst"
    rm -rf "$dst/node_modules" "$dst/.installed"
    cp "$src/package.json" "$src/package-lock.json" "$dst/"
    ( cd "$dst" && npm ci --ignore-scripts --prefer-offline --no-audit --no-fund --loglevel=error ) \
        >"$dst/npm-install.log" 2>&1 || { cat "$dst/npm-install.log" >&2; return 1; }
    echo "$stamp" >"$dst/.installed"
}

# ---------------------------------------------------------------- install, then isolate
# npm needs the network, which the namespace has not: install first (in the
# namespace run_suite finds the installs; a failure is reported there)
if [ -z "${CLIENT_SUITE_IN_NETNS:-}" ]; then
    for s in $SUITES; do
        install_suite "$s" || [ "$INSTALL_ONLY" = 0 ] || die "$s: npm install failed"
    done
fi
[ "$INSTALL_ONLY" = 0 ] || exit 0

NETNS_WHY=""
if [ -n "${CLIENT_SUITE_IN_NETNS:-}" ]; then
    ip link set lo up || die "cannot bring up lo in the private network namespace (ip is in iproute2)"
    log "in a private network namespace: a server on the host's $HOST:$PORT does not matter"
elif [ "${CLIENT_SUITE_NETNS:-auto}" = off ]; then
    NETNS_WHY="CLIENT_SUITE_NETNS=off"
else
    # root: a network namespace; anyone: a user namespace with one, where
    # the kernel allows them
    ways=("--user --map-root-user --net")
    [ "$(id -u)" -ne 0 ] || ways=("--net" "${ways[@]}")
    for way in "${ways[@]}"; do
        # shellcheck disable=SC2086
        if err="$(unshare $way true 2>&1)"; then
            # shellcheck disable=SC2086
            CLIENT_SUITE_IN_NETNS=1 exec unshare $way -- "$0" "$SERVER" $SUITES
        fi
        NETNS_WHY="${NETNS_WHY:+$NETNS_WHY; }unshare $way: ${err:-failed}"
    done
    log "no private network namespace ($NETNS_WHY): the suites use the host's $HOST:$PORT"
fi
port_open && port_taken

TOTAL_PASS=0; TOTAL_FAIL=0; TOTAL_SKIP=0; STATUS=0
SUMMARIES=()

run_suite() {  # $1 = suite name
    local name="$1" dir pkgdir ver out rc pass fail pend excluded=0 t0 t1
    local -a cmd
    dir="$WORK/$name"
    if ! install_suite "$name"; then
        log "$name: npm install failed"
        TOTAL_FAIL=$((TOTAL_FAIL + 1)); STATUS=1
        SUMMARIES+=("client-suite $name: 0 passed, 1 failed (npm install failed)")
        return
    fi
    pkgdir="$dir/node_modules/$name"
    ver="$(node -p "require('$pkgdir/package.json').version")"

    case "$name" in
    fivebeans)
        # Its package.json test script is `nyc mocha -t 8000 -R spec test/`;
        # nyc only adds coverage, so mocha is run directly with the same args.
        # Excluded (see README): 'emits the error event on failure' asserts
        # err.errno === 'ECONNREFUSED', which held only on old Node
        # releases (current Node reports errno as a number, -111); it never talks to the server.
        cmd=(node "$dir/node_modules/mocha/bin/_mocha" -t 8000 -R spec test/
             --grep 'emits the error event on failure' --invert)
        excluded=1
        ;;
    jackd)
        # Its package.json test script is `mocha --bail`; we drop --bail so a
        # failure does not hide the remaining results, and add --exit so a
        # socket left open by a failed test cannot hang the run.
        cmd=(node "$dir/node_modules/mocha/bin/_mocha" -R spec --exit)
        ;;
    esac

    echo
    echo "=================== $name@$ver (own test suite, unchanged) vs $(basename "$SERVER") on $HOST:$PORT"
    out="$dir/mocha.log"
    start_server "$dir/server.log"
    t0=$(date +%s)
    ( cd "$pkgdir" && timeout -k 5 "$SUITE_TIMEOUT" "${cmd[@]}" ) 2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
    t1=$(date +%s)
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
        log "$name: SERVER DIED during the suite; its output:"; cat "$dir/server.log"
    fi
    stop_server

    pass="$(grep -Eo '^ *[0-9]+ passing' "$out" | tail -1 | grep -Eo '[0-9]+')"
    fail="$(grep -Eo '^ *[0-9]+ failing' "$out" | tail -1 | grep -Eo '[0-9]+')"
    pend="$(grep -Eo '^ *[0-9]+ pending' "$out" | tail -1 | grep -Eo '[0-9]+')"
    pass=${pass:-0}; fail=${fail:-0}; pend=${pend:-0}
    local note=""
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        note=" (suite TIMED OUT after ${SUITE_TIMEOUT}s)"; fail=$((fail + 1))
    elif ! grep -Eq '^ *[0-9]+ passing' "$out"; then
        note=" (mocha crashed, exit $rc)"; fail=$((fail + 1))
    elif [ "$rc" -ne 0 ] && [ "$fail" -eq 0 ]; then
        note=" (mocha exit $rc)"; fail=1
    fi
    [ "$fail" -eq 0 ] || STATUS=1
    local skip=$((pend + excluded))
    TOTAL_PASS=$((TOTAL_PASS + pass)); TOTAL_FAIL=$((TOTAL_FAIL + fail)); TOTAL_SKIP=$((TOTAL_SKIP + skip))
    SUMMARIES+=("client-suite $name@$ver: $pass passed, $fail failed, $skip skipped, $((t1 - t0))s$note")
}

for s in $SUITES; do run_suite "$s"; done

echo
for l in "${SUMMARIES[@]}"; do echo "$l"; done
echo "client-suite: $TOTAL_PASS passed, $TOTAL_FAIL failed, $TOTAL_SKIP skipped"
exit $STATUS
