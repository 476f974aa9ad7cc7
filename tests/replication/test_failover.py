"""High availability through NATS JetStream (--replicate): three nats-server
nodes in a JetStream cluster and two beangate nodes on loopback.

    python3 tests/replication/test_failover.py build/beangate [-k NAME]

- failover: puts and deletes under load (-f 0: a reply means a quorum of
  the stream has the change); the primary is SIGKILLed 10 times and started
  again as a standby, so the roles alternate. After each failover: every
  acknowledged put is on the new primary with its body, no acknowledged
  delete is back, and the failover (from the kill to the first put the new
  primary acknowledges) took less than 3 s; the times are printed. One NATS
  node is killed during the run (and started again later) and puts go on
  being acknowledged.
- fencing: a primary frozen (SIGSTOP) past its lease comes back after the
  standby took over: the put it was sent is never acknowledged, it exits
  with status 75, and the new primary never sees that put.
- stream_bounded: release churn on a small live set: the stream is
  snapshotted and purged, so it stays a small multiple of the live data.
- standby_refuses: a standby answers /readyz and the API with 503 STANDBY,
  and does not listen on the beanstalk port.
- sigterm_hands_over: SIGTERM on the primary gives the lease up; the
  standby serves at once, not after the lease time.
- takeover_without_consumer: a standby whose consumer is never created (as
  when nats-server 2.9.10 places it on a server that is down) keeps up
  with the purged stream by sequence while standby, takes over in time
  and with every job, and logs the real error of each subscribe it tries.
- late_standby_without_consumer: such a standby started beside 8,000
  messages and made primary at once reads them by sequence (many requests
  in flight) within the failover limit, with every job.
- cluster_start_survives_a_taken_port: the harness starts the NATS
  cluster again on fresh ports when a node cannot bind one of its own.
- kubernetes_manifests: contrib/kubernetes/ha/ parses, and wires the pair's
  Service and readiness probe to /readyz.

Needs nats-server (Debian: nats-server) and a beangate built with libnats;
without either the suite is skipped (exit 77).
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, HERE)
from testlib import (LineSocket, Skip, arg_parser, check, clean_env, free_port, parse_args, run,  # noqa: E402
                     sanitizer_report, wait_until)
from natscluster import nats_server_binary, start_cluster  # noqa: E402

ARGS = None
LEASE_MS = 1000
RENEW_MS = 200
FAILOVER_LIMIT_S = 3.0
LATE_STANDBY_MESSAGES = 8000
LOST_EXIT = 75


def http_get(port, path):
    """(status, body) of GET http://127.0.0.1:port/path; (None, error) if it cannot connect."""
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=2) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError as e:
        return None, str(e).encode()


class Node:
    """One beangate process of the pair; started again with the same ports."""

    def __init__(self, world, name, extra=(), user=None):
        self.world, self.name, self.extra, self.user = world, name, list(extra), user
        self.port, self.http = free_port(), free_port()
        self.proc, self.starts, self.err_path, self.killed = None, 0, None, False

    def start(self):
        self.killed = False
        self.starts += 1
        self.err_path = os.path.join(self.world.tmp, "%s.%d.log" % (self.name, self.starts))
        err = open(self.err_path, "wb")
        self.proc = subprocess.Popen(
            [ARGS.binary, "-p", str(self.port), "--http-port", str(self.http), "-f", "0",
             "--replicate", self.world.cluster.urls(self.user), "--replicate-stream", self.world.stream,
             "--replicate-node-id", self.name, "--replicate-lease-ms", str(LEASE_MS),
             "--replicate-renew-ms", str(RENEW_MS)] + self.extra,
            stdout=subprocess.DEVNULL, stderr=err, env=clean_env())
        err.close()

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def readyz(self):
        return http_get(self.http, "/readyz")

    def primary(self):
        return self.alive() and self.readyz()[0] == 200

    def standby(self):
        status, body = self.readyz()
        return self.alive() and status == 503 and b"STANDBY" in body

    def kill(self):
        self.killed = True
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stderr(self):
        try:
            with open(self.err_path, "rb") as f:
                return f.read().decode(errors="replace")
        except (OSError, TypeError):
            return ""


class World:
    """The NATS cluster and two beangate nodes; stopped by close()."""

    def __init__(self, extra=(), users=None, node_users=(None, None)):
        self.tmp = tempfile.mkdtemp(prefix="bg-repl-")
        self.stream = "bgtest"
        self.cluster = start_cluster(self.tmp, 3, users)
        check(self.cluster is not None, "the NATS cluster did not come up in 3 tries")
        self.nodes = [Node(self, "a", extra, node_users[0]), Node(self, "b", extra, node_users[1])]
        self.logs = []

    def start_pair(self):
        a, b = self.nodes
        a.start()
        wait_until(a.primary, "node a to become primary", timeout=30)
        b.start()
        wait_until(b.standby, "node b to be a standby", timeout=30)

    def primary(self):
        self.revive()
        found = [n for n in self.nodes if n.primary()]
        return found[0] if len(found) == 1 else None

    def revive(self, skip=None):
        """Start again a node that stopped by itself because it lost
        leadership (status 75), as a supervisor would; any other exit fails."""
        for n in self.nodes:
            if n is not skip and n.proc is not None and n.proc.poll() is not None and not n.killed:
                check(n.proc.returncode == LOST_EXIT, "%s exited with %s" % (n.name, n.proc.returncode))
                print("  %s stopped by itself (lost leadership); started again" % n.name, flush=True)
                n.start()

    def close(self):
        problems = []
        for n in self.nodes:
            n.kill()
            for start in range(1, n.starts + 1):
                path = os.path.join(self.tmp, "%s.%d.log" % (n.name, start))
                try:
                    text = open(path, "rb").read().decode(errors="replace")
                except OSError:
                    continue
                report = sanitizer_report(text)
                if report:
                    problems.append("%s (start %d): %s" % (n.name, start, report))
        self.cluster.stop_all()
        return problems


WORLD = None


def setup(names):
    if not nats_server_binary():
        raise Skip("nats-server is not installed (scripts/install-deps.sh test installs it)")
    probe = subprocess.run([ARGS.binary, "--replicate", "nats://127.0.0.1:1", "-p", "0", "--no-http"],
                           capture_output=True, timeout=30, env=clean_env())
    if b"replication unavailable" in probe.stderr:
        raise Skip("this beangate was built without libnats")


def after(error):
    global WORLD
    if WORLD is None:
        return []
    problems = WORLD.close()
    if error or problems:
        for n in WORLD.nodes:
            print("---- %s's last log lines:\n%s" % (n.name, "\n".join(n.stderr().splitlines()[-15:])))
        print("---- every node's log (beangate and NATS) is kept in %s" % WORLD.tmp)
    else:
        shutil.rmtree(WORLD.tmp, ignore_errors=True)
    WORLD = None
    return problems


# ---- a small beanstalk client ------------------------------------------------


class Conn(LineSocket):
    def __init__(self, port, timeout=3.0):
        super().__init__(port, timeout, "beanstalk", ConnectionError)

    def cmd(self, text, body=None):
        self.s.sendall(text + b"\r\n" + (body + b"\r\n" if body is not None else b""))
        return self.line()

    def peek_many(self, ids):
        """{id: body or None} for many ids, pipelined."""
        out = {}
        ids = list(ids)
        for k in range(0, len(ids), 2000):
            part = ids[k:k + 2000]
            self.s.sendall(b"".join(b"peek %d\r\n" % i for i in part))
            for i in part:
                line = self.line()
                if line.startswith(b"FOUND "):
                    out[i] = self.body(int(line.split()[2]))
                elif line == b"NOT_FOUND":
                    out[i] = None
                else:
                    raise AssertionError("peek %d: %r" % (i, line))
        return out


class Load:
    """Threads that put and delete against whichever node is primary, and
    remember what was acknowledged."""

    def __init__(self, world, threads=3):
        self.world = world
        self.lock = threading.Lock()
        self.acked = {}           # id -> body: acknowledged puts
        self.deleted = set()      # acknowledged deletes
        self.unknown = set()      # deletes sent whose outcome is unknown
        self.acks = []            # (monotonic time, node name) of acknowledged puts
        self.errors = []
        self.stop = threading.Event()
        self.paused = threading.Event()
        self.idle = [threading.Event() for _ in range(threads)]
        self.threads = [threading.Thread(target=self.work, args=(t,), daemon=True) for t in range(threads)]

    def start(self):
        for t in self.threads:
            t.start()

    def pause(self):
        self.paused.set()
        for e in self.idle:
            e.wait(15)

    def resume(self):
        for e in self.idle:
            e.clear()
        self.paused.clear()

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(15)

    def work(self, t):
        conn, node, n = None, None, 0
        mine = []
        while not self.stop.is_set():
            if self.paused.is_set():
                if conn:
                    conn.close()
                    conn = None
                self.idle[t].set()
                time.sleep(0.01)
                continue
            if conn is None:
                node = next((x for x in self.world.nodes if x.alive()), None)
                for cand in sorted(self.world.nodes, key=lambda x: x is not node):
                    try:
                        conn = Conn(cand.port, timeout=5)
                        node = cand
                        break
                    except OSError:
                        conn = None
                if conn is None:
                    time.sleep(0.01)
                    continue
            try:
                if mine and n % 3 == 2:
                    victim = mine.pop(0)
                    try:
                        reply = conn.cmd(b"delete %d" % victim)
                    except (OSError, ConnectionError):
                        with self.lock:
                            self.unknown.add(victim)
                        raise
                    with self.lock:
                        if reply == b"DELETED":
                            self.deleted.add(victim)
                        else:
                            self.errors.append("delete %d of an acknowledged put: %r" % (victim, reply))
                else:
                    body = b"w%d-%d-%s" % (t, n, os.urandom(6).hex().encode())
                    reply = conn.cmd(b"put 0 0 120 %d" % len(body), body)
                    if reply.startswith(b"INSERTED "):
                        jid = int(reply.split()[1])
                        with self.lock:
                            if jid in self.acked:
                                self.errors.append("id %d acknowledged twice" % jid)
                            self.acked[jid] = body
                            self.acks.append((time.monotonic(), node.name))
                        mine.append(jid)
                    else:
                        self.errors.append("put answered %r" % reply)
                n += 1
            except (OSError, ConnectionError):
                conn = None
                time.sleep(0.01)

    def first_ack_after(self, t0, name):
        with self.lock:
            for when, who in reversed(self.acks):
                if when > t0 and who == name:
                    earliest = when
                    for w2, who2 in reversed(self.acks):
                        if w2 > t0 and who2 == name and w2 < earliest:
                            earliest = w2
                    return earliest
        return None

    def acks_since(self, t0):
        with self.lock:
            return sum(1 for when, _ in self.acks if when > t0)

    def verify(self, node):
        """Every acknowledged put is on node with its body; no acknowledged
        delete is back. Returns (puts checked, deletes checked)."""
        with self.lock:
            live = {i: b for i, b in self.acked.items() if i not in self.deleted and i not in self.unknown}
            gone = set(self.deleted)
            errors = list(self.errors)
        check(not errors, "the load saw wrong answers: %s" % errors[:5])
        conn = wait_until(lambda: _connect(node.port), "a connection to %s" % node.name, timeout=5)
        try:
            found = conn.peek_many(sorted(live) + sorted(gone))
        finally:
            conn.close()
        lost = [i for i, b in live.items() if found.get(i) != b]
        back = [i for i in gone if found.get(i) is not None]
        check(not lost, "%d acknowledged puts are missing or changed on %s, e.g. %s"
              % (len(lost), node.name, lost[:10]))
        check(not back, "%d acknowledged deletes are back on %s, e.g. %s" % (len(back), node.name, back[:10]))
        return len(live), len(gone)


def _connect(port):
    try:
        return Conn(port)
    except OSError:
        return None


# ---- the tests -----------------------------------------------------------------


def test_failover():
    global WORLD
    WORLD = world = World()
    world.start_pair()
    load = Load(world)
    load.start()
    wait_until(lambda: load.acks_since(0) > 200, "the first acknowledged puts", timeout=20)
    times = []
    nats_killed = None
    for round_no in range(1, 11):
        old = wait_until(world.primary, "one primary", timeout=20)
        new = next(n for n in world.nodes if n is not old)
        wait_until(lambda: world.revive() or new.standby(), "%s to be a standby" % new.name, timeout=30)
        time.sleep(0.3)  # a little load on this primary
        t0 = time.monotonic()
        old.kill()
        when = wait_until(lambda: load.first_ack_after(t0, new.name), "a put acknowledged by %s" % new.name,
                          timeout=20)
        took = when - t0
        times.append(took)
        load.pause()
        puts, dels = load.verify(new)
        load.resume()
        print("  failover %2d: %s -> %s in %.2f s; %d acknowledged puts present, %d acknowledged deletes absent"
              % (round_no, old.name, new.name, took, puts, dels), flush=True)
        if round_no == 5:
            # one NATS node goes down; the stream (3 replicas) keeps a quorum
            nats_killed = 1
            t1 = time.monotonic()
            world.cluster.kill(nats_killed)
            before = load.acks_since(t1)
            wait_until(lambda: load.acks_since(t1) > before + 100, "puts acknowledged with a NATS node down",
                       timeout=30)
            print("  NATS node %s killed: 100 more puts acknowledged %.2f s later"
                  % (world.cluster.nodes[nats_killed]["name"], time.monotonic() - t1), flush=True)
        if round_no == 7 and nats_killed is not None:
            world.cluster.start(nats_killed)
            # its replica of the stream catches up before the next kill
            wait_until(lambda: world.cluster.stream_state(world.stream, only=nats_killed),
                       "the restarted NATS node to hold the stream again", timeout=30)
        old.start()  # back as a standby
        wait_until(lambda: world.revive() or old.standby(), "%s to come back as a standby" % old.name,
                   timeout=30)
    load.finish()
    final = wait_until(world.primary, "one primary", timeout=20)
    puts, dels = load.verify(final)
    print("  failover times (s): %s; max %.2f, median %.2f" % (
        " ".join("%.2f" % t for t in times), max(times), sorted(times)[len(times) // 2]), flush=True)
    print("  %d puts and %d deletes acknowledged in all" % (len(load.acked), len(load.deleted)), flush=True)
    slow = [t for t in times if t >= FAILOVER_LIMIT_S]
    check(not slow, "failovers slower than %.0f s: %s" % (FAILOVER_LIMIT_S, slow))


def test_fencing():
    global WORLD
    WORLD = world = World()
    world.start_pair()
    a, b = world.nodes
    conn = Conn(a.port)
    check(conn.cmd(b"put 0 0 60 4", b"keep").startswith(b"INSERTED"), "a put on the primary")
    a.proc.send_signal(signal.SIGSTOP)
    try:
        conn.s.sendall(b"put 0 0 60 5\r\nstale\r\n")  # waits in the socket while a is frozen
        wait_until(b.primary, "b to take over from the frozen a", timeout=20)
        cb = Conn(b.port)
        check(cb.cmd(b"put 0 0 60 3", b"new").startswith(b"INSERTED"), "a put on the new primary")
    finally:
        a.proc.send_signal(signal.SIGCONT)
    conn.s.settimeout(10)
    try:
        reply = conn.line()
    except (OSError, ConnectionError):
        reply = None
    check(reply is None, "the fenced primary answered %r to a put it could not replicate" % reply)
    code = a.proc.wait(timeout=15)
    check(code == LOST_EXIT, "the fenced primary exited with %s, want %d" % (code, LOST_EXIT))
    check("replication_lost" in a.stderr(), "no replication_lost event from the fenced primary")
    stats = cb.cmd(b"stats-tube default")
    size = int(stats.split()[1])
    text = cb.body(size).decode()
    total = int(next(l.split()[1] for l in text.splitlines() if l.startswith("total-jobs:")))
    ready = int(next(l.split()[1] for l in text.splitlines() if l.startswith("current-jobs-ready:")))
    check(ready == 2, "the new primary has %d ready jobs, want 2 (keep, new): the stale put got in?" % ready)
    for jid in range(1, 5):
        reply = cb.cmd(b"peek %d" % jid)
        if reply.startswith(b"FOUND"):
            check(cb.body(int(reply.split()[2])) != b"stale", "the stale put is on the new primary")
    print("  fenced primary exited %d; new primary holds %d jobs (total-jobs %d)" % (code, ready, total))


def test_stream_bounded():
    global WORLD
    WORLD = world = World(extra=["-s", "65536"])
    world.start_pair()
    a = world.nodes[0]
    conn = Conn(a.port)
    body = b"x" * 200
    for _ in range(20):
        check(conn.cmd(b"put 0 0 60 %d" % len(body), body).startswith(b"INSERTED"), "put")
    peak = 0
    for i in range(3000):
        reply = conn.cmd(b"reserve-with-timeout 1")
        check(reply.startswith(b"RESERVED"), "reserve: %r" % reply)
        jid = int(reply.split()[1])
        conn.body(int(reply.split()[2]))
        check(conn.cmd(b"release %d 0 0" % jid) == b"RELEASED", "release")
        if i % 500 == 499:
            st = world.cluster.stream_state(world.stream)
            if st:
                peak = max(peak, st["bytes"])
    st = wait_until(lambda: world.cluster.stream_state(world.stream), "the stream's state", timeout=10)
    live = 20 * (len(body) + 100)
    print("  after 3000 releases of 20 jobs: stream %d messages, %d bytes (peak seen %d), first seq %d, "
          "last seq %d" % (st["messages"], st["bytes"], peak, st["first_seq"], st["last_seq"]))
    check(st["first_seq"] > 1, "the stream was never purged (first seq %d)" % st["first_seq"])
    # the bound: twice the live data plus one segment (-s) before a snapshot,
    # plus the snapshot and what a batch adds meanwhile
    limit = 3 * live + 2 * 65536 + 64 * 1024
    check(peak <= limit and st["bytes"] <= limit, "the stream grew to %d bytes (limit %d)"
          % (max(peak, st["bytes"]), limit))
    # a standby started now reads from the purged stream and has every job
    b = world.nodes[1]
    wait_until(lambda: _applied(b) >= st["last_seq"], "the standby to apply the stream", timeout=20)
    a.kill()
    wait_until(b.primary, "b to take over", timeout=10)
    cb = Conn(b.port)
    reply = cb.cmd(b"stats")
    text = cb.body(int(reply.split()[1])).decode()
    ready = int(next(l.split()[1] for l in text.splitlines() if l.startswith("current-jobs-ready:")))
    check(ready == 20, "the new primary has %d ready jobs, want 20" % ready)


def _applied(node):
    body = node.readyz()[1]
    try:
        return int(body.split(b"up to sequence ")[1].split()[0])
    except (IndexError, ValueError):
        return -1


def test_standby_refuses():
    global WORLD
    WORLD = world = World()
    world.start_pair()
    a, b = world.nodes
    status, body = b.readyz()
    check(status == 503 and b'"code":"STANDBY"' in body and b"standby: applied the stream" in body,
          "standby /readyz: %s %r" % (status, body))
    status, body = http_get(b.http, "/stats")
    check(status == 503 and b"STANDBY" in body, "standby GET /stats: %s %r" % (status, body))
    check(http_get(b.http, "/livez")[0] == 200, "standby /livez")
    status, body = http_get(b.http, "/metrics")
    check(status == 200 and b'beangate_replication_role{role="standby"} 1' in body,
          "standby /metrics has no standby role")
    check(_connect(b.port) is None, "the standby accepts beanstalk connections")
    status, body = http_get(a.http, "/metrics")
    check(b'beangate_replication_role{role="primary"} 1' in body and b"beangate_replication_primary 1" in body,
          "primary /metrics")


def test_sigterm_hands_over():
    """A primary stopped with SIGTERM gives the lease up: the standby takes
    over well before the lease would have expired, with every job."""
    global WORLD
    WORLD = world = World(extra=["--replicate-lease-ms", "5000", "--replicate-renew-ms", "500"])
    world.start_pair()
    a, b = world.nodes
    conn = Conn(a.port)
    for i in range(50):
        check(conn.cmd(b"put 0 0 60 2", b"%02d" % i).startswith(b"INSERTED"), "put")
    conn.close()
    t0 = time.monotonic()
    a.proc.send_signal(signal.SIGTERM)
    code = a.proc.wait(timeout=15)
    check(code == 0, "the primary stopped with status %s" % code)
    wait_until(b.primary, "b to take over", timeout=10)
    took = time.monotonic() - t0
    print("  after SIGTERM of the primary, the standby served %.2f s later (lease 5 s)" % took)
    check(took < 2.5, "the standby waited %.2f s: the lease was not given up" % took)
    found = Conn(b.port).peek_many(range(1, 51))
    check(all(found[i] == b"%02d" % (i - 1) for i in range(1, 51)), "jobs missing after the handover")


def test_takeover_without_consumer():
    """A standby that cannot get a consumer on the stream still takes over in
    time, with every acknowledged change: it reads the stream by sequence.
    nats-server 2.9.10 places a new consumer on any of the stream's servers,
    one that is down too, and never answers then; here the standby's NATS
    user may not create consumers, so no subscription ever succeeds. The
    stream is purged first (release churn, -s 64 KiB): the standby starts
    reading at the snapshot the purge left. Its log says why it could not
    subscribe, with libnats's status, not just "Error"."""
    global WORLD
    WORLD = world = World(extra=["-s", "65536"], users={"full": True, "noconsumer": False},
                          node_users=("full", "noconsumer"))
    world.start_pair()
    a, b = world.nodes
    conn = Conn(a.port)
    bodies = {}
    for i in range(40):
        body = b"job-%02d-%s" % (i, os.urandom(4).hex().encode())
        reply = conn.cmd(b"put 0 0 120 %d" % len(body), body)
        check(reply.startswith(b"INSERTED "), "put: %r" % reply)
        bodies[int(reply.split()[1])] = body
    deleted = sorted(bodies)[:10]
    for jid in deleted:
        check(conn.cmd(b"delete %d" % jid) == b"DELETED", "delete %d" % jid)
    for _ in range(1500):
        reply = conn.cmd(b"reserve-with-timeout 1")
        check(reply.startswith(b"RESERVED"), "reserve: %r" % reply)
        conn.body(int(reply.split()[2]))
        check(conn.cmd(b"release %s 0 0" % reply.split()[1]) == b"RELEASED", "release")
    st = wait_until(lambda: world.cluster.stream_state(world.stream), "the stream's state", timeout=10)
    check(st["first_seq"] > 1, "the stream was not purged (first seq %d)" % st["first_seq"])
    wait_until(lambda: "event=replication_subscribe_retry" in b.stderr(), "b to fail subscribing", timeout=20)
    # without a consumer it keeps up by sequence while standby
    wait_until(lambda: _applied(b) >= st["last_seq"], "b to apply the stream by sequence as a standby", timeout=20)
    t0 = time.monotonic()
    a.kill()
    wait_until(b.primary, "b to take over without a consumer", timeout=10)
    took = time.monotonic() - t0
    found = Conn(b.port).peek_many(sorted(bodies))
    live = {i: body for i, body in bodies.items() if i not in deleted}
    lost = [i for i, body in live.items() if found.get(i) != body]
    back = [i for i in deleted if found.get(i) is not None]
    check(not lost and not back, "after the takeover: missing or changed %s, deletes back %s" % (lost, back))
    retry = next(l for l in b.stderr().splitlines() if "event=replication_subscribe_retry" in l)
    check(" status=" in retry and " js_error=" in retry and "error=Error " not in retry,
          "the subscribe retry does not say what failed: %s" % retry)
    print("  b (no consumer; stream purged up to %d) took over %.2f s after a was killed, %d jobs, %d deletes "
          "absent; it logged: %s" % (st["first_seq"], took, len(live), len(deleted), retry.split("event=")[1]))
    check(took < FAILOVER_LIMIT_S, "the takeover took %.2f s" % took)


def _put_many(port, count):
    """count puts, one at a time (with -f 0 each is its own message in the
    stream); returns {id: body}."""
    conn, bodies = Conn(port), {}
    for i in range(count):
        body = b"late-%05d" % i
        reply = conn.cmd(b"put 0 0 600 %d" % len(body), body)
        check(reply.startswith(b"INSERTED "), "put: %r" % reply)
        bodies[int(reply.split()[1])] = body
    conn.close()
    return bodies


def test_late_standby_without_consumer():
    """A standby started beside a long stream and unable to get a consumer
    (as when nats-server 2.9.10 places it on a server that is down) is
    made primary at once: it reads thousands of messages by sequence within
    the failover limit (many requests in flight, not one per round trip),
    with every job."""
    global WORLD
    WORLD = world = World(users={"full": True, "noconsumer": False}, node_users=("full", "noconsumer"))
    a, b = world.nodes
    a.start()
    wait_until(a.primary, "node a to become primary", timeout=30)
    t_put = time.monotonic()
    bodies = _put_many(a.port, LATE_STANDBY_MESSAGES)
    st = wait_until(lambda: world.cluster.stream_state(world.stream), "the stream's state", timeout=10)
    check(st["messages"] >= LATE_STANDBY_MESSAGES, "the stream holds %d messages" % st["messages"])
    put_s = time.monotonic() - t_put
    b.start()
    wait_until(b.standby, "b to be a standby", timeout=30)
    applied = _applied(b)
    t0 = time.monotonic()
    a.kill()
    wait_until(b.primary, "b to take over", timeout=30)
    took = time.monotonic() - t0
    found = Conn(b.port).peek_many(sorted(bodies))
    lost = [i for i, body in bodies.items() if found.get(i) != body]
    check(not lost, "%d jobs missing or changed after the takeover, e.g. %s" % (len(lost), lost[:10]))
    primary_line = next((l for l in b.stderr().splitlines() if "event=replication_primary" in l), "")
    print("  %d messages in the stream (%d puts in %.1f s); b applied up to %d when a was killed, took over "
          "%.2f s later: %s" % (st["messages"], len(bodies), put_s, applied, took,
                                primary_line.split("event=")[-1]), flush=True)
    check(took < FAILOVER_LIMIT_S, "the takeover took %.2f s (limit %.0f s)" % (took, FAILOVER_LIMIT_S))


def test_cluster_start_survives_a_taken_port():
    """The harness itself: a NATS node whose cluster port another process
    holds exits at once; start_cluster notices (not after its 15 s wait) and
    starts the cluster again on fresh ports, every node healthy."""
    import natscluster
    holder, taken = [], []
    made = natscluster.Cluster.__init__

    def take_a_port(self, workdir, size=3, users=None):
        made(self, workdir, size, users)
        if not holder:
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", self.nodes[2]["cport"]))
            s.listen()
            holder.append(s)
            taken.append(self.nodes[2]["cport"])

    natscluster.Cluster.__init__ = take_a_port
    tmp = tempfile.mkdtemp(prefix="bg-repl-ports-")
    t0 = time.monotonic()
    try:
        cluster = start_cluster(tmp, 3)
    finally:
        natscluster.Cluster.__init__ = made
        for s in holder:
            s.close()
    took = time.monotonic() - t0
    check(cluster is not None, "start_cluster gave up")
    try:
        check(all(cluster.healthy(i) for i in range(3)), "every node healthy after the retry")
        check(taken and taken[0] not in [n["cport"] for n in cluster.nodes],
              "the retry picked fresh ports")
        check(took < 10, "the clash was noticed at once (%.1f s)" % took)
        print("  a node's cluster port taken: the cluster came up on fresh ports %.2f s after the first try"
              % took, flush=True)
    finally:
        cluster.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)


def test_kubernetes_manifests():
    """contrib/kubernetes/ha/ parses as YAML, its Service selects the pair and
    its readiness probe is /readyz (no cluster here to apply it to)."""
    try:
        import yaml
    except ImportError:
        raise Skip("python3-yaml is not installed")
    root = os.path.join(HERE, "..", "..", "contrib", "kubernetes", "ha")
    docs = {}
    for name in ("nats.yaml", "beangate.yaml"):
        with open(os.path.join(root, name)) as f:
            for d in yaml.safe_load_all(f):
                docs[(d["kind"], d["metadata"]["name"])] = d
    nats = docs[("StatefulSet", "beangate-nats")]
    check(nats["spec"]["replicas"] == 3, "the NATS StatefulSet has 3 replicas")
    pair = docs[("StatefulSet", "beangate")]
    check(pair["spec"]["replicas"] == 2, "the beangate StatefulSet has 2 replicas")
    container = pair["spec"]["template"]["spec"]["containers"][0]
    check(container["readinessProbe"]["httpGet"]["path"] == "/readyz", "readiness on /readyz")
    env = {e["name"]: e.get("value") for e in container["env"]}
    check(all("beangate-nats-%d" % i in env["BEANGATE_REPLICATE"] for i in range(3)),
          "BEANGATE_REPLICATE names the three NATS nodes")
    svc = docs[("Service", "beangate")]
    check(svc["spec"]["selector"] == pair["spec"]["template"]["metadata"]["labels"],
          "the Service selects the pair's pods")


TESTS = [test_standby_refuses, test_fencing, test_stream_bounded, test_sigterm_hands_over,
         test_takeover_without_consumer, test_late_standby_without_consumer, test_failover, test_kubernetes_manifests,
         test_cluster_start_survives_a_taken_port]

if __name__ == "__main__":
    ARGS = parse_args(arg_parser(__doc__), sys.argv)
    sys.exit(run("replication", TESTS, ARGS, namespace=globals(), setup=setup, after=after, all_skipped=77))
