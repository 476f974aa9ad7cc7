#!/usr/bin/env python3
"""Tests of the runner every Python suite uses (tests/lib/testlib.py).

Usage: python3 tests/lib/test_testlib.py [-k NAME]...

Each test writes a small suite into a temporary directory, runs it with
python3 as a real suite runs, and checks its output lines and exit status:
the registry that cannot miss a test, -k and BEANGATE_TEST_ONLY, the
PASS/FAIL/SKIP lines and the summary, the exit statuses (0, 1, 2, and a
suite's own status when everything was skipped), the hooks, the seed; and
wait_until / wait_ready; free_port. It uses the runner itself, so its last line is
`testlib: N passed, M failed, K skipped`.
"""

import os
import re
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import testlib  # noqa: E402
from testlib import check, check_eq  # noqa: E402

# The head of every suite written by these tests.
SUITE_HEAD = '''
import os, random, sys
sys.path.insert(0, %r)
import testlib
''' % HERE


def run_suite(body, args=(), env=None):
    """Write a suite (SUITE_HEAD + body) and run it: (status, stdout lines)."""
    with tempfile.TemporaryDirectory(prefix="beangate-testlib-") as tmp:
        path = os.path.join(tmp, "suite.py")
        with open(path, "w") as f:
            f.write(SUITE_HEAD + body)
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("BEANGATE_TEST_")}
        full_env.update(env or {})
        p = subprocess.run([sys.executable, path] + list(args), stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, env=full_env, timeout=60)
    return p.returncode, p.stdout.splitlines(), p.stderr


# A suite of three tests: one passes, one fails, one skips.
MIXED = '''
def test_passes():
    testlib.check(True, "never")

def test_fails():
    testlib.check(1 == 2, "one is not two")

def test_skips():
    raise testlib.Skip("not here")

TESTS = [test_passes, test_fails, test_skips]

if __name__ == "__main__":
    args = testlib.parse_args(testlib.arg_parser(__doc__, binary=False), sys.argv)
    sys.exit(testlib.run("mixed", TESTS, args, namespace=globals()))
'''


def test_lines_summary_and_status():
    rc, lines, err = run_suite(MIXED)
    check_eq(rc, 1, "exit status with a failure (stderr %r)" % err)
    check(re.match(r"^seed \d+ ", lines[0]), "first line %r is not the seed" % lines[0])
    check(re.match(r"^PASS test_passes \(\d+\.\d s\)$", lines[1]), "line %r" % lines[1])
    check_eq(lines[2], "FAIL test_fails: one is not two", "the FAIL line")
    check_eq(lines[3], "SKIP test_skips: not here", "the SKIP line")
    check_eq(lines[-1], "mixed: 1 passed, 1 failed, 1 skipped", "the summary is the last line")


def test_registry_catches_a_test_left_out():
    rc, lines, _ = run_suite(MIXED.replace("TESTS = [test_passes, test_fails, test_skips]",
                                           "TESTS = [test_passes, test_passes]"))
    check_eq(rc, 1, "exit status")
    check("FAIL registry: test functions missing from the list of tests: test_fails test_skips" in lines,
          "no registry failure for the tests left out: %r" % lines)
    check("FAIL registry: tests listed twice: test_passes" in lines, "no failure for a test listed twice: %r"
          % lines)


def test_selection():
    rc, lines, _ = run_suite(MIXED, ["-k", "passes"])
    check_eq((rc, lines[-1]), (0, "mixed: 1 passed, 0 failed, 0 skipped"), "-k passes (test_ left out)")
    rc, lines, _ = run_suite(MIXED, ["-k", "test_passes", "-k", "test_skips"])
    check_eq((rc, lines[-1]), (0, "mixed: 1 passed, 0 failed, 1 skipped"), "two -k")
    rc, lines, _ = run_suite(MIXED, env={"BEANGATE_TEST_ONLY": "test_fails"})
    check_eq((rc, lines[-1]), (1, "mixed: 0 passed, 1 failed, 0 skipped"), "BEANGATE_TEST_ONLY")
    rc, lines, err = run_suite(MIXED, ["-k", "test_nothing"])
    check_eq(rc, 2, "a name that is no test")
    check("no test named test_nothing" in err, "stderr %r" % err)
    rc, lines, _ = run_suite(MIXED, ["--list"])
    check_eq((rc, lines), (0, ["test_passes", "test_fails", "test_skips"]), "--list")


def test_a_broken_test_shows_its_traceback():
    rc, lines, _ = run_suite(MIXED.replace('testlib.check(1 == 2, "one is not two")', "{}['key']"))
    check_eq(rc, 1, "exit status")
    fail = [ln for ln in lines if ln.startswith("FAIL test_fails: ")]
    check_eq(fail, ["FAIL test_fails: KeyError: 'key'"], "the FAIL line of an unexpected exception")
    check(any(ln.startswith("Traceback (most recent call last)") for ln in lines), "no traceback: %r" % lines)


HOOKS = '''
LOG = []

def test_one():
    LOG.append("one")

def test_two():
    LOG.append("two")
    raise AssertionError("two failed")

def after(error):
    LOG.append("after " + repr(error))
    if LOG[-2:-1] == ["server_stops"]:
        raise KeyError("broken hook")
    return ["a leak"] if LOG[-2:-1] == ["one"] else []

def server_stops():
    print("log: " + " | ".join(LOG))
    LOG.append("server_stops")

if __name__ == "__main__":
    args = testlib.parse_args(testlib.arg_parser(None, binary=False), sys.argv)
    sys.exit(testlib.run("hooks", [test_one, test_two], args, namespace=globals(), after=after,
                         setup=lambda names: LOG.append("setup " + " ".join(names)),
                         last=(server_stops,), finish=lambda: print("finish")))
'''


def test_hooks():
    rc, lines, _ = run_suite(HOOKS)
    check_eq(rc, 1, "exit status")
    check_eq(lines[1:4], ["FAIL test_one: a leak",
                          "FAIL test_two: two failed",
                          "log: setup test_one test_two | one | after None | two | after 'two failed'"],
             "setup sees the selected names; a problem of after() fails the test; the last check runs")
    check_eq(lines[4], "FAIL server_stops: after the test: KeyError: 'broken hook'",
             "a hook that raises fails the test it ran after")
    check_eq((lines[-3], lines[-1]), ("finish", "hooks: 0 passed, 3 failed, 0 skipped"),
             "finish() prints just before the total time and the summary")
    rc, lines, _ = run_suite(HOOKS.replace("LOG.append(\"setup \" + \" \".join(names))",
                                           "testlib.check(False, 'no server')"))
    check("FAIL setup: AssertionError: no server" in lines, "a failed setup: %r" % lines)
    check_eq(lines[-1], "hooks: 0 passed, 2 failed, 0 skipped", "no test runs after a failed setup; last does")


def test_status_when_everything_is_skipped():
    suite = MIXED.replace('namespace=globals())', 'namespace=globals(), all_skipped=77)')
    rc, lines, _ = run_suite(suite, ["-k", "test_skips"])
    check_eq((rc, lines[-1]), (77, "mixed: 0 passed, 0 failed, 1 skipped"), "every test skipped")
    no_setup = suite.replace("all_skipped=77)", "all_skipped=77, setup=no_namespace)").replace(
        "TESTS = [", "def no_namespace(names):\n    raise testlib.Skip('no namespace here')\n\nTESTS = [")
    rc, lines, _ = run_suite(no_setup)
    check_eq((rc, lines[1:2], lines[-1]), (77, ["SKIP setup: no namespace here"],
                                          "mixed: 0 passed, 0 failed, 1 skipped"), "a setup that skips the suite")
    suite = suite.replace("TESTS = [test_passes, test_fails, test_skips]", "TESTS = []\ndel test_passes, "
                          "test_fails, test_skips")
    rc, lines, _ = run_suite(suite)
    check_eq((rc, lines[-1]), (1, "mixed: 0 passed, 0 failed, 0 skipped"), "no test at all is a failure")


SEEDED = '''
def test_draw():
    print("drew %d" % random.randrange(1 << 40))

if __name__ == "__main__":
    args = testlib.parse_args(testlib.arg_parser(None, binary=False), sys.argv)
    sys.exit(testlib.run("seeded", [test_draw], args, namespace=globals()))
'''


def test_seed_repeats_a_run():
    _, a, _ = run_suite(SEEDED, ["--seed", "12345"])
    _, b, _ = run_suite(SEEDED, env={"BEANGATE_TEST_SEED": "12345"})
    check_eq(a[0], "seed 12345 (--seed 12345 repeats this run's random choices)", "the seed line")
    check_eq(a[1], b[1], "the same draw with --seed and BEANGATE_TEST_SEED")
    check(a[1].startswith("drew "), "line %r" % a[1])


def test_the_binary_argument():
    suite = MIXED.replace("binary=False", "binary=True")
    rc, _, err = run_suite(suite, ["/nonexistent/beangate"])
    check_eq(rc, 2, "exit status for a binary that is not there (stderr %r)" % err)
    check("not an executable: /nonexistent/beangate" in err, "stderr %r" % err)
    rc, lines, _ = run_suite(suite, [sys.executable, "-k", "passes"])
    check_eq((rc, lines[-1]), (0, "mixed: 1 passed, 0 failed, 0 skipped"), "with an executable")


def test_wait_until_and_wait_ready():
    t0 = time.monotonic()
    check_eq(testlib.wait_until(lambda: time.monotonic() - t0 > 0.1 and "done", "0.1 s", step=0.01), "done",
             "wait_until returns the value")
    check_eq(testlib.wait_until(lambda: 7, "seven", ok=lambda v: v == 7), 7, "wait_until with ok")
    try:
        testlib.wait_until(lambda: 0, "a zero to be true", timeout=0.2, step=0.05)
    except AssertionError as e:
        check("waiting for a zero to be true (last: 0)" in str(e), "the timeout's message %r" % str(e))
    else:
        raise AssertionError("wait_until did not raise on its timeout")
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    check_eq(testlib.wait_ready(p, lambda: False, 5.0), "exited", "wait_ready of a process that ended")
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        check_eq(testlib.wait_ready(p, lambda: {}["not yet"], 0.2, not_yet=(KeyError,)), "timeout",
                 "wait_ready that is never ready")
        check_eq(testlib.wait_ready(p, lambda: True, 1.0), "ok", "wait_ready that is ready")
    finally:
        p.kill()
        p.wait()


def test_free_port_never_repeats():
    """bind(0) hands a closed port out again (5,000 draws from the ~28,000
    ephemeral ports repeat hundreds of times); free_port never gives one
    process the same port twice, and each is free to bind."""
    ports = [testlib.free_port() for _ in range(5000)]
    check_eq(len(set(ports)), len(ports), "distinct ports in 5,000 draws")
    for port in ports[-3:]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_doc_block():
    """doc_block returns the code block after its marker, not another one,
    and says which document lacks a marker."""
    with tempfile.TemporaryDirectory(prefix="beangate-testlib-") as tmp:
        path = os.path.join(tmp, "doc.md")
        with open(path, "w") as f:
            f.write("# t\n\n<!-- a: run me -->\n```python\nprint(1)\nprint(2)\n```\n\n"
                    "<!-- b -->\n\n```sh\necho b\n```\n")
        check_eq(testlib.doc_block(path, "a"), "print(1)\nprint(2)", "the block after <!-- a")
        check_eq(testlib.doc_block(path, "b"), "echo b", "the block after <!-- b")
        try:
            testlib.doc_block(path, "c")
        except AssertionError as e:
            check("doc.md has no code block after <!-- c" in str(e), "the message %r" % str(e))
        else:
            raise AssertionError("doc_block found a block for a marker that is not there")


TESTS = [
    test_lines_summary_and_status,
    test_registry_catches_a_test_left_out,
    test_selection,
    test_a_broken_test_shows_its_traceback,
    test_hooks,
    test_status_when_everything_is_skipped,
    test_seed_repeats_a_run,
    test_the_binary_argument,
    test_wait_until_and_wait_ready,
    test_free_port_never_repeats,
    test_doc_block,
]


if __name__ == "__main__":
    sys.exit(testlib.main_without_binary("testlib", __doc__, TESTS, sys.argv, globals()))
