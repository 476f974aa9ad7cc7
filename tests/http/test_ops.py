#!/usr/bin/env python3
"""Operations tests of beangate: health and readiness, /metrics (checked by
`promtool check metrics`), bearer-token auth of the HTTP gateway, settings
from the environment and their precedence, and the log lines.

Usage:
  python3 tests/http/test_ops.py build/beangate

Every test starts its own server(s) on free loopback ports and stops them
(SIGTERM, then SIGKILL after a few seconds); a server must exit with status
0 and leave no sanitizer report on stderr. Python 3 standard library only.
`promtool` comes from Debian's package `prometheus`: when it is missing the
script installs it with apt-get (as root); if that is not possible the
promtool test FAILS and says so. The runner is tests/lib/testlib.py's: -k NAME
runs one test, PASS/FAIL per test, the last line is
`ops: N passed, M failed, K skipped`; exits 1 on failure.
"""

import http.client
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import testlib  # noqa: E402
from testlib import SANITIZER_MARKERS, check, check_eq, clean_env, free_port, port_open  # noqa: E402

HTTP_TIMEOUT = 10.0
START_TIMEOUT = 15.0
STOP_TIMEOUT = 5.0
BUCKETS = ["0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5",
           "1", "2.5", "5", "10", "30", "+Inf"]
PROM_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TOKEN_A = "ops-test-token-A-3f9c1e7a52"
TOKEN_B = "ops-test-token-B-8d04b6c2e1"
TOKEN_ENV = "ops-test-token-ENV-77aa19c0"

BINARY = None


# ---- processes ----------------------------------------------------------------

class Server(testlib.ServerProcess):
    """A beangate process. args: extra flags; env: extra environment.
    tcp_port/http_port: where it is expected to listen (chosen free when the
    flags do not give them, unless ports=False)."""

    def __init__(self, args=(), env=None, ports=True, http=True, tcp_port=None, http_port=None):
        super().__init__()
        self.args = list(args)
        self.env = dict(env or {})
        self.ports = ports
        self.http = http
        self.want_tcp, self.want_http = tcp_port, http_port
        self.tcp_port = None
        self.http_port = None
        self.stderr_text = ""

    def start(self, tcp_port=None, http_port=None):
        args = list(self.args)
        if self.ports:
            self.tcp_port = tcp_port or free_port()
            args = ["-p", str(self.tcp_port)] + args
            if self.http:
                self.http_port = http_port or free_port()
                args = ["--http-port", str(self.http_port)] + args
            else:
                args = ["--no-http"] + args
        else:
            self.tcp_port, self.http_port = tcp_port, http_port
        self.spawn([BINARY] + args, env=clean_env(self.env))
        status = testlib.wait_ready(
            self.proc, lambda: port_open(self.tcp_port) and (not self.http_port or port_open(self.http_port)),
            START_TIMEOUT, step=0.05)
        if status == "exited":
            raise AssertionError("server exited with status %r at start; stderr: %s"
                                 % (self.proc.returncode, self.stderr()[-2000:]))
        if status == "ok":
            return self
        self.kill()
        raise AssertionError("server did not listen within %.0f s; stderr: %s"
                             % (START_TIMEOUT, self.stderr()[-2000:]))

    def stop(self):
        """SIGTERM; returns the exit status (kills after STOP_TIMEOUT)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.kill()
                self.stderr_text = self.stderr()
                raise AssertionError("server did not stop within %.0f s of SIGTERM (killed)"
                                     % STOP_TIMEOUT)
        self.stderr_text = self.stderr()
        return self.proc.returncode

    def __enter__(self):
        if not self.ports:
            return self.start(self.want_tcp, self.want_http)
        for attempt in range(3):  # a free port may be taken by someone else meanwhile
            try:
                return self.start()
            except AssertionError:
                if attempt == 2:
                    raise
                self.kill()

    def __exit__(self, exc_type, exc, tb):
        try:
            status = self.stop()
        finally:
            self.kill()
            if self.err:
                self.err.close()
        bad = [m for m in SANITIZER_MARKERS if m in self.stderr_text]
        if exc_type is None:
            check(not bad, "sanitizer report on stderr: %s" % self.stderr_text[-3000:])
            check(status == 0, "exit status %r after SIGTERM, want 0; stderr: %s"
                  % (status, self.stderr_text[-2000:]))
        return False

    # HTTP --------------------------------------------------------------------

    def request(self, method, path, body=None, headers=None, timeout=HTTP_TIMEOUT):
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=dict(headers or {}))
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        except (OSError, http.client.HTTPException) as e:
            raise AssertionError("%s %s: %s: %s" % (method, path, type(e).__name__, e)) from None
        finally:
            conn.close()

    def get(self, path, token=None, **kw):
        headers = {"Authorization": "Bearer " + token} if token else {}
        return self.request("GET", path, headers=headers, **kw)

    def metrics(self, token=None):
        status, headers, body = self.get("/metrics", token=token)
        check_eq(status, 200, "GET /metrics status")
        return body.decode("utf-8")

    # beanstalk ---------------------------------------------------------------

    def beanstalk(self, data, want_lines):
        """Send data on a new connection; read until want_lines lines came."""
        with socket.create_connection(("127.0.0.1", self.tcp_port), timeout=HTTP_TIMEOUT) as s:
            s.sendall(data)
            got = b""
            while got.count(b"\r\n") < want_lines:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
            return got


def run_binary(args, env=None, timeout=15):
    """Run the binary to its end: (status, stdout, stderr)."""
    return testlib.run_binary(BINARY, args, timeout, env=clean_env(env), err_limit=2000)


def token_file(*lines):
    f = tempfile.NamedTemporaryFile("w", prefix="beangate-tokens-", delete=False)
    f.write("\n".join(lines) + "\n")
    f.close()
    os.chmod(f.name, 0o600)
    return f.name


# ---- Prometheus text parsing ----------------------------------------------------

SAMPLE_RE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text):
    """{(name, frozenset(labels.items())): value}, and {family: type}; checks
    that every sample belongs to a family with HELP and TYPE."""
    samples, types, helps = {}, {}, set()
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("# HELP "):
            helps.add(line.split()[2])
            continue
        if line.startswith("# TYPE "):
            _, _, name, typ = line.split(None, 3)
            types[name] = typ
            continue
        check(not line.startswith("#"), "unexpected comment line %r" % line)
        m = SAMPLE_RE.match(line)
        check(m, "not a sample line: %r" % line)
        name, labels = m.group(1), dict(LABEL_RE.findall(m.group(3) or ""))
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        fam = name if name in types else base
        check(fam in types, "sample %r has no # TYPE" % line)
        check(fam in helps, "family %s has no # HELP" % fam)
        samples[(name, frozenset(labels.items()))] = float(m.group(4))
    return samples, types


def value(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())))


def series(samples, name):
    return {k[1]: v for k, v in samples.items() if k[0] == name}


# ---- promtool -------------------------------------------------------------------

def find_promtool():
    """The promtool path; installs Debian's `prometheus` if it is missing.
    Raises AssertionError (loudly) if that cannot be done."""
    path = shutil.which("promtool")
    if path:
        return path
    why = []
    if os.geteuid() != 0:
        why.append("not root, so apt-get cannot install it")
    elif not shutil.which("apt-get"):
        why.append("no apt-get on this machine")
    else:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        for cmd in (["apt-get", "install", "-y", "-q", "--no-install-recommends", "prometheus"],
                    ["apt-get", "update", "-q"],
                    ["apt-get", "install", "-y", "-q", "--no-install-recommends", "prometheus"]):
            print("ops: promtool is missing: running %s" % " ".join(cmd), flush=True)
            try:
                p = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, env=env, timeout=600)
                if p.returncode != 0:
                    why.append("%s: exit %d: %s" % (" ".join(cmd), p.returncode,
                                                    p.stdout.decode("utf-8", "replace")[-500:]))
            except (OSError, subprocess.TimeoutExpired) as e:
                why.append("%s: %s" % (" ".join(cmd), e))
            path = shutil.which("promtool")
            if path:
                return path
    msg = ("PROMTOOL IS NOT AVAILABLE, so the /metrics output could not be checked "
           "(install Debian's package `prometheus`): " + "; ".join(why))
    print("ops: " + "!" * 72 + "\nops: " + msg + "\nops: " + "!" * 72, flush=True)
    raise AssertionError(msg)


# ---- tests: health --------------------------------------------------------------

def test_livez_readyz():
    with Server() as srv:
        status, headers, body = srv.get("/livez")
        check_eq(status, 200, "GET /livez")
        check_eq(json.loads(body), {"status": "ok"}, "GET /livez body")
        check(headers.get("content-type", "").startswith("application/json"),
              "/livez content type %r" % headers.get("content-type"))
        status, _, body = srv.get("/readyz")
        check_eq(status, 200, "GET /readyz while serving")
        check_eq(json.loads(body), {"status": "ok"}, "GET /readyz body")
        check_eq(value(parse_metrics(srv.metrics())[0], "beangate_ready"), 1.0, "beangate_ready")

        srv.proc.send_signal(signal.SIGUSR1)
        status, headers, body = testlib.wait_until(lambda: srv.get("/readyz"), "GET /readyz to answer 503",
                                                   ok=lambda r: r[0] == 503)
        check_eq(status, 503, "GET /readyz after SIGUSR1")
        check(headers.get("content-type") == "application/problem+json",
              "/readyz 503 content type %r" % headers.get("content-type"))
        check(headers.get("retry-after"), "/readyz 503 has no Retry-After")
        problem = json.loads(body)
        check_eq(problem.get("code"), "DRAINING", "/readyz 503 code")
        check_eq(problem.get("status"), 503, "/readyz 503 status field")
        status, _, _ = srv.get("/livez")
        check_eq(status, 200, "GET /livez while draining")
        samples = parse_metrics(srv.metrics())[0]
        check_eq(value(samples, "beangate_draining"), 1.0, "beangate_draining after SIGUSR1")
        check_eq(value(samples, "beangate_ready"), 0.0, "beangate_ready after SIGUSR1")


def test_health_methods():
    with Server() as srv:
        status, headers, _ = srv.request("POST", "/livez", body=b"")
        check_eq(status, 405, "POST /livez")
        check("GET" in (headers.get("allow") or ""), "POST /livez Allow %r" % headers.get("allow"))


# ---- tests: metrics -------------------------------------------------------------

def test_metrics_content():
    with Server() as srv:
        status, headers, body = srv.get("/metrics")
        check_eq(status, 200, "GET /metrics")
        check_eq(headers.get("content-type"), PROM_CONTENT_TYPE, "/metrics Content-Type")
        before, types = parse_metrics(body.decode("utf-8"))
        for fam, typ in (("beangate_current_jobs", "gauge"), ("beangate_jobs_total", "counter"),
                         ("beangate_job_timeouts_total", "counter"),
                         ("beangate_commands_total", "counter"),
                         ("beangate_current_connections", "gauge"),
                         ("beangate_connections_total", "counter"),
                         ("beangate_current_tubes", "gauge"), ("beangate_current_waiting", "gauge"),
                         ("beangate_draining", "gauge"), ("beangate_uptime_seconds", "gauge"),
                         ("beangate_tube_current_jobs", "gauge"),
                         ("beangate_tube_current_waiting", "gauge"),
                         ("beangate_tube_paused", "gauge"), ("beangate_tubes_omitted", "gauge"),
                         ("beangate_http_requests_total", "counter"),
                         ("beangate_http_request_duration_seconds", "histogram")):
            check_eq(types.get(fam), typ, "# TYPE of %s" % fam)
        for state in ("ready", "delayed", "reserved", "buried"):
            check(value(before, "beangate_current_jobs", state=state) is not None,
                  "no beangate_current_jobs{state=%r}" % state)
        check_eq(value(before, "beangate_draining"), 0.0, "beangate_draining")
        check_eq(value(before, "beangate_jobs_total"), 0.0, "beangate_jobs_total at start")

        # two jobs over HTTP, one over beanstalk, one reserved, one paused tube
        tube = "ops.metrics-tube"
        for i in range(2):
            status, _, _ = srv.request("POST", "/tubes/%s/jobs" % tube, body=b"job %d" % i)
            check_eq(status, 201, "POST /tubes/%s/jobs" % tube)
        status, _, _ = srv.request("GET", "/jobs/999999")
        check_eq(status, 404, "GET /jobs/999999")
        reply = srv.beanstalk(b"use %s\r\nput 0 0 60 3\r\nabc\r\nput 0 5 60 1\r\nx\r\n"
                              % tube.encode(), 3)
        check(reply.startswith(b"USING"), "beanstalk use/put replies %r" % reply)
        status, _, _ = srv.request("POST", "/tubes/%s/reservations?timeout=0" % tube, body=b"")
        check_eq(status, 200, "reserve over HTTP")
        status, _, _ = srv.request("POST", "/tubes/%s/pause?delay=60" % tube, body=b"")
        check_eq(status, 200, "pause over HTTP")

        after = parse_metrics(srv.metrics())[0]
        check_eq(value(after, "beangate_jobs_total"), 4.0, "beangate_jobs_total after 4 puts")
        check_eq(value(after, "beangate_commands_total", command="put"), 4.0,
                 "beangate_commands_total{command=put} after 2 beanstalk and 2 HTTP puts")
        check_eq(value(after, "beangate_commands_total", command="use"), 1.0,
                 "beangate_commands_total{command=use}")
        check(value(after, "beangate_connections_total") >= 1.0, "beangate_connections_total")
        check_eq(value(after, "beangate_current_jobs", state="ready"), 2.0, "ready jobs")
        check_eq(value(after, "beangate_current_jobs", state="reserved"), 1.0, "reserved jobs")
        check_eq(value(after, "beangate_current_jobs", state="delayed"), 1.0, "delayed jobs")
        check_eq(value(after, "beangate_tube_current_jobs", tube=tube, state="ready"), 2.0,
                 "tube ready jobs")
        check_eq(value(after, "beangate_tube_current_jobs", tube=tube, state="delayed"), 1.0,
                 "tube delayed jobs")
        check_eq(value(after, "beangate_tube_paused", tube=tube), 1.0, "tube paused")
        check_eq(value(after, "beangate_tube_paused", tube="default"), 0.0, "default not paused")
        check(value(after, "beangate_current_tubes") >= 2.0, "beangate_current_tubes")
        check_eq(value(after, "beangate_tubes_omitted"), 0.0, "beangate_tubes_omitted")

        # HTTP counters: labelled by the route pattern, never by the raw URL
        check_eq(value(after, "beangate_http_requests_total", route="/tubes/{tube}/jobs",
                       method="POST", status="201"), 2.0, "requests_total for the two puts")
        check_eq(value(after, "beangate_http_requests_total", route="/jobs/{id}", method="GET",
                       status="404"), 1.0, "requests_total for GET /jobs/999999")
        check_eq(value(after, "beangate_http_requests_total", route="/metrics", method="GET",
                       status="200"), 1.0, "requests_total for the first GET /metrics")
        routes = {dict(labels).get("route") for labels in series(after, "beangate_http_requests_total")}
        for r in routes:
            check(tube not in r and "999999" not in r, "a route label holds a raw URL: %r" % r)

        # the histogram: cumulative buckets, +Inf == _count, a sum
        hist = series(after, "beangate_http_request_duration_seconds_bucket")
        route = "/tubes/{tube}/jobs"
        counts = [hist.get(frozenset({("route", route), ("le", le)})) for le in BUCKETS]
        check(all(c is not None for c in counts), "buckets of %s: %r" % (route, counts))
        check(all(a <= b for a, b in zip(counts, counts[1:])), "buckets not cumulative: %r" % counts)
        check_eq(counts[-1], value(after, "beangate_http_request_duration_seconds_count", route=route),
                 "+Inf bucket vs _count")
        check_eq(counts[-1], 2.0, "observations of %s" % route)
        check(value(after, "beangate_http_request_duration_seconds_sum", route=route) >= 0,
              "_sum of %s" % route)
        for labels, v in series(after, "beangate_http_request_duration_seconds_count").items():
            r = dict(labels)["route"]
            cs = [hist.get(frozenset({("route", r), ("le", le)})) for le in BUCKETS]
            check(all(a <= b for a, b in zip(cs, cs[1:])) and cs[-1] == v,
                  "histogram of %s: buckets %r, count %r" % (r, cs, v))

        # counters only go up
        later = parse_metrics(srv.metrics())[0]
        check(value(later, "beangate_http_requests_total", route="/metrics", method="GET",
                    status="200") == 2.0, "the second GET /metrics is counted")
        check(value(later, "beangate_uptime_seconds") >= value(after, "beangate_uptime_seconds"),
              "uptime went back")


def test_metrics_long_poll_latency():
    """A long-poll is measured until its response is sent."""
    with Server() as srv:
        t0 = time.monotonic()
        status, _, _ = srv.request("POST", "/tubes/ops.empty/reservations?timeout=1", body=b"")
        took = time.monotonic() - t0
        check_eq(status, 204, "long-poll on an empty tube")
        check(took >= 0.9, "long-poll answered after %.2f s, want about 1 s" % took)
        samples = parse_metrics(srv.metrics())[0]
        route = "/tubes/{tube}/reservations"
        total = value(samples, "beangate_http_request_duration_seconds_sum", route=route)
        check(total is not None and total >= 0.9, "duration _sum of the 1 s long-poll: %r" % total)
        check_eq(value(samples, "beangate_http_request_duration_seconds_bucket", route=route, le="0.5"),
                 0.0, "the 1 s long-poll in the le=0.5 bucket")
        check_eq(value(samples, "beangate_http_request_duration_seconds_bucket", route=route, le="2.5"),
                 1.0, "the 1 s long-poll in the le=2.5 bucket")
        check_eq(value(samples, "beangate_http_requests_total", route=route, method="POST",
                       status="204"), 1.0, "requests_total of the long-poll")


def test_metrics_tube_cap():
    """10k tubes cannot make /metrics huge: at most 1000 are exported."""
    with Server() as srv:
        n = 1010
        with socket.create_connection(("127.0.0.1", srv.tcp_port), timeout=HTTP_TIMEOUT) as s:
            s.sendall(b"".join(b"watch ops.cap.%d\r\n" % i for i in range(n)))
            got = b""
            while got.count(b"\r\n") < n:
                chunk = s.recv(65536)
                check(chunk, "connection closed after %d replies" % got.count(b"\r\n"))
                got += chunk
            text = srv.metrics()
            samples = parse_metrics(text)[0]
            tubes = {dict(labels)["tube"] for labels in series(samples, "beangate_tube_paused")}
            check_eq(len(tubes), 1000, "tubes in beangate_tube_paused")
            current = value(samples, "beangate_current_tubes")
            check_eq(current, float(n + 1), "beangate_current_tubes")
            check_eq(value(samples, "beangate_tubes_omitted"), current - 1000, "beangate_tubes_omitted")
            check_eq(value(samples, "beangate_tubes_exported"), 1000.0, "beangate_tubes_exported")
            check(len(text) < 1000000, "/metrics is %d bytes with %d tubes" % (len(text), n))


def test_promtool_check_metrics():
    promtool = find_promtool()
    with Server() as srv:
        # make every family have samples: jobs, a tube, HTTP requests of several kinds
        srv.request("POST", "/tubes/ops.prom/jobs", body=b"x")
        srv.request("GET", "/no/such/route")
        srv.request("POST", "/tubes/ops.prom/reservations?timeout=0", body=b"")
        srv.beanstalk(b"stats\r\n", 1)
        text = srv.metrics()
    p = subprocess.run([promtool, "check", "metrics"], input=text.encode("utf-8"),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    out = p.stdout.decode("utf-8", "replace")
    check(p.returncode == 0 and not out.strip(),
          "promtool check metrics: exit %d: %s" % (p.returncode, out[-3000:]))
    check("route=\"unmatched\"" in text, "an unknown path is counted as route=\"unmatched\"")


def test_promtool_push_metrics():
    """The push families (a delivered job, a retried one, a buried one) pass promtool."""
    import http.server
    import threading

    class Receiver(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self.send_response({"/ok": 204, "/busy": 503, "/no": 404}[self.path])
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass
    rx = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=rx.serve_forever, daemon=True).start()
    promtool = find_promtool()
    base = "http://127.0.0.1:%d" % rx.server_address[1]
    try:
        args = ["--push", "tube=ops.ok url=%s/ok" % base, "--push", "tube=ops.busy url=%s/busy backoff=60..60" % base,
                "--push", "tube=ops.no url=%s/no" % base]
        with Server(args=args) as srv:
            for tube in ("ops.ok", "ops.busy", "ops.no"):
                srv.request("POST", "/tubes/%s/jobs" % tube, body=b"x")
            deadline = time.monotonic() + 10
            while True:
                samples, _ = parse_metrics(srv.metrics())
                done = (value(samples, "beangate_push_delivered_total", tube="ops.ok"),
                        value(samples, "beangate_push_retries_total", tube="ops.busy", reason="http_5xx"),
                        value(samples, "beangate_push_buried_total", tube="ops.no", reason="http_4xx"))
                if done == (1.0, 1.0, 1.0) or time.monotonic() > deadline:
                    break
                time.sleep(0.02)
            check_eq(done, (1.0, 1.0, 1.0), "delivered, retried (http_5xx), buried (http_4xx)")
            check_eq(value(samples, "beangate_push_backing_off", tube="ops.busy"), 1.0, "backing_off")
            check_eq(value(samples, "beangate_push_in_flight", tube="ops.ok"), 0.0, "in_flight")
            check_eq(value(samples, "beangate_push_concurrency", tube="ops.ok"), 1.0, "concurrency")
            check_eq(value(samples, "beangate_push_attempt_duration_seconds_count", tube="ops.ok"), 1.0,
                     "attempt histogram count")
            check_eq(value(samples, "beangate_push_delivery_seconds_count", tube="ops.ok"), 1.0,
                     "put-to-delivery histogram count")
            check_eq(value(samples, "beangate_push_failures_tracked"), 2.0, "failures tracked (busy, no)")
            text = srv.metrics()
    finally:
        rx.shutdown()
        rx.server_close()
    p = subprocess.run([promtool, "check", "metrics"], input=text.encode("utf-8"),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    out = p.stdout.decode("utf-8", "replace")
    check(p.returncode == 0 and not out.strip(), "promtool check metrics with push: %s" % out[-3000:])


def test_metrics_binlog_and_gearman():
    """With -b the log's figures are metrics too; Gearman connections count."""
    promtool = find_promtool()
    logdir = tempfile.mkdtemp(prefix="beangate-ops-")
    gport = free_port()
    try:
        with Server(args=["-b", logdir, "--gearman-port", str(gport)]) as srv:
            for i in range(3):
                srv.beanstalk(b"put 0 0 60 1\r\nx\r\n", 1)
            g = socket.create_connection(("127.0.0.1", gport), timeout=HTTP_TIMEOUT)
            try:
                g.sendall(b"version\n")
                check(g.recv(100).startswith(b"OK "), "the Gearman port answers")
                # the flusher thread writes the records after the replies:
                # wait (up to 5 s) until the three puts are counted and the
                # closed beanstalk connections are gone
                samples, _ = testlib.wait_until(
                    lambda: parse_metrics(srv.metrics()), "3 log records and 1 connection in /metrics",
                    step=0.02, ok=lambda m: (value(m[0], "beangate_binlog_records_written_total") or 0) >= 3
                    and value(m[0], "beangate_current_connections") == 1)
                check(value(samples, "beangate_binlog_records_written_total") >= 3,
                      "3 puts are at least 3 log records: %r" % series(samples, "beangate_binlog_records_written_total"))
                check_eq(value(samples, "beangate_binlog_torn_records"), 0, "torn records of a fresh log")
                check(value(samples, "beangate_binlog_current_index") >= 1, "a segment is being written")
                check_eq(value(samples, "beangate_current_connections"), 1, "the open Gearman connection")
                text = srv.metrics()
            finally:
                g.close()
        p = subprocess.run([promtool, "check", "metrics"], input=text.encode("utf-8"),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
        out = p.stdout.decode("utf-8", "replace")
        check(p.returncode == 0 and not out.strip(), "promtool check metrics with -b: %s" % out[-3000:])
        with Server() as srv:
            samples, _ = parse_metrics(srv.metrics())
            check(not series(samples, "beangate_binlog_records_written_total"),
                  "no log figures without -b")
    finally:
        shutil.rmtree(logdir, ignore_errors=True)


# ---- tests: command counters ------------------------------------------------------

# The 22 cmd-* counters of `stats` (YAML names), as beanstalkd shows them.
SHOWN_COMMANDS = ("put", "peek", "peek-ready", "peek-delayed", "peek-buried", "reserve",
                  "reserve-with-timeout", "delete", "release", "use", "watch", "ignore", "bury",
                  "kick", "touch", "stats", "stats-job", "stats-tube", "list-tubes", "list-tube-used",
                  "list-tubes-watched", "pause-tube")


def gearman_packet(kind, *args):
    body = b"\0".join(a if isinstance(a, bytes) else str(a).encode() for a in args)
    return b"\0REQ" + struct.pack(">II", kind, len(body)) + body


def gearman_reply(sock):
    """One response packet: (type, [args])."""
    data = b""
    while len(data) < 12 or len(data) < 12 + struct.unpack(">II", data[4:12])[1]:
        chunk = sock.recv(65536)
        check(chunk, "the Gearman connection closed; got %r" % data)
        data += chunk
    kind, size = struct.unpack(">II", data[4:12])
    check_eq(len(data), 12 + size, "one Gearman reply at a time")
    return kind, (data[12:].split(b"\0") if size else [])


def command_counters(srv, bs):
    """The cmd-* counters as the three renderings show them:
    {"yaml"|"json"|"metrics": {command: value}} (the 22 of `stats`)."""
    bs.sendall(b"stats\r\n")
    data = b""
    while b"\r\n" not in data or len(data) < data.index(b"\r\n") + 2 + int(data.split()[1]) + 2:
        chunk = bs.recv(65536)
        check(chunk, "beanstalk stats: connection closed")
        data += chunk
    yaml = dict(line.split(": ", 1) for line in data.decode().split("\r\n")[1].splitlines()[1:])
    status, _, body = srv.get("/stats")
    check_eq(status, 200, "GET /stats")
    js = json.loads(body)
    samples = parse_metrics(srv.metrics())[0]
    return {
        "yaml": {c: int(yaml["cmd-" + c]) for c in SHOWN_COMMANDS},
        "json": {c: js["cmd_" + c.replace("-", "_")] for c in SHOWN_COMMANDS},
        "metrics": {c: value(samples, "beangate_commands_total", command=c) for c in SHOWN_COMMANDS},
        # what happened to jobs (not in `stats`: its keys are beanstalkd's)
        "jobs_json": {k: js["total_jobs_" + k] for k in ("reserved", "deleted")},
        "jobs_metrics": {k: value(samples, "beangate_jobs_%s_total" % k) for k in ("reserved", "deleted")},
    }


def test_command_counters_agree_across_protocols():
    """One rule for the cmd-* counters (docs/operations.md): each front-end
    counts a well-formed request once, in the counter of the beanstalk
    command it performs. A put, reserve and delete over beanstalk, HTTP and
    Gearman each move the same counters in `stats` (YAML), GET /stats (JSON)
    and /metrics. `stats` itself is left out: reading the counters counts.
    Each also reserves and deletes one job: total_jobs_reserved and
    total_jobs_deleted (JSON) and beangate_jobs_*_total (/metrics) move by
    one, whichever protocol, and agree."""
    gport = free_port()
    with Server(args=["--gearman-port", str(gport)]) as srv:
        bs = socket.create_connection(("127.0.0.1", srv.tcp_port), timeout=HTTP_TIMEOUT)
        gm = socket.create_connection(("127.0.0.1", gport), timeout=HTTP_TIMEOUT)

        def over_beanstalk():
            got = srv.beanstalk(b"use cc\r\nwatch cc\r\nput abc 0 60 1\r\nput 0 0 60 1\r\nx\r\n"
                                b"reserve\r\n", 5)
            check(b"BAD_FORMAT" in got and b"INSERTED " in got and b"RESERVED " in got,
                  "beanstalk use/watch/put/reserve: %r" % got)
            jid = int(got.split(b"RESERVED ")[1].split()[0])
            check_eq(srv.beanstalk(b"delete %d\r\n" % jid, 1), b"DELETED\r\n", "beanstalk delete")
            # the reserve above was on another connection, which closed: the
            # job went back to ready before this delete
            return {"use": 1, "watch": 1, "put": 1, "reserve": 1, "delete": 1}

        def over_http():
            status, _, _ = srv.request("POST", "/tubes/cc/jobs?priority=abc", body=b"x")
            check_eq(status, 400, "a malformed put (not counted)")
            status, _, _ = srv.request("POST", "/tubes/cc/jobs", body=b"x")
            check_eq(status, 201, "HTTP put")
            status, _, body = srv.request("POST", "/tubes/cc/reservations?timeout=0")
            check_eq(status, 200, "HTTP reserve")
            doc = json.loads(body)
            status, _, _ = srv.request("DELETE", "/jobs/%d?reservation=%s" % (doc["id"], doc["reservation"]))
            check_eq(status, 204, "HTTP delete")
            return {"put": 1, "reserve-with-timeout": 1, "delete": 1}

        def over_gearman():
            gm.sendall(gearman_packet(18, "cc", "", "x"))          # SUBMIT_JOB_BG
            check_eq(gearman_reply(gm)[0], 8, "JOB_CREATED")
            gm.sendall(gearman_packet(1, "cc") + gearman_packet(9))  # CAN_DO, GRAB_JOB
            kind, args = gearman_reply(gm)
            check_eq(kind, 11, "JOB_ASSIGN")
            gm.sendall(gearman_packet(13, args[0], "done") + gearman_packet(16, "sync"))
            check_eq(gearman_reply(gm), (17, [b"sync"]), "ECHO_RES after WORK_COMPLETE")
            return {"put": 1, "watch": 1, "reserve-with-timeout": 1, "delete": 1}

        try:
            before = command_counters(srv, bs)
            for protocol, run in (("beanstalk", over_beanstalk), ("http", over_http),
                                  ("gearman", over_gearman)):
                want = run()
                after = command_counters(srv, bs)
                for rendering in ("yaml", "json", "metrics"):
                    moved = {c: after[rendering][c] - before[rendering][c] for c in SHOWN_COMMANDS
                             if c != "stats" and after[rendering][c] != before[rendering][c]}
                    check_eq(moved, want, "%s: the counters a put, reserve and delete over %s moved"
                             % (rendering, protocol))
                for rendering in ("json", "metrics"):
                    check_eq({c: v for c, v in after[rendering].items() if c != "stats"},
                             {c: v for c, v in after["yaml"].items() if c != "stats"},
                             "%s vs yaml after %s" % (rendering, protocol))
                for rendering in ("jobs_json", "jobs_metrics"):
                    check_eq({k: after[rendering][k] - before[rendering][k] for k in ("reserved", "deleted")},
                             {"reserved": 1, "deleted": 1},
                             "%s: the jobs one reserve and one delete over %s moved" % (rendering, protocol))
                check_eq(after["jobs_metrics"], after["jobs_json"], "jobs: metrics vs json after %s" % protocol)
                before = after
        finally:
            bs.close()
            gm.close()


def stats_json(srv, token=None):
    status, _, body = srv.get("/stats", token=token)
    check_eq(status, 200, "GET /stats")
    return json.loads(body)


def wait_stats(srv, cond, what, limit=5.0):
    """GET /stats once cond(stats) holds (polled, at most limit seconds)."""
    def ready():
        st = stats_json(srv)
        return st if cond(st) else None
    return testlib.wait_until(ready, what, timeout=limit)


def test_stats_connections_and_log_state():
    """GET /stats tells the dashboard the open connections by protocol and
    the log's state: with -b it is enabled, its size grows with the records
    written, and its last sync is recent; with -F it never syncs (null);
    without -b it is off."""
    logdir = tempfile.mkdtemp(prefix="beangate-ops-")
    gport = free_port()
    try:
        with Server(args=["-b", logdir, "--gearman-port", str(gport)]) as srv:
            st = stats_json(srv)
            check_eq((st["binlog_enabled"], st["binlog_failed"]), (True, False), "log enabled and healthy")
            check(isinstance(st["binlog_last_sync_age_ms"], int) and st["binlog_last_sync_age_ms"] >= 0,
                  "last sync age %r" % st["binlog_last_sync_age_ms"])
            size0 = st["binlog_size"]
            check(size0 > 0, "a fresh log has its segment header: %r" % size0)
            srv.beanstalk(b"put 0 0 60 100\r\n" + b"x" * 100 + b"\r\n", 1)
            st = wait_stats(srv, lambda s: s["binlog_size"] >= size0 + 100, "the log grows by the put's body")
            g = socket.create_connection(("127.0.0.1", gport), timeout=HTTP_TIMEOUT)
            b = socket.create_connection(("127.0.0.1", srv.tcp_port), timeout=HTTP_TIMEOUT)
            try:
                g.sendall(b"version\n")
                check(g.recv(100).startswith(b"OK "), "the Gearman port answers")
                b.sendall(b"list-tube-used\r\n")
                check(b.recv(100).startswith(b"USING "), "the beanstalk port answers")
                st = wait_stats(srv, lambda s: s["current_beanstalk_connections"] == 1,
                                "the put's closed connection gone")
                check_eq((st["current_gearman_connections"], st["current_connections"]), (1, 2),
                         "one Gearman and one beanstalk connection open (current_connections: both)")
                check(st["current_http_connections"] >= 1, "HTTP connections %r" % st["current_http_connections"])
            finally:
                g.close()
                b.close()
            wait_stats(srv, lambda s: (s["current_gearman_connections"], s["current_beanstalk_connections"]) == (0, 0),
                       "both closed")
        with Server(args=["-b", logdir, "-F"]) as srv:
            st = stats_json(srv)
            check_eq((st["binlog_enabled"], st["binlog_last_sync_age_ms"]), (True, None), "-F: enabled, never syncs")
        with Server() as srv:
            st = stats_json(srv)
            check_eq((st["binlog_enabled"], st["binlog_size"], st["binlog_last_sync_age_ms"]), (False, 0, None),
                     "without -b")
    finally:
        shutil.rmtree(logdir, ignore_errors=True)


# ---- tests: auth ----------------------------------------------------------------

def check_401(srv, path, token=None, method="GET", body=None):
    headers = {"Authorization": "Bearer " + token} if token else {}
    status, h, b = srv.request(method, path, body=body, headers=headers)
    check_eq(status, 401, "%s %s with token %r" % (method, path, token))
    check((h.get("www-authenticate") or "").startswith('Bearer realm="beangate"'),
          "%s %s: WWW-Authenticate %r" % (method, path, h.get("www-authenticate")))
    check_eq(h.get("content-type"), "application/problem+json", "401 content type")
    check_eq(json.loads(b).get("code"), "UNAUTHORIZED", "401 problem code")


def test_auth_token_file():
    path = token_file("# beangate tokens", "", "  " + TOKEN_A + "  ", "# " + "not-a-token", TOKEN_B)
    try:
        with Server(["--http-token-file", path]) as srv:
            for p in ("/stats", "/tubes", "/openapi.yaml", "/no/such/route", "/jobs/1"):
                check_401(srv, p)
                check_401(srv, p, token="wrong-token")
            check_401(srv, "/stats", token=TOKEN_A + "x")
            check_401(srv, "/stats", token=TOKEN_A[:-1])
            check_401(srv, "/stats", token="not-a-token")
            check_401(srv, "/tubes/ops.auth/jobs", method="POST", body=b"x" * 5000)
            for tok in (TOKEN_A, TOKEN_B):
                status, _, _ = srv.get("/stats", token=tok)
                check_eq(status, 200, "GET /stats with a token of the file")
                status, _, _ = srv.get("/openapi.yaml", token=tok)
                check_eq(status, 200, "GET /openapi.yaml with a token")
            status, _, _ = srv.request("POST", "/tubes/ops.auth/jobs", body=b"hi",
                                       headers={"Authorization": "bearer " + TOKEN_A})
            check_eq(status, 201, "POST a job with the scheme in lower case")
            status, _, _ = srv.request("GET", "/stats", headers={"Authorization": TOKEN_A})
            check_eq(status, 401, "GET /stats with the token but no Bearer scheme")
            # health and metrics stay open
            for p in ("/livez", "/readyz", "/metrics"):
                status, _, _ = srv.get(p)
                check_eq(status, 200, "GET %s without a token" % p)
            samples = parse_metrics(srv.metrics())[0]
            check_eq(value(samples, "beangate_http_requests_total", route="/stats", method="GET",
                           status="401"), 6.0, "401s counted in beangate_http_requests_total")
            # the beanstalk protocol is not affected
            check(srv.beanstalk(b"list-tubes\r\n", 1).startswith(b"OK "), "beanstalk without auth")
    finally:
        os.unlink(path)


def test_auth_env_tokens():
    env = {"BEANGATE_HTTP_TOKENS": " %s , ,%s " % (TOKEN_ENV, TOKEN_B)}
    with Server(env=env) as srv:
        check_401(srv, "/stats")
        check_401(srv, "/stats", token=TOKEN_A)
        for tok in (TOKEN_ENV, TOKEN_B):
            status, _, _ = srv.get("/stats", token=tok)
            check_eq(status, 200, "GET /stats with a token of BEANGATE_HTTP_TOKENS")
        status, _, _ = srv.get("/readyz")
        check_eq(status, 200, "GET /readyz without a token")


def test_auth_file_and_env_together():
    path = token_file(TOKEN_A)
    try:
        env = {"BEANGATE_HTTP_TOKEN_FILE": path, "BEANGATE_HTTP_TOKENS": TOKEN_ENV}
        with Server(env=env) as srv:
            for tok in (TOKEN_A, TOKEN_ENV):
                status, _, _ = srv.get("/tubes", token=tok)
                check_eq(status, 200, "GET /tubes with either token")
            check_401(srv, "/tubes", token=TOKEN_B)
    finally:
        os.unlink(path)


def test_metrics_auth():
    path = token_file(TOKEN_A)
    try:
        with Server(["--http-token-file", path, "--metrics-auth"]) as srv:
            check_401(srv, "/metrics")
            check_401(srv, "/metrics", token=TOKEN_B)
            srv.metrics(token=TOKEN_A)
            for p in ("/livez", "/readyz"):
                status, _, _ = srv.get(p)
                check_eq(status, 200, "GET %s without a token under --metrics-auth" % p)
        with Server(["--http-token-file", path], env={"BEANGATE_METRICS_AUTH": "1"}) as srv:
            check_401(srv, "/metrics")
            srv.metrics(token=TOKEN_A)
    finally:
        os.unlink(path)


def test_auth_dashboard_files_are_open():
    """With tokens on, the dashboard's files need none (they hold no data)
    and an unknown one is 404 without a token; the API they call, the page
    of tube stats included, still needs one."""
    path = token_file(TOKEN_A)
    try:
        with Server(["--http-token-file", path]) as srv:
            for p in ("/ui/", "/ui/index.html", "/ui/favicon.svg"):
                status, h, body = srv.get(p)
                check_eq(status, 200, "GET %s without a token" % p)
                check(body, "GET %s: a body" % p)
            status, h, _ = srv.get("/ui")
            check_eq((status, h.get("location")), (301, "ui/"), "GET /ui without a token")
            status, _, _ = srv.get("/ui/nope.js")
            check_eq(status, 404, "GET /ui/nope.js without a token")
            for p in ("/stats/tubes", "/stats", "/tubes"):
                check_401(srv, p)
            status, _, _ = srv.get("/stats/tubes", token=TOKEN_A)
            check_eq(status, 200, "GET /stats/tubes with the token")
    finally:
        os.unlink(path)


def test_no_tokens_means_open():
    with Server() as srv:
        for p in ("/stats", "/tubes", "/openapi.yaml", "/metrics"):
            status, _, _ = srv.get(p)
            check_eq(status, 200, "GET %s without any token configured" % p)


def test_bad_token_sources_exit_5():
    empty = token_file("# only a comment", "", "   ")
    try:
        cases = [
            (["--http-token-file", "/nonexistent/beangate-tokens"], {}, "/nonexistent/beangate-tokens"),
            (["--http-token-file", empty], {}, "token"),
            ([], {"BEANGATE_HTTP_TOKENS": " , "}, "BEANGATE_HTTP_TOKENS"),
            ([], {"BEANGATE_HTTP_TOKENS": "a" * 600}, "BEANGATE_HTTP_TOKENS"),
        ]
        for args, env, word in cases:
            rc, _, err = run_binary(["-p", str(free_port()), "--http-port", str(free_port())] + args,
                                    env=env)
            check(rc == 5, "%r %r: exit status %r, want 5; stderr %r" % (args, env, rc, err[-500:]))
            check(word in err, "%r %r: stderr does not name %r: %r" % (args, env, word, err[-500:]))
            check("a" * 600 not in err, "a token value was printed")
    finally:
        os.unlink(empty)


# ---- tests: configuration --------------------------------------------------------

def test_env_sets_ports():
    tcp, http_port = free_port(), free_port()
    env = {"BEANGATE_PORT": str(tcp), "BEANGATE_HTTP_PORT": str(http_port)}
    with Server(env=env, ports=False, tcp_port=tcp, http_port=http_port) as srv:
        check(srv.beanstalk(b"list-tubes\r\n", 1).startswith(b"OK "), "beanstalk on BEANGATE_PORT")
        status, _, _ = srv.get("/livez")
        check_eq(status, 200, "HTTP on BEANGATE_HTTP_PORT")


def test_flag_overrides_env():
    env_tcp, flag_tcp = free_port(), free_port()
    env_http, flag_http = free_port(), free_port()
    env = {"BEANGATE_PORT": str(env_tcp), "BEANGATE_HTTP_PORT": str(env_http),
           "BEANGATE_MAX_JOB_SIZE": "100"}
    with Server(["-p", str(flag_tcp), "--http-port", str(flag_http), "-z", "200"], env=env,
                ports=False, tcp_port=flag_tcp, http_port=flag_http) as srv:
        check(not port_open(env_tcp), "something listens on BEANGATE_PORT although -p was given")
        check(not port_open(env_http), "something listens on BEANGATE_HTTP_PORT although --http-port was given")
        stats = srv.beanstalk(b"stats\r\n", 2)
        check(b"\nmax-job-size: 200\n" in stats, "-z 200 must win over BEANGATE_MAX_JOB_SIZE=100: %r"
              % stats[:200])


def test_env_no_http_and_listen():
    tcp = free_port()
    http_port = free_port()
    with Server(["-p", str(tcp), "--http-port", str(http_port)],
                env={"BEANGATE_NO_HTTP": "true", "BEANGATE_LISTEN": "127.0.0.1"}, ports=False,
                tcp_port=tcp) as srv:
        # a round trip: the loop runs, so every listener the server opens is open
        check(srv.beanstalk(b"list-tube-used\r\n", 1) == b"USING default\r\n", "beanstalk round trip")
        check(not port_open(http_port), "HTTP listens although BEANGATE_NO_HTTP=true")


def test_bad_env_exits_5():
    for var, val in (("BEANGATE_PORT", "abc"), ("BEANGATE_PORT", "70000"),
                     ("BEANGATE_HTTP_PORT", "-1"), ("BEANGATE_MAX_JOB_SIZE", "12k"),
                     ("BEANGATE_VERBOSE", "lots"), ("BEANGATE_NO_HTTP", "maybe"),
                     ("BEANGATE_METRICS_AUTH", "2"), ("BEANGATE_FSYNC_MS", "-5"),
                     ("BEANGATE_NO_FSYNC", "sometimes"), ("BEANGATE_BINLOG_SIZE", "0")):
        # the flags give free ports, so a binary that took the value would not
        # take the default ports; a bad value is fatal even when a flag wins
        rc, _, err = run_binary(["-p", str(free_port()), "--http-port", str(free_port())],
                                env={var: val}, timeout=5)
        check(rc == 5, "%s=%s: exit status %r, want 5; stderr %r" % (var, val, rc, err[-500:]))
        check(var in err, "%s=%s: the message does not name the variable: %r" % (var, val, err[-500:]))
    # -h still works with a bad variable; a bad flag still exits 5
    rc, out, _ = run_binary(["-h"], env={"BEANGATE_PORT": "abc"})
    check_eq(rc, 0, "-h with a bad BEANGATE_PORT")
    rc, _, _ = run_binary(["-z", "abc"])
    check_eq(rc, 5, "-z abc")


def test_http_max_wait_setting():
    """--http-max-wait SECONDS (BEANGATE_HTTP_MAX_WAIT) caps a long-poll's
    wait: 1 to 3600, else exit status 5 naming the setting; the variable
    sets it, the flag wins over the variable."""
    bad = [(["--http-max-wait", v], {}, "--http-max-wait") for v in ("0", "3601", "1s", "-1", "")]
    bad += [(["--http-max-wait=99999999999999999999"], {}, "--http-max-wait")]
    bad += [([], {"BEANGATE_HTTP_MAX_WAIT": v}, "BEANGATE_HTTP_MAX_WAIT") for v in ("0", "3601", "x")]
    for args, env, name in bad:
        rc, _, err = run_binary(["-p", str(free_port()), "--http-port", str(free_port())] + args,
                                env=env, timeout=5)
        check(rc == 5, "%r %r: exit status %r, want 5; stderr %r" % (args, env, rc, err[-500:]))
        check(name in err, "%r %r: the message does not name %s: %r" % (args, env, name, err[-500:]))
    for args, env in (([], {"BEANGATE_HTTP_MAX_WAIT": "1"}),
                      (["--http-max-wait", "1"], {"BEANGATE_HTTP_MAX_WAIT": "3600"}),
                      (["--http-max-wait=1"], {})):
        with Server(args, env=env) as srv:
            t0 = time.monotonic()
            status, _, _ = srv.request("POST", "/tubes/maxwait/reservations?timeout=60",
                                       timeout=HTTP_TIMEOUT + 60)
            took = time.monotonic() - t0
        check_eq(status, 204, "%r %r: long-poll on an empty tube" % (args, env))
        check(0.9 <= took <= 3.0, "%r %r: timeout=60 answered after %.2f s, want the 1 s cap"
              % (args, env, took))


# A start that reads every setting and then fails at its first listener (a
# UNIX socket in a directory that does not exist): status 111 and the -V
# config line if the settings were accepted, 5 if one was refused. No port
# is bound, so any port number can be tried.
UNREACHABLE = "unix:/nonexistent-beangate-dir/sock"


def settings_of(args, env=None):
    """(exit status, the config line's key=value pairs or None, stderr) of a
    start with args (and -V) that reads its settings, then cannot listen."""
    rc, _, err = run_binary(["-l", UNREACHABLE, "-V"] + list(args), env=env, timeout=10)
    lines = [l for l in err.splitlines() if " event=config " in l]
    config = dict(kv.split("=", 1) for kv in lines[0].split()[3:]) if lines else None
    return rc, config, err


# (flags, variables, the config line's values, or None: refused with status 5
# naming the flag or variable, and a log event that must be on stderr)
SETTING_LIMITS = [
    (["-p", "65535"], {}, {"port": "65535"}, None),
    (["-p", "65536"], {}, None, "-p"),
    (["-p", "0"], {}, {"port": "0"}, None),
    ([], {"BEANGATE_PORT": "65535"}, {"port": "65535"}, None),
    ([], {"BEANGATE_PORT": "65536"}, None, "BEANGATE_PORT"),
    (["--http-port", "65535"], {}, {"http_port": "65535"}, None),
    (["--http-port", "65536"], {}, None, "--http-port"),
    (["--http-port=65536"], {}, None, "--http-port"),
    (["--http-port", "http"], {}, None, "--http-port"),
    ([], {"BEANGATE_HTTP_PORT": "65535"}, {"http_port": "65535"}, None),
    ([], {"BEANGATE_HTTP_PORT": "65536"}, None, "BEANGATE_HTTP_PORT"),
    (["--gearman-port", "65535"], {}, {"gearman_port": "65535", "gearman": "on"}, None),
    (["--gearman-port", "65536"], {}, None, "--gearman-port"),
    ([], {"BEANGATE_GEARMAN_PORT": "65536"}, None, "BEANGATE_GEARMAN_PORT"),
    # -z: up to 1 GiB as given, above it lowered with a warning (beanstalkd)
    (["-z", "1073741824"], {}, {"max_job_size": "1073741824"}, None),
    (["-z", "1073741825"], {}, {"max_job_size": "1073741824"}, "event=max_job_size_clamped from=-z"),
    (["-z", "9" * 30], {}, {"max_job_size": "1073741824"}, "event=max_job_size_clamped from=-z"),
    ([], {"BEANGATE_MAX_JOB_SIZE": "1073741825"}, {"max_job_size": "1073741824"},
     "event=max_job_size_clamped from=BEANGATE_MAX_JOB_SIZE"),
    (["-z", "0"], {}, {"max_job_size": "0"}, None),
    (["-z", "12k"], {}, None, "-z"),
    # -f: 0 to 10^9 ms, in both of beanstalkd's forms
    (["-f", "0"], {}, {"fsync_ms": "0"}, None),
    (["-f0"], {}, {"fsync_ms": "0"}, None),
    (["-f", "1000000000"], {}, {"fsync_ms": "1000000000"}, None),
    (["-f1000000001"], {}, None, "-f"),
    ([], {"BEANGATE_FSYNC_MS": "1000000000"}, {"fsync_ms": "1000000000"}, None),
    ([], {"BEANGATE_FSYNC_MS": "1000000001"}, None, "BEANGATE_FSYNC_MS"),
    (["-F", "-f", "10"], {}, {"fsync_ms": "10", "fsync_never": "off"}, None),
    (["-f", "10", "-F"], {}, {"fsync_ms": "10", "fsync_never": "on"}, None),
    # -s: at least 1, rounded up to 4096
    (["-s", "1"], {}, {"binlog_size": "4096"}, None),
    (["-s4097"], {}, {"binlog_size": "8192"}, None),
    (["-s", "0"], {}, None, "-s"),
    # -V and its count
    ([], {"BEANGATE_VERBOSE": "100"}, {"verbose": "1"}, None),   # -V replaces it
    ([], {"BEANGATE_VERBOSE": "101"}, None, "BEANGATE_VERBOSE"),
    # --http-max-wait: 1 to 3600 seconds
    (["--http-max-wait", "1"], {}, {"http_max_wait": "1"}, None),
    (["--http-max-wait=3600"], {}, {"http_max_wait": "3600"}, None),
    (["--http-max-wait", "0"], {}, None, "--http-max-wait"),
    (["--http-max-wait", "3601"], {}, None, "--http-max-wait"),
    ([], {"BEANGATE_HTTP_MAX_WAIT": "3600"}, {"http_max_wait": "3600"}, None),
    ([], {"BEANGATE_HTTP_MAX_WAIT": "0"}, None, "BEANGATE_HTTP_MAX_WAIT"),
    # booleans: the words, any case; anything else is refused
    ([], {"BEANGATE_NO_HTTP": "TRUE"}, {"http": "off"}, None),
    ([], {"BEANGATE_NO_HTTP": "off"}, {"http": "on"}, None),
    ([], {"BEANGATE_NO_HTTP": "2"}, None, "BEANGATE_NO_HTTP"),
    ([], {"BEANGATE_NO_FSYNC": "Yes"}, {"fsync_never": "on"}, None),
    ([], {"BEANGATE_NO_FSYNC": "y"}, None, "BEANGATE_NO_FSYNC"),
    ([], {"BEANGATE_METRICS_AUTH": "on"}, {"metrics_auth": "on"}, None),
    ([], {"BEANGATE_GEARMAN_ADMIN_SHUTDOWN": "nope"}, None, "BEANGATE_GEARMAN_ADMIN_SHUTDOWN"),
    (["--no-http=1"], {}, None, "--no-http"),
    # an empty variable counts as unset
    ([], {"BEANGATE_PORT": "", "BEANGATE_HTTP_PORT": "", "BEANGATE_NO_HTTP": "",
          "BEANGATE_MAX_JOB_SIZE": "", "BEANGATE_HTTP_MAX_WAIT": ""},
     {"port": "11300", "http_port": "11301", "http": "on", "max_job_size": "65535",
      "http_max_wait": "30"}, None),
    # the command line wins over the environment, which wins over the default
    (["-p", "2345", "--http-port", "2346", "-z", "200", "--http-max-wait", "5"],
     {"BEANGATE_PORT": "1234", "BEANGATE_HTTP_PORT": "1235", "BEANGATE_MAX_JOB_SIZE": "100",
      "BEANGATE_HTTP_MAX_WAIT": "9", "BEANGATE_GEARMAN_LISTEN": "127.0.0.2"},
     {"port": "2345", "http_port": "2346", "max_job_size": "200", "http_max_wait": "5",
      "gearman": "on", "gearman_listen": "127.0.0.2", "gearman_port": "4730"}, None),
    # --shard K/N: N 1 to 1024, K 0 to N-1, exactly two decimals and a slash
    (["--shard", "0/1"], {}, {"shard": "0/1"}, None),
    (["--shard", "1023/1024"], {}, {"shard": "1023/1024"}, None),
    (["--shard=02/3"], {}, {"shard": "2/3"}, None),
    ([], {"BEANGATE_SHARD": "1/3"}, {"shard": "1/3"}, None),
    (["--shard", "2/5"], {"BEANGATE_SHARD": "1/3"}, {"shard": "2/5"}, None),
    (["--shard", "3/3"], {}, None, "--shard"),
    (["--shard", "0/0"], {}, None, "--shard"),
    (["--shard", "0/1025"], {}, None, "--shard"),
    (["--shard", "1"], {}, None, "--shard"),
    (["--shard", "1/3/5"], {}, None, "--shard"),
    (["--shard", "-1/3"], {}, None, "--shard"),
    (["--shard", " 1/3"], {}, None, "--shard"),
    (["--shard", "1/"], {}, None, "--shard"),
    ([], {"BEANGATE_SHARD": "3/2"}, None, "BEANGATE_SHARD"),
    # ... and an empty value on the command line is refused, as a missing one
    (["--http-listen="], {}, None, "--http-listen"),
    (["-u", ""], {}, None, "-u"),
]


def test_settings_at_their_limits():
    """Each setting's flag and variable go through the same parser and range:
    the values at the limits are taken, one past them refused with status 5
    (ports by flag were not checked at all: -p 65536 listened on a random
    port), -z above 1 GiB is clamped with a warning, empty variables are
    unset, and the command line wins."""
    for args, env, want, event in SETTING_LIMITS:
        rc, config, err = settings_of(args, env)
        what = "%r %r" % (args, env)
        if want is None:
            check(rc == 5, "%s: exit status %r, want 5 (refused); stderr %r" % (what, rc, err[-600:]))
            check(re.search(r"event=bad_(flag|env) (flag|var)=%s " % re.escape(event), err),
                  "%s: no bad_flag/bad_env line naming %s: %r" % (what, event, err[-600:]))
            continue
        check(rc == 111 and config is not None,
              "%s: exit status %r and config line %r, want 111 after the settings were taken; "
              "stderr %r" % (what, rc, config, err[-600:]))
        got = {k: config.get(k) for k in want}
        check_eq(got, want, "%s: the config line's values" % what)
        if event:
            check(event in err, "%s: no %r on stderr: %r" % (what, event, err[-600:]))
        else:
            check("_clamped" not in err, "%s: a clamp warning: %r" % (what, err[-600:]))


def test_first_argument_commands():
    """--healthcheck and --check-log are commands, read only as the first
    argument: they ignore the other settings' variables (even bad ones),
    refuse anything after them, and are refused elsewhere (status 5)."""
    with Server() as srv:
        for args, env in ((["--healthcheck=127.0.0.1:%d" % srv.http_port], {"BEANGATE_PORT": "abc"}),
                          (["--healthcheck"], {"BEANGATE_HTTP_PORT": str(srv.http_port)})):
            rc, out, err = run_binary(args, env=env)
            check_eq((rc, out), (0, "healthy\n"), "%r %r (stderr %r)" % (args, env, err[-300:]))
        closed = free_port()
        rc, out, _ = run_binary(["--healthcheck=127.0.0.1:%d" % closed])
        check_eq((rc, out), (1, "unhealthy\n"), "--healthcheck of a closed port")
        # the port it uses goes through the same parser as for a server
        rc, _, err = run_binary(["--healthcheck"], env={"BEANGATE_HTTP_PORT": "65536"})
        check(rc == 5 and "event=bad_env var=BEANGATE_HTTP_PORT" in err,
              "--healthcheck with BEANGATE_HTTP_PORT=65536: status %r, stderr %r" % (rc, err[-300:]))
    with tempfile.TemporaryDirectory(prefix="beangate-check-log-") as empty:
        rc, out, err = run_binary(["--check-log=" + empty])
        check_eq(rc, 0, "--check-log=DIR of an empty directory (stdout %r, stderr %r)" % (out, err[-300:]))
        for args in (["-V", "--healthcheck"], ["-V", "--check-log", empty], ["--healthcheck", "x"],
                     ["--healthcheck=127.0.0.1:1", "-V"], ["--check-log"], ["--check-log="],
                     ["--check-log", empty, "-V"], ["--check-log=" + empty, "x"]):
            rc, _, err = run_binary(args)
            check(rc == 5 and "event=bad_flag" in err, "%r: exit status %r, want 5 with a bad_flag line; "
                  "stderr %r" % (args, rc, err[-300:]))


def usage_settings():
    """Every setting of `beangate -h` (which prints config.c's table):
    [(flags, variable or None, default or None)]."""
    rc, out, _ = run_binary(["-h"])
    check_eq(rc, 0, "-h exit status")
    entries = []
    for line in out.splitlines():
        m = re.match(r"^ (-\S.*?)?\s*(BEANGATE_[A-Z_]+)=\S+$", line) or re.match(r"^ (-\S.*)()$", line)
        if m:
            flags = [re.split(r"[ \[]", f)[0] for f in (m.group(1) or "").split(", ") if f]
            entries.append([flags, m.group(2) or None, None])
        elif entries and line.startswith("      "):
            d = re.search(r"default ([^,)\s]+)\)", line)
            if d and entries[-1][2] is None:
                entries[-1][2] = d.group(1)
    check(len(entries) >= 20, "only %d settings found in -h: %r" % (len(entries), out[:3000]))
    return entries


def man_entries(man):
    """The .TP entries of the man page: (tag line, text)."""
    blocks = man.split("\n.TP\n")[1:]
    return [(b.split("\n", 1)[0], b) for b in blocks]


def test_docs_list_every_setting():
    """docs/beangate.1 and the settings tables of docs/operations.md and
    docs/user-guide.md name every flag, variable and default that config.c's
    table has (through -h), so the documents cannot drift from the code."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(repo, "docs", "beangate.1"), encoding="utf-8") as f:
        man = f.read()
    tables = {}
    for doc in ("operations.md", "user-guide.md"):
        with open(os.path.join(repo, "docs", doc), encoding="utf-8") as f:
            tables[doc] = [l for l in f.read().splitlines() if l.startswith("| ")]
    entries = man_entries(man)
    for flags, var, default in usage_settings():
        what = " ".join(flags) or var
        for flag in flags:
            roff = flag.replace("-", "\\-")
            tagged = [text for tag, text in entries if re.search(re.escape(roff) + r"(?![\w\\])", tag)]
            check(tagged, "beangate.1 has no entry for %s" % flag)
            if default:
                check(any(default in t for t in tagged),
                      "beangate.1's entry for %s does not give its default %s" % (flag, default))
        if var:
            check(any(re.search(r"\b%s\b" % var, tag) for tag, _ in entries),
                  "beangate.1 has no entry for %s" % var)
        for doc, lines in tables.items():
            # a name ends where no name character follows: --push is not --push-file
            named = lambda name, cell: re.search(r"`%s(?![\w-])" % re.escape(name), cell)  # noqa: E731
            rows = [l for l in lines if all(named(f, l.split("|")[1]) for f in flags)
                    and (flags or not l.split("|")[1].strip())
                    and (not var or named(var, l.split("|")[2]))]
            check(len(rows) == 1, "%s: want one settings row with %s %s, found %r"
                  % (doc, " ".join(flags), var or "", rows))
            if default:
                check("`%s`" % default in rows[0], "%s's row for %s lacks the default `%s`: %r"
                      % (doc, what, default, rows[0]))


def test_help_lists_env():
    rc, out, _ = run_binary(["--help"])
    check_eq(rc, 0, "--help exit status")
    for word in ("-l ADDR", "--http-token-file", "--metrics-auth", "BEANGATE_LISTEN", "BEANGATE_PORT",
                 "BEANGATE_USER", "BEANGATE_MAX_JOB_SIZE", "BEANGATE_VERBOSE", "BEANGATE_HTTP_LISTEN",
                 "BEANGATE_HTTP_PORT", "BEANGATE_NO_HTTP", "BEANGATE_HTTP_TOKEN_FILE",
                 "BEANGATE_HTTP_TOKENS", "BEANGATE_METRICS_AUTH", "BEANGATE_BINLOG_DIR",
                 "BEANGATE_FSYNC_MS", "BEANGATE_NO_FSYNC", "BEANGATE_BINLOG_SIZE",
                 "--http-max-wait", "BEANGATE_HTTP_MAX_WAIT"):
        check(word in out, "--help does not mention %s" % word)
    check("command line" in out and "environment" in out, "--help does not tell the precedence")


def test_verbose_logs_config_without_tokens():
    path = token_file(TOKEN_A, TOKEN_B)
    try:
        env = {"BEANGATE_HTTP_TOKENS": TOKEN_ENV, "BEANGATE_MAX_JOB_SIZE": "1234"}
        with Server(["-V", "--http-token-file", path], env=env) as srv:
            pass
        err = srv.stderr_text
        lines = [l for l in err.splitlines() if "event=config " in l]
        check(len(lines) == 1, "want one event=config line with -V, stderr: %r" % err[-2000:])
        line = lines[0]
        for want in ("level=info", "port=%d" % srv.tcp_port, "http_port=%d" % srv.http_port,
                     "max_job_size=1234", "http_tokens=3", "http_token_file=%s" % path,
                     "verbose=1", "metrics_auth=off", "http_max_wait=30"):
            check(want in line, "config line lacks %r: %r" % (want, line))
        for tok in (TOKEN_A, TOKEN_B, TOKEN_ENV):
            check(tok not in err, "a token value is on stderr: %r" % err[-2000:])
        # every log line is key=value pairs with level= and event=
        for l in err.splitlines():
            if l.startswith("ts="):
                check(re.match(r"^ts=\S+ level=(error|warn|info|debug) event=[a-z_]+( |$)", l),
                      "log line not in the format: %r" % l)
        # without -V: no info lines
        with Server() as quiet:
            pass
        check("level=info" not in quiet.stderr_text, "info lines without -V: %r" % quiet.stderr_text)
        # BEANGATE_VERBOSE=2 gives debug lines (one per request)
        with Server(env={"BEANGATE_VERBOSE": "2"}) as loud:
            loud.get("/livez")
        check("level=debug event=http_request" in loud.stderr_text and 'route=/livez' in loud.stderr_text,
              "no debug request line with BEANGATE_VERBOSE=2: %r" % loud.stderr_text[-1500:])
    finally:
        os.unlink(path)


# ---- runner ---------------------------------------------------------------------------

TESTS = [
    test_livez_readyz,
    test_health_methods,
    test_metrics_content,
    test_metrics_long_poll_latency,
    test_metrics_tube_cap,
    test_promtool_check_metrics,
    test_promtool_push_metrics,
    test_metrics_binlog_and_gearman,
    test_stats_connections_and_log_state,
    test_command_counters_agree_across_protocols,
    test_auth_token_file,
    test_auth_env_tokens,
    test_auth_file_and_env_together,
    test_metrics_auth,
    test_auth_dashboard_files_are_open,
    test_no_tokens_means_open,
    test_bad_token_sources_exit_5,
    test_env_sets_ports,
    test_flag_overrides_env,
    test_env_no_http_and_listen,
    test_bad_env_exits_5,
    test_http_max_wait_setting,
    test_help_lists_env,
    test_settings_at_their_limits,
    test_first_argument_commands,
    test_docs_list_every_setting,
    test_verbose_logs_config_without_tokens,
]


def main(argv):
    global BINARY
    args = testlib.parse_args(testlib.arg_parser(__doc__), argv)
    BINARY = args.binary
    return testlib.run("ops", TESTS, args, namespace=globals())


if __name__ == "__main__":
    sys.exit(main(sys.argv))
