#!/usr/bin/env python3
"""Hostile load on the beanstalk and Gearman ports (issue 13): the server
keeps serving, and every byte a client can make it hold has a limit.

    python3 tests/hostile/test_hostile_tcp.py build/beangate [-k NAME]...

Each test starts its own server on free loopback ports and prints the
numbers it measured (latency, RSS, CPU time, log lines) on a `  ...` line
before its PASS/FAIL line. Counts and times are bounded; nothing sleeps to
wait for something: every wait polls with a deadline. The suite raises its
own open-file limit (setrlimit) as far as the hard limit allows and skips,
with a SKIP line saying why, the tests that need more. Under ASan (the
binary is instrumented) the crowd tests use smaller counts and the memory
bounds are looser; the output says so.

With --tls (ctest hostile_tcp_tls) the same tests run against --tls-port
and --gearman-tls-port (issue 23): every client socket is wrapped in
Python's ssl (a throwaway CA from tests/lib/tlsfiles.py), so the limits
are those of the TLS ports. TLS_SKIPS says which tests do not apply there
and why.
"""

import os
import resource
import select
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import testlib  # noqa: E402
from testlib import SANITIZER_MARKERS, check, check_eq, free_port, signal_and_wait, wait_until
from testlib import append_tempfile, rss_kib  # noqa: E402

BINARY = None
ASAN = False            # the binary is built with AddressSanitizer
SLOW_CLIENTS = 5000     # the crowd of slow beanstalk clients (1000 under ASan)
START_TIMEOUT = 10.0
TLS = None              # --tls: the client context and the server's files (TLSFiles)

Skip = testlib.Skip


def note(text):
    """A line of numbers in the suite's output."""
    print("  " + text, flush=True)


# ---- --tls: the same clients over TLS -------------------------------------------

class TLSFiles:
    """--tls: a throwaway CA, a server certificate for 127.0.0.1, and a
    client context trusting the CA whose sockets behave like plain ones for
    these tests (HostileSSLSocket)."""

    def __init__(self):
        from tlsfiles import TestCA
        self.dir = tempfile.mkdtemp(prefix="beangate-hostile-tls-")
        ca = TestCA(self.dir)
        self.cert, self.key = ca.issue("server", dns=["localhost"], ips=["127.0.0.1"])
        self.context = ssl.create_default_context(cafile=ca.cert)
        self.context.sslsocket_class = HostileSSLSocket

    def server_args(self, port, gm_port):
        return ["--tls-cert", self.cert, "--tls-key", self.key, "--tls-port", str(port),
                "--gearman-tls-port", str(gm_port)]

    def wrap(self, sock):
        """sock (connected) after a TLS handshake; one the server closed
        before or during the handshake (a limit refused it) is returned
        as closed: it reads b"" (or a reset), as a plain one would."""
        s = self.context.wrap_socket(sock, server_hostname="localhost", do_handshake_on_connect=False)
        try:
            s.do_handshake()
        except (ssl.SSLError, ConnectionResetError, BrokenPipeError) as e:
            s.refused = e
        return s


class HostileSSLSocket(ssl.SSLSocket):
    """An ssl socket that answers like a plain one where the tests look:
    non-blocking calls that cannot go on raise BlockingIOError, the peer's
    end (with or without close_notify) reads b"", other TLS errors are a
    reset. TLS cannot peek: recv(n, MSG_PEEK) reads and keeps the bytes for
    the next recv."""

    refused = None
    peeked = b""

    def recv(self, n=1024, flags=0):
        if self.refused is not None:
            return b""
        if self.peeked:
            data = self.peeked[:n]
            if not flags & socket.MSG_PEEK:
                self.peeked = self.peeked[n:]
            return data
        data = self._recv(n)
        if flags & socket.MSG_PEEK:
            self.peeked = data
        return data

    def _recv(self, n):
        try:
            return super().recv(n)
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            raise BlockingIOError(11, "TLS: would block") from None
        except (ssl.SSLEOFError, ssl.SSLZeroReturnError):
            return b""
        except ssl.SSLError as e:
            raise ConnectionResetError(104, "TLS: %s" % e) from None

    def send(self, data, flags=0):
        if self.refused is not None:
            raise BrokenPipeError(32, "TLS: refused at the handshake: %s" % self.refused)
        try:
            return super().send(data)
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            raise BlockingIOError(11, "TLS: would block") from None
        except ssl.SSLError as e:
            raise ConnectionResetError(104, "TLS: %s" % e) from None

    def sendall(self, data, flags=0):
        if self.refused is not None:
            raise BrokenPipeError(32, "TLS: refused at the handshake: %s" % self.refused)
        try:
            return super().sendall(data)
        except ssl.SSLError as e:
            raise ConnectionResetError(104, "TLS: %s" % e) from None


def client_socket(sock):
    """A connected client socket as the tests use it: wrapped in TLS with --tls."""
    return TLS.wrap(sock) if TLS else sock


# What a GnuTLS server session may hold besides the layer's buffers (its
# record buffers, up to 16 KB each way, and its state), for memory bounds.
TLS_SESSION_BYTES = 40960

# Tests that do not apply to the TLS ports, and why.
TLS_SKIPS = {
    "test_p99_with_slow_clients": "its 5000-client crowd measures the plain path's memory and latency; "
                                  "over TLS each client would first need a handshake from this one Python "
                                  "process, and the connection layer's crowd handling is the same code",
    "test_rss_bounded_partial_lines": "its per-connection memory bound is for plain connections; a GnuTLS "
                                      "session keeps its own record buffers (tests/tls measures TLS itself)",
    "test_rss_bounded_non_reading_pipeliners": "its RSS bound is for plain connections (GnuTLS buffers a "
                                               "record per session besides the layer's own buffers)",
    "test_rss_bounded_non_reading_listers": "its RSS bound is for plain connections (GnuTLS buffers a "
                                            "record per session besides the layer's own buffers)",
    "test_job_memory_ceiling_after_restart": "about the log and the job-memory ceiling after a restart; "
                                             "nothing in it depends on the transport "
                                             "(test_job_memory_ceiling runs over TLS)",
}


# ---- the server --------------------------------------------------------------

def cpu_seconds(pid):
    """utime + stime of a process, in seconds (/proc/PID/stat)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    """One beangate on free loopback ports: beanstalk, and HTTP / Gearman when
    asked. nofile: its open-file limit (soft and hard); None: the suite's."""

    def __init__(self, args=(), http=False, gearman=False, nofile=None, logdir=None):
        self.args, self.http, self.gearman, self.nofile, self.logdir = list(args), http, gearman, nofile, logdir
        self.proc = None
        self.err = append_tempfile()

    def __enter__(self):
        for _attempt in range(5):
            self.port, self.http_port, self.gm_port = free_port(), free_port(), free_port()
            argv = [BINARY, "-l", "127.0.0.1", "-p", str(self.port)] + self.args
            if TLS:
                self.tls_port, self.gm_tls_port = free_port(), free_port()
                argv += TLS.server_args(self.tls_port, self.gm_tls_port)
                if not self.gearman:  # the Gearman TLS port turns Gearman on: give it its plain port too
                    argv += ["--gearman-listen", "127.0.0.1", "--gearman-port", str(self.gm_port)]
            argv += ["--http-listen", "127.0.0.1", "--http-port", str(self.http_port)] if self.http else ["--no-http"]
            if self.gearman:
                argv += ["--gearman-listen", "127.0.0.1", "--gearman-port", str(self.gm_port)]
            if self.logdir:
                argv += ["-b", self.logdir]
            nofile = self.nofile

            def limits():
                if nofile:
                    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
            self.err.seek(0)
            self.err.truncate()
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=self.err, env=testlib.clean_env(), preexec_fn=limits)
            if testlib.wait_ready(self.proc, lambda: self._answers(), START_TIMEOUT) == "ok":
                if TLS:  # from now on the tests' ports are the TLS ones
                    self.plain_port, self.port, self.gm_port = self.port, self.tls_port, self.gm_tls_port
                return self
            signal_and_wait(self.proc, signal.SIGKILL, 5)
            if "cannot listen" not in self.stderr() and "Address already in use" not in self.stderr():
                break
        raise AssertionError("the server did not start: %s" % self.stderr()[-1500:])

    def _answers(self):
        with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
            s.sendall(b"list-tube-used\r\n")
            return s.recv(64) == b"USING default\r\n"

    def __exit__(self, *exc):
        status = signal_and_wait(self.proc, signal.SIGTERM, 20)
        err = self.stderr()
        bad = [m for m in SANITIZER_MARKERS if m in err]
        if exc[0] is None:
            check(status == 0, "the server's exit status after SIGTERM: %r; stderr: %s" % (status, err[-1500:]))
            check(not bad, "sanitizer report: %s" % err[-3000:])
        return False

    def stderr(self):
        self.err.seek(0)
        return self.err.read().decode("utf-8", "replace")

    def lines(self, word):
        return [line for line in self.stderr().splitlines() if word in line]

    def connect(self, port=None, timeout=5.0, source=None):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(timeout)
        if source:
            s.bind((source, 0))
        s.connect(("127.0.0.1", port or self.port))
        return client_socket(s)

    def http_get(self, path):
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d%s" % (self.http_port, path), timeout=5) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def http_post(self, path, body):
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.http_port, path), data=body, method="POST",
                                     headers={"Content-Type": "application/octet-stream"})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def metric(self, name):
        """A series' value from /metrics (name with its labels)."""
        status, text = self.http_get("/metrics")
        check_eq(status, 200, "GET /metrics")
        for line in text.decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        raise AssertionError("no series %s in /metrics" % name)


def command(s, line, want_prefix=None):
    """Send one command line, read one reply line (and a body if it has one)."""
    s.sendall(line)
    data = b""
    while not data.endswith(b"\r\n"):
        chunk = s.recv(65536)
        check(chunk, "the server closed the connection after %r (got %r)" % (line, data))
        data += chunk
    if want_prefix is not None:
        check(data.startswith(want_prefix), "%r: got %r, want %r..." % (line, data[:200], want_prefix))
    return data


def closed_by_server(s, within):
    """Wait up to `within` s for the server to close s: the time it took, or
    None if it was still open (bytes received before the close are ignored)."""
    t0 = time.monotonic()
    s.settimeout(0.05)
    while time.monotonic() - t0 < within:
        try:
            data = s.recv(65536)
        except socket.timeout:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return time.monotonic() - t0
        if not data:
            return time.monotonic() - t0
    return None


def still_open(s):
    """The server has not closed s (and sent nothing)."""
    r, _, _ = select.select([s], [], [], 0)
    if not r:
        return True
    try:
        return s.recv(1, socket.MSG_PEEK) != b""
    except (ConnectionResetError, BrokenPipeError):
        return False


def open_many(port, n, first=b""):
    """n connections to port, each sending `first`; the list."""
    conns = []
    for _ in range(n):
        s = client_socket(socket.create_connection(("127.0.0.1", port), timeout=5))
        if first:
            s.sendall(first)
        conns.append(s)
    return conns


def close_all(conns):
    for s in conns:
        try:
            s.close()
        except OSError:
            pass


def crowd_files():
    """The server's open-file limit for the crowd tests: its default
    --max-connections (the limit less an eighth) must let them all in."""
    n = SLOW_CLIENTS * 8 // 7 + 600
    need_files(n)
    return n


def need_files(n):
    """Raise the suite's open-file limit to n, or skip."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= n:
        return
    if hard != resource.RLIM_INFINITY and hard < n:
        raise Skip("needs %d open files; the hard limit is %d (raise it: ulimit -Hn)" % (n, hard))
    resource.setrlimit(resource.RLIMIT_NOFILE, (n, hard))


def gm_packet(kind, *args):
    data = b"\0".join(a if isinstance(a, bytes) else str(a).encode() for a in args)
    return b"\0REQ" + struct.pack(">II", kind, len(data)) + data


def gm_read_packet(s):
    head = b""
    while len(head) < 12:
        chunk = s.recv(12 - len(head))
        check(chunk, "the server closed the Gearman connection")
        head += chunk
    magic, kind, size = head[:4], *struct.unpack(">II", head[4:])
    check_eq(magic, b"\0RES", "a Gearman response's magic")
    body = b""
    while len(body) < size:
        chunk = s.recv(size - len(body))
        check(chunk, "the server closed the Gearman connection mid-packet")
        body += chunk
    return kind, body.split(b"\0")


GM_ERROR, GM_JOB_CREATED = 19, 8
GM_SUBMIT_JOB, GM_SUBMIT_JOB_BG, GM_SUBMIT_JOB_EPOCH, GM_CAN_DO_TIMEOUT, GM_WORK_DATA = 7, 18, 36, 23, 28
GM_CAN_DO, GM_GRAB_JOB, GM_JOB_ASSIGN = 1, 9, 11


def percentile(sorted_values, p):
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * p / 100))]


# ---- the crowd: a fresh client's latency, memory -------------------------------

def test_p99_with_slow_clients():
    """SLOW_CLIENTS connections, half idle and half holding a partial command
    line that trickles (a byte each every 0.2 s): a fresh client's put /
    reserve / delete cycle keeps its p99 under 100 ms."""
    need_files(SLOW_CLIENTS + 200)
    with Server(nofile=crowd_files()) as srv:
        rss0 = rss_kib(srv.proc.pid)
        idle = open_many(srv.port, SLOW_CLIENTS // 2)
        trickle = open_many(srv.port, SLOW_CLIENTS - SLOW_CLIENTS // 2, b"put 0 0 ")
        stop = threading.Event()
        sent = [0]

        def trickler():  # a byte to each trickling client every 0.2 s, until told to stop
            while not stop.is_set():
                round_end = time.monotonic() + 0.2
                for s in trickle:
                    try:
                        s.send(b"1")
                        sent[0] += 1
                    except OSError:
                        pass
                stop.wait(max(0.0, round_end - time.monotonic()))
        t = threading.Thread(target=trickler, daemon=True)
        t.start()
        fresh = srv.connect()
        lat = []
        start = time.monotonic()
        while len(lat) < 1000 or time.monotonic() - start < 2.0:  # at least 1000 cycles and 2 s
            check(time.monotonic() - start < 30, "1000 cycles took over 30 s")
            t0 = time.monotonic()
            command(fresh, b"put 0 0 60 5\r\nhello\r\n", b"INSERTED ")
            reply = command(fresh, b"reserve-with-timeout 0\r\n", b"RESERVED ")
            command(fresh, b"delete %s\r\n" % reply.split()[1], b"DELETED")
            lat.append(time.monotonic() - t0)
        stop.set()
        t.join(5)
        lat.sort()
        rss1 = rss_kib(srv.proc.pid)
        p50, p99, worst = percentile(lat, 50) * 1000, percentile(lat, 99) * 1000, lat[-1] * 1000
        note("%d slow clients (%d idle, %d trickling, %d bytes trickled): fresh client put+reserve+delete "
             "x%d: p50 %.2f ms, p99 %.2f ms, max %.2f ms; server RSS %.1f MB -> %.1f MB%s"
             % (SLOW_CLIENTS, len(idle), len(trickle), sent[0], len(lat), p50, p99, worst, rss0 / 1024, rss1 / 1024,
                " (ASan: smaller crowd)" if ASAN else ""))
        check(p99 < 100, "p99 %.1f ms is not under 100 ms" % p99)
        check_eq(command(fresh, b"stats\r\n").split(b"\r\n")[0][:3], b"OK ", "stats after the load")
        close_all(idle + trickle + [fresh])


def test_rss_bounded_partial_lines():
    """SLOW_CLIENTS connections each holding half a command line cost about
    what an idle one does: no 64 KiB read buffer each (issue 13: 10,000 of
    them took 965 MB)."""
    need_files(SLOW_CLIENTS + 200)
    with Server(nofile=crowd_files()) as srv:
        fresh = srv.connect()
        command(fresh, b"stats\r\n")
        rss0 = rss_kib(srv.proc.pid)
        conns = open_many(srv.port, SLOW_CLIENTS, b"put 0 0 60 ")
        command(fresh, b"list-tube-used\r\n", b"USING")  # every earlier connection was read by now
        wait_until(lambda: int(command(fresh, b"stats\r\n").split(b"current-connections: ")[1].split(b"\n")[0])
                   >= SLOW_CLIENTS + 1, "every connection accepted", timeout=20)
        rss1 = rss_kib(srv.proc.pid)
        per = (rss1 - rss0) * 1024 / SLOW_CLIENTS
        note("%d partial-line clients: server RSS %.1f MB -> %.1f MB, %.0f bytes per connection%s"
             % (SLOW_CLIENTS, rss0 / 1024, rss1 / 1024, per, " (ASan: loose bound)" if ASAN else ""))
        check(per < (16384 if ASAN else 2048), "%.0f bytes per partial-line connection" % per)
        close_all(conns + [fresh])


def test_rss_bounded_non_reading_pipeliners():
    """200 clients pipeline 8192 `peek` of a 1000-byte job each (8 MB of
    replies each) and read nothing: the server stops reading each at its
    output limit, so RSS stays bounded (issue 13: 4 MiB each, doubling, took
    1.6 GB), and a client that does read still gets every reply in order."""
    need_files(600)
    with Server() as srv:
        fresh = srv.connect()
        body = bytes(range(256)) * 3 + b"x" * 232
        command(fresh, b"put 0 0 60 1000\r\n" + body + b"\r\n", b"INSERTED 1")
        rss0 = rss_kib(srv.proc.pid)
        burst = b"peek 1\r\n" * 8192  # 64 KiB of commands, 8.2 MB of replies
        conns = []
        for _ in range(200):
            s = srv.connect()
            s.setblocking(False)
            conns.append([s, 0])
        deadline = time.monotonic() + 30
        while any(off < len(burst) for _, off in conns):  # write what the server takes, bounded in time
            check(time.monotonic() < deadline, "the clients could not send their 64 KiB in 30 s")
            for entry in conns:
                try:
                    entry[1] += entry[0].send(burst[entry[1]:entry[1] + 65536])
                except BlockingIOError:
                    pass
        # the server answers until each one's buffers are full: poll RSS until it settles
        samples = []

        def settled():
            samples.append(rss_kib(srv.proc.pid))
            return len(samples) > 10 and max(samples[-10:]) - min(samples[-10:]) < 256
        wait_until(settled, "the server's RSS to settle", timeout=30, step=0.1)
        command(fresh, b"list-tube-used\r\n", b"USING")
        rss1 = max(samples)
        note("200 non-reading clients, 8.2 MB of replies asked each: server RSS %.1f MB -> %.1f MB "
             "(+%.1f MB, %.0f KB per client)%s" % (rss0 / 1024, rss1 / 1024, (rss1 - rss0) / 1024,
                                                   (rss1 - rss0) / 200, " (ASan: loose bound)" if ASAN else ""))
        check(rss1 - rss0 < (400 if ASAN else 100) * 1024, "RSS grew by %.1f MB" % ((rss1 - rss0) / 1024))
        # one of them reads now: all 8192 replies come, in order
        s = conns[0][0]
        s.setblocking(True)
        s.settimeout(10)
        want = (b"FOUND 1 1000\r\n" + body + b"\r\n") * 8192
        got = bytearray()
        while len(got) < len(want):
            chunk = s.recv(1 << 20)
            check(chunk, "closed after %d of %d bytes" % (len(got), len(want)))
            got += chunk
        check(bytes(got) == want, "the replies of the client that read at last differ from 8192 FOUND")
        close_all([c for c, _ in conns] + [fresh])


def test_rss_bounded_non_reading_listers():
    """200 clients send `list-tubes` with 30,000 tubes of 200-byte names (a
    6 MB reply each) and read nothing. The kernel takes about 4 MiB of each
    into the socket; what is left is held by the server, within
    --max-reply-memory (64 MiB): once it is full, the next list-tubes gets
    OUT_OF_MEMORY at once, and RSS grows by about the budget, not 200 x 2 MB
    (the code before: +435 MB). Small replies go on; the budget comes back
    when the clients leave."""
    n = 50 if ASAN else 200
    need_files(n + 300)
    with Server(http=True) as srv:
        c = srv.connect(timeout=30)
        tubes = 30000
        c.sendall(b"".join(b"use t%05d%s\r\nput 0 0 600 1\r\nj\r\n" % (i, b"x" * 194) for i in range(tubes)))
        got = b""
        while got.count(b"INSERTED") < tubes:
            chunk = c.recv(1 << 20)
            check(chunk, "the server closed while the tubes were made")
            got += chunk
        rss0 = rss_kib(srv.proc.pid)
        conns, firsts = [], {}
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.settimeout(10)
            s.connect(("127.0.0.1", srv.port))
            s.sendall(b"list-tubes\r\n")
            first = s.recv(16)  # "OK 6089..." or "OUT_OF_MEMORY\r\n"
            word = first.split()[0].decode() if first else "closed"
            firsts[word] = firsts.get(word, 0) + 1
            conns.append(s)
        rss1 = rss_kib(srv.proc.pid)
        held = srv.metric("beangate_reply_memory_bytes")
        refused = srv.metric("beangate_replies_refused_total")
        command(c, b"list-tube-used\r\n", b"USING t29999")
        note("%d clients not reading list-tubes (a 6 MB reply each): %s; %.1f MB held unsent "
             "(--max-reply-memory 64 MiB); server RSS %.1f MB -> %.1f MB (+%.1f MB)%s"
             % (n, firsts, held / 1e6, rss0 / 1024, rss1 / 1024, (rss1 - rss0) / 1024,
                " (ASan: fewer clients)" if ASAN else ""))
        check(firsts.get("OUT_OF_MEMORY", 0) >= 1 or n * 2e6 < 64 << 20, "none refused: %s" % firsts)
        check_eq(firsts.get("OUT_OF_MEMORY", 0), refused, "refusals counted in /metrics")
        check(held <= (64 << 20) + 6.1e6, "held %d bytes, over the budget and one reply" % held)
        check(rss1 - rss0 < (400 if ASAN else 64 + 7 + 30) * 1024, "RSS grew by %.1f MB" % ((rss1 - rss0) / 1024))
        close_all(conns)
        wait_until(lambda: srv.metric("beangate_reply_memory_bytes") == 0, "the budget to come back", 10)
        c.sendall(b"list-tubes\r\n")
        reply = b""
        while b"\r\n" not in reply or len(reply) < reply.index(b"\r\n") + 4 + int(reply.split()[1]):
            chunk = c.recv(1 << 20)
            check(chunk, "closed during list-tubes: %r" % reply[:40])
            reply += chunk
        check(reply.startswith(b"OK ") and reply.endswith(b"- t29999%s\n\r\n" % (b"x" * 194)),
              "list-tubes once the clients left: %r" % reply[:40])
        c.close()


# ---- the open-file limit -------------------------------------------------------

def fd_limit_run(extra, what, http):
    """300 clients against a server whose open-file limit is 256: its CPU
    time over 5 s, its warn lines, HTTP's /livez (http), and a fresh client
    once 100 close."""
    need_files(1000)
    with Server(extra, http=http, nofile=256) as srv:
        conns = []
        for _ in range(300):
            try:
                conns.append(socket.create_connection(("127.0.0.1", srv.port), timeout=5))
            except OSError:
                pass
        # let it take what it can, then watch it for 5 s
        # a connect (no TLS handshake: the server may have no descriptor to accept it with)
        fresh_probe = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        fresh_probe.close()
        cpu0, t0 = cpu_seconds(srv.proc.pid), time.monotonic()
        end = t0 + 5
        while time.monotonic() < end:
            select.select([], [], [], end - time.monotonic())
        cpu = cpu_seconds(srv.proc.pid) - cpu0
        warns = [line for line in srv.stderr().splitlines() if "level=warn" in line or "level=error" in line]
        status, _ = srv.http_get("/livez") if http else ("-", None)
        # others close: a fresh client is served
        for s in conns[:100]:
            s.close()
        t1 = time.monotonic()
        fresh = srv.connect(timeout=10)
        reply = command(fresh, b"list-tube-used\r\n")
        served = time.monotonic() - t1
        note("%s: 300 clients at `ulimit -n 256`: server CPU %.3f s over 5 s (%.1f%% of a core), %d warn "
             "lines (%s), HTTP /livez %s, a fresh client served %.0f ms after 100 closed"
             % (what, cpu, cpu / 5 * 100, len(warns), ", ".join(sorted({w.split("event=")[1].split()[0]
                                                                           for w in warns})) or "-",
                status, served * 1000))
        check(cpu < 0.25, "the server used %.3f s of CPU in 5 s at the fd limit" % cpu)
        check(len(warns) <= 3, "%d warn lines in 5 s: %s" % (len(warns), warns[:5]))
        if http:
            check_eq(status, 200, "GET /livez at the fd limit")
        check_eq(reply, b"USING default\r\n", "a fresh client once others closed")
        close_all(conns[100:] + [fresh])
        return srv


def test_fd_limit_default_cap():
    """At `ulimit -n 256` the default --max-connections (224: the limit less
    an eighth, at least 32 spare) refuses the rest at once: the process stays
    idle, logs a bounded number of lines, and HTTP stays reachable."""
    fd_limit_run([], "default cap (224)", http=True)


def test_fd_limit_accept_pauses():
    """With --max-connections above the open-file limit, accept() fails with
    EMFILE: accepting pauses (100 ms doubling to 1 s, or until a connection
    closes) instead of spinning (issue 13: 72% of a core, 244k lines in 9 s).
    Without the gateway: every descriptor is taken, so HTTP could not accept
    either (the default cap above is what keeps it reachable)."""
    fd_limit_run(["--max-connections", "100000"], "--max-connections 100000, --no-http", http=False)


# ---- each limit at its limit -----------------------------------------------------

def test_max_connections():
    """--max-connections 5: five are served, the sixth is closed at once (and
    counted in /metrics); once one closes, a new one is served."""
    with Server(["--max-connections", "5"], http=True, gearman=True) as srv:
        conns = [srv.connect() for _ in range(4)] + [srv.connect(srv.gm_port)]
        for s in conns[:4]:
            command(s, b"list-tube-used\r\n", b"USING")
        extra = srv.connect()
        took = closed_by_server(extra, 5)
        check(took is not None, "the sixth connection (beanstalk) was not closed")
        extra_gm = srv.connect(srv.gm_port)
        check(closed_by_server(extra_gm, 5) is not None, "the sixth connection (Gearman) was not closed")
        check_eq(srv.metric('beangate_connections_rejected_total{reason="max_connections"}'), 2.0,
                 "refused connections in /metrics")
        command(conns[1], b"list-tube-used\r\n", b"USING")  # the five are still served
        conns[4].sendall(gm_packet(GM_SUBMIT_JOB_BG, b"f", b"", b"x"))
        check_eq(gm_read_packet(conns[4])[0], GM_JOB_CREATED, "the Gearman one of the five")
        conns[0].close()
        fresh = wait_until(lambda: _served(srv), "a connection to be served again", timeout=5)
        note("--max-connections 5: the 6th closed after %.0f ms; served again once one closed" % (took * 1000))
        close_all(conns[1:] + [fresh])


def _served(srv):
    s = srv.connect()
    try:
        s.sendall(b"list-tube-used\r\n")
        if s.recv(64) == b"USING default\r\n":
            return s
    except OSError:
        pass
    s.close()
    return None


def test_max_connections_per_ip():
    """--max-connections-per-ip 3: a fourth from 127.0.0.1 is closed at once,
    one from 127.0.0.2 is served."""
    with Server(["--max-connections-per-ip", "3"], http=True) as srv:
        conns = [srv.connect() for _ in range(3)]
        for s in conns:
            command(s, b"list-tube-used\r\n", b"USING")
        fourth = srv.connect()
        check(closed_by_server(fourth, 5) is not None, "the fourth connection from 127.0.0.1 was not closed")
        other = srv.connect(source="127.0.0.2")
        command(other, b"list-tube-used\r\n", b"USING default")
        check_eq(srv.metric('beangate_connections_rejected_total{reason="max_connections_per_ip"}'), 1.0,
                 "per-address refusals in /metrics")
        conns[0].close()
        wait_until(lambda: _served(srv), "127.0.0.1 to be served again", timeout=5).close()
        close_all(conns[1:] + [fourth, other])


def test_request_timeout():
    """--request-timeout 1: half a command line (even one that trickles), an
    over-long line that keeps coming, a put body that stops coming and half a
    Gearman packet header are closed about 1 s after their last progress
    (Gearman with an ERROR packet); a put body that keeps coming, an idle
    connection and commands sent behind a blocked reserve are not, and an
    idle client is served meanwhile."""
    with Server(["--request-timeout", "1"], gearman=True) as srv:
        partial = srv.connect()
        partial.sendall(b"put 0 0 6")
        trickle = srv.connect()
        trickle.sendall(b"l")
        garbage = srv.connect()
        body = srv.connect()
        body.sendall(b"put 0 0 60 4\r\n")
        stalled = srv.connect()
        stalled.sendall(b"put 0 0 60 4\r\nab")
        idle = srv.connect()
        blocked = srv.connect()
        blocked.sendall(b"watch slow\r\nreserve\r\nlist-tube-used\r\n")
        gm = srv.connect(srv.gm_port)
        gm.sendall(b"\0REQ\0\0")
        t0 = time.monotonic()
        closed, body_sent = {}, 0
        for s in (partial, trickle, garbage, stalled, gm):
            s.setblocking(False)
        while time.monotonic() - t0 < 2.6:  # 2.6 s: trickle, flood garbage and the body, watch for closes
            now = time.monotonic() - t0
            for name, s in (("partial", partial), ("trickle", trickle), ("garbage", garbage), ("stalled", stalled),
                            ("gearman", gm)):
                if name in closed:
                    continue
                try:
                    if name == "trickle":
                        s.send(b"i")
                    elif name == "garbage":
                        s.send(b"x" * 4096)
                    data = s.recv(65536)
                    if not data:
                        closed[name] = now
                    elif name == "gearman":
                        closed.setdefault("gearman_error", data)
                except (BlockingIOError, InterruptedError):
                    pass
                except (ConnectionResetError, BrokenPipeError):
                    closed[name] = now
            if body_sent < 4 and now > 0.6 * (body_sent + 1):
                body.sendall(b"abcd"[body_sent:body_sent + 1])
                body_sent += 1
            select.select([], [], [], 0.02)
        body.sendall(b"\r\n")
        check_eq(body.recv(64)[:9], b"INSERTED ", "a put whose body took 2.4 s, a byte at a time")
        for name in ("partial", "trickle", "garbage", "stalled", "gearman"):
            check(name in closed, "%s was not closed within 2.6 s" % name)
            check(0.9 <= closed[name] <= 2.5, "%s closed after %.2f s, want about 1 s" % (name, closed[name]))
        check(b"REQUEST_TIMEOUT" in closed.get("gearman_error", b""),
              "the Gearman client's last packet: %r" % closed.get("gearman_error"))
        check(still_open(idle), "an idle connection was closed by --request-timeout")
        command(idle, b"put 0 0 60 1\r\nz\r\n", b"INSERTED")
        check(still_open(blocked), "a blocked reserve with commands behind it was closed")
        command(idle, b"use slow\r\n", b"USING slow")
        command(idle, b"put 0 0 60 1\r\nq\r\n", b"INSERTED")
        blocked.settimeout(5)
        got = b""
        while not got.endswith(b"USING default\r\n"):
            chunk = blocked.recv(4096)
            check(chunk, "the blocked client was closed: %r" % got)
            got += chunk
        check(got.startswith(b"WATCHING 2\r\nRESERVED "), "the blocked client's replies: %r" % got)
        note("--request-timeout 1: closed after %s; a 2.4 s put body, an idle client and a 2.6 s blocked "
             "reserve kept" % ", ".join("%s %.2f s" % (k, v) for k, v in sorted(closed.items())
                                        if isinstance(v, float)))
        close_all([partial, trickle, garbage, stalled, body, idle, blocked, gm])


def test_idle_timeout():
    """--idle-timeout 1: a silent connection is closed after about 1 s (a
    Gearman one with an ERROR packet); a blocked reserve, a connection holding
    a reservation and a sleeping Gearman worker are not idle. Without the flag
    nothing idle is closed (beanstalkd has no idle timeout)."""
    with Server(["--idle-timeout", "1"], gearman=True) as srv:
        silent = srv.connect()
        talker = srv.connect()
        blocked = srv.connect()
        blocked.sendall(b"watch idle-t\r\nreserve\r\n")
        holder = srv.connect()
        command(holder, b"use held\r\n")
        command(holder, b"put 0 0 600 1\r\nh\r\n", b"INSERTED")
        command(holder, b"watch held\r\n")
        command(holder, b"reserve-with-timeout 0\r\n", b"RESERVED")
        gm_idle = srv.connect(srv.gm_port)
        sleeper = srv.connect(srv.gm_port)
        sleeper.sendall(gm_packet(GM_CAN_DO, b"f") + gm_packet(4))  # CAN_DO f, PRE_SLEEP
        t0 = time.monotonic()
        silent.setblocking(False)
        took = None
        for _ in range(12):  # 2.4 s of traffic keeps `talker` alive; watch `silent`
            command(talker, b"list-tube-used\r\n", b"USING")
            select.select([silent], [], [], 0.2)
            if took is None and not still_open(silent):
                took = time.monotonic() - t0
        check(took is not None, "a silent connection was kept for 2.4 s")
        check(0.8 <= took <= 1.8, "the silent connection was closed after %.2f s, want about 1 s" % took)
        gm_idle.settimeout(1)
        kind, args = gm_read_packet(gm_idle)
        check_eq((kind, args[0]), (GM_ERROR, b"IDLE_TIMEOUT"), "the idle Gearman client's last packet")
        for name, s in (("talker", talker), ("blocked", blocked), ("holder", holder), ("sleeper", sleeper)):
            check(still_open(s), "%s was closed as idle" % name)
        command(talker, b"use idle-t\r\n")
        command(talker, b"put 0 0 60 1\r\nb\r\n", b"INSERTED")
        blocked.settimeout(5)
        got = b""
        while b"RESERVED" not in got:
            chunk = blocked.recv(4096)
            check(chunk, "the blocked reserve was closed")
            got += chunk
        note("--idle-timeout 1: a silent connection closed after %.2f s; talking, blocked, holding "
             "and sleeping ones kept for 2.4 s" % took)
        close_all([silent, talker, blocked, holder, gm_idle, sleeper])
    with Server() as srv:
        s = srv.connect()
        t0 = time.monotonic()
        check(closed_by_server(s, 2.0) is None, "an idle connection was closed without --idle-timeout")
        command(s, b"list-tube-used\r\n", b"USING")
        note("default: an idle connection kept %.1f s and served" % (time.monotonic() - t0))


def test_input_limit():
    """--max-input-buffer 1024: 200 clients block in `reserve` and pipeline
    1 MB of commands behind it. The server keeps at most 1024 unprocessed
    bytes of each and stops reading (the rest waits in the kernel, and the
    senders stall), so RSS stays bounded; other clients are served
    meanwhile; once a job comes, a client's 65536 commands are all answered
    in order."""
    burst = b"list-tube-used\r\n" * 65536  # 1 MB
    with Server(["--max-input-buffer", "1024"]) as srv:
        fresh = srv.connect()
        command(fresh, b"stats\r\n")
        rss0 = rss_kib(srv.proc.pid)
        conns = []
        for _ in range(200):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # no autotuning: the kernel holds little
            s.settimeout(5)
            s.connect(("127.0.0.1", srv.port))
            s = client_socket(s)
            s.sendall(b"watch inq\r\nreserve\r\n")
            s.setblocking(False)
            conns.append([s, 0])
        view = memoryview(burst)
        progress = []

        def stalled():  # send what each takes; done when no one took a byte for 10 rounds
            took = 0
            for entry in conns:
                try:
                    n = entry[0].send(view[entry[1]:entry[1] + 65536])
                    entry[1] += n
                    took += n
                except BlockingIOError:
                    pass
            progress.append(took)
            return len(progress) > 10 and not any(progress[-10:])
        wait_until(stalled, "the senders to stall", timeout=30, step=0.02)
        command(fresh, b"list-tube-used\r\n", b"USING default")  # served meanwhile
        rss1 = rss_kib(srv.proc.pid)
        sent = sorted(off for _, off in conns)
        per = (rss1 - rss0) * 1024 / len(conns)
        note("--max-input-buffer 1024: 200 blocked clients pipelining 1 MB each stalled after %d..%d KB "
             "(kernel buffers); server RSS %.1f MB -> %.1f MB, %.0f bytes per client"
             % (sent[0] // 1024, sent[-1] // 1024, rss0 / 1024, rss1 / 1024, per))
        check(sent[-1] < len(burst), "a client sent all of its 1 MB behind a blocked reserve")
        # over TLS a GnuTLS session adds its own buffers (a 16 KB record each way at most).
        # Under ASan over TLS the bound is not checked: ASan's quarantine keeps the record
        # buffers GnuTLS frees (about 400 KB per client here; 56 KB with quarantine_size_mb=0)
        bound = (24576 if ASAN else 6144) + (TLS_SESSION_BYTES if TLS else 0)
        if TLS and ASAN:
            note("ASan over TLS: the per-client memory bound is not checked (ASan's quarantine)")
        else:
            check(per < bound, "%.0f bytes per client with 1024 of input allowed (bound %d)" % (per, bound))
        # a job for each: the first client's reserve returns and all of its commands are answered
        command(fresh, b"use inq\r\n", b"USING inq")
        for _ in conns:
            command(fresh, b"put 0 0 60 1\r\nx\r\n", b"INSERTED")
        first, off = conns[0]
        want = b"USING default\r\n" * 65536
        got = bytearray()
        # send the rest and read the replies in one thread, non-blocking (an ssl
        # socket must not be read and written from two threads at once)
        deadline = time.monotonic() + 30
        while b"\r\nx\r\n" not in got or len(got) - got.index(b"\r\nx\r\n") - 5 < len(want):
            check(time.monotonic() < deadline, "the replies did not come within 30 s (%d bytes)" % len(got))
            select.select([first], [first] if off < len(burst) else [], [], 0.05)
            if off < len(burst):
                try:
                    off += first.send(view[off:off + 65536])
                except BlockingIOError:
                    pass
            try:
                chunk = first.recv(1 << 20)
            except BlockingIOError:
                continue
            check(chunk, "closed after %d bytes" % len(got))
            got += chunk
        head, _, tail = bytes(got).partition(b"\r\nx\r\n")
        check(head.startswith(b"WATCHING 2\r\nRESERVED "), "the first client's replies: %r" % got[:100])
        check(tail == want, "the 65536 pipelined commands' replies differ (%d bytes)"
              % len(tail))
        close_all([c for c, _ in conns] + [fresh])


def test_output_limit():
    """--max-output-buffer 4096: a client that pipelines 2000 `peek` of a
    10 KB job and does not read stops being read at the limit, and gets all
    20 MB in order once it reads. A Gearman client that does not read the
    results a worker sends it is closed once they pass the limit plus one
    packet of the largest size (counted in /metrics)."""
    with Server(["--max-output-buffer", "4096", "-z", "10000"], http=True, gearman=True) as srv:
        c = srv.connect()
        job = b"j" * 10000
        command(c, b"put 0 0 60 10000\r\n" + job + b"\r\n", b"INSERTED 1")
        rss0 = rss_kib(srv.proc.pid)
        p = srv.connect()
        p.sendall(b"peek 1\r\n" * 2000)
        samples = []

        def settled():
            samples.append(rss_kib(srv.proc.pid))
            return len(samples) > 10 and max(samples[-10:]) - min(samples[-10:]) < 64
        wait_until(settled, "the server's RSS to settle", timeout=20, step=0.05)
        grew = max(samples) - rss0
        command(c, b"peek 1\r\n", b"FOUND 1 10000\r\n")  # served while the other is stuck
        want = (b"FOUND 1 10000\r\n" + job + b"\r\n") * 2000
        got = bytearray()
        p.settimeout(10)
        while len(got) < len(want):
            chunk = p.recv(1 << 20)
            check(chunk, "closed after %d of %d bytes" % (len(got), len(want)))
            got += chunk
        check(bytes(got) == want, "the 2000 FOUND replies differ")
        # Gearman: results pushed to a client that does not read
        client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(("127.0.0.1", srv.gm_port))
        client = client_socket(client)
        client.sendall(gm_packet(GM_SUBMIT_JOB, b"f", b"", b"work"))
        worker = srv.connect(srv.gm_port)
        worker.sendall(gm_packet(GM_CAN_DO, b"f") + gm_packet(GM_GRAB_JOB))
        kind, args = gm_read_packet(worker)
        check_eq(kind, GM_JOB_ASSIGN, "the worker's grab")
        handle = args[0]
        chunk = gm_packet(GM_WORK_DATA, handle, b"d" * 8000)
        sent = 0
        worker.settimeout(5)
        while srv.metric('beangate_connections_rejected_total{reason="output_limit"}') < 1:
            check(sent < 64 << 20, "64 MB of WORK_DATA and the client that reads nothing is still open")
            worker.sendall(chunk * 64)
            sent += len(chunk) * 64
        client.settimeout(5)
        got_gm = 0
        while True:  # what the kernel held, then the end
            try:
                data = client.recv(1 << 20)
            except ConnectionResetError:
                break
            if not data:
                break
            got_gm += len(data)
        note("--max-output-buffer 4096: 2000 pipelined 10 KB peeks grew RSS by %.0f KB before the client read, "
             "then all 20 MB came in order; a Gearman client reading nothing was closed after %.1f MB of "
             "results (%d bytes had reached it)" % (grew, sent / 1e6, got_gm))
        check(grew < (8192 if ASAN else 2048), "RSS grew by %d KB for one non-reading client" % grew)
        close_all([c, p, client, worker])


def test_job_memory_ceiling():
    """--max-job-memory: each ready job counts its body + 2 + 64. Puts up to exactly
    the ceiling are taken; one byte over gets OUT_OF_MEMORY (beanstalk), 503
    OUT_OF_MEMORY (HTTP) and an ERROR packet (Gearman); /readyz says why while
    not even an empty job fits; a delete makes room."""
    per = 64 + 12  # a 10-byte body (never reserved: no side record)
    with Server(["--max-job-memory", str(3 * per)], http=True, gearman=True) as srv:
        c = srv.connect()
        for i in range(2):
            command(c, b"put 0 0 60 10\r\n0123456789\r\n", b"INSERTED")
        status, _ = srv.http_get("/readyz")
        check_eq(status, 200, "/readyz below the ceiling")
        command(c, b"put 0 0 60 11\r\n0123456789x\r\n", b"OUT_OF_MEMORY\r\n")  # one byte over
        command(c, b"put 0 0 60 10\r\n0123456789\r\n", b"INSERTED")             # exactly at it
        check_eq(srv.metric("beangate_job_memory_bytes"), float(3 * per), "beangate_job_memory_bytes")
        command(c, b"put 0 0 60 0\r\n\r\n", b"OUT_OF_MEMORY\r\n")
        status, body = srv.http_get("/readyz")
        check_eq(status, 503, "/readyz at the ceiling")
        check(b'"OUT_OF_MEMORY"' in body and b"--max-job-memory" in body, "/readyz's problem: %r" % body)
        status, body = srv.http_post("/tubes/default/jobs", b"x")
        check_eq(status, 503, "an HTTP put at the ceiling")
        check(b'"OUT_OF_MEMORY"' in body and b"--max-job-memory" in body, "the HTTP put's problem: %r" % body)
        gm = srv.connect(srv.gm_port)
        gm.sendall(gm_packet(GM_SUBMIT_JOB_BG, b"f", b"", b"x"))
        kind, args = gm_read_packet(gm)
        check_eq((kind, args[0]), (GM_ERROR, b"OUT_OF_MEMORY"), "a Gearman submit at the ceiling")
        command(c, b"delete 1\r\n", b"DELETED")
        check_eq(srv.http_get("/readyz")[0], 200, "/readyz after a delete")
        command(c, b"put 0 0 60 10\r\n0123456789\r\n", b"INSERTED")
        stats = command(c, b"stats\r\n")
        check(b"current-jobs-ready: 3\n" in stats, "3 jobs at the end")
        note("--max-job-memory %d (3 jobs of 10 bytes): the 3rd fits exactly, 1 byte over and an empty job "
             "refused on beanstalk, HTTP 503, Gearman ERROR, /readyz 503 OUT_OF_MEMORY; a delete makes room"
             % (3 * per))
        close_all([c, gm])


def test_job_memory_ceiling_after_restart():
    """A log with more jobs than the ceiling: a restart keeps them all, then
    refuses puts (and /readyz says why) until deletes bring it below."""
    per = 64 + 3  # a 1-byte body
    with tempfile.TemporaryDirectory() as logdir:
        with Server(logdir=logdir, args=["-f", "0"]) as srv:
            c = srv.connect()
            for _ in range(5):
                command(c, b"put 0 0 60 1\r\nj\r\n", b"INSERTED")
            c.close()
        with Server(["--max-job-memory", str(2 * per), "-f", "0"], http=True, logdir=logdir) as srv:
            c = srv.connect()
            stats = command(c, b"stats\r\n")
            check(b"current-jobs-ready: 5\n" in stats, "all 5 logged jobs came back: %r" % stats[:400])
            check_eq(srv.http_get("/readyz")[0], 503, "/readyz over the ceiling after a restart")
            command(c, b"put 0 0 60 1\r\nk\r\n", b"OUT_OF_MEMORY\r\n")
            for i in range(1, 5):
                command(c, b"delete %d\r\n" % i, b"DELETED")
            check_eq(srv.http_get("/readyz")[0], 200, "/readyz once below the ceiling")
            command(c, b"put 0 0 60 1\r\nk\r\n", b"INSERTED 6\r\n")
            note("5 logged jobs over a ceiling of 2: all kept, puts refused, /readyz 503 until 4 were deleted")
            c.close()


# ---- strict numbers, quiet disconnects --------------------------------------------

def test_gearman_numbers_are_strict():
    """gearmand (atoi) takes SUBMIT_JOB_EPOCH "abc" as delay 0 and answers
    `maxqueue f -1` OK; beangate answers an error for each."""
    with Server(gearman=True) as srv:
        gm = srv.connect(srv.gm_port)
        for epoch in (b"abc", b"", b"-5", b"99999999999999999999999"):
            gm.sendall(gm_packet(GM_SUBMIT_JOB_EPOCH, b"f", b"", epoch, b"data"))
            kind, args = gm_read_packet(gm)
            check_eq((kind, args[0]), (GM_ERROR, b"INVALID_ARGUMENT"), "SUBMIT_JOB_EPOCH %r" % epoch)
        gm.sendall(gm_packet(GM_CAN_DO_TIMEOUT, b"f", b"ten"))
        kind, args = gm_read_packet(gm)
        check_eq((kind, args[0]), (GM_ERROR, b"INVALID_ARGUMENT"), "CAN_DO_TIMEOUT f ten")
        admin = srv.connect(srv.gm_port)
        for line in (b"maxqueue f -1\n", b"maxqueue f abc\n"):
            admin.sendall(line)
            reply = command(admin, b"")
            check(reply.startswith(b"ERR INVALID_ARGUMENTS "), "%r: %r" % (line, reply))
        c = srv.connect()
        stats = command(c, b"stats\r\n")
        check(b"total-jobs: 0\n" in stats, "no job was made by the refused submits")
        close_all([gm, admin, c])


def test_disconnects_are_quiet():
    """200 clients that leave mid-line, mid-body or at once write no warn
    line (issue 13: one warning each); with -VV each is one debug line."""
    with Server() as srv:
        for k in range(200):
            s = srv.connect()
            s.sendall([b"put 0 0 60 100\r\nhalf a bo", b"stats-tu", b""][k % 3])
            if k % 2:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # a reset
            s.close()
        c = srv.connect()
        wait_until(lambda: b"current-connections: 1\n" in command(c, b"stats\r\n"), "the 200 to be closed")
        warns = [line for line in srv.stderr().splitlines() if "level=warn" in line or "level=error" in line]
        check_eq(warns, [], "warn lines after 200 clients left mid-request")
        c.close()
    with Server(["-VV"]) as srv:
        for k in range(20):
            s = srv.connect()
            s.sendall(b"put 0 0 60 100\r\nhalf")
            s.close()
        c = srv.connect()
        wait_until(lambda: b"current-connections: 1\n" in command(c, b"stats\r\n"), "the 20 to be closed")
        closed = srv.lines("event=closed")
        check(len(closed) >= 20 and all("level=debug" in line for line in closed),
              "-VV: %d closed lines: %s" % (len(closed), closed[:2]))
        note("200 clients leaving mid-request: 0 warn lines; with -VV %d debug lines" % len(closed))
        c.close()


TESTS = [
    test_p99_with_slow_clients,
    test_rss_bounded_partial_lines,
    test_rss_bounded_non_reading_pipeliners,
    test_rss_bounded_non_reading_listers,
    test_fd_limit_default_cap,
    test_fd_limit_accept_pauses,
    test_max_connections,
    test_max_connections_per_ip,
    test_request_timeout,
    test_idle_timeout,
    test_input_limit,
    test_output_limit,
    test_job_memory_ceiling,
    test_job_memory_ceiling_after_restart,
    test_gearman_numbers_are_strict,
    test_disconnects_are_quiet,
]


def main(argv):
    global BINARY, ASAN, SLOW_CLIENTS, TLS
    parser = testlib.arg_parser(__doc__)
    parser.add_argument("--tls", action="store_true", help="run against the TLS ports (issue 23)")
    args = testlib.parse_args(parser, argv)
    BINARY = args.binary
    skip = None
    if args.tls:
        TLS = TLSFiles()
        skip = lambda fn: TLS_SKIPS.get(fn.__name__)  # noqa: E731
        print("TLS mode: every client over TLS on --tls-port / --gearman-tls-port", flush=True)
    ASAN = testlib.is_asan_build(BINARY)
    if ASAN:
        SLOW_CLIENTS = 1000
        print("ASan build: %d slow clients instead of 5000, looser memory bounds" % SLOW_CLIENTS, flush=True)
    try:
        return testlib.run("hostile_tcp_tls" if TLS else "hostile_tcp", TESTS, args, namespace=globals(),
                           skip=skip)
    finally:
        if TLS:
            shutil.rmtree(TLS.dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
