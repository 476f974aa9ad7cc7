#!/usr/bin/env python3
"""Differential test of the import of beanstalkd's log (issue 24).

Usage: python3 tests/compat/test_binlog_differential.py build/beangate [--seed N]

Debian's beanstalkd (BEANSTALKD, default /usr/bin/beanstalkd) runs with
-b DIR -s 20000 and gets a seeded random workload over 20 tubes: puts with
every kind of priority, delay (none, 1 s, a minute to a day), TTR and body
(0 to 4,000 bytes, CRLF and NUL inside), and churn: deletes, releases with
and without a delay, buries, kicks (kick and kick-job), touches, TTR
timeouts; a client holds jobs reserved from the start (compaction logs
them in state reserved: the test checks that the log has such records)
and takes more just before the stop. The files are small, so
the log spans many files and beanstalkd compacts it (the test checks that
the oldest file is gone while its jobs live on). beanstalkd is then stopped
and the directory copied twice: beanstalkd restarts on one copy, beangate
(which imports beanstalkd's files) on the other, and every answer is
compared for every id from 1 to the highest put:
  peek (found or not, the body), every stats-job field (id, tube, state,
  pri, delay, ttr, reserves, timeouts, releases, kicks exactly; age and
  time-left within a second), every tube's stats-tube (job counts,
  total-jobs: 0 on both after a restart), list-tubes, the job counts,
  total-jobs and current-tubes of stats, and the id of the next put.
Two fields differ for documented reasons, and the test asserts the
difference instead of skipping the field (docs/protocol.md, "Differences
from beanstalkd"; docs/durability.md, "Importing beanstalkd's log"):
  file     beanstalkd names its binlog file (> 0), beangate always says 0;
  buries   beanstalkd adds 1 to a buried job's count each time it replays
           its log; beangate keeps the count the log holds.
The tests:
  sigkill        beanstalkd killed with SIGKILL (a crash)
  sigterm        beanstalkd stopped with SIGTERM (it runs no shutdown code)
  damaged        a record in the middle of an older file made unreadable:
                 beangate refuses the start (status nonzero) naming the file
                 and the record's offset and leaves every file as it was;
                 with --log-recover-damaged it starts
  torn_tail      the newest file with records cut inside a record's body:
                 both start, drop that record, agree; beangate warns
After the import beangate's directory holds no binlog.N file under its old
name, every file's bytes are kept under a name that starts with it, and a
restart of beangate (now from its own log) answers the same.

Python 3 standard library only; the runner is tests/lib/testlib.py's
(-k NAME, --seed N or BEANGATE_TEST_SEED=N, PASS/FAIL lines, the last line
`binlog_differential: N passed, M failed, K skipped`). Exit 77 (every test
skipped) without beanstalkd.
"""

import hashlib
import os
import random
import re
import shutil
import signal
import struct
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import testlib  # noqa: E402
from testlib import check, check_eq, show, signal_and_wait  # noqa: E402

BEANSTALKD = os.environ.get("BEANSTALKD", "/usr/bin/beanstalkd")
BINARY = None
SEED = None
WORK = None
SEGMENT = 20000           # beanstalkd's -s: small, so the log spans many files
READ_TIMEOUT = 20.0       # every socket read gives up after this (ASan, a big replay)
START_TIMEOUT = 30.0
TUBES = ["default", "emails", "emails.bulk", "pay$ment", "a(b)", "x+y", "img/thumb",
         "semi;colon", "under_score", "dash-ed"] + ["t%02d" % i for i in range(10)]
SERVERS = []              # every ServerProcess started, killed after each test
JOBREC = struct.Struct("<QI4xqqi4xqqIIIIIB3x")   # beanstalkd's Jobrec (x86-64), 80 bytes
WORKLOAD_OPS = 2500
HOLD = 12                 # jobs reserved by a client when beanstalkd stops


# ---- a beanstalk client ----------------------------------------------------------

class Client(testlib.LineSocket):
    def __init__(self, port, what):
        super().__init__(port, READ_TIMEOUT, what)

    def send(self, data):
        self.s.sendall(data)

    # One command, its reply line.
    def ask(self, line):
        self.send(line + b"\r\n")
        return self.line()

    def expect(self, line, want):
        got = self.ask(line)
        check_eq(got, want, "%s: %r" % (self.what, line))

    def put(self, tube, body, pri, delay, ttr):
        self.expect(b"use " + tube, b"USING " + tube)
        self.send(b"put %d %d %d %d\r\n%s\r\n" % (pri, delay, ttr, len(body), body))
        line = self.line()
        check(line.startswith(b"INSERTED "), "%s: put: %s" % (self.what, show(line, 80)))
        return int(line[9:])

    # A job reply (RESERVED/FOUND id n + body): (id, body), or None for another reply.
    def job_reply(self, line, word):
        m = re.match(rb"%s (\d+) (\d+)$" % word, line)
        if not m:
            return None
        return int(m.group(1)), self.body(int(m.group(2)))

    def reserve_now(self):
        line = self.ask(b"reserve-with-timeout 0")
        if line in (b"TIMED_OUT", b"DEADLINE_SOON"):
            return None
        got = self.job_reply(line, b"RESERVED")
        check(got is not None, "%s: reserve: %s" % (self.what, show(line, 80)))
        return got

    # OK <n> + YAML as a dict (lists as a list of items); None for NOT_FOUND.
    def yaml(self, line):
        self.send(line + b"\r\n")
        return self.read_yaml(line)

    def read_yaml(self, line):
        head = self.line()
        if head == b"NOT_FOUND":
            return None
        check(head.startswith(b"OK "), "%s: %r: %s" % (self.what, line, show(head, 80)))
        text = self.body(int(head[3:])).decode("latin-1")
        items = [raw[2:] for raw in text.split("\n") if raw.startswith("- ")]
        if items:
            return items
        return dict((k, v.strip().strip('"')) for k, v in
                    (raw.split(": ", 1) for raw in text.split("\n") if ": " in raw))


# ---- the servers -------------------------------------------------------------------

def start(argv_for_port, what, expect_start=True):
    """Start argv_for_port(port) on a free port; (ServerProcess, port) once it answers.
    expect_start=False: the process must exit by itself: (ServerProcess, status)."""
    srv = testlib.ServerProcess()
    SERVERS.append(srv)
    port = [None]

    def launch():
        port[0] = testlib.free_port()
        srv.spawn(argv_for_port(port[0]), env=testlib.clean_env())

    def ready():
        c = Client(port[0], what)
        c.s.settimeout(2.0)
        return testlib.uses_default_tube(_Probe(c))

    if not expect_start:
        launch()
        try:
            return srv, srv.proc.wait(START_TIMEOUT)
        except Exception:
            srv.kill()
            raise AssertionError("%s did not exit within %.0f s; stderr: %s"
                                 % (what, START_TIMEOUT, srv.stderr()[-800:]))
    status = srv.start_retrying(launch, ready, START_TIMEOUT, 5)
    check(status == "ok", "%s did not start (%s); stderr: %s" % (what, status, srv.stderr()[-1500:]))
    return srv, port[0]


class _Probe:
    """testlib.uses_default_tube's view of a Client (send, read_line, close)."""
    def __init__(self, c):
        self.c = c

    def send(self, data):
        self.c.send(data)

    def read_line(self):
        return self.c.line() + b"\r\n"

    def close(self):
        self.c.close()


def beanstalkd(logdir):
    return start(lambda p: [BEANSTALKD, "-l", "127.0.0.1", "-p", str(p), "-b", logdir, "-s", str(SEGMENT)],
                 "beanstalkd on %s" % os.path.basename(logdir))


def beangate_argv(logdir, extra=()):
    return lambda p: [BINARY, "-l", "127.0.0.1", "-p", str(p), "--no-http", "-b", logdir] + list(extra)


def beangate(logdir, extra=()):
    return start(beangate_argv(logdir, extra), "beangate on %s" % os.path.basename(logdir))


def stop_checked(srv, what):
    """SIGTERM a beangate: exit status 0, no sanitizer report."""
    status = signal_and_wait(srv.proc, signal.SIGTERM, 15)
    check(testlib.sanitizer_report(srv.stderr()) is None, "%s: sanitizer report: %s"
          % (what, testlib.sanitizer_report(srv.stderr())))
    check_eq(status, 0, "%s: exit status after SIGTERM" % what)


# ---- the workload against beanstalkd -------------------------------------------------

class Workload:
    """A seeded random history on one beanstalkd; what it put."""

    def __init__(self, rng, port):
        self.rng = rng
        self.port = port
        self.producer = Client(port, "producer")
        self.worker = Client(port, "worker")
        for tube in TUBES:
            self.worker.ask(b"watch " + tube.encode())
        self.max_id = 0
        self.live = set()         # ids put and not deleted (as far as the workload knows)
        self.counts = {}

    def count(self, what):
        self.counts[what] = self.counts.get(what, 0) + 1

    def body(self):
        rng = self.rng
        n = rng.choice([0, 1, 2, 10, 50, 100, 200, 300]) if rng.random() < 0.95 else rng.randrange(1000, 4000)
        return bytes(rng.choice(b"abcxyz0189 \r\n\0\xff") for _ in range(n))

    def put(self, delay=None, ttr=None, tube=None):
        rng = self.rng
        tube = tube or rng.choice(TUBES)
        pri = rng.choice([0, 1, 100, 1023, 1024, 65536, 2 ** 31, 2 ** 32 - 1, rng.randrange(2 ** 32)])
        if delay is None:
            delay = rng.choice([0, 0, 0, 0, 1, rng.randrange(60, 86400)])
        ttr = ttr or rng.choice([1, 2, 60, 120, 3600, rng.randrange(1, 100000)])
        jid = self.producer.put(tube.encode(), self.body(), pri, delay, ttr)
        self.max_id = max(self.max_id, jid)
        self.live.add(jid)
        self.count("put")
        return jid

    def delete(self):
        if not self.live:
            return
        jid = self.rng.choice(sorted(self.live))
        reply = self.producer.ask(b"delete %d" % jid)
        check(reply in (b"DELETED", b"NOT_FOUND"), "delete %d: %s" % (jid, show(reply, 80)))
        self.live.discard(jid)
        self.count("delete")

    # Reserve a job and release it (with or without a delay and a new
    # priority), bury it, delete it or touch it first.
    def work(self):
        rng = self.rng
        got = self.worker.reserve_now()
        if got is None:
            return
        jid = got[0]
        if rng.random() < 0.2:
            check_eq(self.worker.ask(b"touch %d" % jid), b"TOUCHED", "touch %d" % jid)
            self.count("touch")
        pri = rng.randrange(2 ** 32)
        action = rng.choice(["release", "release_delay", "release_delay", "bury", "bury", "delete"])
        if action == "release":
            want, line = b"RELEASED", b"release %d %d 0" % (jid, pri)
        elif action == "release_delay":
            want, line = b"RELEASED", b"release %d %d %d" % (jid, pri, rng.choice([1, rng.randrange(60, 7200)]))
        elif action == "bury":
            want, line = b"BURIED", b"bury %d %d" % (jid, pri)
        else:
            want, line = b"DELETED", b"delete %d" % jid
            self.live.discard(jid)
        check_eq(self.worker.ask(line), want, line.decode())
        self.count(action)

    def kick(self):
        rng = self.rng
        if rng.random() < 0.5 and self.live:
            jid = rng.choice(sorted(self.live))
            reply = self.producer.ask(b"kick-job %d" % jid)
            check(reply in (b"KICKED", b"NOT_FOUND"), "kick-job %d: %s" % (jid, show(reply, 80)))
            self.count("kick-job")
        else:
            tube = rng.choice(TUBES).encode()
            self.producer.expect(b"use " + tube, b"USING " + tube)
            reply = self.producer.ask(b"kick %d" % rng.randrange(1, 4))
            check(reply.startswith(b"KICKED "), "kick: %s" % show(reply, 80))
            self.count("kick")

    # Two jobs whose TTR runs out once (timeouts 1, reserves 2), then buried:
    # the bury logs the counters that only the TTR timeout changed. (They are
    # reserved with reserve, on a connection watching only their tube:
    # beanstalkd 1.12 does not time out a job taken with reserve-job.)
    def timeouts(self):
        timer = Client(self.port, "timer")
        timer.expect(b"watch timeouts", b"WATCHING 2")
        timer.expect(b"ignore default", b"WATCHING 1")
        ids = [self.put(delay=0, ttr=1, tube="timeouts") for _ in range(2)]
        for _ in ids:
            check(timer.reserve_now() is not None, "reserve a job of tube timeouts")
        for _ in ids:
            testlib.wait_until(lambda: timer.reserve_now(), "a TTR to run out", timeout=10, step=0.2)
        for jid in ids:
            st = self.producer.yaml(b"stats-job %d" % jid)
            check(st["timeouts"] == "1" and st["state"] == "reserved", "job %d after its TTR ran out: %r" % (jid, st))
            check_eq(timer.ask(b"bury %d 7" % jid), b"BURIED", "bury %d" % jid)
        timer.close()

    def run(self, ops):
        rng = self.rng
        # long-lived jobs in the first file: compaction must move them
        for _ in range(30):
            self.put(delay=rng.randrange(3600, 86400))
        # jobs held reserved from the start: compaction logs them as reserved
        self.holder = Client(self.port, "holder")
        self.holder.expect(b"watch held", b"WATCHING 2")
        for _ in range(6):
            self.put(delay=0, ttr=86400, tube="held")
            check(self.holder.reserve_now() is not None, "reserve a job of tube held")
        self.timeouts()
        steps = [(0.36, self.put), (0.58, self.delete), (0.92, self.work), (1.0, self.kick)]
        for _ in range(ops):
            r = rng.random()
            next(fn for bound, fn in steps if r < bound)()
        # a job of delay 1 put last: once it is ready, every delay-1 deadline has passed
        last = self.put(delay=1, tube="default")
        testlib.wait_until(lambda: self.producer.yaml(b"stats-job %d" % last)["state"] == "ready",
                           "the last 1-second delay to pass", timeout=10)
        # the holder takes more jobs (some touched) just before beanstalkd stops
        for tube in TUBES:
            self.holder.ask(b"watch " + tube.encode())
        for i in range(HOLD):
            got = self.holder.reserve_now()
            if got and i % 2:
                self.holder.ask(b"touch %d" % got[0])
        stats = self.producer.yaml(b"stats")
        print("  workload: %s; max id %d; beanstalkd: %s jobs, %s reserved, binlog files %s..%s, "
              "%s records migrated" % (" ".join("%s=%d" % kv for kv in sorted(self.counts.items())), self.max_id,
                                       stats["current-jobs-ready"], stats["current-jobs-reserved"],
                                       stats["binlog-oldest-index"], stats["binlog-current-index"],
                                       stats["binlog-records-migrated"]), flush=True)
        check(int(stats["current-jobs-reserved"]) > 0, "no job is reserved at the stop")
        check(int(stats["binlog-oldest-index"]) > 1, "the first binlog file is still there: no compaction "
              "moved its long-lived jobs (stats: %r)" % stats)
        check(int(stats["binlog-records-migrated"]) > 0, "beanstalkd migrated no record (no compaction)")
        check(int(stats["binlog-current-index"]) - int(stats["binlog-oldest-index"]) >= 2,
              "the log spans fewer than three files")


def beanstalkd_log(name, stop_signal, seed):
    """A directory holding the binlog of a workload (seed) on a beanstalkd stopped with
    stop_signal; (directory, highest id put)."""
    logdir = os.path.join(WORK, name)
    os.makedirs(logdir)
    srv, port = beanstalkd(logdir)
    wl = Workload(random.Random(seed), port)
    wl.run(WORKLOAD_OPS)
    status = signal_and_wait(srv.proc, stop_signal, 10)
    check(status is not None, "beanstalkd did not stop on signal %d" % stop_signal)
    reserved = sum(1 for path in binlog_files(logdir).values() for r in records(path) if r[2][-1] == 2)
    check(reserved > 0, "no record of the log says reserved: compaction moved no held job")
    return logdir, wl.max_id


# ---- beanstalkd's files ---------------------------------------------------------------

def binlog_files(logdir):
    """{N: path} of the binlog.N files in logdir."""
    out = {}
    for name in os.listdir(logdir):
        m = re.match(r"binlog\.(\d+)$", name)
        if m:
            out[int(m.group(1))] = os.path.join(logdir, name)
    return out


def records(path):
    """The records of a version-7 binlog file: [(offset, name length, Jobrec fields, end)]."""
    with open(path, "rb") as f:
        data = f.read()
    check(len(data) >= 4 and struct.unpack_from("<i", data)[0] == 7, "%s: not a version 7 binlog" % path)
    out = []
    pos = 4
    while pos + 4 + JOBREC.size <= len(data):
        namelen = struct.unpack_from("<i", data, pos)[0]
        rec = JOBREC.unpack_from(data, pos + 4 + namelen)
        if rec[0] == 0:
            break
        end = pos + 4 + namelen + JOBREC.size + (rec[4] if namelen else 0)
        out.append((pos, namelen, rec, end))
        pos = end
    return out


def snapshot(logdir):
    """{relative path: sha256} of every file under logdir."""
    out = {}
    for root, _dirs, names in os.walk(logdir):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, logdir)] = hashlib.sha256(f.read()).hexdigest()
    return out


def check_moved_aside(before, logdir):
    """After an import: no binlog.N under its own name, each one's bytes kept
    under a name that starts with it (inside logdir)."""
    after = snapshot(logdir)
    for rel, digest in before.items():
        if not re.match(r"binlog\.\d+$", rel):
            continue
        check(rel not in after, "%s is still there under its name after the import" % rel)
        kept = [r for r, d in after.items() if os.path.basename(r).startswith(rel + ".") and d == digest]
        check(kept, "%s's bytes are nowhere in the directory after the import (files: %s)"
              % (rel, sorted(after)[:40]))


# ---- the comparison ---------------------------------------------------------------------

EXACT_JOB_FIELDS = ("id", "tube", "state", "pri", "delay", "ttr", "reserves", "timeouts", "releases", "kicks")
NEAR_JOB_FIELDS = ("age", "time-left")          # within a second
JOB_COUNTS = ("current-jobs-urgent", "current-jobs-ready", "current-jobs-reserved",
              "current-jobs-delayed", "current-jobs-buried")
TUBE_FIELDS = ("name", "total-jobs") + JOB_COUNTS + ("current-using", "current-watching", "current-waiting",
                                          "cmd-delete", "cmd-pause-tube", "pause", "pause-time-left")


def pipelined(c, lines, read):
    """Send lines at once, read each reply with read(c, line): the list of replies."""
    c.send(b"".join(line + b"\r\n" for line in lines))
    return [read(c, line) for line in lines]


def read_peek(c, line):
    head = c.line()
    if head == b"NOT_FOUND":
        return None
    got = c.job_reply(head, b"FOUND")
    check(got is not None, "%r: %s" % (line, show(head, 80)))
    return got


def compare_job(jid, ref, cand, peek_ref, peek_cand):
    what = "job %d" % jid
    check_eq(peek_cand, peek_ref, what + ": peek (beangate, beanstalkd)")
    check_eq(cand is None, ref is None, what + ": stats-job NOT_FOUND (beangate, beanstalkd)")
    if ref is None:
        return
    for field in EXACT_JOB_FIELDS:
        check_eq(cand.get(field), ref.get(field), "%s: stats-job %s (beangate, beanstalkd)" % (what, field))
    for field in NEAR_JOB_FIELDS:
        check(abs(int(cand[field]) - int(ref[field])) <= 1, "%s: stats-job %s: beangate %s, beanstalkd %s "
              "(want within a second)" % (what, field, cand[field], ref[field]))
    # documented differences: beanstalkd names its file, beangate says 0 ...
    check(int(ref["file"]) > 0, "%s: beanstalkd's file is %s, want its binlog's number" % (what, ref["file"]))
    check_eq(cand["file"], "0", what + ": beangate's stats-job file")
    # ... and beanstalkd counts one more bury for a buried job at each replay
    quirk = 1 if ref["state"] == "buried" else 0
    check_eq(int(cand["buries"]) + quirk, int(ref["buries"]),
             "%s (%s): beangate's buries + %d (beanstalkd's replay quirk), beanstalkd's buries"
             % (what, ref["state"], quirk))


def compare_all(ref_port, cand_port, max_id, label):
    """Every id's peek and stats-job, every tube's stats-tube, list-tubes and stats' job
    counts; the number of jobs."""
    ref, cand = Client(ref_port, "beanstalkd"), Client(cand_port, "beangate")
    ids = list(range(1, max_id + 4))
    found = 0
    for i in range(0, len(ids), 200):
        part = ids[i:i + 200]
        peeks = [pipelined(c, [b"peek %d" % j for j in part], read_peek) for c in (ref, cand)]
        stats = [pipelined(c, [b"stats-job %d" % j for j in part], Client.read_yaml) for c in (ref, cand)]
        for k, jid in enumerate(part):
            compare_job(jid, stats[0][k], stats[1][k], peeks[0][k], peeks[1][k])
            found += stats[0][k] is not None
    tubes = [sorted(c.yaml(b"list-tubes")) for c in (ref, cand)]
    check_eq(tubes[1], tubes[0], label + ": list-tubes (beangate, beanstalkd)")
    for tube in tubes[0]:
        st = [c.yaml(b"stats-tube " + tube.encode()) for c in (ref, cand)]
        for field in TUBE_FIELDS:
            check_eq(st[1].get(field), st[0].get(field), "%s: stats-tube %s: %s (beangate, beanstalkd)"
                     % (label, tube, field))
    st = [c.yaml(b"stats") for c in (ref, cand)]
    for field in JOB_COUNTS + ("total-jobs", "current-tubes"):
        check_eq(st[1][field], st[0][field], "%s: stats %s (beangate, beanstalkd)" % (label, field))
    check(found > 100, "%s: only %d jobs survived; the workload is too thin to compare" % (label, found))
    print("  %s: %d ids compared, %d jobs (%s), %d tubes agree" % (
        label, len(ids), found, ", ".join("%s %s" % (f[13:], st[0][f]) for f in JOB_COUNTS), len(tubes[0])),
        flush=True)
    ref.close()
    cand.close()
    return found


def check_next_put(ref_port, cand_port):
    ids = [Client(p, "next put").put(b"default", b"next", 0, 0, 60) for p in (ref_port, cand_port)]
    check_eq(ids[1], ids[0], "the id of the next put (beangate, beanstalkd)")


# ---- the tests -----------------------------------------------------------------------------

def copies(logdir):
    ref, cand = logdir + "-beanstalkd", logdir + "-beangate"
    shutil.copytree(logdir, ref)
    shutil.copytree(logdir, cand)
    return ref, cand


def import_and_compare(logdir, max_id, label, extra=()):
    """beanstalkd on one copy, beangate on another: every answer agrees; again
    after beangate restarts on its own log; then the next put's id. beangate's stderr."""
    ref_dir, cand_dir = copies(logdir)
    before = snapshot(cand_dir)
    _ref, ref_port = beanstalkd(ref_dir)
    cand, cand_port = beangate(cand_dir, extra)
    err = cand.stderr()
    imported = re.search(r"event=binlog_imported .*\bjobs=(\d+)\b.*", err)
    check(imported, "%s: beangate logged no event=binlog_imported; stderr: %s" % (label, err[-1500:]))
    print("  beangate: %s" % imported.group(0), flush=True)
    jobs = compare_all(ref_port, cand_port, max_id, label)
    check_eq(int(imported.group(1)), jobs, "%s: jobs= of the import line, jobs beanstalkd has" % label)
    check_moved_aside(before, cand_dir)
    stop_checked(cand, "beangate after the import")
    cand, cand_port = beangate(cand_dir, extra)
    compare_all(ref_port, cand_port, max_id, label + ", beangate restarted")
    check_next_put(ref_port, cand_port)
    return err


def test_sigkill():
    logdir, max_id = beanstalkd_log("sigkill", signal.SIGKILL, SEED)
    import_and_compare(logdir, max_id, "after SIGKILL")


def test_sigterm():
    logdir, max_id = beanstalkd_log("sigterm", signal.SIGTERM, SEED + 1)
    import_and_compare(logdir, max_id, "after SIGTERM")


def newest_with_records(logdir):
    files = binlog_files(logdir)
    with_records = [n for n in sorted(files) if records(files[n])]
    check(len(with_records) >= 2, "fewer than two binlog files hold records: %s" % sorted(files))
    return files, with_records


def test_damaged():
    logdir, _max_id = beanstalkd_log("damaged", signal.SIGKILL, SEED + 2)
    files, with_records = newest_with_records(logdir)
    victim = files[with_records[0]]
    recs = records(victim)
    check(len(recs) >= 3, "%s holds %d records; want one in the middle" % (victim, len(recs)))
    offset = recs[len(recs) // 2][0]
    with open(victim, "r+b") as f:          # the name length becomes negative
        f.seek(offset)
        f.write(b"\xff\xff\xff\xff")
    print("  damaged %s at offset %d (of %d records)" % (os.path.basename(victim), offset, len(recs)), flush=True)
    before = snapshot(logdir)
    srv, status = start(beangate_argv(logdir), "beangate on a damaged log", expect_start=False)
    err = srv.stderr()
    check(testlib.sanitizer_report(err) is None, "sanitizer report: %s" % testlib.sanitizer_report(err))
    check(status != 0, "beangate started on a damaged binlog (status %r); stderr: %s" % (status, err[-1500:]))
    name = os.path.basename(victim)
    check(re.search(r"event=binlog_damaged file=%s .*\boffset=%d\b" % (re.escape(name), offset), err),
          "the refusal does not name %s and offset %d; stderr: %s" % (name, offset, err[-1500:]))
    check_eq(snapshot(logdir), before, "the files after the refused start (unchanged)")
    print("  refused (status %d): %s" % (status, " | ".join(l for l in err.splitlines() if name in l)[:600]),
          flush=True)
    _srv, port = beangate(logdir, ["--log-recover-damaged"])
    stats = Client(port, "beangate").yaml(b"stats")
    check(int(stats["current-jobs-ready"]) + int(stats["current-jobs-delayed"]) + int(stats["current-jobs-buried"]) > 0,
          "beangate recovered no job from the damaged log: %r" % stats)


def test_torn_tail():
    logdir, max_id = beanstalkd_log("torn", signal.SIGKILL, SEED + 3)
    files, with_records = newest_with_records(logdir)
    newest = files[with_records[-1]]
    # tear a job's first full record (its put): a torn rewrite of a job that
    # an older record still holds (compaction) is where the two differ on
    # purpose: beanstalkd drops that job, beangate keeps its older record
    # (docs/durability.md, "Importing beanstalkd's log")
    seen, puts = set(), []
    for n in with_records:
        for r in records(files[n]):
            if r[1] > 0 and r[2][0] not in seen:
                if files[n] == newest:
                    puts.append(r)
                seen.add(r[2][0])
    check(puts, "%s holds no job's first full record to tear" % newest)
    pos, namelen, rec, _end = puts[-1]
    cut = pos + 4 + namelen + JOBREC.size + 1      # one byte into the last full record's body
    os.truncate(newest, cut)
    print("  cut %s at %d (inside job %d's first full record's body)" % (os.path.basename(newest), cut, rec[0]), flush=True)
    err = import_and_compare(logdir, max_id, "after a torn tail")
    name = os.path.basename(newest)
    check(re.search(r"level=warn event=binlog_torn_tail file=%s " % re.escape(name), err),
          "beangate did not warn about the torn tail of %s; stderr: %s" % (name, err[-1500:]))


def test_torn_rewrite():
    """A torn tail inside a rewrite of a job whose older full record is complete (what
    a crash during compaction leaves, which a short workload seldom shows, so the
    rewrite is written here: the job's record copied to the end of the newest file,
    cut one byte into its body): beangate keeps the job as the older record left it,
    beanstalkd's restart drops it (docs/durability.md)."""
    logdir, max_id = beanstalkd_log("rewrite", signal.SIGKILL, SEED + 4)
    files, with_records = newest_with_records(logdir)
    newest = files[with_records[-1]]
    full, state = {}, {}
    for n in with_records:
        with open(files[n], "rb") as f:
            data = f.read()
        for pos, namelen, rec, end in records(files[n]):
            if namelen > 0:
                full[rec[0]] = data[pos:end]
            state[rec[0]] = rec[-1]
    live = sorted(j for j in full if state[j] != 0)
    check(live, "no live job has a full record")
    jid = live[len(live) // 2]
    last_end = records(newest)[-1][3]
    namelen = struct.unpack_from("<i", full[jid])[0]
    torn = full[jid][:4 + namelen + JOBREC.size + 1]
    with open(newest, "r+b") as f:
        f.seek(last_end)
        f.write(torn)
        f.truncate(last_end + len(torn))
    print("  %s ends in job %d's rewritten record, cut one byte into its body"
          % (os.path.basename(newest), jid), flush=True)
    ref_dir, cand_dir = copies(logdir)
    _ref, ref_port = beanstalkd(ref_dir)
    cand, cand_port = beangate(cand_dir)
    ref, got = Client(ref_port, "beanstalkd"), Client(cand_port, "beangate")
    check_eq(pipelined(ref, [b"peek %d" % jid], read_peek)[0], None, "job %d on beanstalkd" % jid)
    kept = pipelined(got, [b"peek %d" % jid], read_peek)[0]
    check(kept is not None and kept[0] == jid, "beangate lost job %d, whose older record is complete" % jid)
    body_size = JOBREC.unpack_from(full[jid], 4 + namelen)[4]
    check_eq(len(kept[1]), body_size - 2, "job %d's body length on beangate" % jid)
    counts = [sum(int(c.yaml(b"stats")[f]) for f in JOB_COUNTS if f != "current-jobs-urgent")
              for c in (ref, got)]
    check_eq(counts[1], counts[0] + 1, "jobs on beangate, jobs on beanstalkd + 1 (job %d)" % jid)
    print("  beanstalkd dropped job %d, beangate kept it; %d jobs beside it on both" % (jid, counts[0]),
          flush=True)
    ref.close()
    got.close()


TESTS = [test_sigkill, test_sigterm, test_damaged, test_torn_tail, test_torn_rewrite]


def after(error):
    problems = []
    for srv in SERVERS:
        srv.kill()
        report = testlib.sanitizer_report(srv.stderr())
        if report:
            problems.append("sanitizer report: " + report[:3000])
    del SERVERS[:]
    return problems


def setup(names):
    if not os.access(BEANSTALKD, os.X_OK):
        raise testlib.Skip("no beanstalkd at %s (apt-get install beanstalkd; BEANSTALKD= names another)"
                           % BEANSTALKD)


def main(argv):
    global BINARY, WORK, SEED
    args = testlib.parse_args(testlib.arg_parser(__doc__), argv)
    BINARY, SEED = args.binary, args.seed
    with tempfile.TemporaryDirectory(prefix="binlog-diff-") as work:
        WORK = work
        return testlib.run("binlog_differential", TESTS, args, namespace=globals(), setup=setup,
                           after=after, all_skipped=77)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
