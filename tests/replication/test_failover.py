"""High availability through NATS JetStream (--replicate): three nats-server
nodes in a JetStream cluster and two beangate nodes on loopback.

    python3 tests/replication/test_failover.py build/beangate [-k NAME]

- failover: beanstalk and HTTP clients put and delete (-f 0: a reply means
  a quorum of the stream has the change) through HAProxy running the
  shipped contrib/haproxy/beangate-ha.cfg; the primary is SIGKILLed 8
  times and started again as a standby, so the roles alternate. After
  each failover: every acknowledged put is on the new primary with its
  body, no acknowledged delete is back, and the failover as the clients
  see it (from the kill to the first put sent after it and acknowledged
  through HAProxy) took less than 3 s; the times are printed. Before each
  kill the NATS cluster is whole (every replica current).
- nats_node_loss: NATS nodes killed in 4 rounds (the stream's leader, the
  lease bucket's leader, ...) under beanstalk and HTTP load: no node
  deposes itself, the service resumes, nothing acknowledged is lost or
  back. NATS's election time and the clients' pause are printed; the
  cluster is whole again before each round.
- lease_answers_late (defect 10): NATS answers to the primary delayed
  (tests/lib/faultproxy.py) past the lease requests' wait: the primary
  recognises its own renewal and serves on.
- cut_off_from_nats: the primary's links to NATS dropped while its clients
  reach it: nothing acknowledged, it steps down (75), the standby serves.
- fenced_primary_steps_down, fenced_idle_primary_steps_down (defect 11):
  a fenced old primary (a put waiting, or idle) that finds the lease
  expired exits 75 instead of taking it again.
- takeover_gives_up (defect 11): a takeover that cannot read the stream
  gives the lease back and exits 75.
- fencing: a primary frozen (SIGSTOP) past its lease comes back after the
  standby took over: the put it was sent is never acknowledged, it exits
  with status 75, and the new primary never sees that put.
- fencing_http: the same over HTTP (defect 3: expected to fail until the
  gateway's held responses follow the reply rule, the reply-rule branch).
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
- fault_proxy: the harness's fault proxy delays, cuts and heals.
- cluster_start_survives_a_taken_port: the harness starts the NATS
  cluster again on fresh ports when a node cannot bind one of its own.
- kubernetes_manifests: contrib/kubernetes/ha/ parses, and wires the pair's
  Service and readiness probe to /readyz.

Needs nats-server (Debian: nats-server) and a beangate built with libnats;
without either the suite is skipped (exit 77).
"""

import http.client
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
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, HERE)
from testlib import (LineSocket, Skip, arg_parser, check, clean_env, free_port, parse_args, run,  # noqa: E402
                     sanitizer_report, wait_until)
from natscluster import nats_server_binary, start_cluster  # noqa: E402
from faultproxy import FaultProxy  # noqa: E402

ARGS = None
LEASE_MS = 1000
RENEW_MS = 200
FAILOVER_LIMIT_S = 3.0
LATE_STANDBY_MESSAGES = 8000
LOST_EXIT = 75
STREAM = "bgtest"
STREAMS = (STREAM, "KV_%s_lease" % STREAM)   # the log and the lease bucket
SETTLE_S = 60.0      # how long the NATS cluster may take to be whole again (not what is tested)
HA_CFG = os.path.join(REPO, "contrib", "haproxy", "beangate-ha.cfg")


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
    """One beangate process of the pair; started again with the same ports.
    proxied: it reaches each NATS server through a FaultProxy of its own
    (self.proxies), which a test can delay or cut."""

    def __init__(self, world, name, extra=(), user=None, proxied=False):
        self.world, self.name, self.extra, self.user = world, name, list(extra), user
        self.port, self.http = free_port(), free_port()
        self.proc, self.starts, self.err_path, self.killed = None, 0, None, False
        self.proxies = [FaultProxy(n["port"]) for n in world.cluster.nodes] if proxied else []

    def nats_urls(self):
        if not self.proxies:
            return self.world.cluster.urls(self.user)
        login = "%s:%s@" % (self.user, self.user) if self.user else ""
        return ",".join("nats://%s127.0.0.1:%d" % (login, p.port) for p in self.proxies)

    def start(self):
        self.killed = False
        self.starts += 1
        self.err_path = os.path.join(self.world.tmp, "%s.%d.log" % (self.name, self.starts))
        err = open(self.err_path, "wb")
        self.proc = subprocess.Popen(
            [ARGS.binary, "-p", str(self.port), "--http-port", str(self.http), "-f", "0",
             "--replicate", self.nats_urls(), "--replicate-stream", STREAM,
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

    def stderr(self, start=None):
        """Its log (of its current start, or of start number `start`)."""
        path = self.err_path if start is None else os.path.join(self.world.tmp, "%s.%d.log" % (self.name, start))
        try:
            with open(path, "rb") as f:
                return f.read().decode(errors="replace")
        except (OSError, TypeError):
            return ""

    def events(self, name):
        """The lines of every start's log with event=name."""
        return [l for k in range(1, self.starts + 1) for l in self.stderr(k).splitlines()
                if "event=%s " % name in l + " "]


class HAProxy:
    """contrib/haproxy/beangate-ha.cfg as shipped, run by Debian's haproxy in
    front of the pair (addresses through its environment variables)."""

    def __init__(self, world):
        self.tcp, self.http = free_port(), free_port()
        a, b = world.nodes
        env = clean_env({"BEANGATE_HA_TCP_BIND": "127.0.0.1:%d" % self.tcp,
                         "BEANGATE_HA_HTTP_BIND": "127.0.0.1:%d" % self.http,
                         "BEANGATE_A_TCP": "127.0.0.1:%d" % a.port, "BEANGATE_A_HTTP": "127.0.0.1:%d" % a.http,
                         "BEANGATE_A_CHECK_PORT": str(a.http),
                         "BEANGATE_B_TCP": "127.0.0.1:%d" % b.port, "BEANGATE_B_HTTP": "127.0.0.1:%d" % b.http,
                         "BEANGATE_B_CHECK_PORT": str(b.http)})
        self.log = open(os.path.join(world.tmp, "haproxy.log"), "wb")
        self.proc = subprocess.Popen([shutil.which("haproxy") or "/usr/sbin/haproxy", "-db", "-f", HA_CFG],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env)
        wait_until(lambda: self.proc.poll() is not None or _port_open(self.tcp), "haproxy to listen", timeout=15)
        check(self.proc.poll() is None, "haproxy exited with %s" % self.proc.poll())

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.log.close()


def _port_open(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


class World:
    """The NATS cluster and two beangate nodes (and HAProxy in front when
    haproxy=True); stopped by close(). proxied: the names of the nodes that
    reach NATS through fault proxies."""

    def __init__(self, extra=(), users=None, node_users=(None, None), proxied=(), haproxy=False):
        self.tmp = tempfile.mkdtemp(prefix="bg-repl-")
        self.stream = STREAM
        self.cluster = start_cluster(self.tmp, 3, users)
        check(self.cluster is not None, "the NATS cluster did not come up in 3 tries")
        self.nodes = [Node(self, "a", extra, node_users[0], "a" in proxied),
                      Node(self, "b", extra, node_users[1], "b" in proxied)]
        self.haproxy = None
        if haproxy:
            if not shutil.which("haproxy") and not os.path.exists("/usr/sbin/haproxy"):
                raise Skip("haproxy is not installed (scripts/install-deps.sh test installs it)")
            self.haproxy = HAProxy(self)
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

    def settle(self, what):
        """Wait (SETTLE_S at most) until the NATS cluster is whole: every node
        healthy, the stream and the lease bucket led, every replica current.
        Returns the seconds it took (reported, not what is tested)."""
        took = self.cluster.wait_settled(STREAMS, timeout=SETTLE_S)
        check(took is not None, "the NATS cluster was not whole again within %.0f s %s" % (SETTLE_S, what))
        return took

    def close(self):
        problems = []
        if self.haproxy:
            self.haproxy.stop()
        for n in self.nodes:
            n.kill()
            for p in n.proxies:
                p.close()
            for start in range(1, n.starts + 1):
                report = sanitizer_report(n.stderr(start))
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


class HttpClient:
    """One keep-alive HTTP connection: put and delete. Raises OSError (and
    http.client's errors, which are OSError or HTTPException) when the
    connection fails."""

    def __init__(self, port, timeout=5):
        self.c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)

    def request(self, method, path, body=None):
        self.c.request(method, path, body=body)
        r = self.c.getresponse()
        return r.status, r.read()

    def close(self):
        self.c.close()


class Load:
    """Threads that put and delete (beanstalk over TCP: `tcp` threads; the
    HTTP gateway: `http` threads) against whichever node is primary, or
    through HAProxy (via: the World's HAProxy), and remember what was
    acknowledged: (sent, acknowledged, kind, node) for every put, the node
    being "haproxy" when it went through it."""

    def __init__(self, world, tcp=3, http=0, via=None):
        self.world, self.via = world, via
        self.lock = threading.Lock()
        self.acked = {}           # id -> body: acknowledged puts
        self.deleted = set()      # acknowledged deletes
        self.unknown = set()      # deletes sent whose outcome is unknown
        self.acks = []            # (sent, acknowledged, kind, node name) of acknowledged puts
        self.errors = []
        self.stop = threading.Event()
        self.paused = threading.Event()
        kinds = ["tcp"] * tcp + ["http"] * http
        self.idle = [threading.Event() for _ in kinds]
        self.threads = [threading.Thread(target=self.work, args=(t, k), daemon=True) for t, k in enumerate(kinds)]

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

    def _connect(self, kind):
        """(client, node name) or (None, None)."""
        if self.via:
            port = self.via.tcp if kind == "tcp" else self.via.http
            try:
                return (Conn(port, timeout=5) if kind == "tcp" else HttpClient(port)), "haproxy"
            except OSError:
                return None, None
        alive = sorted(self.world.nodes, key=lambda x: not x.alive())
        for cand in alive:
            try:
                if kind == "tcp":
                    return Conn(cand.port, timeout=5), cand.name
                if cand.primary():
                    return HttpClient(cand.http), cand.name
            except OSError:
                pass
        return None, None

    def _put(self, kind, conn, body):
        """The id of an acknowledged put; None when refused before it was
        applied (a standby's or HAProxy's 503); raises OSError when the
        outcome is unknown."""
        if kind == "tcp":
            reply = conn.cmd(b"put 0 0 120 %d" % len(body), body)
            if reply.startswith(b"INSERTED "):
                return int(reply.split()[1])
            self.errors.append("put answered %r" % reply)
            return None
        try:
            status, text = conn.request("POST", "/tubes/default/jobs", body)
        except http.client.HTTPException as e:
            raise OSError(str(e))
        if status == 201:
            return int(json.loads(text)["id"])
        if status not in (502, 503, 504):
            self.errors.append("HTTP put answered %d %r" % (status, text[:200]))
        raise OSError("HTTP %d" % status)  # refused, or the node went away: connect again

    def _delete(self, kind, conn, jid):
        """True when acknowledged; raises OSError when the outcome is unknown."""
        if kind == "tcp":
            reply = conn.cmd(b"delete %d" % jid)
            if reply == b"DELETED":
                return True
            self.errors.append("delete %d of an acknowledged put: %r" % (jid, reply))
            return False
        try:
            status, text = conn.request("DELETE", "/jobs/%d" % jid)
        except http.client.HTTPException as e:
            raise OSError(str(e))
        if status in (200, 204):
            return True
        if status in (502, 503, 504):
            raise OSError("HTTP %d" % status)  # refused, or the node went away: outcome unknown
        self.errors.append("HTTP delete %d of an acknowledged put: %d %r" % (jid, status, text[:200]))
        return False

    def work(self, t, kind):
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
                conn, node = self._connect(kind)
                if conn is None:
                    time.sleep(0.01)
                    continue
            try:
                if mine and n % 3 == 2:
                    victim = mine[0]
                    try:
                        done = self._delete(kind, conn, victim)
                    except (OSError, ConnectionError):
                        mine.pop(0)
                        with self.lock:
                            self.unknown.add(victim)
                        raise
                    mine.pop(0)
                    if done:
                        with self.lock:
                            self.deleted.add(victim)
                else:
                    body = b"%s%d-%d-%s" % (kind.encode(), t, n, os.urandom(6).hex().encode())
                    sent = time.monotonic()
                    jid = self._put(kind, conn, body)
                    if jid is not None:
                        with self.lock:
                            if jid in self.acked:
                                self.errors.append("id %d acknowledged twice (%r, then %r over %s)"
                                                   % (jid, self.acked[jid], body, kind))
                            self.acked[jid] = body
                            self.acks.append((sent, time.monotonic(), kind, node))
                        mine.append(jid)
                n += 1
            except (OSError, ConnectionError):
                conn.close()
                conn = None
                time.sleep(0.01)

    def first_ack_after(self, t0, kind=None, name=None):
        """When the first put sent after t0 (of that kind, by that node) was
        acknowledged, or None."""
        with self.lock:
            found = [acked for sent, acked, k, who in self.acks
                     if sent > t0 and (kind is None or k == kind) and (name is None or who == name)]
        return min(found) if found else None

    def acks_since(self, t0):
        with self.lock:
            return sum(1 for sent, _, _, _ in self.acks if sent > t0)

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
    """The primary SIGKILLed in rounds, clients (beanstalk and HTTP) going
    through the shipped HAProxy file: every failover under 3 s as they see
    it, and nothing acknowledged lost or back."""
    global WORLD
    WORLD = world = World(haproxy=True)
    world.start_pair()
    load = Load(world, tcp=3, http=1, via=world.haproxy)
    load.start()
    wait_until(lambda: load.acks_since(0) > 200, "the first acknowledged puts", timeout=20)
    times = {"tcp": [], "http": []}
    for round_no in range(1, 9):
        old = wait_until(world.primary, "one primary", timeout=20)
        new = next(n for n in world.nodes if n is not old)
        wait_until(lambda: world.revive() or new.standby(), "%s to be a standby" % new.name, timeout=30)
        world.settle("before round %d" % round_no)
        before = load.acks_since(0)
        wait_until(lambda: load.acks_since(0) > before + 20, "puts on %s before the kill" % old.name, timeout=20)
        t0 = time.monotonic()
        old.kill()
        dead = time.monotonic()  # a put sent from now on can only be acknowledged by the new primary
        took = {}
        for kind in ("tcp", "http"):
            when = wait_until(lambda: load.first_ack_after(dead, kind), "a %s put acknowledged through HAProxy "
                              "after %s was killed" % (kind, old.name), timeout=30)
            took[kind] = when - t0
            times[kind].append(took[kind])
        load.pause()
        puts, dels = load.verify(new)
        load.resume()
        print("  failover %d: %s -> %s, seen through HAProxy in %.2f s (beanstalk) and %.2f s (HTTP); "
              "%d acknowledged puts present, %d acknowledged deletes absent"
              % (round_no, old.name, new.name, took["tcp"], took["http"], puts, dels), flush=True)
        old.start()  # back as a standby
        wait_until(lambda: world.revive() or old.standby(), "%s to come back as a standby" % old.name,
                   timeout=30)
    load.finish()
    final = wait_until(world.primary, "one primary", timeout=20)
    puts, dels = load.verify(final)
    for kind, label in (("tcp", "beanstalk"), ("http", "HTTP")):
        t = times[kind]
        print("  failover times through HAProxy, %s (s): %s; max %.2f, median %.2f" % (
            label, " ".join("%.2f" % x for x in t), max(t), sorted(t)[len(t) // 2]), flush=True)
    print("  %d puts and %d deletes acknowledged in all" % (len(load.acked), len(load.deleted)), flush=True)
    slow = [t for kind in times for t in times[kind] if t >= FAILOVER_LIMIT_S]
    check(not slow, "failovers slower than %.0f s through HAProxy: %s" % (FAILOVER_LIMIT_S, slow))


def _self_depositions(world):
    """Lines where a node said it lost the lease to itself (defect 10)."""
    return [l for n in world.nodes for l in n.events("replication_lost")
            if re.search(r"held by %s[ )\"]" % n.name, l) or re.search(r"held by %s$" % n.name, l)]


def test_nats_node_loss():
    """NATS nodes killed in rounds (the stream's leader, then the lease
    bucket's, ...) while beanstalk and HTTP clients put and delete: the
    service resumes after each, no node deposes itself, and nothing
    acknowledged is lost or back. Before each kill the cluster is whole
    again (every replica current); how long NATS took to elect a leader and
    how long the clients waited are printed, not what is tested (the bound
    is an outage: 60 s)."""
    global WORLD
    WORLD = world = World()
    world.start_pair()
    load = Load(world, tcp=2, http=1)
    load.start()
    wait_until(lambda: load.acks_since(0) > 100, "the first acknowledged puts", timeout=20)
    failovers = 0
    for round_no in range(1, 5):
        primary = wait_until(world.primary, "one primary", timeout=30)
        settle = world.settle("before NATS round %d" % round_no)
        which = STREAMS[(round_no - 1) % 2]
        victim = world.cluster.leader(which)
        check(victim is not None, "%s has a leader" % which)
        before = load.acks_since(0)
        wait_until(lambda: load.acks_since(0) > before + 20, "puts before NATS round %d" % round_no, timeout=30)
        t0 = time.monotonic()
        world.cluster.kill(victim)
        leader = wait_until(lambda: world.cluster.leader(which), "a new leader of %s" % which, timeout=SETTLE_S,
                            ok=lambda i: i is not None)
        elected = time.monotonic() - t0
        resumed = wait_until(lambda: world.revive() or load.first_ack_after(t0), "puts acknowledged again after "
                             "NATS node %s was killed" % world.cluster.nodes[victim]["name"], timeout=60) - t0
        now_primary = wait_until(world.primary, "one primary", timeout=30)
        failovers += now_primary is not primary
        load.pause()
        puts, dels = load.verify(now_primary)
        load.resume()
        print("  NATS round %d: killed %s (leader of %s; the cluster had settled in %.1f s); %s elected %.2f s "
              "later; puts acknowledged again %.2f s after the kill; primary %s%s; %d puts present, %d deletes "
              "absent" % (round_no, world.cluster.nodes[victim]["name"], which, settle,
                          world.cluster.nodes[leader]["name"], elected, resumed, now_primary.name,
                          " (a failover)" if now_primary is not primary else "", puts, dels), flush=True)
        check(not _self_depositions(world), "a node deposed itself: %s" % _self_depositions(world))
        world.cluster.start(victim)
    world.settle("after the last NATS round")
    load.finish()
    final = wait_until(world.primary, "one primary", timeout=30)
    puts, dels = load.verify(final)
    print("  %d puts and %d deletes acknowledged in all; %d failovers in 4 NATS rounds"
          % (len(load.acked), len(load.deleted), failovers), flush=True)
    check(not _self_depositions(world), "a node deposed itself: %s" % _self_depositions(world))


def _put_until(node, stop, acked, errors):
    """Put on node one at a time until stop is set; acknowledged ids go to
    acked ({id: body}), wrong answers to errors. A broken connection ends it."""
    try:
        conn = Conn(node.port, timeout=30)
        k = 0
        while not stop.is_set():
            body = b"late-answer-%d" % k
            reply = conn.cmd(b"put 0 0 120 %d" % len(body), body)
            if not reply.startswith(b"INSERTED "):
                errors.append(reply)
                return
            acked[int(reply.split()[1])] = body
            k += 1
    except (OSError, ConnectionError):
        pass


def test_lease_answers_late():
    """Defect 10: the answers of NATS to the primary come late (a fault proxy
    holds them 350 ms, longer than the lease's requests wait), for about half
    a lease time, again and again. A renewal is then applied but its answer
    lost; the next one finds the key with this node's name at the next
    revision. The primary recognises its own lease and serves on: it never
    exits (before the fix it exited 75, "the lease is held by a"), the
    standby stays a standby, and every put acknowledged meanwhile is on the
    standby when it takes over at the end."""
    global WORLD
    WORLD = world = World(proxied=("a",))
    world.start_pair()
    a, b = world.nodes
    stop, acked, errors = threading.Event(), {}, []
    putter = threading.Thread(target=_put_until, args=(a, stop, acked, errors), daemon=True)
    putter.start()
    episodes = 0
    try:
        while episodes < 12 and len(a.events("replication_lease_recognised")) < 3:
            episodes += 1
            for p in a.proxies:
                p.delay(0.35)
            time.sleep(0.5)  # the fault's length (half a lease time), not a wait for something
            for p in a.proxies:
                p.delay(0)
            wait_until(lambda: not a.alive() or _lease_age_ms(a) < 2 * RENEW_MS,
                       "a to renew its lease after the late answers", timeout=20)
            check(a.alive(), "a exited (%s) after late NATS answers: %s" % (
                a.proc.poll(), a.events("replication_lost")))
    finally:
        stop.set()
        putter.join(40)
    recognised = a.events("replication_lease_recognised")
    check(not a.events("replication_lost"), "a lost leadership: %s" % a.events("replication_lost"))
    check(a.primary() and b.standby(), "a primary and b standby after the late answers")
    check(recognised, "in %d episodes of late answers no renewal was applied with its answer lost "
          "(the fault was not reproduced)" % episodes)
    check(not errors, "puts answered %s" % errors[:3])
    a.kill()
    wait_until(b.primary, "b to take over at the end", timeout=30)
    found = Conn(b.port).peek_many(sorted(acked))
    lost = [i for i, body in acked.items() if found.get(i) != body]
    check(not lost, "%d puts acknowledged during the late answers are missing on b, e.g. %s" % (len(lost), lost[:5]))
    print("  %d episodes of answers 350 ms late: a recognised its own renewal %d times and served on; %d puts "
          "acknowledged meanwhile, all on b after a was killed" % (episodes, len(recognised), len(acked)), flush=True)


def _lease_age_ms(node):
    status, body = http_get(node.http, "/metrics")
    m = re.search(rb"^beangate_replication_lease_age_ms (-?\d+)", body or b"", re.M)
    return int(m.group(1)) if status == 200 and m else 1 << 30


def test_cut_off_from_nats():
    """A primary cut off from NATS (every link through its fault proxies
    drops everything) while its clients still reach it: the put it is sent
    is never acknowledged, it steps down (exit 75) soon after its lease
    went unconfirmed (before the fix it served on, unable to acknowledge
    anything, for as long as the cut lasted), and the standby takes over
    without the put. Healed, the old primary comes back as a standby."""
    global WORLD
    WORLD = world = World(proxied=("a",))
    world.start_pair()
    a, b = world.nodes
    conn = Conn(a.port, timeout=30)
    check(conn.cmd(b"put 0 0 60 4", b"keep").startswith(b"INSERTED"), "a put before the cut")
    t0 = time.monotonic()
    for p in a.proxies:
        p.cut()
    conn.s.sendall(b"put 0 0 60 3\r\ncut\r\n")
    seen = {}

    def both():
        for what, done in (("stepped", lambda: a.events("replication_lost") or not a.alive()),
                           ("served", b.primary)):
            if what not in seen and done():
                seen[what] = time.monotonic() - t0
        return len(seen) == 2

    wait_until(both, "a to step down and b to take over after a was cut off from NATS", timeout=20)
    code = wait_until(lambda: a.proc.poll(), "a to exit", timeout=20, ok=lambda c: c is not None)
    check(code == LOST_EXIT, "a exited with %s, want %d" % (code, LOST_EXIT))
    try:
        reply = conn.line()
    except (OSError, ConnectionError):
        reply = None
    check(reply is None, "a answered %r to a put it could not replicate" % reply)
    stepped, took = seen["stepped"], seen["served"]
    cb = Conn(b.port)
    found = cb.peek_many(range(1, 4))
    check(found.get(1) == b"keep" and b"cut" not in found.values(),
          "b holds %r: want the put before the cut, not the one after" % found)
    why = a.events("replication_lost")
    for p in a.proxies:
        p.heal()
    world.revive()
    wait_until(a.standby, "a to come back as a standby once healed", timeout=30)
    print("  a cut off from NATS: stepped down %.2f s later (%s); b served %.2f s after the cut" % (
        stepped, why[0].split("why=")[-1] if why else "?", took), flush=True)


def _fenced_primary_steps_down(pending):
    """A primary frozen (SIGSTOP) past its lease; the standby takes over,
    acknowledges a put, and dies; its lease expires. The old primary is
    resumed, with a put waiting for it (pending) or idle: it must step down
    (exit 75), never take the lease again and serve. Started again, the
    other node takes over with every acknowledged job."""
    global WORLD
    WORLD = world = World()
    world.start_pair()
    a, b = world.nodes
    conn = Conn(a.port, timeout=30)
    check(conn.cmd(b"put 0 0 60 4", b"keep").startswith(b"INSERTED"), "a put on the primary")
    a.proc.send_signal(signal.SIGSTOP)
    try:
        if pending:
            conn.s.sendall(b"put 0 0 60 5\r\nstale\r\n")
        wait_until(b.primary, "b to take over from the frozen a", timeout=20)
        check(Conn(b.port).cmd(b"put 0 0 60 3", b"new").startswith(b"INSERTED"), "a put on b")
        b.kill()
        wait_until(lambda: (world.cluster.stream_state(STREAMS[1]) or {}).get("messages", 1) == 0,
                   "b's lease to expire", timeout=20)
    finally:
        a.proc.send_signal(signal.SIGCONT)
    if pending:
        try:
            reply = conn.line()
        except (OSError, ConnectionError):
            reply = None
        check(reply is None, "the fenced a answered %r to a put it could not replicate" % reply)
    code = wait_until(lambda: a.proc.poll(), "the fenced a to step down", timeout=20, ok=lambda c: c is not None)
    check(code == LOST_EXIT, "the fenced a exited with %s, want %d" % (code, LOST_EXIT))
    b.start()
    t0 = time.monotonic()
    wait_until(b.primary, "b, started again, to take over", timeout=20)
    found = Conn(b.port).peek_many(range(1, 5))
    bodies = sorted(v for v in found.values() if v)
    check(bodies == [b"keep", b"new"], "b holds %r, want keep and new" % bodies)
    print("  the fenced a (%s) exited %d (%s); b started again served %.2f s later with keep and new" % (
        "a put waiting" if pending else "idle", code, a.events("replication_lost")[0].split("why=")[-1],
        time.monotonic() - t0), flush=True)


def test_fenced_primary_steps_down():
    """Defect 11: a fenced old primary with a put waiting finds its append
    refused and the lease free: it exits 75 (before the fix it took the
    expired lease again and sat at 503 LOG_UNAVAILABLE renewing it for good,
    and the other node never took over)."""
    _fenced_primary_steps_down(pending=True)


def test_fenced_idle_primary_steps_down():
    """Defect 11: a fenced old primary with nothing to append finds the
    lease expired and another node's messages at the stream's end: it exits
    75 (before the fix it took the lease again and served its stale state,
    without the other node's put, until its next append)."""
    _fenced_primary_steps_down(pending=False)


def test_takeover_gives_up():
    """Defect 11: a takeover that cannot finish (here the standby's NATS user
    sees the stream's state but may not read its messages, so it never
    reaches the stream's end) gives
    the lease back and steps down (exit 75) once it made no progress for
    ten lease times (at least 10 s); before the fix it held the lease for
    ever and nobody served. The other node, started again, then takes over
    (the lease was given back by a delete conditional on b's revision, or,
    when b's last renewal's answer was lost, expires; the time is printed)."""
    global WORLD
    WORLD = world = World(users={"full": True, "noread": "no_stream_read"}, node_users=("full", "noread"))
    world.start_pair()
    a, b = world.nodes
    check(Conn(a.port).cmd(b"put 0 0 60 4", b"keep").startswith(b"INSERTED"), "a put on the primary")
    t0 = time.monotonic()
    a.kill()
    wait_until(lambda: b"taking over" in b.readyz()[1], "b to take the lease", timeout=20)
    code = wait_until(lambda: b.proc.poll(), "the stalled takeover to give up", timeout=40,
                      ok=lambda c: c is not None)
    gave_up = time.monotonic() - t0
    check(code == LOST_EXIT, "b exited with %s, want %d" % (code, LOST_EXIT))
    why = b.events("replication_lost")
    check(why and "no progress" in why[0], "b's replication_lost: %s" % why)
    t1 = time.monotonic()
    a.start()
    wait_until(a.primary, "a to take the lease b gave back", timeout=30)
    took = time.monotonic() - t1
    back = b.events("replication_lease_given_back")
    print("  b's takeover gave up %.1f s after a was killed (%s; %s); a, started again, served %.2f s later"
          % (gave_up, why[0].split("why=")[-1], back[0].split("event=")[-1] if back else "not given back",
             took), flush=True)


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


def test_fencing_http():
    """The HTTP half of fencing (issue 21, defect 3): a put sent to the HTTP
    gateway of a primary frozen (SIGSTOP) past its lease is never answered
    201 once it resumes (its batch is fenced), and the new primary does not
    have it. EXPECTED TO FAIL until the reply-rule branch's gateway fix
    (held replies never released at shutdown or after lost leadership) is
    merged; it passes after the merge."""
    global WORLD
    WORLD = world = World()
    world.start_pair()
    a, b = world.nodes
    check(HttpClient(a.http).request("POST", "/tubes/default/jobs", b"keep")[0] == 201, "an HTTP put on a")
    s = socket.create_connection(("127.0.0.1", a.http), timeout=30)
    a.proc.send_signal(signal.SIGSTOP)
    try:
        s.sendall(b"POST /tubes/default/jobs HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nstale")
        wait_until(b.primary, "b to take over from the frozen a", timeout=20)
        check(HttpClient(b.http).request("POST", "/tubes/default/jobs", b"new")[0] == 201, "an HTTP put on b")
    finally:
        a.proc.send_signal(signal.SIGCONT)
    answer = b""
    try:
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            answer += chunk
    except OSError:
        pass
    s.close()
    status = answer.split(b"\r\n", 1)[0]
    code = a.proc.wait(timeout=15)
    check(code == LOST_EXIT, "the fenced primary exited with %s, want %d" % (code, LOST_EXIT))
    found = Conn(b.port).peek_many(range(1, 5))
    check(b"stale" not in found.values(), "the stale HTTP put is on the new primary")
    check(b" 201 " not in status + b" ", "the fenced primary answered %r to an HTTP put it could not replicate "
          "(defect 3; fixed by the reply-rule branch)" % status)
    print("  the fenced primary answered the HTTP put with %r and exited %d" % (status or b"nothing", code),
          flush=True)


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
    st = wait_until(lambda: world.cluster.stream_state(world.stream), "the stream to hold every put", timeout=30,
                    ok=lambda st: st and st["messages"] >= LATE_STANDBY_MESSAGES)
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


def test_fault_proxy():
    """The harness: tests/lib/faultproxy.py passes bytes both ways, holds the
    server's answers for the delay set (in order), drops everything while
    cut (a connection made meanwhile carries nothing), and passes again on
    new connections once healed."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    stop = threading.Event()

    def echo():
        while not stop.is_set():
            try:
                c, _ = server.accept()
            except OSError:
                return

            def serve(c=c):
                try:
                    while True:
                        data = c.recv(4096)
                        if not data:
                            break
                        c.sendall(data)
                except OSError:
                    pass
                c.close()
            threading.Thread(target=serve, daemon=True).start()

    threading.Thread(target=echo, daemon=True).start()
    proxy = FaultProxy(server.getsockname()[1])
    try:
        def round_trip(c, data, timeout=5.0):
            c.settimeout(timeout)
            t0 = time.monotonic()
            c.sendall(data)
            got = b""
            try:
                while len(got) < len(data):
                    chunk = c.recv(4096)
                    if not chunk:
                        break
                    got += chunk
            except socket.timeout:
                pass
            return got, time.monotonic() - t0

        c = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        got, took = round_trip(c, b"hello")
        check(got == b"hello", "through the proxy: %r" % got)
        proxy.delay(0.3)
        got, took = round_trip(c, b"late")
        check(got == b"late" and took >= 0.29, "a delayed answer came after %.3f s: %r" % (took, got))
        proxy.delay(0)
        proxy.cut()
        got, _ = round_trip(c, b"cut", timeout=0.5)
        check(got == b"", "an answer passed the cut: %r" % got)
        during = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        got, _ = round_trip(during, b"new", timeout=0.5)
        check(got == b"", "a connection made during the cut carried %r" % got)
        proxy.heal()
        after_heal = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        got, _ = round_trip(after_heal, b"again")
        check(got == b"again", "after heal: %r" % got)
        for sock in (c, during, after_heal):
            sock.close()
    finally:
        stop.set()
        proxy.close()
        server.close()


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
    # TLS and scopes (issue 23): the probes speak HTTPS, and every file the
    # arguments name is under a mounted Secret
    for probe in ("readinessProbe", "livenessProbe"):
        check(container[probe]["httpGet"].get("scheme") == "HTTPS", "%s over HTTPS" % probe)
    args = container["args"]
    check("--http-tls" in args, "the gateway serves HTTPS")
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    secrets = {v["name"]: v["secret"]["secretName"] for v in pair["spec"]["template"]["spec"]["volumes"]
               if "secret" in v}
    for flag in ("--tls-cert", "--tls-key", "--http-token-file"):
        path = args[args.index(flag) + 1]
        check(any(path.startswith(mounts[n] + "/") for n in secrets), "%s %s is in a mounted Secret" % (flag, path))
    access = docs[("Secret", "beangate-access")]["stringData"]["access"]
    check(any(len(line.split()) > 1 for line in access.splitlines()), "the access file shows a scoped token")


TESTS = [test_standby_refuses, test_fencing, test_fencing_http, test_stream_bounded, test_sigterm_hands_over,
         test_takeover_without_consumer, test_late_standby_without_consumer, test_failover, test_nats_node_loss,
         test_lease_answers_late, test_cut_off_from_nats, test_fenced_primary_steps_down,
         test_fenced_idle_primary_steps_down, test_takeover_gives_up, test_fault_proxy, test_kubernetes_manifests,
         test_cluster_start_survives_a_taken_port]

if __name__ == "__main__":
    ARGS = parse_args(arg_parser(__doc__), sys.argv)
    sys.exit(run("replication", TESTS, ARGS, namespace=globals(), setup=setup, after=after, all_skipped=77))
