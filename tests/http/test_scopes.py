#!/usr/bin/env python3
"""Scoped tokens on the HTTP gateway (issue 23): an access file with several
scoped tokens, each kind of action (produce, consume, manage, read) allowed
and refused over HTTP with the exact 403 PERMISSION_DENIED body and its
required_scope, prefix grants, listings (GET /tubes, /stats/tubes, the
subscriptions of /stats and /subscriptions, /metrics' per-tube and push
series) that show only the tubes a token sees, a job of an unseen tube
answered 404 as a missing one, GET /auth (grants and patterns), an
unscoped token and a server without tokens unchanged, refusals counted in
GET /stats and /metrics, and a SIGHUP reload while a long-poll waits.

Usage:
  python3 tests/http/test_scopes.py build/beangate

Every test starts its own server on free loopback ports (tests/http/
test_ops.py's Server: a clean SIGTERM exit and no sanitizer report are
checked). The runner is tests/lib/testlib.py's: -k NAME runs one test, the
last line is `scopes: N passed, M failed, K skipped`; exits 1 on failure.
"""

import json
import os
import signal
import sys
import threading
import urllib.parse

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import testlib  # noqa: E402
import test_ops  # noqa: E402  (its Server and token_file)
from testlib import check, check_eq  # noqa: E402

PRODUCER = "scope-producer-4c1e9a02b7"
CONSUMER = "scope-consumer-9b37d0e6f1"
MANAGER = "scope-manager-2a8f64c0d5"
READER = "scope-reader-71e0c3b9a4"
PREFIX = "scope-prefix-e5d2a81f06"
UNSCOPED = "scope-unscoped-0f6b2d93c8"
WRONG = "scope-wrong-token-000000"

ACCESS_FILE = [
    "# the access file of these tests",
    PRODUCER + " produce:emails",
    CONSUMER + " consume:emails read:emails",
    MANAGER + " manage:emails,reports read:emails,reports",
    READER + " read:*",
    PREFIX + " produce,read:mail-*",
    UNSCOPED,
]

ALL_KINDS = ["produce", "consume", "manage", "read"]


def scoped_server(*args):
    path = test_ops.token_file(*ACCESS_FILE)
    return test_ops.Server(["--http-token-file", path] + list(args))


def call(srv, method, path, token=None, body=None, headers=None):
    """(status, headers, parsed JSON or raw bytes)."""
    h = dict(headers or {})
    if token:
        h["Authorization"] = "Bearer " + token
    status, rh, raw = srv.request(method, path, body=body, headers=h)
    ctype = rh.get("content-type", "")
    data = json.loads(raw) if "json" in ctype and raw else raw
    return status, rh, data


def put(srv, tube, token=UNSCOPED, body=b"job"):
    status, _, data = call(srv, "POST", "/tubes/%s/jobs" % urllib.parse.quote(tube, safe=""), token, body)
    check_eq(status, 201, "put into %s" % tube)
    return data["id"]


def denied(srv, method, path, token, required, what):
    """The exact 403 of a scoped token's refusal."""
    status, headers, raw = srv.request(method, path, headers={"Authorization": "Bearer " + token})
    check_eq(status, 403, "%s: status" % what)
    check_eq(headers.get("content-type"), "application/problem+json", "%s: content type" % what)
    check_eq(json.loads(raw), {
        "type": "about:blank", "title": "Forbidden", "status": 403, "code": "PERMISSION_DENIED",
        "detail": "this token's scope does not allow this request: it needs " + required,
        "required_scope": required}, "%s: body" % what)


def allowed(srv, method, path, token, want, what, headers=None):
    status, _, data = call(srv, method, path, token, headers=headers)
    check_eq(status, want, what + ": status (body %r)" % (data,))
    return data


# ---- each kind, allowed and refused ------------------------------------------

def test_produce():
    with scoped_server() as srv:
        allowed(srv, "POST", "/tubes/emails/jobs", PRODUCER, 201, "producer puts into emails")
        allowed(srv, "POST", "/tubes/emails/jobs/batch?x=1", PRODUCER, 400, "producer's batch reaches the handler")
        denied(srv, "POST", "/tubes/reports/jobs", PRODUCER, "produce:reports", "producer puts into reports")
        denied(srv, "POST", "/tubes/reports/jobs/batch", PRODUCER, "produce:reports", "producer's batch elsewhere")
        denied(srv, "POST", "/tubes/emails/jobs", CONSUMER, "produce:emails", "consumer puts")
        denied(srv, "POST", "/tubes/emails/jobs", READER, "produce:emails", "reader puts")
        denied(srv, "GET", "/tubes/emails", PRODUCER, "read:emails", "producer reads the tube")
        denied(srv, "POST", "/tubes/emails/reservations?timeout=0", PRODUCER, "consume:emails",
               "producer reserves")


def test_consume():
    with scoped_server() as srv:
        put(srv, "emails")
        job = allowed(srv, "POST", "/tubes/emails/reservations?timeout=0", CONSUMER, 200, "consumer reserves")
        token = {"X-Reservation": job["reservation"]}
        path = "/jobs/%d" % job["id"]
        allowed(srv, "POST", path + "/touch", CONSUMER, 200, "touch", headers=token)
        allowed(srv, "POST", path + "/release", CONSUMER, 200, "release", headers=token)
        job = allowed(srv, "POST", "/reservations?tubes=emails&timeout=0", CONSUMER, 200, "reserve by ?tubes=")
        token = {"X-Reservation": job["reservation"]}
        allowed(srv, "POST", path + "/bury", CONSUMER, 200, "bury", headers=token)
        # deleting a buried job (no reservation) is managing it
        denied(srv, "DELETE", path, CONSUMER, "manage:emails", "consumer deletes a buried job")
        denied(srv, "POST", path + "/kick", CONSUMER, "manage:emails", "consumer kicks the job")
        allowed(srv, "POST", path + "/kick", MANAGER, 200, "manager kicks it")
        allowed(srv, "POST", path + "/reservations", CONSUMER, 200, "consumer reserves the job by id")
        job = allowed(srv, "GET", path, CONSUMER, 200, "consumer reads the job")
        check_eq(job["state"], "reserved", "the job's state")
        # with its reservation token, a delete is consuming
        job2 = put(srv, "emails")
        got = allowed(srv, "POST", "/tubes/emails/reservations?timeout=0", CONSUMER, 200, "reserve again")
        check_eq(got["id"], job2, "the second job")
        allowed(srv, "DELETE", "/jobs/%d" % job2, CONSUMER, 204, "consumer deletes with its token",
                headers={"X-Reservation": got["reservation"]})
        denied(srv, "POST", "/reservations?tubes=emails,reports&timeout=0", CONSUMER, "consume:reports",
               "consumer reserves from reports too")
        denied(srv, "POST", "/tubes/reports/reservations?timeout=0", CONSUMER, "consume:reports",
               "consumer reserves from reports")


def test_manage():
    with scoped_server() as srv:
        job = put(srv, "reports")
        allowed(srv, "POST", "/tubes/reports/kick?bound=5", MANAGER, 200, "manager kicks a tube")
        allowed(srv, "POST", "/tubes/reports/pause?delay=0", MANAGER, 200, "manager pauses a tube")
        denied(srv, "POST", "/tubes/emails/pause?delay=1", CONSUMER, "manage:emails", "consumer pauses")
        denied(srv, "POST", "/tubes/emails/kick", READER, "manage:emails", "reader kicks")
        denied(srv, "POST", "/tubes/reports/jobs", MANAGER, "produce:reports", "manager puts")
        denied(srv, "DELETE", "/jobs/%d" % job, READER, "manage:reports", "reader deletes")
        allowed(srv, "DELETE", "/jobs/%d" % job, MANAGER, 204, "manager deletes a ready job")
        # bulk actions (issue 26): manage on the tube
        put(srv, "reports")
        denied(srv, "DELETE", "/tubes/reports/jobs?state=ready", READER, "manage:reports", "reader bulk-deletes")
        denied(srv, "DELETE", "/tubes/emails/jobs?state=ready", CONSUMER, "manage:emails", "consumer bulk-deletes")
        denied(srv, "POST", "/tubes/emails/kick?state=buried&bound=all", CONSUMER, "manage:emails",
               "consumer bulk-kicks")
        allowed(srv, "POST", "/tubes/reports/kick?state=delayed&bound=all", MANAGER, 200, "manager bulk-kicks")
        check_eq(allowed(srv, "DELETE", "/tubes/reports/jobs?state=ready", MANAGER, 200, "manager bulk-deletes"),
                 {"deleted": 1, "state": "ready"}, "the bulk delete's answer")


def test_read():
    with scoped_server() as srv:
        job = put(srv, "reports")
        for path in ("/tubes/reports", "/tubes/reports/ready", "/jobs/%d" % job, "/jobs/%d/body" % job):
            allowed(srv, "GET", path, READER, 200, "reader GET " + path)
        allowed(srv, "GET", "/tubes/reports/buried", READER, 404, "reader peeks an empty state")
        page = allowed(srv, "GET", "/tubes/reports/jobs?state=ready", READER, 200, "reader lists a tube's jobs")
        check_eq([j["id"] for j in page["jobs"]], [job], "the listed job")
        denied(srv, "GET", "/tubes/reports/jobs?state=ready", PRODUCER, "read:reports", "producer lists jobs")
        denied(srv, "GET", "/tubes/reports/delayed", PRODUCER, "read:reports", "producer peeks")
        denied(srv, "POST", "/jobs/%d/reservations" % job, READER, "consume:reports", "reader reserves a job")


def test_prefix_grants():
    with scoped_server() as srv:
        allowed(srv, "POST", "/tubes/mail-eu/jobs", PREFIX, 201, "prefix token puts into mail-eu")
        allowed(srv, "POST", "/tubes/mail-/jobs", PREFIX, 201, "... into the bare prefix")
        allowed(srv, "GET", "/tubes/mail-eu", PREFIX, 200, "... reads mail-eu")
        denied(srv, "POST", "/tubes/mailbox/jobs", PREFIX, "produce:mailbox", "prefix token, mailbox")
        denied(srv, "POST", "/tubes/emails/jobs", PREFIX, "produce:emails", "prefix token, emails")
        denied(srv, "POST", "/tubes/mail-eu/reservations?timeout=0", PREFIX, "consume:mail-eu",
               "prefix token reserves")


# ---- what a token sees --------------------------------------------------------

def test_listings_filtered():
    with scoped_server("--metrics-auth") as srv:
        for tube in ("emails", "reports", "mail-eu", "other"):
            put(srv, tube)
        everything = ["default", "emails", "reports", "mail-eu", "other"]
        for token, want in ((PRODUCER, ["emails"]), (MANAGER, ["emails", "reports"]),
                            (PREFIX, ["mail-eu"]), (READER, everything), (UNSCOPED, everything)):
            tubes = allowed(srv, "GET", "/tubes", token, 200, "GET /tubes")["tubes"]
            check_eq(tubes, want, "GET /tubes of %s" % token)
            page = allowed(srv, "GET", "/stats/tubes", token, 200, "GET /stats/tubes")
            check_eq([t["name"] for t in page["tubes"]], want, "GET /stats/tubes of %s" % token)
            check_eq(page["total"], len(want), "its total")
            page = allowed(srv, "GET", "/stats/tubes?sort=name&order=desc&limit=1", token, 200, "sorted")
            check_eq([t["name"] for t in page["tubes"]], sorted(want)[-1:], "sorted page of %s" % token)
            metrics = test_ops.parse_metrics(srv.metrics(token))[0]
            series = {dict(labels)["tube"] for (name, labels) in metrics if name == "beangate_tube_paused"}
            check_eq(series, set(want), "/metrics tube series of %s" % token)
            check_eq(metrics[("beangate_tubes_exported", frozenset())], float(len(want)), "tubes exported")
            stats = allowed(srv, "GET", "/stats", token, 200, "GET /stats")
            check_eq(stats["current_tubes"], len(everything), "/stats counts the whole server")


def test_push_views_filtered():
    """The subscriptions (GET /subscriptions, GET /stats) and push
    delivery's /metrics series show a scoped token only its tubes."""
    pushes = []
    for tube in ("emails", "other"):   # no job is put: nothing is delivered
        pushes += ["--push", "tube=%s url=http://127.0.0.1:9/never" % tube]
    with scoped_server("--metrics-auth", *pushes) as srv:
        for token, want in ((PRODUCER, ["emails"]), (PREFIX, []), (UNSCOPED, ["emails", "other"])):
            subs = allowed(srv, "GET", "/subscriptions", token, 200, "GET /subscriptions")["subscriptions"]
            check_eq(sorted(x["tube"] for x in subs), want, "GET /subscriptions of %s" % token)
            subs = allowed(srv, "GET", "/stats", token, 200, "GET /stats")["subscriptions"]
            check_eq(sorted(x["tube"] for x in subs), want, "the subscriptions of GET /stats of %s" % token)
            metrics = test_ops.parse_metrics(srv.metrics(token))[0]
            tubes = {dict(labels)["tube"] for (name, labels) in metrics
                     if name.startswith("beangate_push_") and "tube" in dict(labels)}
            check_eq(sorted(tubes), want, "push delivery's series of %s" % token)


def test_unseen_job_is_404():
    with scoped_server() as srv:
        job = put(srv, "reports")
        _, _, missing = srv.get("/jobs/999999", token=PRODUCER)
        for method, path in (("GET", ""), ("GET", "/body"), ("DELETE", ""), ("POST", "/kick"),
                             ("POST", "/touch"), ("POST", "/reservations")):
            status, _, body = srv.request(method, "/jobs/%d%s" % (job, path),
                                          headers={"Authorization": "Bearer " + CONSUMER})
            check_eq(status, 404, "%s /jobs/{id}%s of an unseen tube" % (method, path))
            check_eq(body, missing, "... the body of a missing job")
        allowed(srv, "GET", "/jobs/%d" % job, MANAGER, 200, "the manager sees it")


# ---- unchanged without scopes, and GET /auth ----------------------------------

def test_unscoped_token_unchanged():
    with scoped_server() as srv:
        job = put(srv, "anything", token=UNSCOPED)
        allowed(srv, "POST", "/tubes/anything/pause?delay=0", UNSCOPED, 200, "pause")
        got = allowed(srv, "POST", "/tubes/anything/reservations?timeout=0", UNSCOPED, 200, "reserve")
        check_eq(got["id"], job, "the job")
        allowed(srv, "DELETE", "/jobs/%d" % job, UNSCOPED, 204, "delete with no reservation token",
                headers={"X-Reservation": got["reservation"]})
        status, headers, _ = srv.get("/tubes", token=WRONG)
        check_eq(status, 401, "a wrong token")
        check(headers.get("www-authenticate", "").startswith("Bearer"), "401 names the scheme")
        check_eq(srv.get("/tubes")[0], 401, "no token")
        check_eq(srv.get("/auth", token=WRONG)[0], 401, "GET /auth with a wrong token")


def test_no_token_server_unchanged():
    with test_ops.Server() as srv:
        job = put(srv, "emails", token=None)
        check_eq(allowed(srv, "GET", "/tubes", None, 200, "tubes")["tubes"], ["default", "emails"], "tubes")
        allowed(srv, "POST", "/tubes/emails/kick", None, 200, "kick")
        allowed(srv, "DELETE", "/jobs/%d" % job, None, 204, "delete")
        everything = [{"kinds": ALL_KINDS, "tubes": ["*"]}]
        check_eq(allowed(srv, "GET", "/auth", None, 200, "GET /auth"),
                 {"authenticated": False, "scoped": False, "grants": everything, "patterns": everything},
                 "GET /auth without tokens")


def test_auth_endpoint():
    with scoped_server() as srv:
        for tube in ("emails", "reports", "mail-eu"):
            put(srv, tube)
        want = {
            UNSCOPED: [{"kinds": ALL_KINDS, "tubes": ["*"]}],
            CONSUMER: [{"kinds": ["consume", "read"], "tubes": ["emails"]}],
            MANAGER: [{"kinds": ["manage", "read"], "tubes": ["emails", "reports"]}],
            PREFIX: [{"kinds": ["produce", "read"], "tubes": ["mail-eu"]}],
            READER: [{"kinds": ["read"], "tubes": ["default", "emails", "reports", "mail-eu"]}],
        }
        # the access file's grants as written, prefixes included
        patterns = {
            UNSCOPED: [{"kinds": ALL_KINDS, "tubes": ["*"]}],
            CONSUMER: [{"kinds": ["consume"], "tubes": ["emails"]}, {"kinds": ["read"], "tubes": ["emails"]}],
            MANAGER: [{"kinds": ["manage"], "tubes": ["emails", "reports"]},
                      {"kinds": ["read"], "tubes": ["emails", "reports"]}],
            PREFIX: [{"kinds": ["produce", "read"], "tubes": ["mail-*"]}],
            READER: [{"kinds": ["read"], "tubes": ["*"]}],
        }
        for token, grants in want.items():
            got = allowed(srv, "GET", "/auth", token, 200, "GET /auth")
            check_eq(got, {"authenticated": True, "scoped": token != UNSCOPED, "grants": grants,
                           "patterns": patterns[token]}, "GET /auth of %s" % token)


def refusals(srv):
    """(permission_denied of GET /stats, beangate_permission_denied_total of /metrics)."""
    stats = allowed(srv, "GET", "/stats", UNSCOPED, 200, "GET /stats")
    metrics = test_ops.parse_metrics(srv.metrics())[0]
    return stats["permission_denied"], metrics[("beangate_permission_denied_total", frozenset())]


def test_permission_denied_counted():
    """Each 403 and each job hidden as 404 counts once in GET /stats and
    /metrics; what a token may do, and 401s, do not count."""
    with scoped_server() as srv:
        check_eq(refusals(srv), (0, 0.0), "no refusal yet")
        job = put(srv, "reports")
        allowed(srv, "POST", "/tubes/emails/jobs", PRODUCER, 201, "an allowed put")
        check_eq(srv.get("/tubes", token=WRONG)[0], 401, "a wrong token")
        check_eq(refusals(srv), (0, 0.0), "allowed requests and a 401 counted nothing")
        denied(srv, "POST", "/tubes/reports/jobs", PRODUCER, "produce:reports", "producer puts into reports")
        denied(srv, "GET", "/tubes/emails", PRODUCER, "read:emails", "producer reads the tube")
        check_eq(refusals(srv), (2, 2.0), "two 403s")
        check_eq(srv.get("/jobs/%d" % job, token=CONSUMER)[0], 404, "a job of an unseen tube")
        check_eq(refusals(srv), (3, 3.0), "two 403s and a hidden job")


def test_reload_keeps_requests_under_way():
    """SIGHUP with a new access file (docs/security.md, "Reloading the
    access file"): a long-poll reserve that began under a token the new
    file removes still gets its job; the token is refused (401) from the
    next request on; the new file's token works."""
    path = test_ops.token_file(*ACCESS_FILE)
    added = "scope-added-after-reload-5d"
    with test_ops.Server(["--http-token-file", path]) as srv:
        answer = []
        waiter = threading.Thread(target=lambda: answer.append(srv.request(
            "POST", "/tubes/emails/reservations?timeout=20", headers={"Authorization": "Bearer " + CONSUMER},
            timeout=30)), daemon=True)
        waiter.start()
        testlib.wait_until(lambda: allowed(srv, "GET", "/stats", UNSCOPED, 200, "GET /stats")["current_waiting"]
                           == 1, "the long-poll waiting", 10)
        with open(path + ".new", "w") as f:   # CONSUMER removed, a token added
            f.write("\n".join([x for x in ACCESS_FILE if not x.startswith(CONSUMER)] + [added + " read:*"]) + "\n")
        os.chmod(path + ".new", 0o600)
        os.rename(path + ".new", path)
        srv.proc.send_signal(signal.SIGHUP)
        testlib.wait_until(lambda: srv.get("/tubes", token=added)[0] == 200, "the added token accepted", 10)
        check_eq(srv.get("/tubes", token=CONSUMER)[0], 401, "the removed token, on a new request")
        job = put(srv, "emails", token=PRODUCER)
        waiter.join(30)
        check(answer, "the long-poll did not answer")
        status, _, raw = answer[0]
        check_eq((status, json.loads(raw)["id"]), (200, job), "the long-poll begun before the reload: its job")
    os.unlink(path)


TESTS = [
    test_produce,
    test_consume,
    test_manage,
    test_read,
    test_prefix_grants,
    test_listings_filtered,
    test_push_views_filtered,
    test_unseen_job_is_404,
    test_unscoped_token_unchanged,
    test_no_token_server_unchanged,
    test_auth_endpoint,
    test_permission_denied_counted,
    test_reload_keeps_requests_under_way,
]


def main(argv):
    args = testlib.parse_args(testlib.arg_parser(__doc__), argv)
    test_ops.BINARY = args.binary
    return testlib.run("scopes", TESTS, args, namespace=globals())


if __name__ == "__main__":
    sys.exit(main(sys.argv))
