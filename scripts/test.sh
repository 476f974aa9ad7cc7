#!/usr/bin/env bash
# Install what is missing, build, and run every test:
#   normal     the normal build: unit tests (cmocka), recorded codec cases,
#              integration tests over TCP and HTTP, the differential test
#              against Debian's beanstalkd, real client libraries' own test
#              suites, the OpenAPI contract check, the write-ahead log's
#              crash tests;
#   package    the Debian package (tests/package/test_package.py): build it
#              (scripts/build-deb.sh), lintian, install it, run the installed
#              server as its unit says (systemd where it runs), put and
#              reserve over TCP and HTTP, remove and purge; as root with dpkg
#              only, and not over a beangate package it did not install:
#              elsewhere a SKIP line says why;
#   asan       the same suites again in an AddressSanitizer +
#              UndefinedBehaviorSanitizer build;
#   fuzz       the libFuzzer harnesses: the codec for FUZZ_SECONDS (default
#              60), the log reader for FUZZ_LOG_SECONDS (default 30) and the
#              Gearman codec for FUZZ_GEARMAN_SECONDS (default 30); the codec's
#              and the Gearman harness run one session under a scope
#              (fuzz/fuzz_scopes.h);
#   container  the container image: build, run, put over HTTP, reserve over
#              TCP, restart on the same volume (docker/smoke-test), where
#              docker or podman works; elsewhere a SKIP line says why.
#
#   scripts/test.sh                 # every stage, in that order
#   scripts/test.sh normal fuzz     # only these stages
#
# A beangate or beanstalkd already running on 127.0.0.1:11300 (say, from
# scripts/run.sh) does not matter: the suites pick free ports, and the client
# suites, whose port is fixed, run in a private network namespace
# (tests/client/run_client_suite.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
all_stages=(normal package asan fuzz container)
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=("${all_stages[@]}")
for s in "${stages[@]}"; do
    case " ${all_stages[*]} " in
        *" $s "*) ;;
        *) echo "scripts/test.sh: unknown stage '$s' (stages: ${all_stages[*]})" >&2; exit 2 ;;
    esac
done
wants() { case " ${stages[*]} " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

scripts/install-deps.sh test
jobs="$(nproc)"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
skipped=()

# Run a stage's command (its output shown as it runs): exit status 77 means
# it cannot run here, which is a skip with the reason of its last line that
# starts with PREFIX (no / in it); any other failure ends the run.
run_skippable() {
    local label=$1 prefix=$2 out status=0
    shift 2
    out=$(mktemp)
    "$@" | tee "$out" || status=${PIPESTATUS[0]}
    local why
    why=$(sed -n "s/^$prefix//p" "$out" | tail -n 1)
    rm -f "$out"
    if [ "$status" = 77 ]; then
        skipped+=("$label: $why")
    elif [ "$status" != 0 ]; then
        exit "$status"
    fi
}

if wants normal; then
    echo "== normal build"
    cmake -S . -B build -DBEANGATE_TESTS=ON >/dev/null
    cmake --build build -j"$jobs"
    ctest --test-dir build --output-on-failure
fi

if wants package; then
    echo "== Debian package (build, lintian, install, run, remove, purge)"
    # exit status 77: it cannot run here (not root, no dpkg, a beangate
    # package of someone else's); its SKIP line says why
    run_skippable "Debian package" "SKIP setup: " tests/package/test_package.py --install
fi

if wants asan; then
    echo "== ASan + UBSan build"
    cmake -S . -B build-asan -DBEANGATE_TESTS=ON -DBEANGATE_SANITIZE=ON >/dev/null
    cmake --build build-asan -j"$jobs"
    ctest --test-dir build-asan --output-on-failure
fi

if wants fuzz; then
    echo "== fuzzing the codec for ${FUZZ_SECONDS:-60} s, the log reader for ${FUZZ_LOG_SECONDS:-30} s, the Gearman codec for ${FUZZ_GEARMAN_SECONDS:-30} s and the binlog reader for ${FUZZ_BINLOG_SECONDS:-30} s"
    CC=clang cmake -S . -B build-fuzz -DBEANGATE_TESTS=OFF -DBEANGATE_FUZZ=ON >/dev/null
    cmake --build build-fuzz -j"$jobs" --target fuzz_codec fuzz_journal fuzz_gearman fuzz_binlog
    mkdir -p build-fuzz/corpus build-fuzz/corpus-journal build-fuzz/corpus-gearman build-fuzz/corpus-binlog
    # new inputs go to build-fuzz/; the seeds in fuzz/ are read only
    build-fuzz/fuzz/fuzz_codec -max_total_time="${FUZZ_SECONDS:-60}" -max_len=4096 \
        -print_final_stats=1 build-fuzz/corpus fuzz/corpus 2>&1 | tail -n 5
    build-fuzz/fuzz/fuzz_journal -max_total_time="${FUZZ_LOG_SECONDS:-30}" -max_len=8192 \
        -print_final_stats=1 build-fuzz/corpus-journal fuzz/corpus-journal 2>&1 | tail -n 5
    build-fuzz/fuzz/fuzz_gearman -max_total_time="${FUZZ_GEARMAN_SECONDS:-30}" -max_len=4096 \
        -print_final_stats=1 build-fuzz/corpus-gearman fuzz/corpus-gearman 2>&1 | tail -n 5
    build-fuzz/fuzz/fuzz_binlog -max_total_time="${FUZZ_BINLOG_SECONDS:-30}" -max_len=8192 \
        -print_final_stats=1 build-fuzz/corpus-binlog fuzz/corpus-binlog 2>&1 | tail -n 5
    echo "fuzz: 4 passed, 0 failed"
fi

if wants container; then
    echo "== container image (docker/smoke-test: docker or podman, where one works)"
    # exit status 77: no working container engine; its SKIP line says why
    run_skippable "container image" "SKIP container image: " docker/smoke-test
fi

if [ ${#skipped[@]} -gt 0 ]; then
    for s in "${skipped[@]}"; do echo "SKIP $s"; done
    echo "all test suites passed (${stages[*]}), ${#skipped[@]} skipped (see the SKIP lines)"
else
    echo "all test suites passed (${stages[*]})"
fi
