#!/usr/bin/env python3
"""beangate --copy-jobs against Debian's beanstalkd (issue 24, "a way back").

    test_copy_jobs.py BINARY [-k NAME] [--seed N]

Each test starts Debian's /usr/bin/beanstalkd and beangate on free loopback
ports, fills the source with jobs in every state across several tubes
(binary bodies, CRLF inside, empty bodies, a body at the -z limit,
priorities 0 and 2^32-1, delays, a job reserved by a consumer that stays
connected), runs the copy (beangate -> beanstalkd is the way back;
beanstalkd -> beangate an online migration), and checks every job on the
target: tube, state, pri, ttr, time-left within a second, body by peek;
the counts printed; the source after --move. Then the failures: the
target's -z smaller than a job, the source killed mid-move (nothing lost),
bad usage. Exit 77 (all skipped) without /usr/bin/beanstalkd.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from testlib import (LineSocket, ServerProcess, Skip, arg_parser, check, check_eq, free_port,  # noqa: E402
                     parse_args, port_open, run, run_binary, sanitizer_report, wait_until)

BEANSTALKD = "/usr/bin/beanstalkd"
BINARY = None
WORKDIR = None
ZMAX = 5000          # -z of both servers (the largest body)
TIMEOUT = 10.0
SERVERS = []         # started by the running test; stopped (and checked) after it
PRI_MAX = 2 ** 32 - 1

# (tube, state, pri, delay, ttr, body): unique rows; "reserved" is held by a consumer.
JOBS = [
    ("default", "ready", 0, 0, 60, b""),
    ("default", "ready", PRI_MAX, 0, 1, b"\r\n"),
    ("default", "ready", 1024, 0, 120, bytes(range(256))),
    ("t-a", "ready", 7, 0, 30, b"x" * ZMAX),
    ("t-a", "delayed", 3, 300, 40, b"later\r\nstill"),
    ("t-a", "delayed", PRI_MAX, 90, 5, b""),
    ("t.b", "buried", 0, 0, 60, b"buried\x00\xff"),
    ("t.b", "buried", PRI_MAX, 0, 2, b"buried 2"),
    ("t.b", "reserved", 9, 0, 600, b"held by a consumer"),
    ("t_c(1)", "ready", 5, 0, 60, b"\r\n\r\n" + bytes(range(255, -1, -1))),
    ("t_c(1)", "buried", 11, 0, 60, b""),
]


class Conn(LineSocket):
    """A beanstalk client: ask(command) -> the reply line."""

    def __init__(self, port):
        super().__init__(port, TIMEOUT)

    def ask(self, cmd, body=None):
        self.s.sendall(cmd + b"\r\n" + (body + b"\r\n" if body is not None else b""))
        return self.line()

    def stats_job(self, job_id):
        line = self.ask(b"stats-job %d" % job_id)
        if line == b"NOT_FOUND":
            return None
        check(line.startswith(b"OK "), "stats-job %d: %r" % (job_id, line))
        fields = {}
        for row in self.body(int(line.split()[1])).decode().splitlines()[1:]:
            k, v = row.split(": ", 1)
            fields[k] = v.strip('"')
        return fields

    def stats_tube(self, tube):
        line = self.ask(b"stats-tube " + tube.encode())
        check(line.startswith(b"OK "), "stats-tube %s: %r" % (tube, line))
        return dict(row.split(": ", 1) for row in self.body(int(line.split()[1])).decode().splitlines()[1:])

    def peek(self, job_id):
        line = self.ask(b"peek %d" % job_id)
        check(line.startswith(b"FOUND "), "peek %d: %r" % (job_id, line))
        return self.body(int(line.split()[2]))


def start_beanstalkd(z=ZMAX):
    if not os.access(BEANSTALKD, os.X_OK):
        raise Skip("no %s (apt-get install beanstalkd; scripts/install-deps.sh test does)" % BEANSTALKD)
    port = free_port()
    proc = ServerProcess()
    proc.spawn([BEANSTALKD, "-l", "127.0.0.1", "-p", str(port), "-z", str(z)])
    SERVERS.append(proc)
    wait_until(lambda: proc.proc.poll() is not None or port_open(port), "beanstalkd on %d" % port, TIMEOUT)
    check(proc.proc.poll() is None, "beanstalkd exited: %s" % proc.stderr())
    return port, proc


def start_beangate(z=ZMAX, logdir=None, port=None, unix=None, extra=()):
    """beangate on a free port (or on the unix socket path unix); extra: more flags."""
    port = port or free_port()
    proc = ServerProcess()
    argv = [BINARY, "-l", "unix:" + unix if unix else "127.0.0.1", "-p", str(port), "-z", str(z), "--no-http"]
    if logdir:
        argv += ["-b", logdir, "-f", "0"]
    argv += list(extra)
    proc.spawn(argv)
    SERVERS.append(proc)
    up = (lambda: os.path.exists(unix)) if unix else (lambda: port_open(port))
    wait_until(lambda: proc.proc.poll() is not None or up(), "beangate on %s" % (unix or port), TIMEOUT)
    check(proc.proc.poll() is None, "beangate exited: %s" % proc.stderr())
    return port, proc


class Proxy:
    """A loopback proxy to a beanstalk server at port that hands each chunk of
    a client's commands, cut after its last CRLF (so a command is never
    split), to edit(chunk) -> (bytes to forward, whether to close the
    connection then); the server's replies go back as they are."""

    def __init__(self, port):
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()

    def edit(self, chunk):
        return chunk, False

    def accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self.pipe, args=(client, server, self.edit), daemon=True).start()
            threading.Thread(target=self.pipe, args=(server, client, None), daemon=True).start()

    @staticmethod
    def pipe(src, dst, edit):
        held = b""
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                held += data
                cut = held.rfind(b"\r\n") + 2 if edit else len(held)
                out, held = held[:cut], held[cut:]
                out, close = edit(out) if edit else (out, False)
                dst.sendall(out)
                if close:
                    break
        except OSError:
            pass
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        """Stop listening (shutdown wakes the accept, which close alone does not)."""
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()


class NoReserveJobProxy(Proxy):
    """A beanstalk server that lacks reserve-job (as beanstalkd before 1.12):
    the proxy renames the command on its way, so the server answers
    UNKNOWN_COMMAND."""

    def edit(self, chunk):
        return chunk.replace(b"reserve-job ", b"reserve-jxb "), False


class CutBeforeBuryProxy(Proxy):
    """A TO whose connection breaks between the puts of a buried run and its
    buries: at the first `reserve-job N` (N > 0; the copy's `reserve-job 0`
    probes) the proxy forwards what comes before and closes the connection.
    With refuse_after, it then accepts no connection more."""

    def __init__(self, port, refuse_after):
        self.refuse_after = refuse_after
        self.cut = threading.Event()
        super().__init__(port)

    def edit(self, chunk):
        at = re.search(rb"(^|\n)reserve-job [1-9]", chunk)
        if self.cut.is_set() or not at:
            return chunk, False
        self.cut.set()
        if self.refuse_after:
            self.close()
        return chunk[:at.start() + len(at.group(1))], True


def drain(port, proc):
    """SIGUSR1 to the beangate proc on port; wait until its stats say draining."""
    proc.proc.send_signal(signal.SIGUSR1)
    c = Conn(port)

    def draining():
        line = c.ask(b"stats")
        return b"\ndraining: true\n" in c.body(int(line.split()[1]))
    wait_until(draining, "beangate to drain", TIMEOUT)
    c.close()


def fill(port, jobs=JOBS):
    """Put jobs on the server at port; the connection that holds the reserved
    one (keep it open), and the time of the puts."""
    c = Conn(port)
    t0 = time.monotonic()
    for tube, state, pri, delay, ttr, body in jobs:
        check_eq(c.ask(b"use " + tube.encode()), b"USING " + tube.encode(), "use")
        line = c.ask(b"put %d %d %d %d" % (pri, delay, ttr, len(body)), body)
        check(line.startswith(b"INSERTED "), "put: %r" % line)
        job_id = int(line.split()[1])
        if state in ("buried", "reserved"):
            check(c.ask(b"reserve-job %d" % job_id).startswith(b"RESERVED "), "reserve-job %d" % job_id)
            c.body(len(body))
        if state == "buried":
            check_eq(c.ask(b"bury %d %d" % (job_id, pri)), b"BURIED", "bury")
    return c, t0


def jobs_on(port, max_id=None, states=("ready", "delayed", "buried", "reserved")):
    """Every job on the server at port with an id up to max_id (default:
    total-jobs + 1): {id: (tube, state, pri, ttr, body, time-left)}."""
    c = Conn(port)
    if max_id is None:
        line = c.ask(b"stats")
        stats = c.body(int(line.split()[1])).decode()
        max_id = int(next(r.split(": ")[1] for r in stats.splitlines() if r.startswith("total-jobs:"))) + 1
    found = {}
    for job_id in range(1, max_id + 1):
        f = c.stats_job(job_id)
        if f and f["state"] in states:
            found[job_id] = (f["tube"], f["state"], int(f["pri"]), int(f["ttr"]), c.peek(job_id),
                             int(f["time-left"]))
    c.close()
    return found


LAST_COPY_SECONDS = [0.0]   # how long the last copy_jobs ran


def copy_jobs(args, timeout=120):
    t = time.monotonic()
    try:
        return run_binary(BINARY, ["--copy-jobs"] + args, timeout)
    finally:
        LAST_COPY_SECONDS[0] = time.monotonic() - t


def check_target(port, t0, jobs):
    """The target holds exactly jobs minus the reserved one, each as it was
    (a delayed one with its remaining delay within a second, plus the time
    the copy took between reading a job's time-left and putting it)."""
    got = jobs_on(port)
    elapsed = time.monotonic() - t0
    want = sorted((t, s, p, ttr, b) for t, s, p, d, ttr, b in jobs if s != "reserved")
    check_eq(sorted(v[:5] for v in got.values()), want, "the jobs on the target (tube, state, pri, ttr, body)")
    delays = {(t, p, ttr, b): d for t, s, p, d, ttr, b in jobs if s == "delayed"}
    for tube, state, pri, ttr, body, left in got.values():
        if state == "delayed":
            remaining = delays[(tube, pri, ttr, body)] - elapsed
            check(abs(left - remaining) <= 1.0 + LAST_COPY_SECONDS[0],
                  "delayed job in %s: time-left %d on the target, %.2f s remaining on the source" %
                  (tube, left, remaining))


def check_summary(out, verb, jobs):
    n = {s: sum(1 for j in jobs if j[1] == s) for s in ("ready", "delayed", "buried", "reserved")}
    copied = n["ready"] + n["delayed"] + n["buried"]
    first = out.splitlines()[0] if out else ""
    check(first.startswith("%s %d jobs from " % (verb, copied)) and
          first.endswith(": ready %d, delayed %d, buried %d; reserved (left on FROM) %d" %
                         (n["ready"], n["delayed"], n["buried"], n["reserved"])),
          "summary line: %r" % first)
    check("  tube t.b: ready 0, delayed 0, buried 2, reserved 1" in out, "the tube t.b's line in %r" % out)


def one_way(source, target, move):
    """Fill the source, copy or move to the target, check both."""
    src_port, _ = source()
    dst_port, _ = target()
    consumer, t0 = fill(src_port)
    before = jobs_on(src_port)
    args = ["127.0.0.1:%d" % src_port, "127.0.0.1:%d" % dst_port, "--map", os.path.join(WORKDIR, "map")]
    status, out, err = copy_jobs(args + (["--move"] if move else []))
    check_eq(status, 3, "exit status (a reserved job stays on the source); stderr %r" % err)
    check("1 reserved job(s) left on FROM" in err, "stderr names the reserved job left: %r" % err)
    check_summary(out, "moved" if move else "copied", JOBS)
    check_target(dst_port, t0, JOBS)
    with open(os.path.join(WORKDIR, "map")) as f:
        pairs = [tuple(map(int, line.split())) for line in f]
    check_eq(len(pairs), len(JOBS) - 1, "lines of --map")
    on_target = jobs_on(dst_port)
    for src_id, dst_id in pairs:
        check_eq(on_target[dst_id][:5], before[src_id][:5], "--map's line %d %d: the same job" % (src_id, dst_id))
    after = jobs_on(src_port)
    if move:
        check_eq([v[:5] for v in after.values()], [("t.b", "reserved", 9, 600, b"held by a consumer")],
                 "the source after --move: only the reserved job")
    else:
        check_eq({k: v[:5] for k, v in after.items()}, {k: v[:5] for k, v in before.items()},
                 "the source after a copy: untouched")
    consumer.close()


def test_copy_beangate_to_beanstalkd():
    one_way(start_beangate, start_beanstalkd, move=False)


def test_move_beangate_to_beanstalkd():
    one_way(start_beangate, start_beanstalkd, move=True)


def test_copy_beanstalkd_to_beangate():
    one_way(start_beanstalkd, start_beangate, move=False)


def test_move_beanstalkd_to_beangate():
    one_way(start_beanstalkd, start_beangate, move=True)


def test_json_report_and_tube_filter():
    """--json prints one object with the counts; --tube moves only that tube."""
    src_port, _ = start_beangate()
    dst_port, _ = start_beanstalkd()
    consumer, _ = fill(src_port)
    status, out, err = copy_jobs(["127.0.0.1:%d" % src_port, "127.0.0.1:%d" % dst_port, "--move",
                                  "--tube", "t-a", "--json"])
    check_eq(status, 0, "exit status (no reserved job in t-a); stderr %r" % err)
    report = json.loads(out)
    check_eq((report["mode"], report["jobs"], report["ready"], report["delayed"], report["buried"],
              report["reserved"], report["error"]), ("move", 3, 1, 2, 0, 0, None), "the JSON report")
    check_eq(sorted(report["tubes"]), ["t-a"], "tubes in the JSON report")
    check_eq(sorted(v[0] for v in jobs_on(dst_port).values()), ["t-a"] * 3, "tubes on the target")
    check_eq(len(jobs_on(src_port)), len(JOBS) - 3, "jobs left on the source")
    consumer.close()


def test_target_max_job_size_smaller():
    """TO's -z below a body: stop naming the job, nonzero exit, nothing lost."""
    src_port, _ = start_beangate()
    dst_port, _ = start_beanstalkd(z=ZMAX - 1)
    consumer, _ = fill(src_port)
    status, out, err = copy_jobs(["127.0.0.1:%d" % src_port, "127.0.0.1:%d" % dst_port, "--move"])
    check_eq(status, 1, "exit status; stdout %r" % out)
    check("JOB_TOO_BIG" in err and "its -z" in err and "stays on FROM" in err, "the reason: %r" % err)
    check(out.startswith("stopped after moving "), "the report says it stopped: %r" % out)
    left, moved = jobs_on(src_port), jobs_on(dst_port)
    check_eq(sorted(v[:5] for v in list(left.values()) + list(moved.values())),
             sorted((t, s, p, ttr, b) for t, s, p, d, ttr, b in JOBS), "the jobs on both servers together")
    check(any(v[4] == b"x" * ZMAX for v in left.values()), "the big job is still on the source")
    consumer.close()


def test_target_without_reserve_job():
    """TO without reserve-job: the move stops at the first buried job, says
    why, and leaves it on FROM; what moved before is on TO, nothing lost."""
    src_port, _ = start_beangate()
    dst_port, _ = start_beanstalkd()
    proxy = NoReserveJobProxy(dst_port)
    jobs = [("t-a", "ready", 1, 0, 9, b"ready one")] + [j for j in JOBS if j[0] == "t.b" and j[1] != "reserved"]
    consumer, _ = fill(src_port, jobs)
    status, out, err = copy_jobs(["127.0.0.1:%d" % src_port, "127.0.0.1:%d" % proxy.port, "--move"])
    proxy.close()
    check_eq(status, 1, "exit status; stdout %r" % out)
    check("lacks reserve-job" in err and "stays on FROM" in err, "the reason: %r" % err)
    left, moved = jobs_on(src_port), jobs_on(dst_port)
    check_eq(sorted(v[:5] for v in list(left.values()) + list(moved.values())),
             sorted((t, s, p, ttr, b) for t, s, p, d, ttr, b in jobs), "the jobs on both servers together")
    check(all(v[1] == "buried" for v in left.values()) and len(left) == 2, "the buried jobs stay on FROM: %r" % left)
    check_eq([v[4] for v in moved.values()], [b"ready one"], "the job moved before (t-a's, listed first)")
    consumer.close()


def test_target_draining():
    """TO draining (SIGUSR1): the move stops at the first job, nothing deleted."""
    src_port, _ = start_beanstalkd()
    dst_port, dst = start_beangate()
    consumer, _ = fill(src_port)
    drain(dst_port, dst)
    before = jobs_on(src_port)
    status, out, err = copy_jobs(["127.0.0.1:%d" % src_port, "127.0.0.1:%d" % dst_port, "--move", "--json"])
    check_eq(status, 1, "exit status; stdout %r" % out)
    check("DRAINING" in err and "draining" in err, "the reason: %r" % err)
    report = json.loads(out)
    check_eq((report["jobs"], "DRAINING" in (report["error"] or "")), (0, True), "the JSON report")
    check_eq({k: v[:5] for k, v in jobs_on(src_port).items()}, {k: v[:5] for k, v in before.items()},
             "the source: nothing deleted")
    consumer.close()


def test_draining_source():
    """FROM draining (SIGUSR1, as before going back): a copy cannot put its
    probe and says to use --move; --move moves everything."""
    src_port, src = start_beangate()
    dst_port, _ = start_beanstalkd()
    consumer, t0 = fill(src_port)
    drain(src_port, src)
    status, out, err = copy_jobs(["127.0.0.1:%d" % src_port, "127.0.0.1:%d" % dst_port])
    check_eq(status, 1, "exit status of a copy; stdout %r" % out)
    check("DRAINING" in err and "--move needs none" in err, "the reason: %r" % err)
    status, out, err = copy_jobs(["127.0.0.1:%d" % src_port, "127.0.0.1:%d" % dst_port, "--move"])
    check_eq(status, 3, "exit status of --move; stderr %r" % err)
    check_summary(out, "moved", JOBS)
    check_target(dst_port, t0, JOBS)
    consumer.close()


def test_unix_socket_source():
    """FROM as a unix socket path."""
    path = os.path.join(WORKDIR, "src.sock")
    _, _ = start_beangate(unix=path)
    dst_port, _ = start_beanstalkd()
    c = socket.socket(socket.AF_UNIX)
    c.connect(path)
    c.sendall(b"use u\r\nput 3 0 7 2\r\nhi\r\n")
    f = c.makefile("rb")
    check_eq((f.readline(), f.readline()), (b"USING u\r\n", b"INSERTED 1\r\n"), "put over the unix socket")
    status, out, err = copy_jobs([path, "127.0.0.1:%d" % dst_port])
    check_eq(status, 0, "exit status; stderr %r" % err)
    check_eq(list(jobs_on(dst_port).values()), [("u", "ready", 3, 7, b"hi", 0)], "the job on the target")
    c.close()


def killed_mid_move(side):
    """side ("FROM" or "TO", beangate with -b and -f 0; the other one is
    beanstalkd) SIGKILLed while --move runs: after its restart every job is
    on one server or the other, at most one on both. Killing TO proves that
    a job leaves FROM only once TO has it."""
    count = 4000
    logdir = os.path.join(WORKDIR, "log")
    shutil.rmtree(logdir, ignore_errors=True)
    if side == "FROM":
        (src_port, victim), (dst_port, _) = start_beangate(logdir=logdir), start_beanstalkd()
    else:
        (src_port, _), (dst_port, victim) = start_beanstalkd(), start_beangate(logdir=logdir)
    victim_port = src_port if side == "FROM" else dst_port
    c = Conn(src_port)
    c.s.sendall(b"".join(b"put 100 0 60 8\r\n%08d\r\n" % i for i in range(count)))
    for _ in range(count):
        check(c.line().startswith(b"INSERTED "), "put")
    c.close()
    copier = subprocess.Popen([BINARY, "--copy-jobs", "127.0.0.1:%d" % src_port, "127.0.0.1:%d" % dst_port,
                               "--move"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    probe = Conn(dst_port)

    def target_jobs():
        line = probe.ask(b"stats-tube default")
        if not line.startswith(b"OK"):
            return 0
        return int(next(r.split(b": ")[1] for r in probe.body(int(line.split()[1])).splitlines()
                        if r.startswith(b"current-jobs-ready:")))
    wait_until(lambda: target_jobs() >= 200 or copier.poll() is not None, "200 jobs moved", 30)
    probe.close()
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait()
    out, err = copier.communicate(timeout=60)
    err = err.decode()
    check_eq(copier.returncode, 1, "exit status; stderr %r" % err)
    check("stopped: %s 127.0.0.1:%d" % (side, victim_port) in err, "the reason names %s: %r" % (side, err))
    check(sanitizer_report(err) is None, "sanitizer report: %s" % err[:2000])
    start_beangate(logdir=logdir, port=victim_port)
    bodies = [v[4] for port in (src_port, dst_port) for v in jobs_on(port, count + 1).values()]
    check_eq(sorted(set(bodies)), [b"%08d" % i for i in range(count)], "every job on one of the servers")
    check(len(bodies) - count <= 1, "%d jobs on both servers (at most 1)" % (len(bodies) - count))


def test_source_killed_mid_move():
    killed_mid_move("FROM")


def test_target_killed_mid_move():
    killed_mid_move("TO")


def test_reply_announcing_too_much():
    """A FROM that announces more bytes than any reply may hold (past -z's ceiling
    of 1 GiB, and 2^64-1, which would wrap a length sum): a clear error, exit 1,
    nothing read into memory, nothing on TO."""
    dst_port, _ = start_beanstalkd()
    for size in (2 ** 30 + 1, 2 ** 64 - 1):
        fake = socket.create_server(("127.0.0.1", 0))

        def answer(listener=fake, size=size):
            conn, _ = listener.accept()
            with conn:
                while conn.recv(65536):
                    conn.sendall(b"OK %d\r\n" % size)
        threading.Thread(target=answer, daemon=True).start()
        status, out, err = copy_jobs(["127.0.0.1:%d" % fake.getsockname()[1], "127.0.0.1:%d" % dst_port, "--move"],
                                     timeout=30)
        fake.close()
        check_eq(status, 1, "exit status for OK %d; stdout %r, stderr %r" % (size, out, err))
        check("announces %d bytes, more than %d" % (size, 2 ** 30) in err, "the reason: %r" % err)
    check_eq(jobs_on(dst_port), {}, "jobs on TO")


# stats-job fields a copy cannot carry (docs/migrating.md, "What a copied job
# keeps"): the id is TO's next; age starts at the put; file is TO's own log
# file; the counters count what happened on one server (TO's reserves and
# buries are 1 for a buried job: the copy's own reserve-job and bury).
NOT_CARRIED = {"id", "age", "file", "reserves", "timeouts", "releases", "buries", "kicks"}


def put_job(c, tube, pri, delay, ttr, body):
    check_eq(c.ask(b"use " + tube.encode()), b"USING " + tube.encode(), "use")
    line = c.ask(b"put %d %d %d %d" % (pri, delay, ttr, len(body)), body)
    check(line.startswith(b"INSERTED "), "put: %r" % line)
    return int(line.split()[1])


def reserve_job(c, job_id):
    line = c.ask(b"reserve-job %d" % job_id)
    check(line.startswith(b"RESERVED %d " % job_id), "reserve-job %d: %r" % (job_id, line))
    c.body(int(line.split()[2]))


def stats_job_fields(source, target):
    """Fill the source with buried jobs of several delays (0; put with 5;
    released with 7, then buried) beside a ready and a delayed one, copy
    them while a consumer of the target waits on their tube, and compare
    every stats-job field of each job with its copy (by --map)."""
    src_port, _ = source()
    dst_port, _ = target()
    c = Conn(src_port)
    buried = []
    for pri, delay, ttr, body in [(0, 0, 60, b"b-0"), (PRI_MAX, 5, 70, b"b-5\r\n"), (30, 0, 80, b"")]:
        job_id = put_job(c, "tb", pri, delay, ttr, body)
        reserve_job(c, job_id)
        if body == b"":  # released with a delay of 7 (its delay field), reserved again, buried with pri 31
            check_eq(c.ask(b"release %d 30 7" % job_id), b"RELEASED", "release")
            reserve_job(c, job_id)
            pri = 31
        check_eq(c.ask(b"bury %d %d" % (job_id, pri)), b"BURIED", "bury")
        buried.append(job_id)
    put_job(c, "t-other", 1, 0, 60, b"ready")  # (in tb the consumer would take it, rightly)
    put_job(c, "t-other", 2, 300, 60, b"delayed")
    consumer = Conn(dst_port)  # waits on tb: it must not get a buried job while it is copied
    check_eq(consumer.ask(b"watch tb"), b"WATCHING 2", "watch")
    check_eq(consumer.ask(b"ignore default"), b"WATCHING 1", "ignore")
    consumer.s.sendall(b"reserve-with-timeout 20\r\n")
    source_fields = {job_id: c.stats_job(job_id) for job_id in range(1, 6)}
    t0 = time.monotonic()
    status, out, err = copy_jobs(["127.0.0.1:%d" % src_port, "127.0.0.1:%d" % dst_port,
                                  "--map", os.path.join(WORKDIR, "map")])
    elapsed = time.monotonic() - t0
    check_eq(status, 0, "exit status; stdout %r, stderr %r" % (out, err))
    with open(os.path.join(WORKDIR, "map")) as f:
        pairs = dict(tuple(map(int, line.split())) for line in f)
    check_eq(sorted(pairs), [1, 2, 3, 4, 5], "the jobs in --map")
    t = Conn(dst_port)
    for src_id, dst_id in sorted(pairs.items()):
        want, got = source_fields[src_id], t.stats_job(dst_id)
        check_eq(set(got), set(want), "stats-job fields of job %d (the target's %d)" % (src_id, dst_id))
        check_eq(t.peek(dst_id), c.peek(src_id), "body of job %d" % src_id)
        carried = ["tube", "state", "pri", "ttr"]
        if want["state"] == "delayed":  # its delay is what was left of it (put is the only way to set both)
            left = int(want["time-left"])
            check(left <= int(got["delay"]) <= left + 1 + elapsed + 1,
                  "delay of delayed job %d on the target: %s (%d s left on the source)" % (src_id, got["delay"], left))
            check(abs(int(got["time-left"]) - left) <= 1 + elapsed, "time-left of job %d: %s, source %d" %
                  (src_id, got["time-left"], left))
        else:
            carried += ["delay", "time-left"]
        for field in carried:
            check_eq(got[field], want[field], "stats-job %s of job %d (%s) on the target" % (field, src_id, want["state"]))
        check_eq(set(got) - set(carried) - {"delay", "time-left"}, NOT_CARRIED, "the fields not carried")
        if want["state"] == "buried":
            check_eq((got["reserves"], got["buries"], got["releases"]), ("1", "1", "0"),
                     "the target's counters of buried job %d: the copy's reserve-job and bury" % src_id)
    check_eq([source_fields[i]["delay"] for i in buried], ["0", "5", "7"], "the source's delays of the buried jobs")
    # the consumer got none of the copied jobs, and tb is not left paused: it gets a new job at once
    check_eq(t.stats_tube("tb")["pause-time-left"], "0", "tb's pause-time-left on the target")
    check(t.ask(b"use tb") == b"USING tb" and t.ask(b"put 0 0 60 5", b"fresh").startswith(b"INSERTED "), "put")
    line = consumer.line()
    check(line.startswith(b"RESERVED ") and consumer.body(int(line.split()[2])) == b"fresh",
          "the waiting consumer of the target got the fresh job: %r" % line)
    for conn in (c, t, consumer):
        conn.close()


def test_stats_job_fields_beanstalkd_to_beangate():
    stats_job_fields(start_beanstalkd, start_beangate)


def test_stats_job_fields_beangate_to_beanstalkd():
    stats_job_fields(start_beangate, start_beanstalkd)


def tube_pauses(source, target, move):
    """A tube paused on the source is paused on the target for the time it
    has left (within a second, never shorter); a tube the target had paused
    itself keeps its pause through the copy of its buried job; an unpaused
    one stays unpaused."""
    src_port, _ = source()
    dst_port, _ = target()
    c = Conn(src_port)
    for tube in ("tp", "tq", "tr"):
        put_job(c, tube, 5, 0, 60, b"ready " + tube.encode())
        job_id = put_job(c, tube, 6, 0, 60, b"buried " + tube.encode())
        reserve_job(c, job_id)
        check_eq(c.ask(b"bury %d 6" % job_id), b"BURIED", "bury")
    check_eq(c.ask(b"pause-tube tp 300"), b"PAUSED", "pause-tube on the source")
    t = Conn(dst_port)
    check_eq(t.ask(b"watch tq"), b"WATCHING 2", "watch (keeps tq on the target)")
    check_eq(t.ask(b"pause-tube tq 200"), b"PAUSED", "the target's own pause of tq")
    t0 = time.monotonic()
    status, out, err = copy_jobs(["127.0.0.1:%d" % src_port, "127.0.0.1:%d" % dst_port, "--json"] +
                                 (["--move"] if move else []))
    elapsed = time.monotonic() - t0
    check_eq(status, 0, "exit status; stdout %r, stderr %r" % (out, err))
    report = json.loads(out)
    check_eq((report["jobs"], report["buried"], report["pauses"]), (6, 3, 1), "the JSON report's jobs, buried, pauses")
    for tube, want in (("tp", 300), ("tq", 200)):
        left = int(t.stats_tube(tube)["pause-time-left"])
        check(want - 1 - elapsed <= left <= want + 1, "%s's pause-time-left on the target: %d, want %d" % (tube, left, want))
    check_eq(t.stats_tube("tr")["pause-time-left"], "0", "tr's pause-time-left on the target")
    check_eq(sorted(v[:2] for v in jobs_on(dst_port).values()),
             sorted((tube, state) for tube in ("tp", "tq", "tr") for state in ("ready", "buried")), "the jobs on the target")
    # a paused tube's ready job is not served on the target; tr's is
    reader = Conn(dst_port)
    for tube, want in (("tp", b"TIMED_OUT"), ("tr", b"RESERVED ")):
        check_eq(reader.ask(b"watch " + tube.encode()), b"WATCHING 2", "watch")
        check_eq(reader.ask(b"ignore default" if tube == "tp" else b"ignore tp"), b"WATCHING 1", "ignore")
        line = reader.ask(b"reserve-with-timeout 0")
        check(line.startswith(want), "reserve from %s on the target: %r" % (tube, line))
    for conn in (c, t, reader):
        conn.close()


def test_tube_pauses_copy_beanstalkd_to_beangate():
    tube_pauses(start_beanstalkd, start_beangate, move=False)


def test_tube_pauses_move_beangate_to_beanstalkd():
    tube_pauses(start_beangate, start_beanstalkd, move=True)


def tls_beangate(ca, verify_client=False, access=None):
    """beangate with a TLS port beside its plain one, its certificate (from
    ca) naming localhost only, not 127.0.0.1; with verify_client it wants
    a client certificate from ca; access: the text of its access file (its
    identity lines give client certificates their scopes). (plain port,
    TLS port)."""
    cert, key = ca.issue("server", dns=["localhost"])
    tls_port = free_port()
    extra = ["--tls-cert", cert, "--tls-key", key, "--tls-port", str(tls_port)]
    if verify_client:
        extra += ["--tls-ca", ca.cert, "--tls-verify-client"]
    if access is not None:
        path = os.path.join(WORKDIR, "access-%d" % tls_port)
        with open(path, "w") as f:
            f.write(access)
        os.chmod(path, 0o600)
        extra += ["--http-token-file", path]
    port, _ = start_beangate(extra=extra)
    wait_until(lambda: port_open(tls_port), "beangate's TLS port %d" % tls_port, TIMEOUT)
    return port, tls_port


def tls_ca(name="beangate test CA"):
    try:
        from tlsfiles import TestCA
    except ImportError:
        raise Skip("python3-cryptography is not installed (tests/lib/tlsfiles.py needs it)")
    return TestCA(os.path.join(WORKDIR, "tls"), name)


def test_tls_both_ways():
    """tls://HOST:PORT against beangate's own TLS listener: beanstalkd ->
    beangate and beangate -> beanstalkd, every job as over plain TCP."""
    ca = tls_ca()
    plain, tls_port = tls_beangate(ca)
    src_port, _ = start_beanstalkd()
    consumer, t0 = fill(src_port)
    status, out, err = copy_jobs(["127.0.0.1:%d" % src_port, "tls://localhost:%d" % tls_port, "--tls-ca", ca.cert])
    check_eq(status, 3, "exit status of the copy to TLS (a reserved job stays); stderr %r" % err)
    check_summary(out, "copied", JOBS)
    check(" to tls://localhost:%d: " % tls_port in out, "the report names the TLS address: %r" % out)
    check_target(plain, t0, JOBS)
    consumer.close()
    dst_port, _ = start_beanstalkd()
    status, out, err = copy_jobs(["tls://localhost:%d" % tls_port, "127.0.0.1:%d" % dst_port, "--tls-ca", ca.cert,
                                  "--move"])
    check_eq(status, 0, "exit status of the move from TLS; stderr %r" % err)
    check_target(dst_port, t0, [j for j in JOBS if j[1] != "reserved"])
    check_eq(jobs_on(plain), {}, "beangate after the move from it")


def test_tls_refusals():
    """A certificate from a CA not given (--tls-ca another CA, or the
    system's), one that does not name the host (127.0.0.1), a server that
    wants a client certificate, a missing --tls-ca file: each
    stops the copy before any job, exit 1, the reason on stderr; with the
    client certificate it goes."""
    ca = tls_ca()
    other = tls_ca("other CA")
    plain, tls_port = tls_beangate(ca, verify_client=True)
    src_port, _ = start_beanstalkd()
    consumer, t0 = fill(src_port)
    client_cert, client_key = ca.issue("client", cn="copier", client=True)
    with_cert = ["--tls-cert", client_cert, "--tls-key", client_key]
    for args, why in [(["tls://localhost:%d" % tls_port, "--tls-ca", other.cert] + with_cert, "issuer is unknown"),
                      (["tls://localhost:%d" % tls_port] + with_cert, "issuer is unknown. (--tls-ca FILE"),
                      (["tls://127.0.0.1:%d" % tls_port, "--tls-ca", ca.cert] + with_cert, "does not match"),
                      (["tls://localhost:%d" % tls_port, "--tls-ca", ca.cert], "wants a client certificate"),
                      (["tls://localhost:%d" % tls_port, "--tls-ca", os.path.join(WORKDIR, "none.pem")],
                       "--tls-ca %s: " % os.path.join(WORKDIR, "none.pem"))]:
        status, out, err = copy_jobs(["127.0.0.1:%d" % src_port] + args)
        check_eq(status, 1, "exit status of %r; stdout %r, stderr %r" % (args, out, err))
        check(why in err, "the reason for %r: %r" % (args, err))
    check_eq(jobs_on(plain), {}, "jobs on the target after the refusals")
    status, out, err = copy_jobs(["127.0.0.1:%d" % src_port, "tls://localhost:%d" % tls_port, "--tls-ca", ca.cert]
                                 + with_cert)
    check_eq(status, 3, "exit status with the client certificate; stderr %r" % err)
    check_target(plain, t0, JOBS)
    consumer.close()


def buried_copies_on(port, jobs):
    """The jobs on the server at port that copy a buried one of jobs (its tube
    and body): {id: (tube, state, ...)}."""
    buried = {(t, b) for t, s, p, d, ttr, b in jobs if s == "buried"}
    return {k: v for k, v in jobs_on(port).items() if (v[0], v[4]) in buried}


def test_target_without_manage_scope():
    """TO is beangate, the copy's client certificate has produce, consume and
    read but not manage, so TO refuses pause-tube: the copy stops at the
    first buried run before putting any of it (put in an unpaused tube, a
    buried job would be ready on TO), names the missing scope, exit 1."""
    ca = tls_ca()
    plain, tls_port = tls_beangate(ca, verify_client=True, access="identity cn:copier produce,consume,read:*\n")
    src_port, _ = start_beanstalkd()
    consumer, _ = fill(src_port)
    cert, key = ca.issue("client", cn="copier", client=True)
    status, out, err = copy_jobs(["127.0.0.1:%d" % src_port, "tls://localhost:%d" % tls_port, "--tls-ca", ca.cert,
                                  "--tls-cert", cert, "--tls-key", key])
    check_eq(status, 1, "exit status; stdout %r, stderr %r" % (out, err))
    check_eq(buried_copies_on(plain, JOBS), {}, "copies of FROM's buried jobs on TO")
    check("PERMISSION_DENIED" in err and "manage scope" in err and "stay on FROM" in err, "the reason: %r" % err)
    consumer.close()


def cut_before_bury(refuse_after):
    """A copy whose TO connection breaks after the puts of a buried run
    (tube t.b's two jobs, the first run) and before their buries; with
    refuse_after the copy cannot connect again to clean up. (exit status,
    stdout, stderr, TO's port, FROM's jobs)."""
    src_port, _ = start_beanstalkd()
    dst_port, _ = start_beanstalkd()
    consumer, _ = fill(src_port)
    before = jobs_on(src_port)
    proxy = CutBeforeBuryProxy(dst_port, refuse_after)
    status, out, err = copy_jobs(["127.0.0.1:%d" % src_port, "127.0.0.1:%d" % proxy.port, "--json"])
    proxy.close()
    consumer.close()
    check(proxy.cut.is_set(), "the proxy cut the connection before a reserve-job; stderr %r" % err)
    check_eq(status, 1, "exit status; stdout %r, stderr %r" % (out, err))
    check("TO 127.0.0.1:%d: the server closed the connection" % proxy.port in err, "the reason: %r" % err)
    return out, err, dst_port, before


def test_target_lost_before_bury_cleaned_up():
    """The copies of the cut run are deleted on TO over a new connection (else
    they would turn ready when the guard pause ends), and the tube's pause is
    set back; the report lists nothing left on TO."""
    out, err, dst_port, _ = cut_before_bury(refuse_after=False)
    check_eq(buried_copies_on(dst_port, JOBS), {}, "copies of FROM's buried jobs on TO")
    check("in tube t.b were deleted there" in err, "stderr tells the cleanup: %r" % err)
    check_eq(json.loads(out)["may_remain_on_to"], [], "may_remain_on_to in the report")
    c = Conn(dst_port)
    line = c.ask(b"stats-tube t.b")
    paused = line != b"NOT_FOUND" and c.stats_tube("t.b")["pause-time-left"] != "0"
    check(not paused, "t.b's pause on TO set back (or the tube gone with its copies): %r" % line)
    c.close()


def test_target_lost_before_bury_not_cleaned_up():
    """TO cannot be reached again after the cut: stderr and the JSON report
    name exactly the copies that remain on TO (FROM's id, TO's id), and
    those are the two copies of t.b's buried jobs, in a paused tube."""
    out, err, dst_port, before = cut_before_bury(refuse_after=True)
    left = json.loads(out)["may_remain_on_to"]
    on_to = buried_copies_on(dst_port, JOBS)
    check_eq(sorted(e["to"] for e in left), sorted(on_to), "may_remain_on_to %r against TO's copies %r" % (left, on_to))
    for e in left:
        check_eq(e["tube"], "t.b", "the tube of %r" % e)
        check_eq(on_to[e["to"]][:5:4], before[e["from"]][:5:4], "TO's job %d copies FROM's %d" % (e["to"], e["from"]))
        check("  job %d of FROM: job %d on TO" % (e["from"], e["to"]) in err, "stderr names %r: %r" % (e, err))
    check_eq(len(left), 2, "copies left on TO; stdout %r, stderr %r" % (out, err))
    c = Conn(dst_port)
    check(int(c.stats_tube("t.b")["pause-time-left"]) > 60, "t.b stays paused on TO (the guard)")
    c.close()


def test_target_closes_connection():
    """A TO that closes the connection at the first command (end of file, no
    error): the reason says so (not "no answer", whatever errno held), with
    no client-certificate hint (plain TCP), exit 1."""
    closer = socket.create_server(("127.0.0.1", 0))

    def close_each():
        while True:
            try:
                conn, _ = closer.accept()
            except OSError:
                return
            with conn:
                conn.recv(64)
    threading.Thread(target=close_each, daemon=True).start()
    src_port, _ = start_beanstalkd()
    status, out, err = copy_jobs(["127.0.0.1:%d" % src_port, "127.0.0.1:%d" % closer.getsockname()[1]], timeout=30)
    closer.close()
    check_eq(status, 1, "exit status; stdout %r" % out)
    check(err.endswith(": the server closed the connection\n") and "TO 127.0.0.1:" in err, "the reason: %r" % err)


def test_tls_garbage_no_certificate_hint():
    """A tls:// TO that, after the handshake, answers the first command with
    a record that does not decrypt: the reason is GnuTLS's, without the hint
    about a client certificate (a server that wants one closes, it does not
    send garbage), exit 1. Python's TLS server (OpenSSL) sends TLS 1.3
    session tickets after the handshake, for which GnuTLS's read says
    GNUTLS_E_AGAIN at once: that is no "no answer within 60 s"."""
    import ssl
    ca = tls_ca()
    cert, key = ca.issue("server", dns=["localhost"])
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))

    def garble():
        conn, _ = listener.accept()
        try:
            with ctx.wrap_socket(conn, server_side=True) as tls:
                tls.recv(64)
                os.write(tls.fileno(), b"\x17\x03\x03\x00\x20" + b"\x00" * 32)  # past TLS: raw bytes
                tls.recv(64)
        except (OSError, ssl.SSLError):
            pass
    threading.Thread(target=garble, daemon=True).start()
    src_port, _ = start_beanstalkd()
    status, out, err = copy_jobs(["127.0.0.1:%d" % src_port, "tls://localhost:%d" % listener.getsockname()[1],
                                  "--tls-ca", ca.cert], timeout=30)
    listener.close()
    check_eq(status, 1, "exit status; stdout %r, stderr %r" % (out, err))
    check("read failed: " in err and "client certificate" not in err, "the reason: %r" % err)


def test_usage_errors():
    for args, what in [([], "FROM and TO are required"), (["127.0.0.1:1"], "FROM and TO are required"),
                       (["a:1", "b:2", "--bogus"], "unknown option"), (["a:1", "a:1"], "the same"),
                       (["a:1", "b:2", "--tube"], "needs a value"), (["a:1", "b:2", "c:3"], "one FROM"),
                       (["a:1", "b:2"] + [a for i in range(65) for a in ("--tube", "t%d" % i)], "--tube given too often"),
                       (["a:1", "tls://b:2", "--tls-cert", "c.pem"], "--tls-cert and --tls-key go together"),
                       (["a:1", "b:2", "--tls-ca", "ca.pem"], "need a tls:// FROM or TO")]:
        status, _, err = copy_jobs(args, timeout=20)
        check_eq(status, 5, "exit status of --copy-jobs %s" % " ".join(args))
        check(what in err and "Use: beangate --copy-jobs" in err, "stderr of %r: %r" % (args, err))
    status, _, err = copy_jobs(["127.0.0.1:%d" % free_port(), "127.0.0.1:%d" % free_port()], timeout=20)
    check_eq(status, 1, "exit status with nothing listening")
    check("FROM 127.0.0.1:" in err and "cannot connect" in err, "stderr: %r" % err)
    # 64 --tube options (COPY_TUBES_MAX) are not a usage error
    status, _, err = copy_jobs(["127.0.0.1:%d" % free_port(), "127.0.0.1:%d" % free_port()]
                               + [a for i in range(64) for a in ("--tube", "t%d" % i)], timeout=20)
    check_eq(status, 1, "exit status with 64 --tube and nothing listening; stderr %r" % err)


TESTS = [test_copy_beangate_to_beanstalkd, test_move_beangate_to_beanstalkd, test_copy_beanstalkd_to_beangate,
         test_move_beanstalkd_to_beangate, test_json_report_and_tube_filter, test_target_max_job_size_smaller,
         test_target_without_reserve_job, test_target_draining, test_draining_source, test_unix_socket_source,
         test_source_killed_mid_move, test_target_killed_mid_move, test_reply_announcing_too_much,
         test_stats_job_fields_beanstalkd_to_beangate, test_stats_job_fields_beangate_to_beanstalkd,
         test_tube_pauses_copy_beanstalkd_to_beangate, test_tube_pauses_move_beangate_to_beanstalkd,
         test_tls_both_ways, test_tls_refusals, test_target_without_manage_scope,
         test_target_lost_before_bury_cleaned_up, test_target_lost_before_bury_not_cleaned_up, test_target_closes_connection,
         test_tls_garbage_no_certificate_hint, test_usage_errors]


def after(_error):
    problems = []
    for proc in SERVERS:
        proc.kill()
        report = sanitizer_report(proc.stderr())
        if report:
            problems.append("sanitizer report of a server: %s" % report)
    SERVERS.clear()
    return problems


def main(argv):
    global BINARY, WORKDIR
    args = parse_args(arg_parser(__doc__), argv)
    BINARY = args.binary
    with tempfile.TemporaryDirectory(prefix="beangate-copy-") as d:
        WORKDIR = d
        return run("copy_jobs", TESTS, args, namespace=globals(), after=after, all_skipped=77)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
