#!/usr/bin/env python3
"""Scale-out: three beangate shards behind HAProxy, on loopback (issue 16).

Usage: python3 tests/scale/test_sharding.py build/beangate [-k NAME]...

Three instances run with --shard 0/3, 1/3 and 2/3 on free ports, and
Debian's haproxy runs the shipped contrib/haproxy/beangate-shards.cfg as it
is: its addresses come from the environment (BEANGATE_PROXY_BIND,
BEANGATE_SHARD_0..2), so the file tested is the file shipped. The tests:
puts to 100 tubes through the proxy land on the shard that owns each tube
(CRC-32 of the name mod 3, computed here with zlib) and nowhere else; every
id is K mod 3 on instance K; reserves and deletes through the proxy find the
jobs; a reservation over tubes of two shards is answered 421 WRONG_SHARD;
the routes that cannot be merged answer 421 NOT_SHARDED and /shard/K/ reaches
shard K, whatever the rest of the path names (a job id of another shard,
/readyz); the documented client-side sharding (docs/scaling.md, Python
and Node.js with jackd) puts and reserves on the right instances over
beanstalk TCP; and stopping one instance fails only its tubes and ids (503
SHARD_DOWN from HAProxy, /shard/K/ included) while the others keep working,
until it is back.
The Kubernetes manifests (contrib/kubernetes) are checked as YAML, and the
HAProxy configuration inside shards.yaml is the shipped file.

Tests that need haproxy are skipped with a line saying so when it is not
installed (scripts/install-deps.sh installs it). Every wait polls with a
deadline.
"""

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import testlib  # noqa: E402
from testlib import (SANITIZER_MARKERS, Skip, check, check_eq, clean_env, free_port, port_open,  # noqa: E402
                     signal_and_wait, wait_until)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
HAPROXY_CFG = os.path.join(REPO, "contrib", "haproxy", "beangate-shards.cfg")
K8S_DIR = os.path.join(REPO, "contrib", "kubernetes")
SCALING_DOC = os.path.join(REPO, "docs", "scaling.md")
N = 3                       # the shipped configuration's number of shards
HTTP_TIMEOUT = 10.0
START_TIMEOUT = 15.0
STOP_TIMEOUT = 10.0
BINARY = None
HAPROXY = shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.access("/usr/sbin/haproxy", os.X_OK) else None)
NO_HAPROXY = "haproxy is not installed (scripts/install-deps.sh installs Debian's haproxy)"


def tube_shard(tube):
    """The documented rule: CRC-32 (zlib's) of the name's bytes, mod N."""
    return zlib.crc32(tube.encode()) % N


def enc(tube):
    """A tube name as one path segment ('/' and the rest percent-encoded)."""
    return urllib.parse.quote(tube, safe="")


# ---- processes --------------------------------------------------------------------

class Shard(testlib.ServerProcess):
    """One beangate instance, --shard k/N, on free loopback ports."""

    def __init__(self, k):
        super().__init__()
        self.k = k
        self.tcp_port = self.http_port = None

    def start(self, tcp_port=None, http_port=None):
        def launch():   # a free port may be taken meanwhile: each try picks afresh
            self.tcp_port = tcp_port or free_port()
            self.http_port = http_port or free_port()
            self.spawn([BINARY, "--shard", "%d/%d" % (self.k, N), "-l", "127.0.0.1", "-p", str(self.tcp_port),
                        "--http-listen", "127.0.0.1", "--http-port", str(self.http_port)], env=clean_env())
        status = self.start_retrying(launch, lambda: http_get(self.http_port, "/readyz")[0] == 200,
                                     START_TIMEOUT, attempts=3, retry=lambda err: not (tcp_port and http_port),
                                     not_yet=(OSError, http.client.HTTPException))
        if status == "ok":
            return self
        raise AssertionError("shard %d did not start (%s): %s" % (self.k, status, self.stderr()[-800:]))

    def stop(self):
        """SIGTERM; the exit status and stderr (a sanitizer report fails)."""
        status = signal_and_wait(self.proc, signal.SIGTERM, STOP_TIMEOUT)
        err = self.stderr()
        bad = [m for m in SANITIZER_MARKERS if m in err]
        check(not bad, "shard %d: sanitizer report on stderr: %s" % (self.k, err[-3000:]))
        check_eq(status, 0, "shard %d's exit status after SIGTERM (stderr %s)" % (self.k, err[-600:]))
        return status


class Proxy:
    """haproxy -db (foreground) with the shipped file and the shards' addresses."""

    def __init__(self, shards):
        self.shards = shards
        self.port = None
        self.proc = None
        self.out = None

    def start(self):
        for attempt in range(3):
            self.port = free_port()
            env = dict(os.environ, BEANGATE_PROXY_BIND="127.0.0.1:%d" % self.port)
            for s in self.shards:
                env["BEANGATE_SHARD_%d" % s.k] = "127.0.0.1:%d" % s.http_port
            self.out = tempfile.TemporaryFile()
            self.proc = subprocess.Popen([HAPROXY, "-db", "-f", HAPROXY_CFG], stdin=subprocess.DEVNULL,
                                         stdout=self.out, stderr=subprocess.STDOUT, env=env)
            if testlib.wait_ready(self.proc, lambda: port_open(self.port), START_TIMEOUT) == "ok":
                return self
            self.stop()
        raise AssertionError("haproxy did not listen: %s" % self.output()[-1500:])

    def output(self):
        self.out.seek(0)
        return self.out.read().decode("utf-8", "replace")

    def stop(self):
        if self.proc:
            signal_and_wait(self.proc, signal.SIGTERM, STOP_TIMEOUT)


# ---- HTTP -------------------------------------------------------------------------

def http_request(port, method, path, body=None, headers=None):
    """(status, headers with lower-case names, body bytes)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=HTTP_TIMEOUT)
    try:
        conn.request(method, path, body=body, headers=dict(headers or {}))
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def http_get(port, path):
    status, _, body = http_request(port, "GET", path)
    return status, body


def http_json(port, method, path, want, body=None, what=None):
    """The JSON of a request that must answer `want`."""
    status, headers, data = http_request(port, method, path, body=body)
    check_eq(status, want, "%s: %s %s (body %r)" % (what or "status", method, path, data[:300]))
    return json.loads(data) if data else None


def problem(port, method, path, want_status, want_code, body=None):
    """A problem+json answer with this status and code: its document."""
    status, headers, data = http_request(port, method, path, body=body)
    check_eq((status, headers.get("content-type")), (want_status, "application/problem+json"),
             "%s %s (body %r)" % (method, path, data[:300]))
    doc = json.loads(data)
    check_eq((doc.get("status"), doc.get("code")), (want_status, want_code), "%s %s problem" % (method, path))
    return doc


# ---- the cluster shared by the tests ------------------------------------------------

CLUSTER = {}


def setup(names):
    """Start the three shards and the proxy once, for every test that needs them."""
    needs = [n for n in names if n in NEEDS_CLUSTER]
    if not needs or not HAPROXY:
        return
    CLUSTER["shards"] = shards = []
    for k in range(N):
        shards.append(Shard(k).start())
    CLUSTER["proxy"] = Proxy(shards).start()
    wait_backends_up()


def stop_cluster():
    proxy = CLUSTER.pop("proxy", None)
    if proxy:
        proxy.stop()
    problems = []
    for s in CLUSTER.pop("shards", []):
        if s.proc and s.proc.poll() is None:
            try:
                s.stop()
            except AssertionError as e:
                problems.append(str(e))
        s.kill()
    return problems


def proxy_port():
    return CLUSTER["proxy"].port


def shard(k):
    return CLUSTER["shards"][k]


def wait_backends_up():
    """Every shard answers through its /shard/K/ route (HAProxy sees it up)."""
    for k in range(N):
        wait_until(lambda: http_get(proxy_port(), "/shard/%d/readyz" % k)[0] == 200,
                   "shard %d to be up behind the proxy" % k, timeout=15)


def tubes_of(k):
    """The tubes instance k holds (GET /tubes on its own port)."""
    return set(http_json(shard(k).http_port, "GET", "/tubes", 200)["tubes"])


def skip_without_haproxy(fn):
    return NO_HAPROXY if fn.__name__ in NEEDS_CLUSTER and not HAPROXY else None


# ---- the tests ----------------------------------------------------------------------

def test_shipped_config_is_valid():
    """haproxy -c accepts the shipped file without a warning."""
    env = dict(os.environ, BEANGATE_PROXY_BIND="127.0.0.1:%d" % free_port())
    p = subprocess.run([HAPROXY, "-c", "-f", HAPROXY_CFG], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       env=env, timeout=30)
    out = p.stdout.decode("utf-8", "replace")
    check_eq(p.returncode, 0, "haproxy -c exit status (output %s)" % out[-1500:])
    check("WARNING" not in out and "ALERT" not in out, "haproxy -c warns: %s" % out[-1500:])


def test_puts_land_on_the_owning_shard():
    """Puts to 100 tubes through the proxy: each job's id is that shard's
    (id mod 3 = CRC-32 of the tube mod 3), each instance lists exactly its
    own tubes (and default), and every shard got some."""
    tubes = ["land-%d" % i for i in range(97)] + ["land/slash", "land(1);$x", "land+plus.z"]
    before = {k: tubes_of(k) for k in range(N)}
    ids = {}
    for t in tubes:
        doc = http_json(proxy_port(), "POST", "/tubes/%s/jobs" % enc(t), 201, body=b"job of " + t.encode(),
                        what="put to %r through the proxy" % t)
        check_eq(doc["tube"], t, "the put's tube")
        check_eq(doc["id"] % N, tube_shard(t), "id %d of tube %r: id mod 3" % (doc["id"], t))
        ids[t] = doc["id"]
    per_shard = {k: {t for t in tubes if tube_shard(t) == k} for k in range(N)}
    for k in range(N):
        check(len(per_shard[k]) >= 15, "only %d of 100 tubes hash to shard %d" % (len(per_shard[k]), k))
        check_eq(tubes_of(k) - before[k], per_shard[k], "the new tubes on instance %d" % k)
        stats = http_json(shard(k).http_port, "GET", "/stats", 200)
        check_eq((stats["shard_index"], stats["shard_count"]), (k, N), "instance %d's /stats shard" % k)
    for t, jid in ids.items():  # each job is where its id says, and found through the proxy by id
        doc = http_json(shard(jid % N).http_port, "GET", "/jobs/%d" % jid, 200, what="job %d on its shard" % jid)
        check_eq(doc["tube"], t, "job %d's tube" % jid)
        check_eq(http_json(proxy_port(), "GET", "/jobs/%d" % jid, 200)["tube"], t, "job %d via the proxy" % jid)
    CLUSTER["landed"] = ids


def test_reserve_and_delete_through_the_proxy():
    """Every job of the 100 tubes is reserved and deleted through the proxy,
    and the instances are empty after it."""
    ids = CLUSTER.get("landed")
    if ids is None:
        raise Skip("needs test_puts_land_on_the_owning_shard first")
    for t, jid in ids.items():
        doc = http_json(proxy_port(), "POST", "/tubes/%s/reservations?timeout=1" % enc(t), 200,
                        what="reserve from %r" % t)
        check_eq((doc["id"], doc["body"]), (jid, "job of " + t), "the job reserved from %r" % t)
        status, _, body = http_request(proxy_port(), "DELETE",
                                       "/jobs/%d?reservation=%s" % (jid, urllib.parse.quote(doc["reservation"])))
        check_eq(status, 204, "delete job %d through the proxy (%r)" % (jid, body[:200]))
    for k in range(N):
        stats = http_json(shard(k).http_port, "GET", "/stats", 200)
        check_eq((stats["current_jobs_ready"], stats["current_jobs_reserved"]), (0, 0), "jobs left on %d" % k)


def test_ids_are_k_mod_n_on_every_instance():
    """Over beanstalk TCP and HTTP, instance K gives out K, K+3, K+6, ...
    (3, 6, 9 for K = 0): ids never collide across shards."""
    seen = set()
    for k in range(N):
        with socket.create_connection(("127.0.0.1", shard(k).tcp_port), timeout=HTTP_TIMEOUT) as s:
            f = s.makefile("rb")
            got = []
            for i in range(5):
                s.sendall(b"put 0 0 60 1\r\nx\r\n")
                line = f.readline()
                check(line.startswith(b"INSERTED "), "instance %d: %r" % (k, line))
                got.append(int(line.split()[1]))
            for jid in got:
                s.sendall(b"delete %d\r\n" % jid)
                check_eq(f.readline(), b"DELETED\r\n", "delete %d on instance %d" % (jid, k))
        check(all(j % N == k and j > 0 for j in got), "instance %d gave out %r" % (k, got))
        check_eq([b - a for a, b in zip(got, got[1:])], [N] * 4, "instance %d's id steps" % k)
        check(not seen & set(got), "ids given out twice: %r" % (seen & set(got)))
        seen |= set(got)


def same_shard_tubes(k, count, prefix):
    """count tube names that hash to shard k."""
    out, i = [], 0
    while len(out) < count:
        name = "%s-%d" % (prefix, i)
        if tube_shard(name) == k:
            out.append(name)
        i += 1
    return out


def test_reservation_over_several_tubes():
    """POST /reservations?tubes=a,b goes to the shard of the first tube:
    tubes of one shard work; a tube of another shard is 421 WRONG_SHARD,
    naming that tube and its shard, and no waiter is left behind."""
    a, b = same_shard_tubes(1, 2, "multi")
    other = same_shard_tubes(2, 1, "multi")[0]
    jid = http_json(proxy_port(), "POST", "/tubes/%s/jobs" % b, 201, body=b"m")["id"]
    doc = http_json(proxy_port(), "POST", "/reservations?tubes=%s,%s&timeout=1" % (a, b), 200)
    check_eq(doc["id"], jid, "the job reserved over two tubes of shard 1")
    check_eq(http_request(proxy_port(), "DELETE", "/jobs/%d?reservation=%s" % (jid, doc["reservation"]))[0],
             204, "delete")
    p = problem(proxy_port(), "POST", "/reservations?tubes=%s,%s&timeout=5" % (a, other), 421, "WRONG_SHARD")
    check("'%s'" % other in p["detail"] and "shard 2" in p["detail"], "the detail: %r" % p["detail"])
    check_eq(http_json(shard(1).http_port, "GET", "/stats", 200)["current_waiting"], 0, "waiters on shard 1")


def test_routes_that_cannot_be_merged():
    """/stats, /tubes, /metrics, /ui/ of the whole cluster are 421
    NOT_SHARDED from HAProxy; /shard/K/... is instance K's own (its /stats
    says so, its dashboard loads); /shard/9/ is 404; /readyz, /livez and
    /openapi.yaml come from any shard."""
    for path in ("/stats", "/tubes", "/stats/tubes", "/stats/history", "/metrics", "/ui/", "/subscriptions", "/"):
        problem(proxy_port(), "GET", path, 421, "NOT_SHARDED")
    for k in range(N):
        stats = http_json(proxy_port(), "GET", "/shard/%d/stats" % k, 200)
        check_eq(stats["shard_index"], k, "/shard/%d/stats is instance %d's" % (k, k))
        check_eq(http_json(proxy_port(), "GET", "/shard/%d/tubes" % k, 200)["tubes"],
                 http_json(shard(k).http_port, "GET", "/tubes", 200)["tubes"], "/shard/%d/tubes" % k)
        status, headers, body = http_request(proxy_port(), "GET", "/shard/%d/ui/" % k)
        check(status == 200 and b"<html" in body.lower(), "/shard/%d/ui/: %d %r" % (k, status, body[:100]))
        status, body = http_get(proxy_port(), "/shard/%d/metrics" % k)
        check(status == 200 and b"beangate_" in body, "/shard/%d/metrics: %d" % (k, status))
    problem(proxy_port(), "GET", "/shard/9/stats", 404, "NOT_FOUND")
    for path in ("/readyz", "/livez", "/openapi.yaml"):
        check_eq(http_get(proxy_port(), path)[0], 200, "GET %s through the proxy" % path)


def test_shard_prefix_names_the_shard():
    """/shard/K/jobs/ID goes to shard K whatever shard the id's is (issue 21,
    defect 13: the prefix was taken off before the routing rules asked
    whether the path had it, so the id's own shard answered): shard K finds
    its own job there and answers 404 for another shard's."""
    tubes = [same_shard_tubes(k, 1, "prefix")[0] for k in range(N)]
    ids = [http_json(proxy_port(), "POST", "/tubes/%s/jobs" % t, 201, body=b"p")["id"] for t in tubes]
    for k in range(N):
        for owner, jid in enumerate(ids):
            status, _, body = http_request(proxy_port(), "GET", "/shard/%d/jobs/%d" % (k, jid))
            check_eq(status, 200 if owner == k else 404,
                     "GET /shard/%d/jobs/%d (a job of shard %d): %r" % (k, jid, owner, body[:200]))
    for jid in ids:
        check_eq(http_request(proxy_port(), "DELETE", "/jobs/%d" % jid)[0], 204, "delete %d" % jid)


def node_modules_with_jackd():
    """The node_modules that hold jackd (tests/client's pinned install), or None."""
    work = os.environ.get("CLIENT_SUITE_DIR", os.path.join(REPO, "build", "client-suite"))
    mods = os.path.join(work, "jackd", "node_modules")
    if not os.path.isdir(os.path.join(mods, "jackd")) and shutil.which("npm"):
        subprocess.run([os.path.join(REPO, "tests", "client", "run_client_suite.sh"), "--install-only",
                        BINARY, "jackd"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=300, env=dict(os.environ, CLIENT_SUITE_DIR=work))
    return mods if os.path.isdir(os.path.join(mods, "jackd")) else None


def jobs_put_per_instance():
    """total_jobs of each instance (GET /stats on its own port)."""
    return [http_json(shard(k).http_port, "GET", "/stats", 200)["total_jobs"] for k in range(N)]


def run_client(argv, what, env=None):
    """Run a documented client against the three instances' beanstalk
    ports; check that each of its 30 tubes got its job on the tube's
    instance (id and total_jobs), and that it reserved and deleted each."""
    before = jobs_put_per_instance()
    p = subprocess.run(argv + [str(shard(k).tcp_port) for k in range(N)], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=60, env=env)
    check_eq(p.returncode, 0, "%s: exit status (stderr %s)" % (what, p.stderr.decode()[-1500:]))
    results = json.loads(p.stdout)
    check_eq(len(results), 30, "%s: results" % what)
    for tube, put_id, got_id, body, deleted in results:
        check_eq((got_id, body, deleted), (put_id, "body of " + tube, True),
                 "%s: tube %r: reserved id, body, deleted" % (what, tube))
        check_eq(put_id % N, tube_shard(tube), "%s: id %d of tube %r" % (what, put_id, tube))
    after = jobs_put_per_instance()
    want = [sum(1 for r in results if tube_shard(r[0]) == k) for k in range(N)]
    check_eq([a - b for a, b in zip(after, before)], want, "%s: jobs put on each instance" % what)
    for k in range(N):
        check_eq(http_json(shard(k).http_port, "GET", "/stats", 200)["current_jobs_ready"], 0,
                 "%s: ready jobs left on instance %d" % (what, k))


CLIENT_DRIVER_PY = r"""
import json, sys
shards = ShardedBeanstalk([("127.0.0.1", int(p)) for p in sys.argv[1:]])
tubes = ["py-%d" % i for i in range(29)] + ["py/slash"]
ids = {t: shards.put(t, ("body of " + t).encode()) for t in tubes}
results = []
for t in tubes:
    job_id, body = shards.reserve(t, timeout=1)
    results.append([t, ids[t], job_id, body.decode(), shards.delete(job_id)])
print(json.dumps(results))
"""

CLIENT_DRIVER_JS = r"""
(async () => {
  const shards = new Shards(process.argv.slice(2).map((port) => ({ host: "127.0.0.1", port: Number(port) })));
  await shards.connect();
  const tubes = [...Array(29).keys()].map((i) => "js-" + i).concat(["js/slash"]);
  const ids = {};
  for (const t of tubes) ids[t] = await shards.put(t, "body of " + t);
  const results = [];
  for (const t of tubes) {
    const job = await shards.reserve(t, 1);
    await shards.delete(job.id);
    results.push([t, Number(ids[t]), Number(job.id), job.payload, true]);
  }
  await shards.disconnect();
  console.log(JSON.stringify(results));
})().catch((e) => { console.error(e); process.exit(1); });
"""


def test_client_side_sharding_python():
    """docs/scaling.md's Python client (raw beanstalk, standard library)
    puts to 30 tubes on three instances over TCP, each to the shard of its
    tube, and reserves and deletes them on the shard of each id."""
    code = testlib.doc_block(SCALING_DOC, "shard-client-python") + "\n" + CLIENT_DRIVER_PY
    run_client([sys.executable, "-c", code], "the Python client")


def test_client_side_sharding_node_jackd():
    """docs/scaling.md's Node.js client (jackd, the version tests/client
    pins) does the same against the three instances."""
    if not shutil.which("node"):
        raise Skip("node is not installed (scripts/install-deps.sh installs it)")
    mods = node_modules_with_jackd()
    if not mods:
        raise Skip("jackd could not be installed from the npm registry (tests/client/run_client_suite.sh "
                   "--install-only BINARY jackd)")
    with tempfile.TemporaryDirectory(prefix="beangate-shards-js-") as tmp:
        script = os.path.join(tmp, "shards.js")
        with open(script, "w") as f:
            f.write(testlib.doc_block(SCALING_DOC, "shard-client-node") + "\n" + CLIENT_DRIVER_JS)
        run_client(["node", script], "the Node.js client (jackd)", env=dict(os.environ, NODE_PATH=mods))


def test_stopping_one_shard_affects_only_its_tubes():
    """Shard 1 stops: its tubes and ids answer 503 SHARD_DOWN from HAProxy
    (with Retry-After), at once and after the health check marks it down;
    the tubes and ids of shards 0 and 2 keep working (put, reserve,
    delete). Started again on its ports, shard 1 serves its tubes again."""
    down = shard(1)
    mine = same_shard_tubes(1, 3, "down")
    others = same_shard_tubes(0, 3, "up") + same_shard_tubes(2, 3, "up")
    held = http_json(proxy_port(), "POST", "/tubes/%s/jobs" % mine[0], 201, body=b"held")["id"]
    kept = same_shard_tubes(0, 1, "kept")[0]
    elsewhere = http_json(proxy_port(), "POST", "/tubes/%s/jobs" % kept, 201, body=b"kept")["id"]
    down.stop()
    deadline = time.monotonic() + 3  # also once the checks (every 1 s, down after 2) took it out
    while True:
        for t in mine:
            p = problem(proxy_port(), "POST", "/tubes/%s/jobs" % t, 503, "SHARD_DOWN", body=b"x")
            check("shard 1" in p["detail"], "the detail %r" % p["detail"])
        status, headers, _ = http_request(proxy_port(), "GET", "/jobs/%d" % held)
        check_eq((status, headers.get("retry-after")), (503, "5"), "GET /jobs/%d of the stopped shard" % held)
        # /shard/1/... is shard 1's, down (issue 21, defect 13: its /readyz
        # answered 200 from another shard, a job id went to the id's shard)
        problem(proxy_port(), "GET", "/shard/1/readyz", 503, "SHARD_DOWN")
        problem(proxy_port(), "GET", "/shard/1/jobs/%d" % elsewhere, 503, "SHARD_DOWN")
        for t in others:
            jid = http_json(proxy_port(), "POST", "/tubes/%s/jobs" % t, 201, body=b"still",
                            what="put to %r (shard %d) while shard 1 is down" % (t, tube_shard(t)))["id"]
            doc = http_json(proxy_port(), "POST", "/tubes/%s/reservations?timeout=1" % t, 200)
            check_eq(doc["id"], jid, "reserve from %r while shard 1 is down" % t)
            check_eq(http_request(proxy_port(), "DELETE", "/jobs/%d?reservation=%s"
                                  % (jid, doc["reservation"]))[0], 204, "delete %d" % jid)
        if time.monotonic() >= deadline:
            break
    check("shard1/shard1 is DOWN" in CLUSTER["proxy"].output(),
          "HAProxy's health check did not mark shard 1 down: %s" % CLUSTER["proxy"].output()[-1500:])
    # back on the same ports: its tubes work again (its jobs were in memory only)
    check_eq(http_request(proxy_port(), "GET", "/jobs/%d" % elsewhere)[0], 200,
             "GET /jobs/%d (of shard %d) while shard 1 is down" % (elsewhere, elsewhere % N))
    down.start(down.tcp_port, down.http_port)
    wait_until(lambda: http_request(proxy_port(), "POST", "/tubes/%s/jobs" % mine[1], body=b"back")[0] == 201,
               "a put to shard 1's tube %r to work again" % mine[1], timeout=15)
    wait_until(lambda: http_get(proxy_port(), "/shard/1/readyz")[0] == 200, "/shard/1/readyz to answer 200 again",
               timeout=15)


def test_kubernetes_manifests():
    """contrib/kubernetes/*.yaml parse as YAML (python3-yaml), hold the
    pieces docs/scaling.md names, and the HAProxy configuration in
    shards.yaml's ConfigMap is contrib/haproxy/beangate-shards.cfg byte for
    byte."""
    try:
        import yaml
    except ImportError:
        raise Skip("python3-yaml is not installed (apt-get install python3-yaml)") from None
    docs = {}
    for name in ("sidecar.yaml", "shards.yaml"):
        with open(os.path.join(K8S_DIR, name), encoding="utf-8") as f:
            docs[name] = [d for d in yaml.safe_load_all(f) if d]
    kinds = lambda name: {d["kind"]: d for d in docs[name]}  # noqa: E731
    pod = kinds("sidecar.yaml")["Deployment"]["spec"]["template"]["spec"]
    bg = next(c for c in pod["containers"] if c["name"] == "beangate")
    check_eq(bg["livenessProbe"]["httpGet"]["path"], "/livez", "sidecar liveness probe")
    check_eq(bg["readinessProbe"]["httpGet"]["path"], "/readyz", "sidecar readiness probe")
    check("-b" in bg["args"] and any(m["mountPath"] == bg["args"][bg["args"].index("-b") + 1]
                                     for m in bg["volumeMounts"]), "the sidecar's -b is on its volume")
    check("requests" in bg["resources"] and "limits" in bg["resources"], "sidecar resources")
    check(len(pod["containers"]) == 2, "the sidecar pod has the app and beangate")
    shards = kinds("shards.yaml")
    sts = shards["StatefulSet"]
    check_eq(sts["spec"]["serviceName"], "beangate", "the StatefulSet's headless Service")
    env = {e["name"]: e for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
    check_eq(env["BEANGATE_SHARD"]["value"], "$(SHARD_INDEX)/%d" % sts["spec"]["replicas"],
             "BEANGATE_SHARD of the StatefulSet's pods")
    check_eq(env["SHARD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"],
             "metadata.labels['apps.kubernetes.io/pod-index']", "the pod's ordinal as K")
    services = [d for d in docs["shards.yaml"] if d["kind"] == "Service"]
    check(any(s["spec"].get("clusterIP") == "None" and s["metadata"]["name"] == "beangate" for s in services),
          "no headless Service named beangate")
    with open(HAPROXY_CFG, encoding="utf-8") as f:
        check_eq(shards["ConfigMap"]["data"]["haproxy.cfg"], f.read(),
                 "shards.yaml's haproxy.cfg against contrib/haproxy/beangate-shards.cfg")
    proxy_env = {e["name"]: e.get("value") for e in shards["Deployment"]["spec"]["template"]["spec"]
                 ["containers"][0]["env"]}
    for k in range(N):
        check(proxy_env["BEANGATE_SHARD_%d" % k].startswith("beangate-%d.beangate." % k),
              "the proxy's BEANGATE_SHARD_%d: %r" % (k, proxy_env.get("BEANGATE_SHARD_%d" % k)))


# the tests that need the three shards and the proxy, in order (the last stops a shard)
NEEDS_CLUSTER = {
    "test_shipped_config_is_valid", "test_puts_land_on_the_owning_shard",
    "test_reserve_and_delete_through_the_proxy", "test_ids_are_k_mod_n_on_every_instance",
    "test_reservation_over_several_tubes", "test_routes_that_cannot_be_merged",
    "test_shard_prefix_names_the_shard", "test_client_side_sharding_python", "test_client_side_sharding_node_jackd",
    "test_stopping_one_shard_affects_only_its_tubes",
}

TESTS = [
    test_shipped_config_is_valid,
    test_puts_land_on_the_owning_shard,
    test_reserve_and_delete_through_the_proxy,
    test_ids_are_k_mod_n_on_every_instance,
    test_reservation_over_several_tubes,
    test_routes_that_cannot_be_merged,
    test_shard_prefix_names_the_shard,
    test_client_side_sharding_python,
    test_client_side_sharding_node_jackd,
    test_stopping_one_shard_affects_only_its_tubes,
    test_kubernetes_manifests,
]


def shards_stopped_cleanly():
    """After the tests: the proxy and every instance stop; each instance
    exits 0 on SIGTERM with no sanitizer report."""
    problems = stop_cluster()
    check(not problems, "\n  ".join(problems))


def main(argv):
    global BINARY
    args = testlib.parse_args(testlib.arg_parser(__doc__), argv)
    BINARY = args.binary
    return testlib.run("sharding", TESTS, args, namespace=globals(), setup=setup, skip=skip_without_haproxy,
                       last=(shards_stopped_cleanly,), all_skipped=77)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
