#!/usr/bin/env python3
"""The Gearman front-end: the same scenarios against gearmand and beangate.

Usage:
  python3 tests/gearman/test_gearman.py --target gearmand [--gearmand PATH]
      runs every test that does not need beangate against Debian's gearmand
      (/usr/sbin/gearmand, 1.1.20): proves the tests themselves are right.
  python3 tests/gearman/test_gearman.py build/beangate
      runs every test against beangate (started with --gearman-port); the
      differential admin test also starts gearmand and compares; the
      cross-protocol tests (Gearman <-> beanstalk TCP / HTTP) run only here.

Each test gets a fresh server on free loopback ports (bind to port 0); every
socket read and every subprocess has a timeout, and each test has a SIGALRM
watchdog. Uses the real `gearman` / `gearadmin` tools (Debian gearman-tools)
unchanged. The runner is tests/lib/testlib.py's: -k NAME runs one test (so
does GEARMAN_TEST_ONLY="test_a test_b"), PASS/FAIL/SKIP per test, the last
line is `gearman: N passed, M failed, K skipped`; exit status 1 on failure.
On a failure the
stderr of every server the test started is printed (sanitizer reports
verbatim, from their first line); a sanitizer report fails the test.
See tests/gearman/FACTS.md for the observed gearmand behaviour the
assertions encode.
"""

import http.client
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import testlib  # noqa: E402
from testlib import SANITIZER_MARKERS, free_port  # noqa: E402

START_TIMEOUT = 10.0
READ_TIMEOUT = 3.0        # a reply that must come
QUIET = 0.4               # how long we listen to prove that nothing comes
TOOL_TIMEOUT = 15.0       # any gearman/gearadmin run
TEST_TIMEOUT = 60         # SIGALRM watchdog per test

GEARMAN = shutil.which("gearman") or "/usr/bin/gearman"
GEARADMIN = shutil.which("gearadmin") or "/usr/bin/gearadmin"

T = dict(CAN_DO=1, CANT_DO=2, RESET_ABILITIES=3, PRE_SLEEP=4, NOOP=6, SUBMIT_JOB=7,
         JOB_CREATED=8, GRAB_JOB=9, NO_JOB=10, JOB_ASSIGN=11, WORK_STATUS=12,
         WORK_COMPLETE=13, WORK_FAIL=14, GET_STATUS=15, ECHO_REQ=16, ECHO_RES=17,
         SUBMIT_JOB_BG=18, ERROR=19, STATUS_RES=20, SUBMIT_JOB_HIGH=21, SET_CLIENT_ID=22,
         CAN_DO_TIMEOUT=23, ALL_YOURS=24, WORK_EXCEPTION=25, OPTION_REQ=26, OPTION_RES=27,
         WORK_DATA=28, WORK_WARNING=29, GRAB_JOB_UNIQ=30, JOB_ASSIGN_UNIQ=31,
         SUBMIT_JOB_HIGH_BG=32, SUBMIT_JOB_LOW=33, SUBMIT_JOB_LOW_BG=34, SUBMIT_JOB_SCHED=35,
         SUBMIT_JOB_EPOCH=36, GRAB_JOB_ALL=39, JOB_ASSIGN_ALL=40, GET_STATUS_UNIQUE=41,
         STATUS_RES_UNIQUE=42)
NAMES = {v: k for k, v in T.items()}


class Fail(Exception):
    pass


# here a failed check raises Fail, not AssertionError (see testlib.check / testlib.check_eq)
def check(cond, msg):
    testlib.check(cond, msg, exc=Fail)


def check_eq(got, want, what):
    testlib.check_eq(got, want, what, exc=Fail)


def b(x):
    return x if isinstance(x, bytes) else str(x).encode()


def packet(kind, *args, magic=b"\0REQ"):
    if isinstance(kind, str):
        kind = T[kind]
    body = b"\0".join(b(a) for a in args)
    return magic + struct.pack(">II", kind, len(body)) + body


def wait_until(fn, what, timeout=5.0):
    return testlib.wait_until(fn, what, timeout, exc=Fail)


# ------------------------------------------------------------------ Gearman client

class Gear(testlib.LineSocket):
    """One Gearman connection (binary packets and admin text lines)."""

    def __init__(self, port):
        super().__init__(port, READ_TIMEOUT, "gearman", Fail)

    def send(self, kind, *args):
        self.s.sendall(packet(kind, *args))

    def raw(self, data):
        self.s.sendall(data)

    def _fill(self, n, deadline):
        while len(self.buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout()
            self.s.settimeout(left)
            d = self.s.recv(65536)
            if not d:
                raise EOFError("connection closed")
            self.buf += d

    def recv(self, timeout=READ_TIMEOUT):
        """Next packet as (name, [args], raw bytes); Fail on timeout/EOF."""
        deadline = time.monotonic() + timeout
        try:
            self._fill(12, deadline)
            kind, size = struct.unpack(">II", self.buf[4:12])
            self._fill(12 + size, deadline)
        except socket.timeout:
            raise Fail("no packet within %.1f s (buffered %r)" % (timeout, self.buf))
        except EOFError:
            raise Fail("connection closed while waiting for a packet (buffered %r)" % self.buf)
        check_eq(self.buf[:4], b"\0RES", "reply magic")
        raw, self.buf = self.buf[:12 + size], self.buf[12 + size:]
        body = raw[12:]
        return NAMES.get(kind, kind), (body.split(b"\0") if size else []), raw

    def expect(self, name, args=None, timeout=READ_TIMEOUT):
        got = self.recv(timeout)
        check(got[0] == name, "want %s%s, got %s %r" % (name, "" if args is None else " %r" % (args,),
                                                          got[0], got[1]))
        if args is not None:
            check_eq(got[1], [b(a) for a in args], "%s arguments" % name)
        return got[1]

    def expect_nothing(self, what, quiet=QUIET):
        self.s.settimeout(quiet)
        try:
            d = self.s.recv(65536)
        except socket.timeout:
            return
        raise Fail("%s: expected nothing, got %r" % (what, self.buf + d))

    def is_closed(self, timeout=READ_TIMEOUT):
        """True if the server closes (data before the EOF is a failure)."""
        self.s.settimeout(timeout)
        got = b""
        try:
            while True:
                d = self.s.recv(65536)
                if not d:
                    check(got == b"", "got %r before the close" % got)
                    return True
                got += d
        except socket.timeout:
            check(got == b"", "got %r and no close" % got)
            return False
        except ConnectionResetError:
            return True

    def submit(self, func, data, unique="", kind="SUBMIT_JOB"):
        self.send(kind, func, unique, data)
        return self.expect("JOB_CREATED")[0]

    def text(self, line, multi=None, timeout=READ_TIMEOUT):
        """Send an admin line and read one reply: up to `.\\n` for list
        commands, else one line."""
        self.s.sendall(line)
        if multi is None:
            word = line.strip().split(b" ")[0].lower()
            multi = word in (b"status", b"workers", b"show", b"prioritystatus")
        deadline = time.monotonic() + timeout
        while True:
            if multi:
                if self.buf == b".\n" or self.buf.endswith(b"\n.\n"):
                    break
            elif b"\n" in self.buf:
                break
            try:
                self._fill(len(self.buf) + 1, deadline)
            except socket.timeout:
                raise Fail("admin %r: incomplete reply %r" % (line, self.buf))
            except EOFError:
                raise Fail("admin %r: closed after %r" % (line, self.buf))
        if multi:
            out, self.buf = self.buf, b""
        else:
            i = self.buf.index(b"\n") + 1
            out, self.buf = self.buf[:i], self.buf[i:]
        return out


# ------------------------------------------------------------------ beanstalk client

class Beanstalk(testlib.LineSocket):
    def __init__(self, port):
        super().__init__(port, READ_TIMEOUT, "beanstalk", Fail)

    def cmd(self, line, data=None):
        """Returns (reply line, body or None)."""
        self.s.settimeout(READ_TIMEOUT + 5)
        self.s.sendall(b(line) + b"\r\n" + (b(data) + b"\r\n" if data is not None else b""))
        reply = self.line()
        parts = reply.split(b" ")
        if parts[0] in (b"RESERVED", b"FOUND", b"OK"):
            return reply, self.body(int(parts[-1]))
        return reply, None

    def put(self, tube, body, pri):
        """use tube, put body with priority pri (TTR 60): the new job's id."""
        self.cmd("use %s" % tube)
        reply, _ = self.cmd("put %d 0 60 %d" % (pri, len(b(body))), body)
        check(reply.startswith(b"INSERTED "), "put: %r" % reply)
        return int(reply.split()[1])

    def stats_job(self, jid):
        return self.stats("stats-job %d" % jid)

    def stats(self, line="stats"):
        """Any stats command -> (reply line, dict of its YAML, or None)."""
        reply, body = self.cmd(line)
        if reply != b"OK" and not reply.startswith(b"OK "):
            return reply, None
        d = {}
        for ln in body.decode().splitlines()[1:]:
            k, _, v = ln.partition(": ")
            d[k.strip()] = v.strip()
        return reply, d


def http_req(port, method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request(method, path, body=body)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


# ------------------------------------------------------------------ servers

class Server(testlib.ServerProcess):
    kind = None
    binary = None

    def __init__(self):
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="gearman-test-")
        self.extra = []            # more command line arguments (new_server)
        self.env = None            # more environment variables (new_server)
        self.expect_exit = False   # a test made it exit (admin shutdown)
        self.last_stderr = ""      # its stderr, kept by stop()

    def _spawn(self, argv):
        if self.err:
            self.err.close()
        # append: the stderr of a killed and restarted server is kept
        env = dict(os.environ, **self.env) if self.env else None
        self.spawn(argv, env=env, err_file=open(os.path.join(self.tmp, "stderr"), "a+b"))

    def _ready(self):
        def echo():
            g = Gear(self.port)
            try:
                g.send("ECHO_REQ", "ready")
                g.expect("ECHO_RES", ["ready"], timeout=1)
                return True
            finally:
                g.close()
        return testlib.wait_ready(self.proc, echo, START_TIMEOUT, step=0.05, not_yet=(OSError, Fail)) == "ok"

    def start(self):
        for _ in range(5):
            self.pick_ports()
            self._spawn(self.argv())
            if self._ready():
                return self
            self.kill()
        raise Fail("%s did not start: %s" % (self.argv(), self.stderr()[-800:]))

    def restart_after_kill9(self):
        """SIGKILL, then start again with the same arguments (same -b
        directory, fresh ports)."""
        self.kill()
        return self.start()

    def stop(self):
        """SIGTERM; returns a problem description or None."""
        problem = None
        if self.proc is None:
            return None
        if self.proc.poll() is not None:
            if not self.expect_exit or self.proc.returncode != 0:
                problem = "server exited early with %r: %s" % (self.proc.returncode, self.stderr()[-800:])
        else:
            self.proc.terminate()
            try:
                status = self.proc.wait(5)
                if self.kind == "beangate" and status != 0:
                    problem = "exit status %r after SIGTERM: %s" % (status, self.stderr()[-800:])
            except subprocess.TimeoutExpired:
                self.kill()
                problem = "did not exit within 5 s of SIGTERM"
        err = self.last_stderr = self.stderr()
        bad = [m for m in SANITIZER_MARKERS if m in err]
        if bad:
            problem = "sanitizer report in its stderr (printed below if the test failed): %s" % \
                sanitizer_report(err).splitlines()[0]
        try:
            self.err.close()
        except (OSError, AttributeError):
            pass
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.proc = None
        return problem

    # convenience
    def conn(self):
        return Gear(self.port)

    def admin(self, line):
        g = Gear(self.port)
        try:
            return g.text(line)
        finally:
            g.close()

    def tool(self, args, input=None, timeout=TOOL_TIMEOUT):
        return subprocess.run([GEARMAN, "-h", "127.0.0.1", "-p", str(self.port)] + args,
                              input=input, capture_output=True, timeout=timeout)

    def gearadmin(self, *args):
        return subprocess.run([GEARADMIN, "-h", "127.0.0.1", "-p", str(self.port)] + list(args),
                              capture_output=True, timeout=TOOL_TIMEOUT)

    def status(self):
        """Normalised `status`: dict function -> (total, running, workers)."""
        out = self.admin(b"status\n")
        d = {}
        for ln in normalise_status(out):
            name, tot, run, av = ln.split("\t")
            d[name] = (int(tot), int(run), int(av))
        return d


class Gearmand(Server):
    kind = "gearmand"

    def pick_ports(self):
        self.port = free_port()

    def argv(self):
        return [self.binary, "-L", "127.0.0.1", "-p", str(self.port),
                "-l", os.path.join(self.tmp, "gearmand.log"), "--verbose", "INFO"] + self.extra


class Beangate(Server):
    kind = "beangate"

    def pick_ports(self):
        self.port, self.bport, self.hport = free_port(), free_port(), free_port()

    def argv(self):
        return [self.binary, "-l", "127.0.0.1", "-p", str(self.bport),
                "--http-listen", "127.0.0.1", "--http-port", str(self.hport),
                "--gearman-listen", "127.0.0.1", "--gearman-port", str(self.port)] + self.extra


TARGET = None          # the class under test, set in main()
GEARMAND_BIN = "/usr/sbin/gearmand"


def is_beangate():
    return TARGET is Beangate


def handle_number(h):
    m = re.match(rb"^H:([^:]+):(\d+)$", h)
    check(m is not None, "job handle %r is not H:host:N" % h)
    return int(m.group(2))


def check_handle(h, srv):
    n = handle_number(h)
    if is_beangate():
        # beangate: H:<hostname>:<beanstalk job id>
        check_eq(h.split(b":")[1], socket.gethostname().encode(), "handle host")
    return n


def normalise_status(out):
    """`status` reply -> sorted list of lines without the final '.'.
    Sorted: gearmand lists functions newest-first from an internal list; the
    order is not part of the format. On beangate the beanstalk tube `default`
    always exists; a line `default\\t0\\t0\\t0` (no gearman job or worker ever
    named it) is left out so empty servers compare equal."""
    text = out.decode()
    check(text.endswith(".\n"), "status does not end in '.\\n': %r" % out)
    check(text == ".\n" or text.endswith("\n.\n"), "status: bad end %r" % out)
    lines = text[:-2].splitlines()
    for ln in lines:
        check(re.match(r"^[^\t]+\t\d+\t\d+\t\d+$", ln), "status line %r" % ln)
    if is_beangate():
        lines = [ln for ln in lines if ln != "default\t0\t0\t0"]
    return sorted(lines)


def normalise_workers(out):
    """`workers` reply -> sorted lines. Normalised: the first field is the
    server's file descriptor number (differs between processes) -> 'FD';
    the line order is gearmand's connection list order -> sorted; a worker's
    functions are listed in reverse CAN_DO order by gearmand (storage order)
    -> sorted. The IP and the client id (SET_CLIENT_ID or '-') are kept."""
    text = out.decode()
    check(text == ".\n" or text.endswith("\n.\n"), "workers: bad end %r" % out)
    res = []
    for ln in text[:-2].splitlines():
        m = re.match(r"^(\d+) (\S+) (\S+) :(.*)$", ln)
        check(m is not None, "workers line %r is not 'FD IP ID : FUNCS'" % ln)
        funcs = m.group(4).split()
        check(m.group(4) == "".join(" " + f for f in funcs), "workers line %r: function list spacing" % ln)
        res.append("FD %s %s :%s" % (m.group(2), m.group(3), "".join(" " + f for f in sorted(funcs))))
    return sorted(res)


# ------------------------------------------------------------------ test plumbing

TESTS = []
CLEANUP = []


def test(fn):
    TESTS.append(fn)
    return fn


CROSS = "cross-protocol, beangate only"


def beangate_only(fn=None, why=CROSS):
    """Skip the test (printing `why`) unless the target is beangate.
    @beangate_only or @beangate_only(why="...")."""
    def mark(f):
        f.beangate_only = why
        return f
    return mark(fn) if fn else mark


def sanitizer_report(err):
    """A server's stderr from its first sanitizer line on (verbatim), or
    its tail."""
    return testlib.sanitizer_report(err) or err[-2000:]


def spawn(argv, **kw):
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, **kw)
    CLEANUP.append(p)
    return p


def tool_worker(srv, args):
    return spawn([GEARMAN, "-h", "127.0.0.1", "-p", str(srv.port), "-w"] + args)


# Worker w (a new Gear connection) says CAN_DO fn and GRAB_JOB (GRAB_JOB_UNIQ
# when unique is given): it must be assigned job handle with args data; returns w.
def worker_gets(w, fn, handle, *data, unique=None):
    w.send("CAN_DO", fn)
    if unique is None:
        w.send("GRAB_JOB")
        w.expect("JOB_ASSIGN", [handle, fn] + list(data))
    else:
        w.send("GRAB_JOB_UNIQ")
        w.expect("JOB_ASSIGN_UNIQ", [handle, fn, unique] + list(data))
    return w


def wait_connections(srv, n, what):
    """Wait until `workers` lists n connections besides the admin one that
    asks (the server has seen the others close)."""
    wait_until(lambda: len(normalise_workers(srv.admin(b"workers\n"))) == n + 1,
               "%d connection(s) in workers after %s" % (n, what))


def wait_workers(srv, func, n=1):
    wait_until(lambda: srv.status().get(func, (0, 0, 0))[2] >= n,
               "%d worker(s) for %s in status" % (n, func))


def new_server(cls=None, extra=(), env=None):
    """A started server; `extra`: more arguments, or a function of the
    (not yet started) server returning them (e.g. a directory in s.tmp);
    `env`: more environment variables."""
    s = (cls or TARGET)()
    s.extra = list(extra(s) if callable(extra) else extra)
    s.env = env
    CLEANUP.append(s)
    return s.start()


# ================================================================== a. the tools

@test
def test_tool_reverse_roundtrip(srv):
    tool_worker(srv, ["-f", "reverse", "--", "rev"])
    wait_workers(srv, "reverse")
    r = srv.tool(["-f", "reverse", "hello"])
    check_eq((r.returncode, r.stdout), (0, b"olleh"), "gearman -f reverse hello (stderr %r)" % r.stderr)
    r = srv.tool(["-f", "reverse"], input=b"from stdin\n")
    check_eq(r.stdout, b"nidts morf\n", "workload from stdin")
    r = srv.tool(["-I", "-u", "myuniq", "-f", "reverse", "high"])
    check_eq(r.stdout, b"hgih", "-I -u")
    r = srv.tool(["-L", "-f", "reverse", "low"])
    check_eq(r.stdout, b"wol", "-L")
    wait_until(lambda: srv.status().get("reverse") == (0, 0, 1), "reverse 0 0 1 in status")


@test
def test_tool_background_then_worker(srv):
    r = srv.tool(["-b", "-f", "reverse", "bgdata"])
    check_eq((r.returncode, r.stdout), (0, b""), "gearman -b (stderr %r)" % r.stderr)
    check_eq(srv.status().get("reverse"), (1, 0, 0), "status after -b")
    out = os.path.join(srv.tmp, "out")
    w = tool_worker(srv, ["-c", "1", "-f", "reverse", "--", "sh", "-c", 'cat > "$0"', out])
    check_eq(w.wait(TOOL_TIMEOUT), 0, "worker -c 1 exit status")
    check_eq(open(out, "rb").read(), b"bgdata", "workload seen by the worker")
    check_eq(srv.status().get("reverse"), (0, 0, 0), "status after the worker")


@test
def test_tool_priorities(srv):
    for args, data in ((["-L"], "low"), ([], "normal1"), (["-I"], "high"), ([], "normal2")):
        r = srv.tool(args + ["-b", "-f", "reverse", data])
        check_eq(r.returncode, 0, "gearman %s -b" % args)
    check_eq(srv.status().get("reverse"), (4, 0, 0), "status with 4 queued")
    out = os.path.join(srv.tmp, "order")
    w = tool_worker(srv, ["-c", "4", "-f", "reverse", "--", "sh", "-c", 'cat >> "$0"; echo >> "$0"', out])
    check_eq(w.wait(TOOL_TIMEOUT), 0, "worker -c 4 exit status")
    check_eq(open(out).read().split("\n"), ["high", "normal1", "normal2", "low", ""],
             "processing order (HIGH, NORMAL fifo, LOW)")


@test
def test_gearadmin(srv):
    w = srv.conn()
    w.send("SET_CLIENT_ID", "adminworker")
    w.send("CAN_DO", "reverse")
    w.send("CAN_DO", "upper")
    c = srv.conn()
    c.submit("reverse", "a", kind="SUBMIT_JOB_BG")
    c.submit("reverse", "b", kind="SUBMIT_JOB_BG")
    c.submit("other", "c", kind="SUBMIT_JOB_BG")
    w.send("GRAB_JOB")
    w.expect("JOB_ASSIGN")
    r = srv.gearadmin("--status")
    check_eq(r.returncode, 0, "gearadmin --status exit")
    check_eq(normalise_status(r.stdout),
             ["other\t1\t0\t0", "reverse\t2\t1\t1", "upper\t0\t0\t1"], "gearadmin --status")
    r = srv.gearadmin("--workers")
    lines = normalise_workers(r.stdout)
    check("FD 127.0.0.1 adminworker : reverse upper" in lines, "gearadmin --workers: %r" % lines)
    check("FD 127.0.0.1 - :" in lines, "--workers lists the submitting client: %r" % lines)
    r = srv.gearadmin("--getpid")
    check_eq(r.stdout, b"%d\n" % srv.proc.pid, "gearadmin --getpid")
    r = srv.gearadmin("--server-version")
    if is_beangate():
        # beangate reports its own version (`beangate -v`), not gearmand's
        check(re.match(rb"^\S+\n$", r.stdout), "gearadmin --server-version: %r" % r.stdout)
    else:
        check_eq(r.stdout, b"1.1.20+ds\n", "gearadmin --server-version")
    w.close()
    c.close()


# ================================================================== b. raw protocol

@test
def test_submit_assign_and_forwarding(srv):
    c = srv.conn()
    h = c.submit("reverse", "hello")
    n = check_handle(h, srv)
    if not is_beangate():
        check_eq(n, 1, "gearmand's first handle number")  # beangate: the beanstalk job id
    w = worker_gets(srv.conn(), "reverse", h, "hello")
    o = srv.conn()
    o.send("GET_STATUS", h)
    o.expect("STATUS_RES", [h, 1, 1, 0, 0])
    check_eq(srv.status().get("reverse"), (1, 1, 1), "status while running")
    w.send("WORK_DATA", h, b"part\0ial")
    w.send("WORK_WARNING", h, "warn")
    w.send("WORK_STATUS", h, 1, 2)
    c.expect("WORK_DATA", [h, b"part", b"ial"])
    c.expect("WORK_WARNING", [h, "warn"])
    c.expect("WORK_STATUS", [h, 1, 2])
    o.send("GET_STATUS", h)
    o.expect("STATUS_RES", [h, 1, 1, 1, 2])
    w.send("WORK_COMPLETE", h, "olleh")
    c.expect("WORK_COMPLETE", [h, "olleh"])
    c.expect_nothing("client after WORK_COMPLETE")
    o.send("GET_STATUS", h)
    o.expect("STATUS_RES", [h, 0, 0, 0, 0])
    check_eq(srv.status().get("reverse"), (0, 0, 1), "status after completion")
    w.send("GRAB_JOB")
    w.expect("NO_JOB", [])


@test
def test_get_status(srv):
    c = srv.conn()
    unknown = b"H:%s:987654" % socket.gethostname().encode()
    c.send("GET_STATUS", unknown)
    c.expect("STATUS_RES", [unknown, 0, 0, 0, 0])
    h1 = c.submit("q", "fg")
    h2 = c.submit("q", "bg", kind="SUBMIT_JOB_BG")
    check(h1 != h2, "two jobs, two handles")
    o = srv.conn()
    for h in (h1, h2):
        o.send("GET_STATUS", h)
        o.expect("STATUS_RES", [h, 1, 0, 0, 0])
    # exact bytes of one reply
    o.send("GET_STATUS", h1)
    _, _, raw = o.recv()
    body = h1 + b"\x001\x000\x000\x000"
    check_eq(raw, b"\0RES" + struct.pack(">II", 20, len(body)) + body, "STATUS_RES bytes")


@test
def test_echo_option_client_id(srv):
    c = srv.conn()
    c.send("ECHO_REQ", b"bin\0ary\xff")
    _, _, raw = c.recv()
    check_eq(raw, b"\0RES\0\0\0\x11\0\0\0\x08bin\0ary\xff", "ECHO_RES bytes")
    c.send("ECHO_REQ")
    c.expect("ECHO_RES", [])
    c.send("OPTION_REQ", "exceptions")
    c.expect("OPTION_RES", ["exceptions"])
    c.send("OPTION_REQ", "nosuchoption")
    _, _, raw = c.recv()
    msg = b"UNKNOWN_OPTION\0Server does not recognize given option"
    check_eq(raw, b"\0RES\0\0\0\x13" + struct.pack(">I", len(msg)) + msg, "unknown option ERROR bytes")
    c.send("SET_CLIENT_ID", "my-client")
    c.expect_nothing("SET_CLIENT_ID has no reply")
    c.send("CAN_DO", "reverse")
    c.expect_nothing("CAN_DO has no reply")
    lines = normalise_workers(srv.admin(b"workers\n"))
    check("FD 127.0.0.1 my-client : reverse" in lines, "workers after SET_CLIENT_ID: %r" % lines)
    c.send("ECHO_REQ", "still")
    c.expect("ECHO_RES", ["still"])


@test
def test_unique_coalescing(srv):
    c1, c2, c3, c4 = srv.conn(), srv.conn(), srv.conn(), srv.conn()
    h = c1.submit("f", "d1", unique="U")
    check_eq(c2.submit("f", "d2", unique="U"), h, "same function+unique while queued")
    check_eq(c3.submit("f", "d3", unique="U", kind="SUBMIT_JOB_BG"), h, "background duplicate")
    other = c3.submit("g", "d4", unique="U")
    check(other != h, "same unique, other function: another job")
    check_eq(srv.status().get("f"), (1, 0, 0), "one job for three submits")
    w = worker_gets(srv.conn(), "f", h, "d1", unique="U")
    check_eq(c4.submit("f", "d5", unique="U"), h, "same function+unique while running")
    w.send("WORK_COMPLETE", h, "res")
    for c in (c1, c2, c4):
        c.expect("WORK_COMPLETE", [h, "res"])
    c3.expect_nothing("background submitter gets no result")
    check_eq(srv.status().get("f"), (0, 0, 1), "status after completion")
    h2 = c1.submit("f", "again", unique="U")
    check(h2 != h, "after completion the unique makes a new job")
    w.send("GRAB_JOB_UNIQ")
    w.expect("JOB_ASSIGN_UNIQ", [h2, "f", "U", "again"])


@test
def test_work_fail(srv):
    c = srv.conn()
    h = c.submit("f", "x")
    w = worker_gets(srv.conn(), "f", h, "x")
    w.send("WORK_FAIL", h)
    c.expect("WORK_FAIL", [h])
    check_eq(srv.status().get("f"), (0, 0, 1), "status after WORK_FAIL")
    c.send("GET_STATUS", h)
    c.expect("STATUS_RES", [h, 0, 0, 0, 0])
    w.send("GRAB_JOB")
    w.expect("NO_JOB")


@test
def test_work_exception(srv):
    w = srv.conn()
    w.send("CAN_DO", "f")
    c = srv.conn()
    h = c.submit("f", "x")
    w.send("GRAB_JOB")
    w.expect("JOB_ASSIGN")
    w.send("WORK_EXCEPTION", h, "boom")
    name, args, _ = c.recv()
    # without OPTION_REQ exceptions the client gets WORK_FAIL; gearmand sends
    # it as "handle\0" (an empty 2nd argument); [handle] alone is accepted too
    check(name == "WORK_FAIL" and args[0] == h and args[1:] in ([], [b""]),
          "WORK_EXCEPTION without the option: got %s %r" % (name, args))
    check_eq(srv.status().get("f"), (0, 0, 1), "status after the exception")
    c2 = srv.conn()
    c2.send("OPTION_REQ", "exceptions")
    c2.expect("OPTION_RES", ["exceptions"])
    h2 = c2.submit("f", "y")
    w.send("GRAB_JOB")
    w.expect("JOB_ASSIGN", [h2, "f", "y"])
    w.send("WORK_EXCEPTION", h2, "boom")
    c2.expect("WORK_EXCEPTION", [h2, "boom"])
    check_eq(srv.status().get("f"), (0, 0, 1), "status after the 2nd exception")
    # a result for a job that is gone
    w.send("WORK_COMPLETE", h2, "late")
    w.expect("ERROR", ["JOB_NOT_FOUND", "Job given in work result not found"])
    w.send("ECHO_REQ", "open")
    w.expect("ECHO_RES", ["open"])


@test
def test_pre_sleep_noop(srv):
    w = srv.conn()
    w.send("CAN_DO", "s")
    w.send("GRAB_JOB")
    w.expect("NO_JOB", [])
    w.send("PRE_SLEEP")
    w.expect_nothing("sleeping worker, nothing queued")
    c = srv.conn()
    h1 = c.submit("s", "one", kind="SUBMIT_JOB_BG")
    w.expect("NOOP", [])
    c.submit("s", "two", kind="SUBMIT_JOB_BG")
    w.expect_nothing("only one NOOP per PRE_SLEEP")
    w.send("GRAB_JOB")
    w.expect("JOB_ASSIGN", [h1, "s", "one"])
    w.send("WORK_COMPLETE", h1, "")
    w.send("PRE_SLEEP")   # a job is still queued: woken at once
    w.expect("NOOP", [])
    # a job for a function the worker does not do: no NOOP
    w.send("GRAB_JOB")
    w.expect("JOB_ASSIGN")
    w.send("GRAB_JOB")
    w.expect("NO_JOB")
    w.send("PRE_SLEEP")
    c.submit("not-s", "x", kind="SUBMIT_JOB_BG")
    w.expect_nothing("job for another function")


@test
def test_noop_does_not_take_the_job(srv):
    """A NOOP is only a wake-up: until the worker sends GRAB_JOB the job is
    queued (not running) and any worker may grab it."""
    w1 = srv.conn()
    w1.send("CAN_DO", "f")
    w1.send("PRE_SLEEP")
    c = srv.conn()
    h = c.submit("f", "x", kind="SUBMIT_JOB_BG")
    w1.expect("NOOP", [])
    check_eq(srv.status().get("f"), (1, 0, 1), "status after the NOOP, before GRAB_JOB")
    c.send("GET_STATUS", h)
    c.expect("STATUS_RES", [h, 1, 0, 0, 0])
    w2 = worker_gets(srv.conn(), "f", h, "x")
    w1.send("GRAB_JOB")
    w1.expect("NO_JOB", [])


@test
def test_grab_after_noop_takes_highest_priority(srv):
    """The job a GRAB_JOB gets is chosen at the GRAB_JOB, not at the NOOP:
    a HIGH job submitted in between goes first."""
    w = srv.conn()
    w.send("CAN_DO", "f")
    w.send("PRE_SLEEP")
    c = srv.conn()
    hl = c.submit("f", "low", kind="SUBMIT_JOB_LOW_BG")
    w.expect("NOOP", [])
    hh = c.submit("f", "high", kind="SUBMIT_JOB_HIGH_BG")
    for h, d in ((hh, "high"), (hl, "low")):
        w.send("GRAB_JOB")
        w.expect("JOB_ASSIGN", [h, "f", d])
        w.send("WORK_COMPLETE", h, "")


@test
def test_admin_cancel_job_with_a_sleeping_worker(srv):
    """cancel job works on a queued job also when a sleeping worker was
    woken for it (and has not grabbed it)."""
    w = srv.conn()
    w.send("CAN_DO", "g")
    w.send("PRE_SLEEP")
    c = srv.conn()
    h = c.submit("g", "y")
    w.expect("NOOP", [])
    a = srv.conn()
    check_eq(a.text(b"cancel job " + h + b"\n"), b"OK\r\n", "cancel job of a queued job")
    c.expect("WORK_FAIL", [h])
    w.send("GRAB_JOB")
    w.expect("NO_JOB", [])


@test
def test_can_do_timeout_expiry_requeues(srv):
    """CAN_DO_TIMEOUT f 1: a job held longer goes back to the queue (the
    client is told nothing), another worker gets the same handle, and the
    first worker's late result is JOB_NOT_FOUND."""
    c = srv.conn()
    h = c.submit("f", "x")
    w1 = srv.conn()
    w1.send("CAN_DO_TIMEOUT", "f", 1)
    w1.send("GRAB_JOB")
    w1.expect("JOB_ASSIGN", [h, "f", "x"])
    wait_until(lambda: srv.status().get("f") == (1, 0, 1), "the job back in the queue after 1 s", timeout=4)
    c.send("GET_STATUS", h)
    c.expect("STATUS_RES", [h, 1, 0, 0, 0])
    w2 = worker_gets(srv.conn(), "f", h, "x")
    w1.send("WORK_COMPLETE", h, "late")
    w1.expect("ERROR", ["JOB_NOT_FOUND", "Job given in work result not found"])
    c.expect_nothing("no result from the timed-out worker")
    w2.send("WORK_COMPLETE", h, "ok")
    c.expect("WORK_COMPLETE", [h, "ok"])


@test
def test_grab_job_uniq_and_all(srv):
    c = srv.conn()
    h1 = c.submit("u", "d1", unique="uniq-1", kind="SUBMIT_JOB_BG")
    h2 = c.submit("u", "d2", unique="uniq-2", kind="SUBMIT_JOB_BG")
    w = worker_gets(srv.conn(), "u", h1, "d1", unique="uniq-1")
    # the gearman tool's worker sends GRAB_JOB_ALL; gearmand answers JOB_ASSIGN_UNIQ
    w.send("GRAB_JOB_ALL")
    w.expect("JOB_ASSIGN_UNIQ", [h2, "u", "uniq-2", "d2"])
    w.send("GRAB_JOB_UNIQ")
    w.expect("NO_JOB", [])
    w.send("GRAB_JOB_ALL")
    w.expect("NO_JOB", [])


@test
def test_no_job_cant_do_reset(srv):
    w = srv.conn()
    w.send("GRAB_JOB")
    w.expect("NO_JOB", [])
    c = srv.conn()
    c.submit("n", "x", kind="SUBMIT_JOB_BG")
    w.send("GRAB_JOB")
    w.expect("NO_JOB", [])          # no CAN_DO yet
    w.send("CAN_DO", "n")
    w.send("CANT_DO", "n")
    w.send("GRAB_JOB")
    w.expect("NO_JOB", [])
    w.send("CAN_DO", "n")
    w.send("RESET_ABILITIES")
    w.send("GRAB_JOB")
    w.expect("NO_JOB", [])
    check_eq(srv.status().get("n"), (1, 0, 0), "status: no worker left for n")
    w.send("CAN_DO_TIMEOUT", "n", 30)
    w.send("GRAB_JOB")
    w.expect("JOB_ASSIGN")


@test
def test_priorities_raw(srv):
    c = srv.conn()
    hl = c.submit("p", "low", kind="SUBMIT_JOB_LOW_BG")
    hn1 = c.submit("p", "n1", kind="SUBMIT_JOB_BG")
    hh = c.submit("p", "high", kind="SUBMIT_JOB_HIGH_BG")
    hn2 = c.submit("p", "n2", kind="SUBMIT_JOB_BG")
    w = srv.conn()
    w.send("CAN_DO", "p")
    for h, d in ((hh, "high"), (hn1, "n1"), (hn2, "n2"), (hl, "low")):
        w.send("GRAB_JOB")
        w.expect("JOB_ASSIGN", [h, "p", d])
        w.send("WORK_COMPLETE", h, "")


@test
def test_worker_disconnect_requeues(srv):
    c = srv.conn()
    h = c.submit("d", "mid")
    w = worker_gets(srv.conn(), "d", h, "mid")
    w.send("WORK_STATUS", h, 1, 3)
    c.expect("WORK_STATUS", [h, 1, 3])
    w.close()
    wait_until(lambda: srv.status().get("d") == (1, 0, 0), "job back in the queue")
    c.expect_nothing("client is not told about the lost worker")
    c.send("GET_STATUS", h)
    c.expect("STATUS_RES", [h, 1, 0, 0, 0])
    w2 = worker_gets(srv.conn(), "d", h, "mid")
    w2.send("WORK_COMPLETE", h, "ok")
    c.expect("WORK_COMPLETE", [h, "ok"])
    # background job: the same
    hb = c.submit("d", "bgmid", kind="SUBMIT_JOB_BG")
    w2.send("GRAB_JOB")
    w2.expect("JOB_ASSIGN", [hb, "d", "bgmid"])
    w2.close()
    wait_until(lambda: srv.status().get("d") == (1, 0, 0), "bg job back in the queue")


@test
def test_client_disconnect(srv):
    c = srv.conn()
    c.submit("d", "orphan")
    c.close()
    wait_connections(srv, 0, "the client that left")
    w = srv.conn()
    w.send("CAN_DO", "d")
    w.send("GRAB_JOB")
    # a foreground job whose client left before it was grabbed is not run
    w.expect("NO_JOB", [])
    check_eq(srv.status().get("d"), (0, 0, 1), "orphan job dropped")
    # left after the grab: the job runs to its end, results are dropped
    c = srv.conn()
    h = c.submit("d", "y")
    w.send("GRAB_JOB")
    w.expect("JOB_ASSIGN", [h, "d", "y"])
    c.close()
    wait_connections(srv, 1, "the client that left, beside the worker")
    check_eq(srv.status().get("d"), (1, 1, 1), "still running without its client")
    w.send("WORK_DATA", h, "z")
    w.send("WORK_COMPLETE", h, "done")
    w.expect_nothing("no error for a result without a client")
    check_eq(srv.status().get("d"), (0, 0, 1), "finished")


def error_then(c, code, what, stays_open):
    """An ERROR packet with `code`. gearmand keeps the connection open after
    these errors; beangate may close it after the ERROR (a client that sends
    such a packet is broken; closing is its intended, stricter behaviour), so
    on beangate both are accepted. The text is gearmand's; on beangate only
    the code is compared."""
    name, args, _ = c.recv()
    check_eq(name, "ERROR", "%s: reply" % what)
    check_eq(args[0], b(code), "%s: error code" % what)
    if not is_beangate():
        check_eq(args[1:], [b(stays_open)], "%s: error text" % what)
        c.send("ECHO_REQ", "alive")
        c.expect("ECHO_RES", ["alive"])
    else:
        c.s.settimeout(READ_TIMEOUT)
        try:
            c.send("ECHO_REQ", "alive")
            got = c.recv()
            check_eq(got[:2], ("ECHO_RES", [b"alive"]), "%s: after the ERROR" % what)
        except (Fail, OSError) as e:
            check(isinstance(e, OSError) or "closed" in str(e), "%s: %s" % (what, e))


@test
def test_malformed_packets(srv):
    def fresh():
        return srv.conn()

    c = fresh()
    c.raw(b"\0RES" + struct.pack(">II", 16, 2) + b"hi")
    error_then(c, "INVALID_MAGIC", "response magic in a request", "Request magic expected")
    for kind in ("JOB_CREATED", "NOOP"):
        c = fresh()
        c.raw(packet(kind, "H:x:1") if kind == "JOB_CREATED" else packet(kind))
        error_then(c, "INVALID_COMMAND", "%s sent as a request" % kind, "Command not expected")
    for what, data in (("bad magic", b"\0XYZ" + struct.pack(">II", 16, 2) + b"hi"),
                       ("unknown type 99", packet(99, "x")),
                       ("type 0", packet(0))):
        c = fresh()
        c.raw(data)
        if is_beangate():
            # gearmand closes without a word; beangate may send one ERROR first
            try:
                name, _, _ = c.recv()
                check_eq(name, "ERROR", "%s: reply before the close" % what)
            except Fail as e:
                check("closed" in str(e), "%s: %s" % (what, e))
        check(c.is_closed(), "%s: connection not closed" % what)
    # Too few arguments. gearmand answers nothing and waits for more bytes:
    # the next packet is read as the missing arguments and the connection is
    # closed (log: "realloc(char, count: 18446744073709551615...)"). beangate
    # may do better: an ERROR packet, or a close at once. Never a job.
    for what, data in (("SUBMIT_JOB with 1 arg", packet("SUBMIT_JOB", "f")),
                       ("SUBMIT_JOB with 2 args", packet("SUBMIT_JOB", "f", "u")),
                       ("WORK_COMPLETE with 1 arg", packet("WORK_COMPLETE", "H:x:1"))):
        c = fresh()
        c.raw(data)
        if is_beangate():
            try:
                name, args, _ = c.recv(READ_TIMEOUT)
                check_eq(name, "ERROR", "%s: reply" % what)
            except Fail as e:
                check("closed" in str(e), "%s: neither ERROR nor a close (%s)" % (what, e))
        else:
            c.expect_nothing(what)
            c.send("ECHO_REQ", "next")
            check(c.is_closed(), "%s + ECHO_REQ: connection not closed" % what)
    check("f" not in srv.status(), "no job from a short SUBMIT_JOB: %r" % srv.status())
    c = fresh()
    c.raw(packet("SUBMIT_JOB_BG", "f", "u" * 70, "x"))
    error_then(c, "ARGUMENT_TOO_LARGE", "unique of 70 bytes", "Unique value too large")
    # NULs inside the workload (last argument) are data. A 63-byte unique is
    # kept whole (gearmand mangles a 64-byte one: 63 bytes + an empty arg)
    c = fresh()
    h = c.submit("f", b"a\0b\0c", unique="u" * 63, kind="SUBMIT_JOB_BG")
    w = worker_gets(fresh(), "f", h, b"a", b"b", b"c", unique="u" * 63)


@test
def test_admin_text(srv):
    a = srv.conn()
    check_eq(normalise_status(a.text(b"status\n")), [], "status on an empty server")
    v = a.text(b"version\n")
    if is_beangate():
        check(re.match(rb"^OK \S+\n$", v), "version: %r" % v)   # beangate's own version
    else:
        check_eq(v, b"OK 1.1.20+ds\n", "version")
    check_eq(a.text(b"getpid\n"), b"OK %d\n" % srv.proc.pid, "getpid")
    check_eq(a.text(b"getpid\r\n"), b"OK %d\n" % srv.proc.pid, "getpid with \\r\\n")
    check_eq(a.text(b"bogus\n"), b"ERR UNKNOWN_COMMAND Unknown+server+commandbogus\r\n", "unknown command")
    check_eq(a.text(b"\n"), b"ERR UNKNOWN_COMMAND Unknown+server+command\r\n", "empty line")
    check_eq(a.text(b"maxqueue\n"),
             b"ERR INVALID_ARGUMENTS An+incomplete+set+of+arguments+was+sent+to+this+command+maxqueue\r\n",
             "maxqueue without arguments")
    check_eq(a.text(b"maxqueue reverse 10\n"), b"OK\r\n", "maxqueue reverse 10")
    check_eq(a.text(b"STATUS\r\n", multi=True), a.text(b"status\n"), "case-insensitive, \\r\\n")
    # pipelining, and a command split over two segments
    a.raw(b"getpid\ngetpid\n")
    check_eq(a.text(b"", multi=False) + a.text(b"", multi=False), b"OK %d\n" % srv.proc.pid * 2, "pipelined")
    a.raw(b"get")
    time.sleep(0.1)  # the point: the two halves of the line come in two reads
    check_eq(a.text(b"pid\n"), b"OK %d\n" % srv.proc.pid, "split command")
    # binary and text on one connection
    a.send("ECHO_REQ", "x")
    a.expect("ECHO_RES", ["x"])
    w = srv.conn()
    w.send("CAN_DO", "reverse")
    w.send("CAN_DO", "other")
    c = srv.conn()
    h = c.submit("reverse", "x", kind="SUBMIT_JOB_BG")
    # CAN_DO has no reply: gearmand (threaded) may answer status before w's
    # CAN_DOs are in, so poll for them
    wait_until(lambda: normalise_status(a.text(b"status\n")) == ["other\t0\t0\t1", "reverse\t1\t0\t1"],
               "status: the job and w's two functions")
    w.send("GRAB_JOB")
    w.expect("JOB_ASSIGN", [h, "reverse", "x"])
    check_eq(normalise_status(a.text(b"status\n")), ["other\t0\t0\t1", "reverse\t1\t1\t1"],
             "status while running")
    w.close()
    wait_until(lambda: normalise_status(a.text(b"status\n")) == ["other\t0\t0\t0", "reverse\t1\t0\t0"],
               "functions stay in status after the worker left")
    wl = normalise_workers(a.text(b"workers\n"))
    check_eq(wl, ["FD 127.0.0.1 - :", "FD 127.0.0.1 - :"], "workers: the admin and the client connection")


# ================================================================== c. differential

def admin_scenario(srv):
    """Drive the same scenario; return the normalised admin outputs."""
    out = {}
    conns = []
    wa = srv.conn()
    wa.send("SET_CLIENT_ID", "worker-a")
    wa.send("CAN_DO", "reverse")
    wa.send("CAN_DO", "upper")
    wa.send("CAN_DO_TIMEOUT", "slow", 60)
    wb = srv.conn()
    wb.send("CAN_DO", "reverse")
    # gearmand reads each connection on its own: an admin `status` on
    # another one may come first unless the workers' packets were answered
    for w in (wa, wb):
        w.send("ECHO_REQ", "registered")
        w.expect("ECHO_RES", ["registered"])
    c = srv.conn()
    c.submit("reverse", "1", kind="SUBMIT_JOB_BG")
    c.submit("reverse", "2", kind="SUBMIT_JOB_HIGH_BG")
    c.submit("nobody", "3", kind="SUBMIT_JOB_LOW_BG")
    c.submit("reverse", "4", unique="u1")
    c.submit("reverse", "5", unique="u1")            # coalesced
    a = srv.conn()
    conns += [wa, wb, c, a]
    out["status 1"] = normalise_status(a.text(b"status\n"))
    out["workers 1"] = normalise_workers(a.text(b"workers\n"))
    wb.send("GRAB_JOB")
    h = wb.expect("JOB_ASSIGN")[0]
    out["status 2 (running)"] = normalise_status(a.text(b"status\n"))
    wb.send("WORK_COMPLETE", h, "")
    wb.send("GRAB_JOB")
    h = wb.expect("JOB_ASSIGN")[0]
    wb.close()
    conns.remove(wb)
    wait_until(lambda: normalise_status(a.text(b"status\n")) != out["status 2 (running)"] and
               "reverse\t2\t0\t1" in normalise_status(a.text(b"status\n")), "worker b gone")
    out["status 3 (worker gone)"] = normalise_status(a.text(b"status\n"))
    out["workers 3"] = normalise_workers(a.text(b"workers\n"))
    wa.send("RESET_ABILITIES")
    wa.send("ECHO_REQ", "sync")
    wa.expect("ECHO_RES")
    out["status 4 (reset)"] = normalise_status(a.text(b"status\n"))
    out["workers 4"] = normalise_workers(a.text(b"workers\n"))
    for x in conns:
        x.close()
    return out


@test
def test_differential_admin(srv):
    ref = new_server(Gearmand)
    want = admin_scenario(ref)
    got = admin_scenario(srv)
    for k in want:
        check_eq(got[k], want[k], "%s (%s vs gearmand)" % (k, srv.kind))
    # the reference itself, as a fixed point
    check_eq(want["status 1"], ["nobody\t1\t0\t0", "reverse\t3\t0\t2", "slow\t0\t0\t1", "upper\t0\t0\t1"],
             "gearmand status 1")
    check_eq(want["workers 3"], ["FD 127.0.0.1 - :", "FD 127.0.0.1 - :",
                                 "FD 127.0.0.1 worker-a : reverse slow upper"], "gearmand workers 3")


# ================================================================== d. cross-protocol (beangate)

def bs_reserve(srv, tube):
    bs = Beanstalk(srv.bport)
    bs.cmd("watch %s" % tube)
    bs.cmd("ignore default")
    reply, body = bs.cmd("reserve-with-timeout 3")
    check(reply.startswith(b"RESERVED "), "reserve: %r" % reply)
    return bs, int(reply.split()[1]), body


@test
@beangate_only
def test_cross_gearman_bg_to_beanstalk(srv):
    c = srv.conn()
    for kind, pri in (("SUBMIT_JOB_HIGH_BG", 512), ("SUBMIT_JOB_BG", 1024), ("SUBMIT_JOB_LOW_BG", 2048)):
        h = c.submit("reverse", b"body \0 %d" % pri, kind=kind)
        jid = check_handle(h, srv)
        bs, rid, body = bs_reserve(srv, "reverse")
        check_eq((rid, body), (jid, b"body \0 %d" % pri), "reserved over beanstalk")
        _, st = bs.stats_job(jid)
        check_eq((st["pri"], st["ttr"], st["tube"]), (str(pri), "86400", "reverse"), "stats-job of %s" % kind)
        check_eq(bs.cmd("delete %d" % jid)[0], b"DELETED", "delete")
        bs.close()
        c.send("GET_STATUS", h)
        c.expect("STATUS_RES", [h, 0, 0, 0, 0])
    check_eq(srv.status().get("reverse", (0, 0, 0))[:2], (0, 0), "status after the deletes")
    # the tool, too
    r = srv.tool(["-I", "-b", "-f", "reverse", "tooljob"])
    check_eq(r.returncode, 0, "gearman -b")
    bs, rid, body = bs_reserve(srv, "reverse")
    check_eq(body, b"tooljob", "body of the tool's job")
    check_eq(bs.stats_job(rid)[1]["pri"], "512", "-I is priority 512")
    bs.cmd("delete %d" % rid)


@test
@beangate_only
def test_cross_beanstalk_put_to_gearman_worker(srv):
    bs = Beanstalk(srv.bport)
    jid = bs.put("reverse", "hello", 100)
    w = srv.conn()
    w.send("CAN_DO", "reverse")
    w.send("GRAB_JOB")
    args = w.expect("JOB_ASSIGN")
    check_eq(args[1:], [b"reverse", b"hello"], "JOB_ASSIGN of a beanstalk job")
    check_eq(handle_number(args[0]), jid, "handle names the beanstalk id")
    check_eq(bs.stats_job(jid)[1]["state"], "reserved", "reserved while the worker has it")
    w.send("WORK_COMPLETE", args[0], "olleh")
    wait_until(lambda: bs.stats_job(jid)[0] == b"NOT_FOUND", "job deleted after WORK_COMPLETE")
    # the gearman tool as the worker
    reply, _ = bs.cmd("put 100 0 60 5", "tools")
    jid = int(reply.split()[1])
    out = os.path.join(srv.tmp, "out")
    wk = tool_worker(srv, ["-c", "1", "-f", "reverse", "--", "sh", "-c", 'cat > "$0"', out])
    check_eq(wk.wait(TOOL_TIMEOUT), 0, "gearman -w -c 1")
    check_eq(open(out, "rb").read(), b"tools", "the tool got the beanstalk body")
    wait_until(lambda: bs.stats_job(jid)[0] == b"NOT_FOUND", "job deleted by the tool's WORK_COMPLETE")
    bs.close()


@test
@beangate_only
def test_cross_http_to_gearman_worker(srv):
    st, body = http_req(srv.hport, "POST", "/tubes/reverse/jobs", b"via http")
    check_eq(st, 201, "POST /tubes/reverse/jobs (%r)" % body)
    jid = json.loads(body)["id"]
    st, body = http_req(srv.hport, "GET", "/stats")
    check_eq(json.loads(body)["current_jobs_ready"], 1, "GET /stats ready")
    wk = tool_worker(srv, ["-c", "1", "-f", "reverse", "--", "rev"])
    check_eq(wk.wait(TOOL_TIMEOUT), 0, "gearman -w -c 1")
    st, body = http_req(srv.hport, "GET", "/stats")
    d = json.loads(body)
    check_eq((d["current_jobs_ready"], d["current_jobs_reserved"]), (0, 0), "GET /stats after the worker")
    st, _ = http_req(srv.hport, "GET", "/jobs/%d" % jid)
    check_eq(st, 404, "GET /jobs/%d after completion" % jid)


@test
@beangate_only
def test_cross_function_name_encoding(srv):
    c = srv.conn()
    h = c.submit("a b$", "x", kind="SUBMIT_JOB_BG")
    jid = check_handle(h, srv)
    bs = Beanstalk(srv.bport)
    _, st = bs.stats_job(jid)
    check(st is not None, "stats-job %d" % jid)
    check_eq(st["tube"].lower(), "a$20b$24", "tube of function 'a b$'")
    h = c.submit("-lead", "x", kind="SUBMIT_JOB_BG")
    check_eq(bs.stats_job(handle_number(h))[1]["tube"].lower(), "$2dlead", "tube of function '-lead'")
    bs.close()


@test
@beangate_only
def test_cross_fg_ttr(srv):
    c = srv.conn()
    h = c.submit("reverse", "x")
    bs = Beanstalk(srv.bport)
    _, st = bs.stats_job(handle_number(h))
    check_eq((st["pri"], st["ttr"]), ("1024", "86400"), "foreground job over beanstalk")
    bs.close()


# ================================================================== e. beangate's own behaviour

LIMITS = "beangate's own limits and options (-z, -b, tube names), beangate only"
FRONTEND = "front-end scenario, beangate only"
SHUTDOWN = "admin shutdown with --gearman-admin-shutdown (gearmand 1.1.20 has no shutdown), beangate only"


def bs_stats_http(srv):
    """(beanstalk `stats` dict, GET /stats JSON), taken back to back on a
    new beanstalk connection that stays open for both."""
    bs = Beanstalk(srv.bport)
    try:
        _, st = bs.stats()
        code, body = http_req(srv.hport, "GET", "/stats")
    finally:
        bs.close()
    check_eq(code, 200, "GET /stats")
    return st, json.loads(body)


def http_stats(srv):
    code, body = http_req(srv.hport, "GET", "/stats")
    check_eq(code, 200, "GET /stats")
    return json.loads(body)


@test
@beangate_only
def test_can_do_timeout_is_ttr(srv):
    c = srv.conn()
    h = c.submit("f", "t1", kind="SUBMIT_JOB_BG")
    h2 = c.submit("f", "t2", kind="SUBMIT_JOB_BG")
    w = srv.conn()
    w.send("CAN_DO_TIMEOUT", "f", 5)
    w.send("GRAB_JOB")
    w.expect("JOB_ASSIGN", [h, "f", "t1"])
    bs = Beanstalk(srv.bport)
    _, st = bs.stats_job(handle_number(h))
    check_eq((st["state"], st["ttr"], st["tube"]), ("reserved", "5", "f"), "stats-job after CAN_DO_TIMEOUT f 5")
    check(0 <= int(st["time-left"]) <= 5, "time-left %r within the TTR of 5" % st["time-left"])
    # a worker with a plain CAN_DO keeps the submit TTR
    w2 = worker_gets(srv.conn(), "f", h2, "t2")
    _, st = bs.stats_job(handle_number(h2))
    check_eq((st["state"], st["ttr"]), ("reserved", "86400"), "stats-job after a plain CAN_DO")
    bs.close()


@test
@beangate_only
def test_submit_job_epoch_is_delay(srv):
    c = srv.conn()
    bs = Beanstalk(srv.bport)
    now = int(time.time())
    c.send("SUBMIT_JOB_EPOCH", "ep", "", now + 100, "later")
    hl = c.expect("JOB_CREATED")[0]
    _, st = bs.stats_job(handle_number(hl))
    check_eq((st["state"], st["tube"], st["pri"]), ("delayed", "ep", "1024"), "stats-job of a future epoch")
    check(98 <= int(st["delay"]) <= 102, "delay %r is about 100" % st["delay"])
    check(97 <= int(st["time-left"]) <= 101, "time-left %r is about 100" % st["time-left"])
    c.send("SUBMIT_JOB_EPOCH", "ep", "", now - 100, "past")
    hp = c.expect("JOB_CREATED")[0]
    _, st = bs.stats_job(handle_number(hp))
    check_eq((st["state"], st["delay"]), ("ready", "0"), "stats-job of a past epoch")
    # a background job: the submitter hears nothing; a worker gets only the ready one
    c.expect_nothing("SUBMIT_JOB_EPOCH is a background job")
    w = worker_gets(srv.conn(), "ep", hp, "past")
    w.send("WORK_COMPLETE", hp, "")
    w.send("GRAB_JOB")
    w.expect("NO_JOB", [])
    c.send("GET_STATUS", hl)
    c.expect("STATUS_RES", [hl, 1, 0, 0, 0])
    bs.close()


@test
@beangate_only(why="stops the server process (SIGSTOP), beangate only")
def test_sleeping_worker_closes_after_a_deadline_passed(srv):
    """A sleeping worker that also waits for a foreground job hangs up
    while the server is stopped across the time a delayed job of its
    function comes due: on resume the hang-up is read before the timer
    runs, so freeing the connection catches up with that deadline (the job
    becomes ready and wakes the sleepers, the closing one among them). The
    server must not keep the freed connection anywhere (ASan would report
    a use after free) and the job must reach another worker."""
    w = srv.conn()
    w.send("CAN_DO", "due")
    w.submit("other", "foreground, w listens")
    c = srv.conn()
    due_at = int(time.time()) + 2
    c.send("SUBMIT_JOB_EPOCH", "due", "", due_at, "wakes sleepers")
    h = c.expect("JOB_CREATED")[0]
    w.send("PRE_SLEEP")
    w.expect_nothing("no job for `due` yet")
    os.kill(srv.proc.pid, signal.SIGSTOP)
    try:
        w.close()
        # the delay is whole seconds from the server's time(NULL), so the
        # job is due by due_at + 1 at the latest; the condition is the clock
        while time.time() < due_at + 1.3:
            time.sleep(0.05)  # the point: the clock passes while the server is stopped
    finally:
        os.kill(srv.proc.pid, signal.SIGCONT)
    w2 = worker_gets(srv.conn(), "due", h, "wakes sleepers")
    w2.send("WORK_COMPLETE", h, "")
    c.send("ECHO_REQ", "alive")
    c.expect("ECHO_RES", ["alive"])


@test
@beangate_only
def test_maxqueue_limits_the_tube(srv):
    a = srv.conn()
    check_eq(a.text(b"maxqueue f 2\n"), b"OK\r\n", "maxqueue f 2")
    c = srv.conn()
    h1 = c.submit("f", "1", kind="SUBMIT_JOB_BG")
    c.submit("f", "2", kind="SUBMIT_JOB_BG")
    c.send("SUBMIT_JOB_BG", "f", "", "3")
    args = c.expect("ERROR")
    check_eq(args[0], b"QUEUE_ERROR", "third submit over maxqueue 2 (%r)" % args)
    c.send("SUBMIT_JOB", "f", "", "fg")
    check_eq(c.expect("ERROR")[0], b"QUEUE_ERROR", "a foreground submit over the limit")
    c.send("ECHO_REQ", "open")
    c.expect("ECHO_RES", ["open"])
    bs = Beanstalk(srv.bport)
    _, st = bs.stats("stats-tube f")
    check_eq((st["current-jobs-ready"], st["total-jobs"]), ("2", "2"), "stats-tube f")
    check_eq(srv.status().get("f"), (2, 0, 0), "status f")
    # room again once one is gone
    check_eq(bs.cmd("delete %d" % handle_number(h1))[0], b"DELETED", "delete over beanstalk")
    c.submit("f", "4", kind="SUBMIT_JOB_BG")
    _, st = bs.stats("stats-tube f")
    check_eq(st["current-jobs-ready"], "2", "stats-tube f after a delete and a submit")
    bs.close()


@test
@beangate_only
def test_admin_cancel_job(srv):
    c = srv.conn()
    h = c.submit("f", "doomed")
    a = srv.conn()
    check_eq(a.text(b"cancel job " + h + b"\n"), b"OK\r\n", "cancel job %r" % h)
    c.expect("WORK_FAIL", [h])
    bs = Beanstalk(srv.bport)
    check_eq(bs.stats_job(handle_number(h))[0], b"NOT_FOUND", "stats-job of the cancelled job")
    unknown = b"H:%s:987654" % socket.gethostname().encode()
    check_eq(a.text(b"cancel job " + unknown + b"\n"), b"ERR UNKNOWN_JOB\r\n", "cancel of an unknown handle")
    check_eq(a.text(b"cancel job " + h + b"\n"), b"ERR UNKNOWN_JOB\r\n", "cancel of the cancelled job")
    check_eq(srv.status().get("f"), (0, 0, 0), "status after the cancel")
    c.expect_nothing("one WORK_FAIL only")
    bs.close()


# The server exits with status 0 within 5 s of `after` (a shutdown).
def expect_clean_exit(srv, after):
    try:
        status = srv.proc.wait(5)
    except subprocess.TimeoutExpired:
        raise Fail("still running 5 s after %s" % after)
    srv.expect_exit = True
    check_eq(status, 0, "exit status after %s" % after)


@test
def test_admin_shutdown_is_unknown_by_default(srv):
    """The Gearman port has no authentication: without
    --gearman-admin-shutdown every form of `shutdown` is an unknown command,
    byte for byte as gearmand 1.1.20 answers it, and nothing stops or
    drains (the same test passes against gearmand)."""
    a = srv.conn()
    for line, word in ((b"shutdown\n", b"shutdown"), (b"shutdown graceful\n", b"shutdown"),
                       (b"SHUTDOWN\r\n", b"SHUTDOWN"), (b"Shutdown Graceful\r\n", b"Shutdown"),
                       (b"shutdown graceful now\n", b"shutdown"), (b"shutdown foo\n", b"shutdown")):
        check_eq(a.text(line), b"ERR UNKNOWN_COMMAND Unknown+server+command" + word + b"\r\n",
                 "admin %r without --gearman-admin-shutdown" % line)
    check_eq(a.text(b"getpid\n"), b"OK %d\n" % srv.proc.pid, "the admin connection after the shutdowns")
    a.expect_nothing("after the refused shutdowns")
    check_eq(srv.proc.poll(), None, "the server still runs")
    # not draining either (`shutdown graceful` would refuse new jobs): a
    # submit on a new connection is taken, and a worker gets it
    c = srv.conn()
    h = c.submit("f", "after", kind="SUBMIT_JOB_BG")
    w = worker_gets(srv.conn(), "f", h, "after")
    check_eq(srv.proc.poll(), None, "the server still runs after a job")


@test
@beangate_only(why=SHUTDOWN)
def test_admin_shutdown(srv):
    usage = subprocess.run([srv.binary, "--help"], capture_output=True, timeout=10).stdout
    for word in (b"--gearman-admin-shutdown", b"BEANGATE_GEARMAN_ADMIN_SHUTDOWN=1"):
        check(word in usage, "--help does not mention %r" % word)
    srv = new_server(extra=["--gearman-admin-shutdown"])
    a = srv.conn()
    check_eq(a.text(b"shutdown\n"), b"OK\n", "admin shutdown")
    expect_clean_exit(srv, "the admin shutdown")


@test
@beangate_only(why=SHUTDOWN)
def test_admin_shutdown_graceful(srv):
    # switched on by the environment this time
    srv = new_server(env={"BEANGATE_GEARMAN_ADMIN_SHUTDOWN": "1"})
    # a worker holds a job: the server waits for it, refuses new jobs meanwhile
    c = srv.conn()
    h = c.submit("f", "last")
    w = worker_gets(srv.conn(), "f", h, "last")
    a = srv.conn()
    check_eq(a.text(b"shutdown graceful\n"), b"OK\n", "admin shutdown graceful")
    c.send("SUBMIT_JOB_BG", "f", "", "late")
    name, args, _ = c.recv()
    check_eq((name, args[:1]), ("ERROR", [b"DRAINING"]), "a submit while shutting down gracefully")
    time.sleep(0.5)  # the point: a quiet half second in which the server must not stop
    check_eq(srv.proc.poll(), None, "still running while a worker holds a job")
    w.send("WORK_COMPLETE", h, "done")
    c.expect("WORK_COMPLETE", [h, "done"])
    expect_clean_exit(srv, "the last job of a graceful shutdown was completed")


@test
@beangate_only(why=FRONTEND)
def test_get_status_unique_running(srv):
    c = srv.conn()
    h = c.submit("f", "work", unique="u6")
    o = srv.conn()
    o.send("GET_STATUS_UNIQUE", "u6")
    o.expect("STATUS_RES_UNIQUE", ["u6", 1, 0, 0, 0, 1])
    w = worker_gets(srv.conn(), "f", h, "work", unique="u6")
    w.send("WORK_STATUS", h, 1, 4)
    c.expect("WORK_STATUS", [h, 1, 4])
    o.send("GET_STATUS_UNIQUE", "u6")
    _, _, raw = o.recv()
    body = b"u6\x001\x001\x001\x004\x001"
    check_eq(raw, b"\0RES" + struct.pack(">II", 42, len(body)) + body, "STATUS_RES_UNIQUE bytes")
    o.send("GET_STATUS_UNIQUE", "nope")
    o.expect("STATUS_RES_UNIQUE", ["nope", 0, 0, 0, 0, 0])
    w.send("WORK_COMPLETE", h, "done")
    c.expect("WORK_COMPLETE", [h, "done"])
    o.send("GET_STATUS_UNIQUE", "u6")
    o.expect("STATUS_RES_UNIQUE", ["u6", 0, 0, 0, 0, 0])


@test
@beangate_only(why=FRONTEND)
def test_can_do_while_asleep_wakes(srv):
    w = srv.conn()
    w.send("CAN_DO", "a")
    w.send("GRAB_JOB")
    w.expect("NO_JOB", [])
    w.send("PRE_SLEEP")
    w.expect_nothing("asleep with nothing for a")
    w.send("CAN_DO", "b")
    w.expect_nothing("CAN_DO b while asleep, nothing for b yet")
    c = srv.conn()
    h = c.submit("b", "for-b", kind="SUBMIT_JOB_BG")
    w.expect("NOOP", [])
    w.send("GRAB_JOB")
    w.expect("JOB_ASSIGN", [h, "b", "for-b"])
    w.send("WORK_COMPLETE", h, "")
    w.send("GRAB_JOB")
    w.expect("NO_JOB", [])


@test
@beangate_only
def test_cross_beanstalk_delete_fails_fg_client(srv):
    c = srv.conn()
    h = c.submit("f", "taken elsewhere")
    bs, rid, body = bs_reserve(srv, "f")
    check_eq((rid, body), (handle_number(h), b"taken elsewhere"), "beanstalk reserved the fg job")
    t0 = time.monotonic()
    check_eq(bs.cmd("delete %d" % rid)[0], b"DELETED", "delete over beanstalk")
    c.expect("WORK_FAIL", [h], timeout=2.0)
    check(time.monotonic() - t0 <= 2.0, "WORK_FAIL within 2 s")
    c.expect_nothing("only one WORK_FAIL")
    c.send("GET_STATUS", h)
    c.expect("STATUS_RES", [h, 0, 0, 0, 0])
    bs.close()


@test
@beangate_only
def test_cross_stats_count_gearman(srv):
    bs = Beanstalk(srv.bport)
    wait_until(lambda: bs.stats()[1]["current-connections"] == "1", "only the beanstalk connection")
    st0 = bs.stats()[1]
    w = srv.conn()
    w.send("CAN_DO", "f9")
    w.send("PRE_SLEEP")
    c = srv.conn()
    c.send("ECHO_REQ", "sync")
    c.expect("ECHO_RES", ["sync"])
    wait_until(lambda: bs.stats()[1]["current-waiting"] == "1", "the sleeping worker waits")
    st = bs.stats()[1]
    check_eq((st["current-connections"], st["current-workers"], st["current-waiting"]), ("3", "1", "1"),
             "stats with a sleeping gearman worker and a client (+ this beanstalk connection)")
    check(int(st["total-connections"]) >= int(st0["total-connections"]) + 2, "total-connections grew")
    for i in range(3):
        c.submit("other9", "bg%d" % i, kind="SUBMIT_JOB_BG")
    c.submit("other9", "fg", kind="SUBMIT_JOB_LOW")
    st = bs.stats()[1]
    check_eq(int(st["total-jobs"]), int(st0["total-jobs"]) + 4, "total-jobs after 4 gearman submits")
    check_eq(int(st["current-jobs-ready"]), int(st0["current-jobs-ready"]) + 4, "current-jobs-ready")
    bs.close()
    st, js = bs_stats_http(srv)
    for k in ("current-connections", "current-workers", "current-waiting", "total-jobs", "current-jobs-ready",
              "current-jobs-urgent", "total-connections"):
        check_eq(js[k.replace("-", "_")], int(st[k]), "GET /stats %s vs beanstalk stats" % k)
    check_eq((js["current_workers"], js["current_waiting"]), (1, 1), "GET /stats workers, waiting")
    c.close()
    wait_until(lambda: http_stats(srv)["current_connections"] == 1,
               "GET /stats current_connections 1 once the gearman client left (the worker stays)")
    w.close()
    wait_until(lambda: http_stats(srv)["current_connections"] == 0, "current_connections 0 once all left")
    check_eq((http_stats(srv)["current_workers"], http_stats(srv)["current_waiting"]), (0, 0),
             "GET /stats workers, waiting once the worker left")


@test
@beangate_only(why=LIMITS)
def test_function_name_too_long(srv):
    c = srv.conn()
    c.send("SUBMIT_JOB_BG", " " * 150, "", "x")          # 450 bytes once encoded
    check_eq(c.expect("ERROR")[0], b"INVALID_FUNCTION_NAME", "150 spaces as a function")
    c.send("ECHO_REQ", "after submit")
    c.expect("ECHO_RES", ["after submit"])
    c.send("CAN_DO", " " * 150)
    check_eq(c.expect("ERROR")[0], b"INVALID_FUNCTION_NAME", "CAN_DO of 150 spaces")
    c.send("ECHO_REQ", "after can_do")
    c.expect("ECHO_RES", ["after can_do"])
    c.send("SUBMIT_JOB_BG", "a" * 201, "", "x")
    check_eq(c.expect("ERROR")[0], b"INVALID_FUNCTION_NAME", "201-byte function name")
    # exactly 200 bytes, plain and encoded, are tubes
    bs = Beanstalk(srv.bport)
    for fn, tube in (("a" * 200, "a" * 200), (" " * 66 + "ab", "$20" * 66 + "ab")):
        h = c.submit(fn, "x", kind="SUBMIT_JOB_BG")
        check_eq(bs.stats_job(handle_number(h))[1]["tube"], tube, "tube of a %d-byte function" % len(fn))
    check_eq(sorted(k for k in srv.status()), sorted([" " * 66 + "ab", "a" * 200]),
             "status: only the accepted functions")
    bs.close()


@test
@beangate_only(why=LIMITS)
def test_max_job_size(srv):
    srv = new_server(extra=["-z", "1000"])
    c = srv.conn()
    h = c.submit("f", b"x" * 1000, kind="SUBMIT_JOB_BG")
    c.send("SUBMIT_JOB_BG", "f", "", b"y" * 1001)
    args = c.expect("ERROR")
    check_eq(args[0], b"JOB_TOO_BIG", "a workload of -z + 1 bytes (%r)" % args)
    c.send("SUBMIT_JOB", "f", "", b"y" * 1001)
    check_eq(c.expect("ERROR")[0], b"JOB_TOO_BIG", "foreground, -z + 1 bytes")
    c.send("ECHO_REQ", "open")
    c.expect("ECHO_RES", ["open"])
    check_eq(srv.status().get("f"), (1, 0, 0), "one job in f")
    bs, rid, body = bs_reserve(srv, "f")
    check_eq((rid, body), (handle_number(h), b"x" * 1000), "the -z byte job over beanstalk")
    bs.close()
    # a size field far over the limit: refused from the header alone
    c2 = srv.conn()
    c2.raw(b"\0REQ" + struct.pack(">II", T["SUBMIT_JOB_BG"], 0x7fff0000) + b"f\0\0")
    args = c2.expect("ERROR")
    check_eq(args[0], b"ARGUMENT_TOO_LARGE", "size field 0x7fff0000 (%r)" % args)
    check(c2.is_closed(), "connection closed after a huge size field")


@test
@beangate_only(why=LIMITS)
def test_durable_job_survives_kill9(srv):
    srv = new_server(extra=wal_args)
    c = srv.conn()
    h = c.submit("dur", b"persist\0me", kind="SUBMIT_JOB_HIGH_BG")
    jid = handle_number(h)
    c.close()
    srv.restart_after_kill9()
    bs = Beanstalk(srv.bport)
    _, st = bs.stats_job(jid)
    check(st is not None, "stats-job %d after kill -9 and restart" % jid)
    check_eq((st["state"], st["tube"], st["pri"], st["ttr"]), ("ready", "dur", "512", "86400"),
             "stats-job after the restart")
    c = srv.conn()
    c.send("GET_STATUS", h)
    c.expect("STATUS_RES", [h, 1, 0, 0, 0])
    bs.close()
    bs, rid, body = bs_reserve(srv, "dur")
    check_eq((rid, body), (jid, b"persist\0me"), "reserve after the restart")
    bs.close()


def wal_args(s):
    return ["-b", os.path.join(s.tmp, "wal"), "-f", "0"]


@test
@beangate_only(why=LIMITS)
def test_durable_status_after_restart(srv):
    """A recovered Gearman job's function is in `status` (gearmand with a
    persistent queue lists a function once its jobs are replayed), and a
    worker that registers after the restart gets the job."""
    srv = new_server(extra=wal_args)
    c = srv.conn()
    h = c.submit("dur", "again", kind="SUBMIT_JOB_BG")
    check_eq(srv.status().get("dur"), (1, 0, 0), "status before the restart")
    c.close()
    srv.restart_after_kill9()
    c = srv.conn()
    c.send("GET_STATUS", h)
    c.expect("STATUS_RES", [h, 1, 0, 0, 0])
    check_eq(srv.status().get("dur"), (1, 0, 0), "status after the restart (GET_STATUS knows the job)")
    w = worker_gets(srv.conn(), "dur", h, "again")


@test
@beangate_only(why=LIMITS)
def test_assign_waits_for_the_put_on_disk(srv):
    """Issue 21: with -f 0 on a slow disk (BEANGATE_TEST_DISK_FAULTS: every
    sync waits 1.5 s), JOB_CREATED and a worker's JOB_ASSIGN of that job
    come only after the put is synced: its handle never reaches anyone
    before the job is kept."""
    delay = 1.5
    faults = testlib.DiskFaults(os.path.join(srv.tmp, "faults"))
    srv = new_server(extra=wal_args, env=faults.env())
    faults.set(["sync delay %dms" % int(delay * 1000)])
    w = srv.conn()
    w.send("CAN_DO", "slow")
    c = srv.conn()
    t0 = time.monotonic()
    c.send("SUBMIT_JOB_BG", "slow", "", "kept first")
    wait_until(lambda: srv.status().get("slow", (0, 0, 0))[0] == 1, "the job made")
    w.send("GRAB_JOB")
    w.expect("JOB_ASSIGN", timeout=10.0)
    assigned = time.monotonic() - t0
    c.expect("JOB_CREATED", timeout=10.0)
    check(assigned >= delay * 0.75, "JOB_ASSIGN came %.2f s after the submit, before its %.1f s sync ended"
          % (assigned, delay))
    faults.clear()


@test
@beangate_only(why=FRONTEND)
def test_slow_reader_backpressure(srv):
    n, size = 2000, 65536
    payload = [struct.pack(">I", i) * (size // 4) for i in range(n)]
    slow = srv.conn()
    sender = slow.s.dup()                 # its own timeout; both non-blocking
    sender.settimeout(60)
    state = {"sent": 0, "error": None}

    def send_all():
        try:
            for p in payload:
                sender.sendall(packet("ECHO_REQ", p))
                state["sent"] += 1
        except OSError as e:
            state["error"] = e

    rss0 = testlib.rss_kib(srv.proc.pid)
    t = threading.Thread(target=send_all, daemon=True)
    t.start()
    # wait until the sender is stuck (the server stopped reading it)
    last, since = -1, time.monotonic()
    while time.monotonic() - since < 0.5:
        check(time.monotonic() - since < 20, "sender never stalled")
        if state["sent"] != last:
            last, since = state["sent"], time.monotonic()
        time.sleep(0.05)  # the condition is no progress for 0.5 s: look every 50 ms
    check(state["sent"] < n, "the server took all %d packets without being read (sent %d)" % (n, state["sent"]))
    grown = testlib.rss_kib(srv.proc.pid) - rss0
    check(grown < 64 * 1024, "server RSS grew by %d KiB for an unread client (sent %d packets)"
          % (grown, state["sent"]))
    t0 = time.monotonic()
    out = srv.admin(b"status\n")
    check(time.monotonic() - t0 < 1.0, "admin status took %.2f s beside a slow reader" % (time.monotonic() - t0))
    check(out.endswith(b".\n"), "admin status reply %r" % out)
    got = 0
    for i in range(n):
        _, _, raw = slow.recv(timeout=10)
        if raw != b"\0RES" + struct.pack(">II", T["ECHO_RES"], size) + payload[i]:
            raise Fail("ECHO_RES %d of %d: %d bytes, head %r" % (i, n, len(raw), raw[:20]))
        got += len(raw)
    t.join(10)
    check(not t.is_alive() and state["error"] is None, "sender: %r (sent %d)" % (state["error"], state["sent"]))
    check_eq(got, n * (12 + size), "bytes echoed")
    slow.expect_nothing("after the %d echoes" % n)
    sender.close()


@test
@beangate_only
def test_cross_beanstalk_urgent_before_gearman_high(srv):
    c = srv.conn()
    hh = c.submit("f", "gearman-high", kind="SUBMIT_JOB_HIGH_BG")
    bs = Beanstalk(srv.bport)
    jid = bs.put("f", "beanstalk", 0)
    w = srv.conn()
    w.send("CAN_DO", "f")
    w.send("GRAB_JOB")
    args = w.expect("JOB_ASSIGN")
    check_eq((handle_number(args[0]), args[1:]), (jid, [b"f", b"beanstalk"]), "first job: the pri 0 put")
    w.send("WORK_COMPLETE", args[0], "")
    w.send("GRAB_JOB")
    w.expect("JOB_ASSIGN", [hh, "f", "gearman-high"])
    bs.close()


@test
@beangate_only(why=FRONTEND)
def test_tool_many_background_jobs(srv):
    n = 200
    r = srv.tool(["-b", "-f", "reverse"] + ["a%d" % i for i in range(1, n + 1)])
    check_eq((r.returncode, r.stdout), (0, b""), "gearman -b with %d jobs (stderr %r)" % (n, r.stderr))
    check_eq(srv.status().get("reverse"), (n, 0, 0), "status after %d bg submits" % n)
    wk = tool_worker(srv, ["-c", str(n), "-f", "reverse", "--", "cat"])
    check_eq(wk.wait(TOOL_TIMEOUT * 3), 0, "gearman -w -c %d exit status" % n)
    wait_until(lambda: normalise_status(srv.gearadmin("--status").stdout) == ["reverse\t0\t0\t0"],
               "gearadmin --status: reverse 0 0 0")
    r = srv.gearadmin("--status")
    check_eq((r.returncode, normalise_status(r.stdout)), (0, ["reverse\t0\t0\t0"]), "gearadmin --status")
    # the empty tube is gone (nobody watches it); the server's totals tell
    bs = Beanstalk(srv.bport)
    _, st = bs.stats()
    check_eq((st["total-jobs"], st["current-jobs-ready"], st["current-jobs-reserved"], st["current-jobs-buried"]),
             (str(n), "0", "0", "0"), "beanstalk stats after the worker")
    bs.close()


@test
@beangate_only(why="a deliberate difference from gearmand (docs/gearman.md): beangate only")
def test_http_lines_close_the_connection(srv):
    """A browser's request sent to the Gearman port (a form or no-cors fetch)
    starts with an HTTP request line and a Host header; its body would run
    as admin lines (`cancel job H:...`). gearmand answers ERR for each line
    and runs the body (a browser's request is refused there only because
    its User-Agent line has too many words); beangate closes at the request
    line or a Host line, running nothing, and counts it."""
    bs = Beanstalk(srv.bport)
    jid = bs.put("f", "keep me", 0)
    bs.close()
    handle = "H:%s:%d" % (socket.gethostname(), jid)
    body = "cancel job %s\nversion\n" % handle
    attacks = ["POST / HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Length: %d\r\n\r\n%s" % (srv.port, len(body), body),
               "GET / HTTP/1.0\n" + body, "Host: x\r\n" + body]
    for i, attack in enumerate(attacks):
        g = Gear(srv.port)
        g.raw(attack.encode())
        deadline = time.monotonic() + 5
        got = b""
        while True:
            check(time.monotonic() < deadline, "attack %d: the connection stayed open; got %r" % (i, got))
            g.s.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                d = g.s.recv(65536)
            except socket.timeout:
                continue
            except ConnectionResetError:
                break
            if not d:
                break
            got += d
        g.close()
        check_eq(got, b"", "replies to attack %d" % i)
    check_eq(srv.status().get("f"), (1, 0, 0), "the job a page tried to cancel")
    check_eq(srv.admin(b"version\n")[:3], b"OK ", "admin lines of another connection")
    status, body = http_req(srv.hport, "GET", "/stats")
    check_eq((status, json.loads(body)["cross_protocol_closed"]), (200, len(attacks)), "the count in /stats")


# ------------------------------------------------------------------ main

def alarm(signum, frame):
    raise Fail("test watchdog: still running after %d s" % TEST_TIMEOUT)


def cleanup():
    while CLEANUP:
        x = CLEANUP.pop()
        if isinstance(x, Server):
            problem = x.stop()
            if problem:
                yield "%s: %s" % (x.kind, problem)
        else:
            if x.poll() is None:
                x.kill()
            try:
                x.wait(5)
            except subprocess.TimeoutExpired:
                pass


def main(argv):
    global TARGET
    parser = testlib.arg_parser(__doc__, binary="optional")
    parser.add_argument("--target", choices=["gearmand"], help="run the tests against gearmand")
    parser.add_argument("--gearmand", default=GEARMAND_BIN, metavar="PATH", help="gearmand's path")
    args = testlib.parse_args(parser, argv, only_env=("GEARMAN_TEST_ONLY",))
    if bool(args.binary) == bool(args.target):
        parser.error("give the beangate binary or --target gearmand")
    Gearmand.binary = args.gearmand
    TARGET = Gearmand if args.target else Beangate
    Beangate.binary = args.binary
    missing = [p for p in (GEARMAN, GEARADMIN, Gearmand.binary) if not os.access(p, os.X_OK)]

    def skip(fn):
        if getattr(fn, "beangate_only", False) and not is_beangate():
            return fn.beangate_only
        if missing:
            return "not installed: %s (apt-get install gearman-job-server gearman-tools)" % " ".join(missing)
        return None

    def call(fn):
        signal.alarm(TEST_TIMEOUT)
        try:
            fn(new_server())
        finally:
            signal.alarm(0)

    def after(error):
        servers = [x for x in CLEANUP if isinstance(x, Server)]
        problems = list(cleanup())
        if error or problems:   # every server's stderr, after it stopped
            problems += ["---- %s stderr (%s) ----\n%s\n---- end of stderr ----"
                         % (s.kind, s.binary, sanitizer_report(s.last_stderr))
                         for s in servers if s.last_stderr.strip()]
        return problems

    signal.signal(signal.SIGALRM, alarm)
    return testlib.run("gearman", TESTS, args, namespace=globals(), skip=skip, call=call, after=after,
                       failures=(Fail, AssertionError, subprocess.TimeoutExpired))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
