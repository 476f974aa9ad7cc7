#!/usr/bin/env python3
"""Who is connected (issue 26): GET /clients and DELETE /clients/{id}, and
`reserved_by` of GET /jobs/{id}, against the real binary. Beanstalk
connections (plain and TLS) with use, watch and reserve show their fields
and peer ports; a Gearman worker, a waiting HTTP long-poll and a push
subscription show; paging over 1,200 connections with the cursor has no
duplicate and no gap while connections close and open; DELETE closes a
beanstalk connection and its reserved job is ready again (checked over the
beanstalk protocol), ends a long-poll with 204, refuses a push subscription
(409 NOT_CLOSABLE); limits, cursor and protocol are validated; a scoped
token needs read:* and manage:*.

Usage:
  python3 tests/http/test_clients.py build/beangate

Every test starts its own server on free loopback ports (tests/http/
test_ops.py's Server: a clean SIGTERM exit and no sanitizer report are
checked). The runner is tests/lib/testlib.py's: -k NAME runs one test, the
last line is `clients: N passed, M failed, K skipped`; exits 1 on failure.
"""

import json
import os
import socket
import ssl
import struct
import sys
import tempfile
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, HERE)
import testlib  # noqa: E402
import test_ops  # noqa: E402  (its Server and token_file)
from testlib import check, check_eq, free_port  # noqa: E402

TIMEOUT = 10.0


def call(srv, method, path, token=None):
    """(status, parsed JSON or raw bytes)."""
    headers = {"Authorization": "Bearer " + token} if token else {}
    status, rh, raw = srv.request(method, path, headers=headers)
    data = json.loads(raw) if "json" in rh.get("content-type", "") and raw else raw
    return status, data


def clients(srv, query=""):
    status, doc = call(srv, "GET", "/clients" + query)
    check_eq(status, 200, "GET /clients%s (%r)" % (query, doc))
    return doc


def every_client(srv, protocol=None):
    """All clients, paged through with the cursor: {peer or id: client}."""
    out, cursor = [], None
    while True:
        q = "?limit=500" + ("&protocol=" + protocol if protocol else "") + ("&cursor=" + cursor if cursor else "")
        doc = clients(srv, q)
        out += doc["clients"]
        cursor = doc["next"]
        if cursor is None:
            return out


def by_port(srv, port, protocol="beanstalk"):
    """The listed client whose peer is 127.0.0.1:port, or None."""
    for c in every_client(srv, protocol):
        if c["peer"] == "127.0.0.1:%d" % port:
            return c
    return None


def wait_client(srv, port, what, ok=lambda c: True, protocol="beanstalk"):
    return testlib.wait_until(lambda: (lambda c: c if c and ok(c) else None)(by_port(srv, port, protocol)),
                              what, TIMEOUT)


class Beanstalk:
    """A beanstalk connection that reads replies line by line."""

    def __init__(self, port, wrap=None):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        if wrap:
            self.sock = wrap(self.sock)
        self.file = self.sock.makefile("rb")
        self.port = self.sock.getsockname()[1]

    def send(self, data):
        self.sock.sendall(data if isinstance(data, bytes) else data.encode())

    def line(self):
        return self.file.readline().decode().rstrip("\r\n")

    def cmd(self, text):
        self.send(text + "\r\n")
        reply = self.line()
        if reply.startswith(("RESERVED ", "OK ", "FOUND ")):
            self.file.read(int(reply.split()[-1]) + 2)
        return reply

    def close(self):
        self.file.close()  # the socket's descriptor stays open while its file is
        testlib.close_quietly(self.sock)


def job_state(port, job_id):
    """The state of the job by stats-job on a new beanstalk connection."""
    b = Beanstalk(port)
    try:
        b.send("stats-job %d\r\n" % job_id)
        head = b.line()
        check(head.startswith("OK "), "stats-job %d: %r" % (job_id, head))
        yaml = b.file.read(int(head.split()[1]) + 2).decode()
        return [line.split(": ", 1)[1] for line in yaml.splitlines() if line.startswith("state: ")][0]
    finally:
        b.close()


# ---- the fields ------------------------------------------------------------------------

def test_beanstalk_fields_and_reserved_by():
    with test_ops.Server() as srv:
        producer = Beanstalk(srv.tcp_port)
        check_eq(producer.cmd("use emails"), "USING emails", "use")
        check_eq(producer.cmd("watch reports"), "WATCHING 2", "watch")
        check_eq(producer.cmd("put 0 0 60 5\r\nhello"), "INSERTED 1", "put")
        worker = Beanstalk(srv.tcp_port)
        check_eq(worker.cmd("watch emails"), "WATCHING 2", "watch")
        check_eq(worker.cmd("reserve"), "RESERVED 1 5", "reserve")
        waiter = Beanstalk(srv.tcp_port)
        waiter.send("watch other\r\nignore default\r\nreserve\r\n")
        check_eq(waiter.line(), "WATCHING 2", "watch")
        check_eq(waiter.line(), "WATCHING 1", "ignore")

        p = wait_client(srv, producer.port, "the producer listed")
        check_eq({k: p[k] for k in ("protocol", "tls", "peer", "name", "use", "watching", "reserved",
                                     "reserved_ids", "waiting", "waiting_for")},
                 {"protocol": "beanstalk", "tls": False, "peer": "127.0.0.1:%d" % producer.port, "name": None,
                  "use": "emails", "watching": ["default", "reports"], "reserved": 0, "reserved_ids": [],
                  "waiting": False, "waiting_for": None}, "the producer")
        check(isinstance(p["age"], int) and p["age"] >= 0 and isinstance(p["idle"], int) and p["idle"] >= 0,
              "age and idle are seconds: %r" % p)
        w = wait_client(srv, worker.port, "the worker listed")
        check_eq((w["use"], w["watching"], w["reserved"], w["reserved_ids"], w["waiting"]),
                 ("default", ["default", "emails"], 1, [1], False), "the worker")
        v = wait_client(srv, waiter.port, "the waiter waiting", lambda c: c["waiting"])
        check_eq((v["watching"], v["reserved"]), (["other"], 0), "the waiter")
        check(isinstance(v["waiting_for"], int) and v["waiting_for"] >= 0, "waiting_for: %r" % v)
        check(p["id"] < w["id"] < v["id"], "ids ascend in connection order: %r" % [p["id"], w["id"], v["id"]])

        status, job = call(srv, "GET", "/jobs/1")
        check_eq((status, job["state"], job["reserved_by"]), (200, "reserved", w["id"]), "GET /jobs/1")
        # a job reserved over HTTP is held by a token, not a connection
        status, _ = call(srv, "POST", "/tubes/reports/jobs")
        check_eq(status, 201, "HTTP put")
        status, got = call(srv, "POST", "/tubes/reports/reservations?timeout=0")
        check_eq(status, 200, "HTTP reserve")
        status, job = call(srv, "GET", "/jobs/%d" % got["id"])
        check_eq(job["reserved_by"], None, "reserved_by of an HTTP reservation")
        # a ready job has no reserved_by at all
        status, ready = call(srv, "POST", "/tubes/emails/jobs")
        status, job = call(srv, "GET", "/jobs/%d" % ready["id"])
        check("reserved_by" not in job, "a ready job has no reserved_by: %r" % job)

        # a closed connection leaves the list
        producer.close()
        testlib.wait_until(lambda: by_port(srv, producer.port) is None, "the closed producer gone", TIMEOUT)
        for c in (worker, waiter):
            c.close()


def test_tls_connection_shows_tls():
    try:
        from tlsfiles import TestCA
    except ImportError as e:  # the cryptography module
        raise testlib.Skip("no test CA: %s" % e)
    work = tempfile.mkdtemp(prefix="beangate-clients-tls-")
    ca = TestCA(work)
    cert, key = ca.issue("server", dns=["localhost"], ips=["127.0.0.1"])
    tls_port = free_port()
    with test_ops.Server(["--tls-port", str(tls_port), "--tls-cert", cert, "--tls-key", key]) as srv:
        ctx = ssl.create_default_context(cafile=ca.cert)
        conn = Beanstalk(tls_port, wrap=lambda s: ctx.wrap_socket(s, server_hostname="localhost"))
        check_eq(conn.cmd("use secure"), "USING secure", "use over TLS")
        c = wait_client(srv, conn.port, "the TLS connection listed")
        check_eq((c["tls"], c["use"]), (True, "secure"), "a TLS connection")
        plain = Beanstalk(srv.tcp_port)
        check_eq(plain.cmd("list-tube-used"), "USING default", "plain")
        check_eq(wait_client(srv, plain.port, "the plain one")["tls"], False, "a plain connection")
        conn.close()
        plain.close()


GEARMAN = dict(CAN_DO=1, PRE_SLEEP=4)


def gearman_packet(kind, *args):
    body = b"\0".join(a.encode() for a in args)
    return b"\0REQ" + struct.pack(">II", GEARMAN[kind], len(body)) + body


def test_gearman_worker():
    gm_port = free_port()
    with test_ops.Server(["--gearman-listen", "127.0.0.1", "--gearman-port", str(gm_port)]) as srv:
        w = socket.create_connection(("127.0.0.1", gm_port), timeout=TIMEOUT)
        port = w.getsockname()[1]
        w.sendall(gearman_packet("CAN_DO", "resize") + gearman_packet("PRE_SLEEP"))
        c = wait_client(srv, port, "the sleeping Gearman worker", lambda c: c["waiting"], protocol="gearman")
        check_eq((c["protocol"], c["use"], c["watching"], c["reserved"], c["tls"]),
                 ("gearman", None, ["resize"], 0, False), "the Gearman worker")
        check(isinstance(c["waiting_for"], int), "waiting_for: %r" % c)
        check_eq(by_port(srv, port, "beanstalk"), None, "not among the beanstalk clients")
        check_eq(clients(srv, "?protocol=gearman")["count"], 1, "count of Gearman clients")
        status, _ = call(srv, "DELETE", "/clients/%d" % c["id"])
        check_eq(status, 204, "DELETE the worker")
        check_eq(w.recv(100), b"", "the worker's connection closed")
        w.close()


# ---- HTTP long-poll and push ----------------------------------------------------------

def test_long_poll_listed_and_ended():
    with test_ops.Server() as srv:
        result = {}

        def poll():
            result["answer"] = srv.request("POST", "/tubes/jobs-for-poll/reservations?timeout=30", timeout=40)

        t = threading.Thread(target=poll)
        t.start()
        try:
            c = testlib.wait_until(
                lambda: (clients(srv, "?protocol=http")["clients"] or [None])[0], "the long-poll listed", TIMEOUT)
            check_eq((c["protocol"], c["watching"], c["use"], c["waiting"], c["reserved"]),
                     ("http", ["jobs-for-poll"], None, True, 0), "the long-poll")
            check(c["peer"] and c["peer"].startswith("127.0.0.1:"), "its peer: %r" % c["peer"])
            check_eq(clients(srv)["count"], 1, "one client in all")
            status, _ = call(srv, "DELETE", "/clients/%d" % c["id"])
            check_eq(status, 204, "DELETE the long-poll")
            t.join(TIMEOUT)
            check(not t.is_alive(), "the long-poll answered after DELETE")
            check_eq(result["answer"][0], 204, "the long-poll ends as timed out")
            check_eq(clients(srv, "?protocol=http")["clients"], [], "no long-poll listed after")
        finally:
            t.join(40)


def test_push_subscription_listed_not_closable():
    url = "http://127.0.0.1:%d/hook" % free_port()  # nothing is put: nothing is delivered
    with test_ops.Server(["--push", "tube=pushed url=" + url]) as srv:
        doc = clients(srv, "?protocol=push")
        check_eq(doc["count"], 1, "one push subscription")
        c = doc["clients"][0]
        check_eq((c["protocol"], c["name"], c["peer"], c["tls"], c["watching"], c["reserved"]),
                 ("push", url, None, False, ["pushed"], 0), "the subscription")
        check_eq(c["waiting"], True, "it waits for a job")
        status, problem = call(srv, "DELETE", "/clients/%d" % c["id"])
        check_eq((status, problem["code"]), (409, "NOT_CLOSABLE"), "DELETE a subscription")
        check("configuration" in problem["detail"], "the detail says why: %r" % problem)
        check_eq(clients(srv, "?protocol=push")["count"], 1, "still there")


# ---- paging ----------------------------------------------------------------------------

def test_paging_1200_connections_while_some_close():
    with test_ops.Server() as srv:
        conns = [Beanstalk(srv.tcp_port) for _ in range(1200)]
        try:
            testlib.wait_until(lambda: clients(srv, "?limit=1")["count"] >= 1200, "1,200 listed", 30)
            ports = {c.port: c for c in conns}
            first = clients(srv, "?limit=100")
            check_eq(len(first["clients"]), 100, "a full page")
            check(first["next"] is not None, "a next cursor")
            seen, ids, cursor, page = [], set(), None, 0
            closed, opened = set(), []
            while True:
                doc = clients(srv, "?limit=100" + ("&cursor=" + cursor if cursor else ""))
                for c in doc["clients"]:
                    check(c["id"] not in ids, "client %d twice" % c["id"])
                    check(not seen or c["id"] > seen[-1]["id"], "ids ascend across pages")
                    ids.add(c["id"])
                    seen.append(c)
                page += 1
                # between pages: close 60 connections not yet shown (past half of them by
                # the end: the server compacts its array meanwhile), open 5 new ones
                shown = {int(c["peer"].rsplit(":", 1)[1]) for c in seen if c["peer"]}
                for port in [p for p in ports if p not in shown and p not in closed][:60]:
                    ports[port].close()
                    closed.add(port)
                for _ in range(5):
                    opened.append(Beanstalk(srv.tcp_port))
                cursor = doc["next"]
                if cursor is None:
                    break
            check(page >= 5, "several pages: %d" % page)
            shown = {int(c["peer"].rsplit(":", 1)[1]) for c in seen if c["peer"]}
            # every connection open the whole time is on some page
            missing = [p for p in ports if p not in closed and p not in shown]
            check_eq(missing, [], "connections open throughout that no page showed")
            conns += opened
        finally:
            for c in conns:
                c.close()


def test_limits_cursor_protocol_validated():
    with test_ops.Server() as srv:
        conns = [Beanstalk(srv.tcp_port) for _ in range(3)]
        try:
            testlib.wait_until(lambda: clients(srv)["count"] >= 3, "3 listed", TIMEOUT)
            # /metrics counts the same clients
            lines = srv.metrics().splitlines()
            for protocol in ("beanstalk", "gearman", "http", "push"):
                want = 'beangate_clients{protocol="%s"} %d' % (protocol, clients(srv, "?protocol=" + protocol)["count"])
                check(want in lines, "%s in /metrics" % want)
            check_eq(len(clients(srv, "?limit=500")["clients"]), clients(srv)["count"], "limit=500 is allowed")
            check_eq(clients(srv, "?limit=1")["next"] is not None, True, "limit=1 has a next")
            last = clients(srv)["clients"][-1]["id"]
            check_eq(clients(srv, "?cursor=%d" % last), {"count": clients(srv)["count"], "clients": [],
                                                          "next": None}, "a cursor past the end")
            for query, word in (("?limit=501", "limit"), ("?limit=0", "limit"), ("?limit=x", "limit"),
                                ("?cursor=abc", "cursor"), ("?cursor=-1", "cursor"),
                                ("?protocol=smtp", "protocol"), ("?protocol=", "protocol")):
                status, problem = call(srv, "GET", "/clients" + query)
                check_eq((status, problem["code"]), (400, "BAD_FORMAT"), "GET /clients" + query)
                check(word in problem["detail"], "%s: the detail names %s: %r" % (query, word, problem))
            for path, want in (("/clients/abc", 400), ("/clients/0", 400), ("/clients/999999", 404)):
                status, problem = call(srv, "DELETE", path)
                check_eq(status, want, "DELETE " + path)
        finally:
            for c in conns:
                c.close()


# ---- closing ----------------------------------------------------------------------------

def test_delete_closes_and_its_job_is_ready():
    with test_ops.Server() as srv:
        producer = Beanstalk(srv.tcp_port)
        check_eq(producer.cmd("put 0 0 120 3\r\nabc"), "INSERTED 1", "put")
        worker = Beanstalk(srv.tcp_port)
        check_eq(worker.cmd("reserve"), "RESERVED 1 3", "reserve")
        check_eq(job_state(srv.tcp_port, 1), "reserved", "state before")
        c = wait_client(srv, worker.port, "the worker listed", lambda c: c["reserved"] == 1)
        status, _ = call(srv, "DELETE", "/clients/%d" % c["id"])
        check_eq(status, 204, "DELETE the worker")
        # the answer came after the close: the job is ready now, no waiting
        check_eq(job_state(srv.tcp_port, 1), "ready", "state after")
        check_eq(worker.file.read(), b"", "the worker's connection was closed, nothing more written")
        check_eq(by_port(srv, worker.port), None, "gone from the list")
        status, _ = call(srv, "DELETE", "/clients/%d" % c["id"])
        check_eq(status, 404, "DELETE it again")
        # another worker gets the job at once
        again = Beanstalk(srv.tcp_port)
        check_eq(again.cmd("reserve-with-timeout 0"), "RESERVED 1 3", "reserved again")
        for b in (producer, worker, again):
            b.close()


# ---- scopes -----------------------------------------------------------------------------

READ_ALL = "clients-read-all-5b1e0c7d"
MANAGE_ALL = "clients-manage-all-93a6f2e4"
MANAGE_SOME = "clients-manage-some-0d4c8b71"


def test_scopes():
    path = test_ops.token_file(READ_ALL + " read:*", MANAGE_ALL + " manage:* read:*",
                               MANAGE_SOME + " manage:emails read:emails,reports")
    with test_ops.Server(["--http-token-file", path]) as srv:
        conn = Beanstalk(srv.tcp_port)
        check_eq(conn.cmd("list-tube-used"), "USING default", "a connection")
        status, doc = call(srv, "GET", "/clients", READ_ALL)
        check_eq(status, 200, "read:* lists clients")
        c = [x for x in doc["clients"] if x["peer"] == "127.0.0.1:%d" % conn.port][0]
        for method, where, token, required in (("GET", "/clients", MANAGE_SOME, "read:*"),
                                               ("DELETE", "/clients/%d" % c["id"], READ_ALL, "manage:*"),
                                               ("DELETE", "/clients/%d" % c["id"], MANAGE_SOME, "manage:*")):
            status, problem = call(srv, method, where, token)
            check_eq((status, problem["code"], problem["required_scope"]), (403, "PERMISSION_DENIED", required),
                     "%s %s refused" % (method, where))
        status, doc = call(srv, "GET", "/clients", MANAGE_ALL)
        check(any(x["id"] == c["id"] for x in doc["clients"]), "still connected after the refusals")
        status, _ = call(srv, "DELETE", "/clients/%d" % c["id"], MANAGE_ALL)
        check_eq(status, 204, "manage:* closes it")
        check_eq(conn.file.read(), b"", "closed")
        status, _ = call(srv, "GET", "/clients")
        check_eq(status, 401, "no token")
        conn.close()


TESTS = [
    test_beanstalk_fields_and_reserved_by,
    test_tls_connection_shows_tls,
    test_gearman_worker,
    test_long_poll_listed_and_ended,
    test_push_subscription_listed_not_closable,
    test_paging_1200_connections_while_some_close,
    test_limits_cursor_protocol_validated,
    test_delete_closes_and_its_job_is_ready,
    test_scopes,
]


def main(argv):
    args = testlib.parse_args(testlib.arg_parser(__doc__), argv)
    test_ops.BINARY = args.binary
    return testlib.run("clients", TESTS, args, namespace=globals())


if __name__ == "__main__":
    sys.exit(main(sys.argv))
