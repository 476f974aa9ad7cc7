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
user namespaces). The last line is `client-isolation: N passed, M failed`.
"""

import os
import re
import socket
import subprocess
import sys
import tempfile
import time

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
    (exits with SKIP if none can be made)."""
    why = []
    for way in ways_to_isolate():
        probe = subprocess.run(["unshare"] + way + ["true"], capture_output=True, text=True)
        if probe.returncode == 0:
            env = dict(os.environ, **{INSIDE: "1"})
            os.execvpe("unshare", ["unshare"] + way + ["--", sys.executable] + argv, env)
        why.append("unshare %s: %s" % (" ".join(way), probe.stderr.strip() or "failed"))
    print("SKIP client-isolation: no private network namespace here (%s)" % "; ".join(why))
    sys.exit(SKIP)


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


def wait_listening(proc, deadline):
    while time.monotonic() < deadline:
        check(proc.poll() is None, "the outside server exited with %r" % proc.returncode)
        try:
            socket.create_connection(("127.0.0.1", PORT), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError("the outside server does not listen on 127.0.0.1:%d" % PORT)


def run_runner(binary, env):
    r = subprocess.run([RUNNER, binary], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       env=dict(os.environ, **env), timeout=RUNNER_TIMEOUT)
    return r.returncode, r.stdout + r.stderr


def main(argv):
    binary = testlib.binary_arg(argv)
    if binary is None:
        return 2
    binary = os.path.abspath(binary)
    if not os.environ.get(INSIDE):
        r = subprocess.run([RUNNER, "--install-only", binary], stdin=subprocess.DEVNULL, timeout=RUNNER_TIMEOUT)
        if r.returncode != 0:
            print("FAIL install: run_client_suite.sh --install-only exited with %d" % r.returncode)
            print("client-isolation: 0 passed, 1 failed")
            return 1
        enter_namespace([os.path.abspath(__file__), binary])
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)

    passed = failed = 0
    errf = tempfile.TemporaryFile()
    outside = subprocess.Popen([binary, "-l", "127.0.0.1", "-p", str(PORT), "--no-http"],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errf)
    try:
        wait_listening(outside, time.monotonic() + 10)
        c = Beanstalk()
        check_eq(c.cmd(b"use outside\r\n"), b"USING outside\r\n", "use on the outside server")
        check_eq(c.cmd(b"put 0 0 60 7\r\noutside\r\n"), b"INSERTED 1\r\n", "put on the outside server")
        for name, env in (("the client suites pass beside a server on 127.0.0.1:11300", {}),
                          ("without a namespace, the runner names what holds the port",
                           {"CLIENT_SUITE_NETNS": "off"})):
            try:
                before = c.stats()
                rc, out = run_runner(binary, env)
                if not env:
                    last = out.strip().splitlines()[-1] if out.strip() else ""
                    check(rc == 0 and re.match(r"^client-suite: [1-9]\d* passed, 0 failed", last),
                          "run_client_suite.sh: exit %d, last line %r; output:\n%s" % (rc, last, out[-3000:]))
                    check("in a private network namespace" in out, "the runner did not isolate itself:\n%s"
                          % out[-2000:])
                else:
                    check_eq(rc, 2, "exit status without a namespace, port taken")
                    want = "beangate (pid %d) holds it" % outside.pid
                    check(want in out and "kill %d" % outside.pid in out,
                          "the message does not say %r and how to stop it:\n%s" % (want, out[-2000:]))
                after = c.stats()
                for key in ("total-jobs", "cmd-put", "current-jobs-ready", "current-connections", "cmd-reserve"):
                    check_eq(after.get(key), before.get(key), "outside server's %s after: %s" % (key, name))
                # in a namespace nothing reaches it; without one, the
                # runner's probe connects once and closes
                check_eq(int(after["total-connections"]) - int(before["total-connections"]), 1 if env else 0,
                         "new connections to the outside server during: %s" % name)
                check_eq(c.cmd(b"peek-ready\r\n") + c.line(), b"FOUND 1 7\r\noutside\r\n",
                         "the outside server's job")
                passed += 1
                print("PASS %s" % name, flush=True)
            except (AssertionError, subprocess.TimeoutExpired) as e:
                failed += 1
                print("FAIL %s: %s" % (name, e), flush=True)
    except AssertionError as e:
        failed += 1
        print("FAIL the outside server: %s" % e, flush=True)
    finally:
        status = testlib.signal_and_wait(outside, 15, 5)
        errf.seek(0)
        err = errf.read().decode("utf-8", "replace")
        if status != 0 or any(m in err for m in testlib.SANITIZER_MARKERS):
            failed += 1
            print("FAIL the outside server's exit: status %r, stderr %s" % (status, err[-1500:]), flush=True)
    print("client-isolation: %d passed, %d failed" % (passed, failed), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
