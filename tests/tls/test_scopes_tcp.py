#!/usr/bin/env python3
"""Scopes on the beanstalk and Gearman ports (issue 23; docs/security.md,
"Scopes"): the real binary with TLS listeners asking for client
certificates (tests/lib/tlsfiles.py makes a throwaway CA) and an access
file whose identity lines map certificates to scopes. Each certificate must
be refused what its scope does not allow, over beanstalk and Gearman, with
PERMISSION_DENIED <kind>:<tube>; a certificate no line matches and a TLS
client without one may do nothing; plain TCP keeps beanstalkd's behaviour.
Also the access file's refusals at start (exit 5, "line N: why", no token
in the message), refusals counted in permission_denied, and SIGHUP reading
the access file again (new and removed tokens and identity lines; a bad or
missing file keeps the grants in force).

Usage: test_scopes_tcp.py BINARY [-k NAME]
"""

import http.client
import json
import os
import signal
import socket
import ssl
import struct
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from testlib import (LineSocket, ServerProcess, arg_parser, check, check_eq, doc_block, free_port,  # noqa: E402
                     parse_args, run, run_binary, sanitizer_report, uses_default_tube, wait_until)
from tlsfiles import TestCA  # noqa: E402

TIMEOUT = 10.0
GATEWAY_TOKEN = "gateway-token-0123456789abcdef"
ACCESS_FILE = """# issue 23: scopes of the beanstalk and Gearman ports
%s read:*
identity cn:alice produce:emails
identity dns:worker.example consume,read:emails
identity cn:admin
""" % GATEWAY_TOKEN

BINARY = None
FILES = {}       # name -> (cert, key); "ca" -> the CA's certificate
WORKDIR = None


# ---- the server ----------------------------------------------------------

class Server:
    """beangate with plain and TLS beanstalk and Gearman ports."""

    def __init__(self, access=ACCESS_FILE, extra=()):
        self.access_path = os.path.join(WORKDIR, "access-%d" % free_port())
        with open(self.access_path, "w") as f:
            f.write(access)
        os.chmod(self.access_path, 0o600)
        self.extra = list(extra)
        self.proc = ServerProcess()

    def start(self):
        def launch():
            self.port, self.tls_port = free_port(), free_port()
            self.gm_port, self.gm_tls_port, self.http_port = free_port(), free_port(), free_port()
            self.proc.spawn([BINARY, "-l", "127.0.0.1", "-p", str(self.port), "--tls-port", str(self.tls_port),
                             "--gearman-port", str(self.gm_port), "--gearman-tls-port", str(self.gm_tls_port),
                             "--http-port", str(self.http_port), "--http-token-file", self.access_path,
                             "--tls-cert", FILES["server"][0], "--tls-key", FILES["server"][1],
                             "--tls-ca", FILES["ca"]] + self.extra)

        def ready():
            return uses_default_tube(Line(self.port))
        status = self.proc.start_retrying(launch, ready, TIMEOUT, 3)
        check(status == "ok", "the server did not start (%s): %s" % (status, self.proc.stderr()[-2000:]))
        return self

    def stop(self):
        self.proc.kill()
        os.unlink(self.access_path)
        report = sanitizer_report(self.proc.stderr())
        check(report is None, "sanitizer report: %s" % report)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def tls_socket(port, cert):
    """A TLS connection to 127.0.0.1:port presenting cert (a name of FILES,
    or None for none)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(FILES["ca"])
    if cert:
        ctx.load_cert_chain(*FILES[cert])
    raw = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    return ctx.wrap_socket(raw, server_hostname="localhost")


class Line(LineSocket):
    """A beanstalk connection, plain (cert False) or over TLS."""

    def __init__(self, port, cert=False):  # noqa: the socket is made here, not by LineSocket
        self.s = tls_socket(port, cert) if cert is not False else \
            socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        self.buf = b""
        self.what = "beanstalk"
        self.exc = AssertionError

    def send(self, data):
        self.s.sendall(data)

    def read_line(self):
        return self.line() + b"\r\n"

    def ask(self, data):
        """Send one command; its reply line (and body, for FOUND/RESERVED/OK)."""
        self.send(data)
        line = self.line()
        word = line.split(b" ")[0]
        if word in (b"FOUND", b"RESERVED"):
            return line + b"\r\n" + self.body(int(line.split(b" ")[2]))
        if word == b"OK":
            return line + b"\r\n" + self.body(int(line.split(b" ")[1]))
        return line


class Gearman:
    """A Gearman connection, plain (cert False) or over TLS."""

    def __init__(self, port, cert=False):
        self.s = tls_socket(port, cert) if cert is not False else \
            socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        self.buf = b""

    def _need(self, n):
        while len(self.buf) < n:
            data = self.s.recv(65536)
            check(data, "gearman: connection closed")
            self.buf += data

    def request(self, ptype, *args):
        body = b"\0".join(args)
        self.s.sendall(b"\0REQ" + struct.pack(">II", ptype, len(body)) + body)

    def packet(self):
        """(type, [arguments]) of the next response packet."""
        self._need(12)
        magic, ptype, size = self.buf[:4], *struct.unpack(">II", self.buf[4:12])
        check_eq(magic, b"\0RES", "a response packet's magic")
        self._need(12 + size)
        body, self.buf = self.buf[12:12 + size], self.buf[12 + size:]
        return ptype, body.split(b"\0") if body else []

    def admin(self, line):
        """An admin text line; the reply up to its end (".\\n" or one line)."""
        self.s.sendall(line + b"\n")
        while True:
            if self.buf.startswith((b"OK", b"ERR")) and b"\n" in self.buf:
                reply, self.buf = self.buf.split(b"\n", 1)
                return reply + b"\n"
            if self.buf == b".\n" or b"\n.\n" in self.buf:
                reply, self.buf = self.buf, b""
                return reply
            data = self.s.recv(65536)
            check(data, "gearman admin: connection closed")
            self.buf += data

    def close(self):
        self.s.close()


CAN_DO, GRAB_JOB, NO_JOB, JOB_CREATED, JOB_ASSIGN, ERROR, SUBMIT_JOB_BG = 1, 9, 10, 8, 11, 19, 18


def denied(gm, required):
    check_eq(gm.packet(), (ERROR, [b"PERMISSION_DENIED", required]), "the refusal")


# ---- tests ---------------------------------------------------------------

def test_beanstalk_certificates_get_their_scopes():
    with Server() as srv:
        alice = Line(srv.tls_port, "alice")
        check_eq(alice.ask(b"use emails\r\n"), b"USING emails", "alice: use emails")
        check_eq(alice.ask(b"put 0 0 60 5\r\nhello\r\n"), b"INSERTED 1", "alice: put to emails")
        check_eq(alice.ask(b"use sms\r\n"), b"PERMISSION_DENIED produce:sms", "alice: use sms")
        check_eq(alice.ask(b"watch emails\r\n"), b"PERMISSION_DENIED consume:emails", "alice: watch")
        check_eq(alice.ask(b"reserve-with-timeout 0\r\n"), b"PERMISSION_DENIED consume:default", "alice: reserve")
        check_eq(alice.ask(b"peek 1\r\n"), b"PERMISSION_DENIED read:emails", "alice: peek")
        check_eq(alice.ask(b"stats\r\n"), b"PERMISSION_DENIED read:*", "alice: stats")
        check_eq(alice.ask(b"list-tubes\r\n"), b"OK 13\r\n---\n- emails\n", "alice: list-tubes")

        worker = Line(srv.tls_port, "worker")
        check_eq(worker.ask(b"put 0 0 60 2\r\nno\r\n"), b"PERMISSION_DENIED produce:default", "worker: put")
        check_eq(worker.ask(b"watch emails\r\n"), b"WATCHING 2", "worker: watch emails")
        check_eq(worker.ask(b"reserve-with-timeout 0\r\n"), b"PERMISSION_DENIED consume:default",
                 "worker: reserve while watching default")
        check_eq(worker.ask(b"ignore default\r\n"), b"WATCHING 1", "worker: ignore default")
        check_eq(worker.ask(b"reserve-with-timeout 0\r\n"), b"RESERVED 1 5\r\nhello", "worker: reserve")
        check_eq(worker.ask(b"release 1 0 0\r\n"), b"RELEASED", "worker: release")
        check_eq(worker.ask(b"kick-job 1\r\n"), b"PERMISSION_DENIED manage:emails", "worker: kick-job")
        check_eq(worker.ask(b"delete 1\r\n"), b"PERMISSION_DENIED manage:emails", "worker: delete unreserved")
        check(worker.ask(b"stats\r\n").startswith(b"OK "), "worker: stats (read on emails)")
        check(worker.ask(b"stats-job 1\r\n").startswith(b"OK "), "worker: stats-job")
        check_eq(worker.ask(b"reserve-with-timeout 0\r\n"), b"RESERVED 1 5\r\nhello", "worker: reserve again")
        check_eq(worker.ask(b"delete 1\r\n"), b"DELETED", "worker: delete its reservation")

        plain = Line(srv.port)
        check_eq(plain.ask(b"use sms\r\n"), b"USING sms", "plain TCP: use sms")
        check_eq(plain.ask(b"put 0 0 60 2\r\nhi\r\n"), b"INSERTED 2", "plain TCP: put")
        check_eq(worker.ask(b"peek 2\r\n"), b"NOT_FOUND", "worker: a job of a tube it cannot see")

        admin = Line(srv.tls_port, "admin")
        check_eq(admin.ask(b"use sms\r\n"), b"USING sms", "admin: use sms")
        check_eq(admin.ask(b"kick 10\r\n"), b"KICKED 0", "admin: kick")
        check(admin.ask(b"list-tubes\r\n").count(b"\n- ") == 3, "admin: every tube listed")
        check_eq(admin.ask(b"delete 2\r\n"), b"DELETED", "admin: delete")
        for c in (alice, worker, plain, admin):
            c.close()


def test_beanstalk_strangers_get_nothing():
    with Server() as srv:
        setup = Line(srv.port)
        check_eq(setup.ask(b"use emails\r\n"), b"USING emails", "plain TCP: use")
        check_eq(setup.ask(b"put 0 0 60 2\r\nhi\r\n"), b"INSERTED 1", "plain TCP: put")
        setup.close()
        for who in ("stranger", None):
            c = Line(srv.tls_port, who)
            check_eq(c.ask(b"list-tubes\r\n"), b"OK 4\r\n---\n", "%s: list-tubes" % who)
            check_eq(c.ask(b"put 0 0 60 2\r\nhi\r\n"), b"PERMISSION_DENIED produce:default", "%s: put" % who)
            check_eq(c.ask(b"peek 1\r\n"), b"NOT_FOUND", "%s: peek" % who)
            check_eq(c.ask(b"delete 1\r\n"), b"NOT_FOUND", "%s: delete" % who)
            check_eq(c.ask(b"stats\r\n"), b"PERMISSION_DENIED read:*", "%s: stats" % who)
            check_eq(c.ask(b"use emails\r\n"), b"PERMISSION_DENIED produce:emails", "%s: use" % who)
            c.close()
        plain = Line(srv.port)
        check(plain.ask(b"peek 1\r\n").startswith(b"FOUND 1"), "the job is still there")
        plain.close()


def test_gearman_certificates_get_their_scopes():
    with Server() as srv:
        alice = Gearman(srv.gm_tls_port, "alice")
        alice.request(SUBMIT_JOB_BG, b"emails", b"", b"hello")
        check_eq(alice.packet()[0], JOB_CREATED, "alice: submit to emails")
        alice.request(SUBMIT_JOB_BG, b"sms", b"", b"hello")
        denied(alice, b"produce:sms")
        alice.request(CAN_DO, b"emails")
        denied(alice, b"consume:emails")
        check_eq(alice.admin(b"status"), b"ERR PERMISSION_DENIED read:*\r\n", "alice: status")

        plain = Gearman(srv.gm_port)
        plain.request(SUBMIT_JOB_BG, b"sms", b"", b"text")
        check_eq(plain.packet()[0], JOB_CREATED, "plain TCP: submit to sms")

        worker = Gearman(srv.gm_tls_port, "worker")
        worker.request(CAN_DO, b"sms")
        denied(worker, b"consume:sms")
        worker.request(SUBMIT_JOB_BG, b"emails", b"", b"x")
        denied(worker, b"produce:emails")
        check_eq(worker.admin(b"status"), b"emails\t1\t0\t0\n.\n", "worker: status shows only emails")
        worker.request(CAN_DO, b"emails")
        worker.request(GRAB_JOB)
        ptype, args = worker.packet()
        check_eq((ptype, args[1:]), (JOB_ASSIGN, [b"emails", b"hello"]), "worker: grab")
        check_eq(worker.admin(b"maxqueue emails 1"), b"ERR PERMISSION_DENIED manage:emails\r\n", "worker: maxqueue")

        for who in ("stranger", None):
            g = Gearman(srv.gm_tls_port, who)
            g.request(SUBMIT_JOB_BG, b"emails", b"", b"x")
            denied(g, b"produce:emails")
            check_eq(g.admin(b"version"), b"ERR PERMISSION_DENIED read:*\r\n", "%s: version" % who)
            g.close()

        admin = Gearman(srv.gm_tls_port, "admin")
        check_eq(admin.admin(b"status"), b"sms\t1\t0\t0\nemails\t1\t1\t1\n.\n", "admin: the whole status")
        for c in (alice, plain, worker, admin):
            c.close()


def test_without_identity_lines_certificates_are_unscoped():
    with Server(access=GATEWAY_TOKEN + " produce:emails\n") as srv:
        c = Line(srv.tls_port, "stranger")
        check_eq(c.ask(b"use sms\r\n"), b"USING sms", "a certificate, no identity lines: use")
        check_eq(c.ask(b"put 0 0 60 2\r\nhi\r\n"), b"INSERTED 1", "a certificate, no identity lines: put")
        c.close()


def test_access_file_refused_at_start():
    path = os.path.join(WORKDIR, "bad-access")
    secret = "half-of-a-secret-token"
    cases = [
        ("%s other-half\n" % secret, [], "line 1: grant 1 is not KINDS:TUBES"),
        ("ok-token-0123456789\nidentity cn:a write:emails\n", [],
         "line 2: grant 1: unknown kind (produce, consume, manage, read or *)"),
        ("identity cn:a produce:emails\n", [], "no token in the file"),
        ("identity alice\n", ["--no-http"], "line 1: identity name must be"),
    ]
    for text, extra, want in cases:
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o600)
        rc, _, err = run_binary(BINARY, ["-p", str(free_port()), "--http-port", str(free_port()),
                                         "--http-token-file", path] + extra, TIMEOUT)
        check_eq(rc, 5, "exit status for %r" % text)
        check(want in err, "%r: stderr does not say %r: %s" % (text, want, err[-600:]))
        check(secret not in err and "other-half" not in err, "a token reached the log: %s" % err[-600:])
    # certificates only, no gateway: starts
    srv = Server(access="identity cn:alice produce:emails\n", extra=["--no-http"])
    srv.start()
    check("identities_without_ca" not in srv.proc.stderr(), "a warning with --tls-ca given")
    srv.stop()
    # identity lines without --tls-ca: a warning (no TLS client will have a certificate)
    with open(path, "w") as f:
        f.write("identity cn:alice produce:emails\n")
    proc = ServerProcess()
    proc.spawn([BINARY, "-p", str(free_port()), "--no-http", "--http-token-file", path])
    try:
        wait_until(lambda: "event=identities_without_ca" in proc.stderr() or proc.proc.poll() is not None,
                   "the warning", TIMEOUT)
        check("event=identities_without_ca" in proc.stderr(), "no warning: %s" % proc.stderr()[-600:])
    finally:
        proc.kill()
    os.unlink(path)


def test_documented_access_file():
    """docs/security.md's example access file, as it is: a certificate of
    its first identity line gets that line's grant."""
    doc = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "security.md")
    with Server(access=doc_block(doc, "access-file-example") + "\n") as srv:
        c = Line(srv.tls_port, "mailer")
        check_eq(c.ask(b"use emails\r\n"), b"USING emails", "cn:mailer: use emails")
        check_eq(c.ask(b"put 0 0 60 2\r\nhi\r\n"), b"INSERTED 1", "cn:mailer: put")
        check_eq(c.ask(b"use sms\r\n"), b"PERMISSION_DENIED produce:sms", "cn:mailer: use sms")
        c.close()
        c = Line(srv.tls_port, "stranger")   # identity *: read:public
        check_eq(c.ask(b"list-tubes\r\n"), b"OK 4\r\n---\n", "identity *: list-tubes")
        check_eq(c.ask(b"stats-tube public\r\n"), b"NOT_FOUND", "identity *: stats-tube public")
        c.close()


def http_status(port, token):
    """The status of GET /tubes on the plain gateway with a bearer token."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    try:
        conn.request("GET", "/tubes", headers={"Authorization": "Bearer " + token})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def replace_file(path, text):
    """Write text to path as an operator would: a new file renamed over it."""
    with open(path + ".new", "w") as f:
        f.write(text)
    os.chmod(path + ".new", 0o600)
    os.rename(path + ".new", path)


def use_reply(port, cert, tube):
    """The reply to `use tube` on a new TLS beanstalk connection as cert."""
    c = Line(port, cert)
    try:
        return c.ask(b"use %s\r\n" % tube)
    finally:
        c.close()


def permission_denied(srv):
    """permission_denied of GET /stats (the gateway token may read)."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=TIMEOUT)
    try:
        conn.request("GET", "/stats", headers={"Authorization": "Bearer " + GATEWAY_TOKEN})
        resp = conn.getresponse()
        check_eq(resp.status, 200, "GET /stats")
        return json.loads(resp.read())["permission_denied"]
    finally:
        conn.close()


def test_refusals_counted():
    """Each beanstalk and Gearman refusal, and each job hidden as
    NOT_FOUND, counts once in permission_denied; plain TCP counts none."""
    with Server() as srv:
        plain = Line(srv.port)
        check_eq(plain.ask(b"use sms\r\n"), b"USING sms", "plain TCP: use sms")
        check_eq(plain.ask(b"put 0 0 60 2\r\nhi\r\n"), b"INSERTED 1", "plain TCP: put")
        check_eq(plain.ask(b"peek 99\r\n"), b"NOT_FOUND", "plain TCP: a missing job")
        plain.close()
        check_eq(permission_denied(srv), 0, "nothing refused yet")
        alice = Line(srv.tls_port, "alice")
        check_eq(alice.ask(b"use emails\r\n"), b"USING emails", "alice: use emails (allowed)")
        check_eq(alice.ask(b"use sms\r\n"), b"PERMISSION_DENIED produce:sms", "alice: use sms")
        check_eq(alice.ask(b"stats\r\n"), b"PERMISSION_DENIED read:*", "alice: stats")
        alice.close()
        check_eq(permission_denied(srv), 2, "two beanstalk refusals")
        worker = Line(srv.tls_port, "worker")
        check_eq(worker.ask(b"peek 1\r\n"), b"NOT_FOUND", "worker: a job of a tube it cannot see")
        worker.close()
        check_eq(permission_denied(srv), 3, "and a hidden job")
        gm = Gearman(srv.gm_tls_port, "alice")
        gm.request(SUBMIT_JOB_BG, b"sms", b"", b"x")
        denied(gm, b"produce:sms")
        gm.close()
        check_eq(permission_denied(srv), 4, "and a Gearman refusal")


def test_access_reloaded_on_sighup():
    """SIGHUP reads the access file again (docs/security.md, "Reloading the
    access file"): a new token works and a removed one gets 401 on the
    gateway, new TLS connections get the new identity lines on beanstalk and
    Gearman, a connection open before keeps its scope; a broken or missing
    file keeps the grants in force and logs one line; the same text changes
    nothing."""
    new_token = "reloaded-token-fedcba9876543210"
    with Server(extra=["-V"]) as srv:   # -V: the info lines too
        hup = lambda: srv.proc.proc.send_signal(signal.SIGHUP)  # noqa: E731
        check_eq(http_status(srv.http_port, GATEWAY_TOKEN), 200, "the first token, before")
        check_eq(http_status(srv.http_port, new_token), 401, "the new token, before")
        kept = Line(srv.tls_port, "alice")
        check_eq(kept.ask(b"use emails\r\n"), b"USING emails", "alice before the reload")
        check_eq(use_reply(srv.tls_port, "stranger", b"emails"), b"PERMISSION_DENIED produce:emails",
                 "a stranger before the reload")

        replace_file(srv.access_path, "%s read:*\nidentity cn:alice produce:sms\n"
                     "identity cn:stranger produce:emails\n" % new_token)
        hup()
        wait_until(lambda: http_status(srv.http_port, new_token) == 200, "the new token accepted", TIMEOUT)
        check_eq(http_status(srv.http_port, GATEWAY_TOKEN), 401, "the removed token")
        check_eq(use_reply(srv.tls_port, "alice", b"emails"), b"PERMISSION_DENIED produce:emails",
                 "alice's new line: emails")
        check_eq(use_reply(srv.tls_port, "alice", b"sms"), b"USING sms", "alice's new line: sms")
        check_eq(use_reply(srv.tls_port, "stranger", b"emails"), b"USING emails", "the stranger's new line")
        check_eq(use_reply(srv.tls_port, "admin", b"sms"), b"PERMISSION_DENIED produce:sms",
                 "admin, whose line was removed: nothing")
        gm = Gearman(srv.gm_tls_port, "stranger")
        gm.request(SUBMIT_JOB_BG, b"emails", b"", b"hi")
        check_eq(gm.packet()[0], JOB_CREATED, "Gearman: the stranger's new line")
        gm.request(SUBMIT_JOB_BG, b"sms", b"", b"hi")
        denied(gm, b"produce:sms")
        gm.close()
        check_eq(kept.ask(b"use reports\r\n"), b"PERMISSION_DENIED produce:reports",
                 "the connection open before: its scope")
        check_eq(kept.ask(b"use emails\r\n"), b"USING emails", "the connection open before: still emails")
        kept.close()
        check_eq(srv.proc.stderr().count("event=access_reloaded"), 1, "one access_reloaded line")

        secret = "half-of-a-new-secret"
        for text, why in (("%s other-half\n" % secret, "line 1: grant 1 is not KINDS:TUBES"),
                          ("identity cn:alice produce:sms\n", "no token in the file"),
                          (None, "No such file or directory")):
            before = srv.proc.stderr().count("event=access_reload_failed")
            if text is None:
                os.rename(srv.access_path, srv.access_path + ".moved")
            else:
                replace_file(srv.access_path, text)
            hup()
            wait_until(lambda: srv.proc.stderr().count("event=access_reload_failed") > before,
                       "the refusal logged (%s)" % why, TIMEOUT)
            lines = [x for x in srv.proc.stderr().splitlines() if "event=access_reload_failed" in x]
            check_eq(len(lines), before + 1, "one line for one refusal")
            check(why in lines[-1] and "kept=previous" in lines[-1] and "level=error" in lines[-1],
                  "the line says why: %s" % lines[-1])
            check(secret not in lines[-1] and "other-half" not in lines[-1], "a token reached the log")
            check_eq(http_status(srv.http_port, new_token), 200, "the grants in force kept (%s)" % why)
            check_eq(http_status(srv.http_port, GATEWAY_TOKEN), 401, "the removed token stays out (%s)" % why)
            check_eq(use_reply(srv.tls_port, "stranger", b"emails"), b"USING emails",
                     "the identity lines kept (%s)" % why)
            if text is None:
                os.rename(srv.access_path + ".moved", srv.access_path)

        replace_file(srv.access_path, "%s read:*\nidentity cn:alice produce:sms\n"
                     "identity cn:stranger produce:emails\n" % new_token)
        hup()
        wait_until(lambda: "event=access_unchanged" in srv.proc.stderr(), "the same text noticed", TIMEOUT)
        check_eq(srv.proc.stderr().count("event=access_reloaded"), 1, "nothing reloaded for the same text")


TESTS = [test_beanstalk_certificates_get_their_scopes, test_beanstalk_strangers_get_nothing,
         test_gearman_certificates_get_their_scopes, test_without_identity_lines_certificates_are_unscoped,
         test_access_file_refused_at_start, test_documented_access_file, test_refusals_counted,
         test_access_reloaded_on_sighup]


def main(argv):
    global BINARY, WORKDIR
    args = parse_args(arg_parser(__doc__), argv)
    BINARY = args.binary
    with tempfile.TemporaryDirectory(prefix="beangate-scopes-") as d:
        WORKDIR = d
        ca = TestCA(os.path.join(d, "ca"))
        FILES["ca"] = ca.cert
        FILES["server"] = ca.issue("server", dns=["localhost"], ips=["127.0.0.1"])
        FILES["alice"] = ca.issue("alice", cn="alice", client=True)
        FILES["worker"] = ca.issue("worker", cn="worker-7", dns=["worker.example"], client=True)
        FILES["admin"] = ca.issue("admin", cn="admin", client=True)
        FILES["stranger"] = ca.issue("stranger", cn="stranger", client=True)
        FILES["mailer"] = ca.issue("mailer", cn="mailer", client=True)
        return run("tls_scopes", TESTS, args, namespace=globals())


if __name__ == "__main__":
    sys.exit(main(sys.argv))
