#!/usr/bin/env python3
"""The client suites do not care about a server already on 127.0.0.1:11300.

Usage: python3 tests/client/test_isolation.py BEANGATE_BINARY

The client libraries' suites hard-code 127.0.0.1:11300, where a user who
followed the README still has `scripts/run.sh` running. This test:

1. installs the suites' packages (run_client_suite.sh --install-only: npm
   needs the network);
2. enters a private network namespace of its own (unshare, as the runner
   does), so that the "outside" server below is its own and a real server
   on this machine's 11300 is neither needed nor touched;
3. starts beangate on 127.0.0.1:11300 there (the outside server), puts a
   job into it and reads its stats on one connection;
4. runs tests/client/run_client_suite.sh (both suites): it must pass, in a
   namespace of its own;
5. checks, on the same connection, that the outside server saw nothing:
   total-jobs, total-connections, cmd-put and its job unchanged;
6. with CLIENT_SUITE_NETNS=off (no namespace) the runner must stop with
   exit status 2 and name the process that holds the port and its pid.

Exit status 0 if every check passed, 1 if one failed, 77 (skipped) where no
network namespace can be made (unshare --net needs root, unshare -rn needs
user namespaces). The runner is tests/lib/testlib.py's; the last line is
`client-isolation: N passed, M failed, K skipped`.
"""

import os
import re
import socket
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import testlib  # noqa: E402
from testlib import check, check_eq  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RUNNER = os.path.join(HERE, "run_client_suite.sh")
INSIDE = "BEANGATE_ISOLATION_TEST_IN_NETNS"
SKIP = 77
PORT = 11300
RUNNER_TIMEOUT = 600


def ways_to_isolate():
    """unshare arguments that make a network namespace here, best first."""
    ways = [["--user", "--map-root-user", "--net"]]
    if os.geteuid() == 0:
        ways.insert(0, ["--net"])
    return ways


def enter_namespace(argv):
    """Re-run this test in a private network namespace; never returns
    (raises testlib.Skip if none can be made)."""
    why = []
    for way in ways_to_isolate():
        probe = subprocess.run(["unshare"] + way + ["true"], capture_output=True, text=True)
        if probe.returncode == 0:
            env = dict(os.environ, **{INSIDE: "1"})
            os.execvpe("unshare", ["unshare"] + way + ["--", sys.executable] + argv, env)
        why.append("unshare %s: %s" % (" ".join(way), probe.stderr.strip() or "failed"))
    raise testlib.Skip("no private network namespace here (%s)" % "; ".join(why))


class Beanstalk:
    """One connection to the outside server."""

    def __init__(self):
        self.s = socket.create_connection(("127.0.0.1", PORT), timeout=5)
        self.buf = b""

    def line(self):
        while b"\r\n" not in self.buf:
            d = self.s.recv(65536)
            check(d, "the outside server closed the connection")
            self.buf += d
        i = self.buf.index(b"\r\n") + 2
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def exact(self, n):
        while len(self.buf) < n:
            d = self.s.recv(65536)
            check(d, "the outside server closed the connection")
            self.buf += d
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def cmd(self, data):
        self.s.sendall(data)
        return self.line()

    def stats(self):
        head = self.cmd(b"stats\r\n")
        check(head.startswith(b"OK "), "stats: %r" % head)
        body = self.exact(int(head.split()[1]) + 2).decode()
        return dict(ln.split(": ", 1) for ln in body.splitlines() if ": " in ln)


def wait_listening(proc, timeout):
    status = testlib.wait_ready(proc, lambda: socket.create_connection(("127.0.0.1", PORT), timeout=1).close()
                                or True, timeout, step=0.05)
    check(status != "exited", "the outside server exited with %r" % proc.returncode)
    check(status == "ok", "the outside server does not listen on 127.0.0.1:%d" % PORT)


def run_runner(binary, env):
    r = subprocess.run([RUNNER, binary], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       env=dict(os.environ, **env), timeout=RUNNER_TIMEOUT)
    return r.returncode, r.stdout + r.stderr


OUTSIDE = {}             # the outside server: proc, its stderr file, a connection to it


def install_and_enter_namespace(names):
    """Outside the namespace: install the suites' packages, then run again
    inside a namespace of this test's own."""
    r = subprocess.run([RUNNER, "--install-only", BINARY], stdin=subprocess.DEVNULL, timeout=RUNNER_TIMEOUT)
    check(r.returncode == 0, "install: run_client_suite.sh --install-only exited with %d" % r.returncode)
    sys.stdout.flush()
    enter_namespace([os.path.abspath(__file__)] + sys.argv[1:] + ["--seed", str(SEED)])


def start_outside_server(names):
    """Inside: the outside server on 127.0.0.1:11300, with one job in it."""
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    OUTSIDE["errf"] = tempfile.TemporaryFile()
    OUTSIDE["proc"] = outside = subprocess.Popen(
        [BINARY, "-l", "127.0.0.1", "-p", str(PORT), "--no-http"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=OUTSIDE["errf"])
    wait_listening(outside, 10)
    OUTSIDE["conn"] = c = Beanstalk()
    check_eq(c.cmd(b"use outside\r\n"), b"USING outside\r\n", "use on the outside server")
    check_eq(c.cmd(b"put 0 0 60 7\r\noutside\r\n"), b"INSERTED 1\r\n", "put on the outside server")


def check_outside_untouched(before, env, name):
    """The outside server's counters and job after the runner ran with env."""
    c = OUTSIDE["conn"]
    after = c.stats()
    for key in ("total-jobs", "cmd-put", "current-jobs-ready", "current-connections", "cmd-reserve"):
        check_eq(after.get(key), before.get(key), "outside server's %s after: %s" % (key, name))
    # in a namespace nothing reaches it; without one, the
    # runner's probe connects once and closes
    check_eq(int(after["total-connections"]) - int(before["total-connections"]), 1 if env else 0,
             "new connections to the outside server during: %s" % name)
    check_eq(c.cmd(b"peek-ready\r\n") + c.line(), b"FOUND 1 7\r\noutside\r\n",
             "the outside server's job")


def test_client_suites_pass_beside_a_server():
    """the client suites pass beside a server on 127.0.0.1:11300"""
    before = OUTSIDE["conn"].stats()
    rc, out = run_runner(BINARY, {})
    last = out.strip().splitlines()[-1] if out.strip() else ""
    check(rc == 0 and re.match(r"^client-suite: [1-9]\d* passed, 0 failed", last),
          "run_client_suite.sh: exit %d, last line %r; output:\n%s" % (rc, last, out[-3000:]))
    check("in a private network namespace" in out, "the runner did not isolate itself:\n%s"
          % out[-2000:])
    check_outside_untouched(before, {}, test_client_suites_pass_beside_a_server.__doc__)


def test_without_a_namespace_the_runner_names_the_port_holder():
    """without a namespace, the runner names what holds the port"""
    env = {"CLIENT_SUITE_NETNS": "off"}
    outside = OUTSIDE["proc"]
    before = OUTSIDE["conn"].stats()
    rc, out = run_runner(BINARY, env)
    check_eq(rc, 2, "exit status without a namespace, port taken")
    want = "beangate (pid %d) holds it" % outside.pid
    check(want in out and "kill %d" % outside.pid in out,
          "the message does not say %r and how to stop it:\n%s" % (want, out[-2000:]))
    check_outside_untouched(before, env, test_without_a_namespace_the_runner_names_the_port_holder.__doc__)


def the_outside_server_exits_cleanly():
    """After the tests: SIGTERM stops the outside server with status 0 and no
    sanitizer report."""
    if "proc" not in OUTSIDE:
        raise testlib.Skip("it was not started")
    status = testlib.signal_and_wait(OUTSIDE["proc"], 15, 5)
    OUTSIDE["errf"].seek(0)
    err = OUTSIDE["errf"].read().decode("utf-8", "replace")
    check(status == 0 and testlib.sanitizer_report(err) is None,
          "status %r, stderr %s" % (status, err[-1500:]))


TESTS = [
    test_client_suites_pass_beside_a_server,
    test_without_a_namespace_the_runner_names_the_port_holder,
]

BINARY = None
SEED = None              # the inside run repeats the outside run's seed


def main(argv):
    global BINARY, SEED
    args = testlib.parse_args(testlib.arg_parser(__doc__), argv)
    BINARY, SEED = args.binary, args.seed
    if not os.environ.get(INSIDE):
        return testlib.run("client-isolation", TESTS, args, setup=install_and_enter_namespace,
                           all_skipped=SKIP)
    return testlib.run("client-isolation", TESTS, args, namespace=globals(), setup=start_outside_server,
                       last=(the_outside_server_exits_cleanly,), all_skipped=SKIP)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
