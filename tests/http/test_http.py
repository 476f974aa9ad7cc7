#!/usr/bin/env python3
"""Integration tests of beangate's HTTP/JSON gateway, over real HTTP.

Usage:
  python3 tests/http/test_http.py build/beangate
      starts the binary on free loopback ports (TCP and HTTP) and runs every
      test against it; the server is stopped with SIGTERM at the end and must
      exit with status 0.

  python3 tests/http/test_http.py build/beangate --base-url URL \\
          --direct-url URL --tcp-port N [--server-pid PID]
      uses an already running server, reached through URL for HTTP (for
      example a `prism proxy` in front of it, see tests/http/run_contract.sh).
      The server's own HTTP address (--direct-url) and TCP port (--tcp-port)
      are still needed:
        * the cross-protocol tests talk beanstalk to --tcp-port;
        * requests the document itself declares invalid (bad numbers, bad
          tube names, unknown paths, wrong methods, malformed JSON), which a
          validating proxy refuses without forwarding, go to --direct-url, and
          so do raw-socket tests (413 before the body, a client that hangs up
          during a long-poll) and non-UTF-8 bodies (a proxy that parses bodies
          as text may change them);
        * the drain test sends SIGUSR1 to --server-pid (skipped without it).
      Any response carrying an `sl-violations` header (prism answers 500 with
      it when a response breaks the document) fails the test that got it, and
      the violation is printed; so does an error that prism made up itself
      (a `https://stoplight.io/prism/errors#...` problem).

The binary (argv[1]) is also used for tests that need a server of their own
(`--no-http`). Python 3 standard library only. The runner is
tests/lib/testlib.py's: -k NAME runs one test, PASS/FAIL/SKIP per test, the
last line is `http: N passed, M failed, K skipped`; exits 1 on failure. The
long-poll cap is checked on a server of its own started with --http-max-wait 1.
"""

import base64
import contextlib
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import testlib  # noqa: E402
from testlib import SANITIZER_MARKERS, check, close_quietly, first_difference, free_port, signal_and_wait  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
OPENAPI_PATH = os.path.join(REPO, "openapi", "openapi.yaml")

HTTP_TIMEOUT = 10.0       # every HTTP exchange gives up after this (plus any long-poll wait)
TCP_TIMEOUT = 5.0         # every beanstalk socket read gives up after this
START_TIMEOUT = 10.0
STOP_TIMEOUT = 5.0
WAKE_LIMIT = 1.0          # a long-poll must answer within this after the put

DEFAULT_PRIORITY = 2147483648
DEFAULT_TTR = 60
JOB_KEYS = {"id", "tube", "state", "priority", "age", "delay", "ttr", "time_left",
            "reserves", "timeouts", "releases", "buries", "kicks"}
TUBE_KEYS = {"name", "current_jobs_urgent", "current_jobs_ready", "current_jobs_reserved",
             "current_jobs_delayed", "current_jobs_buried", "total_jobs", "current_using",
             "current_watching", "current_waiting", "cmd_delete", "cmd_pause_tube", "pause",
             "pause_time_left", "rates"}
HISTORY_SERIES = ("put", "reserve", "delete", "ready", "reserved", "delayed", "buried", "connections")
HISTORY_SAMPLES = 900
SERVER_KEYS = {
    "current_jobs_urgent", "current_jobs_ready", "current_jobs_reserved",
    "current_jobs_delayed", "current_jobs_buried", "cmd_put", "cmd_peek", "cmd_peek_ready",
    "cmd_peek_delayed", "cmd_peek_buried", "cmd_reserve", "cmd_reserve_with_timeout",
    "cmd_delete", "cmd_release", "cmd_use", "cmd_watch", "cmd_ignore", "cmd_bury", "cmd_kick",
    "cmd_touch", "cmd_stats", "cmd_stats_job", "cmd_stats_tube", "cmd_list_tubes",
    "cmd_list_tube_used", "cmd_list_tubes_watched", "cmd_pause_tube", "job_timeouts",
    "total_jobs", "max_job_size", "current_tubes", "current_connections", "current_producers",
    "current_workers", "current_waiting", "total_connections", "draining",
    "binlog_failed", "binlog_oldest_index", "binlog_current_index", "binlog_records_migrated",
    "binlog_records_written", "binlog_max_size", "binlog_torn_records",
    # beyond beanstalk's keys, for the dashboard
    "version", "uptime", "current_beanstalk_connections", "current_gearman_connections",
    "current_http_connections", "total_jobs_reserved", "total_jobs_deleted", "cross_protocol_closed",
    "permission_denied",
    "binlog_enabled", "binlog_size", "binlog_unlink_failures",
    "binlog_disk_attempts", "binlog_disk_failures", "binlog_disk_retries", "binlog_disk_bytes",
    "binlog_stream_attempts", "binlog_stream_failures", "binlog_stream_retries", "binlog_stream_bytes",
    "binlog_last_sync_age_ms", "subscriptions", "shard_index", "shard_count"}
SERVER_KEYS_NOT_COUNTS = {"draining", "binlog_failed", "version", "binlog_enabled", "binlog_last_sync_age_ms",
                          "subscriptions"}
PROBLEM_KEYS = {"type", "title", "status", "detail", "code"}
# The server under test has one push subscription (tests/http/run_contract.sh
# starts it with the same flag): jobs of PUSH_TUBE go to a port where nothing
# listens, and one failed attempt buries them.
PUSH_TUBE = "http-push"
PUSH_ARGS = ["--push", "tube=%s url=http://127.0.0.1:1/ attempts=1" % PUSH_TUBE]
SUBSCRIPTION_KEYS = {"tube", "url", "concurrency", "rate", "timeout", "attempts", "backoff_min", "backoff_max",
                     "signed", "in_flight", "backing_off", "last_error", "attempts_started", "delivered",
                     "retried", "buried", "retried_by_reason", "buried_by_reason", "reservations_lost"}


Skip = testlib.Skip  # raised by a test that cannot run in this mode; the message says why


class Target:
    """Where the tests send their requests."""
    binary = None
    base = None          # (host, port) for HTTP, maybe a proxy
    direct = None        # (host, port) of the server's own HTTP listener
    tcp_port = None
    server_pid = None
    proxied = False      # base != direct


T = Target()
VIOLATIONS = []          # every sl-violations / prism-made error seen, for the summary
VIOLATIONS_LOCK = threading.Lock()


# ---- assertions ----------------------------------------------------------------

def _bytes_diff(got, want, what):
    i = first_difference(got, want)
    return ("%s: got %d bytes, want %d (first difference at byte %d: got %r, want %r)"
            % (what, len(got), len(want), i, bytes(got[max(0, i - 20):i + 20]),
               bytes(want[max(0, i - 20):i + 20])))


def check_eq(got, want, what):
    testlib.check_eq(got, want, what, bytes_diff=_bytes_diff)


def uniq(prefix):
    """A tube name (or key) no other test uses."""
    return "%s.%08x" % (prefix, random.getrandbits(32))


# ---- HTTP ---------------------------------------------------------------------------

class Resp:
    def __init__(self, status, reason, headers, body, elapsed, url):
        self.status = status
        self.reason = reason
        self.headers = headers        # list of (name, value)
        self.body = body
        self.elapsed = elapsed
        self.url = url

    def header(self, name):
        name = name.lower()
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return None

    def json(self):
        try:
            return json.loads(self.body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise AssertionError("%s: body is not JSON (%s): %r" % (self.url, e, self.body[:300])) from None

    def describe(self):
        return "%d %s, headers %s, body %r" % (self.status, self.reason, dict(self.headers), self.body[:400])


def prism_problem(resp):
    """The message of an error prism made up (or None)."""
    viol = resp.header("sl-violations")
    if viol:
        return "contract violation (sl-violations) on %s: %s" % (resp.url, viol)
    ctype = resp.header("content-type") or ""
    if "problem+json" in ctype and b"stoplight.io/prism/errors" in resp.body:
        try:
            doc = json.loads(resp.body.decode("utf-8"))
        except ValueError:
            doc = {}
        return "the proxy refused or failed %s: %s %s: %s; %s" % (
            resp.url, doc.get("status"), doc.get("title"), doc.get("detail"),
            json.dumps(doc.get("validation", "")))
    return None


def request(method, path, body=None, headers=None, via="base", timeout=HTTP_TIMEOUT):
    """One HTTP exchange on a new connection. via: "base" (maybe a proxy),
    "direct" (the server itself), or the (host, port) of another server."""
    host, port = T.base if via == "base" else T.direct if via == "direct" else via
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    hdrs = dict(headers or {})
    if body is not None and not any(k.lower() == "content-type" for k in hdrs):
        hdrs["Content-Type"] = "application/octet-stream"
    url = "http://%s:%d%s" % (host, port, path)
    t0 = time.monotonic()
    try:
        conn.request(method, path, body=body, headers=hdrs)
        r = conn.getresponse()
        data = r.read()
        resp = Resp(r.status, r.reason, r.getheaders(), data, time.monotonic() - t0,
                    "%s %s" % (method, url))
    except socket.timeout:
        raise AssertionError("%s %s: no answer within %.1f s" % (method, url, timeout)) from None
    except (ConnectionError, http.client.HTTPException) as e:
        raise AssertionError("%s %s: %s: %s" % (method, url, type(e).__name__, e)) from None
    finally:
        conn.close()
    msg = prism_problem(resp)
    if msg:
        with VIOLATIONS_LOCK:
            VIOLATIONS.append(msg)
        raise AssertionError(msg)
    return resp


def get(path, **kw):
    return request("GET", path, **kw)


def post(path, body=None, **kw):
    return request("POST", path, body=body, **kw)


def delete(path, **kw):
    return request("DELETE", path, **kw)


def post_json(path, doc, **kw):
    hdrs = dict(kw.pop("headers", {}) or {})
    hdrs["Content-Type"] = "application/json"
    data = doc if isinstance(doc, (bytes, bytearray)) else json.dumps(doc).encode()
    return request("POST", path, body=data, headers=hdrs, **kw)


def q(**params):
    """?a=1&b=2 from keyword arguments (None left out)."""
    items = [(k, str(v)) for k, v in params.items() if v is not None]
    return "?" + urllib.parse.urlencode(items, safe=",") if items else ""


def expect_status(resp, status, what):
    if resp.status != status:
        raise AssertionError("%s: status %d, want %d; %s" % (what, resp.status, status, resp.describe()))


def expect_json(resp, status, what):
    expect_status(resp, status, what)
    ctype = resp.header("content-type") or ""
    check(ctype.split(";")[0].strip() == "application/json",
          "%s: Content-Type %r, want application/json" % (what, ctype))
    return resp.json()


def expect_problem(resp, status, code, what):
    """An application/problem+json error with the given status and code."""
    expect_status(resp, status, what)
    ctype = resp.header("content-type") or ""
    check(ctype.split(";")[0].strip() == "application/problem+json",
          "%s: Content-Type %r, want application/problem+json" % (what, ctype))
    doc = resp.json()
    check(isinstance(doc, dict), "%s: problem is not an object: %r" % (what, doc))
    check_eq(set(doc), PROBLEM_KEYS, "%s: problem keys" % what)
    check_eq(doc["status"], status, "%s: problem status" % what)
    check_eq(doc["code"], code, "%s: problem code" % what)
    check(isinstance(doc["type"], str) and doc["type"], "%s: problem type %r" % (what, doc["type"]))
    check(isinstance(doc["title"], str) and doc["title"], "%s: problem title %r" % (what, doc["title"]))
    check(isinstance(doc["detail"], str), "%s: problem detail %r" % (what, doc["detail"]))
    if status == 503:
        ra = resp.header("Retry-After")
        check(ra is not None and ra.strip().isdigit(), "%s: Retry-After %r, want seconds" % (what, ra))
    if status == 405:
        check(resp.header("Allow"), "%s: no Allow header" % what)
    return doc


def check_job(doc, what, body=None, reserved=False, with_body=None):
    """A job JSON: the stats keys; plus `reservation` when reserved; plus
    exactly one of body/body_base64 when with_body (default: when reserved or
    body is given), which must equal body (bytes) when given."""
    check(isinstance(doc, dict), "%s: job is not an object: %r" % (what, doc))
    if with_body is None:
        with_body = reserved or body is not None
    want = set(JOB_KEYS)
    if reserved:
        want.add("reservation")
    elif doc.get("state") == "reserved":
        want.add("reserved_by")  # the client holding it (GET /clients), null for an HTTP token
    if with_body:
        if body is None:
            check(("body" in doc) != ("body_base64" in doc),
                  "%s: want exactly one of body and body_base64, got keys %r" % (what, sorted(doc)))
            want.add("body" if "body" in doc else "body_base64")
        else:
            try:
                body.decode("utf-8")
                want.add("body")
            except UnicodeDecodeError:
                want.add("body_base64")
    check_eq(set(doc), want, "%s: job keys" % what)
    for k in JOB_KEYS - {"tube", "state"}:
        check(isinstance(doc[k], int) and not isinstance(doc[k], bool) and doc[k] >= 0,
              "%s: %s is %r, want a non-negative integer" % (what, k, doc[k]))
    check(doc["state"] in ("ready", "delayed", "reserved", "buried"), "%s: state %r" % (what, doc["state"]))
    if reserved:
        check(isinstance(doc["reservation"], str) and len(doc["reservation"]) >= 16,
              "%s: reservation token %r looks guessable" % (what, doc["reservation"]))
        check_eq(doc["state"], "reserved", "%s: state" % what)
    if "body" in doc:
        check(isinstance(doc["body"], str), "%s: body %r is not a string" % (what, doc["body"]))
        if body is not None:
            check_eq(doc["body"].encode("utf-8"), body, "%s: body" % what)
    if "body_base64" in doc:
        try:
            raw = base64.b64decode(doc["body_base64"], validate=True)
        except (ValueError, TypeError) as e:
            raise AssertionError("%s: body_base64 is not base64: %s" % (what, e)) from None
        check(not _is_utf8(raw), "%s: body_base64 used for a valid UTF-8 body %r" % (what, raw[:40]))
        if body is not None:
            check_eq(raw, body, "%s: body_base64" % what)
    return doc


def _is_utf8(b):
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


# ---- small API helpers ---------------------------------------------------------------

def put(tube, body=b"x", via="base", headers=None, **params):
    r = post("/tubes/%s/jobs%s" % (tube, q(**params)), body=body, via=via, headers=headers)
    doc = expect_json(r, 201, "put into %s" % tube)
    check_eq(set(doc), {"id", "tube", "state"}, "put reply keys")
    check_eq(r.header("Location"), "/jobs/%d" % doc["id"], "put Location")
    check_eq(doc["tube"], tube, "put reply tube")
    return doc["id"]


def reserve(tube, timeout=0, via="base", headers=None, **params):
    """POST /tubes/T/reservations; returns the Resp."""
    return post("/tubes/%s/reservations%s" % (tube, q(timeout=timeout, **params)), via=via,
                headers=headers, timeout=HTTP_TIMEOUT + timeout)


def reserve_one(tube, body=None, timeout=0, what="reserve"):
    doc = expect_json(reserve(tube, timeout), 200, what)
    return check_job(doc, what, body=body, reserved=True)


def job_stats(jid, via="base"):
    return check_job(expect_json(get("/jobs/%d" % jid, via=via), 200, "GET /jobs/%d" % jid),
                     "GET /jobs/%d" % jid)


def tube_stats(tube):
    doc = expect_json(get("/tubes/%s" % tube), 200, "GET /tubes/%s" % tube)
    check_eq(set(doc), TUBE_KEYS, "tube stats keys")
    return doc


def server_stats(via="base"):
    doc = expect_json(get("/stats", via=via), 200, "GET /stats")
    check_eq(set(doc), SERVER_KEYS, "server stats keys")
    return doc


class Later(threading.Thread):
    """Run fn in a thread; .result/.error/.done_at once it ends."""

    def __init__(self, fn):
        super().__init__(daemon=True)
        self.fn = fn
        self.result = None
        self.error = None
        self.done_at = None

    def run(self):
        try:
            self.result = self.fn()
        except BaseException as e:  # reported by get()
            self.error = e
        self.done_at = time.monotonic()

    def get(self, timeout):
        self.join(timeout)
        check(not self.is_alive(), "a background request did not end within %.1f s" % timeout)
        if self.error:
            raise self.error
        return self.result


# ---- beanstalk over TCP -------------------------------------------------------------

class Beanstalk:
    def __init__(self, port=None):
        self.sock = socket.create_connection(("127.0.0.1", port or T.tcp_port), timeout=TCP_TIMEOUT)
        self.buf = b""

    def close(self):
        close_quietly(self.sock)

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()

    def _fill(self, deadline):
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError("beanstalk: timed out; received so far %r" % self.buf[:200])
        self.sock.settimeout(left)
        try:
            chunk = self.sock.recv(65536)
        except socket.timeout:
            raise AssertionError("beanstalk: timed out; received so far %r" % self.buf[:200]) from None
        if not chunk:
            raise AssertionError("beanstalk: connection closed; received so far %r" % self.buf[:200])
        self.buf += chunk

    def line(self, timeout=TCP_TIMEOUT):
        deadline = time.monotonic() + timeout
        while b"\r\n" not in self.buf:
            self._fill(deadline)
        i = self.buf.index(b"\r\n") + 2
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def exact(self, n, timeout=TCP_TIMEOUT):
        deadline = time.monotonic() + timeout
        while len(self.buf) < n:
            self._fill(deadline)
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def cmd(self, text, timeout=TCP_TIMEOUT):
        self.sock.sendall(text if isinstance(text, bytes) else text.encode())
        return self.line(timeout)

    def expect(self, text, want):
        got = self.cmd(text)
        check_eq(got, want, "beanstalk %r" % (text.strip() if isinstance(text, str) else text[:40]))

    def put(self, body, pri=0, delay=0, ttr=60):
        got = self.cmd(b"put %d %d %d %d\r\n" % (pri, delay, ttr, len(body)) + body + b"\r\n")
        check(got.startswith(b"INSERTED "), "beanstalk put: %r" % got)
        return int(got.split()[1])

    def job(self, line, word):
        parts = line.split()
        check(len(parts) == 3 and parts[0] == word, "beanstalk: want %s, got %r" % (word.decode(), line))
        body = self.exact(int(parts[2]) + 2)
        check_eq(body[-2:], b"\r\n", "beanstalk job body end")
        return int(parts[1]), body[:-2]

    def stats(self):
        got = self.cmd("stats\r\n")
        check(got.startswith(b"OK "), "beanstalk stats: %r" % got)
        data = self.exact(int(got.split()[1]) + 2)
        out = {}
        for raw in data.decode("latin-1").split("\n"):
            if ": " in raw:
                k, v = raw.split(": ", 1)
                out[k.strip()] = v.strip()
        return out


# ---- the server process (local mode) -------------------------------------------------

class Server(testlib.ServerProcess):
    """One beangate process on free loopback ports."""

    def __init__(self, extra=(), http=True):
        super().__init__()
        self.extra = list(extra)
        self.http = http
        self.tcp_port = None
        self.http_port = None

    def argv(self):
        a = [T.binary, "-l", "127.0.0.1", "-p", str(self.tcp_port)]
        if self.http:
            a += ["--http-listen", "127.0.0.1", "--http-port", str(self.http_port)]
        return a + self.extra

    def start(self):
        def launch():
            self.tcp_port, self.http_port = free_port(), free_port()
            self.spawn(self.argv())
        if self.start_retrying(launch, self._answers, START_TIMEOUT, attempts=5, step=0.05,
                               not_yet=(OSError, AssertionError, http.client.HTTPException)) == "ok":
            return self
        last = self.stderr()
        self.stop()
        raise AssertionError("server %r did not start: %s" % (self.argv(), last.strip()[-600:]))

    def _answers(self):
        """Whether a beanstalk round trip works and (with HTTP) GET /livez is 200."""
        with Beanstalk(self.tcp_port) as b:
            if b.cmd("list-tube-used\r\n") != b"USING default\r\n":
                return False
        if self.http:
            c = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=2)
            try:
                c.request("GET", "/livez")   # open with bearer tokens too
                return c.getresponse().status == 200
            finally:
                c.close()
        return True

    def stop(self, sig=signal.SIGTERM):
        """Stop the server; returns (exit status or None if it hung, stderr)."""
        if self.proc is None:
            return None, ""
        status = signal_and_wait(self.proc, sig, STOP_TIMEOUT)
        err = self.stderr()
        try:
            self.err.close()
        except OSError:
            pass
        self.proc = None
        return status, err


def check_stopped(status, err, what):
    check(status is not None, "%s: server did not exit within %.0f s of SIGTERM" % (what, STOP_TIMEOUT))
    bad = [m for m in SANITIZER_MARKERS if m in err]
    check(not bad, "%s: sanitizer report: %s" % (what, err.strip()[:1500]))
    check(status == 0, "%s: exit status %r, want 0; stderr: %s" % (what, status, err.strip()[-600:]))


# ======================================================================================
# the tests
# ======================================================================================

# ---- put ----------------------------------------------------------------------------

def test_put_defaults():
    tube = uniq("put")
    r = post("/tubes/%s/jobs" % tube, body=b"hello")
    doc = expect_json(r, 201, "put")
    check_eq(set(doc), {"id", "tube", "state"}, "put reply keys")
    check(isinstance(doc["id"], int) and doc["id"] > 0, "put id %r" % doc["id"])
    check_eq(doc, {"id": doc["id"], "tube": tube, "state": "ready"}, "put reply")
    check_eq(r.header("Location"), "/jobs/%d" % doc["id"], "Location")
    check_eq(r.header("Idempotent-Replayed"), None, "Idempotent-Replayed on a first put")
    j = check_job(expect_json(get(r.header("Location")), 200, "GET Location"), "GET Location")
    check_eq((j["id"], j["tube"], j["state"], j["priority"], j["delay"], j["ttr"], j["reserves"]),
             (doc["id"], tube, "ready", DEFAULT_PRIORITY, 0, DEFAULT_TTR, 0),
             "defaults (id, tube, state, priority, delay, ttr, reserves)")
    check(j["age"] <= 2, "age %r of a new job" % j["age"])


def test_put_with_parameters():
    tube = uniq("putp")
    jid = put(tube, b"later", priority=5, delay=100, ttr=7)
    j = job_stats(jid)
    check_eq((j["state"], j["priority"], j["delay"], j["ttr"]), ("delayed", 5, 100, 7),
             "state, priority, delay, ttr")
    check(98 <= j["time_left"] <= 100, "time_left %r of a job delayed 100 s" % j["time_left"])
    r = post("/tubes/%s/jobs%s" % (tube, q(priority=4294967295, ttr=0)), body=b"max")
    doc = expect_json(r, 201, "put priority 2^32-1")
    j = job_stats(doc["id"])
    check_eq(j["priority"], 4294967295, "priority 2^32-1")
    check_eq(j["ttr"], 1, "ttr 0 is taken as 1 (as beanstalk does)")


def test_put_empty_body():
    tube = uniq("empty")
    jid = put(tube, b"")
    doc = expect_json(get("/tubes/%s/ready" % tube), 200, "peek ready")
    check_job(doc, "peek empty job", body=b"")
    check_eq(doc["id"], jid, "peeked id")
    r = get("/jobs/%d/body" % jid)
    expect_status(r, 200, "GET body of an empty job")
    check_eq(r.body, b"", "empty body")


def test_put_bad_numbers_400():
    tube = uniq("badnum")
    for params in ("priority=abc", "priority=-1", "priority=4294967296", "delay=1.5", "ttr=",
                   "delay=99999999999999999999", "ttr=%2B5"):
        r = post("/tubes/%s/jobs?%s" % (tube, params), body=b"x", via="direct")
        expect_problem(r, 400, "BAD_FORMAT", "put with %s" % params)
    expect_problem(get("/tubes/%s" % tube, via="direct"), 404, "NOT_FOUND", "no job was stored")


def test_bad_tube_names_400():
    for name in ("-starts-with-dash", "a!b", "x" * 201, "sp%20ace", "%2Dx"):
        r = post("/tubes/%s/jobs" % name, body=b"x", via="direct")
        expect_problem(r, 400, "BAD_FORMAT", "put into tube %r" % name[:30])
        expect_problem(get("/tubes/%s" % name, via="direct"), 400, "BAD_FORMAT", "GET tube %r" % name[:30])
        expect_problem(post("/tubes/%s/reservations" % name, via="direct"), 400, "BAD_FORMAT",
                       "reserve from tube %r" % name[:30])
    ok = "A" * 200
    jid = put(ok, b"longest name")
    check_eq(job_stats(jid)["tube"], ok, "a 200-byte tube name works")
    weird = "a+b;c.d$e_f(g)-h"
    jid = put(weird, b"punctuation")
    check_eq(job_stats(jid)["tube"], weird, "tube name with every allowed punctuation")
    delete("/jobs/%d" % jid)


def test_tube_name_with_slash():
    """'/' is valid in a tube name: in a path it is written %2F (an encoded
    slash does not split the path); a literal one is another path."""
    tube = uniq("sl") + "/x/y"
    enc = tube.replace("/", "%2F")
    r = post("/tubes/%s/jobs" % enc, body=b"slashed", via="direct")
    doc = expect_json(r, 201, "put into %s" % enc)
    check_eq(doc["tube"], tube, "tube of the put")
    doc = expect_json(get("/tubes/%s" % enc.replace("%2F", "%2f"), via="direct"), 200, "GET tube, lower-case %2f")
    check_eq((doc["name"], doc["current_jobs_ready"]), (tube, 1), "the tube's name and ready count")
    expect_problem(post("/tubes/%s/jobs" % tube, body=b"x", via="direct"), 404, "NOT_FOUND",
                   "a literal '/' is another path")
    doc = expect_json(post("/reservations?tubes=%s&timeout=0" % enc, via="direct"), 200,
                      "reserve with ?tubes= and %2F")
    check_eq((doc["tube"], doc["body"]), (tube, "slashed"), "the reserved job")
    expect_status(delete("/jobs/%d%s" % (doc["id"], q(reservation=doc["reservation"])), via="direct"), 204,
                  "delete the reserved job")
    jid = expect_json(post("/tubes/%s/jobs" % enc, body=b"again", via="direct"), 201, "second put")["id"]
    doc = expect_json(post("/tubes/%s/reservations?timeout=0" % enc, via="direct"), 200,
                      "reserve from the %2F path")
    check_eq(doc["id"], jid, "the job reserved from the %2F path")


def test_nul_in_path_does_not_cut_it():
    """A %00 in the path must not make the server act on a shorter path:
    DELETE /jobs/ID%00x must not delete job ID, POST /tubes/T%00x/jobs must not
    put into T."""
    tube = uniq("nul")
    jid = put(tube, b"keep me")
    r = delete("/jobs/%d%%00x" % jid, via="direct")
    check(r.status in (400, 404), "DELETE /jobs/%d%%00x: status %d, want 400 or 404; %s"
          % (jid, r.status, r.describe()))
    check_eq(job_stats(jid)["state"], "ready", "the job is still there")
    r = get("/tubes/%s%%00x" % tube, via="direct")
    check(r.status in (400, 404), "GET /tubes/%s%%00x: status %d, want 400 or 404; %s"
          % (tube, r.status, r.describe()))
    r = post("/tubes/%s%%00x/jobs" % tube, body=b"x", via="direct")
    expect_problem(r, 400, "BAD_FORMAT", "put into a tube name with a NUL")
    check_eq(tube_stats(tube)["total_jobs"], 1, "nothing more stored in %s" % tube)
    expect_status(delete("/jobs/%d" % jid), 204, "delete")


def test_put_job_too_big_413():
    tube = uniq("big")
    max_size = server_stats()["max_job_size"]
    r = post("/tubes/%s/jobs" % tube, body=b"y" * (max_size + 1))
    expect_problem(r, 413, "JOB_TOO_BIG", "put of max_job_size + 1 bytes")
    jid = put(tube, b"z" * max_size)
    check_eq(len(get("/jobs/%d/body" % jid).body), max_size, "a body of exactly max_job_size is stored")
    delete("/jobs/%d" % jid)


def read_http_head(sock, timeout):
    """Read one response head (and what body follows within the timeout)."""
    sock.settimeout(timeout)
    data = b""
    deadline = time.monotonic() + timeout
    while b"\r\n\r\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError("no response head within %.1f s; got %r" % (timeout, data[:200]))
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            raise AssertionError("no response head within %.1f s; got %r" % (timeout, data[:200])) from None
        if not chunk:
            break
        data += chunk
    return data


def test_put_413_before_body_is_sent():
    """The limit is checked from Content-Length: the 413 comes before any byte
    of the body is sent (with and without Expect: 100-continue)."""
    host, port = T.direct
    tube = uniq("big")
    for expect in (True, False):
        s = socket.create_connection((host, port), timeout=5)
        try:
            head = ("POST /tubes/%s/jobs HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/octet-stream\r\n"
                    "Content-Length: 50000000\r\n%s\r\n" % (tube, host, port,
                                                           "Expect: 100-continue\r\n" if expect else ""))
            s.sendall(head.encode())
            data = read_http_head(s, 3.0)
        finally:
            s.close()
        first = data.split(b"\r\n", 1)[0]
        check(first.startswith(b"HTTP/1.1 413"), "Expect %s: want 413 before the body, got %r"
              % (expect, data[:300]))
        check(b"100 Continue" not in data, "a 100 Continue was sent for a body that is too big")
        check(b"JOB_TOO_BIG" in data, "413 without code JOB_TOO_BIG: %r" % data[:400])
    # a client that sends the body anyway: the connection is closed after the
    # 413 and the body is not read as further requests
    smuggled = uniq("smuggled")
    s = socket.create_connection((host, port), timeout=5)
    try:
        s.sendall(("POST /tubes/%s/jobs HTTP/1.1\r\nHost: localhost\r\nContent-Length: 70000\r\n\r\n" % tube).encode())
        data = read_http_head(s, 3.0)  # the 413, before any byte of the body
        inner = ("POST /tubes/%s/jobs HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1\r\n\r\nx" % smuggled).encode()
        try:
            s.sendall(inner + b"y" * (70000 - len(inner)))
        except OSError:
            pass  # the server may have closed already
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
    finally:
        s.close()
    check(data.startswith(b"HTTP/1.1 413"), "want 413, got %r" % data[:200])
    check_eq(data.count(b"HTTP/1.1 "), 1, "responses on a connection whose body was refused")
    expect_problem(get("/tubes/%s" % tube), 404, "NOT_FOUND", "nothing stored")
    expect_problem(get("/tubes/%s" % smuggled), 404, "NOT_FOUND", "the refused body was not run as a request")


def test_keep_alive_connection():
    """Several requests, a long-poll among them, on one HTTP/1.1 connection."""
    tube = uniq("keep")
    host, port = T.base
    c = http.client.HTTPConnection(host, port, timeout=HTTP_TIMEOUT)
    try:
        c.request("POST", "/tubes/%s/jobs" % tube, body=b"a", headers={"Content-Type": "application/octet-stream"})
        r = c.getresponse()
        check_eq((r.status, json.loads(r.read())["tube"]), (201, tube), "put on a kept-alive connection")
        c.request("POST", "/tubes/%s/reservations?timeout=1" % tube)
        r = c.getresponse()
        doc = json.loads(r.read())
        check_eq((r.status, doc["body"]), (200, "a"), "reserve on the same connection")
        t0 = time.monotonic()
        c.request("POST", "/tubes/%s/reservations?timeout=1" % tube)
        r = c.getresponse()
        check_eq((r.status, r.read()), (204, b""), "long-poll timeout on the same connection")
        check(time.monotonic() - t0 >= 0.9, "the long-poll did not wait")
        c.request("DELETE", "/jobs/%d?reservation=%s" % (doc["id"], doc["reservation"]))
        r = c.getresponse()
        check_eq((r.status, r.read()), (204, b""), "delete on the same connection")
    finally:
        c.close()


# ---- reserve ------------------------------------------------------------------------------

def test_reserve_poll_empty_204():
    tube = uniq("empty")
    r = reserve(tube)
    expect_status(r, 204, "reserve with nothing ready")
    check_eq(r.body, b"", "204 body")
    check(r.elapsed < 0.8, "timeout 0 must not wait: took %.2f s" % r.elapsed)
    r = post("/reservations?tubes=%s,%s" % (tube, uniq("other")))
    expect_status(r, 204, "multi-tube poll with nothing ready")


def test_reserve_timeout_1s_204():
    tube = uniq("timeout")
    r = reserve(tube, timeout=1)
    expect_status(r, 204, "reserve timeout=1")
    check_eq(r.body, b"", "204 body")
    check(0.9 <= r.elapsed <= 2.2, "timeout=1 answered after %.2f s, want about 1 s" % r.elapsed)


def test_reserve_json():
    tube = uniq("res")
    jid = put(tube, b"payload", priority=10, ttr=30)
    doc = reserve_one(tube, body=b"payload")
    check_eq((doc["id"], doc["tube"], doc["state"], doc["priority"], doc["ttr"], doc["reserves"]),
             (jid, tube, "reserved", 10, 30, 1), "reserved job (id, tube, state, priority, ttr, reserves)")
    check(28 <= doc["time_left"] <= 30, "time_left %r of a fresh reservation with ttr 30" % doc["time_left"])
    j = job_stats(jid)
    check_eq(j["state"], "reserved", "GET state after reserve")
    expect_status(reserve(tube), 204, "nothing else ready")
    expect_status(delete("/jobs/%d%s" % (jid, q(reservation=doc["reservation"]))), 204, "delete with token")
    expect_problem(get("/jobs/%d" % jid), 404, "NOT_FOUND", "GET a deleted job")


def test_reserve_priority_order():
    tube = uniq("order")
    a = put(tube, b"a", priority=50)
    b = put(tube, b"b", priority=5)
    c = put(tube, b"c", priority=50)
    got = [reserve_one(tube)["id"] for _ in range(3)]
    check_eq(got, [b, a, c], "reserve order (priority, then id)")


def test_reserve_raw_octet_stream():
    tube = uniq("raw")
    jid = put(tube, b"raw body", priority=3, ttr=9)
    r = reserve(tube, headers={"Accept": "application/octet-stream"})
    expect_status(r, 200, "raw reserve")
    check_eq((r.header("Content-Type") or "").split(";")[0], "application/octet-stream", "Content-Type")
    check_eq(r.body, b"raw body", "raw body")
    check_eq(r.header("X-Job-Id"), str(jid), "X-Job-Id")
    check_eq(r.header("X-Job-Tube"), tube, "X-Job-Tube")
    check_eq(r.header("X-Job-Priority"), "3", "X-Job-Priority")
    check_eq(r.header("X-Job-Ttr"), "9", "X-Job-Ttr")
    token = r.header("X-Reservation")
    check(token and len(token) >= 16, "X-Reservation %r" % token)
    expect_problem(delete("/jobs/%d" % jid), 409, "RESERVATION_REQUIRED", "delete without token")
    expect_status(delete("/jobs/%d%s" % (jid, q(reservation=token))), 204, "delete with X-Reservation")


def longpoll_then(tube, do_put, via="base"):
    """Start a long-poll, wait until the server has it, run do_put(); return
    (job JSON, seconds from the put to the answer)."""
    lp = Later(lambda: reserve(tube, timeout=10, via=via))
    lp.start()
    wait_for(lambda: waiting_on(tube) >= 1 or not lp.is_alive(), "the long-poll to wait on %s" % tube)
    check(lp.is_alive(), "the long-poll answered before any put: %r"
          % (lp.result.describe() if lp.result else lp.error))
    t_put = time.monotonic()
    jid = do_put()
    r = lp.get(12)
    took = lp.done_at - t_put
    doc = check_job(expect_json(r, 200, "woken long-poll"), "woken long-poll", reserved=True)
    check_eq(doc["id"], jid, "the long-poll got the job that was put")
    check(took <= WAKE_LIMIT, "the long-poll answered %.2f s after the put, want <= %.1f s" % (took, WAKE_LIMIT))
    return doc, took


def test_longpoll_woken_by_http_put():
    tube = uniq("wake")
    doc, _ = longpoll_then(tube, lambda: put(tube, b"from http"))
    check_eq(doc["body"], "from http", "body")
    expect_status(delete("/jobs/%d%s" % (doc["id"], q(reservation=doc["reservation"]))), 204, "delete")


def test_longpoll_woken_by_tcp_put():
    tube = uniq("wake")
    with Beanstalk() as b:
        b.expect("use %s\r\n" % tube, b"USING %s\r\n" % tube.encode())

        doc, _ = longpoll_then(tube, lambda: b.put(b"from tcp", pri=7))
    check_eq((doc["body"], doc["priority"]), ("from tcp", 7), "body and priority of the TCP job")
    expect_status(delete("/jobs/%d%s" % (doc["id"], q(reservation=doc["reservation"]))), 204, "delete")


def wait_for(fn, what, timeout=5.0):
    """Poll fn() until it returns a true value (returned); fail after timeout."""
    return testlib.wait_until(fn, what, timeout, step=0.01)


def waiting_on(tube):
    """current_waiting of tube (0 while the tube does not exist)."""
    r = get("/tubes/%s" % tube)
    return r.json()["current_waiting"] if r.status == 200 else 0


def raw_longpoll(tube, pipelined=b""):
    """A long-poll on a raw socket to the server itself, plus any pipelined
    bytes in the same write; returns once the server has it waiting."""
    host, port = T.direct
    s = socket.create_connection((host, port), timeout=5)
    s.sendall(("POST /tubes/%s/reservations?timeout=20 HTTP/1.1\r\nHost: %s:%d\r\n"
               "Content-Length: 0\r\n\r\n" % (tube, host, port)).encode() + pipelined)
    wait_for(lambda: waiting_on(tube) == 1, "the long-poll to wait on %s" % tube)
    return s


def read_to_eof(s, timeout=5.0):
    """Everything the server sends until it closes (or resets) s."""
    data = b""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        check(left > 0, "the server did not close the connection; got %r" % data[:300])
        s.settimeout(left)
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            return data
        except socket.timeout:
            continue
        if not chunk:
            return data
        data += chunk


def put_after_leaving(tube, put_over):
    """Put a job into tube (over HTTP or beanstalk TCP) and check that it is
    ready at once and was never handed to anyone: the long-poll that waited
    there has gone."""
    if put_over == "tcp":
        with Beanstalk() as b:
            b.expect("use %s\r\n" % tube, b"USING %s\r\n" % tube.encode())
            jid = b.put(b"must not be stranded", pri=5)
    else:
        r = post("/tubes/%s/jobs" % tube, body=b"must not be stranded")
        doc = expect_json(r, 201, "put")
        jid = doc["id"]
        check_eq(doc["state"], "ready", "the put's answer: nobody took the job")
    st = wait_for(lambda: (lambda d: d if d["state"] == "ready" else None)(job_stats(jid)),
                  "job %d to be ready" % jid)
    check_eq((st["reserves"], st["releases"], st["timeouts"]), (0, 0, 0),
             "job %d (reserves, releases, timeouts): never handed to the gone client" % jid)
    check_eq(waiting_on(tube), 0, "nobody waits on %s" % tube)
    expect_status(delete("/jobs/%d" % jid), 204, "delete")


def test_longpoll_fin_close_gives_no_job():
    """A client half-closes (FIN) during a long-poll, as `curl -m1` or a
    client that gives up does. Its wait ends at once (204 or a close, never
    a job), and a job put then is ready at once: it is not handed to the
    gone client and left reserved for its TTR (which a put over beanstalk
    did before issue 11)."""
    for put_over in ("tcp", "http"):
        tube = uniq("fin")
        s = raw_longpoll(tube)
        try:
            s.shutdown(socket.SHUT_WR)
            data = read_to_eof(s)
        finally:
            s.close()
        check(data == b"" or data.startswith(b"HTTP/1.1 204 "), "the gone long-poll got %r" % data[:300])
        put_after_leaving(tube, put_over)


def test_longpoll_close_then_put_at_once():
    """The client closes (FIN) and the put follows at once, before the server
    may have seen the close on its own: the check right before the
    hand-over still keeps the job from the gone client."""
    for put_over in ("tcp", "http"):
        tube = uniq("close")
        raw_longpoll(tube).close()
        put_after_leaving(tube, put_over)


def test_longpoll_reset_gives_no_job():
    """A client that resets (RST) its connection during a long-poll."""
    tube = uniq("rst")
    s = raw_longpoll(tube)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()  # linger 0: a reset, not a FIN
    put_after_leaving(tube, "http")


def test_longpoll_pipelined_request():
    """Bytes after the long-poll request are a pipelined request, not a
    close: the long-poll still waits and gets the job, then the pipelined
    request is answered. A FIN behind pipelined bytes is a close, though."""
    tube = uniq("pipe")
    host, port = T.direct
    pipelined = ("GET /tubes/%s HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n\r\n"
                 % (tube, host, port)).encode()
    s = raw_longpoll(tube, pipelined)
    try:
        jid = put(tube, b"for the pipelining client")
        data = read_to_eof(s)
    finally:
        s.close()
    first, _, rest = data.partition(b"\r\n\r\n")
    check(first.startswith(b"HTTP/1.1 200 "), "the long-poll's answer: %r" % data[:300])
    check(b'"id":%d' % jid in rest and b'"state":"reserved"' in rest, "the job in the answer: %r" % rest[:300])
    check(b"HTTP/1.1 200 " in rest and b'"name":"%s"' % tube.encode() in rest,
          "the pipelined GET was answered after it: %r" % rest[:600])
    token = json.loads(rest[:rest.index(b"\n")].decode())["reservation"]
    expect_status(delete("/jobs/%d%s" % (jid, q(reservation=token))), 204, "delete")

    tube = uniq("pipefin")
    pipelined = ("GET /tubes/%s HTTP/1.1\r\nHost: %s:%d\r\n\r\n" % (tube, host, port)).encode()
    s = raw_longpoll(tube, pipelined)
    try:
        s.shutdown(socket.SHUT_WR)
        data = read_to_eof(s)
    finally:
        s.close()
    check(b'"reservation"' not in data, "a job went to a client that had closed: %r" % data[:300])
    put_after_leaving(tube, "tcp")


def test_concurrent_longpollers_get_different_jobs():
    tube = uniq("many")
    n = 4
    polls = [Later(lambda: reserve(tube, timeout=10)) for _ in range(n)]
    for p in polls:
        p.start()
    wait_for(lambda: waiting_on(tube) >= n or not all(p.is_alive() for p in polls),
             "%d long-polls to wait on %s" % (n, tube))
    check(all(p.is_alive() for p in polls), "a long-poll answered before any put")
    t_put = time.monotonic()
    ids = [put(tube, b"job %d" % i) for i in range(n)]
    got = []
    for p in polls:
        r = p.get(12)
        doc = check_job(expect_json(r, 200, "concurrent long-poll"), "concurrent long-poll", reserved=True)
        got.append(doc)
        check(p.done_at - t_put <= WAKE_LIMIT + 0.5, "a long-poll answered %.2f s after the puts"
              % (p.done_at - t_put))
    check_eq(sorted(d["id"] for d in got), sorted(ids), "each long-poll got a different job, all of them")
    for d in got:
        expect_status(delete("/jobs/%d%s" % (d["id"], q(reservation=d["reservation"]))), 204, "delete")


def test_reserve_count_batch():
    tube = uniq("batchres")
    ids = [put(tube, b"b%d" % i, priority=100 - i) for i in range(5)]
    doc = expect_json(reserve(tube, count=3), 200, "reserve count=3")
    check_eq(set(doc), {"jobs"}, "batch reserve keys")
    check_eq(len(doc["jobs"]), 3, "jobs in count=3")
    for j in doc["jobs"]:
        check_job(j, "batch job", reserved=True, body=("b%d" % ids.index(j["id"])).encode())
    check_eq([j["id"] for j in doc["jobs"]], [ids[4], ids[3], ids[2]], "batch in priority order")
    tokens = {j["reservation"] for j in doc["jobs"]}
    check_eq(len(tokens), 3, "distinct tokens")
    doc2 = expect_json(reserve(tube, count=10), 200, "reserve count=10 with 2 ready")
    check_eq([j["id"] for j in doc2["jobs"]], [ids[1], ids[0]], "the rest")
    expect_status(reserve(tube, count=5), 204, "count=5 with nothing ready")
    for j in doc["jobs"] + doc2["jobs"]:
        expect_status(delete("/jobs/%d%s" % (j["id"], q(reservation=j["reservation"]))), 204, "delete")


def test_reserve_count_longpoll():
    tube = uniq("batchlp")
    lp = Later(lambda: reserve(tube, timeout=10, count=3))
    lp.start()
    wait_for(lambda: waiting_on(tube) >= 1 or not lp.is_alive(), "the count long-poll to wait")
    check(lp.is_alive(), "count long-poll answered early")
    t_put = time.monotonic()
    jid = put(tube, b"one")
    doc = expect_json(lp.get(12), 200, "count long-poll")
    check(lp.done_at - t_put <= WAKE_LIMIT, "count long-poll answered %.2f s after the put"
          % (lp.done_at - t_put))
    check_eq([j["id"] for j in doc["jobs"]], [jid], "count long-poll jobs")
    check_job(doc["jobs"][0], "count long-poll job", body=b"one", reserved=True)


def test_reserve_several_tubes():
    a, b, c = uniq("ma"), uniq("mb"), uniq("mc")
    jc = put(c, b"in c")
    jb = put(b, b"in b")
    r = post("/reservations%s" % q(tubes="%s,%s" % (a, b)))
    doc = check_job(expect_json(r, 200, "reserve a,b"), "reserve a,b", body=b"in b", reserved=True)
    check_eq((doc["id"], doc["tube"]), (jb, b), "job from b")
    expect_status(post("/reservations%s" % q(tubes="%s,%s" % (a, b))), 204, "a,b now empty (c not watched)")
    # 'default' is not watched unless named
    jd = put("default", b"in default")
    try:
        expect_status(post("/reservations%s" % q(tubes=a)), 204, "default is not watched")
    finally:
        expect_status(delete("/jobs/%d" % jd), 204, "delete the default job")
    # long-poll over several tubes, woken by a put into the second
    lp = Later(lambda: post("/reservations%s" % q(tubes="%s,%s" % (a, c), timeout=10, count=5),
                            timeout=HTTP_TIMEOUT + 10))
    lp.start()
    # c already has a job ready: the long-poll must not wait for it
    r = lp.get(3)
    docs = expect_json(r, 200, "a,c count=5")["jobs"]
    check_eq([d["id"] for d in docs], [jc], "jobs from a,c")
    # with a name containing '/', usable in the query
    slash = uniq("with/slash")
    with Beanstalk() as bs:
        bs.expect("use %s\r\n" % slash, b"USING %s\r\n" % slash.encode())
        js = bs.put(b"slashed")
    doc = check_job(expect_json(post("/reservations%s" % q(tubes=slash)), 200, "reserve tube with '/'"),
                    "reserve tube with '/'", body=b"slashed", reserved=True)
    check_eq((doc["id"], doc["tube"]), (js, slash), "job from a tube whose name has '/'")


def test_reserve_bad_parameters_400():
    tube = uniq("badres")
    for params in ("timeout=abc", "timeout=-1", "count=0", "count=101", "count=x", "timeout=1e3"):
        doc = expect_problem(post("/tubes/%s/reservations?%s" % (tube, params), via="direct"), 400,
                             "BAD_FORMAT", "reserve with %s" % params)
        name = params.split("=")[0]
        check("'%s'" % name in doc["detail"], "reserve with %s: the detail names %s: %r" % (params, name, doc["detail"]))
        if name == "count":   # the range, not "a non-negative integer" (0 is one)
            check("1 to 100" in doc["detail"], "reserve with %s: the detail gives the range: %r" % (params, doc["detail"]))
    for params in ("", "tubes=", "tubes=-bad", "tubes=a,,b", "tubes=" + ",".join("t%d" % i for i in range(65))):
        expect_problem(post("/reservations?%s" % params, via="direct"), 400, "BAD_FORMAT",
                       "multi-tube reserve with %r" % params[:40])


def test_reserve_timeout_above_cap_is_accepted():
    tube = uniq("cap")
    lp = Later(lambda: reserve(tube, timeout=1000))
    lp.start()
    wait_for(lambda: waiting_on(tube) >= 1 or not lp.is_alive(), "the timeout=1000 long-poll to wait")
    check(lp.is_alive(), "timeout=1000 answered before any put: %r"
          % (lp.result.describe() if lp.result else lp.error))
    jid = put(tube, b"capped")
    doc = expect_json(lp.get(5), 200, "reserve timeout=1000")
    check_eq(doc["id"], jid, "job")


def test_reserve_job_by_id():
    tube = uniq("rjob")
    jid = put(tube, b"pick me", delay=100)
    r = post("/jobs/%d/reservations" % jid)
    doc = check_job(expect_json(r, 200, "reserve-job of a delayed job"), "reserve-job", body=b"pick me",
                    reserved=True)
    check_eq(doc["id"], jid, "id")
    expect_problem(post("/jobs/%d/reservations" % jid), 409, "ALREADY_RESERVED", "reserve-job of a reserved job")
    expect_problem(post("/jobs/%d/reservations" % 987654321), 404, "NOT_FOUND", "reserve-job of no job")
    expect_status(delete("/jobs/%d%s" % (jid, q(reservation=doc["reservation"]))), 204, "delete")
    jid = put(tube, b"raw pick")
    r = post("/jobs/%d/reservations" % jid, headers={"Accept": "application/octet-stream"})
    expect_status(r, 200, "raw reserve-job")
    check_eq(r.body, b"raw pick", "raw body")
    check_eq(r.header("X-Job-Id"), str(jid), "X-Job-Id")
    token = r.header("X-Reservation")
    check(token, "X-Reservation on reserve-job")
    expect_status(delete("/jobs/%d%s" % (jid, q(reservation=token))), 204, "delete")


# ---- jobs -------------------------------------------------------------------------------

def test_get_job_and_body():
    tube = uniq("get")
    jid = put(tube, b"some body", priority=12, ttr=33)
    j = job_stats(jid)
    check_eq((j["id"], j["tube"], j["priority"], j["ttr"]), (jid, tube, 12, 33), "GET job")
    r = get("/jobs/%d/body" % jid)
    expect_status(r, 200, "GET body")
    check_eq((r.header("Content-Type") or "").split(";")[0], "application/octet-stream", "body Content-Type")
    check_eq(r.body, b"some body", "body bytes")
    check_eq((r.header("X-Job-Id"), r.header("X-Job-Tube"), r.header("X-Job-Priority"), r.header("X-Job-Ttr")),
             (str(jid), tube, "12", "33"), "X-Job-* headers")
    check_eq(r.header("X-Reservation"), None, "X-Reservation on GET body")
    expect_problem(get("/jobs/987654321"), 404, "NOT_FOUND", "GET no job")
    expect_problem(get("/jobs/987654321/body"), 404, "NOT_FOUND", "GET body of no job")
    for bad in ("abc", "-1", "1x", "18446744073709551616"):
        expect_problem(get("/jobs/%s" % bad, via="direct"), 400, "BAD_FORMAT", "GET /jobs/%s" % bad)


def test_delete_ready_delayed_buried():
    tube = uniq("del")
    ready = put(tube, b"r")
    delayed = put(tube, b"d", delay=100)
    buried = put(tube, b"b")
    doc = expect_json(post("/jobs/%d/reservations" % buried), 200, "reserve-job")
    expect_json(post("/jobs/%d/bury%s" % (buried, q(reservation=doc["reservation"]))), 200, "bury")
    for jid, what in ((ready, "ready"), (delayed, "delayed"), (buried, "buried")):
        check_eq(job_stats(jid)["state"], what, "state before delete")
        r = delete("/jobs/%d" % jid)
        expect_status(r, 204, "delete a %s job without token" % what)
        check_eq(r.body, b"", "204 body")
        expect_problem(get("/jobs/%d" % jid), 404, "NOT_FOUND", "GET deleted %s job" % what)
        expect_problem(delete("/jobs/%d" % jid), 404, "NOT_FOUND", "delete twice")


def test_reservation_token_rules():
    tube = uniq("tok")
    j1 = put(tube, b"one")
    j2 = put(tube, b"two")
    d1 = reserve_one(tube)
    d2 = reserve_one(tube)
    check_eq((d1["id"], d2["id"]), (j1, j2), "ids")
    check(d1["reservation"] != d2["reservation"], "two jobs share a token")
    expect_problem(delete("/jobs/%d" % j1), 409, "RESERVATION_REQUIRED", "delete reserved without token")
    expect_problem(delete("/jobs/%d?reservation=bogus" % j1), 409, "RESERVATION_MISMATCH", "bogus token")
    expect_problem(delete("/jobs/%d%s" % (j1, q(reservation=d2["reservation"]))), 409,
                   "RESERVATION_MISMATCH", "token of another job")
    tampered = d1["reservation"][:-1] + ("0" if d1["reservation"][-1] != "0" else "1")
    expect_problem(delete("/jobs/%d%s" % (j1, q(reservation=tampered))), 409, "RESERVATION_MISMATCH",
                   "token with its last character changed")
    check_eq(job_stats(j1)["state"], "reserved", "still reserved after refused deletes")
    for action in ("release", "bury", "touch"):
        expect_problem(post("/jobs/%d/%s" % (j1, action)), 409, "RESERVATION_REQUIRED",
                       "%s without token" % action)
        expect_problem(post("/jobs/%d/%s?reservation=bogus" % (j1, action)), 409, "RESERVATION_MISMATCH",
                       "%s with a bogus token" % action)
        expect_problem(post("/jobs/%d/%s?reservation=x" % (987654321, action)), 404, "NOT_FOUND",
                       "%s of no job" % action)
    # actions that need a reservation, on a job that is not reserved
    j3 = put(tube, b"three", delay=100)
    for action in ("release", "bury", "touch"):
        expect_problem(post("/jobs/%d/%s" % (j3, action)), 409, "NOT_RESERVED",
                       "%s of a delayed job without token" % action)
        expect_problem(post("/jobs/%d/%s%s" % (j3, action, q(reservation=d1["reservation"]))), 409,
                       "RESERVATION_MISMATCH", "%s of a delayed job with another job's token" % action)
    expect_status(delete("/jobs/%d%s" % (j1, q(reservation=d1["reservation"]))), 204, "delete j1")
    expect_status(delete("/jobs/%d%s" % (j2, q(reservation=d2["reservation"]))), 204, "delete j2")
    expect_status(delete("/jobs/%d" % j3), 204, "delete j3")


def check_no_token_hint(doc, what):
    """The detail of a problem about a job reserved by another client never
    suggests a token: there is none for it."""
    detail = doc["detail"].lower()
    for word in ("token", "reservation="):
        if word in detail and "no token" not in detail:
            raise AssertionError("%s: the detail suggests a token: %r" % (what, doc["detail"]))


def test_conflict_codes():
    """Every 409 says what happened in its code, and its detail names the
    job and its state: RESERVATION_REQUIRED (reserved over HTTP, no token),
    RESERVATION_MISMATCH (a token that is not the current reservation's),
    RESERVED_ELSEWHERE (a beanstalk client holds it: no token is suggested),
    NOT_RESERVED (release, bury, touch of a job that is not reserved),
    NOT_BURIED_OR_DELAYED (kick), ALREADY_RESERVED (reserve-job). None is
    NOT_FOUND (issue 14)."""
    tube = uniq("conflict")
    ready = put(tube, b"ready", priority=5)
    over_http = put(tube, b"over http", priority=1)
    d = reserve_one(tube, body=b"over http")

    def ask(cases):
        for fn, path, code, words in cases:
            what = "%s %s" % (fn.__name__.upper(), path)
            doc = expect_problem(fn(path), 409, code, what)
            for w in words:
                check(w in doc["detail"], "%s: %r not in the detail %r" % (what, w, doc["detail"]))
            if code == "RESERVED_ELSEWHERE" or "beanstalk or Gearman client" in words:
                check_no_token_hint(doc, what)
    cases = [
        (delete, "/jobs/%d" % over_http, "RESERVATION_REQUIRED", ["job %d" % over_http, "X-Reservation"]),
        (post, "/jobs/%d/kick" % ready, "NOT_BURIED_OR_DELAYED", ["job %d is ready" % ready]),
        (post, "/jobs/%d/kick" % over_http, "NOT_BURIED_OR_DELAYED", ["reserved over HTTP"]),
        (post, "/jobs/%d/reservations" % over_http, "ALREADY_RESERVED", ["reserved over HTTP"]),
    ]
    for action in ("release", "bury", "touch"):
        cases += [
            (post, "/jobs/%d/%s" % (ready, action), "NOT_RESERVED", ["job %d is ready" % ready]),
            (post, "/jobs/%d/%s" % (over_http, action), "RESERVATION_REQUIRED",
             ["job %d" % over_http, action, "X-Reservation: TOKEN", "reservation=TOKEN"]),
            (post, "/jobs/%d/%s?reservation=bogus" % (over_http, action), "RESERVATION_MISMATCH",
             ["job %d is reserved under another token" % over_http]),
            (post, "/jobs/%d/%s%s" % (ready, action, q(reservation=d["reservation"])), "RESERVATION_MISMATCH",
             ["ended", "job %d is ready" % ready]),
        ]
    ask(cases)
    with Beanstalk() as b:
        b.expect("watch %s\r\n" % tube, b"WATCHING 2\r\n")
        got, _ = b.job(b.cmd("reserve-with-timeout 2\r\n"), b"RESERVED")
        check_eq(got, ready, "the TCP client reserves the ready job")
        cases = [
            (delete, "/jobs/%d" % ready, "RESERVED_ELSEWHERE", ["job %d" % ready, "delete"]),
            (post, "/jobs/%d/kick" % ready, "NOT_BURIED_OR_DELAYED", ["beanstalk or Gearman client"]),
            (post, "/jobs/%d/reservations" % ready, "ALREADY_RESERVED", ["beanstalk or Gearman client"]),
        ]
        for action in ("release", "bury", "touch"):
            for path in ("/jobs/%d/%s" % (ready, action),
                         "/jobs/%d/%s%s" % (ready, action, q(reservation=d["reservation"]))):
                cases.append((post, path, "RESERVED_ELSEWHERE", ["beanstalk or Gearman client", action]))
        ask(cases)
        b.expect("delete %d\r\n" % ready, b"DELETED\r\n")
    expect_status(delete("/jobs/%d%s" % (over_http, q(reservation=d["reservation"]))), 204, "delete")

def test_reservation_token_header():
    """The token may come in the X-Reservation header (the name of the raw
    reply's header), so that it stays out of URLs and proxy logs: delete,
    release, bury and touch take it; the query parameter still works; both
    given and equal is fine, both given and different is 400."""
    tube = uniq("tokhdr")
    jid = put(tube, b"by header", ttr=30)
    d = reserve_one(tube, body=b"by header")
    tok = {"X-Reservation": d["reservation"]}
    j = check_job(expect_json(post("/jobs/%d/touch" % jid, headers=tok), 200, "touch with the header"), "touch")
    check_eq(j["state"], "reserved", "touched")
    doc = expect_problem(post("/jobs/%d/touch%s" % (jid, q(reservation="1-1-" + "0" * 32)), headers=tok), 400,
                         "BAD_FORMAT", "header and query differ")
    check("X-Reservation" in doc["detail"], "the 400 names the header: %r" % doc["detail"])
    expect_problem(delete("/jobs/%d" % jid, headers={"X-Reservation": "1-1-" + "0" * 32}), 409,
                   "RESERVATION_MISMATCH", "delete with a wrong token in the header")
    j = check_job(expect_json(post("/jobs/%d/release%s" % (jid, q(reservation=d["reservation"], delay=0)),
                                   headers=tok), 200, "header and query equal"), "release")
    check_eq((j["state"], j["releases"]), ("ready", 1), "released")
    d = reserve_one(tube, body=b"by header")
    tok = {"X-Reservation": d["reservation"]}
    j = check_job(expect_json(post("/jobs/%d/bury" % jid, headers=tok), 200, "bury with the header"), "bury")
    check_eq(j["state"], "buried", "buried")
    # raw reserve: the reply's X-Reservation goes back as it came
    expect_json(post("/jobs/%d/kick" % jid), 200, "kick")
    r = reserve(tube, headers={"Accept": "application/octet-stream"})
    expect_status(r, 200, "raw reserve")
    expect_status(delete("/jobs/%s" % r.header("X-Job-Id"), headers={"X-Reservation": r.header("X-Reservation")}),
                  204, "delete with the header of the raw reply")
    expect_problem(get("/jobs/%d" % jid), 404, "NOT_FOUND", "deleted")

def test_release():
    tube = uniq("rel")
    jid = put(tube, b"again", priority=20)
    d = reserve_one(tube)
    r = post("/jobs/%d/release%s" % (jid, q(reservation=d["reservation"], priority=7)))
    j = check_job(expect_json(r, 200, "release"), "release reply")
    check_eq((j["id"], j["state"], j["priority"], j["releases"]), (jid, "ready", 7, 1), "after release")
    expect_problem(post("/jobs/%d/touch%s" % (jid, q(reservation=d["reservation"]))), 409,
                   "RESERVATION_MISMATCH",
                   "old token after release (job ready)")
    expect_problem(delete("/jobs/%d%s" % (jid, q(reservation=d["reservation"]))), 409,
                   "RESERVATION_MISMATCH", "delete a released job with its old token")
    d2 = reserve_one(tube, body=b"again")
    check_eq(d2["reserves"], 2, "reserves after the second reserve")
    check(d2["reservation"] != d["reservation"], "a new reservation must have a new token")
    expect_problem(post("/jobs/%d/release%s" % (jid, q(reservation=d["reservation"]))), 409,
                   "RESERVATION_MISMATCH", "release with the first reservation's token")
    r = post("/jobs/%d/release%s" % (jid, q(reservation=d2["reservation"], delay=100)))
    j = check_job(expect_json(r, 200, "release with delay"), "release reply")
    check_eq((j["state"], j["priority"], j["delay"], j["releases"]), ("delayed", 7, 100, 2),
             "after release with delay (priority kept)")
    for params in ("priority=x", "delay=-3"):
        d3 = expect_json(post("/jobs/%d/reservations" % jid), 200, "reserve-job")
        expect_problem(post("/jobs/%d/release?reservation=%s&%s" % (jid, d3["reservation"], params),
                            via="direct"), 400, "BAD_FORMAT", "release with %s" % params)
        expect_json(post("/jobs/%d/release%s" % (jid, q(reservation=d3["reservation"], delay=100))), 200,
                    "release")
    expect_status(delete("/jobs/%d" % jid), 204, "delete the delayed job")


def test_bury_peek_kick():
    tube = uniq("bury")
    jid = put(tube, b"bury me", priority=30)
    d = reserve_one(tube)
    j = check_job(expect_json(post("/jobs/%d/bury%s" % (jid, q(reservation=d["reservation"], priority=9))),
                              200, "bury"), "bury reply")
    check_eq((j["state"], j["priority"], j["buries"]), ("buried", 9, 1), "after bury")
    expect_problem(post("/jobs/%d/bury%s" % (jid, q(reservation=d["reservation"]))), 409,
                   "RESERVATION_MISMATCH", "bury a buried job with the old token")
    p = check_job(expect_json(get("/tubes/%s/buried" % tube), 200, "peek buried"), "peek buried",
                  body=b"bury me")
    check_eq(p["id"], jid, "peeked buried id")
    expect_problem(get("/tubes/%s/ready" % tube), 404, "NOT_FOUND", "peek ready with none ready")
    j = check_job(expect_json(post("/jobs/%d/kick" % jid), 200, "kick buried job"), "kick reply")
    check_eq((j["state"], j["kicks"]), ("ready", 1), "after kick")
    expect_problem(post("/jobs/%d/kick" % jid), 409, "NOT_BURIED_OR_DELAYED", "kick a ready job")
    d = reserve_one(tube)
    expect_problem(post("/jobs/%d/kick" % jid), 409, "NOT_BURIED_OR_DELAYED", "kick a reserved job")
    expect_problem(post("/jobs/%d/kick" % 987654321), 404, "NOT_FOUND", "kick no job")
    expect_status(delete("/jobs/%d%s" % (jid, q(reservation=d["reservation"]))), 204, "delete")
    jd = put(tube, b"delayed", delay=100)
    j = check_job(expect_json(post("/jobs/%d/kick" % jd), 200, "kick delayed job"), "kick reply")
    check_eq(j["state"], "ready", "kicked delayed job")
    expect_status(delete("/jobs/%d" % jd), 204, "delete")


def test_touch_and_ttr():
    tube = uniq("touch")
    jid = put(tube, b"slow work", ttr=4)
    d = reserve_one(tube)
    wait_for(lambda: job_stats(jid)["time_left"] <= 3, "a second of the 4 s TTR to pass")
    j = check_job(expect_json(post("/jobs/%d/touch%s" % (jid, q(reservation=d["reservation"]))), 200, "touch"),
                  "touch reply")
    check(j["time_left"] >= 3 and j["state"] == "reserved", "after touch: %r" % j)
    expect_status(delete("/jobs/%d%s" % (jid, q(reservation=d["reservation"]))), 204,
                  "the token still works after touch")


def test_ttr_expiry_ends_the_reservation():
    tube = uniq("ttr")
    jid = put(tube, b"too slow", ttr=1)
    d = reserve_one(tube)
    wait_for(lambda: job_stats(jid)["state"] != "reserved", "the 1 s TTR to run out", timeout=4)
    j = job_stats(jid)
    check_eq((j["state"], j["timeouts"]), ("ready", 1), "after the TTR ran out")
    expect_problem(delete("/jobs/%d%s" % (jid, q(reservation=d["reservation"]))), 409, "RESERVATION_MISMATCH",
                   "delete with an expired token")
    d2 = reserve_one(tube)
    expect_problem(post("/jobs/%d/touch%s" % (jid, q(reservation=d["reservation"]))), 409,
                   "RESERVATION_MISMATCH", "touch with the expired token while reserved again")
    expect_status(delete("/jobs/%d%s" % (jid, q(reservation=d2["reservation"]))), 204, "delete")


def test_method_not_allowed_405():
    cases = (("PUT", "/jobs/1", "GET, HEAD, DELETE"), ("POST", "/jobs/1", "GET, HEAD, DELETE"),
             ("PATCH", "/tubes/x/jobs", "GET, HEAD, POST, DELETE"), ("DELETE", "/stats", "GET, HEAD"),
             ("POST", "/tubes", "GET, HEAD"), ("GET", "/tubes/x/reservations", "POST"),
             ("GET", "/reservations", "POST"), ("DELETE", "/tubes/x", "GET, HEAD"),
             ("PATCH", "/jobs/1/release", "POST"), ("GET", "/jobs/1/kick", "POST"),
             ("POST", "/jobs/1/body", "GET, HEAD"), ("GET", "/tubes/x/jobs/batch", "POST"),
             ("POST", "/openapi.yaml", "GET, HEAD"))
    for method, path, allow in cases:
        r = request(method, path, via="direct")
        expect_problem(r, 405, "METHOD_NOT_ALLOWED", "%s %s" % (method, path))
        check_eq(r.header("Allow"), allow, "Allow of %s %s" % (method, path))
    r = request("HEAD", "/tubes/x/reservations", via="direct")  # a 405 without its body
    check_eq((r.status, r.header("Allow"), r.body), (405, "POST", b""), "HEAD /tubes/x/reservations")


def concrete_path(pattern, tube, jid):
    """A route pattern of routes_from_source() with {x} filled in: the tube
    after "tubes", the job id after "jobs", a dashboard file after "ui", a
    client id (of none) after "clients"."""
    parts = pattern.split("/")
    fill = {"tubes": tube, "jobs": str(jid), "ui": "index.html", "clients": "999999"}
    for i, p in enumerate(parts):
        if p == "{x}":
            check(i > 0 and parts[i - 1] in fill, "cannot fill in %s" % pattern)
            parts[i] = fill[parts[i - 1]]
    return "/".join(parts)


def test_head_on_every_get_route():
    """HEAD is GET without the body on every route that has GET (the list
    comes from the route table, so a new GET route is covered): the same
    status and Content-Type, no body, and it changes nothing. HEAD
    /jobs/{id} used to delete the job."""
    tube = uniq("head")
    ready = put(tube, b"ready one")
    delayed = put(tube, b"delayed one", delay=100)
    buried = put(tube, b"to bury", priority=1)
    d = reserve_one(tube)
    check_eq(d["id"], buried, "the urgent job is reserved first")
    expect_json(post("/jobs/%d/bury%s" % (buried, q(reservation=d["reservation"]))), 200, "bury")
    held = put(tube, b"held", priority=2)
    h = reserve_one(tube)
    check_eq(h["id"], held, "reserve the job to hold")
    states = {ready: "ready", delayed: "delayed", buried: "buried", held: "reserved"}
    # HEAD goes to the server itself: prism 5.14 parses the (empty) body of
    # a HEAD answer whose Content-Type is JSON and fails it with a 500
    # "FetchError: invalid json response body" (as it does for an empty
    # JSON 204, stoplightio/prism#1361). The head operations of
    # openapi.yaml are still linted and matched with the route table.
    get_routes = sorted(p for p, m in routes_from_source() if m == "GET")
    check(len(get_routes) >= 12, "GET routes of the route table: %r" % get_routes)
    check_eq(sorted(p for p, m in routes_from_source() if m == "HEAD"), get_routes,
             "every GET route has HEAD")
    for pattern in get_routes:
        jids = sorted(states) if "/jobs/" in pattern else [ready]
        for jid in jids:
            path = concrete_path(pattern, tube, jid)
            if pattern == "/tubes/{x}/jobs":
                path += "?state=ready"  # required there
            # prism follows the redirect of /ui and reports the 200 it got
            g = get(path, via="direct" if path == "/ui" else "base")
            hd = request("HEAD", path, via="direct")
            what = "HEAD %s" % path
            check_eq(hd.status, g.status, "%s: status vs GET" % what)
            check(g.status == (301 if path == "/ui" else 200), "GET %s: %s" % (path, g.describe()))
            check_eq(hd.body, b"", "%s: body" % what)
            for name in ("Content-Type", "Location", "ETag"):
                check_eq(hd.header(name), g.header(name), "%s: %s" % (what, name))
            check(hd.header("Content-Length") is not None, "%s: no Content-Length" % what)
    # HEAD on a reserved job with its token, as a link checker that follows
    # a URL with its query would
    path = "/jobs/%d%s" % (held, q(reservation=h["reservation"]))
    expect_status(request("HEAD", path, via="direct"), 200, "HEAD %s" % path)
    for jid, state in sorted(states.items()):
        check_eq(job_stats(jid)["state"], state, "job %d after the HEAD requests" % jid)
    expect_status(request("HEAD", "/jobs/999999999", via="direct"), 404, "HEAD of no job")
    expect_status(delete("/jobs/%d%s" % (held, q(reservation=h["reservation"]))), 204, "delete held")
    for jid in (ready, delayed, buried):
        expect_status(delete("/jobs/%d" % jid), 204, "delete %d" % jid)


def test_unknown_route_404():
    for method, path in (("GET", "/"), ("GET", "/nope"), ("GET", "/jobs"), ("GET", "/jobs/1/nope"),
                         ("POST", "/tubes/x/y"), ("GET", "/tubes/a/b/c/d/e"), ("GET", "/stats/x"),
                         ("GET", "//stats")):
        expect_problem(request(method, path, via="direct"), 404, "NOT_FOUND", "%s %s" % (method, path))


# ---- tubes -------------------------------------------------------------------------------

def test_list_tubes():
    tube = uniq("list")
    put(tube, b"x")
    doc = expect_json(get("/tubes"), 200, "GET /tubes")
    check_eq(set(doc), {"tubes"}, "keys")
    check(tube in doc["tubes"] and "default" in doc["tubes"], "GET /tubes lacks %s or default: %r"
          % (tube, doc["tubes"][:20]))
    check_eq(len(doc["tubes"]), len(set(doc["tubes"])), "no name twice")


def test_tube_stats():
    tube = uniq("stats")
    put(tube, b"urgent", priority=1)
    put(tube, b"normal")
    put(tube, b"delayed", delay=100)
    put(tube, b"to bury", priority=2000)
    d = reserve_one(tube)        # priority 1
    b = reserve_one(tube)        # priority 2000 (before the default 2^31)
    expect_json(post("/jobs/%d/bury%s" % (b["id"], q(reservation=b["reservation"]))), 200, "bury")
    st = tube_stats(tube)
    check_eq(st["name"], tube, "name")
    got = {k: st[k] for k in ("current_jobs_urgent", "current_jobs_ready", "current_jobs_reserved",
                              "current_jobs_delayed", "current_jobs_buried", "total_jobs", "pause",
                              "pause_time_left", "cmd_delete", "cmd_pause_tube")}
    check_eq(got, {"current_jobs_urgent": 0, "current_jobs_ready": 1, "current_jobs_reserved": 1,
                   "current_jobs_delayed": 1, "current_jobs_buried": 1, "total_jobs": 4, "pause": 0,
                   "pause_time_left": 0, "cmd_delete": 0, "cmd_pause_tube": 0}, "tube stats")
    expect_status(delete("/jobs/%d%s" % (d["id"], q(reservation=d["reservation"]))), 204, "delete")
    check_eq(tube_stats(tube)["cmd_delete"], 1, "cmd_delete after a delete")
    expect_problem(get("/tubes/%s" % uniq("nosuch")), 404, "NOT_FOUND", "stats of no tube")


def test_tube_kick():
    tube = uniq("kick")
    ids = [put(tube, b"k%d" % i) for i in range(3)]
    for _ in ids:
        d = reserve_one(tube)
        expect_json(post("/jobs/%d/bury%s" % (d["id"], q(reservation=d["reservation"]))), 200, "bury")
    later = put(tube, b"delayed", delay=100)
    doc = expect_json(post("/tubes/%s/kick%s" % (tube, q(bound=2))), 200, "kick bound=2")
    check_eq(doc, {"kicked": 2}, "kick bound=2")
    check_eq(expect_json(post("/tubes/%s/kick" % tube), 200, "kick"), {"kicked": 1}, "kick default bound 1")
    check_eq(expect_json(post("/tubes/%s/kick%s" % (tube, q(bound=10))), 200, "kick"), {"kicked": 1},
             "kick with no buried job kicks the delayed one")
    check_eq(job_stats(later)["state"], "ready", "kicked delayed job")
    check_eq(expect_json(post("/tubes/%s/kick%s" % (tube, q(bound=10))), 200, "kick"), {"kicked": 0},
             "nothing left to kick")
    expect_problem(post("/tubes/%s/kick?bound=x" % tube, via="direct"), 400, "BAD_FORMAT", "bound=x")
    expect_problem(post("/tubes/%s/kick" % uniq("nosuch")), 404, "NOT_FOUND", "kick no tube")


# ---- a tube's jobs and bulk actions (issue 26) -----------------------------------------

PAGE_KEYS = {"tube", "state", "count", "jobs", "next"}


def jobs_page(tube, what, **params):
    """GET /tubes/T/jobs with params: the page, its keys and jobs checked."""
    doc = expect_json(get("/tubes/%s/jobs%s" % (tube, q(**params))), 200, what)
    check_eq(set(doc), PAGE_KEYS, "%s: page keys" % what)
    check_eq((doc["tube"], doc["state"]), (tube, params["state"]), "%s: tube and state" % what)
    check(doc["next"] is None or isinstance(doc["next"], str), "%s: next %r" % (what, doc["next"]))
    for j in doc["jobs"]:
        check_job(j, what, with_body=params.get("body") == 1)
        check_eq(j["state"], params["state"], "%s: a job's state" % what)
    return doc


def all_pages(tube, state, limit, what):
    """The ids of every page of a state, following next until null."""
    ids, cursor, pages = [], None, 0
    while True:
        doc = jobs_page(tube, "%s page %d" % (what, pages), state=state, limit=limit, cursor=cursor)
        check(len(doc["jobs"]) <= limit, "%s: a page longer than its limit" % what)
        ids += [j["id"] for j in doc["jobs"]]
        pages += 1
        if doc["next"] is None:
            return ids
        check_eq(len(doc["jobs"]), limit, "%s: a page before the end is full" % what)
        cursor = doc["next"]


def bury_all(b, tube, n):
    """Reserve and bury, over beanstalk connection b, n jobs of tube (which
    b watches alone), pipelined; returns their ids in burial order."""
    ids = []
    b.sock.sendall(b"reserve-with-timeout 0\r\n" * n)
    for _ in range(n):
        jid, _body = b.job(b.line(), b"RESERVED")
        ids.append(jid)
    b.sock.sendall(b"".join(b"bury %d 0\r\n" % jid for jid in ids))
    for _ in range(n):
        check_eq(b.line(), b"BURIED\r\n", "bury")
    return ids


def fill_buried(port, tube, n, chunk=5000):
    """n buried jobs in tube over beanstalk (pipelined in chunks); their ids."""
    ids = []
    with Beanstalk(port) as b:
        b.cmd("use %s\r\n" % tube)
        b.cmd("watch %s\r\n" % tube)
        b.cmd("ignore default\r\n")
        for start in range(0, n, chunk):
            k = min(chunk, n - start)
            b.sock.sendall(b"put 0 0 60 1\r\nx\r\n" * k)
            for _ in range(k):
                check(b.line().startswith(b"INSERTED "), "pipelined put")
            ids += bury_all(b, tube, k)
    return ids


def test_tube_jobs_in_serving_order():
    """GET /tubes/{tube}/jobs lists one state in the order the engine serves
    it (ready by priority then id, delayed by due time, buried by burial,
    reserved by id), with count, pages that follow `next` to the end (null),
    and each job as GET /jobs/{id} shows it, with its body only on body=1."""
    tube = uniq("browse")
    ready = [put(tube, b"r%d" % i, priority=p) for i, p in enumerate((5, 1, 5, 3, 1))]
    want_ready = [jid for _, jid in sorted(zip((5, 1, 5, 3, 1), ready))]
    delayed = [put(tube, b"d%d" % i, delay=d) for i, d in enumerate((300, 100, 200))]
    want_delayed = [delayed[1], delayed[2], delayed[0]]
    with Beanstalk(T.tcp_port) as b:
        b.cmd("use %s\r\n" % tube)
        b.cmd("watch %s\r\n" % tube)
        b.cmd("ignore default\r\n")
        b.sock.sendall(b"put 0 0 60 2\r\nb0\r\nput 0 0 60 2\r\nb1\r\nput 0 0 60 2\r\nb2\r\n")
        fresh = [int(b.line().split()[1]) for _ in range(3)]
        # reserve the three (priority 0 comes first), bury them in reverse
        for _ in range(3):
            b.job(b.cmd("reserve-with-timeout 0\r\n"), b"RESERVED")
        for jid in reversed(fresh):
            check_eq(b.cmd("bury %d 0\r\n" % jid), b"BURIED\r\n", "bury")
        want_buried = list(reversed(fresh))
        held = [b.job(b.cmd("reserve-with-timeout 0\r\n"), b"RESERVED")[0] for _ in range(2)]
        for state, want in (("ready", [j for j in want_ready if j not in held]), ("delayed", want_delayed),
                            ("buried", want_buried), ("reserved", sorted(held))):
            doc = jobs_page(tube, "state=%s" % state, state=state)
            check_eq([j["id"] for j in doc["jobs"]], want, "%s jobs in serving order" % state)
            check_eq((doc["count"], doc["next"]), (len(want), None), "%s: count and next" % state)
            check_eq(all_pages(tube, state, 1, state), want, "%s: pages of 1" % state)
        doc = jobs_page(tube, "body=1", state="buried", body=1)
        check_eq([j["body"] for j in doc["jobs"]], ["b2", "b1", "b0"], "bodies of body=1")
        check_eq(doc["jobs"][0], dict(job_stats(want_buried[0]), body="b2"), "a listed job is GET /jobs/{id}'s")
    expect_problem(get("/tubes/%s/jobs?state=ready" % uniq("nosuch")), 404, "NOT_FOUND", "no such tube")
    expect_json(delete("/tubes/%s/jobs?state=ready" % tube), 200, "clean up ready")
    expect_json(delete("/tubes/%s/jobs?state=delayed" % tube), 200, "clean up delayed")


def test_tube_jobs_cursor_survives_changes():
    """A cursor stays valid as jobs come and go: a job of the next page that
    was deleted is simply missing, a job put after the cursor's place shows,
    one put before it does not."""
    tube = uniq("cursor")
    ids = [put(tube, b"c%d" % i, priority=10) for i in range(6)]
    first = jobs_page(tube, "page 1", state="ready", limit=3)
    check_eq([j["id"] for j in first["jobs"]], ids[:3], "page 1")
    expect_status(delete("/jobs/%d" % ids[3]), 204, "delete the next page's first job")
    later = put(tube, b"later", priority=20)   # after the cursor: shows
    put(tube, b"earlier", priority=1)           # before it: does not
    second = jobs_page(tube, "page 2", state="ready", limit=3, cursor=first["next"])
    check_eq([j["id"] for j in second["jobs"]], ids[4:] + [later], "page 2 after the changes")
    check_eq(second["next"], None, "page 2 reached the end")
    more = put(tube, b"more", priority=30)  # the end's cursor still works
    check_eq([j["id"] for j in jobs_page(tube, "after the end", state="ready", limit=3,
                                         cursor=first["next"])["jobs"]], ids[4:] + [later], "page 2 again")
    last = jobs_page(tube, "page 2 of 2", state="ready", limit=2, cursor=first["next"])
    check_eq([j["id"] for j in jobs_page(tube, "page 3", state="ready", cursor=last["next"])["jobs"]],
             [later, more], "a job put after the last page's place shows on the next")
    expect_json(delete("/tubes/%s/jobs?state=ready" % tube), 200, "clean up")


def test_tube_jobs_limits_400():
    """limit 500 is a page, 501 and 0 are refused; state is required and
    must name a state; a cursor must be one the server gave; body is 0 or
    1. Each refusal is a 400 whose detail names the parameter."""
    tube = uniq("limits")
    for start in range(0, 501, 100):
        n = min(100, 501 - start)
        expect_json(post_json("/tubes/%s/jobs/batch" % tube, {"jobs": [{"body": "j"}] * n}), 200, "batch put")
    doc = jobs_page(tube, "limit=500", state="ready", limit=500)
    check_eq((len(doc["jobs"]), doc["count"]), (500, 501), "limit=500: a full page of 501 jobs")
    check(doc["next"], "limit=500 of 501: a next page")
    rest = jobs_page(tube, "the page after 500", state="ready", limit=500, cursor=doc["next"])
    check_eq((len(rest["jobs"]), rest["next"]), (1, None), "the 501st job, then the end")
    check_eq(len(jobs_page(tube, "default limit", state="ready")["jobs"]), 50, "default limit 50")
    cases = [("state=ready&limit=501", "'limit'"), ("state=ready&limit=0", "'limit'"),
             ("state=ready&limit=-1", "'limit'"), ("", "'state'"), ("state=bogus", "'state'"),
             ("state=READY", "'state'"), ("state=ready&body=2", "'body'"),
             ("state=ready&body=yes", "'body'")]
    cases += [("state=ready&cursor=%s" % urllib.parse.quote(c), "'cursor'")
              for c in ("", "1", "x.1", "1.", ".1", "1.2.3", "-1.2", "18446744073709551616.1", "1.2 ")]
    for query, name in cases:
        p = expect_problem(get("/tubes/%s/jobs?%s" % (tube, query), via="direct"), 400, "BAD_FORMAT", query)
        check(name in p["detail"], "%s: detail %r does not name %s" % (query, p["detail"], name))
    check_eq(expect_json(delete("/tubes/%s/jobs?state=ready&bound=all" % tube), 200, "clean up"),
             {"deleted": 501, "state": "ready"}, "bulk delete of 501")


def test_tube_bulk_delete():
    """DELETE /tubes/{tube}/jobs?state=S[&bound=N] deletes the tube's jobs in
    that state (all by default, else the first N in serving order) and
    nothing else; it counts one cmd-delete per job deleted (server and tube)
    and in total_jobs_deleted. Reserved jobs are refused (400), and so is a
    missing state or a bad bound."""
    tube = uniq("bulkdel")
    ready = [put(tube, b"r%d" % i, priority=i) for i in range(4)]
    delayed = [put(tube, b"d%d" % i, delay=100 + i) for i in range(2)]
    with Beanstalk(T.tcp_port) as b:
        b.cmd("watch %s\r\n" % tube)
        b.cmd("ignore default\r\n")
        buried = bury_all(b, tube, 3)  # the three most urgent ready ones
        held = b.job(b.cmd("reserve-with-timeout 0\r\n"), b"RESERVED")[0]
        check_eq((buried, held), (ready[:3], ready[3]), "buried and held")
        for query in ("state=reserved", "", "state=bogus", "state=buried&bound=x", "state=buried&bound=-1",
                      "state=buried&bound=4294967296", "state=buried&bound=ALL"):
            expect_problem(delete("/tubes/%s/jobs?%s" % (tube, query), via="direct"), 400, "BAD_FORMAT",
                           "DELETE ?%s" % query)
        expect_problem(delete("/tubes/%s/jobs?state=buried" % uniq("nosuch")), 404, "NOT_FOUND", "no tube")
        keys = ("cmd_delete", "total_jobs_deleted")
        before = server_stats()
        tube_before = tube_stats(tube)["cmd_delete"]
        check_eq(expect_json(delete("/tubes/%s/jobs?state=buried&bound=2" % tube), 200, "bound=2"),
                 {"deleted": 2, "state": "buried"}, "bound=2")
        check_eq(jobs_page(tube, "buried left", state="buried")["jobs"][0]["id"], buried[2],
                 "the first two in burial order went")
        check_eq(expect_json(delete("/tubes/%s/jobs?state=buried&bound=0" % tube), 200, "bound=0"),
                 {"deleted": 0, "state": "buried"}, "bound=0")
        check_eq(expect_json(delete("/tubes/%s/jobs?state=buried&bound=all" % tube), 200, "bound=all"),
                 {"deleted": 1, "state": "buried"}, "bound=all")
        check_eq(expect_json(delete("/tubes/%s/jobs?state=delayed" % tube), 200, "all delayed"),
                 {"deleted": 2, "state": "delayed"}, "delayed")
        check_eq(expect_json(delete("/tubes/%s/jobs?state=ready&bound=4294967295" % tube), 200, "no ready"),
                 {"deleted": 0, "state": "ready"}, "no ready job (the largest bound)")
        after = server_stats()
        check_eq({k: after[k] - before[k] for k in keys}, {"cmd_delete": 5, "total_jobs_deleted": 5},
                 "server counters: one per job deleted")
        check_eq(tube_stats(tube)["cmd_delete"] - tube_before, 5, "the tube's cmd_delete")
        check_eq(b.cmd("peek-buried\r\n"), b"NOT_FOUND\r\n", "no buried job over beanstalk")
        check_eq(b.cmd("peek-delayed\r\n"), b"NOT_FOUND\r\n", "no delayed job over beanstalk")
        check_eq(b.cmd("delete %d\r\n" % held), b"DELETED\r\n", "the reserved job was left alone")
    for jid in buried + delayed:
        expect_problem(get("/jobs/%d" % jid), 404, "NOT_FOUND", "deleted job %d" % jid)


def test_tube_bulk_kick():
    """POST /tubes/{tube}/kick?state=buried|delayed&bound=N|all kicks the
    jobs of that state only; without state beanstalk's rule (buried first)
    and bound 1 stay; ready or reserved is refused. One request is one
    cmd-kick, as beanstalk's `kick N`."""
    tube = uniq("bulkkick")
    for i in range(3):
        put(tube, b"k%d" % i)
    delayed = [put(tube, b"d%d" % i, delay=100) for i in range(2)]
    with Beanstalk(T.tcp_port) as b:
        b.cmd("watch %s\r\n" % tube)
        b.cmd("ignore default\r\n")
        buried = bury_all(b, tube, 3)
    for query in ("state=ready", "state=reserved", "state=x", "state=buried&bound=x", "state=buried&bound=1.5"):
        expect_problem(post("/tubes/%s/kick?%s" % (tube, query), via="direct"), 400, "BAD_FORMAT", query)
    before = server_stats()["cmd_kick"]
    check_eq(expect_json(post("/tubes/%s/kick?state=delayed&bound=all" % tube), 200, "delayed all"),
             {"kicked": 2}, "all delayed, while buried ones wait")
    check_eq([job_stats(j)["state"] for j in delayed + buried], ["ready"] * 2 + ["buried"] * 3, "states")
    check_eq(expect_json(post("/tubes/%s/kick" % tube), 200, "no state"), {"kicked": 1}, "default bound 1")
    check_eq(expect_json(post("/tubes/%s/kick?state=buried&bound=all" % tube), 200, "buried all"),
             {"kicked": 2}, "the other buried")
    check_eq(expect_json(post("/tubes/%s/kick?state=buried&bound=all" % tube), 200, "none"), {"kicked": 0},
             "nothing left")
    check_eq(server_stats()["cmd_kick"] - before, 4, "cmd_kick: one per request")
    check_eq(expect_json(delete("/tubes/%s/jobs?state=ready" % tube), 200, "clean up")["deleted"], 5, "clean up")


BULK_JOBS = 100000   # jobs of the bulk tests in steps: many loop turns' worth, even unsanitized


def test_bulk_delete_in_steps_other_clients_served():
    """A bulk delete of 100,000 buried jobs runs in steps of about 1 ms, one
    per loop turn (the server's debug line http_bulk_steps counts them and
    times the longest), a beanstalk client's round trips are answered
    while it runs, and the answer counts them all."""
    with own_server(["-VV"], "bulk delete in steps") as srv:
        tube = uniq("steps")
        fill_buried(srv.tcp_port, tube, BULK_JOBS)
        with Beanstalk(srv.tcp_port) as b:
            bulk = Later(lambda: delete("/tubes/%s/jobs?state=buried" % tube, timeout=120))
            bulk.start()
            trips = 0
            while bulk.is_alive() or trips == 0:
                check(b.cmd("list-tube-used\r\n").startswith(b"USING "), "a round trip meanwhile")
                trips += 1
        doc = expect_json(bulk.get(120), 200, "bulk delete")
        check_eq(doc, {"deleted": BULK_JOBS, "state": "buried"}, "the answer")
        expect_problem(get("/tubes/%s" % tube), 404, "NOT_FOUND", "the emptied tube is gone")
        line = wait_for(lambda: re.search(r"event=http_bulk_steps action=delete done=(\d+) left=0 steps=(\d+) "
                                          r"longest_step_us=(\d+)", srv.stderr()), "the http_bulk_steps line")
        done, steps, longest_us = map(int, line.groups())
        check_eq(done, BULK_JOBS, "the steps' count")
        check(steps >= 2, "100,000 deletes in %d step(s): want more than one loop turn" % steps)
        print("  %d jobs in %d steps, the longest %d us; %d round trips meanwhile" % (done, steps, longest_us, trips))


def test_two_bulk_deletes_of_one_tube():
    """Two bulk deletes of the same 100,000 buried jobs at once: their steps
    interleave, the one that deletes the last job frees the tube, and the
    other then finds no tube at its next step and ends (the bulk action
    names its tube at each step and never holds a freed one; ASan checks).
    Together they delete every job once; an answer is 200, or 404 for one
    that arrived after the tube was gone."""
    with own_server([], "two bulk deletes") as srv:
        tube = uniq("twice")
        fill_buried(srv.tcp_port, tube, BULK_JOBS)
        bulks = [Later(lambda: delete("/tubes/%s/jobs?state=buried" % tube, timeout=120)) for _ in range(2)]
        for bulk in bulks:
            bulk.start()
        deleted = []
        for bulk in bulks:
            r = bulk.get(120)
            if r.status == 404:
                expect_problem(r, 404, "NOT_FOUND", "a bulk delete after the tube was freed")
                deleted.append(0)
            else:
                deleted.append(expect_json(r, 200, "a bulk delete")["deleted"])
        check_eq(sum(deleted), BULK_JOBS, "jobs deleted by the two (%r)" % deleted)
        check_eq(server_stats()["current_jobs_buried"], 0, "no buried job left")
        expect_problem(get("/tubes/%s" % tube), 404, "NOT_FOUND", "the tube is gone")
        print("  the two deleted %r" % deleted)


BULK_AT_ONCE = 8            # bulk deletes started together
BULK_AT_ONCE_JOBS = 50000   # buried jobs of each one's tube
BULK_STEP_MS = 1.0          # GW_BULK_STEP_NS: the step budget of a loop turn, all actions together


def test_bulk_deletes_at_once_share_one_budget():
    """Eight bulk deletes sent at once, each of its own tube of 50,000
    buried jobs, share one step budget a loop turn (about 1 ms, round
    robin; issue 27): another client's round trips (beanstalk `stats`,
    until no buried job is left) wait about one budget, as beside a single
    bulk delete. With a budget each they waited about 8 ms (8 steps a
    turn): the median round trip must stay under 4 budgets (the 90th
    percentile and the worst are printed: a loaded machine's own stalls
    show there), and the longest turn's CPU time on the bulk steps (the
    server's http_bulk_steps lines: longest_turn_cpu_us) under 3. Each answer counts its tube's jobs, every tube is gone, and the
    server deleted each job once. Prints each action's steps, longest step
    and longest turn (its http_bulk_steps line)."""
    with own_server(["-VV"], "bulk deletes at once") as srv:
        tubes = [uniq("atonce%d" % i) for i in range(BULK_AT_ONCE)]
        for tube in tubes:
            fill_buried(srv.tcp_port, tube, BULK_AT_ONCE_JOBS)
        before = server_stats()["total_jobs_deleted"]
        with Beanstalk(srv.tcp_port) as b:
            check(b.cmd("list-tube-used\r\n").startswith(b"USING "), "the probe's connection")
            conns = [http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=120) for _ in tubes]
            for conn, tube in zip(conns, tubes):  # all sent before any answer is read
                conn.request("DELETE", "/tubes/%s/jobs?state=buried" % tube)
            trips = []  # round trips (ms) answered while buried jobs were still there
            while True:
                t0 = time.monotonic()
                buried = int(b.stats()["current-jobs-buried"])
                if buried == 0:
                    break
                trips.append((time.monotonic() - t0) * 1000.0)
        for conn, tube in zip(conns, tubes):
            r = conn.getresponse()
            check_eq((r.status, json.loads(r.read())), (200, {"deleted": BULK_AT_ONCE_JOBS, "state": "buried"}),
                     "the answer for %s" % tube)
            conn.close()
            expect_problem(get("/tubes/%s" % tube), 404, "NOT_FOUND", "the emptied tube %s is gone" % tube)
        check_eq(server_stats()["total_jobs_deleted"] - before, BULK_AT_ONCE * BULK_AT_ONCE_JOBS,
                 "jobs deleted by the server: each once")
        steps = wait_for(lambda: (lambda found: found if len(found) == BULK_AT_ONCE else None)(
            re.findall(r"event=http_bulk_steps action=delete done=\d+ left=0 steps=(\d+) longest_step_us=(\d+) "
                       r"longest_step_cpu_us=\d+ longest_turn_cpu_us=(\d+)", srv.stderr())),
            "the http_bulk_steps lines")
        print("  steps, longest step and longest turn's CPU (us) of each: %s" % ", ".join("/".join(t) for t in steps))
        longest_turn_ms = max(int(t[2]) for t in steps) / 1000.0
        check(longest_turn_ms < 3 * BULK_STEP_MS, "a loop turn used %.2f ms of CPU on the bulk steps: want under %.1f ms"
              % (longest_turn_ms, 3 * BULK_STEP_MS))
        check(len(trips) >= 3, "only %d round trips while the bulk deletes ran" % len(trips))
        trips.sort()
        median, p90, worst = trips[len(trips) // 2], trips[len(trips) * 9 // 10], trips[-1]
        print("  %d bulk deletes of %d jobs at once: %d round trips meanwhile, median %.2f ms, p90 %.2f ms, "
              "worst %.2f ms" % (BULK_AT_ONCE, BULK_AT_ONCE_JOBS, len(trips), median, p90, worst))
        check(median < 4 * BULK_STEP_MS, "median round trip %.2f ms: want under %.1f ms" % (median, 4 * BULK_STEP_MS))


def test_bulk_delete_stops_when_its_client_leaves():
    """A client that closes its connection while its bulk delete runs stops
    it (docs/http.md): the jobs deleted are gone, the others are all still
    there, and the server goes on."""
    with own_server([], "bulk delete abandoned") as srv:
        tube = uniq("leave")
        fill_buried(srv.tcp_port, tube, BULK_JOBS)
        s = socket.create_connection(("127.0.0.1", srv.http_port), timeout=5)
        s.sendall(("DELETE /tubes/%s/jobs?state=buried HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" % tube).encode())
        s.close()
        with Beanstalk(srv.tcp_port) as b:
            def settled():
                a = tube_stats(tube)["current_jobs_buried"]
                time.sleep(0.05)
                return a if tube_stats(tube)["current_jobs_buried"] == a else None
            left = wait_for(settled, "the bulk delete to stop", timeout=30)
            check(0 < left < BULK_JOBS, "%d of %d buried jobs left: want it stopped partway" % (left, BULK_JOBS))
            check_eq(server_stats()["total_jobs_deleted"] + left, BULK_JOBS, "deleted + left = all")
            check_eq(int(b.stats()["current-jobs-buried"]), left, "beanstalk sees the same")


LOGGED_BULK_JOBS = 200000  # buried jobs of the bulk delete with a log
LOGGED_BULK_BOUND = 150000  # ... of which it deletes the first (burial order)
LOG_STEP_JOBS = 4096        # GW_BULK_LOG_STEP_JOBS: jobs a step acts on at most with a log


def test_bulk_delete_with_log_paced_and_kept():
    """A bulk delete with a log (-b, -f 0: every answer waits for its sync)
    of the first 150,000 of 200,000 buried jobs: it answers with that count
    after steps of at most 4,096 jobs each (the next waits until the log has
    written the last one's records: log_wait_us in the server's
    http_bulk_steps line), while another client's puts are answered; after
    a restart from the log exactly the jobs it did not delete are there:
    the other 50,000 buried ones in burial order, the tube's ready jobs,
    another tube's buried jobs and every put made meanwhile. How long the
    other client's puts waited is bench/browse --fsync 0's to measure
    (docs/performance.md), not asserted here; this prints it."""
    logdir = tempfile.mkdtemp(prefix="beangate-bulklog-")
    try:
        srv = Server(["-b", logdir, "-f", "0", "-VV"]).start()
        try:
            saved = T.base, T.direct
            T.base = T.direct = ("127.0.0.1", srv.http_port)
            try:
                tube, other, side = uniq("logged"), uniq("loggedother"), uniq("loggedside")
                ids = fill_buried(srv.tcp_port, tube, LOGGED_BULK_JOBS)
                ready = [put(tube, b"ready %d" % i) for i in range(3)]
                kept_buried = fill_buried(srv.tcp_port, other, 2)
                with Beanstalk(srv.tcp_port) as b:
                    b.cmd("use %s\r\n" % side)
                    bulk = Later(lambda: delete("/tubes/%s/jobs?state=buried&bound=%d" % (tube, LOGGED_BULK_BOUND),
                                                timeout=300))
                    bulk.start()
                    trips, side_ids = [], []
                    while bulk.is_alive() or not trips:
                        t0 = time.monotonic()
                        side_ids.append(b.put(b"meanwhile"))
                        trips.append(time.monotonic() - t0)
                doc = expect_json(bulk.get(300), 200, "the bulk delete")
                check_eq(doc, {"deleted": LOGGED_BULK_BOUND, "state": "buried"}, "the answer")
                line = wait_for(lambda: re.search(r"event=http_bulk_steps action=delete done=(\d+) left=0 "
                                                  r"steps=(\d+) .*log_wait_us=(\d+)", srv.stderr()),
                                "the http_bulk_steps line")
                done, steps, log_wait_us = map(int, line.groups())
                check_eq(done, LOGGED_BULK_BOUND, "the steps' count")
                check(steps >= -(-LOGGED_BULK_BOUND // LOG_STEP_JOBS),
                      "%d deletes in %d steps: with a log a step deletes at most %d" % (done, steps, LOG_STEP_JOBS))
                trips.sort()
                print("  %d deleted in %d steps, %.3f s waiting for the log; %d puts meanwhile, round trip median "
                      "%.2f ms, max %.2f ms (not asserted: bench/browse --fsync 0)"
                      % (done, steps, log_wait_us / 1e6, len(trips), trips[len(trips) // 2] * 1000, trips[-1] * 1000),
                      flush=True)
            finally:
                T.base, T.direct = saved
            status, err = srv.stop()
        finally:
            srv.stop()
        check_stopped(status, err, "the server of the bulk delete")
        srv = Server(["-b", logdir]).start()
        try:
            saved = T.base, T.direct
            T.base = T.direct = ("127.0.0.1", srv.http_port)
            try:
                listed, cursor = [], None
                while True:
                    page = expect_json(get("/tubes/%s/jobs?state=buried&limit=500%s"
                                           % (tube, "&cursor=" + cursor if cursor else "")), 200, "a page")
                    listed += [j["id"] for j in page["jobs"]]
                    cursor = page["next"]
                    if cursor is None:
                        break
                check_eq(listed, ids[LOGGED_BULK_BOUND:], "the buried jobs after the restart: those not deleted")
                st = tube_stats(tube)
                check_eq((st["current_jobs_ready"], st["current_jobs_buried"]),
                         (len(ready), LOGGED_BULK_JOBS - LOGGED_BULK_BOUND), "the tube's jobs after the restart")
                for jid in ready + kept_buried + side_ids:
                    expect_status(get("/jobs/%d" % jid), 200, "job %d after the restart" % jid)
                st = server_stats()
                check_eq(sum(st["current_jobs_" + k] for k in ("ready", "reserved", "delayed", "buried")),
                         LOGGED_BULK_JOBS - LOGGED_BULK_BOUND + len(ready) + len(kept_buried) + len(side_ids),
                         "every job after the restart")
            finally:
                T.base, T.direct = saved
            status, err = srv.stop()
        finally:
            srv.stop()
        check_stopped(status, err, "the restarted server")
    finally:
        shutil.rmtree(logdir, ignore_errors=True)


def test_bulk_delete_at_shutdown_loses_nothing():
    """SIGTERM while a bulk delete runs, with a log (-b): the server exits 0
    and a restart from the log has exactly the jobs the answer did not
    count. The request is sent on a connection the server has taken (a
    request before it) while the server is stopped (SIGSTOP), then SIGTERM
    and SIGCONT: the loop then sees both at once. The answer is 503
    INTERRUPTED naming how many it deleted, or if the signal came first 503
    SHUTTING_DOWN (none), or if the steps ended first 200 (all)."""
    logdir = tempfile.mkdtemp(prefix="beangate-bulk-")
    try:
        srv = Server(["-b", logdir]).start()
        try:
            tube = uniq("stop")
            fill_buried(srv.tcp_port, tube, BULK_JOBS)
            conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=30)
            conn.request("GET", "/tubes/%s" % tube)
            check_eq(conn.getresponse().read() and 200, 200, "a first request on the connection")
            os.kill(srv.proc.pid, signal.SIGSTOP)
            try:
                conn.request("DELETE", "/tubes/%s/jobs?state=buried" % tube)
                time.sleep(0.05)  # the bytes are in the server's socket (loopback)
                os.kill(srv.proc.pid, signal.SIGTERM)
            finally:
                os.kill(srv.proc.pid, signal.SIGCONT)
            resp = conn.getresponse()
            r = Resp(resp.status, resp.reason, resp.getheaders(), resp.read(), 0, "DELETE bulk")
            conn.close()
            status, err = srv.stop()
        finally:
            srv.stop()
        check_stopped(status, err, "SIGTERM during a bulk delete")
        print("  the bulk delete at SIGTERM: %d %s" % (r.status, r.body[:200]), flush=True)
        if r.status == 200:
            done = expect_json(r, 200, "a bulk delete that ended first")["deleted"]
            check_eq(done, BULK_JOBS, "a 200 means all")
        elif b"SHUTTING_DOWN" in r.body:
            expect_problem(r, 503, "SHUTTING_DOWN", "the signal came first")
            done = 0
        else:
            p = expect_problem(r, 503, "INTERRUPTED", "the bulk delete at shutdown")
            done = int(re.search(r"after (\d+) jobs", p["detail"]).group(1))
        srv = Server(["-b", logdir]).start()
        try:
            with Beanstalk(srv.tcp_port) as b:
                left = int(b.stats()["current-jobs-buried"])
            check_eq(left, BULK_JOBS - done, "buried jobs after the restart (%d deleted)" % done)
            status, err = srv.stop()
        finally:
            srv.stop()
        check_stopped(status, err, "the restarted server")
    finally:
        shutil.rmtree(logdir, ignore_errors=True)


def test_tube_pause():
    tube = uniq("pause")
    jid = put(tube, b"paused")
    st = expect_json(post("/tubes/%s/pause%s" % (tube, q(delay=2))), 200, "pause delay=2")
    check_eq(set(st), TUBE_KEYS, "pause reply keys")
    check_eq((st["name"], st["pause"], st["cmd_pause_tube"]), (tube, 2, 1), "pause reply")
    check(1 <= st["pause_time_left"] <= 2, "pause_time_left %r" % st["pause_time_left"])
    expect_status(reserve(tube), 204, "reserve from a paused tube")
    t0 = time.monotonic()
    doc = check_job(expect_json(reserve(tube, timeout=6), 200, "long-poll across the pause"), "job",
                    reserved=True)
    took = time.monotonic() - t0
    check_eq(doc["id"], jid, "job after the pause")
    check(0.8 <= took <= 3.5, "the paused tube gave its job after %.2f s, want about 2 s" % took)
    st = expect_json(post("/tubes/%s/pause" % tube), 200, "pause with no delay")
    check_eq(st["pause"], 0, "pause 0 ends the pause")
    expect_problem(post("/tubes/%s/pause?delay=x" % tube, via="direct"), 400, "BAD_FORMAT", "delay=x")
    expect_problem(post("/tubes/%s/pause%s" % (uniq("nosuch"), q(delay=1))), 404, "NOT_FOUND", "pause no tube")
    expect_status(delete("/jobs/%d%s" % (jid, q(reservation=doc["reservation"]))), 204, "delete")


def test_peek_ready_delayed_buried():
    tube = uniq("peek")
    for state in ("ready", "delayed", "buried"):
        expect_problem(get("/tubes/%s/%s" % (tube, state)), 404, "NOT_FOUND",
                       "peek %s of a tube that does not exist" % state)
    r1 = put(tube, b"second", priority=9)
    r0 = put(tube, b"first", priority=1)
    dl = put(tube, b"soon", delay=50)
    put(tube, b"later", delay=100)
    expect_problem(get("/tubes/%s/buried" % tube), 404, "NOT_FOUND", "peek buried with none")
    p = check_job(expect_json(get("/tubes/%s/ready" % tube), 200, "peek ready"), "peek ready", body=b"first")
    check_eq(p["id"], r0, "peek ready gives the most urgent")
    p = check_job(expect_json(get("/tubes/%s/delayed" % tube), 200, "peek delayed"), "peek delayed",
                  body=b"soon")
    check_eq((p["id"], p["state"]), (dl, "delayed"), "peek delayed gives the soonest")
    r = get("/tubes/%s/ready" % tube, headers={"Accept": "application/octet-stream"})
    expect_status(r, 200, "raw peek")
    check_eq((r.body, r.header("X-Job-Id"), r.header("X-Reservation")), (b"first", str(r0), None),
             "raw peek (body, X-Job-Id, X-Reservation)")
    check_eq(job_stats(r0)["state"], "ready", "peek does not reserve")
    check_eq(job_stats(r1)["reserves"], 0, "peek does not reserve")


def test_stats():
    st = server_stats()
    check_eq(st["draining"], False, "draining")
    check_eq(st["binlog_failed"], False, "binlog_failed without -b")
    check(isinstance(st["subscriptions"], list), "subscriptions %r" % st["subscriptions"])
    check_eq(st["binlog_enabled"], False, "binlog_enabled without -b")
    check_eq(st["binlog_last_sync_age_ms"], None, "binlog_last_sync_age_ms without -b")
    check_eq(st["binlog_size"], 0, "binlog_size without -b")
    check_eq((st["shard_index"], st["shard_count"]), (0, 1), "the shard without --shard")
    for k in SERVER_KEYS - SERVER_KEYS_NOT_COUNTS:
        check(isinstance(st[k], int) and not isinstance(st[k], bool) and st[k] >= 0, "stats %s = %r" % (k, st[k]))
    before = st["total_jobs"]
    put(uniq("st"), b"x")
    check_eq(server_stats()["total_jobs"], before + 1, "total_jobs after one put")


def test_command_counters_count_http_requests():
    """HTTP requests count in the cmd-* counters of the beanstalk command they
    perform (docs/operations.md, "Command counters"): a long-poll that
    waited and was woken counts one reserve-with-timeout, not one per
    resume; a batch put counts each entry that is not malformed; a 400
    counts nothing; HEAD counts as GET."""
    keys = ("cmd_put", "cmd_reserve_with_timeout", "cmd_delete", "cmd_stats_job", "cmd_peek")

    def counters():
        st = server_stats()
        return {k: st[k] for k in keys}

    tube = uniq("count")
    before = counters()
    lp = Later(lambda: reserve(tube, timeout=10))
    lp.start()
    wait_for(lambda: waiting_on(tube) == 1, "the long-poll to wait")
    jid = put(tube, b"one")
    doc = check_job(expect_json(lp.get(12), 200, "woken long-poll"), "woken long-poll", reserved=True)
    check_eq(doc["id"], jid, "the long-poll got the job")
    expect_problem(post("/tubes/%s/jobs?priority=abc" % tube, body=b"x", via="direct"), 400,
                   "BAD_FORMAT", "a malformed put")
    r = post_json("/tubes/%s/jobs/batch" % tube, {"jobs": [{"body": "a"}, {"bodyy": "b"}, {"body": "c"}]},
                  via="direct")  # the proxy would refuse the malformed entry
    results = expect_json(r, 200, "batch put")["results"]
    check_eq([x["status"] for x in results], [201, 400, 201], "batch statuses")
    expect_status(request("HEAD", "/jobs/%d" % jid, via="direct"), 200, "HEAD of the job")
    expect_status(get("/jobs/%d" % jid), 200, "GET of the job")
    expect_status(get("/jobs/%d/body" % jid), 200, "GET of the body")
    expect_status(delete("/jobs/%d%s" % (jid, q(reservation=doc["reservation"]))), 204, "delete")
    after = counters()
    check_eq({k: after[k] - before[k] for k in keys},
             {"cmd_put": 3, "cmd_reserve_with_timeout": 1, "cmd_delete": 1, "cmd_stats_job": 2,
              "cmd_peek": 1}, "counters moved")
    for x in results:
        if x["status"] == 201:
            expect_status(delete("/jobs/%d" % x["id"]), 204, "delete a batch job")
def test_stats_jobs_reserved_and_deleted():
    """total_jobs_reserved and total_jobs_deleted count what happened to
    jobs, over HTTP and beanstalk alike, where the cmd_* counters count the
    requests (docs/operations.md, "Command counters"): a reserve with
    count=3 is one request and three reservations, a delete of no job is a
    request and no delete."""
    keys = ("total_jobs_reserved", "total_jobs_deleted", "cmd_reserve_with_timeout", "cmd_delete")

    def moved(before, after):
        return {k: after[k] - before[k] for k in keys if after[k] != before[k]}

    tube = uniq("jobcount")
    for body in (b"a", b"b", b"c"):
        put(tube, body)
    before = server_stats()
    jobs = expect_json(reserve(tube, count=3), 200, "reserve count=3")["jobs"]
    check_eq(len(jobs), 3, "jobs reserved at once")
    for job in jobs:
        expect_status(delete("/jobs/%d%s" % (job["id"], q(reservation=job["reservation"]))), 204, "HTTP delete")
    expect_problem(delete("/jobs/%d" % (jobs[-1]["id"])), 404, "NOT_FOUND", "delete of a deleted job")
    expect_status(reserve(tube), 204, "a reserve that gets nothing")
    mid = server_stats()
    check_eq(moved(before, mid), {"total_jobs_reserved": 3, "total_jobs_deleted": 3,
                                  "cmd_reserve_with_timeout": 2, "cmd_delete": 4}, "over HTTP")
    with Beanstalk(T.tcp_port) as b:
        b.cmd("use %s\r\n" % tube)
        jid = b.put(b"t")
        b.cmd("watch %s\r\n" % tube)
        b.cmd("ignore default\r\n")
        check_eq(b.cmd("reserve-with-timeout 0\r\n"), b"RESERVED %d 1\r\n" % jid, "TCP reserve")
        check_eq(b.line(), b"t\r\n", "the reserved body")
        check_eq(b.cmd("delete %d\r\n" % jid), b"DELETED\r\n", "TCP delete")
    check_eq(moved(mid, server_stats()), {"total_jobs_reserved": 1, "total_jobs_deleted": 1,
                                          "cmd_reserve_with_timeout": 1, "cmd_delete": 1}, "over beanstalk")


def test_stats_version_uptime_connections():
    """version is the binary's (-v), uptime counts seconds, and the open
    connections are counted by protocol: a beanstalk connection opened
    here shows up in current_beanstalk_connections (and in
    current_connections), this very request in current_http_connections."""
    status, out, _ = testlib.run_binary(T.binary, ["-v"], timeout=10)
    st = server_stats()
    check(st["version"] and st["version"] in out, "version %r not in `beangate -v`: %r" % (st["version"], out))
    check(st["uptime"] >= 0, "uptime %r" % st["uptime"])
    check(st["current_http_connections"] >= 1, "this request's connection is not counted: %r"
          % st["current_http_connections"])
    check_eq(st["current_gearman_connections"], 0, "Gearman connections without --gearman-port")
    before = st["current_beanstalk_connections"]
    with Beanstalk(T.tcp_port) as b:
        check_eq(b.cmd("list-tube-used\r\n"), b"USING default\r\n", "beanstalk connection")
        during = server_stats()
        check_eq(during["current_beanstalk_connections"], before + 1, "beanstalk connections with one more open")
        check_eq(during["current_connections"], during["current_beanstalk_connections"]
                 + during["current_gearman_connections"], "current_connections = beanstalk + Gearman")


def tube_page(what="GET /stats/tubes", **params):
    """GET /stats/tubes with params: the page, its shape checked."""
    doc = expect_json(get("/stats/tubes" + q(**params)), 200, what)
    check_eq(set(doc), {"total", "offset", "limit", "tubes"}, "%s: keys" % what)
    check(len(doc["tubes"]) <= doc["limit"], "%s: %d tubes, limit %d" % (what, len(doc["tubes"]), doc["limit"]))
    for t in doc["tubes"]:
        check_eq(set(t), TUBE_KEYS, "%s: tube keys" % what)
    return doc


def test_tube_stats_pages():
    """Pages of GET /stats/tubes: a filter on the name, sort by a stats
    field either way (ties by name), offset and limit walk the matches, and
    each tube's stats are those of GET /tubes/{tube}."""
    prefix = uniq("page")
    ready = [3, 1, 4, 1, 5, 0, 2, 6]          # ready jobs of tube i
    names = ["%s-%d" % (prefix, i) for i in range(len(ready))]
    for name, n in zip(names, ready):
        put(name, b"x", delay=100)            # every tube exists, even with 0 ready
        for _ in range(n):
            put(name, b"x")
    doc = tube_page(filter=prefix)
    check_eq(doc["total"], len(names), "total with the filter")
    check_eq(sorted(t["name"] for t in doc["tubes"]), sorted(names), "the filter finds every tube")
    by_name = {t["name"]: t for t in doc["tubes"]}
    for name in names[:2]:
        # the rates move with the clock between the two requests
        without_rates = [{k: v for k, v in doc.items() if k != "rates"} for doc in (by_name[name], tube_stats(name))]
        check_eq(without_rates[0], without_rates[1], "a page's stats of %s vs GET /tubes/%s" % (name, name))

    doc = tube_page(filter=prefix, sort="current_jobs_ready", order="desc")
    want = sorted(names, key=lambda n: (-ready[names.index(n)], n))
    check_eq([t["name"] for t in doc["tubes"]], want, "sorted by ready, most first, ties by name")
    doc = tube_page(filter=prefix, sort="current_jobs_ready")
    want_asc = sorted(names, key=lambda n: (ready[names.index(n)], n))
    check_eq([t["name"] for t in doc["tubes"]], want_asc, "sorted by ready, fewest first, ties by name")
    doc = tube_page(filter=prefix, sort="name", order="desc", offset=2, limit=3)
    check_eq([t["name"] for t in doc["tubes"]], sorted(names, reverse=True)[2:5], "name desc, offset 2, limit 3")
    check_eq((doc["total"], doc["offset"], doc["limit"]), (len(names), 2, 3), "total, offset, limit echoed")
    walked = []
    for offset in range(0, len(names), 3):
        walked += [t["name"] for t in tube_page(filter=prefix, sort="name", offset=offset, limit=3)["tubes"]]
    check_eq(walked, sorted(names), "pages of 3 walk every tube once")
    check_eq(tube_page(filter=prefix, offset=len(names))["tubes"], [], "an offset past the end: empty page")
    check_eq(tube_page(filter=uniq("nomatch"))["total"], 0, "a filter that matches nothing")

    # without filter and sort: the order of GET /tubes, a slice of it
    listed = expect_json(get("/tubes"), 200, "GET /tubes")["tubes"]
    doc = tube_page(limit=500)
    check_eq(doc["total"], len(listed), "total = every tube")
    check_eq([t["name"] for t in doc["tubes"]], listed[:500], "list order without sort")
    check_eq(tube_page()["limit"], 100, "default limit")

    # no beanstalk command reads many tubes' stats at once: a page counts in
    # no cmd-* counter (docs/operations.md, "Command counters")
    before = server_stats()
    tube_page(filter=prefix, sort="name")
    after = server_stats()
    check_eq({k: after[k] - before[k] for k in after if k.startswith("cmd_") and after[k] != before[k]},
             {"cmd_stats": 1}, "the counters a page moved (cmd_stats: the second GET /stats)")


def history():
    """GET /stats/history, its shape checked."""
    doc = expect_json(get("/stats/history"), 200, "GET /stats/history")
    check_eq(set(doc), {"interval", "end", "series"}, "history keys")
    check_eq(doc["interval"], 1, "interval")
    check_eq(sorted(doc["series"]), sorted(HISTORY_SERIES), "series names")
    n = len(doc["series"]["put"])
    check(n <= HISTORY_SAMPLES, "%d samples, at most %d" % (n, HISTORY_SAMPLES))
    for name, values in doc["series"].items():
        check_eq(len(values), n, "samples of %s" % name)
        check(all(isinstance(v, int) and v >= 0 for v in values), "%s: counts %r" % (name, values[-5:]))
    check(abs(doc["end"] - time.time()) <= 3, "end %d, now %.1f" % (doc["end"], time.time()))
    return doc


def history_since(doc, second, name):
    """The samples of series `name` for the seconds from `second` (Unix) on."""
    values = doc["series"][name]
    first = doc["end"] - len(values) + 1       # the second of values[0]
    return values[max(0, second - first):]


def test_stats_history_shows_puts_and_deletes():
    """GET /stats/history: a sample a second; jobs put (over HTTP and
    beanstalk) and deleted show in the put and delete series within
    seconds, and the ready gauge counts them."""
    tube = uniq("history")
    before = history()
    since = int(time.time()) - 1               # the clocks' seconds may differ by a fraction
    ids = [put(tube, b"h%d" % i) for i in range(5)]
    with Beanstalk(T.tcp_port) as b:
        check_eq(b.cmd("use %s\r\n" % tube), ("USING %s\r\n" % tube).encode(), "use")
        ids += [b.put(b"b%d" % i) for i in range(2)]
        # a sample of a second after the puts (the clocks' seconds may differ by a fraction)
        done = int(time.time()) + 2
        doc = wait_for(lambda: (lambda d: d if d["end"] >= done and sum(history_since(d, since, "put")) >= 7
                                else None)(history()), "the 7 puts in the put series", timeout=10)
        check(doc["end"] >= before["end"], "end went back: %d, then %d" % (before["end"], doc["end"]))
        check(doc["series"]["ready"][-1] >= 7, "ready gauge %r" % doc["series"]["ready"][-5:])
        check(doc["series"]["connections"][-1] >= 1, "connections gauge (the beanstalk one open) %r"
              % doc["series"]["connections"][-5:])
    since = int(time.time()) - 1
    for jid in ids:
        expect_status(delete("/jobs/%d" % jid), 204, "delete")
    done = int(time.time()) + 2
    wait_for(lambda: (lambda d: d["end"] >= done and sum(history_since(d, since, "delete")) >= 7)(history()),
             "the 7 deletes in the delete series", timeout=10)


def test_tube_rates_on_the_first_poll():
    """Each tube object has its put and delete rates per second, measured by
    the server over its last 5 to 10 seconds: not zero on the first GET
    after puts, 0 for a tube that does nothing, the same in GET /stats/tubes."""
    busy, idle = uniq("rates"), uniq("idle")
    with Beanstalk(T.tcp_port) as b:
        check_eq(b.cmd("watch %s\r\n" % idle), b"WATCHING 2\r\n", "watch makes the idle tube")
        ids = [put(busy, b"r%d" % i) for i in range(10)]
        st = wait_for(lambda: (lambda t: t if t["rates"]["put"] > 0 else None)(tube_stats(busy)),
                      "a put rate in GET /tubes/%s" % busy)
        check_eq(set(st["rates"]), {"put", "delete"}, "rates keys")
        # 10 puts over about 5 to 10 s: over more than 4 s however the timer's
        # ticks fall (sweeps are 5 ticks apart), more under a slow build
        check(0 < st["rates"]["put"] <= 2.5, "put rate %r for 10 puts" % st["rates"])
        check_eq(st["rates"]["delete"], 0, "delete rate before any delete")
        for jid in ids[:4]:
            expect_status(delete("/jobs/%d" % jid), 204, "delete")
        st = tube_stats(busy)
        check(0 < st["rates"]["delete"] <= 1.0, "delete rate %r for 4 deletes" % st["rates"])
        check_eq(tube_stats(idle)["rates"], {"put": 0, "delete": 0}, "an idle tube's rates")
        page = tube_page(filter=busy)["tubes"]
        check_eq([t["name"] for t in page], [busy], "the busy tube's page")
        check(page[0]["rates"]["put"] > 0 and page[0]["rates"]["delete"] > 0,
              "GET /stats/tubes rates %r" % page[0]["rates"])


def test_tube_rates_settle_with_many_tubes():
    """With 100,000 tubes a sweep of the tubes takes 25 steps of 4096, one a
    loop turn (core/history.c): a tube's rates are back to 0 two sweeps
    after its puts stopped, about 10 s later, as with few tubes (with a step
    a second, as the history's timer alone would take them, it takes 50 s)."""
    tubes, pipeline = 100000, 20000
    with own_server([], "a server of 100,000 tubes") as srv:
        with Beanstalk(srv.tcp_port) as b:
            busy = uniq("settle")
            for start in range(0, tubes, pipeline):
                b.sock.sendall(b"".join(b"use many-%06d\r\nput 0 0 60 1\r\nx\r\n" % i
                                        for i in range(start, start + pipeline)))
                for i in range(2 * pipeline):
                    line = b.line(timeout=60)
                    check(line.startswith(b"USING") or line.startswith(b"INSERTED"), "reply %r" % line)
            for i in range(10):
                put(busy, b"s%d" % i)
            wait_for(lambda: tube_stats(busy)["rates"]["put"] > 0, "a put rate in GET /tubes/%s" % busy)
            t0 = time.monotonic()
            wait_for(lambda: tube_stats(busy)["rates"] == {"put": 0, "delete": 0},
                     "the rates of %s back to 0 two sweeps after its puts" % busy, timeout=20)
            took = time.monotonic() - t0
            check(took < 20, "rates at 0 after %.1f s" % took)


def test_tube_stats_pages_filter_with_slash_and_plus():
    """%2F and %2B in the filter are '/' and '+' of tube names."""
    tube = uniq("a/b+c")
    enc = tube.replace("/", "%2F").replace("+", "%2B")
    doc = expect_json(post("/tubes/%s/jobs" % enc, body=b"x", via="direct"), 201, "put into %s" % enc)
    check_eq(doc["tube"], tube, "tube of the put")
    for encoded in (enc, tube.replace("+", "%2B")):
        doc = expect_json(get("/stats/tubes?filter=" + encoded, via="direct"), 200, "filter=%s" % encoded)
        check_eq([t["name"] for t in doc["tubes"]], [tube], "filter=%s" % encoded)


def test_tube_stats_pages_bad_parameters_400():
    for query in ("limit=0", "limit=501", "limit=abc", "limit=-1", "offset=-1", "offset=x",
                  "offset=4294967296", "sort=nope", "sort=", "order=up", "order=asc",
                  "sort=name&order=DESC", "filter=a%20b", "filter=%3Cscript%3E", "filter=" + "a" * 201):
        expect_problem(get("/stats/tubes?" + query, via="direct"), 400, "BAD_FORMAT", "GET /stats/tubes?%s"
                       % query[:40])


def ui_files():
    """{name: bytes} of the ui/ folder, as built into the server."""
    folder = os.path.join(REPO, "ui")
    out = {}
    for name in sorted(os.listdir(folder)):
        if not name.startswith(".") and not name.endswith("~"):
            with open(os.path.join(folder, name), "rb") as f:
                out[name] = f.read()
    return out


UI_TYPES = {".html": "text/html; charset=utf-8", ".css": "text/css; charset=utf-8",
            ".js": "text/javascript; charset=utf-8", ".svg": "image/svg+xml"}


def check_ui_headers(r, what):
    """The headers every file of the dashboard carries."""
    csp = r.header("Content-Security-Policy") or ""
    directives = {d.strip().split(" ")[0]: d.strip() for d in csp.split(";") if d.strip()}
    check_eq(directives.get("default-src"), "default-src 'none'", "%s: CSP default-src" % what)
    check_eq(directives.get("script-src"), "script-src 'self'", "%s: CSP script-src (no inline script)" % what)
    check_eq(directives.get("style-src"), "style-src 'self'", "%s: CSP style-src (no inline style)" % what)
    check_eq(directives.get("frame-ancestors"), "frame-ancestors 'none'", "%s: CSP frame-ancestors" % what)
    check_eq(directives.get("require-trusted-types-for"), "require-trusted-types-for 'script'",
             "%s: CSP Trusted Types" % what)
    check("unsafe" not in csp, "%s: CSP allows something unsafe: %s" % (what, csp))
    for name, want in (("X-Content-Type-Options", "nosniff"), ("Referrer-Policy", "no-referrer"),
                       ("X-Frame-Options", "DENY"), ("Cache-Control", "no-cache")):
        check_eq(r.header(name), want, "%s: %s" % (what, name))
    etag = r.header("ETag") or ""
    check(len(etag) == 34 and etag[0] == etag[-1] == '"' and not etag.startswith("W/"),
          "%s: ETag %r is not a strong quoted tag" % (what, etag))
    return etag


def test_ui_files_served():
    """Every file of ui/ is served at /ui/{name}, byte for byte, with its
    Content-Type and the dashboard's headers; /ui/ is index.html."""
    files = ui_files()
    check("index.html" in files and len(files) >= 2, "ui/ has index.html and more: %r" % sorted(files))
    for name, data in files.items():
        r = get("/ui/" + name)
        expect_status(r, 200, "GET /ui/%s" % name)
        check_eq(r.header("Content-Type"), UI_TYPES[os.path.splitext(name)[1]], "Content-Type of %s" % name)
        check_eq(r.body, data, "GET /ui/%s vs ui/%s (rebuild if it changed)" % (name, name))
        check_ui_headers(r, "GET /ui/%s" % name)
    r = get("/ui/")
    expect_status(r, 200, "GET /ui/")
    check_eq(r.body, files["index.html"], "GET /ui/ is index.html")
    check_eq(check_ui_headers(r, "GET /ui/"), get("/ui/index.html").header("ETag"), "ETag of /ui/ and /ui/index.html")


def test_ui_etag_304():
    """A browser's copy is revalidated: If-None-Match with the file's ETag
    (strong or W/, alone or in a list) gets 304 without a body; another
    tag gets the file."""
    r = get("/ui/")
    etag = r.header("ETag")
    for inm in (etag, "W/" + etag, '"other", ' + etag, "*"):
        r2 = get("/ui/", headers={"If-None-Match": inm})
        expect_status(r2, 304, "GET /ui/ with If-None-Match: %s" % inm)
        check_eq(r2.body, b"", "304 body")
        check_eq(r2.header("ETag"), etag, "304 ETag")
        check_eq(r2.header("Cache-Control"), "no-cache", "304 Cache-Control")
    r3 = get("/ui/", headers={"If-None-Match": '"0123456789abcdef0123456789abcdef"'})
    expect_status(r3, 200, "GET /ui/ with another ETag")
    check_eq(r3.body, r.body, "the file again")
    other = [n for n in ui_files() if n != "index.html"][0]
    expect_status(get("/ui/" + other, headers={"If-None-Match": etag}), 200, "index.html's ETag on %s" % other)


def test_ui_redirect_and_unknown_files():
    r = get("/ui", via="direct")
    expect_status(r, 301, "GET /ui")
    check_eq(r.header("Location"), "ui/", "Location of /ui (relative: /ui/)")
    for path in ("/ui/nope.js", "/ui/INDEX.HTML", "/ui/..%2Fopenapi.yaml", "/ui/.hidden"):
        expect_problem(get(path, via="direct"), 404, "NOT_FOUND", "GET %s" % path)
    expect_problem(get("/ui/a/b", via="direct"), 404, "NOT_FOUND", "GET /ui/a/b (the folder is flat)")
    for method, path in (("POST", "/ui/"), ("DELETE", "/ui/index.html"), ("PUT", "/ui")):
        r = request(method, path, via="direct")
        expect_problem(r, 405, "METHOD_NOT_ALLOWED", "%s %s" % (method, path))
        check_eq(r.header("Allow"), "GET, HEAD", "Allow of %s %s" % (method, path))
    r = request("HEAD", "/ui/index.html", via="direct")
    expect_status(r, 200, "HEAD /ui/index.html")
    check_eq(r.body, b"", "HEAD has no body")
    check_eq(r.header("ETag"), get("/ui/index.html").header("ETag"), "HEAD's ETag")


def routes_from_source():
    """{(path, METHOD)} from the route table (`routes[] = {...}` in a
    gateway/*.c file, a row per path and method; '*' -> {x}), with HEAD
    wherever GET is: the router serves HEAD with the GET row
    (gw_match_route)."""
    import re
    src = ""
    gw_dir = os.path.join(REPO, "gateway")
    for name in sorted(os.listdir(gw_dir)):
        if name.endswith(".c"):
            with open(os.path.join(gw_dir, name)) as f:
                text = f.read()
            if "routes[] = {" in text:
                src = text
                break
    check(src, "no route table (routes[] = {...}) in gateway/*.c")
    table = src[src.index("routes[] = {"):]
    table = table[:table.index("};")]
    out = set()
    for pattern, method in re.findall(r'\{"(/[^"]*)",\s*GW_([A-Z]+),', table):
        path = re.sub(r"/\*", "/{x}", pattern)
        out.add((path, method))
        if method == "GET":
            out.add((path, "HEAD"))
    return out


def routes_from_document():
    """{(path, METHOD)} from openapi/openapi.yaml (path parameters -> {x})."""
    import re
    out = set()
    path = None
    in_paths = False
    with open(OPENAPI_PATH) as f:
        for line in f:
            if re.match(r"^paths:", line):
                in_paths = True
                continue
            if in_paths and re.match(r"^\S", line):
                break
            if not in_paths:
                continue
            m = re.match(r"^  (/\S*):\s*$", line)
            if m:
                path = re.sub(r"\{[^}]+\}", "{x}", m.group(1))
                continue
            m = re.match(r"^    (get|put|post|delete|patch|head|options|trace):\s*$", line)
            if m and path:
                out.add((path, m.group(1).upper()))
    return out


def test_document_matches_route_table():
    """Every route of the gateway's route table is in openapi/openapi.yaml with
    the same methods, and the document has nothing else."""
    src, doc = routes_from_source(), routes_from_document()
    check(len(src) >= 20, "could not read the route table (%d routes)" % len(src))
    check_eq(sorted(src - doc), [], "routes of the route table missing from openapi.yaml")
    check_eq(sorted(doc - src), [], "operations of openapi.yaml missing from the route table")


def error_table_of_the_guide():
    """{code: {statuses}} from the table of docs/http.md's "Errors" section."""
    import re
    with open(os.path.join(REPO, "docs", "http.md")) as f:
        text = f.read()
    section = text[text.index("\n## Errors\n"):]
    section = section[:section.index("\n## ", 5)]
    out = {}
    for status, code in re.findall(r"^\| (\d{3}) \| `([A-Z_]+)` \|", section, flags=re.M):
        out.setdefault(code, set()).add(int(status))
    return out


def codes_of_the_document():
    """The `code` enum of the Problem schema of openapi/openapi.yaml."""
    import re
    with open(OPENAPI_PATH) as f:
        text = f.read()
    problem = text[text.index("\n    Problem:\n"):]
    enum = problem[problem.index("enum:"):]
    return set(re.findall(r"^            - ([A-Z_]+)$", enum[:enum.index("\n\n") if "\n\n" in enum else None],
                          flags=re.M))


def test_error_table_of_the_guide():
    """docs/http.md's error table lists every code of the document's
    Problem schema, 401 UNAUTHORIZED included, and nothing else; each code
    with the status the server sends it with."""
    guide, doc = error_table_of_the_guide(), codes_of_the_document()
    check(len(doc) >= 15, "could not read the Problem codes of openapi.yaml: %r" % sorted(doc))
    check_eq(sorted(set(guide)), sorted(doc), "codes of the error table of docs/http.md vs openapi.yaml")
    check_eq(guide.get("UNAUTHORIZED"), {401}, "UNAUTHORIZED's status in the table")
    for code in ("RESERVATION_REQUIRED", "RESERVATION_MISMATCH", "RESERVED_ELSEWHERE", "NOT_RESERVED",
                 "NOT_BURIED_OR_DELAYED", "ALREADY_RESERVED"):
        check_eq(guide.get(code), {409}, "%s's status in the table" % code)

def test_openapi_served():
    r = get("/openapi.yaml")
    expect_status(r, 200, "GET /openapi.yaml")
    check_eq((r.header("Content-Type") or "").split(";")[0], "application/yaml", "Content-Type")
    with open(OPENAPI_PATH, "rb") as f:
        want = f.read()
    check_eq(r.body, want, "served document vs openapi/openapi.yaml (rebuild if it changed)")


# ---- both protocols ----------------------------------------------------------------------

def test_http_put_tcp_reserve():
    tube = uniq("x1")
    jid = put(tube, b"made over http", priority=11)
    with Beanstalk() as b:
        b.expect("watch %s\r\n" % tube, b"WATCHING 2\r\n")
        b.expect("ignore default\r\n", b"WATCHING 1\r\n")
        got, body = b.job(b.cmd("reserve-with-timeout 2\r\n"), b"RESERVED")
        check_eq((got, body), (jid, b"made over http"), "TCP reserve of the HTTP job")
        j = job_stats(jid)
        check_eq(j["state"], "reserved", "HTTP sees the TCP reservation")
        expect_problem(delete("/jobs/%d" % jid), 409, "RESERVED_ELSEWHERE",
                       "HTTP delete of a TCP-reserved job without token")
        expect_problem(delete("/jobs/%d?reservation=%s" % (jid, "1-1-" + "0" * 32)), 409,
                       "RESERVED_ELSEWHERE", "HTTP delete of a TCP-reserved job with a token")
        b.expect("delete %d\r\n" % jid, b"DELETED\r\n")
    expect_problem(get("/jobs/%d" % jid), 404, "NOT_FOUND", "GET after TCP delete")


def test_tcp_put_http_reserve_delete():
    tube = uniq("x2")
    with Beanstalk() as b:
        b.expect("use %s\r\n" % tube, b"USING %s\r\n" % tube.encode())
        jid = b.put(b"made over tcp", pri=4, ttr=20)
        d = reserve_one(tube, body=b"made over tcp")
        check_eq((d["id"], d["priority"], d["ttr"]), (jid, 4, 20), "HTTP reserve of the TCP job")
        check_eq(b.cmd("delete %d\r\n" % jid), b"NOT_FOUND\r\n", "TCP delete of an HTTP-reserved job")
        expect_status(delete("/jobs/%d%s" % (jid, q(reservation=d["reservation"]))), 204, "HTTP delete")
        check_eq(b.cmd("peek %d\r\n" % jid), b"NOT_FOUND\r\n", "TCP peek after HTTP delete")


def test_ids_increase_across_protocols():
    tube = uniq("ids")
    ids = []
    with Beanstalk() as b:
        b.expect("use %s\r\n" % tube, b"USING %s\r\n" % tube.encode())
        for i in range(4):
            ids.append(put(tube, b"h%d" % i))
            ids.append(b.put(b"t%d" % i, pri=DEFAULT_PRIORITY))
        check(all(x < y for x, y in zip(ids, ids[1:])), "ids do not increase across protocols: %r" % ids)
        st = b.stats()
        hs = server_stats()
        check_eq(hs["total_jobs"], int(st["total-jobs"]), "total_jobs over HTTP vs total-jobs over TCP")
        check_eq(hs["max_job_size"], int(st["max-job-size"]), "max_job_size vs max-job-size")
        check_eq(tube_stats(tube)["total_jobs"], 8, "tube total_jobs")
        check_eq(len({x for x in ids}), 8, "distinct ids")
        # TCP sees HTTP's jobs in order
        b.expect("watch %s\r\n" % tube, b"WATCHING 2\r\n")
        got = []
        for _ in range(8):
            jid, _body = b.job(b.cmd("reserve-with-timeout 1\r\n"), b"RESERVED")
            got.append(jid)
            b.expect("delete %d\r\n" % jid, b"DELETED\r\n")
        check_eq(got, ids, "TCP reserve order (same priority: by id)")


# ---- batch ------------------------------------------------------------------------------

def test_batch_put():
    tube = uniq("batch")
    max_size = server_stats()["max_job_size"]
    binary = bytes(range(256)) * 2
    doc = {"jobs": [
        {"body": "plain text ✓"},
        {"body_base64": base64.b64encode(binary).decode()},
        {"body": "params", "priority": 3, "delay": 100, "ttr": 9},
        {"body_base64": base64.b64encode(b"q" * (max_size + 1)).decode()},
        {"body": ""},
    ]}
    r = post_json("/tubes/%s/jobs/batch" % tube, doc)
    res = expect_json(r, 200, "batch put")
    check_eq(set(res), {"results"}, "batch reply keys")
    out = res["results"]
    check_eq([x["status"] for x in out], [201, 201, 201, 413, 201], "batch statuses in order")
    for x in (out[0], out[1], out[2], out[4]):
        check_eq(set(x), {"status", "id", "tube", "state"}, "created entry keys")
        check_eq(x["tube"], tube, "entry tube")
    check_eq([x["state"] for x in (out[0], out[1], out[2], out[4])], ["ready", "ready", "delayed", "ready"],
             "entry states")
    check_eq(set(out[3]), {"status", "code", "detail"}, "failed entry keys")
    check_eq(out[3]["code"], "JOB_TOO_BIG", "too big entry code")
    ids = [out[i]["id"] for i in (0, 1, 2, 4)]
    check(all(x < y for x, y in zip(ids, ids[1:])), "batch ids in order: %r" % ids)
    check_eq(get("/jobs/%d/body" % out[0]["id"]).body, "plain text ✓".encode(), "text entry body")
    check_eq(get("/jobs/%d/body" % out[1]["id"], via="direct").body, binary, "base64 entry body (raw)")
    j = job_stats(out[2]["id"])
    check_eq((j["priority"], j["delay"], j["ttr"], j["state"]), (3, 100, 9, "delayed"), "entry parameters")
    j = job_stats(out[0]["id"])
    check_eq((j["priority"], j["ttr"]), (DEFAULT_PRIORITY, DEFAULT_TTR), "entry defaults")
    check_eq(tube_stats(tube)["total_jobs"], 4, "jobs stored")


def test_batch_put_idempotency_key():
    tube = uniq("bidem")
    key = "batch-" + uniq("k")
    max_size = server_stats()["max_job_size"]
    doc = {"jobs": [{"body": "one"}, {"body_base64": base64.b64encode(b"q" * (max_size + 1)).decode()},
                    {"body": "three"}]}
    hdrs = {"Idempotency-Key": key}
    first = expect_json(post_json("/tubes/%s/jobs/batch" % tube, doc, headers=hdrs), 200, "first batch")["results"]
    check_eq([x["status"] for x in first], [201, 413, 201], "first batch statuses")
    check("replayed" not in first[0], "a first put is not a replay: %r" % first[0])
    # the retry: stored entries answered again, the failed one tried again
    doc["jobs"][1] = {"body": "two, fixed"}
    again = expect_json(post_json("/tubes/%s/jobs/batch" % tube, doc, headers=hdrs), 200, "retried batch")["results"]
    check_eq([x["status"] for x in again], [201, 201, 201], "retried batch statuses")
    check_eq([again[0]["id"], again[2]["id"]], [first[0]["id"], first[2]["id"]], "replayed ids")
    check_eq([x.get("replayed") for x in again], [True, None, True], "replayed flags")
    check_eq(tube_stats(tube)["total_jobs"], 3, "jobs stored over both attempts")
    # each entry's key is bound to the entry's own fields: the same bytes as
    # base64 replay; another body or priority is a mismatch, stored nowhere
    doc["jobs"][2] = {"body_base64": base64.b64encode(b"three").decode()}
    doc["jobs"][0] = {"body": "one, changed"}
    doc["jobs"][1] = {"body": "two, fixed", "priority": 7}
    mixed = expect_json(post_json("/tubes/%s/jobs/batch" % tube, doc, headers=hdrs), 200,
                        "batch with changed entries")["results"]
    check_eq([x["status"] for x in mixed], [422, 422, 201], "changed entries' statuses")
    check_eq([x.get("code") for x in mixed], ["IDEMPOTENCY_KEY_MISMATCH"] * 2 + [None], "changed entries' codes")
    check_eq((mixed[2]["id"], mixed[2].get("replayed")), (first[2]["id"], True), "the same bytes as base64 replay")
    check_eq(tube_stats(tube)["total_jobs"], 3, "nothing stored for the changed entries")
    # the same key for another tube: a mismatch per remembered entry
    other = expect_json(post_json("/tubes/%s/jobs/batch" % uniq("bidem2"), doc, headers=hdrs), 200,
                        "batch into another tube")["results"]
    check_eq([x["status"] for x in other], [422, 422, 422], "another tube's statuses")
    check_eq(other[0]["code"], "IDEMPOTENCY_KEY_MISMATCH", "another tube's code")
    check("another tube" in other[0]["detail"], "another tube's detail: %r" % other[0]["detail"])
    r = post_json("/tubes/%s/jobs/batch" % tube, doc, headers={"Idempotency-Key": "bad key"}, via="direct")
    expect_problem(r, 400, "BAD_FORMAT", "a batch with a bad key")


def test_batch_put_invalid_entries():
    """Entries the schema forbids (sent straight to the server): each gets its
    own 400 result; the others are stored."""
    tube = uniq("batchbad")
    doc = {"jobs": [
        {"body": "ok"},
        {"body": "a", "body_base64": "YQ=="},
        {},
        {"body": "neg", "priority": -1},
        {"body": "big", "ttr": 4294967296},
        {"body_base64": "not base64!"},
        {"body": "extra", "colour": "red"},
        {"body": 5},
        "just a string",
        {"body": "ok too"},
    ]}
    res = expect_json(post_json("/tubes/%s/jobs/batch" % tube, doc, via="direct"), 200, "batch with bad entries")
    out = res["results"]
    check_eq([x["status"] for x in out], [201, 400, 400, 400, 400, 400, 400, 400, 400, 201], "statuses")
    for x in out[1:9]:
        check_eq((set(x), x["code"]), ({"status", "code", "detail"}, "BAD_FORMAT"), "bad entry result")
    check_eq(tube_stats(tube)["total_jobs"], 2, "only the good entries were stored")


def test_batch_put_malformed_400():
    tube = uniq("batchmal")
    for body in (b"{not json", b"[]", b'{"jobs": {}}', b'{"jobs": []}', b'{"other": 1}',
                 json.dumps({"jobs": [{"body": "x"}] * 101}).encode()):
        expect_problem(post_json("/tubes/%s/jobs/batch" % tube, body, via="direct"), 400, "BAD_FORMAT",
                       "batch body %r" % body[:30])
    res = expect_json(post_json("/tubes/%s/jobs/batch" % tube, {"jobs": [{"body": "x"}] * 100}), 200,
                      "batch of exactly 100")
    check_eq([x["status"] for x in res["results"]], [201] * 100, "100 entries stored")
    expect_problem(post_json("/tubes/-bad/jobs/batch", {"jobs": [{"body": "x"}]}, via="direct"), 400,
                   "BAD_FORMAT", "batch into a bad tube name")


# ---- idempotency ---------------------------------------------------------------------------

def test_idempotency_replay():
    tube = uniq("idem")
    key = uniq("key")
    r1 = post("/tubes/%s/jobs?priority=5" % tube, body=b"once", headers={"Idempotency-Key": key})
    d1 = expect_json(r1, 201, "first put with a key")
    check_eq(r1.header("Idempotent-Replayed"), None, "Idempotent-Replayed on the first put")
    r2 = post("/tubes/%s/jobs?priority=5" % tube, body=b"once", headers={"Idempotency-Key": key})
    d2 = expect_json(r2, 201, "retry with the same key")
    check_eq(d2, d1, "retry JSON")
    check_eq(r2.header("Idempotent-Replayed"), "true", "Idempotent-Replayed on the retry")
    check_eq(r2.header("Location"), r1.header("Location"), "retry Location")
    check_eq(tube_stats(tube)["total_jobs"], 1, "one job stored for two puts with one key")
    other = put(tube, b"other", headers={"Idempotency-Key": uniq("key")})
    check(other != d1["id"], "a different key stores a new job")
    no_key = put(tube, b"once")
    check(no_key not in (d1["id"], other), "no key stores a new job")


def test_idempotency_key_for_another_tube_422():
    key = uniq("key")
    put(uniq("idemA"), b"a", headers={"Idempotency-Key": key})
    other = uniq("idemB")
    r = post("/tubes/%s/jobs" % other, body=b"a", headers={"Idempotency-Key": key})
    doc = expect_problem(r, 422, "IDEMPOTENCY_KEY_MISMATCH", "same key, another tube")
    check("another tube" in doc["detail"], "detail %r" % doc["detail"])
    expect_problem(get("/tubes/%s" % other), 404, "NOT_FOUND", "nothing stored in the other tube")


def test_idempotency_key_reused_with_another_request_422():
    """A key reused within the window for a different put (body, priority,
    delay or ttr) used to replay the first job silently, and the second job
    was lost without a word. It is refused with 422, nothing is stored, and
    the first request still replays."""
    tube = uniq("idem3")
    key = uniq("key")
    r1 = post("/tubes/%s/jobs%s" % (tube, q(priority=5, ttr=30)), body=b"charge 10 EUR",
              headers={"Idempotency-Key": key})
    d1 = expect_json(r1, 201, "first put")
    for params, body in ((dict(priority=5, ttr=30), b"charge 99 EUR"), (dict(priority=6, ttr=30), b"charge 10 EUR"),
                         (dict(priority=5, ttr=30, delay=1), b"charge 10 EUR"), (dict(priority=5), b"charge 10 EUR")):
        r = post("/tubes/%s/jobs%s" % (tube, q(**params)), body=body, headers={"Idempotency-Key": key})
        doc = expect_problem(r, 422, "IDEMPOTENCY_KEY_MISMATCH", "the key reused for %r %r" % (params, body))
        check("another body, priority, delay or ttr" in doc["detail"], "detail %r" % doc["detail"])
        check_eq(r.header("Idempotent-Replayed"), None, "a mismatch is no replay")
    check_eq(tube_stats(tube)["total_jobs"], 1, "nothing stored for the mismatches")
    r2 = post("/tubes/%s/jobs%s" % (tube, q(priority=5, ttr=30)), body=b"charge 10 EUR",
              headers={"Idempotency-Key": key})
    check_eq((expect_json(r2, 201, "the first request again"), r2.header("Idempotent-Replayed")), (d1, "true"),
             "the same request still replays")
    expect_status(delete("/jobs/%d" % d1["id"]), 204, "delete")


def test_idempotency_replay_is_the_first_answer():
    """The retry answers what the first put answered, even if the job has
    moved on since (here: it was reserved)."""
    tube = uniq("idem2")
    key = uniq("key")
    r1 = post("/tubes/%s/jobs" % tube, body=b"work", headers={"Idempotency-Key": key})
    d1 = expect_json(r1, 201, "first put")
    d = reserve_one(tube)
    r2 = post("/tubes/%s/jobs" % tube, body=b"work", headers={"Idempotency-Key": key})
    d2 = expect_json(r2, 201, "retry after the job was reserved")
    check_eq(r2.header("Idempotent-Replayed"), "true", "Idempotent-Replayed")
    check_eq(d2, d1, "retry JSON (same as the first answer)")
    check_eq(tube_stats(tube)["total_jobs"], 1, "no second job")
    expect_status(delete("/jobs/%d%s" % (d["id"], q(reservation=d["reservation"]))), 204, "delete")
    r3 = post("/tubes/%s/jobs" % tube, body=b"work", headers={"Idempotency-Key": key})
    d3 = expect_json(r3, 201, "retry after the job was deleted")
    check_eq((d3, r3.header("Idempotent-Replayed")), (d1, "true"), "retry after delete (JSON, Idempotent-Replayed)")
    expect_problem(get("/tubes/%s" % tube), 404, "NOT_FOUND", "no job stored by the retry")


def test_idempotency_key_invalid_400():
    tube = uniq("idembad")
    for key in ("k" * 129, "has space", "tab\tkey", "caf\u00e9"):
        hdr = key.encode("utf-8")
        host, port = T.direct
        s = socket.create_connection((host, port), timeout=5)
        try:
            s.sendall(b"POST /tubes/%s/jobs HTTP/1.1\r\nHost: localhost\r\nIdempotency-Key: %s\r\n"
                      b"Content-Length: 1\r\nConnection: close\r\n\r\nx" % (tube.encode(), hdr))
            data = read_http_head(s, 3.0)
        finally:
            s.close()
        check(data.startswith(b"HTTP/1.1 400"), "Idempotency-Key %r: want 400, got %r" % (key[:20], data[:200]))
        check(b"BAD_FORMAT" in data, "Idempotency-Key %r: want BAD_FORMAT: %r" % (key[:20], data[:400]))
    jid = put(tube, b"x", headers={"Idempotency-Key": "k" * 128})
    check(jid > 0, "a 128-character key works")


# ---- bodies -----------------------------------------------------------------------------

def test_binary_body_base64():
    tube = uniq("bin")
    body = bytes(range(256)) + b"\r\n\x00\xff"
    jid = put(tube, body, via="direct")  # a validating proxy may not pass non-UTF-8 bytes intact
    p = check_job(expect_json(get("/tubes/%s/ready" % tube), 200, "peek"), "peek binary", body=body)
    check("body" not in p, "a non-UTF-8 body must come as body_base64 only")
    d = reserve_one(tube, body=body, what="reserve binary")
    check_eq(d["id"], jid, "id")
    r = get("/jobs/%d/body" % jid, via="direct")
    check_eq(r.body, body, "raw GET of the binary body")
    expect_status(delete("/jobs/%d%s" % (jid, q(reservation=d["reservation"]))), 204, "delete")


def test_binary_raw_round_trip():
    tube = uniq("rawbin")
    body = os.urandom(4096) + b"\x80\x00\r\n"
    jid = put(tube, body, via="direct")
    r = reserve(tube, via="direct", headers={"Accept": "application/octet-stream"})
    expect_status(r, 200, "raw reserve of a binary job")
    check_eq(r.body, body, "raw bytes back")
    check_eq(r.header("X-Job-Id"), str(jid), "X-Job-Id")
    with Beanstalk() as b:
        got, tcp_body = b.job(b.cmd("peek %d\r\n" % jid), b"FOUND")
        check_eq(tcp_body, body, "the same bytes over TCP")
    expect_status(delete("/jobs/%d%s" % (jid, q(reservation=r.header("X-Reservation"))), via="direct"), 204,
                  "delete")


def test_utf8_and_nul_bodies_as_json_text():
    tube = uniq("utf8")
    for body in ("héllo wörld ✓ 日本".encode(), b"nul\x00inside", b'{"a": "json"}\r\n'):
        jid = put(tube, body)
        d = reserve_one(tube, body=body, what="reserve %r" % body[:20])
        check("body_base64" not in d, "valid UTF-8 must come as body")
        expect_status(delete("/jobs/%d%s" % (jid, q(reservation=d["reservation"]))), 204, "delete")


# ---- server level -----------------------------------------------------------------------

def listening_ports(pid):
    """The TCP ports process pid listens on (from /proc)."""
    inodes = set()
    fd_dir = "/proc/%d/fd" % pid
    for fd in os.listdir(fd_dir):
        try:
            link = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            with open("/proc/%d/net/%s" % (pid, table)) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if cols[3] == "0A" and cols[9] in inodes:
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


# ---- CORS -----------------------------------------------------------------------------

CORS_ORIGINS = ("https://app.example.com", "http://localhost:3000")
CORS_TOKEN = "cors-test-token-0123456789abcdef"


def cors_headers(resp):
    """The Access-Control-* headers and Vary of a response, by lowercase name."""
    return {k.lower(): v for k, v in resp.headers if k.lower().startswith("access-control-") or k.lower() == "vary"}


def test_cors_off_by_default():
    """Without --http-cors-origins the gateway sends no CORS header, to an
    Origin or not, and OPTIONS is 405 like any method a path lacks."""
    origin = {"Origin": CORS_ORIGINS[0]}
    for method, path in (("GET", "/stats"), ("GET", "/jobs/987654321"), ("POST", "/tubes/%s/jobs" % uniq("nocors"))):
        r = request(method, path, body=b"x" if method == "POST" else None, headers=origin, via="direct")
        check_eq(cors_headers(r), {}, "CORS headers of %s %s with CORS off" % (method, path))
    r = request("OPTIONS", "/jobs/1", headers=dict(origin, **{"Access-Control-Request-Method": "DELETE"}),
                via="direct")
    expect_problem(r, 405, "METHOD_NOT_ALLOWED", "a preflight with CORS off")
    check_eq((r.header("Allow"), cors_headers(r)), ("GET, HEAD, DELETE", {}), "Allow and CORS headers")


def cors_server(extra=()):
    """A server of its own with CORS for CORS_ORIGINS and a bearer token."""
    f = tempfile.NamedTemporaryFile("w", prefix="beangate-cors-", suffix=".tokens", delete=False)
    f.write(CORS_TOKEN + "\n")
    f.close()
    os.chmod(f.name, 0o600)
    try:
        return Server(["--http-cors-origins", ",".join(CORS_ORIGINS), "--http-token-file", f.name] + list(extra)).start()
    finally:
        os.unlink(f.name)


def test_cors_preflight_on_every_route():
    """With --http-cors-origins, a preflight from a listed origin to any path
    of the route table, without a token, gets 204 with the origin echoed,
    Vary: Origin, the path's methods (from the route table), the request
    headers a page may send and a max age; from another origin 403
    ORIGIN_NOT_ALLOWED without CORS headers. A plain OPTIONS gets 204 with
    Allow; an unknown path still needs the token."""
    srv = cors_server()
    at = ("127.0.0.1", srv.http_port)
    try:
        methods = {}
        for path, method in routes_from_source():
            methods.setdefault(path, set()).add(method)
        order = ["GET", "HEAD", "POST", "DELETE"]
        check(len(methods) >= 20, "paths of the route table: %d" % len(methods))
        for pattern, ms in sorted(methods.items()):
            path = concrete_path(pattern, "t", 1)
            want = ", ".join(m for m in order if m in ms)
            for origin in CORS_ORIGINS + (CORS_ORIGINS[0].upper(),):
                r = request("OPTIONS", path, via=at, headers={
                    "Origin": origin, "Access-Control-Request-Method": sorted(ms)[0],
                    "Access-Control-Request-Headers": "authorization,x-reservation"})
                what = "preflight of %s from %s" % (path, origin)
                expect_status(r, 204, what)
                h = cors_headers(r)
                check_eq(h.get("access-control-allow-origin"), origin, "%s: Allow-Origin" % what)
                check_eq(h.get("access-control-allow-methods"), want, "%s: Allow-Methods" % what)
                check_eq([x.strip() for x in h.get("access-control-allow-headers", "").split(",")],
                         ["Authorization", "Content-Type", "Idempotency-Key", "X-Reservation"],
                         "%s: Allow-Headers" % what)
                check(h.get("access-control-max-age", "").isdigit(), "%s: Max-Age %r" % (what, h))
                check("Origin" in h.get("vary", ""), "%s: Vary %r" % (what, h.get("vary")))
                check_eq(r.header("Allow"), want + ", OPTIONS", "%s: Allow" % what)
            r = request("OPTIONS", path, via=at, headers={"Origin": "https://evil.example",
                                                          "Access-Control-Request-Method": sorted(ms)[0]})
            doc = expect_problem(r, 403, "ORIGIN_NOT_ALLOWED", "preflight of %s from another origin" % path)
            check("--http-cors-origins" in doc["detail"], "the 403 says why: %r" % doc["detail"])
            check_eq(set(cors_headers(r)), {"vary"}, "CORS headers of the 403")
            r = request("OPTIONS", path, via=at)
            expect_status(r, 204, "plain OPTIONS %s" % path)
            check_eq((r.header("Allow"), r.header("Access-Control-Allow-Methods")), (want + ", OPTIONS", None),
                     "plain OPTIONS %s: Allow, no preflight headers" % path)
        r = request("OPTIONS", "/nope", via=at, headers={"Origin": CORS_ORIGINS[0],
                                                         "Access-Control-Request-Method": "GET"})
        expect_problem(r, 401, "UNAUTHORIZED", "OPTIONS of an unknown path without a token")
        r = request("PUT", "/jobs/1", via=at, headers={"Authorization": "Bearer " + CORS_TOKEN})
        expect_problem(r, 405, "METHOD_NOT_ALLOWED", "PUT /jobs/1")
        check_eq(r.header("Allow"), "GET, HEAD, DELETE, OPTIONS", "a 405's Allow lists OPTIONS with CORS on")
    finally:
        check_stopped(*srv.stop(), what="the CORS server")


def test_cors_actual_responses():
    """Answers to a listed origin carry Access-Control-Allow-Origin and
    expose the headers a page needs (Location, X-Job-Id, X-Reservation,
    Retry-After, ...), errors and 401s included, raw replies too; a read
    from another origin is served without them, and its state changes are
    refused (403)."""
    srv = cors_server()
    at = ("127.0.0.1", srv.http_port)
    auth = {"Authorization": "Bearer " + CORS_TOKEN}
    try:
        origin = {"Origin": CORS_ORIGINS[1]}
        tube = uniq("cors")

        def allowed(r, what):
            h = cors_headers(r)
            check_eq(h.get("access-control-allow-origin"), CORS_ORIGINS[1], "%s: Allow-Origin" % what)
            exposed = [x.strip() for x in h.get("access-control-expose-headers", "").split(",")]
            for name in ("Location", "X-Job-Id", "X-Reservation", "Retry-After", "Idempotent-Replayed",
                         "WWW-Authenticate", "Allow"):
                check(name in exposed, "%s: %s not exposed (%r)" % (what, name, exposed))
            check("Origin" in h.get("vary", ""), "%s: Vary %r" % (what, h.get("vary")))
            check("access-control-allow-credentials" not in h, "%s: credentials mode %r" % (what, h))
        r = request("POST", "/tubes/%s/jobs" % tube, body=b"from a page", headers=dict(origin, **auth), via=at)
        jid = expect_json(r, 201, "put from the page")["id"]
        allowed(r, "put")
        r = request("POST", "/tubes/%s/reservations" % tube, via=at,
                    headers=dict(origin, Accept="application/octet-stream", **auth))
        expect_status(r, 200, "raw reserve")
        allowed(r, "raw reserve")
        r = request("DELETE", "/jobs/%d" % jid, via=at,
                    headers=dict(origin, **dict(auth, **{"X-Reservation": r.header("X-Reservation")})))
        expect_status(r, 204, "delete with the header")
        allowed(r, "delete")
        r = request("GET", "/stats", headers=origin, via=at)
        expect_problem(r, 401, "UNAUTHORIZED", "no token")
        allowed(r, "401")
        r = request("GET", "/jobs/%d" % jid, headers=dict(origin, **auth), via=at)
        expect_problem(r, 404, "NOT_FOUND", "a deleted job")
        allowed(r, "404")
        r = request("GET", "/ui/app.js", headers=origin, via=at)
        expect_status(r, 200, "a file of the dashboard")
        allowed(r, "dashboard file")
        for other in ({"Origin": "https://evil.example"}, {"Origin": "null"}, {}):
            r = request("POST", "/tubes/%s/jobs" % tube, body=b"x", headers=dict(other, **auth), via=at)
            # a state change from a page of another origin is refused even
            # with a token (docs/security.md); without an Origin it is not a
            # browser's request
            if other:
                expect_problem(r, 403, "ORIGIN_NOT_ALLOWED", "put from %r" % other)
            else:
                expect_status(r, 201, "put from %r" % other)
            check_eq(cors_headers(r), {"vary": "Origin"}, "CORS headers for %r" % other)
    finally:
        check_stopped(*srv.stop(), what="the CORS server")


def test_cors_origins_checked_at_start():
    """A bad --http-cors-origins (or BEANGATE_HTTP_CORS_ORIGINS) stops the
    start with exit status 5 and a line that says why; '*' is refused."""
    cases = [("*", "'*' is refused"), ("https://a.example,*", "'*' is refused"),
             ("https://a.example/", "no path"), ("https://a.example/app", "no path"),
             ("ftp://a.example", "http:// or https://"), ("a.example", "http:// or https://"),
             ("https://", "no host"), ("https://a.example:0", "port"), ("https://a.example:99999", "port"),
             ("https://a.example,,https://b.example", "http:// or https://"), ("null", "http:// or https://"),
             (",".join("http://h%d.example" % i for i in range(65)), "more than 64")]
    env = testlib.clean_env()
    for value, why in cases:
        for argv, extra_env in (([T.binary, "--http-cors-origins", value], {}),
                                ([T.binary], {"BEANGATE_HTTP_CORS_ORIGINS": value})):
            p = subprocess.run(argv + ["-p", "0", "--http-port", "0"], env=dict(env, **extra_env),
                               stdin=subprocess.DEVNULL, capture_output=True, timeout=10)
            err = p.stderr.decode("utf-8", "replace")
            what = "%s%s" % ("BEANGATE_HTTP_CORS_ORIGINS=" if extra_env else "--http-cors-origins ", value[:60])
            check_eq(p.returncode, 5, "%s: exit status (stderr %s)" % (what, err[-300:]))
            check(why in err, "%s: %r not in %r" % (what, why, err[-400:]))

# ---- beside a browser (issue 22; docs/security.md) -------------------------

def raw_exchange(data, via="direct", timeout=HTTP_TIMEOUT):
    """Send data (whole requests, the last with Connection: close or one the
    server closes) on a raw socket; every response until the server closes,
    as [Resp]."""
    host, port = T.direct if via == "direct" else via
    s = socket.create_connection((host, port), timeout=timeout)
    try:
        s.sendall(data)
        raw = read_to_eof(s, timeout)
    finally:
        close_quietly(s)
    out = []
    while raw:
        head, sep, rest = raw.partition(b"\r\n\r\n")
        check(sep, "a response head without its end: %r" % raw[:300])
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = [tuple(x.strip() for x in l.split(":", 1)) for l in lines[1:]]
        length = int(dict((k.lower(), v) for k, v in headers).get("content-length", "0"))
        out.append(Resp(status, lines[0], headers, rest[:length], 0.0, "raw %r" % data[:60]))
        raw = rest[length:]
    return out


def raw_get(path, host_lines, version="HTTP/1.1", via="direct"):
    """One request with exactly these Host lines (a list of values)."""
    head = "GET %s %s\r\n%sConnection: close\r\n\r\n" % (
        path, version, "".join("Host: %s\r\n" % h for h in host_lines))
    got = raw_exchange(head.encode(), via=via)
    check_eq(len(got), 1, "responses to %r" % head)
    return got[0]


def test_host_header_required_once_400():
    """RFC 9112 section 3.2: an HTTP/1.1 request without Host, or with two,
    is 400 (problem+json, the connection closed); HTTP/1.0 may leave it out."""
    host = "127.0.0.1:%d" % T.direct[1]
    for lines, what in (([], "no Host"), ([host, host], "two Hosts"), ([host, "localhost"], "two Hosts that differ")):
        r = raw_get("/stats", lines)
        expect_problem(r, 400, "BAD_FORMAT", "HTTP/1.1 with %s" % what)
        check("Host" in r.json()["detail"], "the detail does not name Host: %r" % r.body)
    expect_status(raw_get("/livez", [], version="HTTP/1.0"), 200, "HTTP/1.0 without Host")
    expect_status(raw_get("/livez", [host]), 200, "HTTP/1.1 with one Host")
    # a later request of a keep-alive connection too
    ok = "GET /livez HTTP/1.1\r\nHost: %s\r\n\r\n" % host
    got = raw_exchange((ok + "GET /livez HTTP/1.1\r\nConnection: close\r\n\r\n").encode())
    check_eq([r.status for r in got], [200, 400], "a keep-alive connection's second request without Host")


def test_foreign_host_421():
    """DNS rebinding: on a loopback address the gateway answers only to the
    loopback names (localhost, 127.0.0.1, [::1], with or without a port, in
    any case); any other Host gets 421 HOST_NOT_ALLOWED naming
    --http-allowed-hosts, whatever the route, and changes nothing."""
    port = T.direct[1]
    for name in ("localhost", "localhost:%d" % port, "LocalHost:%d" % port, "127.0.0.1", "127.0.0.1:%d" % port,
                 "[::1]", "[::1]:%d" % port, "127.0.0.1:1"):
        expect_status(raw_get("/livez", [name]), 200, "Host %s" % name)
    for name in ("attacker.example", "attacker.example:%d" % port, "localhost.attacker.example",
                 "127.1", "127.0.0.2:%d" % port, "2130706433", "[::2]", "localhost:", "localhost:x",
                 "localhost:%d/x" % port, ""):
        r = raw_get("/stats", [name])
        doc = expect_problem(r, 421, "HOST_NOT_ALLOWED", "Host %r" % name)
        check("--http-allowed-hosts" in doc["detail"], "421 detail does not name the setting: %r" % doc)
    tube = uniq("rebind")
    r = request("POST", "/tubes/%s/jobs" % tube, body=b"from a rebound page",
                headers={"Host": "attacker.example:%d" % port}, via="direct")
    expect_problem(r, 421, "HOST_NOT_ALLOWED", "a put for attacker.example")
    expect_problem(get("/tubes/%s" % tube, via="direct"), 404, "NOT_FOUND", "the tube of a refused put")
    # the dashboard's files too: a rebound page must not get them either
    r = request("GET", "/ui/", headers={"Host": "attacker.example"}, via="direct")
    expect_problem(r, 421, "HOST_NOT_ALLOWED", "the dashboard for attacker.example")


def test_allowed_hosts_setting():
    """--http-allowed-hosts adds names (any port, any case) to the loopback
    ones; other names stay refused; a bad list is refused at start."""
    srv = Server(["--http-allowed-hosts", "queue.internal,[fd00::1]"]).start()
    try:
        at = ("127.0.0.1", srv.http_port)
        for name in ("queue.internal", "Queue.Internal:%d" % srv.http_port, "[fd00::1]:80", "localhost"):
            expect_status(raw_get("/livez", [name], via=at), 200, "Host %s with the setting" % name)
        for name in ("other.internal", "internal", "queue.internal.example"):
            expect_problem(raw_get("/livez", [name], via=at), 421, "HOST_NOT_ALLOWED", "Host %s" % name)
    finally:
        srv.stop()
    env = testlib.clean_env()
    for bad in ("", "a:80", "http://a", "a b", "a,,b", ",".join("h%d" % i for i in range(65))):
        p = subprocess.run([T.binary, "--http-allowed-hosts", bad, "-p", "0", "--http-port", "0"], env=env,
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=10)
        err = p.stderr.decode("utf-8", "replace")
        check(p.returncode == 5 and "http-allowed-hosts" in err, "--http-allowed-hosts %r: exit %r, stderr %r"
              % (bad, p.returncode, err[-300:]))


def test_cross_site_state_changes_403():
    """A state-changing request that a browser marks as another site's
    (Sec-Fetch-Site cross-site or same-site, or an Origin that is not the
    gateway's own) is refused with 403 ORIGIN_NOT_ALLOWED and changes
    nothing; reads are served; requests without these headers (curl,
    services) and the gateway's own pages are not affected."""
    host, port = T.direct
    own = "http://%s:%d" % (host, port)
    tube = uniq("xsite")
    jid = expect_json(request("POST", "/tubes/%s/jobs" % tube, body=b"kept", via="direct"), 201, "put")["id"]
    refused = ({"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
               {"Sec-Fetch-Site": "cross-site", "Origin": own},
               {"Origin": "http://attacker.example"}, {"Origin": "null"},
               {"Origin": "http://%s:%d" % (host, port + 1)}, {"Origin": "https://%s:%d.evil" % (host, port)})
    changes = (("POST", "/tubes/%s/jobs" % tube, b"x"), ("POST", "/tubes/%s/reservations" % tube, None),
               ("POST", "/tubes/%s/kick?bound=5" % tube, None),
               ("POST", "/tubes/%s/pause?delay=4294967295" % tube, None),
               ("DELETE", "/jobs/%d" % jid, None), ("POST", "/jobs/%d/bury" % jid, None))
    for hdrs in refused:
        for method, path, body in changes:
            r = request(method, path, body=body, headers=hdrs, via="direct")
            doc = expect_problem(r, 403, "ORIGIN_NOT_ALLOWED", "%s %s with %r" % (method, path, hdrs))
            check("--http-cors-origins" in doc["detail"], "403 detail does not name the setting: %r" % doc)
    st = expect_json(get("/tubes/%s" % tube, via="direct"), 200, "the tube after the refusals")
    check_eq((st["current_jobs_ready"], st["total_jobs"], st["pause"]), (1, 1, 0), "ready, total, pause")
    for hdrs in refused:
        expect_status(request("GET", "/jobs/%d" % jid, headers=hdrs, via="direct"), 200, "a read with %r" % hdrs)
    for hdrs in ({}, {"Sec-Fetch-Site": "same-origin", "Origin": own}, {"Sec-Fetch-Site": "none"},
                 {"Origin": own}, {"Origin": own.upper()}):
        expect_status(request("POST", "/tubes/%s/jobs" % tube, body=b"y", headers=hdrs, via="direct"), 201,
                      "a put with %r" % hdrs)


def test_nosniff_and_no_store_on_every_response():
    """Every response carries X-Content-Type-Options: nosniff, and every one
    about the queue Cache-Control: no-store: successes, errors, the refusals
    answered before libmicrohttpd and the header timeout's 408. A raw job
    body is an attachment, so that a browser opening its URL saves it."""
    tube = uniq("headers")
    jid = expect_json(post("/tubes/%s/jobs" % tube, body=b"alert(1)//", via="direct"), 201, "put")["id"]
    got = []
    for method, path, hdrs in (("GET", "/stats", {}), ("GET", "/tubes/%s" % tube, {}), ("GET", "/tubes", {}),
                               ("GET", "/jobs/%d" % jid, {}), ("GET", "/jobs/%d/body" % jid, {}),
                               ("GET", "/stats/tubes", {}), ("GET", "/jobs/987654321", {}),
                               ("PUT", "/stats", {}), ("GET", "/nope", {}), ("GET", "/livez", {}),
                               ("POST", "/tubes/%s/reservations" % uniq("empty"), {}),
                               ("GET", "/tubes/%s/ready" % tube, {"Accept": "application/octet-stream"}),
                               ("GET", "/metrics", {}), ("GET", "/openapi.yaml", {})):
        got.append(("%s %s" % (method, path), request(method, path, headers=hdrs, via="direct")))
    for r in raw_exchange(b"POST /tubes/t/jobs HTTP/1.1\r\nHost: localhost\r\nContent-Length: x\r\n\r\n"):
        got.append(("a bad Content-Length (refused before libmicrohttpd)", r))
    for r in raw_exchange(b"GET /stats HTTP/1.1\r\nHost: attacker.example\r\nConnection: close\r\n\r\n"):
        got.append(("a foreign Host", r))
    ui = request("GET", "/ui/app.js", via="direct")
    for what, r in got + [("GET /ui/app.js", ui)]:
        for name in ("X-Content-Type-Options", "Cache-Control"):
            check_eq(len([k for k, _ in r.headers if k.lower() == name.lower()]), 1, "%s: %s fields" % (what, name))
        check_eq(r.header("X-Content-Type-Options"), "nosniff", "%s: X-Content-Type-Options" % what)
    for what, r in got:
        check_eq(r.header("Cache-Control"), "no-store", "%s: Cache-Control" % what)
    body = got[4][1]
    check_eq((body.status, body.header("Content-Disposition"), body.header("Content-Type")),
             (200, "attachment", "application/octet-stream"), "the raw body's headers")
    check_eq((got[11][1].status, got[11][1].header("Content-Disposition")), (200, "attachment"),
             "a raw peek's status and Content-Disposition")
    check_eq(got[3][1].header("Content-Disposition"), None, "a JSON job's Content-Disposition")
    check_eq((ui.header("X-Content-Type-Options"), ui.header("Cache-Control")), ("nosniff", "no-cache"),
             "a dashboard file keeps its own Cache-Control")
    # the 408 of the header timeout, written without libmicrohttpd
    srv = Server(["--http-header-timeout", "1"]).start()
    try:
        s = socket.create_connection(("127.0.0.1", srv.http_port), timeout=5)
        s.sendall(b"GET /stats HTTP/1.1\r\nHost: localhost\r\n")
        raw = read_to_eof(s, 10)
        close_quietly(s)
        check(raw.startswith(b"HTTP/1.1 408 ") and b"\r\nX-Content-Type-Options: nosniff\r\n" in raw
              and b"\r\nCache-Control: no-store\r\n" in raw, "the 408's headers: %r" % raw[:400])
    finally:
        srv.stop()


# ---- the shell examples of docs/http.md, run as they are ------------------------------

HTTP_GUIDE = os.path.join(REPO, "docs", "http.md")


def guide_block(marker):
    """The ```sh block of docs/http.md right after <!-- MARKER: ... -->."""
    with open(HTTP_GUIDE) as f:
        text = f.read()
    at = text.find("<!-- %s:" % marker)
    check(at >= 0, "docs/http.md has no <!-- %s: --> marker" % marker)
    start = text.index("```sh\n", at) + len("```sh\n")
    return text[start:text.index("```", start)]


# Stand-ins put before curl and sleep on PATH: each call is logged (curl with
# its arguments, then the real curl runs; sleep with its seconds, returning
# at once). A run that has slept SLEEPS_MAX times or called curl CURLS_MAX
# times ends its whole process group, so that a loop ends by itself.
SLEEPS_MAX = 7
CURLS_MAX = 60
CURL_STANDIN = """#!/bin/sh
printf 'curl %s\\n' "$*" >> "$CALLS"
[ "$(grep -c '^curl' "$CALLS")" -ge {curls} ] && kill -TERM 0
exec {curl} "$@"
"""
SLEEP_STANDIN = """#!/bin/sh
printf 'sleep %s\\n' "$1" >> "$CALLS"
[ "$(grep -c '^sleep' "$CALLS")" -ge {sleeps} ] && kill -TERM 0
exit 0
"""


class ShellExample:
    """A block of docs/http.md run with POSIX sh in a fresh folder, with
    $B set, in a process group of its own, curl and sleep logged."""

    def __init__(self, marker, base_url):
        self.dir = tempfile.mkdtemp(prefix="beangate-doc-")
        self.calls = os.path.join(self.dir, "calls.log")
        bin_dir = os.path.join(self.dir, "bin")
        os.mkdir(bin_dir)
        curl = shutil.which("curl")
        check(curl and shutil.which("jq"), "curl and jq are needed (scripts/install-deps.sh test)")
        for name, text in (("curl", CURL_STANDIN.format(curls=CURLS_MAX, curl=curl)),
                           ("sleep", SLEEP_STANDIN.format(sleeps=SLEEPS_MAX))):
            path = os.path.join(bin_dir, name)
            with open(path, "w") as f:
                f.write(text)
            os.chmod(path, 0o755)
        env = dict(testlib.clean_env(), B=base_url, CALLS=self.calls, PATH=bin_dir + os.pathsep + os.environ["PATH"])
        self.out = open(os.path.join(self.dir, "stdout"), "w+b")
        self.err = open(os.path.join(self.dir, "stderr"), "w+b")
        self.proc = subprocess.Popen(["sh", "-c", guide_block(marker)], cwd=self.dir, env=env, stdin=subprocess.DEVNULL,
                                     stdout=self.out, stderr=self.err, start_new_session=True)

    def log(self):
        try:
            with open(self.calls) as f:
                return f.read().splitlines()
        except FileNotFoundError:
            return []

    def output(self):
        self.out.seek(0)
        self.err.seek(0)
        return self.out.read(), self.err.read().decode("utf-8", "replace")

    def wait(self, timeout):
        """Until the run ends by itself (its exit status)."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError("the example did not end within %.0f s; calls: %r" % (timeout, self.log()[-10:]))

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(5)
        self.out.close()
        self.err.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def base_url(via="base"):
    host, port = T.base if via == "base" else T.direct if via == "direct" else via
    return "http://%s:%d" % (host, port)


def test_worker_loop_of_the_guide():
    """docs/http.md's worker loop, run as written against the server: it
    reserves the job, prints its body and deletes it with its token (in the
    X-Reservation header), then waits for the next job."""
    body = ("send the welcome mail to %08x" % random.getrandbits(32)).encode()
    jid = put("emails", body)
    run = ShellExample("worker-loop", base_url())
    try:
        testlib.wait_until(lambda: get("/jobs/%d" % jid).status == 404, "the loop to delete job %d" % jid, 20)
        testlib.wait_until(lambda: body in run.output()[0], "the loop to print the body", 5)
        calls = run.log()
        deletes = [c for c in calls if "-X DELETE" in c and c.endswith("/jobs/%d" % jid)]
        check_eq(len(deletes), 1, "DELETE requests of job %d by the loop: %r" % (jid, calls))
        check(re.search(r"-H X-Reservation: \S{16,} ", deletes[0]) and "reservation=" not in deletes[0],
              "the token goes in the header, not the URL: %r" % deletes[0])
        check(not any("/jobs/null" in c for c in calls), "the loop asked for /jobs/null: %r" % calls)
        check(not any(c.startswith("sleep") for c in calls), "the loop slept with the server up: %r" % calls)
    finally:
        run.stop()


def check_backs_off(run, what):
    """The run of the worker loop waited between failed tries, twice as long
    each time (1, 2, 4, ... s), with one reserve per try and no DELETE, and
    ended itself after SLEEPS_MAX sleeps (a loop that spins calls curl
    CURLS_MAX times without sleeping, and ends so)."""
    run.wait(30)
    calls = run.log()
    sleeps = [c for c in calls if c.startswith("sleep")]
    reserves = [c for c in calls if c.startswith("curl") and "/reservations" in c]
    check(not any("-X DELETE" in c for c in calls), "%s: the loop sent a DELETE: %r" % (what, calls[:8]))
    check_eq(len(sleeps), SLEEPS_MAX, "%s: sleeps before %d requests (%r)" % (what, len(calls) - len(sleeps),
                                                                            calls[:8]))
    check_eq([c.split()[1] for c in sleeps], ["1", "2", "4", "8", "16", "32", "64"][:SLEEPS_MAX],
             "%s: the waits" % what)
    check_eq(len(reserves), len(sleeps), "%s: one reserve per wait" % what)
    check_eq(calls[0::2], reserves, "%s: reserve, wait, reserve, wait, ..." % what)
    _, err = run.output()
    check("reserve: HTTP" in err, "%s: the loop says why it waits: %r" % (what, err[-300:]))


def test_worker_loop_backs_off_when_the_server_is_down():
    """With no server at $B the documented loop waits between tries, longer
    each time, instead of asking again at once (the loop of issue 14
    spun: an empty answer looked like 204)."""
    run = ShellExample("worker-loop", "http://127.0.0.1:%d" % free_port())
    try:
        check_backs_off(run, "server down")
        check("HTTP 000" in run.output()[1], "000 for no server: %r" % run.output()[1][-200:])
    finally:
        run.stop()


def test_worker_loop_backs_off_on_4xx():
    """A server that answers 401 (bearer tokens on, none given): the loop
    waits and tries again, and never deletes /jobs/null (the loop of issue
    14 did, after any 4xx)."""
    srv = cors_server()
    run = ShellExample("worker-loop", base_url(("127.0.0.1", srv.http_port)))
    try:
        check_backs_off(run, "401")
        check("HTTP 401" in run.output()[1], "the 401 reported: %r" % run.output()[1][-200:])
    finally:
        run.stop()
        check_stopped(*srv.stop(), what="the server with tokens")


def test_raw_reserve_example_of_the_guide():
    """docs/http.md's octet-stream example, run as written: it puts four
    bytes, reserves them raw, and deletes the job it got, whose id it reads
    from X-Job-Id (the example of issue 14 deleted job 9, whichever it got)."""
    # to the server itself: a proxy that reads bodies as text changes these bytes
    run = ShellExample("raw-reserve", base_url("direct"))
    try:
        check_eq(run.wait(20), 0, "exit status of the example (stderr %r)" % run.output()[1][-300:])
        with open(os.path.join(run.dir, "body.bin"), "rb") as f:
            check_eq(f.read(), b"\x00\x01\xfe\xff", "body.bin")
        with open(os.path.join(run.dir, "headers.txt")) as f:
            headers = dict(line.rstrip("\r\n").split(": ", 1) for line in f if ": " in line)
        jid = int(headers["X-Job-Id"])
        check_eq(headers["X-Job-Tube"], "blobs", "X-Job-Tube")
        expect_problem(get("/jobs/%d" % jid), 404, "NOT_FOUND", "the job the example reserved, after it")
        out, _ = run.output()
        check(b"X-Job-Id: %d" % jid in out, "the example shows the headers: %r" % out[:300])
    finally:
        run.stop()

def test_no_http_flag():
    """--no-http: only the beanstalk port is listening."""
    http_port = free_port()
    srv = Server(extra=["--http-port", str(http_port), "--no-http"], http=False).start()
    try:
        with Beanstalk(srv.tcp_port) as b:
            b.expect("list-tube-used\r\n", b"USING default\r\n")
        ports = listening_ports(srv.proc.pid)
        check_eq(ports, {srv.tcp_port}, "ports a --no-http server listens on")
        try:
            socket.create_connection(("127.0.0.1", http_port), timeout=2).close()
            raise AssertionError("something answers on --http-port %d of a --no-http server" % http_port)
        except ConnectionRefusedError:
            pass
    finally:
        status, err = srv.stop()
    check_stopped(status, err, "--no-http server")


@contextlib.contextmanager
def own_server(extra, what):
    """A server of the test's own, started with the flags extra: the target
    of put(), get(), ... while the block runs; it must then stop cleanly."""
    srv = Server(extra=extra).start()
    try:
        saved = T.base, T.direct
        T.base = T.direct = ("127.0.0.1", srv.http_port)
        try:
            yield srv
        finally:
            T.base, T.direct = saved
        status, err = srv.stop()
    finally:
        srv.stop()
    check_stopped(status, err, what)


def test_sigterm_with_waiting_longpoll():
    """A server with a suspended long-poll stops cleanly and promptly."""
    srv = Server().start()
    try:
        saved = T.base, T.direct
        T.base = T.direct = ("127.0.0.1", srv.http_port)
        try:
            tube = uniq("idle")
            lp = Later(lambda: reserve(tube, timeout=20))
            lp.start()
            wait_for(lambda: waiting_on(tube) >= 1 or not lp.is_alive(), "the long-poll to wait")
            check(lp.is_alive(), "the long-poll answered at once")
        finally:
            T.base, T.direct = saved
        t0 = time.monotonic()
        status, err = srv.stop()
        took = time.monotonic() - t0
    finally:
        srv.stop()
    check_stopped(status, err, "SIGTERM with a waiting long-poll")
    check(took <= 2.0, "exit took %.2f s with a waiting long-poll" % took)
    lp.join(5)
    check(not lp.is_alive(), "the long-poll's client still waits after the server exited")
    if lp.result is not None:  # an answer is not required, but if one came it must be a good one
        check(lp.result.status in (204, 503), "the long-poll got %s at shutdown" % lp.result.describe())


def test_timeout_is_capped_by_http_max_wait():
    """A long-poll waits at most --http-max-wait seconds (default 30): a
    larger timeout is taken as the cap. A server started with
    --http-max-wait 1 answers a timeout=45 long-poll (single and count=3) on
    an empty tube with 204 after about a second; a job put while it waits
    still wakes it at once."""
    with own_server(["--http-max-wait", "1"], "--http-max-wait 1 server"):
        for params in ({}, {"count": 3}):
            t0 = time.monotonic()
            r = reserve(uniq("cap"), timeout=45, **params)
            took = time.monotonic() - t0
            expect_status(r, 204, "long-poll with timeout=45 %r" % params)
            check(0.9 <= took <= 3.0, "timeout=45 %r answered after %.2f s, want the 1 s cap"
                  % (params, took))
        tube = uniq("capwake")
        doc, _ = longpoll_then(tube, lambda: put(tube, b"in time"))
        expect_status(delete("/jobs/%d%s" % (doc["id"], q(reservation=doc["reservation"]))), 204,
                      "delete")


def test_shard_refuses_other_shards_tubes_421():
    """With --shard 1/3 the server gives out ids 1, 4, 7, ... and answers 421
    WRONG_SHARD (naming the tube and its shard) to a put, a batch put and a
    reservation of a tube whose CRC-32 mod 3 is not 1, also when it is the
    second tube of a multi-tube reservation; nothing is stored and no waiter
    is left. Its own tubes work, and reads of any tube are not refused.
    /stats says shard_index 1, shard_count 3."""
    def tube_of(shard, prefix):
        return next(t for t in ("%s-%d" % (prefix, i) for i in range(1000)) if zlib.crc32(t.encode()) % 3 == shard)
    with own_server(["--shard", "1/3"], "--shard 1/3 server") as srv:
        mine, other = tube_of(1, uniq("mine")), tube_of(2, uniq("other"))
        ids = [put(mine, b"m%d" % i) for i in range(3)]
        check_eq(ids, [1, 4, 7], "the ids of shard 1 of 3")
        for what, resp in (
                ("put", post("/tubes/%s/jobs" % other, body=b"x")),
                ("batch put", post_json("/tubes/%s/jobs/batch" % other, {"jobs": [{"body": "x"}]})),
                ("reserve", post("/tubes/%s/reservations?timeout=5" % other)),
                ("multi-tube reserve", post("/reservations?tubes=%s,%s&timeout=5" % (mine, other)))):
            doc = expect_problem(resp, 421, "WRONG_SHARD", what + " of another shard's tube")
            check("'%s' belongs to shard 2 of 0..2" % other in doc["detail"] and "this is shard 1" in doc["detail"],
                  "%s: the detail %r" % (what, doc["detail"]))
        st = server_stats()
        check_eq((st["shard_index"], st["shard_count"], st["total_jobs"], st["current_waiting"]),
                 (1, 3, 3, 0), "shard, jobs and waiters after the refusals")
        expect_problem(get("/tubes/%s" % other), 404, "NOT_FOUND", "stats of the other shard's tube (not 421)")
        doc = expect_json(post("/reservations?tubes=%s&timeout=1" % mine), 200, "reserve from its own tube")
        check_eq(doc["id"], 1, "the job reserved")
        with Beanstalk(srv.tcp_port) as b:  # beanstalk keeps beanstalkd's behaviour: no check
            b.expect("use %s\r\n" % other, b"USING %s\r\n" % other.encode())
            check_eq(b.put(b"tcp"), 10, "a put over beanstalk to any tube, id of class 1")


def test_drain_sigusr1_503():
    """Last test: SIGUSR1 makes the server drain; puts answer 503 DRAINING
    with Retry-After; existing jobs can still be reserved and deleted."""
    if not T.server_pid:
        raise Skip("no --server-pid: cannot send SIGUSR1")
    tube = uniq("drain")
    jid = put(tube, b"before the drain")
    total = server_stats()["total_jobs"]
    os.kill(T.server_pid, signal.SIGUSR1)
    wait_for(lambda: server_stats()["draining"], "draining after SIGUSR1", timeout=3)
    puts = server_stats()["cmd_put"]
    expect_problem(post("/tubes/%s/jobs" % tube, body=b"no"), 503, "DRAINING", "put while draining")
    expect_problem(post_json("/tubes/%s/jobs/batch" % tube, {"jobs": [{"body": "no"}, {"body": "no 2"}]}),
                   503, "DRAINING", "batch put while draining")
    expect_problem(post("/tubes/%s/jobs" % tube, body=b"no", headers={"Idempotency-Key": uniq("k")}), 503,
                   "DRAINING", "put with a new key while draining")
    check_eq(server_stats()["cmd_put"], puts + 4, "refused puts count as puts, as beanstalk's do")
    d = reserve_one(tube, body=b"before the drain")
    check_eq(d["id"], jid, "an existing job is still reserved while draining")
    expect_status(delete("/jobs/%d%s" % (jid, q(reservation=d["reservation"]))), 204, "delete while draining")
    check_eq(server_stats()["total_jobs"], total, "nothing stored while draining")


# ---- push delivery ------------------------------------------------------------------

def push_subscription():
    doc = expect_json(get("/subscriptions"), 200, "GET /subscriptions")
    check_eq(set(doc), {"subscriptions"}, "GET /subscriptions keys")
    subs = [s for s in doc["subscriptions"] if s["tube"] == PUSH_TUBE]
    check_eq(len(subs), 1, "the server's subscription for %s" % PUSH_TUBE)
    check_eq(set(subs[0]), SUBSCRIPTION_KEYS, "subscription keys")
    return subs[0]


def test_subscriptions():
    s = push_subscription()
    check_eq((s["url"], s["concurrency"], s["rate"], s["timeout"], s["attempts"], s["backoff_min"],
              s["backoff_max"], s["signed"]),
             ("http://127.0.0.1:1/", 1, None, 30, 1, 1, 600, False), "settings and defaults")
    check_eq(set(s["retried_by_reason"]), {"retry_after", "http_429", "http_5xx", "timeout", "connect_failed",
                                           "connection_error", "bad_status", "tls_error"},
             "retried_by_reason keys")
    check_eq(set(s["buried_by_reason"]), {"http_3xx", "http_4xx", "attempts_exhausted"}, "buried_by_reason keys")
    check_eq([x["tube"] for x in server_stats()["subscriptions"]], [PUSH_TUBE], "GET /stats subscriptions")


def test_clients_and_reserved_by():
    """GET /clients and DELETE /clients/{id} through the contract check (the
    full behaviour is tests/http/test_clients.py's): a beanstalk worker
    holding a job is listed and named by the job's reserved_by; the push
    subscription is listed and cannot be closed; bad parameters are 400."""
    tube = uniq("clients")
    jid = put(tube, b"held")
    b = Beanstalk(T.tcp_port)
    try:
        b.cmd("watch %s\r\n" % tube)
        check_eq(b.cmd("reserve-with-timeout 0\r\n"), b"RESERVED %d 4\r\n" % jid, "TCP reserve")
        port = b.sock.getsockname()[1]
        doc = expect_json(get("/clients?protocol=beanstalk&limit=500"), 200, "GET /clients")
        mine = [c for c in doc["clients"] if c["peer"] == "127.0.0.1:%d" % port]
        check_eq(len(mine), 1, "the worker listed")
        check_eq((mine[0]["reserved"], mine[0]["reserved_ids"]), (1, [jid]), "its reservation")
        check_eq(job_stats(jid)["reserved_by"], mine[0]["id"], "the job's reserved_by")
        push = expect_json(get("/clients?protocol=push"), 200, "GET /clients?protocol=push")["clients"]
        check_eq([c["watching"] for c in push], [[PUSH_TUBE]], "the push subscription")
        expect_problem(delete("/clients/%d" % push[0]["id"]), 409, "NOT_CLOSABLE", "DELETE a subscription")
        expect_problem(get("/clients?limit=501", via="direct"), 400, "BAD_FORMAT", "limit 501")
        expect_problem(get("/clients?cursor=x", via="direct"), 400, "BAD_FORMAT", "a bad cursor")
        expect_problem(delete("/clients/x", via="direct"), 400, "BAD_FORMAT", "a bad id")
        expect_status(delete("/clients/%d" % mine[0]["id"]), 204, "DELETE the worker")
        check_eq(job_stats(jid)["state"], "ready", "its job is ready again")
        expect_problem(delete("/clients/%d" % mine[0]["id"]), 404, "NOT_FOUND", "DELETE it again")
    finally:
        b.close()
    expect_status(delete("/jobs/%d" % jid), 204, "delete the job")


def test_push_last_delivery_error():
    before = push_subscription()
    j = put(PUSH_TUBE, b"to nowhere")

    def buried():
        doc = expect_json(get("/jobs/%d" % j), 200, "GET /jobs/%d" % j)
        return doc if doc["state"] == "buried" else None
    doc = testlib.wait_until(buried, "the push job buried", 10)
    check_eq(set(doc), JOB_KEYS | {"last_delivery_error"}, "job keys")
    e = doc["last_delivery_error"]
    check_eq((e["status"], e["error"], e["attempt"]), (None, "connect_failed", 1), "last_delivery_error")
    check(abs(e["at"] - time.time()) < 30, "at %r" % e["at"])
    after = push_subscription()
    check_eq(after["buried_by_reason"]["attempts_exhausted"], before["buried_by_reason"]["attempts_exhausted"] + 1,
             "buried for attempts_exhausted")
    check_eq(after["last_error"], dict(e, job_id=j), "the subscription's last_error")
    check_eq(delete("/jobs/%d" % j).status, 204, "delete the buried job")


TESTS = [
    test_host_header_required_once_400,
    test_foreign_host_421,
    test_allowed_hosts_setting,
    test_cross_site_state_changes_403,
    test_nosniff_and_no_store_on_every_response,
    test_subscriptions,
    test_clients_and_reserved_by,
    test_push_last_delivery_error,
    test_tube_name_with_slash,
    test_put_defaults,
    test_put_with_parameters,
    test_put_empty_body,
    test_put_bad_numbers_400,
    test_bad_tube_names_400,
    test_nul_in_path_does_not_cut_it,
    test_put_job_too_big_413,
    test_put_413_before_body_is_sent,
    test_keep_alive_connection,
    test_reserve_poll_empty_204,
    test_reserve_timeout_1s_204,
    test_reserve_json,
    test_reserve_priority_order,
    test_reserve_raw_octet_stream,
    test_longpoll_woken_by_http_put,
    test_longpoll_woken_by_tcp_put,
    test_longpoll_fin_close_gives_no_job,
    test_longpoll_close_then_put_at_once,
    test_longpoll_reset_gives_no_job,
    test_longpoll_pipelined_request,
    test_concurrent_longpollers_get_different_jobs,
    test_reserve_count_batch,
    test_reserve_count_longpoll,
    test_reserve_several_tubes,
    test_reserve_bad_parameters_400,
    test_reserve_timeout_above_cap_is_accepted,
    test_reserve_job_by_id,
    test_get_job_and_body,
    test_delete_ready_delayed_buried,
    test_reservation_token_rules,
    test_conflict_codes,
    test_reservation_token_header,
    test_release,
    test_bury_peek_kick,
    test_touch_and_ttr,
    test_ttr_expiry_ends_the_reservation,
    test_method_not_allowed_405,
    test_head_on_every_get_route,
    test_unknown_route_404,
    test_list_tubes,
    test_tube_stats,
    test_tube_kick,
    test_tube_jobs_in_serving_order,
    test_tube_jobs_cursor_survives_changes,
    test_tube_jobs_limits_400,
    test_tube_bulk_delete,
    test_tube_bulk_kick,
    test_bulk_delete_in_steps_other_clients_served,
    test_two_bulk_deletes_of_one_tube,
    test_bulk_deletes_at_once_share_one_budget,
    test_bulk_delete_stops_when_its_client_leaves,
    test_bulk_delete_at_shutdown_loses_nothing,
    test_bulk_delete_with_log_paced_and_kept,
    test_tube_pause,
    test_peek_ready_delayed_buried,
    test_stats,
    test_stats_jobs_reserved_and_deleted,
    test_stats_version_uptime_connections,
    test_command_counters_count_http_requests,
    test_tube_stats_pages,
    test_tube_stats_pages_filter_with_slash_and_plus,
    test_stats_history_shows_puts_and_deletes,
    test_tube_rates_on_the_first_poll,
    test_tube_rates_settle_with_many_tubes,
    test_tube_stats_pages_bad_parameters_400,
    test_ui_files_served,
    test_ui_etag_304,
    test_ui_redirect_and_unknown_files,
    test_openapi_served,
    test_document_matches_route_table,
    test_error_table_of_the_guide,
    test_http_put_tcp_reserve,
    test_tcp_put_http_reserve_delete,
    test_ids_increase_across_protocols,
    test_batch_put,
    test_batch_put_idempotency_key,
    test_batch_put_invalid_entries,
    test_batch_put_malformed_400,
    test_idempotency_replay,
    test_idempotency_key_for_another_tube_422,
    test_idempotency_key_reused_with_another_request_422,
    test_idempotency_replay_is_the_first_answer,
    test_idempotency_key_invalid_400,
    test_binary_body_base64,
    test_binary_raw_round_trip,
    test_utf8_and_nul_bodies_as_json_text,
    test_cors_off_by_default,
    test_cors_preflight_on_every_route,
    test_cors_actual_responses,
    test_cors_origins_checked_at_start,
    test_worker_loop_of_the_guide,
    test_worker_loop_backs_off_when_the_server_is_down,
    test_worker_loop_backs_off_on_4xx,
    test_raw_reserve_example_of_the_guide,
    test_no_http_flag,
    test_sigterm_with_waiting_longpoll,
    test_timeout_is_capped_by_http_max_wait,
    test_shard_refuses_other_shards_tubes_421,
    test_drain_sigusr1_503,   # last: the server drains from here on
]


# ---- runner ------------------------------------------------------------------------------

def parse_url(url):
    u = urllib.parse.urlsplit(url)
    if u.scheme != "http" or not u.hostname or u.path not in ("", "/"):
        raise ValueError("want http://HOST:PORT, got %r" % url)
    return (u.hostname, u.port or 80)


RUN = {}                 # the server this run started, if it started one


def setup(names):
    """Start a server of this run's own, or use the one given by the options."""
    opts = RUN["args"]
    if opts.base_url:
        T.base = parse_url(opts.base_url)
        T.direct = parse_url(opts.direct_url)
        T.tcp_port = opts.tcp_port
        T.server_pid = opts.server_pid
        T.proxied = T.base != T.direct
        print("using %s (server HTTP %s, TCP port %d)" % (opts.base_url, opts.direct_url, T.tcp_port),
              flush=True)
    else:
        RUN["server"] = server = Server(PUSH_ARGS).start()
        T.base = T.direct = ("127.0.0.1", server.http_port)
        T.tcp_port = server.tcp_port
        T.server_pid = server.proc.pid
        print("started %s" % " ".join(server.argv()), flush=True)


def server_stops_cleanly():
    """After the tests, the server this run started stops on SIGTERM with
    status 0 and no sanitizer report."""
    if "server" not in RUN:
        raise Skip("no server was started")
    status, err = RUN["server"].stop()
    check_stopped(status, err, "the test server")


def print_violations():
    if VIOLATIONS:
        print("contract violations seen: %d" % len(VIOLATIONS), flush=True)
        for v in sorted(set(VIOLATIONS)):
            print("  " + v[:2000], flush=True)


def main(argv):
    parser = testlib.arg_parser(__doc__)
    parser.add_argument("--base-url", metavar="URL", help="reach a running server's HTTP here")
    parser.add_argument("--direct-url", metavar="URL", help="that server's own HTTP address")
    parser.add_argument("--tcp-port", type=int, metavar="N", help="that server's beanstalk port")
    parser.add_argument("--server-pid", type=int, metavar="PID", help="that server's pid (for SIGUSR1)")
    args = RUN["args"] = testlib.parse_args(parser, argv)
    if args.base_url and (args.tcp_port is None or not args.direct_url):
        parser.error("--base-url needs --direct-url and --tcp-port")
    T.binary = args.binary
    return testlib.run("http", TESTS, args, namespace=globals(), setup=setup,
                       last=() if args.base_url else (server_stops_cleanly,), finish=print_violations)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
