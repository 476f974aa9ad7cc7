#!/usr/bin/env bash
# Install build dependencies, build beangate, and start it in the foreground
# with in-memory defaults (beanstalk protocol on 127.0.0.1:11300).
# Extra arguments are passed to beangate, e.g. scripts/run.sh -p 11400 -V
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh build
cmake -S . -B build -DBEANGATE_TESTS=OFF >/dev/null
cmake --build build -j"$(nproc)" --target beangate >/dev/null
exec build/beangate "$@"
