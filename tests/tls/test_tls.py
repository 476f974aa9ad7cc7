#!/usr/bin/env python3
"""TLS on the beanstalk and Gearman ports (issue 23): real TLS clients
(openssl s_client, gnutls-cli, Python's ssl, the fivebeans library through
Node's tls module) against --tls-port and --gearman-tls-port, with a test CA
made by each run (tests/lib/tlsfiles.py).

    python3 tests/tls/test_tls.py build/beangate [-k NAME]...

Each test starts its own server on free loopback ports. Nothing sleeps to
wait for something: every wait polls with a deadline.
"""

import json
import os
import select
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
import testlib  # noqa: E402
from testlib import SANITIZER_MARKERS, check, check_eq, free_port, signal_and_wait, wait_until  # noqa: E402
from tlsfiles import TestCA  # noqa: E402

from cryptography import x509  # noqa: E402

BINARY = None
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
START_TIMEOUT = 15.0
WORK = None          # the run's temporary directory
CA = None            # the test CA; SERVER_CERT, SERVER_KEY: a server pair it issued
SERVER_CERT = SERVER_KEY = None


class Server:
    """One beangate with beanstalk (plain -p and --tls-port) and Gearman
    (plain and --gearman-tls-port) on free loopback ports, TLS with the given
    cert and key (default: the run's server pair)."""

    def __init__(self, args=(), cert=None, key=None):
        self.args = list(args)
        self.cert, self.key = cert or SERVER_CERT, key or SERVER_KEY
        self.sp = testlib.ServerProcess()

    def __enter__(self):
        def launch():
            self.port, self.tls_port, self.gm_port, self.gm_tls_port = (free_port() for _ in range(4))
            argv = [BINARY, "-l", "127.0.0.1", "-p", str(self.port), "--tls-port", str(self.tls_port),
                    "--gearman-listen", "127.0.0.1", "--gearman-port", str(self.gm_port),
                    "--gearman-tls-port", str(self.gm_tls_port), "--no-http",
                    "--tls-cert", self.cert, "--tls-key", self.key] + self.args
            self.sp.spawn(argv, env=testlib.clean_env())
        status = self.sp.start_retrying(launch, self._answers, START_TIMEOUT, 5)
        if status != "ok":
            err = self.sp.stderr()
            self.sp.kill()
            raise AssertionError("the server did not start (%s): %s" % (status, err[-1500:]))
        self.proc = self.sp.proc
        return self

    def _answers(self):
        with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
            s.sendall(b"list-tube-used\r\n")
            return s.recv(64) == b"USING default\r\n"

    def __exit__(self, *exc):
        status = signal_and_wait(self.proc, signal.SIGTERM, 20)
        err = self.stderr()
        if exc[0] is None:
            check(status == 0, "the server's exit status after SIGTERM: %r; stderr: %s" % (status, err[-1500:]))
            check(not [m for m in SANITIZER_MARKERS if m in err], "sanitizer report: %s" % err[-3000:])
        return False

    def stderr(self):
        return self.sp.stderr()

    def lines(self, word):
        return [line for line in self.stderr().splitlines() if word in line]

    def tls(self, port=None, cert=None, key=None, context=None, timeout=10.0):
        """A TLS connection (handshake done) to the beanstalk TLS port or `port`."""
        ctx = context or client_context(cert, key)
        raw = socket.create_connection(("127.0.0.1", port or self.tls_port), timeout=timeout)
        try:
            return ctx.wrap_socket(raw, server_hostname="localhost")
        except BaseException:
            raw.close()
            raise


def client_context(cert=None, key=None):
    """A client context trusting the test CA (TLS 1.2 at least), with a client certificate if given."""
    ctx = ssl.create_default_context(cafile=CA.cert)
    if cert:
        ctx.load_cert_chain(cert, key)
    return ctx


def read_until(s, want, timeout=10.0):
    """Read from s until want has come (the bytes read), failing on a close or the deadline."""
    s.settimeout(timeout)
    data = b""
    while want not in data:
        chunk = s.recv(65536)
        check(chunk, "the server closed the connection; got %r, waiting for %r" % (data, want))
        data += chunk
    return data


def command(s, line, want_prefix):
    s.sendall(line)
    data = read_until(s, b"\r\n")
    check(data.startswith(want_prefix), "%r: got %r, want %r..." % (line, data, want_prefix))
    return data


def closed_within(s, seconds):
    """Wait up to `seconds` for the peer to close s: the time it took, or None."""
    t0 = time.monotonic()
    s.settimeout(0.05)
    while time.monotonic() - t0 < seconds:
        try:
            data = s.recv(65536)
        except socket.timeout:
            continue
        except (ConnectionResetError, BrokenPipeError, ssl.SSLError):
            return time.monotonic() - t0
        if not data:
            return time.monotonic() - t0
    return None


def gm_packet(kind, *args):
    data = b"\0".join(a if isinstance(a, bytes) else str(a).encode() for a in args)
    return b"\0REQ" + struct.pack(">II", kind, len(data)) + data


def gm_read_packet(s):
    head = read_exact(s, 12)
    check_eq(head[:4], b"\0RES", "a Gearman response's magic")
    kind, size = struct.unpack(">II", head[4:])
    return kind, read_exact(s, size).split(b"\0")


def read_exact(s, n):
    data = bytearray()
    while len(data) < n:
        chunk = s.recv(min(n - len(data), 1 << 20))
        check(chunk, "closed after %s of %d bytes" % (testlib.show(data, 200), n))
        data += chunk
    return bytes(data)


GM_CAN_DO, GM_GRAB_JOB, GM_JOB_CREATED, GM_JOB_ASSIGN, GM_SUBMIT_JOB_BG, GM_NO_JOB = 1, 9, 8, 11, 18, 10


def run_tool(argv, stdin, want, timeout=20.0):
    """Run a TLS command-line client, write stdin, read its stdout until
    `want` has come (bytes, or a function of the output) (then close it):
    the stdout bytes. Fails if it ends or the deadline passes first."""
    done = want if callable(want) else (lambda out: want in out)
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = b""
    try:
        p.stdin.write(stdin)
        p.stdin.flush()
        deadline = time.monotonic() + timeout
        while not done(out):
            left = deadline - time.monotonic()
            check(left > 0, "%s: no %r within %.0f s; stdout %r" % (argv[0], want, timeout, out[-400:]))
            r, _, _ = select.select([p.stdout], [], [], left)
            if r:
                chunk = os.read(p.stdout.fileno(), 65536)
                if not chunk:
                    err = p.stderr.read().decode("utf-8", "replace")
                    raise AssertionError("%s ended before %r; stdout %r; stderr %s" % (argv[0], want, out, err[-800:]))
                out += chunk
    finally:
        p.kill()
        p.wait()
        p.stdin.close()
        p.stdout.close()
        p.stderr.close()
    return out


def s_client(port, extra=()):
    return ["openssl", "s_client", "-quiet", "-connect", "127.0.0.1:%d" % port, "-servername", "localhost",
            "-verify_return_error", "-CAfile", CA.cert] + list(extra)


def gnutls_cli(port, extra=()):
    return ["gnutls-cli", "--x509cafile", CA.cert, "-p", str(port)] + list(extra) + ["localhost"]


def cert_serial(path):
    with open(path, "rb") as f:
        return x509.load_pem_x509_certificate(f.read()).serial_number


def peer_serial(s):
    return x509.load_der_x509_certificate(s.getpeercert(binary_form=True)).serial_number


# ---- real clients ----------------------------------------------------------------

BEANSTALK_CYCLE = (b"use tls\r\nput 0 0 60 5\r\nhello\r\nwatch tls\r\nignore default\r\n"
                   b"reserve-with-timeout 0\r\ndelete 1\r\n")
BEANSTALK_REPLIES = b"USING tls\r\nINSERTED 1\r\nWATCHING 2\r\nWATCHING 1\r\nRESERVED 1 5\r\nhello\r\nDELETED\r\n"


def test_openssl_s_client_beanstalk():
    """openssl s_client on --tls-port: use, put, reserve, delete; the exact reply bytes."""
    with Server() as srv:
        out = run_tool(s_client(srv.tls_port), BEANSTALK_CYCLE, b"DELETED\r\n")
        check_eq(out, BEANSTALK_REPLIES, "the replies over TLS (openssl s_client)")
        plain = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        check_eq(command(plain, b"stats-job 1\r\n", b"NOT_FOUND"), b"NOT_FOUND\r\n", "the job is gone")
        plain.close()


def test_gnutls_cli_beanstalk():
    """gnutls-cli on --tls-port: the same cycle, the exact reply bytes."""
    with Server() as srv:
        out = run_tool(gnutls_cli(srv.tls_port), BEANSTALK_CYCLE, b"DELETED\r\n")
        check(out.endswith(BEANSTALK_REPLIES), "the replies over TLS (gnutls-cli): %r" % out[-300:])


def test_gearman_submit_job_over_tls():
    """openssl s_client and gnutls-cli submit background jobs on
    --gearman-tls-port (JOB_CREATED, the exact header); a worker over
    Python's ssl grabs each with its exact data."""
    with Server() as srv:
        for tool, fn, data in ((s_client, b"fn-openssl", b"from-openssl"), (gnutls_cli, b"fn-gnutls", b"from-gnutls")):
            def job_created(out):  # the whole JOB_CREATED packet is in
                at = out.find(b"\0RES\0\0\0\x08")
                return at >= 0 and len(out) >= at + 12 and len(out) >= at + 12 + struct.unpack(">I", out[at + 8:at + 12])[0]
            out = run_tool(tool(srv.gm_tls_port), gm_packet(GM_SUBMIT_JOB_BG, fn, b"", data), job_created)
            head = out[out.index(b"\0RES\0\0\0\x08"):]
            size = struct.unpack(">I", head[8:12])[0]
            check(size > 0 and head[12:12 + size].startswith(b"H:"), "JOB_CREATED over TLS: %r" % head)
            worker = srv.tls(srv.gm_tls_port)
            worker.sendall(gm_packet(GM_CAN_DO, fn) + gm_packet(GM_GRAB_JOB))
            kind, args = gm_read_packet(worker)
            check_eq((kind, args[1], args[2]), (GM_JOB_ASSIGN, fn, data), "the job a TLS worker grabbed")
            worker.close()


def find_fivebeans():
    """fivebeans' node_modules as the client suite installs it (installing
    it with tests/client/run_client_suite.sh --install-only if needed)."""
    work = os.environ.get("CLIENT_SUITE_DIR", os.path.join(REPO, "build", "client-suite"))
    modules = os.path.join(work, "fivebeans", "node_modules")
    if not os.path.isdir(os.path.join(modules, "fivebeans")):
        if not shutil.which("node") or not shutil.which("npm"):
            raise testlib.Skip("node and npm are not installed")
        r = subprocess.run([os.path.join(REPO, "tests", "client", "run_client_suite.sh"), "--install-only",
                            BINARY, "fivebeans"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
        if r.returncode != 0 or not os.path.isdir(os.path.join(modules, "fivebeans")):
            raise testlib.Skip("fivebeans could not be installed from npm: %s" % r.stdout.decode()[-300:])
    return modules


def test_fivebeans_over_tls():
    """The fivebeans library (tests/client's npm pin), its socket made by
    Node's tls module (tests/tls/fivebeans_tls.js): use, put, reserve,
    delete, and the server's own view of the job."""
    modules = find_fivebeans()
    with Server() as srv:
        env = dict(testlib.clean_env(), NODE_PATH=modules)
        r = subprocess.run(["node", os.path.join(HERE, "fivebeans_tls.js"), str(srv.tls_port), CA.cert],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, timeout=60)
        check_eq(r.returncode, 0, "fivebeans over TLS (stderr %s)" % r.stderr.decode()[-800:])
        got = json.loads(r.stdout.decode().strip().splitlines()[-1])
        check_eq(got["payload"], "hello over tls", "the payload fivebeans reserved")
        check_eq(got["reserved"], got["put"], "the id it reserved")
        check(got["tls"], "fivebeans' socket was not a TLS socket: %r" % got)
        check_eq(got["deleted"], True, "fivebeans deleted the job")


def test_held_and_large_replies_over_tls():
    """Over TLS: with -b DIR -f 0 a put's reply waits for the disk and comes;
    200 pipelined peeks of a 60000-byte job, read only after a pause (the
    server's sends hit EAGAIN and are finished later), arrive whole and in
    order; the stop sequence answers a blocked reserve over TLS."""
    logdir = tempfile.mkdtemp(dir=WORK)
    body = bytes((i * 7) % 251 for i in range(60000))
    with Server(["-b", logdir, "-f", "0", "-z", "60000"]) as srv:
        s = srv.tls()
        command(s, b"put 0 0 60 60000\r\n" + body + b"\r\n", b"INSERTED 1\r\n")
        s.sendall(b"peek 1\r\n" * 200)
        one = b"FOUND 1 60000\r\n" + body + b"\r\n"
        s.settimeout(10)
        # the server's sends fill the socket buffers and hit EAGAIN while this
        # client has not read yet; a put on another connection shows it still serves
        other = srv.tls()
        command(other, b"put 0 0 60 1\r\nx\r\n", b"INSERTED 2\r\n")
        other.close()
        got = read_exact(s, len(one) * 200)
        check(got == one * 200, "200 peeks over TLS: %d bytes, first difference at %s"
              % (len(got), testlib.first_difference(got, one * 200)))
        blocked = srv.tls()
        blocked.sendall(b"watch none\r\nignore default\r\nreserve\r\n")
        read_until(blocked, b"WATCHING 1\r\n")
        srv.proc.send_signal(signal.SIGTERM)
        got = read_until(blocked, b"\r\n", timeout=20)
        check(got.startswith(b"TIMED_OUT\r\n"), "the blocked reserve at the stop: %s" % testlib.show(got, 200))
        s.close()
        blocked.close()
        check_eq(srv.proc.wait(30), 0, "the exit status after SIGTERM")  # before __exit__ signals again


def test_first_request_not_delayed():
    """A client with Nagle on (Python's default) that sends its first request
    right after the handshake gets the reply at once: the server ACKs the
    client's last flight when the handshake ends (before: the request waited
    for the kernel's delayed ACK, 40 ms every time)."""
    with Server() as srv:
        took = []
        for _ in range(20):
            s = srv.tls()
            t0 = time.monotonic()
            command(s, b"list-tube-used\r\n", b"USING default")
            took.append(time.monotonic() - t0)
            s.close()
        took.sort()
        print("  first request after the handshake: median %.1f ms, max %.1f ms"
              % (took[10] * 1000, took[-1] * 1000))
        check(took[10] < 0.025, "the first request's median latency is %.1f ms (delayed ACK?)" % (took[10] * 1000))


# ---- what is refused ------------------------------------------------------------

def test_old_versions_refused():
    """TLS 1.0 and 1.1 are refused by the server (openssl and gnutls-cli
    offering only them get no session; the server logs each refusal); TLS
    1.2 and 1.3 are served."""
    with Server() as srv:
        for flag in ("-tls1", "-tls1_1"):
            p = subprocess.run(s_client(srv.tls_port, [flag, "-cipher", "DEFAULT@SECLEVEL=0"]),
                               input=b"", stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=20)
            check(p.returncode != 0, "openssl %s got a session: %s" % (flag, p.stdout.decode()[-400:]))
        p = subprocess.run(gnutls_cli(srv.tls_port, ["--priority", "NORMAL:-VERS-ALL:+VERS-TLS1.1:+VERS-TLS1.0"]),
                           input=b"", stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=20)
        check(p.returncode != 0, "gnutls-cli with TLS 1.0/1.1 got a session: %s" % p.stdout.decode()[-400:])
        wait_until(lambda: len(srv.lines("reason=handshake_failed")) >= 1,
                   "the server to log the refused handshakes", timeout=10)
        for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
            ctx = client_context()
            ctx.minimum_version = ctx.maximum_version = version
            s = srv.tls(context=ctx)
            check_eq(s.version(), {ssl.TLSVersion.TLSv1_2: "TLSv1.2", ssl.TLSVersion.TLSv1_3: "TLSv1.3"}[version],
                     "the version served")
            command(s, b"list-tube-used\r\n", b"USING default")
            s.close()


def test_renegotiation_closes():
    """A TLS 1.2 client that asks to renegotiate (openssl s_client's R
    command) is closed, and the server says why at -VV; a request after it
    gets no reply."""
    with Server(["-VV"]) as srv:
        p = subprocess.Popen(["openssl", "s_client", "-connect", "127.0.0.1:%d" % srv.tls_port, "-tls1_2",
                              "-CAfile", CA.cert, "-servername", "localhost"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            p.stdin.write(b"put 0 0 10 1\r\nx\r\n")
            p.stdin.flush()
            out = b""
            deadline = time.monotonic() + 20
            while b"INSERTED 1\r\n" not in out:
                check(time.monotonic() < deadline, "no INSERTED over TLS 1.2: %r" % out[-300:])
                r, _, _ = select.select([p.stdout], [], [], 1)
                if r:
                    chunk = os.read(p.stdout.fileno(), 65536)
                    check(chunk, "s_client ended: %r" % out[-300:])
                    out += chunk
            p.stdin.write(b"R\n")
            p.stdin.flush()
            wait_until(lambda: srv.lines("Rehandshake"), "the server to refuse the renegotiation", timeout=10)
            try:
                p.stdin.write(b"list-tube-used\r\n")
                p.stdin.flush()
            except BrokenPipeError:
                pass
            rest, _ = p.communicate(timeout=20)  # s_client ends once the server closed
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        check(b"USING" not in rest, "a reply came after the renegotiation: %r" % rest[-300:])
        line = srv.lines("Rehandshake")[0]
        check("event=tls_error" in line, "the log line: %s" % line)


def test_plain_text_closed_at_once():
    """A beanstalk command in plain text to the TLS ports: closed at once
    (well within the 60 s request deadline), with a tls_refused line."""
    with Server() as srv:
        for port, line in ((srv.tls_port, b"put 0 0 10 5\r\nhello\r\n"), (srv.gm_tls_port, gm_packet(GM_GRAB_JOB))):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(line)
            took = closed_within(s, 5.0)
            check(took is not None, "plain text to TLS port %d was not closed within 5 s" % port)
            s.close()
        wait_until(lambda: len(srv.lines("reason=not_tls")) >= 1, "a tls_refused reason=not_tls line", timeout=10)
        check(any("event=tls_refused" in line for line in srv.lines("reason=not_tls")),
              "the log: %s" % srv.lines("not_tls"))
        check(any("event=gearman_tls_refused" in line for line in srv.stderr().splitlines())
              or len(srv.lines("reason=not_tls")) == 1,  # the warn line is limited to one per 10 s per port
              "the Gearman refusal's line")


def test_handshake_deadline():
    """--request-timeout 1: a client that connects and says nothing, and one
    that sends half a ClientHello, are closed about 1 s later; a client that
    completes its handshake meanwhile is served. With --request-timeout 0
    the handshake still has CONN_TLS_HANDSHAKE_TIMEOUT (10 s)."""
    with Server(["--request-timeout", "1"]) as srv:
        silent = socket.create_connection(("127.0.0.1", srv.tls_port), timeout=5)
        half = socket.create_connection(("127.0.0.1", srv.tls_port), timeout=5)
        half.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
        t0 = time.monotonic()
        good = srv.tls()
        command(good, b"list-tube-used\r\n", b"USING default")
        took = []
        for s in (silent, half):
            check(closed_within(s, 4.0) is not None, "a handshake that never completes was kept 4 s")
            took.append(time.monotonic() - t0)
        check(all(0.8 <= t <= 3.5 for t in took), "stalled handshakes closed after %r s, want about 1" % took)
        command(good, b"list-tube-used\r\n", b"USING default")
        check(srv.lines("reason=request_timeout"), "no request_timeout line: %s" % srv.stderr()[-800:])
        print("  --request-timeout 1: stalled handshakes closed after %s s" % ", ".join("%.2f" % t for t in took))
        for s in (silent, half, good):
            s.close()
    with Server(["--request-timeout", "0"]) as srv:
        silent = socket.create_connection(("127.0.0.1", srv.tls_port), timeout=5)
        took = closed_within(silent, 20.0)
        check(took is not None and 9.0 <= took <= 15.0,
              "without a request deadline a silent TLS client was closed after %r s, want about 10" % took)
        print("  --request-timeout 0: a silent TLS client closed after %.2f s" % took)
        silent.close()


def test_mutual_tls():
    """--tls-ca with --tls-verify-client: no client certificate and one from
    another CA are refused; one from the CA is served, and its names (cn:,
    dns:, email:, uri:) are the session's identity (the -VV line). Without
    --tls-verify-client a client without a certificate is served."""
    alice = CA.issue("alice", cn="alice", dns=["alice.example"], emails=["alice@example.com"],
                     uris=["spiffe://test/alice"], client=True)
    other = TestCA(os.path.join(WORK, "other"), "other CA")
    mallory = other.issue("mallory", cn="mallory", client=True)
    with Server(["--tls-ca", CA.cert, "--tls-verify-client", "-VV"]) as srv:
        for who, cert in (("no certificate", None), ("another CA's certificate", mallory)):
            try:
                s = srv.tls(cert=cert[0] if cert else None, key=cert[1] if cert else None)
                # TLS 1.3: the client's handshake ends before the server checks its certificate
                s.sendall(b"list-tube-used\r\n")
                got = s.recv(64)
                s.close()
                check(not got.startswith(b"USING"), "%s was served: %r" % (who, got))
            except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
                pass
        s = srv.tls(cert=alice[0], key=alice[1])
        command(s, b"put 0 0 60 2\r\nok\r\n", b"INSERTED")
        s.close()
        wait_until(lambda: srv.lines("event=tls_established"), "a tls_established line", timeout=10)
        line = srv.lines("event=tls_established")[-1]
        check('names=4 identity="cn:alice dns:alice.example email:alice@example.com uri:spiffe://test/alice"'
              in line, "the identity logged: %s" % line)
        check_eq(len(srv.lines("reason=handshake_failed")) >= 1, True, "refusals logged")
    with Server(["--tls-ca", CA.cert]) as srv:
        s = srv.tls()
        command(s, b"list-tube-used\r\n", b"USING default")
        s.close()
        s = srv.tls(cert=alice[0], key=alice[1])
        command(s, b"list-tube-used\r\n", b"USING default")
        s.close()
        try:
            s = srv.tls(cert=mallory[0], key=mallory[1])
            s.sendall(b"list-tube-used\r\n")
            got = s.recv(64)
            check(not got.startswith(b"USING"), "another CA's certificate was served without --tls-verify-client")
        except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
            pass


def test_bad_settings_refuse_the_start():
    """A missing or unreadable file, a key of another certificate, a TLS port
    without the pair, --tls-verify-client without --tls-ca, a bad or too
    permissive --tls-priority: the start is refused (exit 5) with a line
    naming why."""
    other_cert, other_key = CA.issue("other-server", dns=["localhost"])
    garbage = os.path.join(WORK, "garbage.pem")
    with open(garbage, "w") as f:
        f.write("not a certificate\n")
    port = str(free_port())
    tls_port = ["--tls-port", str(free_port())]
    base = ["-l", "127.0.0.1", "-p", port, "--no-http"]
    cases = [
        (tls_port + ["--tls-cert", os.path.join(WORK, "missing.crt"), "--tls-key", SERVER_KEY], "No such file"),
        (tls_port + ["--tls-cert", garbage, "--tls-key", SERVER_KEY], "garbage.pem"),
        (tls_port + ["--tls-cert", SERVER_CERT, "--tls-key", other_key], "certificate and key"),
        (tls_port, "needs --tls-cert and --tls-key"),
        (["--gearman-tls-port", str(free_port())], "needs --tls-cert and --tls-key"),
        (["--tls-cert", SERVER_CERT], "go together"),
        (["--tls-cert", SERVER_CERT, "--tls-key", SERVER_KEY, "--tls-verify-client"], "needs --tls-ca"),
        (["--tls-cert", SERVER_CERT, "--tls-key", SERVER_KEY, "--tls-priority", "NORMAL:+BOGUS"], "priority"),
        (["--tls-cert", SERVER_CERT, "--tls-key", SERVER_KEY, "--tls-priority", "NORMAL:+VERS-TLS1.0"],
         "nothing older"),
    ]
    for extra, why in cases:
        status, _out, err = testlib.run_binary(BINARY, base + extra, timeout=20, env=testlib.clean_env())
        check_eq(status, 5, "exit status with %r (stderr %s)" % (extra, err[-300:]))
        check(why in err, "%r: the error does not say %r: %s" % (extra, why, err[-400:]))


# ---- reload ---------------------------------------------------------------------

def test_sighup_reload_under_load():
    """Four TLS connections keep putting while the certificate is replaced
    and SIGHUP sent three times: no connection drops, no reply is lost
    (every put answered, total-jobs equals the puts), and each new handshake
    sees the new certificate's serial. Then a bad file: tls_reload_failed
    names it and why, and new handshakes keep the last good certificate."""
    live_cert, live_key = os.path.join(WORK, "live.crt"), os.path.join(WORK, "live.key")

    def install(name):
        cert, key = CA.issue(name, dns=["localhost"], ips=["127.0.0.1"])
        shutil.copy(key, live_key + ".tmp")
        shutil.copy(cert, live_cert + ".tmp")
        os.replace(live_key + ".tmp", live_key)
        os.replace(live_cert + ".tmp", live_cert)
        return cert_serial(live_cert)

    serial = install("gen0")
    with Server(["-V"], cert=live_cert, key=live_key) as srv:
        first = srv.tls()
        check_eq(peer_serial(first), serial, "the first certificate's serial")
        first.close()
        stop = threading.Event()
        results = []

        def putter(k):
            count, error = 0, None
            try:
                s = srv.tls()
                while not stop.is_set():
                    command(s, b"put 0 0 60 3\r\nabc\r\n", b"INSERTED ")
                    count += 1
                s.close()
            except Exception as e:  # noqa: BLE001 - reported below
                error = "%s: %s" % (type(e).__name__, e)
            results.append((k, count, error))
        threads = [threading.Thread(target=putter, args=(k,), daemon=True) for k in range(4)]
        for t in threads:
            t.start()
        plain = socket.create_connection(("127.0.0.1", srv.port), timeout=5)

        def total_jobs():
            stats = command(plain, b"stats\r\n", b"OK")
            stats += read_until(plain, b"\n\r\n") if not stats.endswith(b"\n\r\n") else b""
            return int(stats.split(b"total-jobs: ")[1].split(b"\n")[0])
        serials = []
        for n in range(1, 4):
            before = total_jobs()
            wait_until(lambda: total_jobs() > before + 200, "puts to go on before reload %d" % n, timeout=20)
            serial = install("gen%d" % n)
            srv.proc.send_signal(signal.SIGHUP)
            try:
                wait_until(lambda: len(srv.lines("event=tls_reloaded")) >= n, "tls_reloaded line %d" % n, timeout=10)
            except AssertionError as e:
                raise AssertionError("%s; the server's TLS lines: %s" % (e, srv.lines("tls_")[-6:])) from None
            s = srv.tls()
            check_eq(peer_serial(s), serial, "the serial a new handshake sees after reload %d" % n)
            serials.append(serial)
            s.close()
        before = total_jobs()
        wait_until(lambda: total_jobs() > before + 200, "puts to go on after the reloads", timeout=20)
        with open(live_cert, "w") as f:
            f.write("-----BEGIN CERTIFICATE-----\nbroken\n-----END CERTIFICATE-----\n")
        srv.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: srv.lines("event=tls_reload_failed"), "a tls_reload_failed line", timeout=10)
        failed = srv.lines("event=tls_reload_failed")[0]
        check("path=" + live_cert in failed and "error=" in failed, "the failure line: %s" % failed)
        s = srv.tls()
        check_eq(peer_serial(s), serials[-1], "the serial after a bad reload (the last good one)")
        command(s, b"list-tube-used\r\n", b"USING default")
        s.close()
        stop.set()
        for t in threads:
            t.join(30)
        errors = [r for r in results if r[2]]
        check(not errors and len(results) == 4, "putters: %r" % results)
        puts = sum(r[1] for r in results)
        check_eq(total_jobs(), puts, "jobs the server made = puts answered over TLS")
        check(all(r[1] > 0 for r in results), "a putter made no put: %r" % results)
        print("  3 reloads and a bad one under load: %d puts over 4 TLS connections, none lost; "
              "serials %s" % (puts, ", ".join("%x" % s for s in serials)))
        plain.close()


TESTS = [
    test_openssl_s_client_beanstalk,
    test_gnutls_cli_beanstalk,
    test_gearman_submit_job_over_tls,
    test_fivebeans_over_tls,
    test_held_and_large_replies_over_tls,
    test_first_request_not_delayed,
    test_old_versions_refused,
    test_renegotiation_closes,
    test_plain_text_closed_at_once,
    test_handshake_deadline,
    test_mutual_tls,
    test_bad_settings_refuse_the_start,
    test_sighup_reload_under_load,
]


def setup(_names):
    global WORK, CA, SERVER_CERT, SERVER_KEY
    for tool in ("openssl", "gnutls-cli"):
        if not shutil.which(tool):
            raise AssertionError("%s is not installed (scripts/install-deps.sh installs it)" % tool)
    WORK = tempfile.mkdtemp(prefix="beangate-tls-")
    CA = TestCA(WORK)
    SERVER_CERT, SERVER_KEY = CA.issue("server", dns=["localhost"], ips=["127.0.0.1"])


def main(argv):
    global BINARY
    args = testlib.parse_args(testlib.arg_parser(__doc__), argv)
    BINARY = args.binary
    try:
        return testlib.run("tls", TESTS, args, namespace=globals(), setup=setup)
    finally:
        if WORK:
            shutil.rmtree(WORK, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
