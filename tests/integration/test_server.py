#!/usr/bin/env python3
"""Integration tests for the real beangate binary.

Usage: python3 tests/integration/test_server.py build/beangate

Every test starts the real server on a free loopback port (or a private
UNIX socket), talks to it over real sockets and compares the exact reply
bytes. Every server is stopped with SIGTERM at the end of its test and must
exit with status 0 and no sanitizer report on stderr (so the same file
checks an ASan+UBSan build for leaks and errors at exit).

Python 3 standard library only. The runner is tests/lib/testlib.py's: -k NAME
runs one test, PASS/FAIL/SKIP per test, the last line is
`integration: N passed, M failed, K skipped`; exits 1 on failure.
"""

import os
import pwd
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import testlib  # noqa: E402
from testlib import SANITIZER_MARKERS, check, close_quietly, first_difference, free_port, signal_and_wait  # noqa: E402

BINARY = None  # set from argv[1]
HAS_HTTP = False  # the binary has the HTTP gateway (--http-port): give it a free port too

READ_TIMEOUT = 5.0        # every socket read gives up after this
START_TIMEOUT = 10.0      # a server must answer a command within this
STOP_TIMEOUT = 5.0        # a server must exit this long after SIGTERM


Skip = testlib.Skip  # raised by a test that cannot run here; the message says why


# ---- formatting ---------------------------------------------------------------

def show(data, limit=240):
    """repr of bytes, shortened for long data."""
    return testlib.show(data, limit)


def _bytes_diff(got, want, what):
    i = first_difference(got, want)
    lo = max(0, i - 40)
    return ("%s: got %s, want %s (first difference at byte %d: got %r, want %r)"
            % (what, show(got), show(want), i, bytes(got[lo:i + 40]), bytes(want[lo:i + 40])))


def check_eq(got, want, what):
    testlib.check_eq(got, want, what, bytes_diff=_bytes_diff)


# ---- the server process --------------------------------------------------------

def read_rss_kb(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class Server(testlib.ServerProcess):
    """One beangate process. Use as a context manager: the server is always
    stopped on exit; on a normal exit its shutdown is checked too."""

    def __init__(self, args=(), unix_path=None, listen_default=False):
        super().__init__()
        self.extra = list(args)
        self.unix_path = unix_path
        self.listen_default = listen_default  # pass only -p (no -l)
        self.port = None
        self.http_port = None
        self.out_file = None
        self.stopped = False
        self.exit_status = None
        self.stderr_text = ""
        self.stdout_text = ""

    # -- start / stop
    def _argv(self):
        argv = [BINARY]
        if self.unix_path:
            argv += ["-l", "unix:" + self.unix_path]
        elif self.listen_default:
            argv += ["-p", str(self.port)]
        else:
            argv += ["-l", "127.0.0.1", "-p", str(self.port)]
        if HAS_HTTP:
            # never the gateway's fixed default port; loopback only
            if not self.listen_default:
                argv += ["--http-listen", "127.0.0.1"]
            argv += ["--http-port", str(self.http_port)]
        return argv + self.extra

    def start(self):
        last = ""
        for _attempt in range(5):
            if not self.unix_path:
                self.port = free_port()
            if HAS_HTTP:
                self.http_port = free_port()
                while self.http_port == self.port:
                    self.http_port = free_port()
            self.out_file = tempfile.TemporaryFile()
            self.spawn(self._argv(), stdout=self.out_file)
            status = self._wait_ready()
            if status == "ok":
                return self
            rc = self.proc.returncode
            last = self.stderr()
            if status == "timeout":
                last = "no answer within %.0f s (killed); stderr: %s" % (START_TIMEOUT, last)
            elif rc < 0:
                last = "killed by signal %s; stderr: %s" % (signal.Signals(-rc).name, last)
            else:
                last = "exit status %d; stderr: %s" % (rc, last)
            self._close_files()
            if "cannot listen" in last and (HAS_HTTP or not self.unix_path):
                continue  # a port was taken in the meantime: pick others
            break
        raise AssertionError("server %r did not start: %s" % (self._argv(), last.strip()[-800:]))

    def _wait_ready(self):
        """Wait until a command round trip works (so the loop and the signal
        handlers are installed, not just the listening socket)."""
        status = testlib.wait_ready(self.proc, lambda: testlib.uses_default_tube(self.connect(timeout=2.0)),
                                    START_TIMEOUT)
        if status == "timeout":
            self.kill()
        return status

    def read_stdout(self):
        """What the server wrote on stdout so far (all of it once stopped)."""
        return self.stdout_text if self.stopped else self._read(self.out_file)

    @staticmethod
    def _read(f):
        try:
            f.seek(0)
            return f.read().decode("utf-8", "replace")
        except (OSError, ValueError):
            return ""

    def _close_files(self):
        for f in (self.err, self.out_file):
            try:
                f.close()
            except Exception:
                pass

    def send_signal(self, sig):
        self.proc.send_signal(sig)

    def stop(self, sig=signal.SIGTERM, timeout=STOP_TIMEOUT):
        """Send sig and wait. Returns (exit status or None if it hung, seconds,
        stderr). Always leaves the process dead."""
        if self.stopped:
            return self.exit_status, 0.0, self.stderr_text
        t0 = time.monotonic()
        status = signal_and_wait(self.proc, sig, timeout)
        took = time.monotonic() - t0
        self.stopped = True
        self.exit_status = status
        self.stderr_text = self.stderr()
        self.stdout_text = self._read(self.out_file)
        self._close_files()
        return status, took, self.stderr_text

    def stop_checked(self, sig=signal.SIGTERM, max_seconds=STOP_TIMEOUT):
        status, took, err = self.stop(sig, timeout=max_seconds)
        check_clean_exit(status, took, err, max_seconds, signal.Signals(sig).name)

    def __enter__(self):
        return self.start()

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.stop_checked()
        else:
            status, _took, err = self.stop()
            bad = [m for m in SANITIZER_MARKERS if m in err]
            if bad and isinstance(exc, AssertionError):
                exc.args = ("%s [and at exit: status %r, stderr: %s]"
                            % (exc.args[0] if exc.args else "", status, err.strip()[:800]),)
        return False

    # -- clients
    def connect(self, timeout=READ_TIMEOUT):
        if self.unix_path:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(timeout)
            try:
                s.connect(self.unix_path)
            except OSError:
                s.close()
                raise
        else:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        return Conn(s, timeout)

    def rss_kb(self):
        return read_rss_kb(self.proc.pid)


def check_clean_exit(status, took, err, max_seconds, how):
    if status is None:
        raise AssertionError("server did not exit within %.1f s of %s (killed); stderr: %s"
                             % (max_seconds, how, err.strip()[-600:]))
    bad = [m for m in SANITIZER_MARKERS if m in err]
    if bad:
        raise AssertionError("sanitizer report on stderr after %s (%s): %s"
                             % (how, ", ".join(bad), err.strip()[:1500]))
    if status != 0:
        raise AssertionError("exit status %r after %s, want 0; stderr: %s"
                             % (status, how, err.strip()[-600:]))
    check(took <= max_seconds, "exit took %.2f s after %s, want <= %.1f s" % (took, how, max_seconds))


# ---- a beanstalk client connection -------------------------------------------

class Conn:
    def __init__(self, sock, timeout=READ_TIMEOUT):
        self.sock = sock
        self.timeout = timeout
        self.buf = b""
        sock.settimeout(timeout)

    def close(self):
        close_quietly(self.sock)

    def send(self, data):
        self.sock.sendall(data)

    def _fill(self, deadline, what):
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError("timed out waiting for %s; received so far %s" % (what, show(self.buf)))
        self.sock.settimeout(left)
        try:
            chunk = self.sock.recv(1 << 20)
        except socket.timeout:
            raise AssertionError("timed out waiting for %s; received so far %s"
                                 % (what, show(self.buf))) from None
        except ConnectionResetError:
            raise AssertionError("connection reset waiting for %s; received so far %s"
                                 % (what, show(self.buf))) from None
        if not chunk:
            raise AssertionError("connection closed by server waiting for %s; received so far %s"
                                 % (what, show(self.buf)))
        self.buf += chunk

    def read_exact(self, n, timeout=None, what=None):
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        what = what or "%d bytes" % n
        while len(self.buf) < n:
            self._fill(deadline, what)
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def read_line(self, timeout=None):
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        while b"\r\n" not in self.buf:
            self._fill(deadline, "a reply line")
        i = self.buf.index(b"\r\n") + 2
        line, self.buf = self.buf[:i], self.buf[i:]
        return line

    def expect(self, want, what, timeout=None):
        """Read exactly len(want) bytes and compare them with want."""
        try:
            got = self.read_exact(len(want), timeout, what)
        except AssertionError as e:
            raise AssertionError("%s: want %s; %s" % (what, show(want), e)) from None
        check_eq(got, want, what)

    def cmd(self, line, want, what=None):
        self.send(line)
        self.expect(want, what or line.decode("latin-1").strip())

    def read_ok(self, timeout=None):
        """Read an `OK <n>` reply; returns the YAML body."""
        line = self.read_line(timeout)
        check(line.startswith(b"OK "), "want an OK reply, got %s" % show(line + self.buf[:100]))
        n = int(line[3:-2])
        body = self.read_exact(n + 2, timeout)
        check_eq(body[-2:], b"\r\n", "end of OK reply")
        return body[:-2]

    def stats(self, command=b"stats"):
        self.send(command + b"\r\n")
        body = self.read_ok()
        out = {}
        for raw in body.decode("latin-1").split("\n"):
            if ": " in raw:
                k, v = raw.split(": ", 1)
                out[k] = v
        return out

    def expect_silence(self, seconds, what):
        """Nothing may arrive (and the connection must stay open) for seconds."""
        check(not self.buf, "%s: unexpected buffered bytes %s" % (what, show(self.buf)))
        self.sock.settimeout(seconds)
        try:
            data = self.sock.recv(65536)
        except socket.timeout:
            return
        finally:
            self.sock.settimeout(self.timeout)
        if not data:
            raise AssertionError("%s: the server closed the connection, want silence" % what)
        raise AssertionError("%s: want no reply, got %s" % (what, show(data)))

    def read_until_closed(self, what, timeout=None):
        """Everything the server sends (after what was buffered) until it
        closes the connection; fails if it is still open after timeout."""
        data, self.buf = self.buf, b""
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("%s: connection still open; got %s" % (what, show(data)))
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                continue
            except ConnectionResetError:
                return data
            if not chunk:
                return data
            data += chunk

    def expect_close(self, what, timeout=None):
        data = self.read_until_closed(what, timeout)
        check(not data, "%s: extra bytes before close: %s" % (what, show(data)))


def job_reply(word, jid, body):
    return b"%s %d %d\r\n" % (word, jid, len(body)) + body + b"\r\n"


def put_cmd(body, pri=0, delay=0, ttr=60):
    return b"put %d %d %d %d\r\n" % (pri, delay, ttr, len(body)) + body + b"\r\n"


def wait_stat(conn, key, want, timeout=3.0, command=b"stats"):
    """Poll stats until stats[key] == want (a string)."""
    return testlib.wait_until(lambda: conn.stats(command), "%s: %s to be %r" % (command.decode(), key, want),
                              timeout, step=0.01, ok=lambda st: st.get(key) == want)


def check_rss(srv, limit_kb, what):
    rss = srv.rss_kb()
    check(rss is not None, "cannot read VmRSS of pid %d" % srv.proc.pid)
    check(rss < limit_kb, "%s: server VmRSS %d kB, want < %d kB" % (what, rss, limit_kb))
    return rss


# ---- 1. round trip and job sizes -------------------------------------------------

def test_put_reserve_delete_binary_body():
    body = b"line1\r\nline2\x00\x00\r\n\x00end\r\n" + bytes(range(256)) + b"\r\n"
    with Server() as srv:
        c = srv.connect()
        c.cmd(put_cmd(body), b"INSERTED 1\r\n", "put binary body")
        c.cmd(b"peek 1\r\n", job_reply(b"FOUND", 1, body), "peek 1")
        c.cmd(b"reserve\r\n", job_reply(b"RESERVED", 1, body), "reserve")
        c.cmd(b"delete 1\r\n", b"DELETED\r\n", "delete 1")
        c.cmd(b"delete 1\r\n", b"NOT_FOUND\r\n", "delete 1 again")
        c.cmd(b"peek 1\r\n", b"NOT_FOUND\r\n", "peek deleted job")
        c.cmd(b"reserve-with-timeout 0\r\n", b"TIMED_OUT\r\n", "reserve on empty queue")
        c.close()


def test_job_size_default_limit():
    big = bytes((i * 7 + 3) & 0xFF for i in range(65535))
    with Server() as srv:
        c = srv.connect()
        c.cmd(put_cmd(big), b"INSERTED 1\r\n", "put of 65535 bytes")
        c.cmd(b"reserve\r\n", job_reply(b"RESERVED", 1, big), "reserve 65535-byte job")
        c.cmd(b"delete 1\r\n", b"DELETED\r\n", "delete 1")
        # 65536: the reply comes only after the whole body has been skipped
        c.send(b"put 0 0 10 65536\r\n" + b"z" * 60000)
        c.expect_silence(0.2, "put 65536 with partial body")
        c.send(b"z" * 5536 + b"\r\n")
        c.expect(b"JOB_TOO_BIG\r\n", "put of 65536 bytes")
        # the body was skipped, not parsed; JOB_TOO_BIG does not use an id
        c.cmd(put_cmd(b"ok"), b"INSERTED 2\r\n", "put after JOB_TOO_BIG")
        c.close()


def test_job_size_flag_z10():
    with Server(["-z", "10"]) as srv:
        c = srv.connect()
        c.cmd(put_cmd(b"0123456789"), b"INSERTED 1\r\n", "-z 10: put of 10 bytes")
        c.cmd(put_cmd(b"0123456789A"), b"JOB_TOO_BIG\r\n", "-z 10: put of 11 bytes")
        c.cmd(b"list-tube-used\r\n", b"USING default\r\n", "command after JOB_TOO_BIG")
        c.cmd(b"reserve\r\n", job_reply(b"RESERVED", 1, b"0123456789"), "reserve the 10-byte job")
        st = c.stats()
        check_eq(st.get("max-job-size"), "10", "stats max-job-size")
        c.close()


# ---- 2. pipelining ----------------------------------------------------------------

def test_pipelined_2000_puts_then_reserve_delete():
    n = 2000
    with Server() as srv:
        c = srv.connect(timeout=10.0)
        c.send(b"".join(put_cmd(b"job-%d" % i) for i in range(1, n + 1)))
        want = b"".join(b"INSERTED %d\r\n" % i for i in range(1, n + 1))
        c.expect(want, "2000 pipelined puts", timeout=10.0)
        c.send(b"".join(b"reserve\r\ndelete %d\r\n" % i for i in range(1, n + 1)))
        want = b"".join(job_reply(b"RESERVED", i, b"job-%d" % i) + b"DELETED\r\n"
                        for i in range(1, n + 1))
        c.expect(want, "2000 pipelined reserve+delete", timeout=10.0)
        st = c.stats()
        for k in ("current-jobs-ready", "current-jobs-reserved"):
            check_eq(st.get(k), "0", "stats " + k)
        check_eq(st.get("cmd-put"), "2000", "stats cmd-put")
        check_eq(st.get("cmd-delete"), "2000", "stats cmd-delete")
        c.close()


# ---- 3. concurrent connections -------------------------------------------------

def test_concurrent_connections():
    threads, per = 8, 300
    errors = []

    def worker(srv, k):
        c = None
        try:
            c = srv.connect(timeout=10.0)
            tube = b"tube-%d" % k
            c.cmd(b"use " + tube + b"\r\n", b"USING " + tube + b"\r\n")
            c.cmd(b"watch " + tube + b"\r\n", b"WATCHING 2\r\n")
            c.cmd(b"ignore default\r\n", b"WATCHING 1\r\n")
            ids = []
            for i in range(per):
                c.send(put_cmd(b"w%d-%d" % (k, i)))
                line = c.read_line()
                check(line.startswith(b"INSERTED "), "worker %d put %d: got %s" % (k, i, show(line)))
                ids.append(int(line[9:-2]))
            for i in range(per):
                body = b"w%d-%d" % (k, i)
                c.cmd(b"reserve\r\n", job_reply(b"RESERVED", ids[i], body), "worker %d reserve %d" % (k, i))
                c.cmd(b"delete %d\r\n" % ids[i], b"DELETED\r\n", "worker %d delete %d" % (k, ids[i]))
        except Exception as e:  # reported by the main thread
            errors.append("worker %d: %s" % (k, e))
        finally:
            if c:
                c.close()

    with Server() as srv:
        ts = [threading.Thread(target=worker, args=(srv, k)) for k in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(40)
        check(not any(t.is_alive() for t in ts), "worker threads still running after 40 s")
        check(not errors, "; ".join(errors[:3]))
        c = srv.connect()
        st = c.stats()
        check_eq(st.get("total-jobs"), str(threads * per), "stats total-jobs")
        check_eq(st.get("cmd-put"), str(threads * per), "stats cmd-put")
        for k in ("current-jobs-urgent", "current-jobs-ready", "current-jobs-reserved",
                  "current-jobs-delayed", "current-jobs-buried"):
            check_eq(st.get(k), "0", "stats " + k)
        check(int(st.get("total-connections", "0")) >= threads + 1,
              "stats total-connections %r, want >= %d" % (st.get("total-connections"), threads + 1))
        c.close()


# ---- 4. blocking reserve woken by put ----------------------------------------------

def test_blocking_reserve_woken_by_put():
    with Server() as srv:
        mon = srv.connect()
        a = srv.connect()
        b = srv.connect()
        # a command pipelined behind the blocking reserve is answered after it
        a.send(b"reserve\r\nlist-tube-used\r\n")
        wait_stat(mon, "current-waiting", "1")
        a.expect_silence(0.1, "blocked reserve before any put")
        t0 = time.monotonic()
        b.cmd(put_cmd(b"from-B"), b"INSERTED 1\r\n", "put on B")
        a.expect(job_reply(b"RESERVED", 1, b"from-B") + b"USING default\r\n",
                 "blocked reserve on A, then the pipelined list-tube-used", timeout=1.0)
        check(time.monotonic() - t0 < 1.0, "A woke after %.2f s, want < 1 s" % (time.monotonic() - t0))
        a.cmd(b"delete 1\r\n", b"DELETED\r\n")
        # a blocked reserver that hangs up is forgotten: the next job stays ready
        gone = srv.connect()
        gone.send(b"reserve\r\n")
        wait_stat(mon, "current-waiting", "1")
        gone.close()
        wait_stat(mon, "current-waiting", "0")
        b.cmd(put_cmd(b"nobody-waits"), b"INSERTED 2\r\n", "put after the reserver left")
        st = mon.stats(b"stats-job 2")
        check_eq(st.get("state"), "ready", "stats-job 2 state (its reserver hung up)")
        for x in (mon, a, b):
            x.close()


def test_two_blocked_reservers_get_different_jobs():
    with Server() as srv:
        mon = srv.connect()
        r1, r2, p = srv.connect(), srv.connect(), srv.connect()
        r1.send(b"reserve\r\n")
        r2.send(b"reserve\r\n")
        wait_stat(mon, "current-waiting", "2")
        p.send(put_cmd(b"first") + put_cmd(b"second"))
        p.expect(b"INSERTED 1\r\nINSERTED 2\r\n", "two puts")
        got = {}
        for name, r in (("r1", r1), ("r2", r2)):
            line = r.read_line(timeout=1.0)
            check(line.startswith(b"RESERVED "), "%s: got %s" % (name, show(line)))
            jid, size = map(int, line[9:-2].split())
            body = r.read_exact(size + 2, timeout=1.0)
            got[name] = (jid, body)
        check(got["r1"][0] != got["r2"][0], "both reservers got job %d" % got["r1"][0])
        want = {1: b"first\r\n", 2: b"second\r\n"}
        for name, (jid, body) in got.items():
            check(jid in want, "%s got unknown job id %d" % (name, jid))
            check_eq(body, want[jid], "%s body of job %d" % (name, jid))
        st = mon.stats()
        check_eq(st.get("current-jobs-reserved"), "2", "stats current-jobs-reserved")
        check_eq(st.get("current-waiting"), "0", "stats current-waiting")
        for x in (mon, r1, r2, p):
            x.close()


def test_reserver_watching_two_tubes():
    with Server() as srv:
        mon = srv.connect()
        r, p = srv.connect(), srv.connect()
        r.cmd(b"watch a\r\n", b"WATCHING 2\r\n")
        r.cmd(b"watch b\r\n", b"WATCHING 3\r\n")
        r.cmd(b"ignore default\r\n", b"WATCHING 2\r\n")
        r.send(b"reserve\r\n")
        wait_stat(mon, "current-waiting", "1")
        # a job in a tube it does not watch must not wake it
        p.cmd(b"use c\r\n", b"USING c\r\n")
        p.cmd(put_cmd(b"in-c"), b"INSERTED 1\r\n")
        r.expect_silence(0.2, "reserver watching a,b after a put into c")
        p.cmd(b"use b\r\n", b"USING b\r\n")
        p.cmd(put_cmd(b"in-b"), b"INSERTED 2\r\n")
        r.expect(job_reply(b"RESERVED", 2, b"in-b"), "reserver watching a and b", timeout=1.0)
        st = r.stats(b"stats-job 2")
        check_eq(st.get("tube"), "b", "stats-job 2 tube")
        check_eq(st.get("state"), "reserved", "stats-job 2 state")
        for x in (mon, r, p):
            x.close()


# ---- 5. a closing connection gives its reserved jobs back -------------------------

def test_disconnect_returns_reserved_job():
    with Server() as srv:
        a, b = srv.connect(), srv.connect()
        a.cmd(put_cmd(b"payload"), b"INSERTED 1\r\n")
        a.cmd(b"reserve\r\n", job_reply(b"RESERVED", 1, b"payload"), "A reserves")
        b.cmd(b"reserve-with-timeout 0\r\n", b"TIMED_OUT\r\n", "B while A holds the job")
        a.close()
        wait_stat(b, "state", "ready", timeout=2.0, command=b"stats-job 1")
        b.cmd(b"reserve-with-timeout 0\r\n", job_reply(b"RESERVED", 1, b"payload"), "B after A closed")
        st = b.stats(b"stats-job 1")
        check_eq(st.get("reserves"), "2", "stats-job 1 reserves")
        check_eq(st.get("timeouts"), "0", "stats-job 1 timeouts")
        check_eq(st.get("state"), "reserved", "stats-job 1 state")
        # a reserver already blocked is woken when the holder hangs up
        c = srv.connect()
        c.cmd(put_cmd(b"second"), b"INSERTED 2\r\n")
        c.cmd(b"reserve\r\n", job_reply(b"RESERVED", 2, b"second"), "C reserves job 2")
        d = srv.connect()
        d.send(b"reserve\r\n")
        wait_stat(b, "current-waiting", "1")
        t0 = time.monotonic()
        c.close()
        d.expect(job_reply(b"RESERVED", 2, b"second"), "blocked D after C closed", timeout=1.0)
        check(time.monotonic() - t0 < 1.0, "D woke after %.2f s" % (time.monotonic() - t0))
        st = d.stats(b"stats-job 2")
        check_eq(st.get("reserves"), "2", "stats-job 2 reserves")
        check_eq(st.get("timeouts"), "0", "stats-job 2 timeouts")
        b.close()
        d.close()


# ---- 6. timers -----------------------------------------------------------------------

def test_reserve_with_timeout_fires():
    with Server() as srv:
        c = srv.connect()
        t0 = time.monotonic()
        c.send(b"reserve-with-timeout 1\r\n")
        c.expect(b"TIMED_OUT\r\n", "reserve-with-timeout 1 with nothing ready", timeout=4.0)
        took = time.monotonic() - t0
        check(0.9 <= took <= 3.0, "TIMED_OUT after %.2f s, want 0.9-3 s" % took)
        c.cmd(b"list-tube-used\r\n", b"USING default\r\n", "command after TIMED_OUT")
        c.close()


def test_delayed_job_reaches_blocked_reserver():
    with Server() as srv:
        r, p = srv.connect(), srv.connect()
        r.send(b"reserve\r\n")
        wait_stat(p, "current-waiting", "1")
        t0 = time.monotonic()
        p.cmd(put_cmd(b"later", delay=1), b"INSERTED 1\r\n")
        st = p.stats(b"stats-job 1")
        check_eq(st.get("state"), "delayed", "stats-job 1 state right after put")
        r.expect(job_reply(b"RESERVED", 1, b"later"), "blocked reserve, job put with delay 1", timeout=4.0)
        took = time.monotonic() - t0
        check(0.9 <= took <= 3.0, "delayed job delivered after %.2f s, want 0.9-3 s" % took)
        r.close()
        p.close()


# ---- 6b. deadlines that pass before the loop's timer runs (issue 11, defect 3) --

def test_pause_zero_then_reserve_with_timeout_0():
    """`pause-tube T 0` then `reserve-with-timeout 0` hands out T's ready job:
    both in one write (one clock reading), and 200 times one by one (the
    loop may read the reserve before its timer ran)."""
    with Server() as srv:
        c = srv.connect()
        c.cmd(put_cmd(b"p0"), b"INSERTED 1\r\n")
        c.cmd(b"pause-tube default 0\r\nreserve-with-timeout 0\r\n",
              b"PAUSED\r\n" + job_reply(b"RESERVED", 1, b"p0"), "pause 0 + rwt 0 in one write")
        c.cmd(b"delete 1\r\n", b"DELETED\r\n")
        for i in range(2, 202):
            body = b"job%d" % i
            c.cmd(put_cmd(body), b"INSERTED %d\r\n" % i)
            c.cmd(b"pause-tube default 0\r\n", b"PAUSED\r\n", "iteration %d: pause 0" % i)
            c.cmd(b"reserve-with-timeout 0\r\n", job_reply(b"RESERVED", i, body),
                  "iteration %d: rwt 0 right after pause 0" % i)
            c.cmd(b"delete %d\r\n" % i, b"DELETED\r\n")
        c.close()


def _pass_clock(deadline):
    """Let the monotonic clock pass `deadline` (the server is stopped, so
    there is nothing to poll: the condition is the time itself)."""
    while time.monotonic() < deadline:
        time.sleep(0.02)  # the point: the clock passes while the server is stopped


def _frozen_send(srv, conn, data, deadline):
    """Stop the server, send data, let `deadline` pass, resume it: the
    loop then finds the read and its expired timer pending together."""
    os.kill(srv.proc.pid, signal.SIGSTOP)
    try:
        conn.send(data)
        _pass_clock(deadline)
    finally:
        os.kill(srv.proc.pid, signal.SIGCONT)


def test_deadline_passed_before_timer_runs():
    """The server is frozen across a deadline with a command already sent,
    so the read and the expired timer are pending at once: the command
    must see the deadline as passed, whichever the loop runs first (the
    replies equal the reference's when its timer ran first)."""
    with Server() as srv:
        c, d = srv.connect(), srv.connect()
        # a delay that passed: the job is ready, not delayed or kickable
        t0 = time.monotonic()
        c.cmd(put_cmd(b"later", delay=1), b"INSERTED 1\r\n")
        _frozen_send(srv, c, b"peek-delayed\r\nkick 10\r\nreserve-with-timeout 0\r\n", t0 + 1.3)
        c.expect(b"NOT_FOUND\r\nKICKED 0\r\n" + job_reply(b"RESERVED", 1, b"later"),
                 "peek-delayed, kick, rwt 0 after the delay passed")
        # a TTR that passed: the old owner's touch, release and bury fail
        t0 = time.monotonic()
        c.cmd(put_cmd(b"ttr", ttr=1) + b"reserve\r\n",
              b"INSERTED 2\r\n" + job_reply(b"RESERVED", 2, b"ttr"))
        _frozen_send(srv, c, b"touch 2\r\nrelease 2 0 0\r\nbury 2 0\r\n", t0 + 1.3)
        c.expect(b"NOT_FOUND\r\n" * 3, "touch, release, bury after the TTR passed")
        st = c.stats(b"stats-job 2")
        check_eq((st.get("state"), st.get("timeouts")), ("ready", "1"), "stats-job 2 (state, timeouts)")
        c.cmd(b"delete 2\r\n", b"DELETED\r\n")
        # a waiter whose timeout passed times out: a put then does not feed it
        t0 = time.monotonic()
        d.send(b"reserve-with-timeout 1\r\n")
        wait_stat(c, "current-waiting", "1")
        _frozen_send(srv, c, put_cmd(b"too late"), t0 + 1.3)
        c.expect(b"INSERTED 3\r\n", "put after the waiter's timeout passed")
        d.expect(b"TIMED_OUT\r\n", "waiter whose timeout passed before the put")
        st = c.stats(b"stats-job 3")
        check_eq(st.get("state"), "ready", "stats-job 3 state")
        c.close()
        d.close()


# ---- 7. quit -----------------------------------------------------------------------

def test_quit_after_pipelined_commands():
    with Server() as srv:
        c = srv.connect()
        c.send(b"use foo\r\n" + put_cmd(b"abc") + b"list-tube-used\r\nquit\r\nlist-tube-used\r\n")
        c.expect(b"USING foo\r\nINSERTED 1\r\nUSING foo\r\n", "replies before quit")
        c.expect_close("after quit", timeout=2.0)
        c.close()
        m = srv.connect()
        st = m.stats(b"stats-job 1")
        check_eq(st.get("tube"), "foo", "job put before quit")
        m.close()


# ---- 8. UNIX socket -------------------------------------------------------------------

def test_unix_socket():
    path = "/tmp/beangate-it-%d-%s.sock" % (os.getpid(), "%08x" % random.getrandbits(32))
    try:
        srv = Server(unix_path=path).start()
        try:
            check(os.path.exists(path), "socket file %s missing while running" % path)
            c = srv.connect()
            body = b"over unix\r\n\x00"
            c.cmd(put_cmd(body), b"INSERTED 1\r\n", "put over UNIX socket")
            c.cmd(b"reserve\r\n", job_reply(b"RESERVED", 1, body), "reserve over UNIX socket")
            c.cmd(b"delete 1\r\n", b"DELETED\r\n")
            c.close()
        except BaseException:
            srv.stop()
            raise
        srv.stop_checked()
        check(not os.path.exists(path), "socket file %s still exists after SIGTERM" % path)
    finally:
        if os.path.exists(path):
            os.unlink(path)


# ---- 8b. the startup block ------------------------------------------------------------

STARTUP_FIRST = re.compile(r"^beangate \S+ \(beanstalkd 1\.12 protocol\) is up; Ctrl-C or SIGTERM stops it$")
LOG_EVENT = re.compile(r"^ts=\S+ level=(error|warn|info|debug) event=\w+( |$)")


def startup_block(srv, want, absent=()):
    """Check the server's stdout: one startup block whose lines include every
    line of `want` and none that starts with a word of `absent`; stderr has
    only key=value event lines. Returns the block's lines."""
    lines = srv.read_stdout().splitlines()
    check(lines and STARTUP_FIRST.match(lines[0]), "stdout does not start with the startup line: %r" % lines)
    check_eq(sum(1 for ln in lines if STARTUP_FIRST.match(ln)), 1, "startup blocks on stdout")
    for w in want:
        check(w in lines, "startup block lacks %r: %r" % (w, lines))
    for word in absent:
        check(not any(ln.split()[:1] == [word] for ln in lines[1:]),
              "startup block has a %r line: %r" % (word, lines))
    err = srv.stderr()
    for ln in err.splitlines():
        check(LOG_EVENT.match(ln), "stderr line is not a key=value event: %r" % ln)
    return lines


def test_startup_block_lists_the_real_listeners():
    if not HAS_HTTP:
        raise Skip("the binary has no HTTP gateway")
    gport = free_port()
    with Server(["--gearman-port", str(gport), "-V"]) as srv:
        http = "http://127.0.0.1:%d/" % srv.http_port
        lines = startup_block(srv, ["  beanstalk  127.0.0.1:%d" % srv.port,
                                    "  http       %s" % http,
                                    "  gearman    127.0.0.1:%d" % gport,
                                    "  log        in memory only: jobs are lost when beangate stops "
                                    "(-b DIR keeps them)"])
        docs = [ln for ln in lines if ln.startswith("  docs ")]
        check(len(docs) == 1 and "docs/beangate.1" in docs[0] and http + "openapi.yaml" in docs[0],
              "docs line: %r" % docs)
        check("event=listening" in srv.stderr(), "stderr lost its -V events")


def test_startup_block_without_http_and_with_a_log():
    logdir = tempfile.mkdtemp(prefix="beangate-it-log-")
    try:
        for flags, policy in ((["-f", "0"], "synced before every reply (-f 0)"),
                              ([], "synced every 50 ms (-f)"),
                              (["-F"], "never synced (-F)")):
            with Server(["--no-http", "-b", logdir] + flags) as srv:
                lines = startup_block(srv, ["  beanstalk  127.0.0.1:%d" % srv.port,
                                            "  log        %s, %s" % (os.path.realpath(logdir), policy)],
                                      absent=["http", "gearman"])
                check(not any("openapi.yaml" in ln for ln in lines), "an API URL without HTTP: %r" % lines)
    finally:
        subprocess.run(["rm", "-rf", logdir])


def test_startup_block_unix_socket():
    path = "/tmp/beangate-it-%d-%08x.sock" % (os.getpid(), random.getrandbits(32))
    try:
        with Server(unix_path=path) as srv:
            startup_block(srv, ["  beanstalk  unix:%s" % path])
    finally:
        if os.path.exists(path):
            os.unlink(path)


def test_no_startup_block_when_a_listener_fails():
    if not HAS_HTTP:
        raise Skip("the binary has no HTTP gateway")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        # an HTTP port asked for explicitly and taken: exit 111, and nothing
        # on stdout says the server is up
        out = tempfile.TemporaryFile()
        proc = subprocess.run([BINARY, "-l", "127.0.0.1", "-p", str(free_port()), "--http-listen",
                               "127.0.0.1", "--http-port", str(busy.getsockname()[1])],
                              stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.PIPE, timeout=10)
        out.seek(0)
        check_eq(proc.returncode, 111, "exit status with a busy --http-port")
        check_eq(out.read(), b"", "stdout of a server that did not start")
    finally:
        busy.close()


# ---- 9. flags -------------------------------------------------------------------------

def run_binary(args, timeout=10):
    return testlib.run_binary(BINARY, args, timeout, err_limit=1500)


def test_flag_v_prints_version():
    rc, out, err = run_binary(["-v"])
    check_eq(rc, 0, "exit status of -v")
    check("beangate" in out.splitlines()[0] if out else False,
          "-v stdout %r has no line containing 'beangate' (stderr %r)" % (out, err))


def test_flag_h_usage():
    rc, out, err = run_binary(["-h"])
    check_eq(rc, 0, "exit status of -h")
    check(out.strip() != "", "-h printed nothing on stdout (stderr %r)" % err)


def test_bad_flags_exit_5():
    for args in (["-x"], ["extra"], ["-z", "abc"]):
        rc, out, err = run_binary(args)
        check(rc == 5, "%r: exit status %r, want 5 (stdout %r, stderr %r)" % (args, rc, out, err[:300]))


def test_flag_z_clamped():
    with Server(["-z", "2000000000"]) as srv:
        c = srv.connect()
        st = c.stats()
        check_eq(st.get("max-job-size"), "1073741824", "stats max-job-size with -z 2000000000")
        c.close()


# ---- 10. default listen address ----------------------------------------------------

def listening_sockets(port):
    """(proc file, local address hex) of every listening socket on port."""
    found = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 4:
                continue
            addr, _, hexport = fields[1].partition(":")
            if int(hexport, 16) == port and fields[3] == "0A":  # 0A = LISTEN
                found.append((name, addr))
    return found


def test_default_listen_address_is_loopback():
    with Server(listen_default=True) as srv:
        ports = [("beanstalk", srv.port)]
        if HAS_HTTP:
            ports.append(("HTTP gateway (only --http-port given)", srv.http_port))
        for what, port in ports:
            found = listening_sockets(port)
            check(found, "%s: no listening socket on port %d in /proc/net/tcp{,6}" % (what, port))
            check(found == [("/proc/net/tcp", "0100007F")],
                  "%s: listening sockets on port %d: %r, want only 0100007F:%04X in /proc/net/tcp"
                  % (what, port, found, port))


# ---- 11. drain mode -------------------------------------------------------------------

def test_drain_mode():
    with Server() as srv:
        c = srv.connect()
        c.cmd(put_cmd(b"before"), b"INSERTED 1\r\n")
        check_eq(c.stats().get("draining"), "false", "stats draining before SIGUSR1")
        srv.send_signal(signal.SIGUSR1)
        wait_stat(c, "draining", "true", timeout=2.0)
        c.send(b"put 0 0 10 5\r\n")
        c.expect_silence(0.2, "put header in drain mode, body not sent yet")
        c.send(b"hello\r\n")
        c.expect(b"DRAINING\r\n", "put in drain mode")
        # the body was consumed, not parsed as commands
        c.cmd(b"list-tube-used\r\n", b"USING default\r\n", "command after DRAINING")
        c.cmd(b"reserve\r\n", job_reply(b"RESERVED", 1, b"before"), "reserve in drain mode")
        c.cmd(b"delete 1\r\n", b"DELETED\r\n")
        st = c.stats()
        check_eq(st.get("draining"), "true", "stats draining")
        check_eq(st.get("current-jobs-ready"), "0", "no job stored in drain mode")
        c.close()


# ---- 12. SIGTERM / SIGINT with a busy server ------------------------------------------

def busy_server_then_signal(sig):
    srv = Server().start()
    conns = []
    try:
        p = srv.connect()
        conns.append(p)
        p.cmd(put_cmd(b"ready-job"), b"INSERTED 1\r\n")
        p.cmd(put_cmd(b"delayed-job", delay=100), b"INSERTED 2\r\n")
        p.cmd(put_cmd(b"to-reserve", pri=1), b"INSERTED 3\r\n")
        p.cmd(put_cmd(b"to-bury", pri=2), b"INSERTED 4\r\n")
        p.cmd(put_cmd(b"other tube job", pri=5), b"INSERTED 5\r\n")
        w = srv.connect()
        conns.append(w)
        w.cmd(b"reserve-job 3\r\n", job_reply(b"RESERVED", 3, b"to-reserve"))
        w.cmd(b"reserve-job 4\r\n", job_reply(b"RESERVED", 4, b"to-bury"))
        w.cmd(b"bury 4 0\r\n", b"BURIED\r\n")
        blocked = srv.connect()
        conns.append(blocked)
        blocked.cmd(b"watch empty-tube\r\n", b"WATCHING 2\r\n")
        blocked.cmd(b"ignore default\r\n", b"WATCHING 1\r\n")
        blocked.send(b"reserve\r\n")
        half = srv.connect()           # in the middle of a put body
        conns.append(half)
        half.send(b"put 0 0 10 100\r\n" + b"x" * 40)
        partial = srv.connect()        # in the middle of a command line
        conns.append(partial)
        partial.send(b"list-tu")
        paused = srv.connect()
        conns.append(paused)
        paused.cmd(b"pause-tube default 100\r\n", b"PAUSED\r\n")
        st = p.stats()
        check_eq(st.get("current-waiting"), "1", "stats current-waiting before signal")
        for k, v in (("current-jobs-ready", "2"), ("current-jobs-delayed", "1"),
                     ("current-jobs-reserved", "1"), ("current-jobs-buried", "1")):
            check_eq(st.get(k), v, "stats " + k)
        status, took, err = srv.stop(sig, timeout=STOP_TIMEOUT)
        check_clean_exit(status, took, err, 2.0, signal.Signals(sig).name)
    finally:
        for c in conns:
            c.close()
        srv.stop()


def test_sigterm_with_busy_server():
    busy_server_then_signal(signal.SIGTERM)


def test_sigterm_answers_blocked_reserve():
    # Graceful stop: a connection blocked in reserve is answered TIMED_OUT
    # before the server closes it, and the server exits 0.
    srv = Server().start()
    try:
        c = srv.connect()
        c.sock.sendall(b"reserve\r\n")
        other = srv.connect()
        wait_stat(other, "current-waiting", "1")  # the reserve is blocked
        other.close()
        srv.stop_checked()
        c.sock.settimeout(READ_TIMEOUT)
        got = b""
        while True:
            chunk = c.sock.recv(4096)
            if not chunk:
                break
            got += chunk
        check(got == b"TIMED_OUT\r\n", "a blocked reserve got %r at shutdown" % got)
    finally:
        srv.stop()


def test_sigint_with_busy_server():
    busy_server_then_signal(signal.SIGINT)


# ---- 13. a slow reader cannot stall the loop ---------------------------------------

RSS_LIMIT_KB = 200 * 1024


def round_trip(conn, body, what):
    t0 = time.monotonic()
    conn.send(put_cmd(body))
    try:
        line = conn.read_line(timeout=2.0)
    except AssertionError as e:
        raise AssertionError("%s: put: %s" % (what, e)) from None
    check(line.startswith(b"INSERTED "), "%s: put got %s" % (what, show(line)))
    jid = int(line[9:-2])
    conn.cmd(b"reserve-with-timeout 0\r\n", job_reply(b"RESERVED", jid, body), what + " reserve")
    conn.cmd(b"delete %d\r\n" % jid, b"DELETED\r\n", what + " delete")
    took = time.monotonic() - t0
    check(took < 1.0, "%s: put+reserve+delete took %.2f s, want < 1 s" % (what, took))


def test_slow_reader_does_not_stall_loop():
    with Server() as srv:
        a = srv.connect()
        b = srv.connect()
        b.cmd(b"watch other\r\n", b"WATCHING 2\r\n")
        b.cmd(b"ignore default\r\n", b"WATCHING 1\r\n")
        b.cmd(b"use other\r\n", b"USING other\r\n")
        big = bytes((i * 13) & 0xFF for i in range(60000))
        a.cmd(put_cmd(big), b"INSERTED 1\r\n", "A puts a 60000-byte job")
        a.send(b"peek 1\r\n" * 5000)   # ~300 MB of replies that A never reads
        for i in range(30):
            round_trip(b, b"b-%d" % i, "B round trip %d while A does not read" % i)
            check_rss(srv, RSS_LIMIT_KB, "while A does not read")
            time.sleep(0.01)  # the point: time passes while A does not read
        wait_stat(b, "current-connections", "2", timeout=1.0)  # A and B
        a.close()
        wait_stat(b, "current-connections", "1", timeout=3.0)
        for i in range(5):
            round_trip(b, b"after-%d" % i, "B round trip %d after A closed" % i)
        check_rss(srv, RSS_LIMIT_KB, "after A closed")
        c = srv.connect()
        c.cmd(b"peek 1\r\n", job_reply(b"FOUND", 1, big), "new connection peeks the big job")
        c.close()
        b.close()


def test_pipelined_replies_beyond_output_high_water():
    """A client that reads everything pipelines commands whose replies add up
    to far more than the server's output high-water mark (4 MB): every
    command must still be answered, in order. Done on 3 connections in a row,
    since whether the server stalls depends on how its writes interleave."""
    n = 300
    with Server() as srv:
        c = srv.connect()
        big = bytes((i * 31 + 7) & 0xFF for i in range(60000))
        c.cmd(put_cmd(big), b"INSERTED 1\r\n", "put a 60000-byte job")
        c.close()
        one = job_reply(b"FOUND", 1, big)
        want = one * n + b"USING default\r\n"
        for attempt in range(1, 4):
            c = srv.connect()
            c.send(b"peek 1\r\n" * n + b"list-tube-used\r\n")
            deadline = time.monotonic() + 8.0
            got = bytearray()
            c.sock.settimeout(0.5)
            quiet_since = time.monotonic()
            while len(got) < len(want) and time.monotonic() < deadline:
                try:
                    data = c.sock.recv(1 << 20)
                except socket.timeout:
                    if time.monotonic() - quiet_since > 2.0:
                        break  # 2 s without a byte: stalled
                    continue
                if not data:
                    break
                got += data
                quiet_since = time.monotonic()
            c.close()
            check(len(got) == len(want),
                  "connection %d: %d pipelined 'peek 1' (+ list-tube-used) of a 60000-byte job: "
                  "received %d of %d bytes (%d whole FOUND replies), then nothing for 2 s: the "
                  "server left the rest of the pipelined input unprocessed after its 4 MB output "
                  "buffer filled and was flushed" % (attempt, n, len(got), len(want), len(got) // len(one)))
            check_eq(bytes(got), want, "connection %d: replies to the pipelined peeks" % attempt)


# ---- 14. a hostile client sending garbage ----------------------------------------------

def test_garbage_flood_without_crlf():
    total = 10 * 1024 * 1024
    with Server() as srv:
        g = srv.connect(timeout=10.0)
        b = srv.connect()
        send_error = []

        def flood():
            chunk = b"x" * 65536
            try:
                for _ in range(total // len(chunk)):
                    g.send(chunk)
            except Exception as e:
                send_error.append(repr(e))

        t = threading.Thread(target=flood)
        t.start()
        rounds = 0
        try:
            while t.is_alive() and rounds < 400:
                round_trip(b, b"during-%d" % rounds, "B round trip %d during the flood" % rounds)
                check_rss(srv, RSS_LIMIT_KB, "during the flood")
                rounds += 1
        finally:
            t.join(30)
        check(not t.is_alive(), "sending 10 MB of garbage did not finish in 30 s")
        check(not send_error, "sending garbage failed: %s" % send_error)
        # reference rule 2: a line with no CRLF is discarded silently
        g.expect_silence(0.3, "after 10 MB without CRLF")
        # 10485760 = 224*46811 + 96: the CRLF falls inside one discard chunk,
        # so it ends the over-long line (BAD_FORMAT) and the rest is parsed
        g.send(b"\r\nlist-tube-used\r\n")
        g.expect(b"BAD_FORMAT\r\nUSING default\r\n", "CRLF after 10 MB of garbage")
        round_trip(b, b"after", "B round trip after the flood")
        check_rss(srv, RSS_LIMIT_KB, "after the flood")
        g.close()
        b.close()


# ---- 15. -u -------------------------------------------------------------------------

def test_flag_u_nobody():
    if os.geteuid() != 0:
        raise Skip("not running as root (euid %d), cannot test -u" % os.geteuid())
    try:
        pw = pwd.getpwnam("nobody")
    except KeyError:
        raise Skip("user 'nobody' does not exist") from None
    with Server(["-u", "nobody"]) as srv:
        uid = gid = None
        with open("/proc/%d/status" % srv.proc.pid) as f:
            for line in f:
                if line.startswith("Uid:"):
                    uid = line.split()[1:]
                elif line.startswith("Gid:"):
                    gid = line.split()[1:]
        want_uid = [str(pw.pw_uid)] * 4
        check_eq(uid, want_uid, "/proc/PID/status Uid (real, effective, saved, fs)")
        check_eq(gid, [str(pw.pw_gid)] * 4, "/proc/PID/status Gid (real, effective, saved, fs)")
        c = srv.connect()
        c.cmd(put_cmd(b"as nobody"), b"INSERTED 1\r\n")
        c.cmd(b"reserve\r\n", job_reply(b"RESERVED", 1, b"as nobody"))
        c.close()


# ---- runner ---------------------------------------------------------------------------

def test_systemd_socket_activation():
    # A listening socket passed as fd 3 with LISTEN_PID/LISTEN_FDS (the
    # sd_listen_fds protocol) serves the beanstalk protocol; -p is ignored.
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(16)
    port = lsock.getsockname()[1]
    saved = os.dup(3) if _fd_open(3) else None
    os.dup2(lsock.fileno(), 3)
    try:
        proc = subprocess.Popen(["/bin/sh", "-c", 'LISTEN_PID=$$ LISTEN_FDS=1 exec "$0" -p 1 --no-http -V',
                                 BINARY], pass_fds=(3,), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    finally:
        if saved is not None:
            os.dup2(saved, 3)
            os.close(saved)
        else:
            os.close(3)
    lsock.close()
    try:
        c = socket.create_connection(("127.0.0.1", port), timeout=5)
        c.settimeout(5)
        c.sendall(b"put 0 0 10 2\r\nhi\r\nlist-tube-used\r\n")
        got = b""
        while not got.endswith(b"USING default\r\n"):
            chunk = c.recv(4096)
            if not chunk:
                break
            got += chunk
        c.close()
        check(got == b"INSERTED 1\r\nUSING default\r\n", "inherited socket replied %r" % got)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    check(proc.returncode == 0, "exit status %r after SIGTERM; stderr %r" % (proc.returncode, err[-500:]))
    check(b"event=listening addr=systemd-fd-3" in err, "no listening line for the inherited socket in %r" % err[-500:])


def _fd_open(fd):
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


# ---- a web page's request on the beanstalk port (issue 22) -----------------

def test_http_lines_close_the_connection():
    """A browser's form or no-cors fetch to the beanstalk port sends an HTTP
    request line, then a Host header, then its body, which would run as
    commands (a put, a delete). The connection is closed at the request
    line (or a Host line), nothing after it runs, earlier commands' replies
    still arrive, and the closing is counted and logged. Lines that only
    look alike stay UNKNOWN_COMMAND, as in beanstalkd."""
    with Server(["-V"]) as srv:
        victim = srv.connect()
        victim.cmd(put_cmd(b"keep me"), b"INSERTED 1\r\n", "put the job a page tries to delete")
        body = b"put 0 0 60 5\r\nhello\r\ndelete 1\r\n"
        attacks = [
            b"POST / HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n"
            % (srv.port, len(body)) + body,
            b"GET /?x HTTP/1.0\r\n" + body,
            b"OPTIONS * HTTP/1.1\r\n" + body,
            b"host: 127.0.0.1\r\n" + body,
            b"use web\r\nPUT /jobs HTTP/1.1\r\n" + body,
            # a request line and a Host longer than a command line may be
            # (a long path, a long rebinding name): each is dropped as too
            # long, but the Host line still closes
            b"POST /" + b"p" * 300 + b" HTTP/1.1\r\nHost: " + b"a" * 250 + b".example:%d\r\n\r\n" % srv.port + body,
        ]
        for i, attack in enumerate(attacks):
            c = srv.connect()
            c.send(attack)
            got = c.read_until_closed("attack %d" % i, 5.0)
            c.close()
            want = b"USING web\r\n" if attack.startswith(b"use web") else b"BAD_FORMAT\r\n" if len(attack) > 600 else b""
            check_eq(got, want, "replies to attack %d" % i)
        victim.send(b"stats-job 1\r\n")
        check(b"\nstate: ready\n" in victim.read_ok(), "job 1 is not ready any more")
        victim.send(b"stats\r\n")
        doc = victim.read_ok().decode()
        check("\ntotal-jobs: 1\n" in doc and "\ncurrent-jobs-ready: 1\n" in doc,
              "a job was made or deleted by a page: %s" % doc[:400])
        for line in (b"POST /", b"GET / HTTP/2", b"GET  / HTTP/1.1", b"Hostname: x", b"GET / HTTP/1.1 x"):
            victim.cmd(line + b"\r\n", b"UNKNOWN_COMMAND\r\n", "%r (not a request line)" % line)
        victim.close()
        testlib.wait_until(lambda: "event=cross_protocol_closed protocol=beanstalk" in srv.stderr(),
                           "the closing to be logged", 5)
        check_eq(srv.stderr().count("event=cross_protocol_closed"), 1, "log lines (one per 10 s)")
        if HAS_HTTP:
            s = socket.create_connection(("127.0.0.1", srv.http_port), timeout=5)
            s.sendall(b"GET /stats HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            conn = Conn(s)
            reply = conn.read_until_closed("GET /stats", 5.0)
            conn.close()
            check(b'"cross_protocol_closed":%d' % len(attacks) in reply, "the count in /stats: %s" % show(reply, 2000))


TESTS = [
    test_put_reserve_delete_binary_body,
    test_systemd_socket_activation,
    test_job_size_default_limit,
    test_job_size_flag_z10,
    test_pipelined_2000_puts_then_reserve_delete,
    test_concurrent_connections,
    test_blocking_reserve_woken_by_put,
    test_two_blocked_reservers_get_different_jobs,
    test_reserver_watching_two_tubes,
    test_disconnect_returns_reserved_job,
    test_reserve_with_timeout_fires,
    test_delayed_job_reaches_blocked_reserver,
    test_pause_zero_then_reserve_with_timeout_0,
    test_deadline_passed_before_timer_runs,
    test_quit_after_pipelined_commands,
    test_unix_socket,
    test_startup_block_lists_the_real_listeners,
    test_startup_block_without_http_and_with_a_log,
    test_startup_block_unix_socket,
    test_no_startup_block_when_a_listener_fails,
    test_flag_v_prints_version,
    test_flag_h_usage,
    test_bad_flags_exit_5,
    test_flag_z_clamped,
    test_default_listen_address_is_loopback,
    test_drain_mode,
    test_sigterm_with_busy_server,
    test_sigint_with_busy_server,
    test_sigterm_answers_blocked_reserve,
    test_slow_reader_does_not_stall_loop,
    test_pipelined_replies_beyond_output_high_water,
    test_garbage_flood_without_crlf,
    test_flag_u_nobody,
    test_http_lines_close_the_connection,
]


def main(argv):
    global BINARY, HAS_HTTP
    args = testlib.parse_args(testlib.arg_parser(__doc__), argv, only_env=("BEANGATE_IT_ONLY",))
    BINARY = args.binary
    HAS_HTTP = b"--http-port" in testlib.binary_usage(BINARY)
    return testlib.run("integration", TESTS, args, namespace=globals())


if __name__ == "__main__":
    sys.exit(main(sys.argv))
