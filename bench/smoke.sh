#!/usr/bin/env bash
# bench/smoke.sh BEANGATE BENCH - CI's check that the benchmark tool still
# works: every scenario, small and bounded, against a fresh beangate on free
# loopback ports. Not a performance test: it only checks that each run
# completes without an unexpected reply.
set -uo pipefail
G="$1"; B="$2"
# two distinct free loopback ports (testlib.free_port; two separate bind(0) calls may repeat one)
read -r port hport < <(python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); from testlib import free_port
print(free_port(), free_port())' "$(dirname "$0")/../tests/lib")
"$G" -l 127.0.0.1 -p "$port" --http-listen 127.0.0.1 --http-port "$hport" 2>/dev/null & pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null' EXIT
for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/"$port") 2>/dev/null && break; sleep 0.1; done
passed=0; failed=0
run() {
    if out=$("$B" -q --csv -p "$port" --http-port "$hport" --timeout 10 -s 5 "$@" 2>&1); then
        passed=$((passed + 1)); echo "PASS $* -> $(echo "$out" | tail -1)"
    else
        failed=$((failed + 1)); echo "FAIL $*: $out"
    fi
}
run -t put -c 2 -P 16 -d 100 -n 20000
run -t reserve-delete -c 2 -P 16 -d 100 -n 10000
run -t cycle -c 2 -d 100 -n 2000
run -t tubes -c 1 -P 16 -d 100 -T 200 -W 20 -n 5000
run -t http-put -c 4 -d 100 -n 2000
run -t http-put -c 4 -d 100 -n 2000 --http-tubes 10
run -t http-reserve-delete -c 4 -d 100 -n 1000
# --redis: the same client against Redis, when redis-server is installed
if command -v redis-server >/dev/null; then
    rport=$(python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); from testlib import free_port
print(free_port())' "$(dirname "$0")/../tests/lib")
    rdir=$(mktemp -d)
    redis-server --bind 127.0.0.1 --port "$rport" --save '' --appendonly no --dir "$rdir" --logfile '' \
        >/dev/null 2>&1 & rpid=$!
    trap 'kill $pid $rpid 2>/dev/null; wait $pid $rpid 2>/dev/null; rm -rf "$rdir"' EXIT
    for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/"$rport") 2>/dev/null && break; sleep 0.1; done
    port=$rport run --redis -t put -c 2 -P 16 -d 100 -n 20000
    port=$rport run --redis -t reserve-delete -c 2 -P 16 -d 100 -n 10000
    port=$rport run --redis -t cycle -c 2 -d 100 -n 2000
else
    echo "SKIP --redis: redis-server is not installed (scripts/install-deps.sh test installs it)"
fi
echo "bench-smoke: $passed passed, $failed failed"
[ "$failed" = 0 ]
