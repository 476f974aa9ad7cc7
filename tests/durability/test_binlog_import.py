#!/usr/bin/env python3
"""Importing beanstalkd's log: beangate started on a directory of binlog.N
files written by the real beanstalkd (Debian's, on PATH).

Usage: python3 tests/durability/test_binlog_import.py build/beangate

setup runs beanstalkd (-b DIR -s 12000, a free loopback port) through one
workload in three tubes (puts, a 65,535-byte body, a delay, reserves, a
bury, a kick, a release with and without a delay, deletes, a job left
reserved), SIGKILLs it and keeps its directory; every test works on a copy.

What is checked:
  import_shows_jobs        every job with its tube, state, priority, delay,
                           TTR, counters and body (stats-job, peek); the
                           reserved job is ready; ids continue above the
                           highest (deleted) id; binlog.N moved aside as
                           binlog.N.imported; the summary line; a restart
                           imports nothing again
  crash_at_<step>          the import stopped (a test hook, exit 75) after
                           each step of its commit sequence, then a start:
                           every job there once, ids continue, files aside
  finish_moves_only_what_was_imported   a binlog file the marker does not
                           list stays, and the start is refused for it
  disk_fault_then_retry    a failing directory fsync stops the import before
                           its commit; the next start imports once
  running_beanstalkd_is_not_imported   beanstalkd's fcntl lock on DIR/lock
                           refuses the start; nothing moved
  both_logs_refused        beangate segments and binlog.N files, no marker:
                           the start is refused and nothing is changed
  damage_refused           a bad state byte in the oldest file: refused,
                           naming the file and the offset; files untouched;
                           --log-recover-damaged imports the other files
  torn_tail                the newest file ends inside its last record: the
                           record is dropped with a warning, the rest imported
  crafted_reserved_delayed_and_version_5   files made by the test: a
                           version 5 file, a record saying reserved, a
                           delay whose deadline passed: all ready
  check_log                --check-log: a line per binlog file, the import's
                           line, exit 0 clean, 1 damaged; nothing changed

Exit status 77 (skipped) when beanstalkd is not installed. Python 3
standard library only; the runner is tests/lib/testlib.py's.
"""

import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import struct
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import testlib  # noqa: E402
from testlib import check, check_eq, free_port, signal_and_wait  # noqa: E402

BINARY = None
NO_HTTP = []
WORK = None
ORIGINAL = None           # the directory beanstalkd wrote
SERVERS = []
START_TIMEOUT = 15.0
BIG = 65535               # beanstalkd's default -z: its largest body

# What beangate must show after the import: id -> stats-job fields that the
# log holds (job 3 was reserved when beanstalkd died: the reserve was not
# logged; job 4's release without a delay was not logged either, its bury was).
EXPECTED = {
    1: {"tube": "alpha", "state": "ready", "pri": "99", "ttr": "60", "reserves": "1", "buries": "1", "kicks": "1"},
    3: {"tube": "alpha", "state": "ready", "pri": "12", "ttr": "60", "reserves": "0"},
    4: {"tube": "alpha", "state": "buried", "pri": "60", "reserves": "2", "releases": "1", "buries": "1"},
    5: {"tube": "alpha", "state": "delayed", "pri": "7", "delay": "1200", "reserves": "1", "releases": "1"},
    6: {"tube": "beta", "state": "delayed", "pri": "20", "delay": "3600", "ttr": "30"},
    7: {"tube": "beta", "state": "ready", "pri": "21", "ttr": "120"},
    9: {"tube": "gamma", "state": "ready", "pri": "0"},
}
GONE = (2, 8)
NEXT_ID = 11              # job 10 was put and deleted: the highest id
BODIES = {}               # id -> body bytes


def body_of(i):
    if i == 7:
        return bytes((k * 7) % 251 for k in range(BIG))
    return b"job %d \x00\xff\r\nend" % i


# ---- a beanstalk connection ------------------------------------------------

class Conn:
    def __init__(self, port, timeout=5.0):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""

    def line(self):
        while b"\r\n" not in self.buf:
            chunk = self.s.recv(65536)
            check(chunk, "connection closed; have %r" % self.buf[:200])
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line.decode()

    def data(self, n):
        while len(self.buf) < n + 2:
            chunk = self.s.recv(65536)
            check(chunk, "connection closed in a body")
            self.buf += chunk
        d, self.buf = self.buf[:n], self.buf[n + 2:]
        return d

    def cmd(self, line, body=None):
        self.s.sendall(line.encode() + b"\r\n" + (body + b"\r\n" if body is not None else b""))
        reply = self.line()
        parts = reply.split()
        if parts[0] in ("OK", "FOUND", "RESERVED"):
            return reply, self.data(int(parts[-1]))
        return reply, None

    def expect(self, line, want, body=None):
        reply, data = self.cmd(line, body)
        check(reply.startswith(want), "%r: got %r, want %r" % (line, reply, want))
        return reply, data

    def close(self):
        testlib.close_quietly(self.s)


def stats_yaml(data):
    out = {}
    for ln in data.decode().splitlines():
        m = re.match(r"^([\w-]+): (.*)$", ln)
        if m:
            out[m.group(1)] = m.group(2)
    return out


# ---- beanstalkd writes the log ------------------------------------------------

def connect_when_ready(proc, port, what):
    conn = []

    def ready():
        conn.append(Conn(port))
        return True
    status = testlib.wait_ready(proc, ready, START_TIMEOUT)
    check(status == "ok", "%s did not start: %s" % (what, status))
    return conn[-1]


def beanstalkd_workload(c):
    """The workload; its ids are checked against the script's."""
    c.expect("use alpha", "USING")
    for i, pri in zip(range(1, 6), (10, 11, 12, 13, 14)):
        c.expect("put %d 0 60 %d" % (pri, len(body_of(i))), "INSERTED %d" % i, body_of(i))
    c.expect("use beta", "USING")
    c.expect("put 20 3600 30 %d" % len(body_of(6)), "INSERTED 6", body_of(6))
    c.expect("put 21 0 120 %d" % BIG, "INSERTED 7", body_of(7))
    c.expect("put 22 0 60 %d" % len(body_of(8)), "INSERTED 8", body_of(8))
    c.expect("delete 8", "DELETED")
    c.expect("use gamma", "USING")
    c.expect("put 0 0 60 %d" % len(body_of(9)), "INSERTED 9", body_of(9))
    c.expect("put 0 0 60 %d" % len(body_of(10)), "INSERTED 10", body_of(10))
    c.expect("delete 10", "DELETED")
    c.expect("watch alpha", "WATCHING")
    c.expect("ignore default", "WATCHING")
    c.expect("reserve", "RESERVED 1 ")
    c.expect("bury 1 99", "BURIED")
    c.expect("use alpha", "USING")
    c.expect("kick 1", "KICKED 1")
    c.expect("reserve", "RESERVED 2 ")
    c.expect("delete 2", "DELETED")
    c.expect("reserve", "RESERVED 3 ")          # left reserved
    c.expect("reserve", "RESERVED 4 ")
    c.expect("release 4 50 0", "RELEASED")       # not logged
    c.expect("reserve", "RESERVED 5 ")
    c.expect("release 5 7 1200", "RELEASED")     # logged: a delay
    c.expect("reserve", "RESERVED 4 ")
    c.expect("bury 4 60", "BURIED")
    c.expect("reserve", "RESERVED 1 ")           # pri 99: the last ready one
    c.expect("release 1 99 0", "RELEASED")


def make_original():
    beanstalkd = shutil.which("beanstalkd")
    if not beanstalkd:
        raise testlib.Skip("beanstalkd is not installed (apt-get install beanstalkd)")
    d = os.path.join(WORK, "beanstalkd")
    os.makedirs(d)
    for _attempt in range(5):
        port = free_port()
        proc = subprocess.Popen([beanstalkd, "-b", d, "-s", "12000", "-l", "127.0.0.1", "-p", str(port)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            c = connect_when_ready(proc, port, "beanstalkd")
            break
        except AssertionError:
            proc.kill()
            proc.wait()
    else:
        raise AssertionError("beanstalkd did not start")
    try:
        beanstalkd_workload(c)
    finally:
        c.close()
        signal_and_wait(proc, signal.SIGKILL, 5)
    os.unlink(os.path.join(d, "lock"))
    for n in os.listdir(d):
        os.chmod(os.path.join(d, n), 0o600)
    return d


def copy_original(name):
    d = os.path.join(WORK, name)
    shutil.copytree(ORIGINAL, d)
    return d


def binlogs(d):
    return sorted((n for n in os.listdir(d) if re.match(r"^binlog\.\d+$", n)), key=lambda n: int(n[7:]))


def digest(d):
    """Each file's sha256 but the lock file's (a start makes it)."""
    return {n: hashlib.sha256(open(os.path.join(d, n), "rb").read()).hexdigest() for n in sorted(os.listdir(d))
            if n != "lock"}


# ---- beangate --------------------------------------------------------------

class Beangate:
    def __init__(self, logdir, args=(), env=None):
        self.logdir, self.args, self.env = logdir, list(args), env
        self.server = testlib.ServerProcess()
        self.port = None
        SERVERS.append(self)

    def spawn(self):
        self.port = free_port()
        self.server.spawn([BINARY, "-l", "127.0.0.1", "-p", str(self.port), "-b", self.logdir] + NO_HTTP + self.args,
                          env=testlib.clean_env(self.env) if self.env else None)

    def start(self):
        def ready():
            return testlib.uses_default_tube(_LineConn(self.port))
        status = self.server.start_retrying(self.spawn, ready, START_TIMEOUT, 5)
        check(status == "ok", "beangate did not start (%s): %s" % (status, self.stderr()[-1500:]))
        return self

    def run_to_exit(self, timeout=START_TIMEOUT):
        """Start it and wait for it to exit (a refused start, a stop hook): the status."""
        self.spawn()
        try:
            return self.server.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.server.kill()
            raise AssertionError("beangate did not exit; stderr: %s" % self.stderr()[-1500:])

    def stderr(self):
        return self.server.stderr()

    def stop(self):
        status = signal_and_wait(self.server.proc, signal.SIGTERM, 10)
        check(testlib.sanitizer_report(self.stderr()) is None, "sanitizer report: %s" % self.stderr()[-3000:])
        check_eq(status, 0, "exit status after SIGTERM")


class _LineConn:
    def __init__(self, port):
        self.c = Conn(port, 2.0)

    def send(self, b):
        self.c.s.sendall(b)

    def read_line(self):
        return self.c.line().encode() + b"\r\n"

    def close(self):
        self.c.close()


def check_jobs(port, expected=EXPECTED):
    """Every expected job with its fields and body; the gone ones gone; the
    counts of jobs by state exactly these (nothing duplicated)."""
    c = Conn(port)
    try:
        for i, fields in expected.items():
            reply, data = c.cmd("stats-job %d" % i)
            check(reply.startswith("OK"), "stats-job %d: %r" % (i, reply))
            got = stats_yaml(data)
            for k, v in fields.items():
                check_eq(got.get(k), v, "job %d %s" % (i, k))
            reply, body = c.cmd("peek %d" % i)
            check(reply.startswith("FOUND %d " % i), "peek %d: %r" % (i, reply))
            check(body == body_of(i), "job %d body: %d bytes, first difference at %d"
                  % (i, len(body), testlib.first_difference(body, body_of(i))))
        for i in GONE:
            check_eq(c.cmd("peek %d" % i)[0], "NOT_FOUND", "peek %d (deleted in beanstalkd)" % i)
        _, data = c.cmd("stats")
        st = stats_yaml(data)
        for state in ("ready", "delayed", "buried", "reserved"):
            want = sum(1 for f in expected.values() if f["state"] == state)
            check_eq(st["current-jobs-" + state], str(want), "current-jobs-" + state)
    finally:
        c.close()


def check_ids_continue(port, want=NEXT_ID):
    """A put's id: want (after the import), or above it (want None; after
    a restart with -f 50 ids continue above the log's id floor)."""
    c = Conn(port)
    try:
        c.expect("use delta", "USING")
        reply, _ = c.expect("put 1 0 10 2", "INSERTED ", b"hi")
        got = int(reply.split()[1])
        check(got == want if want else got > NEXT_ID, "put after the import: %r, want id %s"
              % (reply, want or "above %d" % NEXT_ID))
        c.expect("delete %d" % got, "DELETED")
    finally:
        c.close()


def check_moved_aside(d, names):
    left = binlogs(d)
    check(not left, "binlog files left in place: %s" % left)
    for n in names:
        check(os.path.exists(os.path.join(d, n + ".imported")), "%s not moved aside as %s.imported" % (n, n))
    check(not os.path.exists(os.path.join(d, "beanstalkd-import.pending")), "the import's marker is left")
    check(not os.path.exists(os.path.join(d, "beangate.1.wal.import")), "the import file is left")


# ---- the tests ---------------------------------------------------------------

def test_import_shows_jobs():
    d = copy_original("shows")
    names = binlogs(d)
    check(len(names) >= 2, "beanstalkd wrote %s: the workload should span files" % names)
    b = Beangate(d).start()
    check_jobs(b.port)
    check_ids_continue(b.port)
    check_moved_aside(d, names)
    err = b.stderr()
    m = re.search(r"event=binlog_imported .*", err)
    check(m, "no binlog_imported line: %s" % err[-1500:])
    line = m.group(0)
    for want in ("files=%d" % len(names), "jobs=7", "ready=4", "delayed=2", "buried=1", "max_id=10",
                 "reserved_now_ready=0"):
        check(" %s " % want in line + " ", "summary lacks %s: %s" % (want, line))
    check(re.search(r" bytes=\d+ ", line) and re.search(r" ms=\d+ ", line), "summary lacks bytes/ms: %s" % line)
    b.stop()
    again = Beangate(d).start()     # a restart: no import, the same jobs
    check("binlog_imported" not in again.stderr(), "imported again: %s" % again.stderr()[-800:])
    check_jobs(again.port)
    check_ids_continue(again.port, None)
    again.stop()


STEPS = ("import_written", "marker_written", "committed", "moved_aside")


def crash_at(step):
    d = copy_original("crash-" + step)
    names = binlogs(d)
    before = digest(d)
    stopped = Beangate(d, env={"BEANGATE_TEST_IMPORT_STOP": step})
    status = stopped.run_to_exit()
    check_eq(status, 75, "exit status of the stopped import (stderr: %s)" % stopped.stderr()[-600:])
    check("event=binlog_import_test_stop step=%s" % step in stopped.stderr(), "no stop line")
    files = set(os.listdir(d))
    committed = "beangate.1.wal" in files
    check_eq(committed, step in ("committed", "moved_aside"), "beangate.1.wal exists after %s" % step)
    if not committed:   # beanstalkd's files as they were
        for n in names:
            check_eq(digest(d).get(n), before[n], "%s after a stop at %s" % (n, step))
    b = Beangate(d).start()
    check_jobs(b.port)
    check_ids_continue(b.port)
    check_moved_aside(d, names)
    if committed:
        check("binlog_imported" not in b.stderr(), "imported twice")
    b.stop()


def test_crash_at_import_written():
    crash_at("import_written")


def test_crash_at_marker_written():
    crash_at("marker_written")


def test_crash_at_committed():
    crash_at("committed")


def test_crash_at_moved_aside():
    crash_at("moved_aside")


def test_finish_moves_only_what_was_imported():
    """A binlog file that appeared after the commit (not in the marker) is
    not moved aside with the imported ones: the start is refused for it."""
    d = copy_original("unlisted")
    names = binlogs(d)
    check_eq(Beangate(d, env={"BEANGATE_TEST_IMPORT_STOP": "committed"}).run_to_exit(), 75, "stopped import")
    shutil.copy(os.path.join(ORIGINAL, names[0]), os.path.join(d, "binlog.99"))
    b = Beangate(d)
    status = b.run_to_exit()
    check(status not in (0, None), "started with an unimported binlog.99 (status %r)" % status)
    check("event=binlog_import_finished" in b.stderr() and "event=binlog_import_refused" in b.stderr(),
          "want the import finished, then the start refused: %s" % b.stderr()[-1200:])
    check_eq(binlogs(d), ["binlog.99"], "binlog files left in place")


def test_disk_fault_then_retry():
    """The directory's fsync fails (the disk-fault hook): the start is
    refused after the import file and the marker were written, nothing
    committed; the next start imports again, once."""
    d = copy_original("diskfault")
    names = binlogs(d)
    faults = testlib.DiskFaults(os.path.join(WORK, "diskfault.faults"))
    faults.set(["sync_dir EIO"])
    failed = Beangate(d, env=faults.env())
    status = failed.run_to_exit()
    check(status not in (0, None, 75), "a start whose directory sync fails went on (status %r)" % status)
    check(re.search(r"event=wal_open_failed .*op=binlog_import_write_marker error=", failed.stderr()),
          "no line saying the import failed: %s" % failed.stderr()[-1200:])
    check_eq(binlogs(d), names, "beanstalkd's files after the failed import")
    check("beangate.1.wal" not in os.listdir(d), "the import committed although a sync failed")
    b = Beangate(d).start()
    check_jobs(b.port)
    check_ids_continue(b.port)
    check_moved_aside(d, names)
    b.stop()


def test_running_beanstalkd_is_not_imported():
    """beanstalkd's lock (fcntl on DIR/lock) stops beangate: a running
    beanstalkd's files are never imported or moved."""
    d = os.path.join(WORK, "running")
    os.makedirs(d)
    port = free_port()
    proc = subprocess.Popen([shutil.which("beanstalkd"), "-b", d, "-l", "127.0.0.1", "-p", str(port)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        connect_when_ready(proc, port, "beanstalkd").close()
        before = sorted(os.listdir(d))
        b = Beangate(d)
        status = b.run_to_exit()
        check(status not in (0, None), "beangate started on a running beanstalkd's directory (status %r)" % status)
        check("event=wal_locked" in b.stderr(), "no wal_locked line: %s" % b.stderr()[-800:])
        check_eq(sorted(os.listdir(d)), before, "the running beanstalkd's directory")
    finally:
        signal_and_wait(proc, signal.SIGKILL, 5)


def test_both_logs_refused():
    d = copy_original("both")
    b = Beangate(d).start()
    b.stop()
    for n in binlogs(ORIGINAL):
        shutil.copy(os.path.join(ORIGINAL, n), d)
    before = digest(d)
    refused = Beangate(d)
    status = refused.run_to_exit()
    check(status not in (0, None), "a start with both logs was not refused (status %r)" % status)
    check("event=binlog_import_refused" in refused.stderr() and "binlog_files=" in refused.stderr(),
          "no clear refusal: %s" % refused.stderr()[-800:])
    check_eq(digest(d), before, "the directory after a refused start")


def first_record_state_offset(path):
    """The offset of the state byte of the file's first record (format 7)."""
    data = open(path, "rb").read()
    name_len = int.from_bytes(data[4:8], "little", signed=True)
    check(name_len > 0, "the file's first record is not a full record")
    return 8 + name_len + 76


def test_damage_refused():
    d = copy_original("damage")
    names = binlogs(d)
    path = os.path.join(d, names[0])
    with open(path, "r+b") as f:
        f.seek(first_record_state_offset(path))
        f.write(b"\x09")
    before = digest(d)
    refused = Beangate(d)
    status = refused.run_to_exit()
    check(status not in (0, None), "a damaged log was imported (status %r)" % status)
    err = refused.stderr()
    check(re.search(r"event=binlog_damaged file=%s damage=bad_state offset=4 " % re.escape(names[0]), err),
          "no line naming the file and offset: %s" % err[-1200:])
    check_eq(digest(d), before, "the directory after a refused start")
    b = Beangate(d, ["--log-recover-damaged"]).start()
    err = b.stderr()
    check(re.search(r"event=binlog_damage_dropped file=%s damage=bad_state offset=4 " % re.escape(names[0]), err),
          "no warning naming what was dropped: %s" % err[-1200:])
    check_moved_aside(d, names)
    c = Conn(b.port)
    try:    # the jobs of the other files are there: job 7 (65535 bytes) was put in a later file
        reply, body = c.cmd("peek 7")
        check(reply.startswith("FOUND 7 ") and body == body_of(7), "job 7 after recovery: %r" % reply)
    finally:
        c.close()
    b.stop()


def test_torn_tail():
    d = copy_original("torn")
    names = binlogs(d)
    newest = None
    for n in reversed(names):   # the newest file with records (beanstalkd makes empty ones ahead)
        data = open(os.path.join(d, n), "rb").read()
        if data[4:].strip(b"\0"):
            newest, end = n, len(data.rstrip(b"\0"))
            break
    check(newest, "no file with records")
    with open(os.path.join(d, newest), "r+b") as f:
        f.truncate(end - 1)     # the last record (job 4's bury, a short one) loses its state byte
    rc, out, _ = testlib.run_binary(BINARY, ["--check-log", d], 30)
    check_eq(rc, 0, "--check-log exit status on a torn tail (stdout: %s)" % out)
    check(re.search(r"binlog file=%s .*status=torn_tail damage=truncated" % re.escape(newest), out), out)
    b = Beangate(d).start()
    err = b.stderr()
    check(re.search(r"event=binlog_torn_tail file=%s damage=truncated offset=\d+" % re.escape(newest), err),
          "no torn tail warning: %s" % err[-1200:])
    # the torn record was job 4's bury (the last change logged): job 4 is as
    # its put left it (the release without a delay before the bury was not logged)
    expected = dict(EXPECTED)
    expected[4] = {"tube": "alpha", "state": "ready", "pri": "13", "reserves": "0", "buries": "0"}
    check_jobs(b.port, expected)
    check_ids_continue(b.port)
    check_moved_aside(d, names)
    b.stop()


def crafted_record(version, job_id, tube, state, body, pri=5, delay_ns=0, ttr_ns=60 * 10**9,
                   created_ns=None, deadline_ns=0, counters=(0, 0, 0, 0, 0)):
    """A full record as beanstalkd writes it (x86-64 layout, format 7 or 5)."""
    unit = 1000 if version == 5 else 1
    created_ns = time.time_ns() - 5 * 10**9 if created_ns is None else created_ns
    rec = struct.pack("<QI4xqqi4xqq5IB", job_id, pri, delay_ns // unit, ttr_ns // unit, len(body),
                      created_ns // unit, deadline_ns // unit, *counters, state)
    rec = rec + b"\0" * 3 if version == 7 else rec
    name = tube.encode()
    return struct.pack("<q" if version == 5 else "<i", len(name)) + name + rec + body


def test_crafted_reserved_delayed_and_version_5():
    """Files made here: a version 5 file, then a version 7 one holding a job
    whose record says reserved (a beanstalkd compaction writes those) and a
    delayed job whose deadline passed: all come over ready."""
    d = os.path.join(WORK, "crafted")
    os.makedirs(d)
    with open(os.path.join(d, "binlog.4"), "wb") as f:
        f.write(struct.pack("<i", 5) + crafted_record(5, 1, "old", 1, b"v5 job\r\n", pri=3) + b"\0" * 300)
    past = time.time_ns() - 10**9
    with open(os.path.join(d, "binlog.5"), "wb") as f:
        f.write(struct.pack("<i", 7) + crafted_record(7, 2, "new", 2, b"was reserved\r\n", counters=(4, 1, 0, 0, 0))
                + crafted_record(7, 3, "new", 4, b"late\r\n", delay_ns=30 * 10**9, deadline_ns=past)
                + b"\0" * 500)
    b = Beangate(d).start()
    line = re.search(r"event=binlog_imported .*", b.stderr())
    check(line and " jobs=3 ready=1 delayed=1 buried=0 reserved_now_ready=1 " in line.group(0) + " ",
          "summary: %s" % (line.group(0) if line else b.stderr()[-800:]))
    c = Conn(b.port)
    try:
        want = {1: ("old", "3", "ready", b"v5 job"), 2: ("new", "5", "ready", b"was reserved"),
                3: ("new", "5", "ready", b"late")}
        for i, (tube, pri, state, body) in want.items():
            got = stats_yaml(c.expect("stats-job %d" % i, "OK")[1])
            check_eq((got["tube"], got["pri"], got["state"], got["ttr"]), (tube, pri, state, "60"), "job %d" % i)
            check_eq(c.expect("peek %d" % i, "FOUND")[1], body, "job %d body" % i)
        check_eq(stats_yaml(c.expect("stats-job 2", "OK")[1])["reserves"], "4", "job 2 reserves")
        check(4 <= int(stats_yaml(c.expect("stats-job 1", "OK")[1])["age"]) <= 60, "job 1's age is its own")
    finally:
        c.close()
    b.stop()


def test_check_log():
    d = copy_original("check")
    names = binlogs(d)
    before = digest(d)
    rc, out, err = testlib.run_binary(BINARY, ["--check-log", d], 30)
    check_eq(rc, 0, "--check-log exit status (stderr %s)" % err)
    for n in names:
        check(re.search(r"^binlog file=%s bytes=\d+ version=(7|0) records=\d+ .*status=(ok|never_written)$"
                        % re.escape(n), out, re.M), "no line for %s: %s" % (n, out))
    check(re.search(r"^binlog_import files=%d jobs=7 ready=4 delayed=2 buried=1 .*max_id=10 .*import=would_import$"
                    % len(names), out, re.M), "no import line: %s" % out)
    check_eq(digest(d), before, "the directory after --check-log")
    path = os.path.join(d, names[0])
    with open(path, "r+b") as f:
        f.seek(first_record_state_offset(path))
        f.write(b"\x09")
    rc, out, _ = testlib.run_binary(BINARY, ["--check-log", d], 30)
    check_eq(rc, 1, "--check-log exit status on damage")
    check(re.search(r"^binlog file=%s .*status=damaged damage=bad_state offset=4 " % re.escape(names[0]), out, re.M),
          out)
    check("import=refused_damaged" in out, out)


TESTS = [
    test_import_shows_jobs,
    test_crash_at_import_written,
    test_crash_at_marker_written,
    test_crash_at_committed,
    test_crash_at_moved_aside,
    test_finish_moves_only_what_was_imported,
    test_disk_fault_then_retry,
    test_running_beanstalkd_is_not_imported,
    test_both_logs_refused,
    test_damage_refused,
    test_torn_tail,
    test_crafted_reserved_delayed_and_version_5,
    test_check_log,
]


def setup(_names):
    global ORIGINAL
    ORIGINAL = make_original()


def after_test(error):
    problems = []
    while SERVERS:
        s = SERVERS.pop()
        s.server.kill()
        report = testlib.sanitizer_report(s.stderr())
        if report and report not in (error or ""):
            problems.append("sanitizer report: " + report[:3000])
    return problems


def main(argv):
    global BINARY, NO_HTTP, WORK
    args = testlib.parse_args(testlib.arg_parser(__doc__), argv)
    BINARY = args.binary
    NO_HTTP = ["--no-http"] if b"--no-http" in testlib.binary_usage(BINARY) else []
    WORK = tempfile.mkdtemp(prefix="beangate-binlog-import-")
    try:
        return testlib.run("binlog_import", TESTS, args, namespace=globals(), setup=setup, after=after_test,
                           all_skipped=77)
    finally:
        shutil.rmtree(WORK, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
