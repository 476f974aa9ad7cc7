#!/usr/bin/env python3
"""Durability tests for beangate's write-ahead log (-b DIR).

Usage: python3 tests/durability/test_wal.py build/beangate

Every test starts the real server on a free loopback port with --no-http and
a log directory under one private temporary directory, talks to it over real
sockets, stops or kills it, restarts it on the same directory and compares
what came back with what the server acknowledged before. Servers stopped
with SIGTERM must exit with status 0 and no sanitizer report on stderr (so
the same file checks an ASan+UBSan build); a killed server's stderr is
checked for sanitizer reports too.

What is checked:
  restart_full_state_*   every job field, body and tube count survives a
                         restart (SIGTERM and SIGKILL); reserved -> ready;
                         delays and pauses keep their wall-clock deadline;
                         new ids continue above every earlier id
  crash_cycles           >= 20 SIGKILLs at random moments under 4 writers
                         with -f 0: every acknowledged put is there with its
                         body, no acknowledged delete comes back
  compaction_*           the directory stays small under churn (-s 65536)
  ids_*                  ids are never reused after compaction
  disk_full_*            a file-size limit (prlimit) makes puts answer
                         OUT_OF_MEMORY (beanstalk, as beanstalkd does when
                         its binlog cannot take a put) and 503
                         LOG_UNAVAILABLE (HTTP); the server recovers by itself
  lock_*                 a second server on the same directory refuses
  torn_tail_*            a torn or garbage tail is dropped, the rest kept, and
                         cut off the file (later starts see no damage)
  damage_*               a missing segment, a flipped byte, a zeroed block or a
                         bad length in a segment that is not the newest (or a
                         bad record before more records in the newest) refuses
                         the start (111) naming file and offset; with
                         --log-recover-damaged the readable jobs are served
  check_log_*            --check-log: lines, exit status, read only
  fsync_modes_* / sigterm_under_load_*   -f 50 and -F flush at exit
  binlog_stats           the binlog-* fields of `stats`
  failed_log_* / *_waits_* / *_after_its_sync / idempotent_replay_* /
  sigterm_*_kept_put / sigterm_*_the_log_lacks / sigterm_on_a_stalled_*
                         when a reply may go (issue 21): with -f 0 no reply
                         reports a change or shows a job before the log keeps
                         it, also while the disk fails or is slow, and a
                         SIGTERM answers exactly the puts the log kept

Python 3 standard library only. The runner is tests/lib/testlib.py's: -k NAME
runs one test (crash_cycles is test_crash_cycles), --seed N repeats a run's
random choices (the seed is printed first), PASS/FAIL per test, the last line
is `durability: N passed, M failed, K skipped`; exits 1 on failure.
"""

import os
import random
import re
import shutil
import signal
import http.client
import json
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import testlib  # noqa: E402
from testlib import check, close_quietly, first_difference, free_port, signal_and_wait  # noqa: E402

BINARY = None             # set from argv[1]
NO_HTTP = []              # ["--no-http"] when the binary has the gateway
WORK = None               # the private temporary directory of this run
SEED = None
READ_TIMEOUT = 5.0        # every socket read gives up after this
START_TIMEOUT = 15.0      # a server must answer a command within this
STOP_TIMEOUT = 10.0       # a server must exit this long after SIGTERM
SANITIZER_MARKERS = testlib.SANITIZER_MARKERS + ("ERROR: ThreadSanitizer", "WARNING: ThreadSanitizer")
TORN_EVENTS = ("event=wal_torn_tail", "event=wal_corrupt_record", "event=wal_bad_segment")
JOURNAL_HEADER = 16       # core/journal.c: segment header bytes
JOB_FIXED = 57            # core/journal.c: fixed job fields after the type byte

ALL_SERVERS = []          # every Server made, so that none outlives the run


# ---- formatting ---------------------------------------------------------------

def show(data, limit=200):
    """repr of bytes, shortened for long data."""
    return testlib.show(data, limit)


def _bytes_diff(got, want, what):
    return ("%s: got %s, want %s (first difference at byte %d)"
            % (what, show(got), show(want), first_difference(got, want)))


def check_eq(got, want, what):
    testlib.check_eq(got, want, what, bytes_diff=_bytes_diff)


def log(msg):
    print("  " + msg, flush=True)


# ---- record sizes (core/journal.c) ---------------------------------------------

def put_record_size(tube, body_len):
    """A JOB record: len+crc+type, fixed fields, tube, body length, body+CRLF."""
    return 9 + JOB_FIXED + 1 + len(tube) + 4 + body_len + 2


def update_record_size(tube):
    return 9 + JOB_FIXED + 1 + len(tube)


DELETE_RECORD_SIZE = 9 + 8


# ---- a beanstalk client connection -------------------------------------------

class ConnLost(AssertionError):
    """The server closed or reset the connection."""


class Conn:
    def __init__(self, sock, timeout=READ_TIMEOUT):
        self.sock = sock
        self.timeout = timeout
        self.buf = bytearray()
        self.pos = 0
        sock.settimeout(timeout)

    def close(self):
        close_quietly(self.sock)

    def send(self, data):
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError) as e:
            raise ConnLost("send failed: %s" % e) from None

    def pending(self):
        return bytes(self.buf[self.pos:])

    def _fill(self, deadline, what):
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError("timed out waiting for %s; received so far %s"
                                 % (what, show(self.pending())))
        self.sock.settimeout(left)
        try:
            chunk = self.sock.recv(1 << 20)
        except socket.timeout:
            raise AssertionError("timed out waiting for %s; received so far %s"
                                 % (what, show(self.pending()))) from None
        except (ConnectionResetError, BrokenPipeError):
            raise ConnLost("connection reset waiting for %s" % what) from None
        if not chunk:
            raise ConnLost("connection closed by server waiting for %s; received so far %s"
                           % (what, show(self.pending())))
        if self.pos > (1 << 20):
            del self.buf[:self.pos]
            self.pos = 0
        self.buf += chunk

    def read_exact(self, n, timeout=None, what=None):
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        while len(self.buf) - self.pos < n:
            self._fill(deadline, what or "%d bytes" % n)
        data = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return data

    def read_line(self, timeout=None, what="a reply line"):
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        while True:
            i = self.buf.find(b"\r\n", self.pos)
            if i >= 0:
                line = bytes(self.buf[self.pos:i + 2])
                self.pos = i + 2
                return line
            self._fill(deadline, what)

    def expect(self, want, what, timeout=None):
        try:
            got = self.read_exact(len(want), timeout, what)
        except ConnLost:
            raise
        except AssertionError as e:
            raise AssertionError("%s: want %s; %s" % (what, show(want), e)) from None
        check_eq(got, want, what)

    def cmd(self, line, want, what=None, timeout=None):
        self.send(line)
        self.expect(want, what or line[:60].decode("latin-1").strip(), timeout)

    def read_ok(self, what, timeout=None):
        """Read `OK <n>` + YAML; returns the YAML, or None for NOT_FOUND."""
        line = self.read_line(timeout, what)
        if line == b"NOT_FOUND\r\n":
            return None
        check(line.startswith(b"OK "), "%s: want an OK reply, got %s" % (what, show(line)))
        n = int(line[3:-2])
        body = self.read_exact(n + 2, timeout, what)
        check_eq(body[-2:], b"\r\n", "end of OK reply to " + what)
        return body[:-2]

    def yaml(self, command, timeout=None):
        self.send(command + b"\r\n")
        body = self.read_ok(command.decode("latin-1"), timeout)
        return None if body is None else parse_yaml(body)


def parse_yaml(body):
    out = {}
    for raw in body.decode("latin-1").split("\n"):
        if ": " in raw:
            k, v = raw.split(": ", 1)
            out[k] = v.strip().strip('"')
    return out


def parse_yaml_list(body):
    return [raw[2:] for raw in body.decode("latin-1").split("\n") if raw.startswith("- ")]


def put_cmd(body, pri=0, delay=0, ttr=60):
    return b"put %d %d %d %d\r\n" % (pri, delay, ttr, len(body)) + body + b"\r\n"


def job_reply(word, jid, body):
    return b"%s %d %d\r\n" % (word, jid, len(body)) + body + b"\r\n"


def read_inserted(c, what):
    line = c.read_line(what=what)
    check(line.startswith(b"INSERTED "), "%s: want INSERTED <id>, got %s" % (what, show(line)))
    return int(line[9:-2])


def put(c, body, pri=0, delay=0, ttr=60, what="put"):
    c.send(put_cmd(body, pri, delay, ttr))
    return read_inserted(c, what)


def use(c, tube):
    c.cmd(b"use %s\r\n" % tube, b"USING %s\r\n" % tube)


def read_peek(c, jid, what=None):
    """The reply to `peek jid`: the body, or None for NOT_FOUND."""
    what = what or "peek %d" % jid
    line = c.read_line(what=what)
    if line == b"NOT_FOUND\r\n":
        return None
    m = re.match(rb"FOUND (\d+) (\d+)\r\n$", line)
    check(m is not None, "%s: want FOUND or NOT_FOUND, got %s" % (what, show(line)))
    check_eq(int(m.group(1)), jid, what + ": id in FOUND")
    data = c.read_exact(int(m.group(2)) + 2, what=what + " body")
    check_eq(data[-2:], b"\r\n", what + ": end of body")
    return data[:-2]


def peek_many(c, ids, chunk=500):
    """Pipelined peeks: {id: body or None}."""
    ids = list(ids)
    out = {}
    for i in range(0, len(ids), chunk):
        part = ids[i:i + chunk]
        c.send(b"".join(b"peek %d\r\n" % j for j in part))
        for j in part:
            out[j] = read_peek(c, j)
    return out


def check_bodies(c, jobs, what):
    """Every job of {id: body} is there with its body."""
    got = peek_many(c, sorted(jobs))
    for jid, body in jobs.items():
        check_eq(got[jid], body, "job %d %s" % (jid, what))


def dir_size(path):
    """Total bytes of the files in path (files may vanish while we look)."""
    total = 0
    try:
        names = os.listdir(path)
    except OSError:
        return 0
    for n in names:
        try:
            total += os.stat(os.path.join(path, n)).st_size
        except OSError:
            pass
    return total


def segments(path):
    """{index: size} of the segment files in path."""
    out = {}
    for n in os.listdir(path):
        m = re.match(r"beangate\.(\d+)\.wal$", n)
        if m:
            try:
                out[int(m.group(1))] = os.stat(os.path.join(path, n)).st_size
            except OSError:
                pass
    return out


def new_dir(name):
    d = os.path.join(WORK, name)
    os.makedirs(d)
    return d


# ---- the server process --------------------------------------------------------

class Server:
    """One beangate process on a log directory; start() may be called again
    after stop() (a restart on the same directory, on a new port)."""

    def __init__(self, logdir, args=(), name="srv", http=False, env=None):
        self.logdir = logdir
        self.env = env        # extra environment entries (e.g. DiskFaults.env())
        self.args = list(args)
        self.name = name
        self.http = http      # serve HTTP too, on http_port (else --no-http)
        self.http_port = None
        self.proc = None
        self.port = None
        self.err_path = None
        self.err_paths = []   # one per start
        self.runs = 0
        ALL_SERVERS.append(self)

    def argv(self):
        http = ["--http-port", str(self.http_port)] if self.http else NO_HTTP
        argv = [BINARY, "-l", "127.0.0.1", "-p", str(self.port)] + http
        if self.logdir:
            argv += ["-b", self.logdir]
        return argv + self.args

    def start(self):
        last = ""
        for _attempt in range(5):
            self.port = free_port()
            self.http_port = free_port() if self.http else None
            self.runs += 1
            self.err_path = os.path.join(WORK, "%s-%s-%d.stderr"
                                         % (os.path.basename(self.logdir or "mem"), self.name, self.runs))
            self.err_paths.append(self.err_path)
            err = open(self.err_path, "ab")  # O_APPEND: we read it while the server writes
            try:
                self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL,
                                             stdout=subprocess.DEVNULL, stderr=err,
                                             env=testlib.clean_env(self.env) if self.env else None)
            finally:
                err.close()
            status = self._wait_ready()
            if status == "ok":
                return self
            last = "%s (status %r); stderr: %s" % (status, self.proc.returncode, self.stderr()[-800:])
            if "cannot listen" in last:
                continue
            break
        raise AssertionError("server %r did not start: %s" % (self.argv(), last.strip()))

    def _wait_ready(self):
        def round_trip():
            return testlib.uses_default_tube(Conn(socket.create_connection(("127.0.0.1", self.port), timeout=2.0),
                                                  2.0))
        status = testlib.wait_ready(self.proc, round_trip, START_TIMEOUT)
        if status != "timeout":
            return status
        self.proc.kill()
        self.proc.wait(5)
        return "no answer within %.0f s (killed)" % START_TIMEOUT

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def stderr(self):
        try:
            with open(self.err_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except (OSError, TypeError):
            return ""

    def connect(self, timeout=READ_TIMEOUT):
        return Conn(socket.create_connection(("127.0.0.1", self.port), timeout=timeout), timeout)

    def stop(self, sig=signal.SIGTERM, timeout=STOP_TIMEOUT):
        """Send sig and wait; returns (exit status or None if it hung, seconds)."""
        if self.proc is None or self.proc.poll() is not None:
            return (self.proc.returncode if self.proc else None), 0.0
        t0 = time.monotonic()
        status = signal_and_wait(self.proc, sig, timeout)
        return status, time.monotonic() - t0

    def check_sanitizer(self, how):
        err = self.stderr()
        bad = [m for m in SANITIZER_MARKERS if m in err]
        check(not bad, "sanitizer report on stderr (%s; %s): %s" % (how, ", ".join(bad), err.strip()[:2000]))

    def stop_checked(self, max_seconds=STOP_TIMEOUT):
        """SIGTERM: exit status 0, in time, no sanitizer report."""
        status, took = self.stop(signal.SIGTERM, max_seconds)
        err = self.stderr()
        check(status is not None, "server did not exit within %.1f s of SIGTERM (killed); stderr: %s"
              % (max_seconds, err.strip()[-600:]))
        self.check_sanitizer("after SIGTERM")
        check(status == 0, "exit status %r after SIGTERM, want 0; stderr: %s" % (status, err.strip()[-600:]))
        return took

    def kill(self):
        """SIGKILL (a crash); stderr is still checked for sanitizer reports."""
        self.stop(signal.SIGKILL, 5.0)
        self.check_sanitizer("before SIGKILL")

    def restart(self, sig):
        if sig == signal.SIGKILL:
            self.kill()
        else:
            self.stop_checked()
        return self.start()


def stop_all():
    """Kill what still runs; returns the sanitizer reports of every server
    started since the last call."""
    reports = []
    for srv in ALL_SERVERS:
        if srv.running():
            srv.stop(signal.SIGKILL, 5.0)
        for path in srv.err_paths:
            try:
                with open(path, "rb") as f:
                    err = f.read().decode("utf-8", "replace")
            except OSError:
                continue
            if any(m in err for m in SANITIZER_MARKERS):
                reports.append("%s: %s" % (os.path.basename(path), err.strip()[:1500]))
    del ALL_SERVERS[:]
    return reports


def check_no_torn(srv, what):
    err = srv.stderr()
    bad = [e for e in TORN_EVENTS if e in err]
    check(not bad, "%s: the log was damaged (%s) although nothing was cut; stderr: %s"
          % (what, ", ".join(bad), err.strip()[-800:]))


# ---- 1. restart keeps the full state -----------------------------------------------

JOB_EXACT = ("tube", "state", "pri", "delay", "ttr", "reserves", "timeouts", "releases", "buries", "kicks")


def derive_tube_counts(jobs):
    """tube -> {current-jobs-*} from stats-job dicts (urgent: ready, pri < 1024)."""
    out = {}
    for st in jobs.values():
        t = out.setdefault(st["tube"], {k: 0 for k in ("urgent", "ready", "reserved", "delayed", "buried")})
        t[st["state"]] += 1
        if st["state"] == "ready" and int(st["pri"]) < 1024:
            t["urgent"] += 1
    return out


def tube_counts(st):
    return {k: int(st["current-jobs-" + k]) for k in ("urgent", "ready", "reserved", "delayed", "buried")}


def snapshot_state(c, max_id):
    jobs, bodies = {}, {}
    for jid in range(1, max_id + 1):
        st = c.yaml(b"stats-job %d" % jid)
        body = peek_many(c, [jid])[jid]
        check((st is None) == (body is None),
              "job %d: stats-job %s but peek %s" % (jid, "NOT_FOUND" if st is None else "found",
                                                     "NOT_FOUND" if body is None else "found"))
        if st is not None:
            jobs[jid] = st
            bodies[jid] = body
    c.send(b"list-tubes\r\n")
    tubes = parse_yaml_list(c.read_ok("list-tubes"))
    tstats = {t: c.yaml(b"stats-tube " + t.encode()) for t in tubes}
    return jobs, bodies, tstats


def full_state_scenario(srv, rng):
    """Build the state; returns (connections to keep open, ids by name)."""
    c = srv.connect()
    holder = srv.connect()
    ids = {}
    use(c, b"a")
    ids["a_pri0"] = put(c, b"pri zero", pri=0)
    ids["a_pri5"] = put(c, b"pri five", pri=5, ttr=5)
    ids["a_pri1024"] = put(c, b"pri 1024, not urgent", pri=1024, ttr=100)
    ids["a_primax"] = put(c, b"pri max", pri=4294967295, ttr=3600)
    ids["a_binary"] = put(c, b"\r\n\x00bin\r\nary\x00\x00\r\n" + bytes(range(256)) + b"\r\n", pri=7, ttr=17)
    ids["a_empty"] = put(c, b"", pri=3)
    use(c, b"big")
    big = bytearray(rng.randbytes(60000))
    big[100:104] = b"\r\n\x00\r"
    big[-2:] = b"\r\n"
    ids["big"] = put(c, bytes(big), pri=100)
    use(c, b"b")
    ids["b_delay1000"] = put(c, b"delayed 1000 s", pri=11, delay=1000, ttr=30)
    ids["b_delay2000"] = put(c, b"delayed 2000 s\x00", pri=2000, delay=2000)
    use(c, b"c")
    ids["c_buried"] = put(c, b"to bury", pri=50)
    ids["c_kicked"] = put(c, b"to bury then kick", pri=60)
    ids["c_released_delay"] = put(c, b"to release with a delay", pri=70)
    ids["c_released"] = put(c, b"to release now", pri=80)
    ids["c_kicked_delayed"] = put(c, b"delayed, then kicked", pri=90, delay=500)
    c.cmd(b"reserve-job %d\r\n" % ids["c_buried"], job_reply(b"RESERVED", ids["c_buried"], b"to bury"))
    c.cmd(b"bury %d 999\r\n" % ids["c_buried"], b"BURIED\r\n")
    c.cmd(b"reserve-job %d\r\n" % ids["c_kicked"], job_reply(b"RESERVED", ids["c_kicked"], b"to bury then kick"))
    c.cmd(b"bury %d 61\r\n" % ids["c_kicked"], b"BURIED\r\n")
    c.cmd(b"kick-job %d\r\n" % ids["c_kicked"], b"KICKED\r\n")
    c.cmd(b"reserve-job %d\r\n" % ids["c_released_delay"],
          job_reply(b"RESERVED", ids["c_released_delay"], b"to release with a delay"))
    c.cmd(b"release %d 71 500\r\n" % ids["c_released_delay"], b"RELEASED\r\n")
    c.cmd(b"reserve-job %d\r\n" % ids["c_released"], job_reply(b"RESERVED", ids["c_released"], b"to release now"))
    c.cmd(b"release %d 81 0\r\n" % ids["c_released"], b"RELEASED\r\n")
    c.cmd(b"kick-job %d\r\n" % ids["c_kicked_delayed"], b"KICKED\r\n")
    use(c, b"t")
    ids["t_1"] = put(c, b"in the paused tube", pri=1)
    ids["t_2"] = put(c, b"in the paused tube, delayed", pri=2, delay=1000)
    c.cmd(b"pause-tube t 3600\r\n", b"PAUSED\r\n")
    # one job reserved (by another connection) when the server goes down
    use(holder, b"r")
    ids["r_reserved"] = put(holder, b"reserved at shutdown", pri=5, ttr=120)
    holder.cmd(b"reserve-job %d\r\n" % ids["r_reserved"],
               job_reply(b"RESERVED", ids["r_reserved"], b"reserved at shutdown"))
    # the newest id is a deleted job
    use(c, b"a")
    ids["a_deleted"] = put(c, b"deleted before the restart", pri=1)
    c.cmd(b"delete %d\r\n" % ids["a_deleted"], b"DELETED\r\n")
    return [c, holder], ids


def check_restart_full_state(sig):
    rng = random.Random(SEED)
    d = new_dir("full_state_%s" % signal.Signals(sig).name)
    srv = Server(d, ["-f", "0"]).start()
    conns, ids = full_state_scenario(srv, rng)
    max_id = max(ids.values())
    check_eq(ids["a_deleted"], max_id, "the deleted job has the highest id")
    c = conns[0]
    jobs0, bodies0, tubes0 = snapshot_state(c, max_id)
    t_snap = time.monotonic()
    check(ids["a_deleted"] not in jobs0, "deleted job still there before the restart")
    check_eq(jobs0[ids["r_reserved"]]["state"], "reserved", "state of the reserved job before the restart")
    check_eq(len(jobs0), len(ids) - 1, "jobs before the restart")
    for t, st in tubes0.items():  # our derivation of the tube counts matches the server before
        if t in derive_tube_counts(jobs0):
            check_eq(tube_counts(st), derive_tube_counts(jobs0)[t], "stats-tube %s before the restart" % t)
    # the restart (the holder connection is still open, the job reserved)
    srv.restart(sig)
    for x in conns:
        x.close()
    elapsed = time.monotonic() - t_snap
    check_no_torn(srv, "restart after %s" % signal.Signals(sig).name)
    c = srv.connect()
    jobs1, bodies1, tubes1 = snapshot_state(c, max_id)
    # jobs: the same ids, the same bodies, the same fields
    check_eq(sorted(jobs1), sorted(jobs0), "job ids after the restart")
    for jid, old in jobs0.items():
        new = jobs1[jid]
        name = next(k for k, v in ids.items() if v == jid)
        what = "job %d (%s) after the restart" % (jid, name)
        check_eq(bodies1[jid], bodies0[jid], what + ": body")
        for k in JOB_EXACT:
            want = old[k]
            if jid == ids["r_reserved"] and k == "state":
                want = "ready"
            if jid == ids["r_reserved"] and k == "reserves":
                # reserving is not logged (nor is it in beanstalkd's binlog): the
                # count may fall back to the one of the last record
                check(new[k] in (old[k], str(int(old[k]) - 1)),
                      "%s: reserves %s, want %s or %d" % (what, new[k], old[k], int(old[k]) - 1))
                continue
            check_eq(new[k], want, "%s: %s" % (what, k))
        age0, age1 = int(old["age"]), int(new["age"])
        check(age0 <= age1 <= age0 + elapsed + 2,
              "%s: age %d, want between %d and %d" % (what, age1, age0, age0 + elapsed + 2))
        if new["state"] == "delayed":
            tl0, tl1 = int(old["time-left"]), int(new["time-left"])
            check(tl0 - elapsed - 2 <= tl1 <= tl0,
                  "%s: time-left %d, want between %d and %d (wall-clock deadline)"
                  % (what, tl1, tl0 - elapsed - 2, tl0))
        elif new["state"] in ("ready", "buried"):
            check_eq(new["time-left"], "0", what + ": time-left")
    # tubes: counts derived from the jobs, and the pause
    want_counts = derive_tube_counts({j: dict(st, state="ready" if st["state"] == "reserved" else st["state"])
                                      for j, st in jobs0.items()})
    for t, counts in want_counts.items():
        check(t in tubes1, "tube %s missing after the restart (list-tubes: %s)" % (t, sorted(tubes1)))
        check_eq(tube_counts(tubes1[t]), counts, "stats-tube %s counts after the restart" % t)
        want_pause = tubes0[t]["pause"]
        check_eq(tubes1[t]["pause"], want_pause, "stats-tube %s pause after the restart" % t)
        ptl0, ptl1 = int(tubes0[t]["pause-time-left"]), int(tubes1[t]["pause-time-left"])
        check(ptl0 - elapsed - 2 <= ptl1 <= ptl0,
              "stats-tube %s pause-time-left %d, want between %d and %d"
              % (t, ptl1, ptl0 - elapsed - 2, ptl0))
    check_eq(tubes1["t"]["pause"], "3600", "tube t is still paused for 3600 s")
    # the pause works: a ready job in t is not handed out
    w = srv.connect()
    w.cmd(b"watch t\r\n", b"WATCHING 2\r\n")
    w.cmd(b"ignore default\r\n", b"WATCHING 1\r\n")
    w.cmd(b"reserve-with-timeout 0\r\n", b"TIMED_OUT\r\n", "reserve from the paused tube t after the restart")
    w.close()
    # new ids continue above every earlier one, the deleted one included
    new_id = put(c, b"after the restart")
    check(new_id > max_id, "put after the restart got id %d, want > %d (the highest id before, a deleted job)"
          % (new_id, max_id))
    check_eq(peek_many(c, [new_id])[new_id], b"after the restart", "peek of the new job")
    c.close()
    srv.stop_checked()


def test_restart_full_state_sigterm():
    check_restart_full_state(signal.SIGTERM)


def test_restart_full_state_sigkill():
    check_restart_full_state(signal.SIGKILL)


def test_restart_pause_of_tube_without_jobs():
    """A tube paused while it holds no job yet (it exists because a client
    uses it), then given jobs: the pause is logged before the jobs."""
    d = new_dir("pause_before_put")
    srv = Server(d, ["-f", "0"]).start()
    c = srv.connect()
    use(c, b"pz")
    c.cmd(b"pause-tube pz 3600\r\n", b"PAUSED\r\n")
    jid = put(c, b"put after the pause")
    st0 = c.yaml(b"stats-tube pz")
    check_eq(st0["pause"], "3600", "stats-tube pz pause before the restart")
    c.close()
    srv.restart(signal.SIGTERM)
    c = srv.connect()
    check_eq(peek_many(c, [jid])[jid], b"put after the pause", "the job survived")
    st1 = c.yaml(b"stats-tube pz")
    check(st1 is not None, "tube pz missing after the restart")
    check_eq(st1["pause"], "3600", "stats-tube pz pause after the restart (pause-tube logged before the "
                                   "tube's first job)")
    check(int(st1["pause-time-left"]) >= 3590, "stats-tube pz pause-time-left %s" % st1["pause-time-left"])
    c.close()
    srv.stop_checked()


def test_restart_unpause_persists():
    """pause-tube t 3600, then pause-tube t 0 (ends the pause): after a
    restart the tube must not be paused again."""
    d = new_dir("unpause")
    srv = Server(d, ["-f", "0"]).start()
    c = srv.connect()
    use(c, b"up")
    jid = put(c, b"in a tube paused and unpaused")
    c.cmd(b"pause-tube up 3600\r\n", b"PAUSED\r\n")
    c.cmd(b"pause-tube up 0\r\n", b"PAUSED\r\n")
    check_eq(c.yaml(b"stats-tube up")["pause"], "0", "stats-tube up pause after pause-tube up 0")
    c.close()
    srv.restart(signal.SIGTERM)
    c = srv.connect()
    st = c.yaml(b"stats-tube up")
    check_eq((st["pause"], st["pause-time-left"]), ("0", "0"),
             "stats-tube up (pause, pause-time-left) after the restart (the pause was ended before it)")
    c.cmd(b"watch up\r\n", b"WATCHING 2\r\n")
    c.cmd(b"reserve-with-timeout 0\r\n", job_reply(b"RESERVED", jid, b"in a tube paused and unpaused"),
          "reserve from the unpaused tube after the restart")
    c.close()
    srv.stop_checked()


def test_restart_delay_runs_while_down():
    """Delays are wall-clock deadlines: they keep running while the server is
    down. A 2 s delay is over after 3 s down; a 30 s one has <= 27 s left."""
    d = new_dir("delay_down")
    srv = Server(d, ["-f", "0"]).start()
    c = srv.connect()
    short = put(c, b"delay 2", delay=2)
    long_ = put(c, b"delay 30", delay=30)
    c.close()
    srv.stop_checked()
    time.sleep(3.0)  # the point: 3 s of the wall clock pass while the server is down
    srv.start()
    c = srv.connect()
    st = c.yaml(b"stats-job %d" % short)
    check_eq(st["state"], "ready", "state of the 2 s job after 3 s down")
    st = c.yaml(b"stats-job %d" % long_)
    check_eq(st["state"], "delayed", "state of the 30 s job after 3 s down")
    check(int(st["time-left"]) <= 27, "time-left of the 30 s job after 3 s down: %s, want <= 27"
          % st["time-left"])
    check(int(st["time-left"]) >= 24, "time-left of the 30 s job after 3 s down: %s, want >= 24"
          % st["time-left"])
    c.cmd(b"reserve-with-timeout 0\r\n", job_reply(b"RESERVED", short, b"delay 2"), "reserve the 2 s job")
    c.close()
    srv.stop_checked()


# ---- 2. crashes under concurrent load -------------------------------------------------

CRASH_CYCLES = 20
CRASH_WORKERS = 4


class CrashWorker(threading.Thread):
    """Puts random bodies and deletes its own acknowledged jobs until the
    connection dies. Everything is recorded only when the reply arrived."""

    def __init__(self, srv, k, pool, seed, max_known, stop, churn=0.0):
        super().__init__(daemon=True)
        self.churn = churn        # share of ops that reserve-job + release (log grows, live does not)
        self.srv, self.k, self.pool = srv, k, list(pool)
        self.rng = random.Random(seed)
        self.max_known = max_known
        self.stop_ev = stop
        self.tube = b"crash-%d" % k
        self.acked_puts = {}      # id -> body
        self.acked_deletes = []   # ids
        self.in_doubt = None      # id of a delete without a reply
        self.errors = []
        self.reused = []

    def body(self):
        n = self.rng.randint(1, 2000)
        b = bytearray(self.rng.randbytes(n))
        if n >= 4 and self.rng.random() < 0.3:
            i = self.rng.randrange(n - 3)
            b[i:i + 4] = b"\r\n\x00\r"
        return bytes(b)

    def run(self):
        c = None
        t_end = time.monotonic() + 10.0
        try:
            c = self.srv.connect(timeout=READ_TIMEOUT)
            use(c, self.tube)
            for _op in range(200000):
                if self.stop_ev.is_set() or time.monotonic() > t_end:
                    break
                if self.pool and self.rng.random() < self.churn:
                    jid = self.pool[self.rng.randrange(len(self.pool))]
                    c.send(b"reserve-job %d\r\nrelease %d %d 0\r\n" % (jid, jid, self.rng.randrange(1000)))
                    line = c.read_line(what="reserve-job %d" % jid)
                    m = re.match(rb"RESERVED (\d+) (\d+)\r\n$", line)
                    if not m:
                        self.errors.append("reserve-job %d of an acknowledged live job: %s" % (jid, show(line)))
                        return
                    c.read_exact(int(m.group(2)) + 2, what="reserve-job %d body" % jid)
                    line = c.read_line(what="release %d" % jid)
                    if line != b"RELEASED\r\n":
                        self.errors.append("release %d: %s" % (jid, show(line)))
                        return
                    continue
                if self.pool and self.rng.random() < 0.35:
                    jid = self.pool.pop(self.rng.randrange(len(self.pool)))
                    self.in_doubt = jid
                    c.send(b"delete %d\r\n" % jid)
                    line = c.read_line(what="delete %d" % jid)
                    self.in_doubt = None
                    if line == b"DELETED\r\n":
                        self.acked_deletes.append(jid)
                    else:
                        self.errors.append("delete %d of an acknowledged live job: %s" % (jid, show(line)))
                        return
                else:
                    body = self.body()
                    c.send(put_cmd(body))
                    line = c.read_line(what="put")
                    if not line.startswith(b"INSERTED "):
                        self.errors.append("put: %s" % show(line))
                        return
                    jid = int(line[9:-2])
                    if jid <= self.max_known:
                        self.reused.append(jid)
                    self.acked_puts[jid] = body
                    self.pool.append(jid)
        except ConnLost:
            pass  # the server was killed
        except (AssertionError, OSError) as e:
            if not self.stop_ev.is_set():
                self.errors.append("worker %d before the kill: %s" % (self.k, e))
        finally:
            if c:
                c.close()


def check_crash_cycles(extra_args, name, churn=0.0, min_migrated=0):
    rng = random.Random(SEED + 2)
    d = new_dir(name)
    srv = Server(d, ["-f", "0"] + extra_args)
    present = {}      # id -> (worker, body): acknowledged and not deleted
    gone = set()      # acknowledged deletes, and in-doubt deletes seen done
    doubt = {}        # id -> (worker, body): delete sent, no reply
    totals = {"puts": 0, "deletes": 0, "doubt_kept": 0, "doubt_gone": 0, "cycles": 0, "migrated": 0}
    t0 = time.monotonic()
    max_known = 0

    def verify(when):
        c = srv.connect(timeout=10.0)
        got = peek_many(c, sorted(present))
        missing = [j for j in sorted(present) if got[j] is None]
        wrong = [j for j in sorted(present) if got[j] is not None and got[j] != present[j][1]]
        check(not missing, "%s: %d acknowledged puts are missing, e.g. ids %s"
              % (when, len(missing), missing[:10]))
        check(not wrong, "%s: %d jobs have another body, e.g. id %d: got %s, want %s"
              % (when, len(wrong), wrong[0], show(got[wrong[0]], 60), show(present[wrong[0]][1], 60))
              if wrong else "")
        got = peek_many(c, sorted(gone))
        back = [j for j in sorted(gone) if got[j] is not None]
        check(not back, "%s: %d acknowledged deletes came back, e.g. ids %s" % (when, len(back), back[:10]))
        got = peek_many(c, sorted(doubt))
        for j, (k, body) in sorted(doubt.items()):
            if got[j] is None:
                gone.add(j)
                totals["doubt_gone"] += 1
            else:
                check_eq(got[j], body, "%s: body of job %d (delete without reply)" % (when, j))
                present[j] = (k, body)
                totals["doubt_kept"] += 1
        doubt.clear()
        c.close()

    for cycle in range(CRASH_CYCLES):
        srv.start()  # a kill may leave a torn tail: no check of stderr here
        if cycle:
            verify("cycle %d, after the restart" % cycle)
        stop = threading.Event()
        workers = []
        for k in range(CRASH_WORKERS):
            pool = [j for j, (w, _b) in present.items() if w == k]
            workers.append(CrashWorker(srv, k, pool, rng.randrange(1 << 30), max_known, stop, churn))
        for w in workers:
            w.start()
        time.sleep(rng.uniform(0.2, 1.5))  # the point: the kill comes at a random moment of the load
        try:  # how much compaction this run did, just before its kill
            sc = srv.connect(timeout=2.0)
            totals["migrated"] += int(sc.yaml(b"stats").get("binlog-records-migrated", 0))
            sc.close()
        except (AssertionError, OSError):
            pass
        srv.kill()
        stop.set()
        for w in workers:
            w.join(15)
        check(not any(w.is_alive() for w in workers), "cycle %d: a worker is still running 15 s after the kill"
              % cycle)
        errors = [e for w in workers for e in w.errors]
        check(not errors, "cycle %d: %s" % (cycle, "; ".join(errors[:3])))
        reused = sorted(j for w in workers for j in w.reused)
        check(not reused, "cycle %d: ids %s handed out again (<= %d, the highest id of earlier cycles)"
              % (cycle, reused[:10], max_known))
        for w in workers:
            for jid, body in w.acked_puts.items():
                present[jid] = (w.k, body)
                max_known = max(max_known, jid)
            for jid in w.acked_deletes:
                present.pop(jid, None)
                gone.add(jid)
            if w.in_doubt is not None and w.in_doubt in present:
                doubt[w.in_doubt] = present.pop(w.in_doubt)
            totals["puts"] += len(w.acked_puts)
            totals["deletes"] += len(w.acked_deletes)
        max_known = max([max_known] + list(gone) + list(doubt))
        totals["cycles"] += 1
        check(time.monotonic() - t0 < 150, "crash cycles take too long (%.0f s after %d cycles)"
              % (time.monotonic() - t0, cycle + 1))
    srv.start()
    verify("after the last crash")
    c = srv.connect()
    new_id = put(c, b"after the crashes")
    check(new_id > max_known, "put after the crashes got id %d, want > %d" % (new_id, max_known))
    last_stats = c.yaml(b"stats")
    c.close()
    srv.stop_checked()
    st_line = "binlog-oldest-index %s, binlog-current-index %s, binlog-records-migrated %s" % tuple(
        last_stats.get(k) for k in ("binlog-oldest-index", "binlog-current-index", "binlog-records-migrated"))
    log("%s: %d cycles, %d acknowledged puts, %d acknowledged deletes, %d live at the end, "
        "deletes without reply: %d kept / %d done, %.1f s; records migrated before the kills %d; at the end %s"
        % (name, totals["cycles"], totals["puts"], totals["deletes"], len(present), totals["doubt_kept"],
           totals["doubt_gone"], time.monotonic() - t0, totals["migrated"], st_line))
    check(totals["puts"] >= 200, "only %d acknowledged puts in %d cycles: the load did not run"
          % (totals["puts"], totals["cycles"]))
    check(totals["deletes"] >= 50, "only %d acknowledged deletes: the load did not run" % totals["deletes"])
    check(totals["migrated"] >= min_migrated,
          "%d records migrated over all cycles, want >= %d: compaction did not run"
          % (totals["migrated"], min_migrated))


def test_crash_cycles():
    check_crash_cycles([], "crash")


def test_crash_cycles_small_segments():
    """The same with -s 262144: segments rotate and compaction runs (and is
    interrupted) under the kills."""
    check_crash_cycles(["-s", "262144"], "crash_small_segments")


def test_crash_cycles_during_compaction():
    """Most ops reserve and release (the log grows, the live set does not), so
    compaction runs all the time; its snapshot is written a few thousand jobs
    per batch between other records, and the kills land in the middle of
    snapshots too. Every acknowledged put and delete must survive."""
    check_crash_cycles(["-s", "65536"], "crash_during_compaction", churn=0.6, min_migrated=1)


# ---- 3. compaction keeps the directory small ---------------------------------------------

SEG = 65536


class DirSampler(threading.Thread):
    """Samples the directory's total size every 2 ms until stopped (<= 120 s)."""

    def __init__(self, path):
        super().__init__(daemon=True)
        self.path = path
        self.max = 0
        self.at_max = []  # [(segment index, size)] when the maximum was seen
        self.stop_ev = threading.Event()

    def sample(self):
        try:
            segs = segments(self.path)
        except OSError:
            return
        total = sum(segs.values())
        if total > self.max:
            self.max = total
            self.at_max = sorted(segs.items())

    def run(self):
        t_end = time.monotonic() + 120
        while not self.stop_ev.is_set() and time.monotonic() < t_end:
            self.sample()
            time.sleep(0.002)  # the sampling period: the directory's size is read every 2 ms

    def finish(self):
        self.stop_ev.set()
        self.join(5)
        self.sample()
        return self.max


def stats_int(c, key):
    st = c.yaml(b"stats")
    check(key in st, "stats has no %s" % key)
    return int(st[key])


# Log a compaction test's numbers (st: the stats after its churn; logged: bytes of records
# written, from the record sizes) and check that a segment was deleted (oldest index > 1).
def report_compaction(what, st, logged, max_seen, max_after_chunk, end_size, live, bound):
    log("compaction (%s): ~%d bytes logged, binlog-records-written %s, binlog-records-migrated %s, "
        "segments %s..%s; dir max %d bytes (sampled every 2 ms), %d after a chunk, %d at the end; live %d; "
        "bound %d"
        % (what, logged, st["binlog-records-written"], st["binlog-records-migrated"], st["binlog-oldest-index"],
           st["binlog-current-index"], max_seen, max_after_chunk, end_size, live, bound))
    check(int(st["binlog-oldest-index"]) > 1, "binlog-oldest-index is %s: no segment was ever deleted"
          % st["binlog-oldest-index"])


def test_compaction_release_churn():
    n_jobs, iterations, chunk = 100, 20000, 250
    d = new_dir("compact_release")
    # -f 0: each chunk's replies wait for its batch, so one batch holds at
    # most one chunk of records; with -f 50 a batch holds whatever the loop
    # logs while the flusher writes the one before, which grows as the
    # machine slows (docs/durability.md, "one batch")
    srv = Server(d, ["-s", str(SEG), "-f", "0"]).start()
    c = srv.connect(timeout=20.0)
    bodies = {}
    for i in range(n_jobs):
        body = (b"%03d-" % i) * 25
        jid = put(c, body)
        bodies[jid] = body
    ids = sorted(bodies)
    live = n_jobs * put_record_size("default", 100)
    # docs/durability.md: 3 x live + segments + one batch (one chunk here)
    bound = 4 * SEG + 3 * live + chunk * update_record_size("default")
    logged = live
    sampler = DirSampler(d)
    sampler.start()
    max_after_chunk = 0
    try:
        for start in range(0, iterations, chunk):
            send, want = [], []
            for i in range(start, start + chunk):
                jid = ids[i % n_jobs]
                send.append(b"reserve-job %d\r\nrelease %d 0 1000\r\n" % (jid, jid))
                want.append(job_reply(b"RESERVED", jid, bodies[jid]) + b"RELEASED\r\n")
            c.send(b"".join(send))
            c.expect(b"".join(want), "reserve-job/release chunk at iteration %d" % start, timeout=20.0)
            logged += chunk * update_record_size("default")
            size = dir_size(d)
            max_after_chunk = max(max_after_chunk, size)
            check(size <= bound, "after %d iterations the directory holds %d bytes, want <= %d "
                  "(4 * %d + 3 * %d live + one chunk); segments (index, bytes): %s"
                  % (start + chunk, size, bound, SEG, live, sorted(segments(d).items())))
    finally:
        max_seen = sampler.finish()
    # -f 0: the last reply came once its batch was on disk
    st = c.yaml(b"stats")
    end_size = dir_size(d)
    report_compaction("release churn: %d iterations" % iterations, st, logged, max_seen, max_after_chunk,
                      end_size, live, bound)
    check(logged > 2 * bound, "the test logged only %d bytes, not enough to need compaction" % logged)
    check(int(st["binlog-records-migrated"]) > 0, "binlog-records-migrated is 0: no compaction")
    check(max_seen <= bound, "the directory reached %d bytes, want <= %d; segments then (index, bytes): %s"
          % (max_seen, bound, sampler.at_max))
    check(end_size <= bound, "the directory holds %d bytes at the end, want <= %d" % (end_size, bound))
    c.close()
    # every job is still there, delayed for ~1000 s
    srv.restart(signal.SIGTERM)
    check_no_torn(srv, "restart after the release churn")
    c = srv.connect()
    got = peek_many(c, ids)
    for jid in ids:
        check_eq(got[jid], bodies[jid], "job %d after the restart" % jid)
    st = c.yaml(b"stats")
    check_eq(st["current-jobs-delayed"], str(n_jobs), "delayed jobs after the restart")
    c.close()
    srv.stop_checked()


def test_compaction_put_delete_churn():
    n_keep, pairs, chunk = 1000, 30000, 250
    d = new_dir("compact_churn")
    srv = Server(d, ["-s", str(SEG), "-f", "0"]).start()
    c = srv.connect(timeout=20.0)
    use(c, b"keep")
    keep = {}
    for start in range(0, n_keep, chunk):
        part = [b"keep-%06d-" % i + b"k" * 88 for i in range(start, start + chunk)]
        c.send(b"".join(put_cmd(b) for b in part))
        for b in part:
            keep[read_inserted(c, "put of a long-lived job")] = b
    use(c, b"churn")
    live = n_keep * put_record_size("keep", 100)
    # docs/durability.md: 3 x live + segments + one batch (one chunk here)
    bound = 4 * SEG + 3 * live + chunk * update_record_size("default")
    logged = live
    churn_ids = []
    max_after_chunk = 0
    sampler = DirSampler(d)
    sampler.start()
    try:
        for start in range(0, pairs, chunk):
            bodies = [b"churn-%06d-" % i + b"c" * 87 for i in range(start, start + chunk)]
            c.send(b"".join(put_cmd(b) for b in bodies))
            ids = [read_inserted(c, "churn put") for _ in bodies]
            c.send(b"".join(b"delete %d\r\n" % j for j in ids))
            c.expect(b"DELETED\r\n" * len(ids), "churn deletes at pair %d" % start, timeout=20.0)
            churn_ids += ids
            logged += chunk * (put_record_size("churn", 100) + DELETE_RECORD_SIZE)
            size = dir_size(d)
            max_after_chunk = max(max_after_chunk, size)
            check(size <= bound, "after %d pairs the directory holds %d bytes, want <= %d; segments "
                  "(index, bytes): %s" % (start + chunk, size, bound, sorted(segments(d).items())))
    finally:
        max_seen = sampler.finish()
    st = c.yaml(b"stats")
    end_size = dir_size(d)
    report_compaction("put/delete churn: %d pairs" % pairs, st, logged, max_seen, max_after_chunk, end_size,
                      live, bound)
    batch = chunk * put_record_size("churn", 100)
    check(max_seen <= bound, "the directory reached %d bytes, want <= %d = 4 * %d + 3 * %d live "
          "(docs/durability.md promises < 2 x live + 2 segments + one batch = %d; but while a snapshot is "
          "written the old segments are still there: up to 3 * live + segment + one batch = %d); segments then "
          "(index, bytes): %s"
          % (max_seen, bound, SEG, live, 2 * live + 2 * SEG + batch, 3 * live + SEG + batch, sampler.at_max))
    c.close()
    max_id = max(churn_ids)
    srv.restart(signal.SIGKILL)  # -f 0: everything acknowledged is on disk
    c = srv.connect(timeout=20.0)
    got = peek_many(c, sorted(keep))
    missing = [j for j in sorted(keep) if got[j] != keep[j]]
    check(not missing, "%d long-lived jobs missing or changed after the restart, e.g. %s"
          % (len(missing), missing[:10]))
    got = peek_many(c, churn_ids, chunk=1000)
    back = [j for j in churn_ids if got[j] is not None]
    check(not back, "%d deleted churn jobs came back, e.g. %s" % (len(back), back[:10]))
    new_id = put(c, b"after the churn")
    check(new_id > max_id, "put after the restart got id %d, want > %d (the highest id given out)"
          % (new_id, max_id))
    c.close()
    srv.stop_checked()


# Reserve-job and release job k (body b"K" * 200), ten at a time, until a compaction has
# deleted a segment (binlog-oldest-index > 1); fails after 2000 releases or 20 s.
def release_until_compaction(c, k):
    t_end = time.monotonic() + 20
    for _ in range(200):
        c.send(b"".join(b"reserve-job %d\r\nrelease %d 0 0\r\n" % (k, k) for _ in range(10)))
        c.expect((job_reply(b"RESERVED", k, b"K" * 200) + b"RELEASED\r\n") * 10, "reserve-job/release of K")
        if int(c.yaml(b"stats")["binlog-oldest-index"]) > 1:
            return
        check(time.monotonic() < t_end, "no compaction within 20 s")
    raise AssertionError("no compaction after 2000 releases with -s 4096")


def test_ids_not_reused_after_compaction():
    """Job K lives; job X (a higher id) is put and deleted; then only updates
    of K are logged until a compaction drops the segment with X's records.
    After a restart a new put must still get an id above X."""
    d = new_dir("ids_compaction")
    srv = Server(d, ["-s", "4096", "-f", "0"]).start()
    c = srv.connect()
    k = put(c, b"K" * 200)
    x = put(c, b"X, deleted")
    c.cmd(b"delete %d\r\n" % x, b"DELETED\r\n")
    release_until_compaction(c, k)
    c.close()
    srv.restart(signal.SIGTERM)
    c = srv.connect()
    check_eq(peek_many(c, [k])[k], b"K" * 200, "job K after the restart")
    check_eq(peek_many(c, [x])[x], None, "deleted job X after the restart")
    new_id = put(c, b"new after compaction")
    check(new_id > x, "put after compaction + restart got id %d, want > %d (id %d was given out and deleted "
          "before the compaction; ids must not be reused)" % (new_id, x, x))
    c.close()
    srv.stop_checked()


def test_old_segment_back_after_snapshot_is_ignored():
    """A crash can leave segments that a compaction had deleted (the unlink
    not yet on disk). Jobs deleted before that snapshot must not come back:
    a complete snapshot supersedes every older segment."""
    d = new_dir("old_segment_back")
    srv = Server(d, ["-s", "4096", "-f", "0"]).start()
    c = srv.connect()
    k = put(c, b"K" * 200)
    x = put(c, b"X, deleted before the snapshot")
    live = put(c, b"L, alive: the snapshot's id mark is not a delete of X")
    saved = {name: open(os.path.join(d, name), "rb").read()
             for name in os.listdir(d) if name.endswith(".wal")}
    c.cmd(b"delete %d\r\n" % x, b"DELETED\r\n")
    release_until_compaction(c, k)
    c.close()
    srv.stop_checked()
    for name, data in saved.items():  # the deleted segments come back
        if not os.path.exists(os.path.join(d, name)):
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)
    code, out, err = check_log(d)
    check(code == 0 and "status=superseded" in out, "--check-log with superseded segments back: exit %d, %s %s"
          % (code, out, err))
    srv.start()
    c = srv.connect()
    check_eq(peek_many(c, [x])[x], None, "job X, deleted before the snapshot, after old segments came back")
    check_eq(peek_many(c, [k])[k], b"K" * 200, "job K")
    check_eq(peek_many(c, [live])[live], b"L, alive: the snapshot's id mark is not a delete of X", "job L")
    c.close()
    srv.stop_checked()


def test_unknown_format_version_refuses_start():
    """A segment whose header names another format version (a downgrade)
    must stop the start, not be skipped: its jobs would be lost silently."""
    d = new_dir("unknown_version")
    with open(os.path.join(d, "beangate.1.wal"), "wb") as f:
        f.write(b"BGWAL\r\n\0" + (2).to_bytes(4, "little") + bytes(4))
    r = subprocess.run([BINARY, "-l", "127.0.0.1", "-p", str(free_port()), "-b", d] + NO_HTTP,
                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=20)
    check(r.returncode == 111, "start on a version-2 segment exited %r, want 111" % r.returncode)
    check(b"event=wal_unknown_segment" in r.stderr, "stderr %r" % r.stderr[-400:])


def test_shard_ids_survive_restart_and_compaction():
    """With --shard 1/3 ids are 1, 4, 7, ...; the highest one, deleted, is
    still never given out again after a compaction dropped its records and a
    restart: the next put gets the next id of the class above it."""
    d = new_dir("shard_ids")
    srv = Server(d, ["--shard", "1/3", "-s", "4096", "-f", "0"]).start()
    c = srv.connect()
    k = put(c, b"K" * 200)
    x = put(c, b"X, deleted")
    check_eq((k, x), (1, 4), "the first ids of shard 1 of 3")
    c.cmd(b"delete %d\r\n" % x, b"DELETED\r\n")
    t_end = time.monotonic() + 20
    while int(c.yaml(b"stats")["binlog-oldest-index"]) <= 1:
        check(time.monotonic() < t_end, "no compaction within 20 s with -s 4096")
        c.send(b"".join(b"reserve-job %d\r\nrelease %d 0 0\r\n" % (k, k) for _ in range(10)))
        c.expect((job_reply(b"RESERVED", k, b"K" * 200) + b"RELEASED\r\n") * 10, "reserve-job/release of K")
    c.close()
    srv.restart(signal.SIGTERM)
    c = srv.connect()
    check_eq(peek_many(c, [k])[k], b"K" * 200, "job K after the restart")
    check_eq(put(c, b"after"), 7, "the first put after compaction and restart (4 was given out)")
    c.close()
    srv.stop_checked()


def test_log_of_another_shard_refuses_start():
    """A log holding jobs whose ids another shard owns (written without
    --shard: ids 1, 2, 3) refuses a start with --shard 1/3 (status 111, one
    wal_shard_mismatch line), and is left as it was: without --shard it
    starts with its 3 jobs. Once jobs 2 and 3 are deleted, --shard 1/3
    starts on it, and gives out 4, above every id the log names."""
    d = new_dir("shard_mismatch")
    srv = Server(d, ["-f", "0"]).start()
    c = srv.connect()
    ids = [put(c, b"job %d" % i) for i in range(3)]
    check_eq(ids, [1, 2, 3], "ids without --shard")
    c.close()
    srv.stop_checked()
    code, err = start_expecting_exit(d, ["--shard", "1/3"])
    check_eq(code, 111, "start with --shard 1/3 on a log of ids 1, 2, 3 (stderr %s)" % err[-800:])
    line = next((dict(re.findall(r'(\w+)=("[^"]*"|\S+)', l)) for l in err.splitlines()
                 if " event=wal_shard_mismatch " in l), None)
    check(line is not None, "no wal_shard_mismatch line: %s" % err[-800:])
    check_eq((line.get("shard"), line.get("jobs"), line.get("first_id"), line.get("action")),
             ("1/3", "2", "2", "refuse_start"), "the wal_shard_mismatch line")
    srv.start()  # nothing was changed: the log starts as it was written
    c = srv.connect()
    check_eq(peek_many(c, ids), {1: b"job 0", 2: b"job 1", 3: b"job 2"}, "the jobs without --shard")
    for jid in (2, 3):
        c.cmd(b"delete %d\r\n" % jid, b"DELETED\r\n")
    c.close()
    srv.stop_checked()
    srv.args = ["--shard", "1/3", "-f", "0"]
    srv.start()
    c = srv.connect()
    check_eq(peek_many(c, [1])[1], b"job 0", "job 1 under --shard 1/3")
    check_eq(put(c, b"next"), 4, "the first put of shard 1/3 after ids up to 3")
    c.close()
    srv.stop_checked()


# ---- 4. disk full (injected with a file-size limit) ---------------------------------------

def set_fsize(pid, soft):
    """Set RLIMIT_FSIZE of pid (soft limit; the hard one is left unlimited so
    that no privilege is needed to raise it again). prlimit(1) if present,
    else the same syscall through the resource module."""
    value = "unlimited" if soft is None else str(soft)
    exe = shutil.which("prlimit")
    if exe:
        r = subprocess.run([exe, "--pid", str(pid), "--fsize=%s:unlimited" % value],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=10)
        check(r.returncode == 0, "prlimit --pid %d --fsize=%s:unlimited failed: %s"
              % (pid, value, r.stdout.decode(errors="replace")))
        return "prlimit"
    import resource
    if not hasattr(resource, "prlimit"):
        raise AssertionError("cannot inject a write failure: prlimit(1) is not installed (apt-get install "
                             "util-linux) and this Python has no resource.prlimit")
    lim = resource.RLIM_INFINITY if soft is None else soft
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (lim, resource.RLIM_INFINITY))
    return "resource.prlimit"


def test_disk_full_refuses_puts_then_recovers():
    d = new_dir("disk_full")
    srv = Server(d, ["-f", "0"]).start()
    c = srv.connect()
    use(c, b"old")
    acked = {}
    old = []
    for i in range(3):
        body = b"before the failure %d" % i
        jid = put(c, body)
        acked[jid] = body
        old.append(jid)
    c.close()
    largest = max(segments(d).values())
    limit = largest + 64
    how = set_fsize(srv.proc.pid, limit)
    log("disk full: file-size limit %d bytes (largest segment %d) set with %s" % (limit, largest, how))
    held = []        # (connection, body) of puts without a reply yet
    refused_at = None
    try:
        for attempt in range(1, 7):
            p = srv.connect(timeout=2.0)
            use(p, b"new")
            body = b"during the failure %d " % attempt + b"f" * 500
            p.send(put_cmd(body))
            try:
                line = p.read_line(timeout=2.0)
            except ConnLost:
                raise
            except AssertionError:
                held.append((p, body))  # its record was appended: held until the log works
                continue
            if line == b"OUT_OF_MEMORY\r\n":
                refused_at = attempt
                p.close()
                break
            p.close()
            raise AssertionError("put %d while no byte can be written: got %s, want OUT_OF_MEMORY "
                                 "(or no reply until the log works)" % (attempt, show(line)))
        check(refused_at is not None and refused_at <= 4,
              "no put answered OUT_OF_MEMORY within 4 attempts (held: %d, refused at %r); stderr: %s"
              % (len(held), refused_at, srv.stderr()[-600:]))
        check(len(held) <= 2, "%d puts held, want at most 2" % len(held))
        check("event=wal_failure" in srv.stderr(), "stderr has no event=wal_failure: %s" % srv.stderr()[-600:])
        # reserve and delete of existing jobs still answer
        b = srv.connect(timeout=2.0)
        b.cmd(b"watch old\r\n", b"WATCHING 2\r\n")
        b.cmd(b"ignore default\r\n", b"WATCHING 1\r\n")
        b.cmd(b"reserve-with-timeout 0\r\n", job_reply(b"RESERVED", old[0], acked[old[0]]),
              "reserve during the failure", timeout=2.0)
        # a delete promises the job is gone for good: its DELETED waits
        # until the log has the record (issue 21, defect 1)
        b.send(b"delete %d\r\ndelete %d\r\n" % (old[0], old[1]))
        silent_for(b.sock, QUIET, "DELETED while the log cannot write")
        q = srv.connect(timeout=2.0)
        q.cmd(b"peek %d\r\n" % old[2], job_reply(b"FOUND", old[2], acked[old[2]]), "peek during the failure",
              timeout=2.0)
        q.close()
        del acked[old[0]], acked[old[1]]
        # a second refusal, still failing
        p = srv.connect(timeout=2.0)
        p.cmd(put_cmd(b"still failing"), b"OUT_OF_MEMORY\r\n", "put while the limit is still there", timeout=2.0)
        p.close()
    finally:
        set_fsize(srv.proc.pid, None)
    t_lift = time.monotonic()
    inserted = None
    for attempt in range(40):
        if time.monotonic() - t_lift > 3.5:
            break
        p = srv.connect(timeout=2.0)
        body = b"after the recovery %d" % attempt
        p.send(put_cmd(body))
        line = p.read_line(timeout=2.0)
        p.close()
        if line.startswith(b"INSERTED "):
            inserted = int(line[9:-2])
            acked[inserted] = body
            break
        check_eq(line, b"OUT_OF_MEMORY\r\n", "put after the limit was lifted")
        time.sleep(0.1)  # the step of this poll (its deadline is 3.5 s above): each try is a put
    took = time.monotonic() - t_lift
    check(inserted is not None, "puts still refused %.1f s after the limit was lifted; stderr: %s"
          % (took, srv.stderr()[-600:]))
    log("disk full: OUT_OF_MEMORY at put attempt %d; puts accepted again %.2f s after the limit was lifted; "
        "%d put(s) were held until then" % (refused_at, took, len(held)))
    check("event=wal_recovered" in srv.stderr(), "stderr has no event=wal_recovered: %s" % srv.stderr()[-600:])
    b.expect(b"DELETED\r\nDELETED\r\n", "the deletes once the log took them", timeout=10.0)
    b.close()
    for p, body in held:
        jid = read_inserted(p, "held put after the recovery")
        acked[jid] = body
        p.close()
    srv.restart(signal.SIGKILL)
    c = srv.connect()
    got = peek_many(c, sorted(acked))
    for jid, body in acked.items():
        check_eq(got[jid], body, "acknowledged job %d after the restart" % jid)
    got = peek_many(c, old[:2])
    for jid in old[:2]:
        check_eq(got[jid], None, "job %d deleted during the failure, after the restart" % jid)
    c.close()
    srv.stop_checked()


def http_put(port, tube, body, timeout=2.0):
    """POST a job over HTTP: (status, decoded JSON body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/tubes/%s/jobs" % tube, body=body)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")
    finally:
        conn.close()


def stats_json(port):
    """GET /stats as a dict."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5.0)
    try:
        conn.request("GET", "/stats")
        resp = conn.getresponse()
        body = resp.read()
        check_eq(resp.status, 200, "GET /stats status")
        return json.loads(body)
    finally:
        conn.close()


def disk_faults(name):
    """A DiskFaults control file of this run (empty: no faults yet)."""
    return testlib.DiskFaults(os.path.join(WORK, name + ".faults"))


def test_failed_batch_retried_once_a_second():
    """Issue 21 defect 9: a batch that failed goes again once a second
    (RETRY_SECONDS), not on every loop turn (18,000-35,000 writes in 2 s
    before). Counted by binlog_disk_attempts of GET /stats while every
    write of a segment fails (BEANGATE_TEST_DISK_FAULTS: write EIO); the
    batch is written once the disk works again."""
    d = new_dir("retry_once_a_second")
    faults = disk_faults("retry_once_a_second")
    srv = Server(d, ["-f", "50"], http=True, env=faults.env()).start()
    c = srv.connect()
    put(c, b"before")
    testlib.wait_until(lambda: max(segments(d).values()) > JOURNAL_HEADER, "the first put written", 10.0)
    faults.set(["write EIO"])
    jid = put(c, b"during")  # -f 50: answered at once; its batch fails
    testlib.wait_until(lambda: stats_json(srv.http_port)["binlog_disk_failures"] >= 1, "a failed write", 10.0)
    # loop turns meanwhile (each command's callback kicks the log), as a
    # busy server has: the old code tried the failed batch again on each
    stop = threading.Event()
    turns = [0]

    def busy_client():
        b = srv.connect()
        while not stop.is_set():
            b.cmd(b"peek %d\r\n" % jid, b"FOUND %d 6\r\nduring\r\n" % jid)
            turns[0] += 1
        b.close()
    busy = threading.Thread(target=busy_client, daemon=True)
    busy.start()
    before = stats_json(srv.http_port)
    window = 2.5
    time.sleep(window)  # a measurement window, not a wait for a condition
    after = stats_json(srv.http_port)
    stop.set()
    busy.join(10)
    log("%d commands answered meanwhile" % turns[0])
    attempts = after["binlog_disk_attempts"] - before["binlog_disk_attempts"]
    log("%d write attempts in %.1f s against a failing disk (retries %d, failures %d)"
        % (attempts, window, after["binlog_disk_retries"], after["binlog_disk_failures"]))
    check(1 <= attempts <= 5, "%d write attempts in %.1f s, want one a second" % (attempts, window))
    check(after["binlog_failed"], "binlog_failed is false while every write fails")
    faults.clear()
    testlib.wait_until(lambda: not stats_json(srv.http_port)["binlog_failed"], "the log healthy again", 10.0)
    check("event=wal_recovered" in srv.stderr(), "no wal_recovered after the disk worked again")
    c.close()
    srv.restart(signal.SIGTERM)
    c = srv.connect()
    check_eq(read_peek_cmd(c, jid), b"during", "the put whose batch failed, after a restart")
    c.close()
    srv.stop_checked()


def sigterm_after_failed_write(name, disk_comes_back):
    """-f 50: a put is acknowledged, the write of its batch fails, SIGTERM
    comes before the retry a second later. A disk that comes back is a
    file-size limit lifted again (which the old code meets too); one that
    keeps failing is BEANGATE_TEST_DISK_FAULTS 'write EIO' (a file-size
    limit would cut the server's stderr file as well). Returns (server, id,
    exit status, stderr)."""
    d = new_dir(name)
    faults = disk_faults(name)
    # the limit is on every file: the server's stderr must stay below it
    srv = Server(d, ["-f", "50"], env=None if disk_comes_back else faults.env()).start()
    c = srv.connect()
    put(c, b"before")
    testlib.wait_until(lambda: max(segments(d).values()) > JOURNAL_HEADER, "the first put written", 10.0)
    if disk_comes_back:
        set_fsize(srv.proc.pid, max(segments(d).values()) + 8)
    else:
        faults.set(["write EIO"])
    jid = put(c, b"acknowledged, its write failed")
    testlib.wait_until(lambda: "event=wal_failure" in srv.stderr(), "the failed write (wal_failure)", 10.0)
    if disk_comes_back:
        set_fsize(srv.proc.pid, None)
    # no client event before the stop: each would kick the log, and the old
    # code then tried the failed batch again at once (defect 9)
    status, took = srv.stop(signal.SIGTERM, STOP_TIMEOUT)
    c.close()
    srv.check_sanitizer("after SIGTERM")
    log("exit status %r %.1f s after SIGTERM" % (status, took))
    return srv, jid, status, srv.stderr()


def test_sigterm_keeps_acknowledged_put_whose_write_failed():
    """Issue 21 defect 2: wal_close discarded a failed batch (exit 0, no
    line, the acknowledged job gone after a restart). The stop now tries the
    failed batch again (once a second, within its deadline): the job is
    there after the restart."""
    srv, jid, status, err = sigterm_after_failed_write("sigterm_failed_write", True)
    check_eq(status, 0, "exit status after SIGTERM (stderr: %s)" % err.strip()[-400:])
    check("event=wal_lost" not in err, "wal_lost although the disk works again: %s" % err.strip()[-400:])
    srv.start()
    c = srv.connect()
    check_eq(read_peek_cmd(c, jid), b"acknowledged, its write failed", "the acknowledged put after the restart")
    c.close()
    srv.stop_checked()


def test_sigterm_with_failing_disk_says_records_lost():
    """Issue 21 defect 2: when the disk keeps failing through the stop, the
    server says so: an error line wal_lost with the count of records not
    secured, and exit status 74 (EX_IOERR) instead of 0."""
    srv, jid, status, err = sigterm_after_failed_write("sigterm_failing_disk", False)
    check_eq(status, 74, "exit status after SIGTERM with a failing disk (stderr: %s)" % err.strip()[-400:])
    m = re.search(r"level=error event=wal_lost records=(\d+)", err)
    check(m is not None, "no error line wal_lost: %s" % err.strip()[-1500:])
    # the failed put, and "before" too if its sync (50 ms later) had not come yet
    check(int(m.group(1)) in (1, 2), "wal_lost records=%s, want the failed put (and maybe the one before)"
          % m.group(1))


def failed_sync_under_load(name, fsync_args, stop_signal):
    """Writers put under load; one sync of a segment fails
    (BEANGATE_TEST_DISK_FAULTS 'sync EIO once', which also zeroes what was
    written to it since its last good sync, as a kernel may drop those
    pages); once the log says wal_recovered and more puts went, stop the
    server (SIGKILL with -f 0, whose replies mean synced; SIGTERM with -f N,
    whose replies may precede the write) and restart: the start must not be
    refused and every acknowledged put must be there."""
    d = new_dir(name)
    faults = disk_faults(name)
    srv = Server(d, fsync_args, http=True, env=faults.env()).start()
    acked = {}
    lock = threading.Lock()
    stop = threading.Event()
    errors = []
    refused = [0]

    def writer(k):
        try:
            c = srv.connect()
            i = 0
            while not stop.is_set():
                body = b"w%d-%d " % (k, i) + b"x" * 200
                c.send(put_cmd(body))
                line = c.read_line(what="put")
                i += 1
                if line == b"OUT_OF_MEMORY\r\n":  # refused while the log is failed
                    refused[0] += 1
                    time.sleep(0.01)
                    continue
                check(line.startswith(b"INSERTED "), "put: got %s" % show(line))
                with lock:
                    acked[int(line[9:-2])] = body
            c.close()
        except Exception as e:  # reported below
            errors.append("writer %d: %s" % (k, e))
    threads = [threading.Thread(target=writer, args=(k,), daemon=True) for k in range(4)]
    for t in threads:
        t.start()
    testlib.wait_until(lambda: len(acked) >= 300, "300 puts acknowledged", 20.0)
    faults.set(["sync EIO once"])
    testlib.wait_until(lambda: "event=wal_recovered" in srv.stderr(), "wal_recovered after the failed sync", 20.0)
    with lock:
        at_recovery = len(acked)
    testlib.wait_until(lambda: len(acked) >= at_recovery + 300, "300 more puts after the recovery", 20.0)
    stop.set()
    for t in threads:
        t.join(10)
    check(not errors, "writers failed: %s" % errors)
    err = srv.stderr()
    check("event=wal_failure op=sync" in err, "the failed sync was not logged: %s" % err.strip()[-600:])
    log("%d puts acknowledged (%d refused while the log was failed), one sync failed, then %s"
        % (len(acked), refused[0], stop_signal.name))
    if stop_signal == signal.SIGKILL:
        srv.kill()
    else:
        srv.stop_checked()
    srv.start()
    err = srv.stderr()
    bad = [e for e in ("event=wal_refused", "event=wal_damaged", "event=wal_damage_dropped") if e in err]
    check(not bad, "the log was damaged after the failed sync (%s): %s" % (bad, err.strip()[-800:]))
    c = srv.connect()
    check_bodies(c, acked, "acknowledged before SIGKILL")
    c.close()
    srv.stop_checked()


def test_failed_sync_rewrites_f0():
    """Issue 21 defect 5 (fsyncgate), -f 0: after a failed sync nothing since
    the last good sync counts as written; it is written again into a fresh
    segment and synced before wal_recovered and before the held replies go."""
    failed_sync_under_load("failed_sync_f0", ["-f", "0"], signal.SIGKILL)


def test_failed_sync_rewrites_f50():
    """Issue 21 defect 5 (fsyncgate), -f 50: the batches written since the
    last good sync are written again into a fresh segment, so the next start
    reads a log without a hole (before: refused, damage in the newest
    segment followed by more records)."""
    failed_sync_under_load("failed_sync_f50", ["-f", "50"], signal.SIGTERM)


def vm_kib(pid, key):
    """A figure of /proc/PID/status in KiB (VmRSS, VmHWM)."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise AssertionError("no %s in /proc/%d/status" % (key, pid))


def test_compaction_memory_bounded():
    """Issue 21 defect 8: a snapshot step is capped by bytes (1 MiB of
    records), not by a count of jobs (4096 jobs of 4 KB made a 16 MB step,
    in pending and again in the batch). 12,000 live 4 KB jobs and a log over
    twice their size (written with a large -s, so that no snapshot came
    yet); a restart with -s 4 MiB compacts with its first put, with nothing
    else going on: the peak RSS (VmHWM, reset first) may grow by less than
    16 MB over the RSS before it."""
    d = new_dir("compaction_memory")
    srv = Server(d, ["-f", "50", "-s", str(256 << 20)]).start()
    c = srv.connect()
    body = b"m" * 4096
    live = 12000
    for _ in range(0, live, 500):
        c.send(put_cmd(body) * 500)
        for _ in range(500):
            read_inserted(c, "put of a live job")
    for _ in range(300):  # 120 MB of churn: the log is over 2 * 48 MB + 4 MiB
        c.send(put_cmd(body) * 100)
        ids = [read_inserted(c, "churn put") for _ in range(100)]
        c.send(b"".join(b"delete %d\r\n" % j for j in ids))
        for _ in ids:
            check_eq(c.read_line(what="delete"), b"DELETED\r\n", "churn delete")
    c.close()
    srv.stop_checked()
    srv.args = ["-f", "50", "-s", str(4 << 20)]
    srv.http = True
    srv.start()
    check_eq(stats_json(srv.http_port)["binlog_records_migrated"], 0, "records migrated before the first command")
    with open("/proc/%d/clear_refs" % srv.proc.pid, "w") as f:
        f.write("5")  # reset VmHWM to the RSS now
    rss_before = vm_kib(srv.proc.pid, "VmRSS")
    c = srv.connect()
    put(c, b"the first record after the start")  # its batch begins the snapshot
    testlib.wait_until(lambda: stats_json(srv.http_port)["binlog_records_migrated"] >= live,
                       "a snapshot of every live job", 60.0)
    grew = vm_kib(srv.proc.pid, "VmHWM") - rss_before
    log("compaction of %d live 4 KB jobs: peak RSS %.1f MB over the %.1f MB before it"
        % (live, grew / 1024.0, rss_before / 1024.0))
    c.close()
    srv.stop_checked()
    if testlib.is_asan_build(BINARY):
        raise testlib.Skip("ASan build: RSS figures are the sanitizer's (measured: +%.1f MB)" % (grew / 1024.0))
    check(grew < 16 * 1024, "peak RSS grew %.1f MB during compaction, want < 16 MB" % (grew / 1024.0))


def read_peek_cmd(c, jid):
    c.send(b"peek %d\r\n" % jid)
    return read_peek(c, jid)


def test_disk_full_http_says_log_unavailable():
    """While the log cannot write, an HTTP put is refused with 503 and code
    LOG_UNAVAILABLE (not OUT_OF_MEMORY: nothing is wrong with memory), and a
    beanstalk put with the reference's bytes, OUT_OF_MEMORY."""
    d = new_dir("disk_full_http")
    srv = Server(d, ["-f", "50"], http=True).start()
    status, doc = http_put(srv.http_port, "t", b"before")
    check_eq(status, 201, "HTTP put before the failure")
    largest = max(segments(d).values())
    set_fsize(srv.proc.pid, largest + 64)
    try:
        c = srv.connect(timeout=2.0)
        # puts are taken until the flusher's write fails; then refused
        deadline = time.monotonic() + 5.0
        while "event=wal_failure" not in srv.stderr():
            check(time.monotonic() < deadline, "no event=wal_failure within 5 s of the limit; stderr: %s"
                  % srv.stderr()[-600:])
            c.send(put_cmd(b"x" * 500))
            line = c.read_line(timeout=2.0)
            check(line.startswith(b"INSERTED ") or line == b"OUT_OF_MEMORY\r\n",
                  "beanstalk put while the limit takes effect: got %s" % show(line))
            time.sleep(0.05)
        status, doc = http_put(srv.http_port, "t", b"during")
        check_eq(status, 503, "HTTP put while the log cannot write")
        check_eq(doc.get("code"), "LOG_UNAVAILABLE", "problem code of that put (%r)" % (doc,))
        conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=2.0)
        conn.request("GET", "/readyz")
        resp = conn.getresponse()
        ready = (resp.status, json.loads(resp.read()).get("code"))
        conn.close()
        check_eq(ready, (503, "LOG_UNAVAILABLE"), "GET /readyz while the log cannot write")
        c.cmd(put_cmd(b"during"), b"OUT_OF_MEMORY\r\n", "beanstalk put while the log cannot write")
        c.close()
    finally:
        set_fsize(srv.proc.pid, None)
    testlib.wait_until(lambda: http_put(srv.http_port, "t", b"after"), "an HTTP put accepted after the limit was lifted",
                       ok=lambda got: got[0] == 201)
    srv.stop_checked()


# ---- 5. the lock --------------------------------------------------------------------------

def test_lock_second_server_refused():
    d = new_dir("lock")
    srv = Server(d, ["-f", "0"]).start()
    c = srv.connect()
    jid = put(c, b"first server")
    argv = [BINARY, "-l", "127.0.0.1", "-p", str(free_port())] + NO_HTTP + ["-b", d]
    t0 = time.monotonic()
    try:
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=5)
    except subprocess.TimeoutExpired:
        raise AssertionError("a second server on the same directory still runs after 5 s (killed)") from None
    took = time.monotonic() - t0
    err = r.stderr.decode(errors="replace")
    check(r.returncode != 0, "the second server exited with status 0; stderr: %s" % err)
    check("lock" in err.lower(), "the second server's message does not mention the lock: %r" % err)
    check(took < 3, "the second server took %.1f s to give up" % took)
    check(not any(m in err for m in SANITIZER_MARKERS), "sanitizer report from the second server: %s" % err)
    # the first one is unharmed
    jid2 = put(c, b"first server, still")
    got = peek_many(c, [jid, jid2])
    check_eq(got[jid], b"first server", "first job")
    check_eq(got[jid2], b"first server, still", "second job")
    c.close()
    srv.stop_checked()
    # the lock goes with the process
    srv.start()
    c = srv.connect()
    check_eq(peek_many(c, [jid2])[jid2], b"first server, still", "job after a restart on the directory")
    c.close()
    srv.stop_checked()


# ---- 6. torn and corrupt tails ----------------------------------------------------------

def newest_segment(d):
    segs = segments(d)
    check(segs, "no segment in %s" % d)
    i = max(segs)
    return os.path.join(d, "beangate.%d.wal" % i), segs[i]


# A server with -f 0 on a new directory `name` that has taken each body, one put at a
# time (the i-th with priority pri(i)), its connection closed: (dir, server, {id: body}).
def server_with_jobs(name, bodies, pri=lambda i: 0):
    d = new_dir(name)
    srv = Server(d, ["-f", "0"]).start()
    c = srv.connect()
    jobs = {}
    for i, body in enumerate(bodies):
        jobs[put(c, body, pri=pri(i))] = body
    c.close()
    return d, srv, jobs


# Start srv on a log whose tail was damaged (by `damage`, for the message) and check that its
# stderr reports a torn tail or corrupt record; a new connection and {id: body or None} of ids.
def start_on_damaged_log(srv, ids, damage):
    srv.start()
    err = srv.stderr()
    check(any(e in err for e in ("event=wal_torn_tail", "event=wal_corrupt_record")),
          "no event=wal_torn_tail / wal_corrupt_record on stderr after %s: %s" % (damage, err[-600:]))
    c = srv.connect()
    return c, peek_many(c, sorted(ids))


def test_torn_tail_garbage_appended():
    d, srv, jobs = server_with_jobs("torn_garbage", [b"job %d " % i + bytes(range(i, i + 40)) for i in range(20)],
                                    pri=lambda i: i)
    srv.stop_checked()
    path, size = newest_segment(d)
    check(size > JOURNAL_HEADER, "the newest segment %s has no records (%d bytes)" % (path, size))
    garbage = bytes(random.Random(SEED + 6).randbytes(37))
    with open(path, "ab") as f:
        f.write(garbage)
    c, got = start_on_damaged_log(srv, jobs, "37 garbage bytes")
    for jid, body in jobs.items():
        check_eq(got[jid], body, "job %d after the garbage tail" % jid)
    new_id = put(c, b"after the garbage")
    check(new_id > max(jobs), "put after the restart got id %d, want > %d" % (new_id, max(jobs)))
    jobs[new_id] = b"after the garbage"
    c.close()
    # and once more: the damaged segment and the new one together
    srv.restart(signal.SIGTERM)
    c = srv.connect()
    check_bodies(c, jobs, "after a second restart")
    c.close()
    srv.stop_checked()


def test_torn_tail_last_record_cut():
    # -f 0 and one put at a time: one record per synced batch
    d, srv, jobs = server_with_jobs("torn_cut", [b"cut test %d " % i + b"x" * (50 + i) for i in range(20)])
    last = max(jobs)
    srv.kill()
    path, size = newest_segment(d)
    check(size >= JOURNAL_HEADER + put_record_size("default", len(jobs[last])),
          "the newest segment is too short (%d bytes) to hold the last put" % size)
    with open(path, "r+b") as f:
        f.truncate(size - 5)
    c, got = start_on_damaged_log(srv, jobs, "cutting the last record")
    for jid, body in jobs.items():
        if jid == last:
            check_eq(got[jid], None, "job %d whose record was cut (the reader must not guess)" % jid)
        else:
            check_eq(got[jid], body, "job %d (complete record) after the cut" % jid)
    c.close()
    srv.stop_checked()


def put_then_kill(name, n, prefix):
    """A server on a new directory with -f 0: n puts of prefix + number, then
    SIGKILL. Returns (dir, server, {id: body})."""
    d, srv, jobs = server_with_jobs(name, [b"%s %d" % (prefix, i) for i in range(n)])
    srv.kill()
    return d, srv, jobs


def test_torn_empty_newest_segment():
    """A crash right after a segment file was created leaves it empty (no
    header): it is ignored, everything before it is kept."""
    d, srv, jobs = put_then_kill("torn_empty", 5, b"before the empty segment")
    newest = max(segments(d))
    open(os.path.join(d, "beangate.%d.wal" % (newest + 1)), "wb").close()
    srv.start()
    c = srv.connect()
    got = peek_many(c, sorted(jobs))
    for jid, body in jobs.items():
        check_eq(got[jid], body, "job %d after an empty newest segment" % jid)
    new_id = put(c, b"after")
    check(new_id > max(jobs), "put after the restart got id %d, want > %d" % (new_id, max(jobs)))
    c.close()
    srv.stop_checked()


def test_torn_tail_is_cut_so_later_starts_are_clean():
    """A torn tail of the newest segment is dropped with a warning, and cut
    off the file: once the next start has begun a newer segment, the older
    one must not look damaged (which would refuse every later start)."""
    d, srv, jobs = put_then_kill("torn_then_restarts", 10, b"before the cut")
    path, size = newest_segment(d)
    with open(path, "r+b") as f:
        f.truncate(size - 3)
    last = max(jobs)
    del jobs[last]
    srv.start()
    check("event=wal_torn_tail" in srv.stderr(), "no wal_torn_tail after cutting the last record: %s"
          % srv.stderr()[-600:])
    check(os.path.getsize(path) < size - 3, "the torn tail of %s was not cut off the file (%d bytes, was %d)"
          % (path, os.path.getsize(path), size - 3))
    c = srv.connect()
    jobs[put(c, b"after the first restart")] = b"after the first restart"
    c.close()
    for sig in (signal.SIGKILL, signal.SIGTERM):
        srv.restart(sig)
        check_no_torn(srv, "restart after %s, after a torn tail was dropped" % signal.Signals(sig).name)
        check("event=wal_damaged" not in srv.stderr(), "false damage: %s" % srv.stderr()[-600:])
        c = srv.connect()
        check_bodies(c, jobs, "after the restart")
        c.close()
    srv.stop_checked()
    code, out, err = check_log(d)
    check(code == 0 and "result=clean" in out, "--check-log after the restarts: exit %d, %s %s" % (code, out, err))


# ---- 6b. log damage: refuse, --log-recover-damaged, --check-log -----------------

DAMAGE_SEG = 65536        # -s for the damage tests: ~350 jobs of 100 bytes per segment
DAMAGE_JOBS = 1300        # puts: four full segments and a fifth


def read_records(path):
    """[(offset, type, id or None, size)] of a segment's records (an
    undamaged one: no checksum check), core/journal.c's format."""
    with open(path, "rb") as f:
        data = f.read()
    out, at = [], JOURNAL_HEADER
    while at + 9 <= len(data):
        n = int.from_bytes(data[at:at + 4], "little")
        if at + 9 + n > len(data):
            break
        typ = data[at + 8]
        jid = int.from_bytes(data[at + 9:at + 17], "little") if typ in (1, 2, 3) else None
        out.append((at, typ, jid, 9 + n))
        at += 9 + n
    return out


def damage_base(name):
    """A log of 5+ segments: DAMAGE_JOBS puts; then 5 jobs of segment 2
    buried and 3 deleted (their records go to the newest segment).
    Returns (dir, {id: body} alive, {index: [put ids]})."""
    d = new_dir(name)
    srv = Server(d, ["-f", "0", "-s", str(DAMAGE_SEG)]).start()
    c = srv.connect()
    jobs = {}
    for start in range(0, DAMAGE_JOBS, 100):
        bodies = [b"damage test job %05d " % i + b"d" * 80 for i in range(start, start + 100)]
        c.send(b"".join(put_cmd(b) for b in bodies))
        for b in bodies:
            jobs[read_inserted(c, "put")] = b
    c.close()
    srv.stop_checked()
    by_seg = {i: [r[2] for r in read_records(os.path.join(d, "beangate.%d.wal" % i)) if r[1] == 1]
              for i in segments(d)}
    check(len(by_seg) >= 5 and len(by_seg[2]) > 100, "the base log has segments %s" %
          {i: len(v) for i, v in by_seg.items()})
    srv.start()
    c = srv.connect()
    for jid in by_seg[2][10:15]:
        c.cmd(b"reserve-job %d\r\n" % jid, job_reply(b"RESERVED", jid, jobs[jid]))
        c.cmd(b"bury %d 0\r\n" % jid, b"BURIED\r\n")
    for jid in by_seg[2][20:23]:
        c.cmd(b"delete %d\r\n" % jid, b"DELETED\r\n")
        del jobs[jid]
    c.close()
    srv.stop_checked()
    return d, jobs, by_seg


def start_expecting_exit(d, args=(), env=None):
    """Start a server on d that must refuse: (exit status, stderr)."""
    argv = [BINARY, "-l", "127.0.0.1", "-p", str(free_port()), "-b", d] + NO_HTTP + list(args)
    try:
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           timeout=30, env=dict(os.environ, **(env or {})))
    except subprocess.TimeoutExpired:
        raise AssertionError("a server on the damaged log %s still runs after 30 s (killed): it did not "
                             "refuse to start" % d) from None
    err = r.stderr.decode(errors="replace")
    check(not any(m in err for m in SANITIZER_MARKERS), "sanitizer report: %s" % err[-2000:])
    return r.returncode, err


def check_log(d):
    """beangate --check-log d: (exit status, stdout, stderr)."""
    r = subprocess.run([BINARY, "--check-log", d], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=60)
    err = r.stderr.decode(errors="replace")
    check(not any(m in err for m in SANITIZER_MARKERS), "sanitizer report from --check-log: %s" % err[-2000:])
    return r.returncode, r.stdout.decode(errors="replace"), err


def kv_line(text, prefix):
    """The key=value pairs of the first line of text starting with prefix
    (a dict), or None."""
    for line in text.splitlines():
        if line.startswith(prefix):
            return dict(re.findall(r'(\w+)=("[^"]*"|\S+)', line))
    return None


def dir_state(d):
    """{name: (size, mtime_ns, bytes)} of every file in d."""
    out = {}
    for n in sorted(os.listdir(d)):
        p = os.path.join(d, n)
        with open(p, "rb") as f:
            out[n] = (os.path.getsize(p), os.stat(p).st_mtime_ns, f.read())
    return out


def check_refused(d, file, what, offset=None):
    """A start on d exits 111 naming file (and offset), and changes nothing."""
    before = dir_state(d)
    code, err = start_expecting_exit(d)
    check(code == 111, "start on a log with %s exited %r, want 111; stderr: %s" % (what, code, err[-800:]))
    ev = kv_line(err[err.find("event=wal_damaged"):], "event=wal_damaged") if "event=wal_damaged" in err else None
    check(ev is not None and ev.get("file") == file, "start on a log with %s: no event=wal_damaged naming %s; "
          "stderr: %s" % (what, file, err[-800:]))
    if offset is not None:
        check_eq(ev.get("offset"), str(offset), "offset in the wal_damaged line (%s)" % what)
    check("event=wal_refused" in err and "event=listening" not in err,
          "start on a log with %s: want event=wal_refused and no listening; stderr: %s" % (what, err[-800:]))
    check(dir_state(d) == before, "a refused start changed the log directory (%s)" % what)
    return ev, err


def check_recovered(d, jobs, dropped, file, what, via_env=False):
    """Start d with --log-recover-damaged (or BEANGATE_LOG_RECOVER_DAMAGED=1):
    it logs the drop of file, serves every job in jobs but not those in
    dropped; a snapshot then makes the next plain start clean."""
    if via_env:
        os.environ["BEANGATE_LOG_RECOVER_DAMAGED"] = "1"
        try:
            srv = Server(d, ["-f", "0", "-s", str(DAMAGE_SEG)]).start()
        finally:
            del os.environ["BEANGATE_LOG_RECOVER_DAMAGED"]
    else:
        srv = Server(d, ["-f", "0", "-s", str(DAMAGE_SEG), "--log-recover-damaged"]).start()
    err = srv.stderr()
    ev = kv_line(err[err.find("event=wal_damage_dropped"):], "event=wal_damage_dropped") \
        if "event=wal_damage_dropped" in err else None
    check(ev is not None and ev.get("file") == file and "level=warn" in err,
          "%s, --log-recover-damaged: no warn event=wal_damage_dropped naming %s: %s" % (what, file, err[-800:]))
    check("event=wal_recovered_damaged" in err, "%s: no wal_recovered_damaged summary: %s" % (what, err[-800:]))
    c = srv.connect()
    got = peek_many(c, sorted(set(jobs) | set(dropped)))
    missing = [j for j in sorted(jobs) if j not in dropped and got[j] != jobs[j]]
    back = [j for j in sorted(dropped) if got[j] is not None]
    check(not missing, "%s, --log-recover-damaged: %d jobs before the damage or in later segments are not "
          "served, e.g. %s" % (what, len(missing), missing[:10]))
    check(not back, "%s: %d jobs after the damage point are served, e.g. %s" % (what, len(back), back[:10]))
    new_id = put(c, b"after the damaged start")
    check(new_id > max(set(jobs) | set(dropped)), "put after the damaged start got id %d, want > %d"
          % (new_id, max(set(jobs) | set(dropped))))
    jobs[new_id] = b"after the damaged start"
    # the snapshot of what was recovered supersedes the damaged segments
    damaged_index = int(file.split(".")[1])
    testlib.wait_until(lambda: int(c.yaml(b"stats")["binlog-oldest-index"]) > damaged_index,
                       "%s: a snapshot to supersede %s" % (what, file), timeout=20)
    c.close()
    srv.stop_checked()
    check(os.path.exists(os.path.join(d, file + ".damaged")) or not os.path.exists(os.path.join(d, file)),
          "%s: %s is still in use after the snapshot" % (what, file))
    # a plain start is clean now, with the same jobs
    srv.args = ["-f", "0", "-s", str(DAMAGE_SEG)]
    srv.start()
    check("event=wal_damaged" not in srv.stderr() and "wal_torn_tail" not in srv.stderr(),
          "%s: the start after the recovered one still finds damage: %s" % (what, srv.stderr()[-800:]))
    c = srv.connect()
    got = peek_many(c, sorted(jobs))
    wrong = [j for j in sorted(jobs) if j not in dropped and got[j] != jobs[j]]
    check(not wrong, "%s: after the snapshot and a plain restart, %d jobs are wrong, e.g. %s"
          % (what, len(wrong), wrong[:10]))
    c.close()
    srv.stop_checked()


def test_damage_missing_middle_segment_refuses():
    d, jobs, by_seg = damage_base("missing_segment")
    os.remove(os.path.join(d, "beangate.2.wal"))
    ev, err = check_refused(d, "beangate.2.wal", "beangate.2.wal deleted")
    check_eq(ev.get("damage"), "missing_segment", "damage of a deleted segment")
    refused = kv_line(err[err.find("event=wal_refused"):], "event=wal_refused")
    check_eq(refused.get("missing_segments"), "1", "missing_segments in wal_refused")
    # 5 jobs of segment 2 were buried later and not deleted: known lost
    check_eq(refused.get("jobs_lost_at_least"), "5", "jobs_lost_at_least (buried later, put in the gap)")
    code, out, _ = check_log(d)
    check(code == 1, "--check-log on a log with a missing segment exited %d, want 1; %s" % (code, out))
    seg = kv_line(out, "segment index=2 ")
    check(seg is not None and seg.get("status") == "missing", "--check-log: no missing line for segment 2: %s" % out)
    summary = kv_line(out, "summary ")
    check(summary is not None and summary.get("result") == "damaged", "--check-log summary: %s" % out)
    alive_seg2 = [j for j in by_seg[2] if j in jobs]
    check_eq(summary.get("live_jobs"), str(len(jobs) - len(alive_seg2) + 0), "live_jobs after replay")
    code, err = start_expecting_exit(d, env={"BEANGATE_LOG_RECOVER_DAMAGED": "maybe"})
    check(code == 5 and "BEANGATE_LOG_RECOVER_DAMAGED" in err, "BEANGATE_LOG_RECOVER_DAMAGED=maybe: exit %r, %s"
          % (code, err[-400:]))
    check_recovered(d, jobs, set(by_seg[2]), "beangate.2.wal", "a deleted middle segment", via_env=True)


def damage_case(name, damage):
    """Damage segment 2 (not the newest) with damage(data, records) ->
    (offset of the first bad record); check the refusal, --check-log and
    the recovered start."""
    d, jobs, by_seg = damage_base(name)
    path = os.path.join(d, "beangate.2.wal")
    records = read_records(path)
    with open(path, "rb") as f:
        data = bytearray(f.read())
    size = len(data)
    k = len(records) // 2
    offset = damage(data, records, k)
    with open(path, "wb") as f:
        f.write(data)
    ev, err = check_refused(d, "beangate.2.wal", name, offset)
    check_eq(ev.get("dropped_bytes"), str(size - offset), "dropped_bytes (%s)" % name)
    code, out, _ = check_log(d)
    check(code == 1, "--check-log on %s exited %d, want 1; %s" % (name, code, out))
    seg = kv_line(out, "segment index=2 ")
    check(seg is not None and seg.get("status") == "damaged" and seg.get("offset") == str(offset),
          "--check-log line of segment 2 (%s): %s" % (name, out))
    check_eq(seg.get("records"), str(k), "records read before the damage (%s)" % name)
    for i in segments(d):
        if i != 2:
            check_eq(kv_line(out, "segment index=%d " % i).get("status"), "ok", "segment %d (%s)" % (i, name))
    check_eq(kv_line(out, "summary ").get("result"), "damaged", "--check-log result (%s)" % name)
    dropped = {r[2] for r in records[k:] if r[1] == 1}
    check_recovered(d, jobs, dropped, "beangate.2.wal", name)
    return ev


def test_damage_flipped_byte_in_older_segment_refuses():
    def flip(data, records, k):
        at, _t, _j, n = records[k]
        data[at + n - 20] ^= 0x10   # a byte of the body
        return at
    ev = damage_case("flipped_byte", flip)
    check_eq(ev.get("damage"), "checksum", "damage of a flipped body byte")


def test_damage_zeroed_block_in_older_segment_refuses():
    def zero(data, records, k):
        at = records[k][0] + 30
        data[at:at + 4096] = bytes(4096)
        return records[k][0]
    damage_case("zeroed_block", zero)


def test_damage_bad_length_in_older_segment_refuses():
    def length(data, records, k):
        at = records[k][0]
        data[at:at + 4] = (0x7FFFFFFF).to_bytes(4, "little")
        return at
    ev = damage_case("bad_length", length)
    check_eq(ev.get("damage"), "bad_frame", "damage of a bad length field")


def test_damage_in_newest_segment_before_more_records_refuses():
    """A bad record in the newest segment followed by readable records is
    damage, not a torn tail."""
    d = new_dir("newest_middle")
    srv = Server(d, ["-f", "0"]).start()
    c = srv.connect()
    for i in range(40):
        put(c, b"newest %d" % i)
    c.close()
    srv.stop_checked()
    path, _size = newest_segment(d)
    records = read_records(path)
    with open(path, "r+b") as f:
        f.seek(records[10][0] + records[10][3] - 4)
        f.write(b"!")
    check_refused(d, os.path.basename(path), "a bad record in the middle of the newest segment", records[10][0])


def test_check_log_clean_and_torn_and_read_only():
    d = new_dir("check_clean")
    srv = Server(d, ["-f", "0", "-s", "8192"]).start()
    c = srv.connect()
    ids = [put(c, b"check job %d " % i + b"c" * 100) for i in range(200)]
    for jid in ids[:30]:
        c.cmd(b"delete %d\r\n" % jid, b"DELETED\r\n")
    c.close()
    srv.stop_checked()
    os.remove(os.path.join(d, "lock"))
    before = dir_state(d)
    code, out, err = check_log(d)
    check(code == 0, "--check-log on a clean log exited %d; %s %s" % (code, out, err))
    check(dir_state(d) == before, "--check-log changed the directory (it must only read)")
    for i in segments(d):
        line = kv_line(out, "segment index=%d " % i)
        check(line is not None, "--check-log printed no line for segment %d: %s" % (i, out))
        recs = read_records(os.path.join(d, "beangate.%d.wal" % i))
        check_eq(line.get("job"), str(sum(1 for r in recs if r[1] == 1)), "job records of segment %d" % i)
        check_eq(line.get("delete"), str(sum(1 for r in recs if r[1] == 3)), "delete records of segment %d" % i)
        check_eq(line.get("bytes"), str(os.path.getsize(os.path.join(d, "beangate.%d.wal" % i))), "bytes")
        check_eq(line.get("status"), "ok", "status of segment %d" % i)
    summary = kv_line(out, "summary ")
    check_eq(summary.get("live_jobs"), "170", "live_jobs of the clean log")
    check_eq(summary.get("result"), "clean", "result of the clean log")
    # while a server holds the directory: the check works and the server is unharmed
    srv.start()
    code, out, err = check_log(d)
    check(code == 0 and kv_line(out, "summary ").get("live_jobs") == "170",
          "--check-log while a server runs: exit %d, %s %s" % (code, out, err))
    c = srv.connect()
    check_eq(peek_many(c, [ids[-1]])[ids[-1]], b"check job 199 " + b"c" * 100, "a job after the check")
    c.close()
    srv.stop_checked()
    # a torn tail: exit 0, reported
    path, size = newest_segment(d)
    with open(path, "ab") as f:
        f.write(b"\x55" * 37)
    code, out, err = check_log(d)
    idx = int(os.path.basename(path).split(".")[1])
    line = kv_line(out, "segment index=%d " % idx)
    check(code == 0, "--check-log on a torn tail exited %d, want 0; %s" % (code, out))
    check(line is not None and line.get("status") == "torn_tail" and line.get("offset") == str(size)
          and line.get("dropped_bytes") == "37", "--check-log line of the torn segment: %s" % out)
    check_eq(kv_line(out, "summary ").get("result"), "torn_tail", "result with a torn tail")
    # usage
    r = subprocess.run([BINARY, "--check-log"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=10)
    check(r.returncode == 5, "--check-log without DIR exited %d, want 5" % r.returncode)
    r = subprocess.run([BINARY, "--check-log", os.path.join(d, "nope")], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=10)
    check(r.returncode == 2 and not os.path.exists(os.path.join(d, "nope")),
          "--check-log on a missing directory exited %d (want 2) or created it" % r.returncode)


# ---- 7. -f 50 and -F flush at exit ------------------------------------------------------

def check_mode_survives_sigterm(mode_args, name):
    d = new_dir("mode_" + name)
    srv = Server(d, mode_args).start()
    c = srv.connect()
    jobs = {}
    states = {}
    use(c, b"m1")
    cmds = []
    bodies = []
    for i in range(200):
        body = b"%s job %d\r\n\x00" % (name.encode(), i)
        bodies.append(body)
        cmds.append(put_cmd(body, pri=i, delay=1000 if i % 10 == 0 else 0))
    c.send(b"".join(cmds))
    for i, body in enumerate(bodies):
        jid = read_inserted(c, "put %d" % i)
        jobs[jid] = body
        states[jid] = "delayed" if i % 10 == 0 else "ready"
    bury = sorted(j for j, s in states.items() if s == "ready")[:5]
    for jid in bury:
        c.cmd(b"reserve-job %d\r\n" % jid, job_reply(b"RESERVED", jid, jobs[jid]))
        c.cmd(b"bury %d 5\r\n" % jid, b"BURIED\r\n")
        states[jid] = "buried"
    gone = sorted(jobs)[-3:]
    for jid in gone:
        c.cmd(b"delete %d\r\n" % jid, b"DELETED\r\n")
        del jobs[jid], states[jid]
    c.close()
    srv.stop_checked()  # right away: the tail is written at exit
    srv.start()
    check_no_torn(srv, name + " restart")
    c = srv.connect()
    got = peek_many(c, sorted(jobs) + gone)
    for jid in gone:
        check_eq(got[jid], None, "%s: deleted job %d after the restart" % (name, jid))
    for jid, body in jobs.items():
        check_eq(got[jid], body, "%s: job %d after the restart" % (name, jid))
        st = c.yaml(b"stats-job %d" % jid)
        check_eq(st["state"], states[jid], "%s: state of job %d" % (name, jid))
    c.close()
    srv.stop_checked()


def test_fsync_modes_f50_survives_sigterm():
    check_mode_survives_sigterm(["-f", "50"], "f50")


def test_fsync_modes_F_survives_sigterm():
    check_mode_survives_sigterm(["-F"], "F")


class PutStream(threading.Thread):
    """Pipelines puts (20 per write) and records every INSERTED, until the
    connection dies."""

    def __init__(self, srv, seed):
        super().__init__(daemon=True)
        self.srv = srv
        self.rng = random.Random(seed)
        self.acked = {}
        self.error = None
        self.stopping = False

    def run(self):
        c = None
        t_end = time.monotonic() + 15
        try:
            c = self.srv.connect(timeout=READ_TIMEOUT)
            for _round in range(100000):
                if time.monotonic() > t_end:
                    break
                bodies = [self.rng.randbytes(self.rng.randint(1, 3000)) for _ in range(20)]
                c.send(b"".join(put_cmd(b) for b in bodies))
                for b in bodies:
                    line = c.read_line(what="put")
                    if not line.startswith(b"INSERTED "):
                        if not self.stopping:
                            self.error = "put: %s" % show(line)
                        return
                    self.acked[int(line[9:-2])] = b
        except ConnLost:
            pass
        except (AssertionError, OSError) as e:
            if not self.stopping:
                self.error = str(e)
        finally:
            if c:
                c.close()


def check_sigterm_under_load(mode_args, name, rounds=5):
    rng = random.Random(SEED + 7)
    d = new_dir("load_" + name)
    srv = Server(d, mode_args)
    acked = {}

    def verify(when):
        c = srv.connect(timeout=10.0)
        got = peek_many(c, sorted(acked))
        c.close()
        missing = [j for j in sorted(acked) if got[j] is None]
        changed = [j for j in sorted(acked) if got[j] is not None and got[j] != acked[j]]
        err = srv.stderr()
        torn = [line for line in err.splitlines() if any(e in line for e in TORN_EVENTS)]
        problems = []
        if missing:
            problems.append("%d of %d acknowledged puts missing (ids %d..%d, e.g. %s)"
                            % (len(missing), len(acked), missing[0], missing[-1], missing[:8]))
        if changed:
            problems.append("%d acknowledged puts have another body (e.g. id %d)" % (len(changed), changed[0]))
        if torn:
            problems.append("the log was damaged although the server was only stopped with SIGTERM: %s"
                            % "; ".join(torn[:3]))
        check(not problems, "%s: %s: %s" % (name, when, "; ".join(problems)))

    for rnd in range(rounds):
        srv.start()
        if rnd:
            verify("restart %d after SIGTERM under load" % rnd)
        streams = [PutStream(srv, rng.randrange(1 << 30)) for _ in range(2)]
        for s in streams:
            s.start()
        time.sleep(rng.uniform(0.2, 0.6))  # the point: SIGTERM comes at a random moment of the load
        for s in streams:
            s.stopping = True
        srv.stop_checked()
        for s in streams:
            s.join(10)
            check(not s.is_alive(), "%s: a writer still runs after the server stopped" % name)
            check(s.error is None, "%s: writer: %s" % (name, s.error))
            acked.update(s.acked)
    srv.start()
    verify("last restart after SIGTERM under load")
    srv.stop_checked()
    log("%s: %d acknowledged puts over %d SIGTERM restarts under load, all there" % (name, len(acked), rounds))


def test_sigterm_under_load_f50():
    check_sigterm_under_load(["-f", "50"], "f50")


def test_sigterm_under_load_F():
    check_sigterm_under_load(["-F"], "F")


def test_sigterm_under_load_f0():
    check_sigterm_under_load(["-f", "0"], "f0")


# ---- 9. when a reply may go (issue 21) -------------------------------------------------------

QUIET = 1.5               # a reply that must not come is waited for this long


def fail_next_write(srv, d):
    """The log's next write past the newest segment's end fails (RLIMIT_FSIZE)."""
    set_fsize(srv.proc.pid, max(segments(d).values()) + 64)


def wait_log_failed(srv, what):
    testlib.wait_until(lambda: "event=wal_failure" in srv.stderr(), "event=wal_failure (%s)" % what,
                       timeout=10.0)


def silent_for(sock, seconds, what):
    """Nothing arrives on sock for `seconds` (a reply that must not be sent yet)."""
    sock.settimeout(seconds)
    try:
        got = sock.recv(4096)
    except socket.timeout:
        return
    raise AssertionError("%s: got %s, want nothing yet" % (what, show(got)))


class HttpPut(threading.Thread):
    """One HTTP put in the background: status (None: the connection closed
    without one) and body."""

    def __init__(self, port, tube, body, headers=None, timeout=30.0):
        super().__init__(daemon=True)
        self.args = (port, tube, body, headers or {}, timeout)
        self.status = self.doc = self.error = self.answered_at = None

    def run(self):
        port, tube, body, headers, timeout = self.args
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        try:
            conn.request("POST", "/tubes/%s/jobs" % tube, body=body, headers=headers)
            resp = conn.getresponse()
            self.answered_at = time.monotonic()
            self.status = resp.status
            self.doc = json.loads(resp.read() or b"null")
        except (OSError, http.client.HTTPException, ValueError) as e:
            self.error = "%s: %s" % (type(e).__name__, e)
        finally:
            conn.close()


def test_failed_log_holds_replies():
    """Defect 1: with -f 0, after the log failed a write, a DELETED on
    another connection is not sent until the log holds the delete; once it
    was sent, the job does not come back after SIGKILL and a restart."""
    d = new_dir("failed_log_holds")
    srv = Server(d, ["-f", "0"]).start()
    c = srv.connect()
    jid = put(c, b"to be deleted")
    fail_next_write(srv, d)
    c.send(put_cmd(b"x" * 500))      # its write fails: the log is failing from here
    wait_log_failed(srv, "a put past the file-size limit")
    other = srv.connect()
    other.send(b"delete %d\r\n" % jid)
    silent_for(other.sock, QUIET, "DELETED while the log cannot write")
    set_fsize(srv.proc.pid, None)    # the retry (once a second) gets it on disk
    other.expect(b"DELETED\r\n", "DELETED once the log took it", timeout=15.0)
    srv.kill()
    srv.start()
    c = srv.connect()
    c.cmd(b"peek %d\r\n" % jid, b"NOT_FOUND\r\n", "the deleted job after SIGKILL and a restart")
    srv.stop_checked()


def test_reserve_waits_for_the_put():
    """A reply that only shows a job (RESERVED) is not sent before the job's
    put is on disk: its id and body never escape before the put is kept."""
    d = new_dir("reserve_waits")
    srv = Server(d, ["-f", "0"]).start()
    c = srv.connect()
    put(c, b"first")
    fail_next_write(srv, d)
    c.send(put_cmd(b"y" * 500))
    wait_log_failed(srv, "a put past the file-size limit")
    w = srv.connect()
    w.cmd(b"reserve-with-timeout 0\r\n", b"RESERVED ", "the kept job is reserved at once")
    w.read_line()
    w.read_line()
    w.send(b"reserve-with-timeout 0\r\n")
    silent_for(w.sock, QUIET, "RESERVED of a job whose put is not on disk")
    srv.kill()
    srv.start()
    srv.stop_checked()


def slow_disk_server(name, delay, http=False):
    """A -f 0 server whose every sync of a segment waits `delay` seconds
    (BEANGATE_TEST_DISK_FAULTS): (server, faults)."""
    faults = disk_faults(name)
    srv = Server(new_dir(name), ["-f", "0"], http=http, env=faults.env()).start()
    faults.set(["sync delay %dms" % int(delay * 1000)])
    return srv, faults


def wait_put_done(srv):
    """The server made the job of a put whose answer is held (GET /stats)."""
    testlib.wait_until(lambda: stats_json(srv.http_port)["current_jobs_ready"], "the put made its job", 10.0,
                       ok=lambda n: n >= 1)


def test_waiting_reserve_gets_the_job_after_its_sync():
    """A worker waiting in `reserve` is handed a new job inside the put: its
    RESERVED (id and body) goes no earlier than the put's INSERTED, once
    the put is synced (-f 0, sync delay)."""
    delay = 1.5
    srv, faults = slow_disk_server("waiting_reserve", delay)
    w = srv.connect(timeout=20.0)
    w.send(b"reserve\r\n")
    silent_for(w.sock, 0.2, "reserve with nothing ready")
    c = srv.connect(timeout=20.0)
    t0 = time.monotonic()
    c.send(put_cmd(b"fresh"))
    w.expect(b"RESERVED ", "the waiting worker's job", timeout=20.0)
    took = time.monotonic() - t0
    log("waiting reserve: RESERVED %.2f s after the put" % took)
    check(took >= delay * 0.75, "RESERVED came %.2f s after the put, before its %.1f s sync ended" % (took, delay))
    read_inserted(c, "the put")
    faults.clear()
    srv.stop_checked()


def test_sigterm_never_sends_a_response_the_log_lacks():
    """Defect 3: SIGTERM while an HTTP put (-f 0) is held because the disk
    fails: no 201, and the job is not there after a restart."""
    d = new_dir("sigterm_held_http")
    srv = Server(d, ["-f", "0"], http=True).start()
    status, _ = http_put(srv.http_port, "t", b"before")
    check_eq(status, 201, "HTTP put before the failure")
    fail_next_write(srv, d)
    req = HttpPut(srv.http_port, "t", b"z" * 500)
    req.start()
    wait_log_failed(srv, "an HTTP put past the file-size limit")
    check(req.is_alive(), "the held put was answered while the log failed: %r %r" % (req.status, req.doc))
    status, took = srv.stop(signal.SIGTERM, STOP_TIMEOUT + 15)
    check(status is not None, "server did not exit after SIGTERM")
    req.join(10)
    check(req.status != 201, "the held put got 201 at SIGTERM although the log never had it: %r" % (req.doc,))
    srv.start()
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=5.0)
    conn.request("GET", "/tubes/t")
    doc = json.loads(conn.getresponse().read())
    conn.close()
    check_eq(doc.get("current_jobs_ready"), 1, "jobs in tube t after the restart (%r)" % (doc,))
    srv.stop_checked()


def test_sigterm_on_a_stalled_disk_answers_after_the_sync():
    """Defect 3 on a slow disk (BEANGATE_TEST_DISK_FAULTS: sync delay): a
    -f 0 HTTP put held for its sync at SIGTERM gets its 201 only once the
    sync is done (the stop finishes the log first), never at the signal;
    the job is there after a restart."""
    delay = 2.0
    srv, faults = slow_disk_server("sigterm_stalled_http", delay, http=True)
    t0 = time.monotonic()
    req = HttpPut(srv.http_port, "t", b"slow")
    req.start()
    wait_put_done(srv)
    check(req.is_alive(), "the put was answered before its sync: %r" % (req.status,))
    status, _ = srv.stop(signal.SIGTERM, STOP_TIMEOUT + 15)
    check_eq(status, 0, "exit status after SIGTERM")
    req.join(10)
    check_eq(req.status, 201, "the held put's answer once the log kept it (%s)" % req.error)
    took = req.answered_at - t0
    log("stalled disk: 201 %.2f s after the put" % took)
    check(took >= delay * 0.75, "201 came %.2f s after the put, before its %.1f s sync ended" % (took, delay))
    faults.clear()
    srv.start()
    c = srv.connect()
    c.send(b"peek %d\r\n" % req.doc["id"])
    check_eq(read_peek(c, req.doc["id"]), b"slow", "the acknowledged job after the restart")
    srv.stop_checked()


def test_idempotent_replay_waits_for_the_original():
    """Defect 4: a replay under the same Idempotency-Key is not answered 201
    before the original put is on disk."""
    d = new_dir("idem_replay")
    srv = Server(d, ["-f", "0"], http=True).start()
    status, _ = http_put(srv.http_port, "t", b"before")
    check_eq(status, 201, "HTTP put before the failure")
    fail_next_write(srv, d)
    body = b"k" * 500
    first = HttpPut(srv.http_port, "t", body, {"Idempotency-Key": "once"})
    first.start()
    wait_log_failed(srv, "a keyed put past the file-size limit")
    replay = HttpPut(srv.http_port, "t", body, {"Idempotency-Key": "once"})
    replay.start()
    replay.join(QUIET)
    check(replay.is_alive(), "the replay was answered before the original was on disk: %r %r"
          % (replay.status, replay.doc))
    set_fsize(srv.proc.pid, None)
    first.join(20)
    replay.join(20)
    check_eq((first.status, replay.status), (201, 201), "both answers once the log took the put")
    check_eq(replay.doc.get("id"), first.doc.get("id"), "the replay's job")
    srv.kill()
    srv.start()
    c = srv.connect()
    c.send(b"peek %d\r\n" % first.doc["id"])
    check(read_peek(c, first.doc["id"]) == body, "the acknowledged job after SIGKILL and a restart")
    srv.stop_checked()


def test_idempotent_replay_waits_on_a_slow_disk():
    """Defect 4 on a slow disk (sync delay): the replay's 201 does not come
    before the original's sync ended."""
    delay = 2.0
    srv, faults = slow_disk_server("idem_slow", delay, http=True)
    t0 = time.monotonic()
    first = HttpPut(srv.http_port, "t", b"keyed", {"Idempotency-Key": "slow"})
    first.start()
    wait_put_done(srv)
    replay = HttpPut(srv.http_port, "t", b"keyed", {"Idempotency-Key": "slow"})
    replay.start()
    first.join(20)
    replay.join(20)
    check_eq((first.status, replay.status), (201, 201), "both answers")
    took = replay.answered_at - t0
    log("slow disk: the replay answered %.2f s after the original put" % took)
    check(took >= delay * 0.75, "the replay's 201 came %.2f s after the put, before its %.1f s sync ended"
          % (took, delay))
    faults.clear()
    srv.stop_checked()


def test_id_of_a_lost_put_is_never_given_again():
    """Ids never come back (issue 21): with -f 50 a put is answered before
    its write; when that write fails and the process dies, the put is lost,
    but the id the client saw is not given to another job after the
    restart (the log's id floor is above it)."""
    d = new_dir("lost_put_id")
    faults = disk_faults("lost_put_id")
    srv = Server(d, ["-f", "50"], env=faults.env()).start()
    c = srv.connect()
    put(c, b"kept")
    testlib.wait_until(lambda: c.yaml(b"stats")["binlog-records-written"], "the first put written", 10.0,
                       ok=lambda n: int(n) >= 1)
    faults.set(["write EIO"])
    lost = put(c, b"lost")            # answered at once; its write fails
    wait_log_failed(srv, "the write of the lost put")
    srv.kill()
    faults.clear()
    srv.start()
    c = srv.connect()
    c.send(b"peek %d\r\n" % lost)
    check_eq(read_peek(c, lost), None, "the put whose write failed, after SIGKILL (lost, as -f 50 allows)")
    again = put(c, b"after")
    check(again > lost, "the first id after the restart is %d: id %d, seen by a client, given again"
          % (again, lost))
    srv.stop_checked()


class TcpPutter(threading.Thread):
    """Pipelines puts of unique bodies, 10 per write, until the connection
    ends: acked (bodies answered INSERTED), unanswered (sent, no answer)."""

    def __init__(self, srv, prefix):
        super().__init__(daemon=True)
        self.srv, self.prefix = srv, prefix
        self.acked, self.unanswered = [], []
        self.error = None

    def run(self):
        n = 0
        try:
            c = self.srv.connect(timeout=30.0)
        except OSError as e:
            self.error = str(e)
            return
        try:
            while True:
                bodies = [b"%s-%d" % (self.prefix, n + i) for i in range(10)]
                n += 10
                try:
                    c.send(b"".join(put_cmd(b) for b in bodies))
                except ConnLost:
                    self.unanswered += bodies
                    return
                for k, b in enumerate(bodies):
                    try:
                        line = c.read_line(timeout=30.0)
                    except (ConnLost, OSError):
                        self.unanswered += bodies[k:]
                        return
                    if not line.startswith(b"INSERTED "):
                        self.error = "put: %s" % show(line)
                        return
                    self.acked.append(b)
        except AssertionError as e:
            self.error = str(e)
        finally:
            c.close()


class HttpPutter(threading.Thread):
    """HTTP puts of unique bodies until the server goes: acked (201),
    refused (503: nothing done), unanswered (no status)."""

    def __init__(self, srv, prefix):
        super().__init__(daemon=True)
        self.srv, self.prefix = srv, prefix
        self.acked, self.refused, self.unanswered = [], [], []
        self.error = None

    def run(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.srv.http_port, timeout=30.0)
        n = 0
        try:
            while True:
                body = b"%s-%d" % (self.prefix, n)
                n += 1
                try:
                    conn.request("POST", "/tubes/default/jobs", body=body)
                    resp = conn.getresponse()
                    resp.read()
                except (OSError, http.client.HTTPException):
                    self.unanswered.append(body)
                    return
                if resp.status == 201:
                    self.acked.append(body)
                elif resp.status == 503:
                    self.refused.append(body)
                    return
                else:
                    self.error = "put: status %d" % resp.status
                    return
        finally:
            conn.close()


def drain_bodies(srv):
    """Every job's body (reserve and delete each)."""
    c = srv.connect(timeout=10.0)
    bodies = []
    while True:
        c.send(b"reserve-with-timeout 0\r\n")
        line = c.read_line()
        if line == b"TIMED_OUT\r\n":
            break
        check(line.startswith(b"RESERVED "), "drain: %s" % show(line))
        jid, n = (int(x) for x in line[9:-2].split())
        bodies.append(c.read_exact(n + 2)[:-2])
        c.cmd(b"delete %d\r\n" % jid, b"DELETED\r\n", "drain: delete")
    c.close()
    return bodies


def test_sigterm_answers_every_kept_put():
    """Defect 6: puts in flight over TCP and HTTP at SIGTERM (-f 0): every
    put the log kept was answered, so after a restart the jobs are exactly
    the answered puts; a client that retries only unanswered puts stores
    each body once."""
    rng = random.Random(SEED + 21)
    d = new_dir("sigterm_answers")
    srv = Server(d, ["-f", "0"], http=True).start()
    clients = [TcpPutter(srv, b"tcp%d" % i) for i in range(6)] + [HttpPutter(srv, b"http%d" % i) for i in range(4)]
    for t in clients:
        t.start()
    testlib.wait_until(lambda: sum(len(t.acked) for t in clients), "puts answered under load",
                       timeout=20.0, ok=lambda n: n >= 200)
    time.sleep(rng.uniform(0.0, 0.3))  # the point: SIGTERM at a random moment of the load
    srv.stop_checked(STOP_TIMEOUT + 15)
    for t in clients:
        t.join(30)
        check(not t.is_alive(), "a client still runs after the server stopped")
        check(t.error is None, "client: %s" % t.error)
    acked = [b for t in clients for b in t.acked]
    retry = [b for t in clients for b in t.unanswered + getattr(t, "refused", [])]
    srv.start()
    stored = drain_bodies(srv)
    extra = sorted(set(stored) - set(acked))
    missing = sorted(set(acked) - set(stored))
    log("sigterm: %d puts answered, %d unanswered or refused, %d jobs after the restart"
        % (len(acked), len(retry), len(stored)))
    check(not missing, "%d answered puts missing after the restart (e.g. %s)" % (len(missing), missing[:5]))
    check(not extra, "%d puts the log kept were never answered (a retry stores them twice), e.g. %s"
          % (len(extra), extra[:5]))
    check_eq(len(stored), len(set(stored)), "jobs after the restart without duplicates")
    # the client retries what was not answered: each body is stored once
    c = srv.connect()
    for b in retry:
        put(c, b)
    c.close()
    again = drain_bodies(srv)
    check_eq(sorted(again), sorted(set(retry)), "the retried puts, each once")
    srv.stop_checked()


# ---- 8. binlog stats ----------------------------------------------------------------------

def test_binlog_stats():
    d = new_dir("binlog_stats")
    srv = Server(d, ["-f", "0", "-s", "10000"]).start()
    c = srv.connect()
    st = c.yaml(b"stats")
    check_eq(st.get("binlog-max-size"), "12288", "binlog-max-size with -s 10000 (rounded up to 4096)")
    oldest, current = int(st["binlog-oldest-index"]), int(st["binlog-current-index"])
    check(current >= oldest >= 1, "binlog-current-index %d >= binlog-oldest-index %d >= 1" % (current, oldest))
    w0 = int(st["binlog-records-written"])
    for i in range(5):
        put(c, b"stats job %d" % i)
    st = c.yaml(b"stats")
    w1 = int(st["binlog-records-written"])
    check(w1 >= w0 + 5, "binlog-records-written %d after 5 puts, was %d" % (w1, w0))
    # more than a segment: the current index moves on
    use(c, b"fill")
    for i in range(40):
        put(c, b"f" * 500)
    st = c.yaml(b"stats")
    w2 = int(st["binlog-records-written"])
    check(w2 >= w1 + 40, "binlog-records-written %d after 40 more puts, was %d" % (w2, w1))
    o2, c2 = int(st["binlog-oldest-index"]), int(st["binlog-current-index"])
    check(c2 > current, "binlog-current-index %d after ~20 kB with -s 10000, was %d" % (c2, current))
    check(c2 >= o2 >= 1, "binlog-current-index %d >= binlog-oldest-index %d >= 1" % (c2, o2))
    check_eq(st.get("binlog-max-size"), "12288", "binlog-max-size later")
    c.close()
    srv.stop_checked()
    # without -b: zeros, and beanstalkd's default size
    srv = Server(None, []).start()
    c = srv.connect()
    st = c.yaml(b"stats")
    for k in ("binlog-oldest-index", "binlog-current-index", "binlog-records-written", "binlog-records-migrated"):
        check_eq(st.get(k), "0", "%s without -b" % k)
    check_eq(st.get("binlog-max-size"), "10485760", "binlog-max-size without -b")
    c.close()
    srv.stop_checked()
    for s_arg, want in (("65536", "65536"), ("1", "4096"), ("4097", "8192")):
        srv = Server(new_dir("binlog_stats_s%s" % s_arg), ["-s", s_arg]).start()
        c = srv.connect()
        check_eq(c.yaml(b"stats").get("binlog-max-size"), want, "binlog-max-size with -s " + s_arg)
        c.close()
        srv.stop_checked()


# ---- runner ---------------------------------------------------------------------------

# ---- the Gearman front-end's changes reach the log -------------------------------------

def gearman_packet(kind, *args):
    body = b"\0".join(args)
    return b"\0REQ" + struct.pack(">II", kind, len(body)) + body


def gearman_read(c, what):
    """One response packet: (type, [arguments])."""
    head = c.read_exact(12, what=what)
    check_eq(head[:4], b"\0RES", what + ": magic")
    kind, size = struct.unpack(">II", head[4:])
    return kind, c.read_exact(size, what=what).split(b"\0") if size else []


def test_can_do_timeout_ttr_survives_restart():
    """CAN_DO_TIMEOUT is the TTR of the job the worker grabs; the change is
    logged (with -f 0, before JOB_ASSIGN is sent), so the job comes back
    after a crash with that TTR."""
    d = new_dir("can_do_timeout")
    gport = free_port()
    srv = Server(d, ["-f", "0", "--gearman-port", str(gport)]).start()
    g = Conn(socket.create_connection(("127.0.0.1", gport), timeout=READ_TIMEOUT))
    g.send(gearman_packet(18, b"resize", b"", b"image 1"))          # SUBMIT_JOB_BG
    kind, args = gearman_read(g, "JOB_CREATED")
    check_eq(kind, 8, "JOB_CREATED")
    jid = int(args[0].rsplit(b":", 1)[1])
    g.send(gearman_packet(23, b"resize", b"7") + gearman_packet(9))  # CAN_DO_TIMEOUT, GRAB_JOB
    kind, args = gearman_read(g, "JOB_ASSIGN")
    check_eq(kind, 11, "JOB_ASSIGN")
    c = srv.connect()
    check_eq(c.yaml(b"stats-job %d" % jid).get("ttr"), "7", "ttr of the grabbed job")
    c.close()
    g.close()
    srv.restart(signal.SIGKILL)  # -f 0: JOB_ASSIGN came once its record was on disk
    c = srv.connect()
    st = c.yaml(b"stats-job %d" % jid)
    check(st is not None, "job %d is gone after the restart" % jid)
    check_eq(st.get("ttr"), "7", "ttr of job %d after the restart" % jid)
    check_eq(st.get("state"), "ready", "state of job %d after the restart" % jid)
    c.close()
    srv.stop_checked()


TESTS = [
    test_restart_full_state_sigterm,
    test_restart_full_state_sigkill,
    test_restart_pause_of_tube_without_jobs,
    test_restart_unpause_persists,
    test_restart_delay_runs_while_down,
    test_crash_cycles,
    test_crash_cycles_small_segments,
    test_crash_cycles_during_compaction,
    test_compaction_release_churn,
    test_compaction_put_delete_churn,
    test_ids_not_reused_after_compaction,
    test_old_segment_back_after_snapshot_is_ignored,
    test_unknown_format_version_refuses_start,
    test_shard_ids_survive_restart_and_compaction,
    test_log_of_another_shard_refuses_start,
    test_disk_full_refuses_puts_then_recovers,
    test_lock_second_server_refused,
    test_torn_tail_garbage_appended,
    test_torn_tail_last_record_cut,
    test_torn_empty_newest_segment,
    test_torn_tail_is_cut_so_later_starts_are_clean,
    test_damage_missing_middle_segment_refuses,
    test_damage_flipped_byte_in_older_segment_refuses,
    test_damage_zeroed_block_in_older_segment_refuses,
    test_damage_bad_length_in_older_segment_refuses,
    test_damage_in_newest_segment_before_more_records_refuses,
    test_check_log_clean_and_torn_and_read_only,
    test_fsync_modes_f50_survives_sigterm,
    test_fsync_modes_F_survives_sigterm,
    test_sigterm_under_load_f50,
    test_sigterm_under_load_F,
    test_sigterm_under_load_f0,
    test_binlog_stats,
    test_can_do_timeout_ttr_survives_restart,
    test_disk_full_http_says_log_unavailable,
    test_failed_batch_retried_once_a_second,
    test_failed_log_holds_replies,
    test_reserve_waits_for_the_put,
    test_waiting_reserve_gets_the_job_after_its_sync,
    test_sigterm_never_sends_a_response_the_log_lacks,
    test_sigterm_on_a_stalled_disk_answers_after_the_sync,
    test_idempotent_replay_waits_for_the_original,
    test_idempotent_replay_waits_on_a_slow_disk,
    test_sigterm_answers_every_kept_put,
    test_id_of_a_lost_put_is_never_given_again,
    test_sigterm_keeps_acknowledged_put_whose_write_failed,
    test_sigterm_with_failing_disk_says_records_lost,
    test_failed_sync_rewrites_f0,
    test_failed_sync_rewrites_f50,
    test_compaction_memory_bounded,
]


def after_test(error):
    """Kill what a test left running: the sanitizer reports of its servers,
    unless its failure already shows one."""
    reports = stop_all()
    if reports and not any(m in (error or "") for m in SANITIZER_MARKERS):
        return ["sanitizer report: " + " | ".join(reports)[:3000]]
    return []


def main(argv):
    global BINARY, NO_HTTP, WORK, SEED
    args = testlib.parse_args(testlib.arg_parser(__doc__), argv)
    BINARY = args.binary
    NO_HTTP = ["--no-http"] if b"--no-http" in testlib.binary_usage(BINARY) else []
    SEED = args.seed
    WORK = tempfile.mkdtemp(prefix="beangate-durability-")
    try:
        return testlib.run("durability", TESTS, args, namespace=globals(), after=after_test)
    finally:
        stop_all()
        shutil.rmtree(WORK, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
