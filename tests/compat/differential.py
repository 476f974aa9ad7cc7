#!/usr/bin/env python3
"""Differential protocol test: a candidate server (beangate) against Debian's
beanstalkd (the reference).

For every stream a fresh reference process and a fresh candidate process are
started on free loopback ports with identical flags.  A seeded generator
produces a random sequence of "units" (the bytes of one or a few commands,
sent with one write on one of 2-4 client connections).  Every unit is sent
byte-for-byte identically to both servers; the complete reply of that unit is
collected from both before the next unit is sent anywhere, so the shared
server state evolves identically.  Replies are compared byte for byte, except
for the stats fields that depend on time or on the process (those values are
masked, together with the resulting `OK <n>` length difference).

The generator is driven by the *reference* replies (job ids it learned,
which tubes are watched and have ready jobs ...), so a stream is fully
determined by (seed, stream index, reference behaviour).

Usage:
  differential.py CANDIDATE [--reference /usr/bin/beanstalkd]
                  [--seed S] [--streams 40] [--commands 300] [--only I[,J..]]
                  [--jobs 4] [--save DIR] [--skip-kinds K1,K2] [--coverage]
                  [--timeout 2] [--quiet-ms 40] [--repr-limit 6000] [-q]
  differential.py --against-reference ...      (reference vs reference)
  differential.py CANDIDATE --replay DIR/stream-SEED-I.json

  --seed/--only/--commands reproduce one stream exactly (the divergence
  report prints the command line).  --save writes stream-SEED-I.json (all
  units up to the failing one, base64) and a readable .txt next to it;
  --replay re-sends such a file to fresh servers.  --skip-kinds leaves out
  generator kinds, to look past a bug that is already known.
  DIFF_DEBUG=1 reports units where the reference itself timed out (would be
  a generator bug: the generator must never make the reference wait).

Framing: every unit's reply size is predicted (one line; RESERVED/FOUND/OK
<n> carry n+2 more bytes; a model of the reference's 224-byte line window
predicts over-long lines, stray CRs and put bodies re-read as commands);
only after EXPECTED_CRLF for a malformed put header is the connection read
until it is quiet for --quiet-ms.

Summary line printed last:  differential: N passed, M failed
Exit status: 0 all streams identical, 1 divergence(s), 2 setup error,
130 interrupted.
"""

import argparse
import atexit
import base64
import json
import os
import random
import select
import signal
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import testlib  # noqa: E402
from testlib import free_port, wait_ready  # noqa: E402

REFERENCE_DEFAULT = "/usr/bin/beanstalkd"
DEFAULT_MAX_JOB = 65535
LINE_WINDOW = 224  # reference reads command lines through a 224-byte window

# --------------------------------------------------------------------------
# process bookkeeping: every server we start is killed at exit / on signals
# --------------------------------------------------------------------------

_PROCS = set()
_PROCS_LOCK = threading.Lock()
STOP = threading.Event()


def _kill_proc(p):
    try:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=5)
    except Exception:
        pass


def kill_all_servers():
    with _PROCS_LOCK:
        procs = list(_PROCS)
        _PROCS.clear()
    for p in procs:
        _kill_proc(p)


atexit.register(kill_all_servers)


def _on_signal(signum, frame):
    STOP.set()
    kill_all_servers()
    raise KeyboardInterrupt("signal %d" % signum)


class SetupError(Exception):
    pass


class Server(testlib.ServerProcess):
    """One server process listening on a free loopback port."""

    def __init__(self, binary, zlimit, label):
        super().__init__()
        self.binary = binary
        self.zlimit = zlimit
        self.label = label
        self.port = None

    def start(self):
        last = None
        for _attempt in range(5):
            self.port = free_port()
            args = [self.binary, "-l", "127.0.0.1", "-p", str(self.port)]
            if self.zlimit is not None:
                args += ["-z", str(self.zlimit)]
            if self.label == "candidate":
                # e.g. CANDIDATE_ARGS=--no-http: flags only beangate knows
                args += os.environ.get("CANDIDATE_ARGS", "").split()
            with _PROCS_LOCK:
                if STOP.is_set():
                    raise KeyboardInterrupt()
                _PROCS.add(self.spawn(args))
            # wait until it listens (probe with a bare TCP connect that is
            # refused until the listener exists; a refused connect is never
            # seen by the server, so it does not disturb the counters)
            if wait_ready(self.proc, self._port_listening, 5.0, step=0.002) == "ok":
                return
            last = self.stderr_text()
            self.stop()
        raise SetupError("%s (%s) did not start: %s" % (self.label, self.binary, last))

    def _port_listening(self):
        # Look at the kernel's listening sockets instead of connecting (a
        # successful probe connection would be counted by the server).
        try:
            with open("/proc/net/tcp") as f:
                want = ":%04X" % self.port
                for line in f:
                    parts = line.split()
                    if len(parts) > 3 and parts[1].endswith(want) and parts[3] == "0A":
                        return True
        except OSError:
            return True  # no /proc: fall back to connect-with-retry later
        return False

    def stderr_text(self):
        return self.stderr()[-2000:]

    def connect(self):
        got = []

        def connect_once():
            got.append(socket.create_connection(("127.0.0.1", self.port), timeout=5))
            return True
        if wait_ready(self.proc, connect_once, 5.0, step=0.002, not_yet=(ConnectionRefusedError,)) != "ok":
            raise SetupError("cannot connect to %s: %s" % (self.label, self.stderr_text()))
        s = got[0]
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setblocking(False)
        return s

    def stop(self):
        if self.proc is not None:
            _kill_proc(self.proc)
            with _PROCS_LOCK:
                _PROCS.discard(self.proc)
            self.proc = None


# --------------------------------------------------------------------------
# reply framing
# --------------------------------------------------------------------------

ACCEPT_PUT = (b"INSERTED", b"BURIED", b"JOB_TOO_BIG", b"EXPECTED_CRLF", b"DRAINING")


def split_frame(buf):
    """Return the length of the first complete reply frame in buf, or 0.
    A frame is a line; `RESERVED <id> <n>`, `FOUND <id> <n>` and `OK <n>`
    lines are followed by n bytes plus CRLF."""
    i = buf.find(b"\r\n")
    if i < 0:
        return 0
    parts = bytes(buf[:i]).split(b" ")
    need = 0
    if parts[0] in (b"RESERVED", b"FOUND") and len(parts) == 3 and parts[2].isdigit():
        need = int(parts[2]) + 2
    elif parts[0] == b"OK" and len(parts) == 2 and parts[1].isdigit():
        need = int(parts[1]) + 2
    total = i + 2 + need
    return total if len(buf) >= total else 0


class Side:
    """Client end of one connection to one server."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = bytearray()
        self.eof = False

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


class Result:
    __slots__ = ("frames", "status", "extra")

    def __init__(self):
        self.frames = []
        self.status = "ok"   # ok | eof | timeout
        self.extra = b""     # unframed / unexpected trailing bytes

    def raw(self):
        return b"".join(self.frames) + self.extra

    def describe(self):
        s = repr(self.raw())
        if self.status != "ok":
            s += "  <%s>" % self.status.upper()
        return s


def collect(sides, expect, timeout, quiet):
    """Collect the replies of one unit from every side concurrently.

    expect: ('one',) | ('count', k) | ('put', k_or_None) | ('putq',) | ('eof',)
            | ('quiet',)
      put: one frame; if it is not an accepting reply (INSERTED, JOB_TOO_BIG,
      ...) the body was taken as commands: then k more frames, or (k None)
      everything until the connection is quiet for `quiet` seconds.
      putq: one frame, then everything until quiet.
      putbad (malformed put header): one frame; if the header was refused,
      the body lines were commands: k more frames; after EXPECTED_CRLF
      (header accepted with a shorter count) everything until quiet.
      oneeof: one frame or end of file.
    """
    start = time.monotonic()
    n = len(sides)
    res = [Result() for _ in range(n)]
    want = [None] * n      # remaining frames wanted, or 'quiet' / 'eof'
    done = [False] * n
    last_rx = [start] * n
    kind = expect[0]
    for i in range(n):
        if kind in ("one", "oneeof"):
            want[i] = 1
        elif kind == "count":
            want[i] = expect[1]
        elif kind in ("put", "putq", "putbad"):
            want[i] = "put"
        else:
            want[i] = kind

    def advance(i):
        side = sides[i]
        while True:
            if want[i] == 0:
                done[i] = True
                return
            ln = split_frame(side.buf)
            if not ln:
                break
            frame = bytes(side.buf[:ln])
            del side.buf[:ln]
            res[i].frames.append(frame)
            if want[i] == "put":
                word = frame.split(b"\r\n", 1)[0].split(b" ", 1)[0]
                if kind == "putq":
                    want[i] = "quiet"
                elif kind == "putbad":
                    if word in (b"INSERTED", b"BURIED", b"JOB_TOO_BIG", b"DRAINING"):
                        want[i] = 0
                    elif word == b"EXPECTED_CRLF":
                        want[i] = "quiet"   # header took part of the body
                    else:
                        want[i] = expect[1]
                elif word in ACCEPT_PUT:
                    want[i] = 0
                elif expect[1] is None:
                    want[i] = "quiet"
                else:
                    want[i] = expect[1]
            elif isinstance(want[i], int):
                want[i] -= 1
        if want[i] == 0:
            done[i] = True
            return
        if side.eof:
            res[i].status = "eof"
            done[i] = True

    while True:
        for i in range(n):
            if not done[i]:
                advance(i)
        now = time.monotonic()
        for i in range(n):
            if done[i]:
                continue
            if want[i] == "quiet" and not sides[i].buf and now - last_rx[i] >= quiet:
                done[i] = True
            elif now - start >= timeout:
                res[i].status = "timeout"
                done[i] = True
        if all(done):
            break
        waits = [start + timeout - now]
        for i in range(n):
            if not done[i] and want[i] == "quiet":
                waits.append(last_rx[i] + quiet - now)
        w = max(0.0, min(waits))
        socks = {sides[i].sock: i for i in range(n) if not done[i] and not sides[i].eof}
        if not socks:
            continue
        try:
            r, _, _ = select.select(list(socks), [], [], w)
        except (OSError, ValueError):
            r = []
        for s in r:
            i = socks[s]
            try:
                data = s.recv(1 << 20)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data = b""
            if data:
                sides[i].buf += data
                last_rx[i] = time.monotonic()
            else:
                sides[i].eof = True
    for i in range(n):
        # anything left over is output nobody asked for
        res[i].extra = bytes(sides[i].buf)
        sides[i].buf.clear()
        if sides[i].eof and res[i].status == "ok":
            res[i].status = "eof"
    return res


def drain_pending(side):
    """Pick up bytes a server sent outside any unit (should never happen)."""
    while not side.eof:
        try:
            data = side.sock.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            side.eof = True
            return
        side.buf += data


# --------------------------------------------------------------------------
# masking of time / process dependent stats values
# --------------------------------------------------------------------------

MASK_SERVER = {b"pid", b"version", b"rusage-utime", b"rusage-stime", b"uptime",
               b"id", b"hostname", b"os", b"platform"}
MASK_JOB = {b"age", b"time-left"}
MASK_TUBE = {b"pause-time-left"}


def mask_frame(frame, problems):
    """Return a comparable version of one reply frame."""
    if not frame.startswith(b"OK "):
        return frame
    hdr_end = frame.find(b"\r\n")
    header = frame[:hdr_end]
    try:
        n = int(header[3:])
    except ValueError:
        return frame
    payload = frame[hdr_end + 2:-2]
    if len(payload) != n or frame[-2:] != b"\r\n":
        problems.append("OK %d payload has %d bytes / bad trailer" % (n, len(payload)))
        return frame
    lines = payload.split(b"\n")
    if not lines or lines[0] != b"---" or lines[-1] != b"":
        return frame
    keys = set()
    for ln in lines[1:-1]:
        k, sep, _ = ln.partition(b": ")
        if not sep:
            return frame  # a list (list-tubes ...) or something else
        keys.add(k)
    if b"current-jobs-urgent" in keys and b"uptime" in keys:
        mask = MASK_SERVER
    elif b"time-left" in keys and b"reserves" in keys:
        mask = MASK_JOB
    elif b"pause-time-left" in keys:
        mask = MASK_TUBE
    else:
        return frame
    out = [lines[0]]
    masked = False
    for ln in lines[1:-1]:
        k, sep, v = ln.partition(b": ")
        if k in mask:
            out.append(k + b": <masked>")
            masked = True
        else:
            out.append(ln)
    out.append(b"")
    if not masked:
        return frame
    return b"OK <masked-len>\r\n" + b"\n".join(out) + b"\r\n"


def normalize(res):
    problems = []
    frames = tuple(mask_frame(f, problems) for f in res.frames)
    return (frames, res.status, res.extra), problems


# --------------------------------------------------------------------------
# the generator
# --------------------------------------------------------------------------


class Unit:
    __slots__ = ("conn", "data", "expect", "kind")

    def __init__(self, conn, data, expect, kind):
        self.conn = conn
        self.data = data
        self.expect = expect
        self.kind = kind

    def to_json(self):
        return {"conn": self.conn, "kind": self.kind, "expect": list(self.expect),
                "data_b64": base64.b64encode(self.data).decode()}

    @staticmethod
    def from_json(d):
        exp = d["expect"]
        return Unit(d["conn"], base64.b64decode(d["data_b64"]),
                    tuple(exp), d.get("kind", "?"))


def sim_lines(data):
    """Model of the reference's line reader: command lines are read through
    a 224-byte window; a line ends at the first CR of the window if (and
    only if) an LF follows it inside the window; a full window without a
    line end is discarded and the reader then skips to the next line end,
    answering BAD_FORMAT once there.

    Returns (clean, replies, long_lines): clean -- every byte of `data` is
    consumed once it has all arrived (nothing stays buffered); replies --
    number of replies if every complete line yields exactly one; long_lines
    -- a window was discarded."""
    pos = 0
    replies = 0
    long_lines = False
    while pos < len(data):
        win = data[pos:pos + LINE_WINDOW]
        cr = win.find(b"\r", 0, max(len(win) - 1, 0))
        if cr >= 0 and win[cr + 1:cr + 2] == b"\n":
            pos += cr + 2
            replies += 1
            continue
        if len(win) < LINE_WINDOW:
            return False, replies, long_lines
        # a full window with no line end is discarded; the rest of the over-long
        # line goes through the same window rule, and its end yields one reply
        long_lines = True
        pos += LINE_WINDOW
    return True, replies, long_lines


def sim_clean(data):
    clean, _, long_lines = sim_lines(data)
    return clean, long_lines


VALID_TUBES = [b"default", b"alpha", b"beta", b"gamma", b"a-b", b"x+y/z;.$()",
               b"under_score", b"9lives", b"T" * 200, b"Q" * 199 + b"z"]
BAD_TUBES = [b"-lead", b"a b", b"bad*", b"bad!", b"Z" * 201, b"caf\xc3\xa9",
             b"a\x00b", b"a\tb", b"", b"tab\t", b"x:y", b"a,b", b"@home", b"~",
             b"default ", b" default", b"#", b"a%b", b"\x00"]
SAFE_ALPHA = (b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789#@!%&*=<>?[]{}~^|:,'\"\t"
              b"\x00\x01\x7f\x80\xfe\xff")
SAFE_FIRST = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ#@!%&*="
BIG_DELAYS = [1000, 5000, 86400, 1000000, 4294967295]
TTRS = [100, 120, 3600, 86400, 4294967295]
PRIS = [0, 1, 2, 10, 100, 512, 1023, 1024, 1025, 65536, 2147483648, 4294967294, 4294967295]
UNKNOWN_WORDS = [b"PUT 0 0 100 1", b"STATS", b"Stats", b"help", b"list", b"list-tube",
                 b"listtubes", b"stats-tubes default", b"peekx", b"peek-all",
                 b"kickjob 1", b"kick-jobs 1", b"delete-all", b"touchx 1", b"watchx default",
                 b"use", b"watch", b"ignore", b"bury", b"touch", b"release", b"delete",
                 b"stats-job", b"reserve-job", b"pause-tube", b"pause-tube default",
                 b"peek-", b"stat", b"list-tubes-watche", b"list-tube-use", b"q", b"x",
                 b"\x00", b"\x00stats", b" stats", b"\tstats", b" use default",
                 b"drain", b"shutdown", b"version", b"auth x", b"get 1", b"set a b",
                 b"kick-job", b"reserve-jobs 1", b"delete1", b"bury1 0"]
EXPECT_ONE = ("one",)
EXPECT_QUIET = ("quiet",)
EXPECT_PUT = ("put", None)
EXPECT_PUTQ = ("putq",)


class ConnModel:
    def __init__(self):
        self.used = b"default"
        self.watched = [b"default"]
        self.reserved = []


class Generator:
    """Produces units; is told every reference result via observe()."""

    def __init__(self, rng, zlimit, nconns, ncommands, skip_kinds=()):
        self.rng = rng
        self.zlimit = zlimit
        self.maxjob = zlimit if zlimit is not None else DEFAULT_MAX_JOB
        self.nconns = nconns
        self.ncommands = ncommands
        self.count = 0
        self.conns = [ConnModel() for _ in range(nconns)]
        self.jobs = []          # ids seen (in order)
        self.job_set = set()
        self.deleted = set()
        self.tubes = rng.sample(VALID_TUBES[1:], rng.randint(2, 5)) + [b"default"]
        self.pending = {}       # unit -> meta for observe
        weights = {
            "put": 16, "put_limit": 2, "put_trailer": 1.5, "put_bad": 3,
            "short_timer": 0.6, "use": 4, "watch": 3.5, "ignore": 2.5,
            "reserve0": 6, "reserve_bad": 0.8, "reserve_block": 3, "reserve_job": 3,
            "delete": 5, "release": 4, "bury": 3, "touch": 2, "peek": 3,
            "peek_state": 4, "kick": 2, "kick_job": 2, "stats_job": 3,
            "stats_tube": 2, "stats": 1.5, "list": 3, "pause": 1, "quit": 0.8,
            "mutated": 5, "unknown": 2, "empty": 1, "long_line": 1,
            "stray_cr": 0.3, "pipeline": 1.2,
        }
        for k in skip_kinds:
            if k not in weights:
                raise SystemExit("unknown kind %r (known: %s)" % (k, ", ".join(weights)))
            weights[k] = 0
        self.kinds = list(weights)
        self.weights = [weights[k] for k in self.kinds]

    # ---- helpers
    def c(self):
        return self.rng.randrange(self.nconns)

    def tube(self):
        if self.rng.random() < 0.9:
            return self.rng.choice(self.tubes)
        return self.rng.choice(VALID_TUBES)

    def bad_tube(self):
        return self.rng.choice(BAD_TUBES)

    def live_ids(self):
        return [j for j in self.jobs if j not in self.deleted]

    def some_id(self, c=None):
        r = self.rng.random()
        if c is not None and self.conns[c].reserved and r < 0.45:
            return self.rng.choice(self.conns[c].reserved)
        live = self.live_ids()
        if live and r < 0.85:
            return self.rng.choice(live)
        if self.jobs and r < 0.92:
            return self.rng.choice(self.jobs)
        top = max(self.jobs) if self.jobs else 0
        return self.rng.choice([0, top + 1, top + 7, 18446744073709551615])

    def pri(self):
        return self.rng.choice(PRIS) if self.rng.random() < 0.6 else self.rng.randrange(0, 3000)

    def delay(self):
        return 0 if self.rng.random() < 0.8 else self.rng.choice(BIG_DELAYS)

    def body(self, n):
        r = self.rng.random()
        rng = self.rng
        if r < 0.35:
            return rng.randbytes(n)
        if r < 0.6:
            out = bytearray(rng.choice(b"abcdefghijklmnopqrstuvwxyz 0123456789") for _ in range(n))
        else:
            out = bytearray(rng.choice(b"\r\n\x00 ABCrn\xff") for _ in range(n))
        for _ in range(rng.randint(0, 3)):
            if n >= 2:
                p = rng.randrange(n - 1)
                out[p:p + 2] = b"\r\n"
        return bytes(out)

    def safe_text(self, lo, hi, allow_lf=True):
        """Bytes that can never form a command name nor a stray CR."""
        n = self.rng.randint(lo, hi)
        if n == 0:
            return b""
        alpha = SAFE_ALPHA + (b"\n" if allow_lf else b"")
        return bytes([self.rng.choice(SAFE_FIRST)]) + bytes(
            self.rng.choice(alpha) for _ in range(n - 1))

    def num_variant(self, base, kind):
        """A malformed (or odd-but-maybe-accepted) spelling of `base` such
        that any plausible parse of it yields either an error, `base`, or
        `base` modulo 2**32 / 2**64 -- so a 'big' delay never becomes small."""
        b = str(base).encode()
        v = [b"-" + b, b"+" + b, b + b"x", b + b"e5", b + b".5", b"0" + b, b"00" + b,
             str(2 ** 32 + base).encode(), str(2 ** 64 + base).encode(),
             str(10 ** 25 + base).encode(), b"", b"abc", b"x" + b, b + b"\x00" + b"9",
             b"\x00" + b, b"\xd9\xa3"]
        if kind == "id":
            v += [b"-1", b"0x1", b"18446744073709551615", b"18446744073709551616", b"1 1"]
        if kind == "count":
            v += [b"1" + b"\x00" + b]
        return self.rng.choice(v)

    # ---- observe reference results
    def observe(self, unit, res):
        self.count += 1
        meta = self.pending.pop(unit, {})
        c = unit.conn
        cm = self.conns[c]
        for f in res.frames:
            line = f.split(b"\r\n", 1)[0]
            parts = line.split(b" ")
            w = parts[0]
            if w in (b"INSERTED", b"BURIED", b"RESERVED", b"FOUND") and len(parts) >= 2 \
                    and parts[1].isdigit():
                jid = int(parts[1])
                if jid not in self.job_set:
                    self.job_set.add(jid)
                    self.jobs.append(jid)
                if w == b"RESERVED" and jid not in cm.reserved:
                    cm.reserved.append(jid)
            elif w == b"USING" and len(parts) == 2:
                cm.used = parts[1]
                if parts[1] not in self.tubes:
                    self.tubes.append(parts[1])
            elif w == b"WATCHING" and "watch" in meta:
                if meta["watch"] not in cm.watched:
                    cm.watched.append(meta["watch"])
            elif w == b"WATCHING" and "ignore" in meta:
                if meta["ignore"] in cm.watched:
                    cm.watched.remove(meta["ignore"])
            elif w == b"DELETED" and "id" in meta:
                self.deleted.add(meta["id"])
                for m in self.conns:
                    if meta["id"] in m.reserved:
                        m.reserved.remove(meta["id"])
            elif w in (b"RELEASED", b"BURIED") and "id" in meta:
                if meta["id"] in cm.reserved:
                    cm.reserved.remove(meta["id"])
        if unit.data == b"list-tubes-watched\r\n" and res.frames \
                and res.frames[0].startswith(b"OK "):
            body = res.frames[0].split(b"\r\n", 1)[1]
            cm.watched = [ln[2:] for ln in body.split(b"\n") if ln.startswith(b"- ")]
        if res.status == "eof":
            self.conns[c] = ConnModel()

    def unit(self, c, data, expect=EXPECT_ONE, kind="?", check=True, **meta):
        if check and expect[0] in ("one", "count", "quiet"):
            clean, replies, long_lines = sim_lines(data)
            if not clean:
                data += b"\r\n"
                clean, replies, long_lines = sim_lines(data)
            if not clean:
                expect = EXPECT_QUIET
            elif long_lines or expect[0] == "quiet":
                expect = ("count", replies)
        u = Unit(c, data, expect, kind)
        if meta:
            self.pending[u] = meta
        return u

    # ---- the stream
    def units(self):
        while self.count < self.ncommands:
            kind = self.rng.choices(self.kinds, self.weights)[0]
            yield from getattr(self, "g_" + kind)()

    # ---- plans (each is a generator; `res = yield unit` gets the reference result)
    def put_line(self, pri, delay, ttr, n):
        return b"put %d %d %d %d\r\n" % (pri, delay, ttr, n)

    def g_put(self):
        c = self.c()
        r = self.rng.random()
        if r < 0.15:
            n = 0
        elif r < 0.75:
            n = self.rng.randint(1, 40)
        else:
            n = self.rng.randint(1, min(self.maxjob, 2000))
        yield self.unit(c, self.put_line(self.pri(), self.delay(), self.rng.choice(TTRS), n)
                        + self.body(n) + b"\r\n", EXPECT_PUT, "put")

    def g_put_limit(self):
        c = self.c()
        z = self.maxjob
        n = self.rng.choice([z - 1, z, z, z + 1, z + 1, z + 2, 2 * z + 5])
        if n < 0:
            n = 0
        line = b"put %d %d %d %d" % (self.pri(), self.delay(), self.rng.choice(TTRS), n)
        if n > z and self.rng.random() < 0.3:
            line += self.rng.choice([b" junk", b" ", b"x", b" 1"])
        trailer = b"\r\n" if self.rng.random() < 0.8 else b"XY"
        yield self.unit(c, line + b"\r\n" + self.body(n) + trailer, EXPECT_PUT, "put-limit")

    def g_put_trailer(self):
        c = self.c()
        n = self.rng.randint(0, 30)
        trailer = self.rng.choice([b"XY", b"\n\r", b"\r\r", b"\n\n", b"\x00\x00",
                                   b"\r\x00", b" \n", b"\rX", b"X\n"])
        yield self.unit(c, self.put_line(self.pri(), self.delay(), self.rng.choice(TTRS), n)
                        + self.body(n) + trailer, EXPECT_PUT, "put-trailer")

    def g_put_bad(self):
        rng = self.rng
        c = self.c()
        # the body comes first: whatever the header, an accepting parse of
        # it must not expect more bytes than we send
        if rng.random() < 0.5:
            body = self.safe_text(0, 60, allow_lf=True)
        else:
            # a body that is itself a harmless command when taken as a line
            body = rng.choice([b"list-tube-used", b"stats-tube default", b"peek-ready",
                               b"list-tubes-watched", b"peek-buried"])
            if rng.random() < 0.5:
                body += b"\r\n" + self.safe_text(1, 20)
        n = len(body)
        fields = [str(self.pri()).encode(), str(self.delay()).encode(),
                  str(rng.choice(TTRS)).encode(), str(n).encode()]
        which = rng.randrange(9)
        seps = [b" "] * 4
        tail = b""
        cmd = b"put"
        if which <= 3:
            kind = ["pri", "delay", "ttr", "count"][which]
            base = int(fields[which])
            fields[which] = self.num_variant(base, kind)
        elif which == 4:
            del fields[rng.randrange(4)]
            seps = seps[:3]
        elif which == 5:
            tail = rng.choice([b" ", b" 1", b" extra", b"\t", b"  ", b"\x00junk", b" \x00"])
        elif which == 6:
            seps[rng.randrange(4)] = rng.choice([b"  ", b"\t", b" \t", b"\x00"])
        elif which == 7:
            cmd = rng.choice([b"PUT", b"Put", b"put\t", b"putt", b"put ", b" put", b"pu"])
        else:
            # several fields spelled oddly (leading zeros etc)
            for k in range(4):
                if rng.random() < 0.5:
                    fields[k] = b"0" + fields[k]
        line = cmd
        for s, f in zip(seps, fields):
            line += s + f
        line += tail
        if sim_clean(line + b"\r\n")[1]:
            line = line[:150]
        k = sim_lines(body + b"\r\n")[1]
        yield self.unit(c, line + b"\r\n" + body + b"\r\n", ("putbad", k), "put-bad")

    def g_short_timer(self):
        """Put a job with a tiny ttr or delay, look at it and delete it
        before the timer can possibly fire.  Nothing else runs meanwhile."""
        rng = self.rng
        c = self.c()
        if rng.random() < 0.5:
            ttr, delay = rng.choice([0, 1, 2]), 0
        else:
            ttr, delay = 100, rng.choice([2, 30])
        res = yield self.unit(c, self.put_line(self.pri(), delay, ttr, 3) + b"abc\r\n",
                              EXPECT_PUT, "put-short")
        line = res.frames[0] if res.frames else b""
        if not line.startswith(b"INSERTED "):
            return
        jid = int(line.split()[1])
        if delay == 0 and ttr >= 1 and rng.random() < 0.5:
            yield self.unit(c, b"reserve-job %d\r\n" % jid, kind="reserve-job", id=jid)
        yield self.unit(c, b"stats-job %d\r\n" % jid, kind="stats-job")
        yield self.unit(c, b"delete %d\r\n" % jid, kind="delete", id=jid)

    def g_use(self):
        name = self.tube() if self.rng.random() < 0.85 else self.bad_tube()
        yield self.unit(self.c(), b"use " + name + b"\r\n", kind="use")

    def g_watch(self):
        ok = self.rng.random() < 0.85
        name = self.tube() if ok else self.bad_tube()
        if ok:
            yield self.unit(self.c(), b"watch " + name + b"\r\n", kind="watch", watch=name)
        else:
            yield self.unit(self.c(), b"watch " + name + b"\r\n", kind="watch")

    def g_ignore(self):
        c = self.c()
        r = self.rng.random()
        if r < 0.7 and self.conns[c].watched:
            name = self.rng.choice(self.conns[c].watched)
            yield self.unit(c, b"ignore " + name + b"\r\n", kind="ignore", ignore=name)
        elif r < 0.9:
            name = self.tube()
            yield self.unit(c, b"ignore " + name + b"\r\n", kind="ignore", ignore=name)
        else:
            yield self.unit(c, b"ignore " + self.bad_tube() + b"\r\n", kind="ignore")

    def g_reserve0(self):
        yield self.unit(self.c(), b"reserve-with-timeout 0\r\n", kind="reserve0")

    def g_reserve_bad(self):
        # every spelling here means "timeout 0" or is rejected by the reference
        arg = self.rng.choice([b"", b" ", b" abc", b" 0x", b" +0", b" -0", b"  0", b" 0 1",
                               b" 0 ", b" 4294967296", b" -4294967296", b" 00",
                               b" 18446744073709551616", b" 99999999999999999999999"])
        yield self.unit(self.c(), b"reserve-with-timeout" + arg + b"\r\n", kind="reserve-bad")

    def g_reserve_block(self):
        """Blocking `reserve`, only when the reference says a job is ready in
        a watched, unpaused tube (found out with list-tubes-watched and
        stats-tube on the same connection)."""
        c = self.c()
        res = yield self.unit(c, b"list-tubes-watched\r\n", kind="list-tubes-watched")
        watched = []
        if res.frames and res.frames[0].startswith(b"OK "):
            body = res.frames[0].split(b"\r\n", 1)[1]
            for ln in body.split(b"\n"):
                if ln.startswith(b"- "):
                    watched.append(ln[2:])
        ready = False
        for name in watched[:4]:
            res = yield self.unit(c, b"stats-tube " + name + b"\r\n", kind="stats-tube")
            if not res.frames:
                continue
            vals = {}
            for ln in res.frames[0].split(b"\n"):
                k, sep, v = ln.partition(b": ")
                if sep:
                    vals[k] = v
            if vals.get(b"current-jobs-ready", b"0") != b"0" and vals.get(b"pause") == b"0":
                ready = True
                break
        if ready:
            yield self.unit(c, b"reserve\r\n", kind="reserve")
        else:
            yield self.unit(c, b"reserve-with-timeout 0\r\n", kind="reserve0")

    def g_reserve_job(self):
        c = self.c()
        yield self.unit(c, b"reserve-job %d\r\n" % self.some_id(), kind="reserve-job")

    def g_delete(self):
        c = self.c()
        jid = self.some_id(c)
        yield self.unit(c, b"delete %d\r\n" % jid, kind="delete", id=jid)

    def g_release(self):
        c = self.c()
        jid = self.some_id(c)
        delay = 0 if self.rng.random() < 0.6 else self.rng.choice(BIG_DELAYS)
        yield self.unit(c, b"release %d %d %d\r\n" % (jid, self.pri(), delay),
                        kind="release", id=jid)

    def g_bury(self):
        c = self.c()
        jid = self.some_id(c)
        yield self.unit(c, b"bury %d %d\r\n" % (jid, self.pri()), kind="bury", id=jid)

    def g_touch(self):
        c = self.c()
        yield self.unit(c, b"touch %d\r\n" % self.some_id(c), kind="touch")

    def g_peek(self):
        yield self.unit(self.c(), b"peek %d\r\n" % self.some_id(), kind="peek")

    def g_peek_state(self):
        cmd = self.rng.choice([b"peek-ready", b"peek-delayed", b"peek-buried"])
        yield self.unit(self.c(), cmd + b"\r\n", kind="peek-state")

    def g_kick(self):
        n = self.rng.choice([0, 1, 1, 2, 3, 5, 100, 4294967295])
        yield self.unit(self.c(), b"kick %d\r\n" % n, kind="kick")

    def g_kick_job(self):
        yield self.unit(self.c(), b"kick-job %d\r\n" % self.some_id(), kind="kick-job")

    def g_stats_job(self):
        yield self.unit(self.c(), b"stats-job %d\r\n" % self.some_id(), kind="stats-job")

    def g_stats_tube(self):
        r = self.rng.random()
        name = self.tube() if r < 0.8 else (b"nosuchtube" if r < 0.9 else self.bad_tube())
        yield self.unit(self.c(), b"stats-tube " + name + b"\r\n", kind="stats-tube")

    def g_stats(self):
        yield self.unit(self.c(), b"stats\r\n", kind="stats")

    def g_list(self):
        cmd = self.rng.choice([b"list-tubes", b"list-tube-used", b"list-tubes-watched"])
        yield self.unit(self.c(), cmd + b"\r\n", kind="list")

    def g_pause(self):
        r = self.rng.random()
        if r < 0.75:
            name = self.tube()
            arg = b"%d" % self.rng.choice(BIG_DELAYS)
        elif r < 0.85:
            name = b"nosuchtube"
            arg = b"100000"
        else:
            name = self.tube() if self.rng.random() < 0.7 else self.bad_tube()
            arg = self.num_variant(self.rng.choice(BIG_DELAYS), "delay")
        yield self.unit(self.c(), b"pause-tube " + name + b" " + arg + b"\r\n", kind="pause")

    def g_quit(self):
        c = self.c()
        r = self.rng.random()
        if r < 0.8:
            yield self.unit(c, b"quit\r\n", ("eof",), "quit")
        else:
            yield self.unit(c, self.rng.choice([b"quit \r\n", b"quitx\r\n", b"quit 1\r\n",
                                                b"QUIT\r\n", b"qui\r\n", b"quit\x00\r\n"]),
                            ("oneeof",), "quit-variant")

    def g_mutated(self):
        """A valid simple command with one thing wrong (or oddly spelled)."""
        rng = self.rng
        c = self.c()
        templates = [
            (b"use", [self.tube()]), (b"watch", [self.tube()]), (b"ignore", [self.tube()]),
            (b"peek", [b"%d" % self.some_id()]), (b"peek-ready", []), (b"peek-delayed", []),
            (b"peek-buried", []), (b"delete", [b"%d" % self.some_id(c)]),
            (b"touch", [b"%d" % self.some_id(c)]),
            (b"bury", [b"%d" % self.some_id(c), b"%d" % self.pri()]),
            (b"kick", [b"%d" % rng.choice([0, 1, 2, 10])]),
            (b"kick-job", [b"%d" % self.some_id()]), (b"stats-job", [b"%d" % self.some_id()]),
            (b"stats-tube", [self.tube()]), (b"stats", []), (b"list-tubes", []),
            (b"list-tube-used", []), (b"list-tubes-watched", []),
            (b"reserve-job", [b"%d" % self.some_id()]),
        ]
        cmd, args = rng.choice(templates)
        m = rng.randrange(8)
        numeric = bool(args) and args[0].isdigit()
        if m == 0:
            line = b" ".join([cmd] + args) + rng.choice([b" ", b"  ", b"\t", b" extra", b" 1"])
        elif m == 1 and args:
            line = cmd + rng.choice([b"  ", b"\t", b" \t"]) + b" ".join(args)
        elif m == 2:
            line = b" ".join([cmd] + args)
            if not cmd.startswith(b"reserve"):
                p = rng.randrange(len(line) + 1)
                line = line[:p] + b"\x00" + line[p:]
            else:
                line += b"\x00"
        elif m == 3:
            line = b" ".join([cmd.upper()] + args)
        elif m == 4 and numeric:
            args = [self.num_variant(int(args[0]), "id")] + args[1:]
            line = b" ".join([cmd] + args)
        elif m == 5 and args and not numeric:
            line = cmd + b" " + self.bad_tube()
        elif m == 6:
            line = cmd + rng.choice([b"x", b"-", b"s", b"1"]) + (b" " + b" ".join(args) if args else b"")
        else:
            line = b" ".join([cmd] + args + [b"%d" % rng.randrange(5)])
        yield self.unit(c, line + b"\r\n", kind="mutated")

    def g_unknown(self):
        rng = self.rng
        if rng.random() < 0.6:
            line = rng.choice(UNKNOWN_WORDS)
        else:
            line = self.safe_text(1, 150, allow_lf=True)
        yield self.unit(self.c(), line + b"\r\n", kind="unknown")

    def g_empty(self):
        yield self.unit(self.c(), rng_choice(self.rng, [b"\r\n", b"\r\n", b" \r\n", b"\n\r\n"]),
                        kind="empty")

    def g_long_line(self):
        rng = self.rng
        L = rng.randint(220, 600)
        prefix = rng.choice([b"", b"use ", b"stats-tube ", b"watch ", b"delete 1", b"put 0 0 100 5 "])
        name_chars = b"abcdefghijklmnopqrstuvwxyz0123456789-+/;.$()_"
        if prefix and prefix[-1:] == b" " and rng.random() < 0.7:
            filler = bytes(rng.choice(name_chars) for _ in range(L))
        else:
            filler = self.safe_text(L, L, allow_lf=False)
        line = (prefix + filler)[:L]
        data = line + b"\r\n"
        for _ in range(3):
            if sim_clean(data)[0]:
                break
            data = line + b"Z" + b"\r\n"
            line = line + b"Z"
        if rng.random() < 0.3:
            data += b"list-tube-used\r\n"
        yield self.unit(self.c(), data, EXPECT_QUIET, "long-line")

    def g_stray_cr(self):
        rng = self.rng
        head = rng.choice([b"stats\r", b"list-tubes\rx", b"\r", b"use a\rb", b"A\r\rB"])
        L = rng.randint(LINE_WINDOW + 1, 500)
        line = head + self.safe_text(L - len(head), L - len(head), allow_lf=False)
        data = line + b"\r\n"
        while not sim_clean(data)[0]:
            line += b"Z"
            data = line + b"\r\n"
        yield self.unit(self.c(), data, EXPECT_QUIET, "stray-cr")

    def g_pipeline(self):
        rng = self.rng
        c = self.c()
        parts = []
        k = rng.randint(2, 4)
        for _ in range(k):
            r = rng.random()
            if r < 0.3:
                n = rng.randint(0, 20)
                parts.append(self.put_line(self.pri(), self.delay(), rng.choice(TTRS), n)
                             + self.body(n) + b"\r\n")
            elif r < 0.45:
                parts.append(b"reserve-with-timeout 0\r\n")
            else:
                parts.append(rng.choice([b"list-tube-used", b"peek-ready", b"peek-buried",
                                         b"stats-tube default", b"list-tubes", b"kick 1",
                                         b"use " + self.tube(), b"watch " + self.tube(),
                                         b"stats-job %d" % self.some_id(), b"bogus"])
                             + b"\r\n")
        yield self.unit(c, b"".join(parts), ("count", k), "pipeline", check=False)


def rng_choice(rng, seq):
    return rng.choice(seq)


# --------------------------------------------------------------------------
# running a stream
# --------------------------------------------------------------------------


def clip(b, limit):
    r = repr(b)
    if len(r) > limit:
        return r[:limit] + "...<%d bytes total>" % len(b)
    return r


class StreamOutcome:
    def __init__(self, index):
        self.index = index
        self.ok = True
        self.units = 0
        self.seconds = 0.0
        self.lines = []
        self.error = None
        self.stats = {}


def stream_params(seed, index):
    rng = random.Random("%s:%d" % (seed, index))
    r = rng.random()
    zlimit = None if r < 0.55 else (1024 if r < 0.9 else 300)
    nconns = rng.randint(2, 4)
    return rng, zlimit, nconns


def run_units(cfg, index, zlimit, nconns, unit_source, out, label, save_info, stats):
    """Drive one stream.  unit_source: generator of units (send() gets the
    reference result).  Returns True if no divergence."""
    ref = Server(cfg.reference, zlimit, "reference")
    cand = Server(cfg.candidate, zlimit, "candidate")
    conns = [None] * nconns
    history = []
    stats["ref_timeouts"] = stats["quiet_units"] = 0
    t0 = time.monotonic()
    try:
        ref.start()
        cand.start()
        try:
            unit = next(unit_source)
        except StopIteration:
            unit = None
        while unit is not None:
            if STOP.is_set():
                raise KeyboardInterrupt()
            pair = conns[unit.conn]
            if pair is None:
                pair = conns[unit.conn] = [Side(ref.connect()), Side(cand.connect())]
            for side in pair:
                drain_pending(side)
                try:
                    side.sock.settimeout(cfg.timeout)
                    side.sock.sendall(unit.data)
                except OSError:
                    pass  # the reply comparison will show the closed connection
                finally:
                    side.sock.setblocking(False)
            ra, rb = collect(pair, unit.expect, cfg.timeout, cfg.quiet)
            history.append((unit, ra, rb))
            cov = stats.setdefault("coverage", {})
            words = tuple(sorted({f.split(b"\r\n", 1)[0].split(b" ", 1)[0].decode("latin-1")
                                  for f in ra.frames})) or ("<none>",)
            key = (unit.kind, " ".join(words) + ("" if ra.status == "ok" else " +" + ra.status))
            cov[key] = cov.get(key, 0) + 1
            if ra.status == "timeout":
                stats["ref_timeouts"] += 1
                if os.environ.get("DIFF_DEBUG"):
                    out.append("  [debug] reference timed out: stream %d unit %d c%d %s %s -> %s"
                               % (index, len(history) - 1, unit.conn, unit.kind,
                                  clip(unit.data, 300), clip(ra.raw(), 300)))
            if unit.expect[0] in ("quiet", "putq") or (
                    unit.expect[0] in ("put", "putbad") and ra.frames
                    and ra.frames[0].startswith(b"EXPECTED_CRLF") and unit.kind == "put-bad") or (
                    unit.expect == ("put", None) and ra.frames
                    and ra.frames[0].split(b" ")[0].rstrip(b"\r\n") not in ACCEPT_PUT):
                stats["quiet_units"] += 1
            (na, pa), (nb, pb) = normalize(ra), normalize(rb)
            problems = ["reference: " + p for p in pa] + ["candidate: " + p for p in pb]
            if na != nb or problems:
                report_divergence(cfg, index, zlimit, nconns, history, problems, out, label)
                if cfg.save:
                    save_repro(cfg, index, zlimit, nconns, history, save_info)
                return False, len(history), time.monotonic() - t0
            if ra.status == "eof" or rb.status == "eof":
                for side in pair:
                    side.close()
                conns[unit.conn] = None
            try:
                unit = unit_source.send(ra)
            except StopIteration:
                unit = None
        return True, len(history), time.monotonic() - t0
    finally:
        for pair in conns:
            if pair:
                for side in pair:
                    side.close()
        ref.stop()
        cand.stop()


def report_divergence(cfg, index, zlimit, nconns, history, problems, out, label):
    unit, ra, rb = history[-1]
    out.append("DIVERGENCE seed=%s stream=%d unit=%d (conn %d, kind %s, -z %s, %d conns)%s"
               % (cfg.seed, index, len(history) - 1, unit.conn, unit.kind,
                  zlimit if zlimit is not None else "default", nconns, label))
    out.append("  unit bytes : %s" % clip(unit.data, cfg.repr_limit))
    out.append("  reference  : %s" % clip(ra.raw(), cfg.repr_limit) +
               ("  <%s>" % ra.status.upper() if ra.status != "ok" else ""))
    out.append("  candidate  : %s" % clip(rb.raw(), cfg.repr_limit) +
               ("  <%s>" % rb.status.upper() if rb.status != "ok" else ""))
    for p in problems:
        out.append("  problem    : %s" % p)
    for line in yaml_field_diff(ra, rb):
        out.append("  field diff : %s" % line)
    out.append("  previous units (conn: bytes -> reference reply):")
    start = max(0, len(history) - 11)
    for k in range(start, len(history) - 1):
        u, a, _ = history[k]
        out.append("    #%d c%d: %s -> %s" % (k, u.conn, clip(u.data, 160), clip(a.raw(), 160)))
    out.append("  reproduce: differential.py %s --seed %s --only %d --commands %d%s"
               % (cfg.candidate, cfg.seed, index, cfg.commands,
                  " --skip-kinds " + ",".join(cfg.skip_kinds) if cfg.skip_kinds else ""))


def yaml_fields(frame):
    if not frame.startswith(b"OK "):
        return None
    body = frame.split(b"\r\n", 1)[1][:-2]
    fields = []
    for ln in body.split(b"\n")[1:]:
        if ln:
            fields.append(ln)
    return fields


def yaml_field_diff(ra, rb):
    """Readable differences between two YAML replies (stats, lists)."""
    out = []
    for fa, fb in zip(ra.frames, rb.frames):
        la, lb = yaml_fields(fa), yaml_fields(fb)
        if la is None or lb is None or mask_frame(fa, []) == mask_frame(fb, []):
            continue
        da = dict(ln.partition(b": ")[::2] for ln in la if b": " in ln)
        db = dict(ln.partition(b": ")[::2] for ln in lb if b": " in ln)
        if da and db:
            for k in list(da) + [k for k in db if k not in da]:
                va, vb = da.get(k), db.get(k)
                if va != vb and k not in MASK_SERVER | MASK_JOB | MASK_TUBE:
                    out.append("%s: reference=%s candidate=%s"
                               % (k.decode("latin-1"), va and va.decode("latin-1"),
                                  vb and vb.decode("latin-1")))
            if [ln.partition(b": ")[0] for ln in la] != [ln.partition(b": ")[0] for ln in lb]:
                out.append("key order differs: reference=%r candidate=%r"
                           % ([ln.partition(b": ")[0] for ln in la],
                              [ln.partition(b": ")[0] for ln in lb]))
        else:
            out.append("list reference=%r candidate=%r" % (la, lb))
    return out


def save_repro(cfg, index, zlimit, nconns, history, info):
    os.makedirs(cfg.save, exist_ok=True)
    name = os.path.join(cfg.save, "stream-%s-%d.json" % (cfg.seed, index))
    unit, ra, rb = history[-1]
    doc = {
        "seed": cfg.seed, "stream": index, "zlimit": zlimit, "nconns": nconns,
        "commands": cfg.commands, "candidate": cfg.candidate, "reference": cfg.reference,
        "failing_unit": len(history) - 1,
        "reference_reply_b64": base64.b64encode(ra.raw()).decode(),
        "reference_status": ra.status,
        "candidate_reply_b64": base64.b64encode(rb.raw()).decode(),
        "candidate_status": rb.status,
        "units": [u.to_json() for (u, _, _) in history],
    }
    if info:
        doc.update(info)
    with open(name, "w") as f:
        json.dump(doc, f, indent=1)
    with open(name[:-5] + ".txt", "w") as f:
        for k, (u, a, b) in enumerate(history):
            f.write("#%d c%d %s\n  sent: %r\n  ref : %r %s\n  cand: %r %s\n"
                    % (k, u.conn, u.kind, u.data, a.raw(), a.status, b.raw(), b.status))


def run_stream(cfg, index):
    out = StreamOutcome(index)
    rng, zlimit, nconns = stream_params(cfg.seed, index)
    gen = Generator(rng, zlimit, nconns, cfg.commands, cfg.skip_kinds)

    def source():
        g = gen.units()
        res = None
        try:
            unit = next(g)
            while True:
                res = yield unit
                gen.observe(unit, res)
                unit = g.send(res)
        except StopIteration:
            return

    try:
        ok, n, secs = run_units(cfg, index, zlimit, nconns, source(), out.lines, "", None,
                                out.stats)
        out.ok, out.units, out.seconds = ok, n, secs
    except SetupError as e:
        out.ok = False
        out.error = str(e)
        out.lines.append("stream %d: setup error: %s" % (index, e))
    except KeyboardInterrupt:
        raise
    except Exception:
        import traceback
        out.ok = False
        out.error = "internal error"
        out.lines.append("stream %d: internal error in the test tool:\n%s"
                         % (index, traceback.format_exc()))
    return out


def replay(cfg, path):
    with open(path) as f:
        doc = json.load(f)
    units = [Unit.from_json(u) for u in doc["units"]]
    out = []

    def source():
        for u in units:
            yield u

    cfg.seed = doc.get("seed")
    ok, n, secs = run_units(cfg, doc.get("stream", 0), doc.get("zlimit"), doc.get("nconns", 4),
                            source(), out, " [replay %s]" % path, None, {})
    for line in out:
        print(line)
    print("replay: %d units in %.2fs, %s" % (n, secs, "identical" if ok else "DIVERGED"))
    print("differential: %d passed, %d failed" % (1 if ok else 0, 0 if ok else 1))
    return 0 if ok else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("candidate", nargs="?", help="server binary under test (beangate)")
    ap.add_argument("--reference", default=REFERENCE_DEFAULT,
                    help="reference beanstalkd binary (default %(default)s)")
    ap.add_argument("--against-reference", action="store_true",
                    help="use the reference binary as the candidate (self-check)")
    ap.add_argument("--seed", help="master seed (default: random, printed)")
    ap.add_argument("--streams", type=int, default=40)
    ap.add_argument("--commands", type=int, default=300, help="units per stream")
    ap.add_argument("--only", help="comma separated stream indexes to run")
    ap.add_argument("--jobs", type=int, default=4, help="streams run concurrently")
    ap.add_argument("--quiet-ms", type=float, default=40.0,
                    help="silence that ends a reply whose size cannot be predicted")
    ap.add_argument("--timeout", type=float, default=2.0, help="per-unit reply timeout (s)")
    ap.add_argument("--save", metavar="DIR", help="write repro files of failing streams here")
    ap.add_argument("--replay", metavar="FILE", help="replay a saved repro .json")
    ap.add_argument("--repr-limit", type=int, default=6000,
                    help="longest repr printed for one unit/reply (full in --save)")
    ap.add_argument("--skip-kinds", default="",
                    help="comma separated generator kinds to leave out (e.g. to look past a "
                         "known bug): put,put_limit,put_trailer,put_bad,short_timer,use,watch,"
                         "ignore,reserve0,reserve_bad,reserve_block,reserve_job,delete,release,"
                         "bury,touch,peek,peek_state,kick,kick_job,stats_job,stats_tube,stats,"
                         "list,pause,quit,mutated,unknown,empty,long_line,stray_cr,pipeline")
    ap.add_argument("--coverage", action="store_true",
                    help="print which reference replies each kind of unit produced")
    ap.add_argument("-q", "--quiet", dest="terse", action="store_true",
                    help="no per-stream progress lines")
    cfg = ap.parse_args(argv)
    if cfg.against_reference:
        cfg.candidate = cfg.reference
    if not cfg.candidate:
        ap.error("give the candidate binary (or --against-reference)")
    for b in (cfg.candidate, cfg.reference):
        if not (os.path.isfile(b) and os.access(b, os.X_OK)):
            print("differential: not an executable: %s" % b, file=sys.stderr)
            print("differential: 0 passed, 1 failed")
            return 2
    cfg.quiet = cfg.quiet_ms / 1000.0
    cfg.skip_kinds = [k.strip() for k in cfg.skip_kinds.split(",") if k.strip()]
    # explicit handlers (SIGINT may be inherited as "ignored" when started
    # in the background); each one kills every server and stops the run
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    if cfg.replay:
        return replay(cfg, cfg.replay)
    if cfg.seed is None:
        cfg.seed = str(int.from_bytes(os.urandom(4), "big"))
    indexes = list(range(cfg.streams))
    if cfg.only:
        indexes = [int(x) for x in cfg.only.split(",") if x.strip()]
    print("differential: seed=%s streams=%d commands=%d candidate=%s reference=%s"
          % (cfg.seed, len(indexes), cfg.commands, cfg.candidate, cfg.reference), flush=True)
    t0 = time.monotonic()
    passed = failed = 0
    setup_errors = 0
    ref_timeouts = 0
    coverage = {}
    pool = ThreadPoolExecutor(max_workers=max(1, cfg.jobs))
    try:
        for o in pool.map(lambda i: run_stream(cfg, i), indexes):
            for line in o.lines:
                print(line)
            if o.ok:
                passed += 1
                if not cfg.terse:
                    print("stream %d: ok (%d units, %.2fs, %d quiet-read units)"
                          % (o.index, o.units, o.seconds, o.stats.get("quiet_units", 0)))
            else:
                failed += 1
                if o.error:
                    setup_errors += 1
                else:
                    print("stream %d: FAILED at unit %d (%.2fs)" % (o.index, o.units - 1, o.seconds))
            ref_timeouts += o.stats.get("ref_timeouts", 0)
            for k, v in o.stats.get("coverage", {}).items():
                coverage[k] = coverage.get(k, 0) + v
            sys.stdout.flush()
    except KeyboardInterrupt:
        STOP.set()
        kill_all_servers()
        pool.shutdown(wait=True, cancel_futures=True)
        print("differential: interrupted")
        print("differential: %d passed, %d failed" % (passed, failed + 1))
        return 130
    pool.shutdown(wait=True)
    if cfg.coverage:
        print("coverage (unit kind: reference reply words -> count):")
        for (kind, words), v in sorted(coverage.items()):
            print("  %-20s %-40s %6d" % (kind, words, v))
    if ref_timeouts:
        # the generator must never make the reference wait; if it does, a
        # stream took a needless timeout (harmless for the verdict, but slow)
        print("differential: warning: %d reference replies timed out" % ref_timeouts)
    print("differential: seed=%s elapsed %.1fs" % (cfg.seed, time.monotonic() - t0))
    print("differential: %d passed, %d failed" % (passed, failed))
    if failed:
        return 2 if setup_errors == failed else 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        kill_all_servers()
