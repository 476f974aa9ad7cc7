#!/usr/bin/env bash
# Install what is missing, build, and run every test:
#   1. the normal build: unit tests (cmocka), recorded codec cases,
#      integration tests over TCP and HTTP, the differential test against
#      Debian's beanstalkd, real client libraries' own test suites, the
#      OpenAPI contract check, the write-ahead log's crash tests;
#   2. the same suites again in an AddressSanitizer + UndefinedBehaviorSanitizer build;
#   3. the libFuzzer harnesses: the codec for FUZZ_SECONDS (default 60),
#      the log reader for FUZZ_LOG_SECONDS (default 30) and the Gearman codec
#      for FUZZ_GEARMAN_SECONDS (default 30);
#   4. the container image: build, run, put over HTTP, reserve over TCP,
#      restart on the same volume (docker/smoke-test).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh test
jobs="$(nproc)"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

echo "== normal build"
cmake -S . -B build -DBEANGATE_TESTS=ON >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure

echo "== ASan + UBSan build"
cmake -S . -B build-asan -DBEANGATE_TESTS=ON -DBEANGATE_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$jobs"
ctest --test-dir build-asan --output-on-failure

echo "== fuzzing the codec for ${FUZZ_SECONDS:-60} s, the log reader for ${FUZZ_LOG_SECONDS:-30} s and the Gearman codec for ${FUZZ_GEARMAN_SECONDS:-30} s"
CC=clang cmake -S . -B build-fuzz -DBEANGATE_TESTS=OFF -DBEANGATE_FUZZ=ON >/dev/null
cmake --build build-fuzz -j"$jobs" --target fuzz_codec fuzz_journal fuzz_gearman
mkdir -p build-fuzz/corpus build-fuzz/corpus-journal build-fuzz/corpus-gearman
# new inputs go to build-fuzz/; the seeds in fuzz/ are read only
build-fuzz/fuzz/fuzz_codec -max_total_time="${FUZZ_SECONDS:-60}" -max_len=4096 \
    -print_final_stats=1 build-fuzz/corpus fuzz/corpus 2>&1 | tail -n 5
build-fuzz/fuzz/fuzz_journal -max_total_time="${FUZZ_LOG_SECONDS:-30}" -max_len=8192 \
    -print_final_stats=1 build-fuzz/corpus-journal fuzz/corpus-journal 2>&1 | tail -n 5
build-fuzz/fuzz/fuzz_gearman -max_total_time="${FUZZ_GEARMAN_SECONDS:-30}" -max_len=4096 \
    -print_final_stats=1 build-fuzz/corpus-gearman fuzz/corpus-gearman 2>&1 | tail -n 5
echo "fuzz: 3 passed, 0 failed"

echo "== container image (docker, or podman-local where there is no engine)"
docker/smoke-test
echo "all test suites passed"
