"""A NATS JetStream cluster on loopback for the replication tests and
benchmarks: N nats-server processes with free client and cluster ports, a
store directory each under a temporary directory, routes to one another.
Nodes can be killed (SIGKILL) and started again with their store, and
wait_settled tells when the cluster is whole again (every node healthy,
each named stream led, with every replica current). Python 3 standard
library only; needs the nats-server binary (Debian: nats-server).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from testlib import free_port  # noqa: E402

CONF = """server_name: %(name)s
listen: 127.0.0.1:%(port)d
http: 127.0.0.1:%(mport)d
jetstream {
  store_dir: "%(store)s"
  max_memory_store: 268435456
  max_file_store: 2147483648
}
cluster {
  name: beangate-test
  listen: 127.0.0.1:%(cport)d
  routes: [%(routes)s]
  # clients learn no other server's address: one that reaches NATS through
  # a fault proxy (tests/lib/faultproxy.py) reconnects through it only
  no_advertise: true
}
%(auth)s"""

# users and what they may not do: all (True), create consumers (False: the
# JetStream API's consumer requests go unanswered, as when the server chosen
# for a consumer is down), or "no_stream_read": neither that nor ask for a
# message by sequence (a node that sees the stream's state but cannot read
# its messages: its takeover stalls)
USER_CONF = "    {user: %s, password: %s%s}\n"
DENIED = {True: "", False: ", permissions: {publish: {deny: [\"$JS.API.CONSUMER.>\"]}}",
          "no_stream_read": ", permissions: {publish: {deny: [\"$JS.API.CONSUMER.>\", "
                            "\"$JS.API.STREAM.MSG.GET.bgtest\"]}}"}


def nats_server_binary():
    return shutil.which("nats-server") or ("/usr/bin/nats-server" if os.path.exists("/usr/bin/nats-server") else None)


class Cluster:
    """users: None (no authorization), or {name: what it may do (a key of
    DENIED)} (the password is the name); urls(user) then logs in as that
    user."""

    def __init__(self, workdir, size=3, users=None):
        self.workdir = workdir
        self.users = users
        self.binary = nats_server_binary()
        self.nodes = []
        for i in range(size):
            self.nodes.append({"name": "n%d" % (i + 1), "port": free_port(), "cport": free_port(),
                               "mport": free_port(), "proc": None, "log": None})
        auth = ""
        if users:
            auth = "authorization {\n  users: [\n%s  ]\n}\n" % "".join(
                USER_CONF % (name, name, DENIED[may]) for name, may in users.items())
        for n in self.nodes:
            n["store"] = os.path.join(workdir, n["name"])
            os.makedirs(n["store"], exist_ok=True)
            routes = ", ".join("nats-route://127.0.0.1:%d" % m["cport"] for m in self.nodes if m is not n)
            n["conf"] = os.path.join(workdir, n["name"] + ".conf")
            with open(n["conf"], "w") as f:
                f.write(CONF % dict(n, routes=routes, auth=auth))

    def urls(self, user=None):
        login = "%s:%s@" % (user, user) if user else ""
        return ",".join("nats://%s127.0.0.1:%d" % (login, n["port"]) for n in self.nodes)

    def start(self, i):
        n = self.nodes[i]
        n["log"] = open(os.path.join(self.workdir, n["name"] + ".log"), "ab")
        n["proc"] = subprocess.Popen([self.binary, "-c", n["conf"]], stdout=n["log"], stderr=subprocess.STDOUT)

    def start_all(self):
        for i in range(len(self.nodes)):
            self.start(i)

    def kill(self, i):
        n = self.nodes[i]
        if n["proc"] and n["proc"].poll() is None:
            n["proc"].send_signal(signal.SIGKILL)
            n["proc"].wait(timeout=10)
        n["proc"] = None
        if n["log"]:
            n["log"].close()
            n["log"] = None

    def stop_all(self):
        for i in range(len(self.nodes)):
            self.kill(i)

    def stream_detail(self, i, stream):
        """Stream `stream` as node i's monitoring endpoint (/jsz) describes it
        (its "state" and "cluster": leader, replicas), or None."""
        import urllib.request
        n = self.nodes[i]
        if not n["proc"]:
            return None
        try:
            url = "http://127.0.0.1:%d/jsz?accounts=true&streams=true" % n["mport"]
            data = json.loads(urllib.request.urlopen(url, timeout=2).read())
        except (OSError, ValueError):
            return None
        for acc in data.get("account_details") or []:
            for sd in acc.get("stream_detail") or []:
                if sd.get("name") == stream:
                    return sd
        return None

    def stream_state(self, stream, only=None):
        """The stream's state (messages, bytes, first_seq, last_seq) as its
        leader's monitoring endpoint reports it (a follower may be a message
        behind), else as any running node's; or as node `only`'s. None when
        no node reports it."""
        if only is None:
            j = self.leader(stream)
            sd = self.stream_detail(j, stream) if j is not None else None
            if sd and sd.get("state"):
                return sd["state"]
        for i in range(len(self.nodes)):
            if only is not None and i != only:
                continue
            sd = self.stream_detail(i, stream)
            if sd and sd.get("state"):
                return sd["state"]
        return None

    def index(self, name):
        """The index of the node named name ("n2"), or None."""
        return next((i for i, n in enumerate(self.nodes) if n["name"] == name), None)

    def leader(self, stream):
        """The index of the node that leads stream (as that node itself says),
        or None while it has no leader."""
        for i in range(len(self.nodes)):
            sd = self.stream_detail(i, stream)
            j = self.index(((sd or {}).get("cluster") or {}).get("leader"))
            if j is not None:
                lead = self.stream_detail(j, stream)
                if lead and (lead.get("cluster") or {}).get("leader") == self.nodes[j]["name"]:
                    return j
        return None

    def unsettled(self, streams):
        """Why the cluster is not whole, or None when it is: every node runs
        and is healthy, and each stream has a leader whose every replica is
        current (a stream or bucket of 3 replicas then survives the loss of
        any one node)."""
        for i, n in enumerate(self.nodes):
            if not self.healthy(i):
                return "node %s is not healthy" % n["name"]
        for stream in streams:
            j = self.leader(stream)
            if j is None:
                return "stream %s has no leader" % stream
            replicas = (self.stream_detail(j, stream).get("cluster") or {}).get("replicas") or []
            behind = [r.get("name") for r in replicas if not r.get("current")]
            if len(replicas) != len(self.nodes) - 1 or behind:
                return "stream %s (leader %s): replicas %s, not current: %s" % (
                    stream, self.nodes[j]["name"], [r.get("name") for r in replicas], behind)
        return None

    def wait_settled(self, streams, timeout=60.0):
        """Seconds until unsettled(streams) is None (polled), or None after
        timeout, with the reason printed."""
        t0 = time.monotonic()
        why = None
        while time.monotonic() - t0 < timeout:
            why = self.unsettled(streams)
            if why is None:
                return time.monotonic() - t0
            time.sleep(0.1)
        print("  the NATS cluster did not settle in %.0f s: %s" % (timeout, why), flush=True)
        return None

    def healthy(self, i):
        """Whether node i runs and its monitoring endpoint says JetStream is
        current (GET /healthz answers 200 once the node has joined the meta
        group); a node that cannot bind one of its ports exits, and is not."""
        import urllib.error
        import urllib.request
        n = self.nodes[i]
        if not n["proc"] or n["proc"].poll() is not None:
            return False
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/healthz" % n["mport"], timeout=1) as r:
                return r.status == 200
        except (urllib.error.HTTPError, OSError):
            return False

    def log_tail(self, i, lines=10):
        """The last lines node i wrote (its log file), as text."""
        try:
            with open(os.path.join(self.workdir, self.nodes[i]["name"] + ".log"), "rb") as f:
                return "\n".join(f.read().decode(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_up(self, timeout=15.0):
        """True once every started node is healthy; otherwise False after
        timeout or as soon as a node has exited, with each node that is not
        healthy, its exit status and its last log lines printed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(self.healthy(i) for i, n in enumerate(self.nodes) if n["proc"]):
                return True
            if any(n["proc"] and n["proc"].poll() is not None for n in self.nodes):
                break  # a node exited (a port taken, say): it will not come up
            time.sleep(0.05)
        for i, n in enumerate(self.nodes):
            if n["proc"] and not self.healthy(i):
                print("  NATS node %s (ports %d, %d, %d) is not healthy, exit status %s; its last lines:\n%s"
                      % (n["name"], n["port"], n["cport"], n["mport"], n["proc"].poll(), self.log_tail(i)),
                      flush=True)
        return False


def start_cluster(workdir, size=3, users=None, attempts=3):
    """A started Cluster whose nodes are all healthy, or None: each of up to
    `attempts` tries uses fresh ports and a fresh directory under workdir (a
    port another process took between free_port and nats-server's bind
    makes that node exit), and a failed try is stopped first."""
    for attempt in range(1, attempts + 1):
        sub = os.path.join(workdir, "nats%d" % attempt) if attempt > 1 else workdir
        os.makedirs(sub, exist_ok=True)
        cluster = Cluster(sub, size, users)
        cluster.start_all()
        if cluster.wait_up():
            return cluster
        cluster.stop_all()
        print("  the NATS cluster did not come up (try %d of %d)" % (attempt, attempts), flush=True)
    return None
