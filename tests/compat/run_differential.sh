#!/usr/bin/env bash
# Differential test: beangate vs Debian's beanstalkd.
#
#   tests/compat/run_differential.sh [BEANGATE_BINARY] [extra differential.py flags...]
#
# BEANGATE_BINARY defaults to build/beangate next to this repo; pass
# /usr/bin/beanstalkd (or use --against-reference) to self-check the tool.
# Environment (flags given after the binary win):
#   DIFF_STREAMS   number of streams              (default 40)
#   DIFF_COMMANDS  units (commands) per stream    (default 300)
#   DIFF_SEED      master seed                    (default: random, printed)
#   DIFF_JOBS      streams run concurrently       (default 4)
#   DIFF_SAVE      directory for repro files of failing streams (optional)
# Exit status: 0 no divergence, 1 divergence(s), 2 setup problem.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

bin="${1:-$repo/build/beangate}"
[ $# -gt 0 ] && shift

if [ ! -x /usr/bin/beanstalkd ]; then
    echo "run_differential: installing Debian's beanstalkd (reference)" >&2
    sudo_cmd=()
    if [ "$(id -u)" != 0 ]; then sudo_cmd=(sudo); fi
    export DEBIAN_FRONTEND=noninteractive
    "${sudo_cmd[@]}" apt-get install -y beanstalkd >&2 \
        || { "${sudo_cmd[@]}" apt-get update >&2 && "${sudo_cmd[@]}" apt-get install -y beanstalkd >&2; }
fi

if [ ! -x "$bin" ]; then
    echo "run_differential: no executable at $bin (build beangate first)" >&2
    echo "differential: 0 passed, 1 failed"
    exit 2
fi

args=(--streams "${DIFF_STREAMS:-40}" --commands "${DIFF_COMMANDS:-300}" --jobs "${DIFF_JOBS:-4}")
[ -n "${DIFF_SEED:-}" ] && args+=(--seed "$DIFF_SEED")
[ -n "${DIFF_SAVE:-}" ] && args+=(--save "$DIFF_SAVE")

exec python3 "$here/differential.py" "$bin" --reference /usr/bin/beanstalkd "${args[@]}" "$@"
