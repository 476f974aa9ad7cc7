#!/usr/bin/env python3
"""The HTTP gateway over HTTPS (issue 23), with real clients.

Usage: python3 tests/http/test_https.py build/beangate [-k NAME]

Each test starts its own server on free loopback ports with --http-tls-cert
and --http-tls-key from a throwaway CA (tests/lib/tlsfiles.py), and talks to
it with curl --cacert, openssl s_client and Python's ssl module, checking the
bytes that come back:
  - put, a long-poll reserve answered by a put, delete and stats over curl;
  - openssl s_client (the certificate verifies; a request is answered;
    TLS 1.1 is refused), and a renegotiation refused (gnutls-cli);
  - keep-alive over TLS, HTTP/1.0, a chunked body;
  - mutual TLS: with --http-tls-verify-client, no certificate and one of
    another CA are refused in the handshake, a good one is served; without
    it, no certificate is served and a bad one still refused;
  - a handshake that stalls, a handshake with no request after it, and a
    later head that stalls are closed at the header deadline (shortened to
    1 s with --http-header-timeout), not before;
  - plain HTTP sent to the HTTPS port: 400 PLAIN_HTTP_TO_HTTPS_PORT, closed;
  - SIGHUP: new connections get the new certificate while an open
    keep-alive connection goes on; a bad file keeps the old certificate;
    four clients putting without pause through three reloads and a bad one
    lose no request and no connection;
  - the Host check (421) and the cross-site Origin check (403) over HTTPS,
    an https:// origin of the server itself being same-origin;
  - `beangate --healthcheck` against an HTTPS gateway.
Python 3 standard library, python3-cryptography (tlsfiles), curl, openssl.
"""

import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import testlib  # noqa: E402
from testlib import check, check_eq, free_port, signal_and_wait, wait_until  # noqa: E402

try:
    import tlsfiles  # noqa: E402
    from cryptography import x509  # noqa: E402
except ImportError:  # python3-cryptography missing: the suite skips
    tlsfiles = None

START_TIMEOUT = 10.0
STOP_TIMEOUT = 10.0
IO_TIMEOUT = 10.0


class T:
    binary = None
    dir = None          # the CA's directory (one per run)
    ca = None           # tlsfiles.TestCA
    server = None       # (cert, key) for localhost and 127.0.0.1
    alice = None        # a client certificate of the CA
    mallory = None      # a client certificate of another CA
    servers = []


class Server(testlib.ServerProcess):
    """One beangate with HTTPS on free loopback ports."""

    def __init__(self, extra=(), cert=None):
        super().__init__()
        self.cert, self.key = cert or T.server
        self.extra = list(extra)
        self.port = None

    def argv(self):
        return [T.binary, "-l", "127.0.0.1", "-p", str(self.tcp_port), "--http-listen", "127.0.0.1",
                "--http-port", str(self.port), "--http-tls-cert", self.cert, "--http-tls-key", self.key] + self.extra

    def start(self):
        def launch():
            self.tcp_port, self.port = free_port(), free_port()
            self.spawn(self.argv())  # its stderr file is in append mode (testlib)
        status = self.start_retrying(launch, lambda: testlib.port_open(self.port), START_TIMEOUT, attempts=5)
        check(status == "ok", "server did not start (%s): %s" % (status, self.stderr()[-600:]))
        T.servers.append(self)
        return self

    def stop(self):
        status = signal_and_wait(self.proc, signal.SIGTERM, STOP_TIMEOUT) if self.proc else 0
        self.proc = None
        return status


def context(cert=None):
    """A client context trusting the test CA (with a client certificate)."""
    ctx = ssl.create_default_context(cafile=T.ca.cert)
    if cert:
        ctx.load_cert_chain(*cert)
    return ctx


def tls_socket(port, cert=None):
    s = socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT)
    return context(cert).wrap_socket(s, server_hostname="localhost")


def https(port, cert=None):
    return http.client.HTTPSConnection("localhost", port, timeout=IO_TIMEOUT, context=context(cert))


def call(conn, method, path, body=None, headers=None):
    conn.request(method, path, body=body, headers=headers or {})
    r = conn.getresponse()
    return r.status, dict((k.lower(), v) for k, v in r.getheaders()), r.read()


def curl(port, *args, timeout=IO_TIMEOUT):
    """curl --cacert against the server: (status, body bytes)."""
    out = subprocess.run(["curl", "-sS", "--cacert", T.ca.cert, "--max-time", str(timeout),
                          "-w", "\n%{http_code}"] + list(args), capture_output=True, timeout=timeout + 5)
    check(out.returncode == 0, "curl %s: exit %d: %s" % (args, out.returncode, out.stderr.decode()[-300:]))
    body, _, code = out.stdout.rpartition(b"\n")
    return int(code), body


def read_response(sock):
    """One response from a socket (Content-Length framed): (status, headers, body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        check(chunk, "connection closed before a response head: %r" % data)
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict((k.strip().lower(), v.strip()) for k, v in (line.split(":", 1) for line in lines[1:]))
    n = int(headers.get("content-length", "0"))
    while len(rest) < n:
        chunk = sock.recv(65536)
        check(chunk, "connection closed in a response body")
        rest += chunk
    return int(lines[0].split()[1]), headers, rest[:n]


def closed_after(sock, limit):
    """Seconds until the server closes sock (reading and dropping what it
    sends), at most limit; None if it is still open then."""
    t0 = time.monotonic()
    sock.settimeout(0.2)
    while time.monotonic() - t0 < limit:
        try:
            if not sock.recv(4096):
                return time.monotonic() - t0
        except socket.timeout:
            continue
        except (ssl.SSLError, OSError):
            return time.monotonic() - t0
    return None


def close_times(socks, limit):
    """For each socket of socks (name -> (socket, opened at)), the seconds
    from its opening until the server closed it (what it sent is dropped);
    None for one still open after limit seconds."""
    import select
    left = {sock: name for name, (sock, _) in socks.items()}
    closed = {name: None for name in socks}
    end = time.monotonic() + limit
    for sock in left:
        sock.setblocking(False)
    while left and time.monotonic() < end:
        ready, _, _ = select.select(list(left), [], [], 0.2)
        for sock in ready:
            try:
                gone = not sock.recv(4096)
            except (ssl.SSLWantReadError, BlockingIOError):
                continue
            except (ssl.SSLError, OSError):
                gone = True
            if gone:
                name = left.pop(sock)
                closed[name] = time.monotonic() - socks[name][1]
    return closed


def handshake_refused(port, cert=None):
    """Whether a TLS handshake (and a first request) with cert is refused."""
    try:
        s = tls_socket(port, cert)
        s.sendall(b"GET /livez HTTP/1.1\r\nHost: localhost\r\n\r\n")
        # TLS 1.3: the server's refusal of the client's certificate comes after
        # the client's side of the handshake is done, with the first read
        return not s.recv(64).startswith(b"HTTP/1.1 200")
    except (ssl.SSLError, OSError):
        return True


def peer_serial(port):
    s = tls_socket(port)
    der = s.getpeercert(binary_form=True)
    s.close()
    return x509.load_der_x509_certificate(der).serial_number


def file_serial(path):
    with open(path, "rb") as f:
        return x509.load_pem_x509_certificate(f.read()).serial_number


# ---- tests ------------------------------------------------------------------

def test_curl_put_reserve_delete_stats():
    s = Server().start()
    base = "https://localhost:%d" % s.port
    code, body = curl(s.port, "-X", "POST", "--data-binary", "hello over tls", base + "/tubes/tls/jobs")
    check_eq(code, 201, "put status")
    put_id = json.loads(body)["id"]
    # a long-poll reserve, answered by a put made while it waits
    box = {}
    waiter = threading.Thread(target=lambda: box.update(r=curl(
        s.port, "-X", "POST", base + "/tubes/later/reservations?timeout=8", timeout=20)))
    waiter.start()
    wait_until(lambda: json.loads(curl(s.port, base + "/tubes/later")[1]).get("current_waiting") == 1,
               "the long-poll is waiting", timeout=IO_TIMEOUT)
    code, body = curl(s.port, "-X", "POST", "--data-binary", "later job",
                      base + "/tubes/later/jobs")
    check_eq(code, 201, "put while a reserve waits")
    waiter.join(20)
    code, body = box["r"]
    check_eq(code, 200, "long-poll reserve status")
    job = json.loads(body)
    check_eq((job["tube"], job["body"]), ("later", "later job"), "the long-poll's job")
    code, body = curl(s.port, "-X", "POST", base + "/tubes/tls/reservations?timeout=0")
    check_eq(code, 200, "reserve status")
    job = json.loads(body)
    check_eq(job["id"], put_id, "reserved job id")
    check_eq(job["body"], "hello over tls", "reserved job body")
    code, _ = curl(s.port, "-X", "DELETE", "-H", "X-Reservation: %s" % job["reservation"],
                   base + "/jobs/%d" % put_id)
    check_eq(code, 204, "delete status")
    code, body = curl(s.port, base + "/stats")
    stats = json.loads(body)
    check_eq((code, stats["cmd_put"], stats["cmd_delete"]), (200, 2, 1), "stats after put, put, delete")


def test_openssl_s_client():
    s = Server().start()
    request = b"GET /livez HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    out = subprocess.run(["openssl", "s_client", "-connect", "127.0.0.1:%d" % s.port, "-servername", "localhost",
                          "-CAfile", T.ca.cert, "-verify_return_error", "-ign_eof"],
                         input=request, capture_output=True, timeout=IO_TIMEOUT + 5)
    text = out.stdout.decode("latin-1")
    check("Verify return code: 0 (ok)" in text, "s_client did not verify: %s" % text[-800:])
    check("HTTP/1.1 200 OK" in text, "no 200 through s_client: %s" % text[-800:])
    check(any(v in text for v in ("TLSv1.3", "TLSv1.2")), "no TLS 1.2/1.3 named: %s" % text[:800])
    # TLS 1.1 is refused
    out = subprocess.run(["openssl", "s_client", "-connect", "127.0.0.1:%d" % s.port, "-tls1_1"],
                         input=b"", capture_output=True, timeout=IO_TIMEOUT + 5)
    check(b"HTTP/1.1" not in out.stdout and out.returncode != 0, "TLS 1.1 was accepted")


def test_no_renegotiation():
    """A TLS 1.2 client that asks for a renegotiation is closed (gnutls-cli
    --rehandshake); the same client without it is served."""
    if not shutil.which("gnutls-cli"):
        raise testlib.Skip("gnutls-cli is not installed (gnutls-bin)")
    s = Server().start()
    request = b"GET /livez HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    argv = ["gnutls-cli", "--priority", "NORMAL:-VERS-ALL:+VERS-TLS1.2", "--x509cafile", T.ca.cert,
            "-p", str(s.port), "localhost"]
    out = subprocess.run(argv, input=request, capture_output=True, timeout=IO_TIMEOUT + 5)
    check(b"HTTP/1.1 200 OK" in out.stdout, "gnutls-cli over TLS 1.2 was not served: %r" % out.stdout[-400:])
    out = subprocess.run(argv[:1] + ["--rehandshake"] + argv[1:], input=request, capture_output=True,
                         timeout=IO_TIMEOUT + 5)
    text = out.stdout + out.stderr
    check(out.returncode != 0 and b"ReHandshake has failed" in text and b"HTTP/1.1" not in out.stdout,
          "a renegotiation was not refused: %r" % text[-600:])


def test_keep_alive_over_tls():
    s = Server().start()
    c = https(s.port)
    call(c, "GET", "/livez")
    first = c.sock
    for i in range(20):
        status, _, body = call(c, "POST", "/tubes/ka/jobs", body=b"job %d" % i)
        check_eq(status, 201, "put %d on one connection" % i)
        check(c.sock is first, "the connection was not kept alive (request %d)" % i)
    status, _, body = call(c, "GET", "/tubes/ka")
    check_eq((status, json.loads(body)["current_jobs_ready"]), (200, 20), "jobs put on one TLS connection")


def test_http10_and_chunked_over_tls():
    s = Server().start()
    t = tls_socket(s.port)
    t.sendall(b"POST /tubes/old/jobs HTTP/1.0\r\nContent-Length: 5\r\n\r\nhello")
    status, _, body = read_response(t)
    check_eq(status, 201, "HTTP/1.0 put")
    check(closed_after(t, IO_TIMEOUT) is not None, "an HTTP/1.0 connection was not closed")
    t = tls_socket(s.port)
    t.sendall(b"POST /tubes/chunky/jobs HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n"
              b"5\r\nchunk\r\n6\r\ned bod\r\n1\r\ny\r\n0\r\n\r\n")
    status, _, body = read_response(t)
    check_eq(status, 201, "chunked put")
    t.sendall(b"POST /tubes/chunky/reservations HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n")
    status, _, body = read_response(t)
    check_eq((status, json.loads(body)["body"]), (200, "chunked body"), "reserve after a chunked put, same connection")
    t = tls_socket(s.port)
    t.sendall(b"POST /tubes/old/reservations HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n")
    status, _, body = read_response(t)
    check_eq((status, json.loads(body)["body"]), (200, "hello"), "the HTTP/1.0 job")


def test_mtls_required():
    s = Server(["--http-tls-ca", T.ca.cert, "--http-tls-verify-client"]).start()
    check(handshake_refused(s.port), "a client without a certificate was served")
    check(handshake_refused(s.port, T.mallory), "a certificate of another CA was accepted")
    t = tls_socket(s.port, T.alice)
    t.sendall(b"GET /livez HTTP/1.1\r\nHost: localhost\r\n\r\n")
    check_eq(read_response(t)[0], 200, "a good client certificate")
    code, _ = curl(s.port, "--cert", T.alice[0], "--key", T.alice[1], "https://localhost:%d/stats" % s.port)
    check_eq(code, 200, "curl with a good client certificate")
    check("event=http_server_error" not in s.stderr(), "a refused handshake was logged as the server's "
          "error: %s" % s.stderr()[-600:])


def test_mtls_optional():
    s = Server(["--http-tls-ca", T.ca.cert]).start()
    check(not handshake_refused(s.port), "a client without a certificate was refused")
    check(not handshake_refused(s.port, T.alice), "a good client certificate was refused")
    check(handshake_refused(s.port, T.mallory), "a certificate of another CA was accepted")


def test_stalled_handshake_closed_at_header_deadline():
    s = Server(["--http-header-timeout", "1"]).start()
    # nothing sent; a ClientHello cut short; a handshake and no request.
    # Each deadline runs from the accept, which is after the connect: none
    # may close before 1 s from its opening (the loop's timers are not early)
    socks = {}
    t = time.monotonic()
    socks["silent"] = (socket.create_connection(("127.0.0.1", s.port), timeout=IO_TIMEOUT), t)
    t = time.monotonic()
    partial = socket.create_connection(("127.0.0.1", s.port), timeout=IO_TIMEOUT)
    partial.sendall(b"\x16\x03\x01\x01\x00\x01\x00\x00\xfc\x03\x03")
    socks["partial hello"] = (partial, t)
    t = time.monotonic()
    socks["handshake, no request"] = (tls_socket(s.port), t)
    for what, took in close_times(socks, 15).items():
        check(took is not None, "%s: connection still open after 15 s" % what)
        check(took >= 0.95, "%s: closed %.2f s after it opened, before the 1 s deadline" % (what, took))
    # a later head that stalls on a kept-alive connection
    t = tls_socket(s.port)
    t.sendall(b"GET /livez HTTP/1.1\r\nHost: localhost\r\n\r\n")
    check_eq(read_response(t)[0], 200, "first request")
    t0 = time.monotonic()
    t.sendall(b"GET /livez HTTP/1.1\r\nHost: loc")
    took = closed_after(t, 15)
    check(took is not None, "a stalled later head was not closed within 15 s")
    check(time.monotonic() - t0 >= 0.9, "a stalled later head was closed before its deadline")
    # the server still serves
    code, _ = curl(s.port, "https://localhost:%d/livez" % s.port)
    check_eq(code, 200, "livez after the deadlines")


def test_plain_http_to_https_port():
    s = Server().start()
    p = socket.create_connection(("127.0.0.1", s.port), timeout=IO_TIMEOUT)
    p.sendall(b"GET /stats HTTP/1.1\r\nHost: localhost\r\n\r\n")
    status, headers, body = read_response(p)
    check_eq((status, json.loads(body)["code"], headers.get("connection")), (400, "PLAIN_HTTP_TO_HTTPS_PORT", "close"),
             "plain HTTP to the HTTPS port")
    took = closed_after(p, 5)
    check(took is not None, "the plain connection was not closed")
    code, _ = curl(s.port, "https://localhost:%d/livez" % s.port)
    check_eq(code, 200, "HTTPS after a plain request")


def test_refused_at_connection_limit():
    """Every slot busy in a long-poll: a new client gets 503
    TOO_MANY_CONNECTIONS inside TLS (curl reads it, without the client
    certificate the port requires: a refusal asks for none); a client that
    never starts its handshake is closed after the one second a refusal
    lingers."""
    s = Server(["--http-max-connections", "2", "--http-tls-ca", T.ca.cert, "--http-tls-verify-client"]).start()
    polls = []
    for _ in range(2):
        t = tls_socket(s.port, T.alice)
        t.sendall(b"POST /tubes/full/reservations?timeout=3 HTTP/1.1\r\nHost: localhost\r\n\r\n")
        polls.append(t)
    wait_until(lambda: tube_waiting(s, "full") == 2, "the long-polls to wait", 10)
    code, body = curl(s.port, "https://localhost:%d/livez" % s.port)
    check_eq((code, json.loads(body).get("code")), (503, "TOO_MANY_CONNECTIONS"), "curl over the limit")
    silent = {"silent": (socket.create_connection(("127.0.0.1", s.port), timeout=IO_TIMEOUT), time.monotonic())}
    took = close_times(silent, 10)["silent"]
    check(took is not None and 0.9 <= took <= 5, "a refused client that sends nothing: closed after %r s, "
          "want the 1 s linger" % took)
    for t in polls:
        check_eq(read_response(t)[0], 204, "a long-poll's answer after the refusals")
        t.close()


def tls_refusal_budget():
    """GW_TLS_REFUSALS_PER_S, read from gateway/gateway.h (its one home)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "gateway", "gateway.h")
    with open(path) as f:
        for line in f:
            if line.startswith("#define GW_TLS_REFUSALS_PER_S "):
                return int(line.split()[2])
    raise AssertionError("no GW_TLS_REFUSALS_PER_S in gateway/gateway.h")


def client_hello():
    """The bytes of one TLS ClientHello, to replay on many sockets."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context().wrap_bio(incoming, outgoing, server_hostname="localhost")
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


def metrics(sock):
    """GET /metrics on a keep-alive TLS socket: {name: value} of its
    unlabelled samples."""
    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
    status, _, body = read_response(sock)
    check_eq(status, 200, "GET /metrics")
    return dict(line.split()[:2] for line in body.decode().splitlines() if line and "{" not in line
                and not line.startswith("#"))


def test_tls_refusals_within_budget():
    """A burst of refused HTTPS connections, each replaying one ClientHello,
    while every slot is busy: at most the budget (GW_TLS_REFUSALS_PER_S a
    second, as deep) get a handshake, the rest are closed without one; the
    beanstalk port answers at once meanwhile, and the long-poll holding the
    slot gets its job."""
    budget, burst = tls_refusal_budget(), 120
    s = Server(["--http-max-connections", "1"]).start()
    poll = tls_socket(s.port)
    poll.sendall(b"POST /tubes/budget/reservations?timeout=30 HTTP/1.1\r\nHost: localhost\r\n\r\n")
    wait_until(lambda: tube_waiting(s, "budget") == 1, "the long-poll to wait", 10)
    hello = client_hello()
    t0 = time.monotonic()
    socks = []
    for _ in range(burst):
        c = socket.create_connection(("127.0.0.1", s.port), timeout=IO_TIMEOUT)
        try:
            c.sendall(hello)
        except OSError:
            pass  # closed unanswered already
        socks.append(c)
    b = socket.create_connection(("127.0.0.1", s.tcp_port), timeout=IO_TIMEOUT)
    b.sendall(b"use budget\r\nput 0 0 60 2\r\nhi\r\n")
    data = b""
    while data.count(b"\r\n") < 2:
        chunk = b.recv(256)
        check(chunk, "the beanstalk port closed")
        data += chunk
    took = time.monotonic() - t0
    check(data.startswith(b"USING budget\r\nINSERTED "), "a put during the burst: %r" % data)
    check(took < 5, "the burst and a put took %.2f s" % took)
    b.close()
    check_eq(read_response(poll)[0], 200, "the long-poll's answer")
    # the slot is the poll's, so its keep-alive connection asks
    counted = lambda m: (int(m["beangate_http_tls_refusals_total"]),
                         int(m["beangate_http_tls_refusals_unanswered_total"]))
    done = wait_until(lambda: counted(metrics(poll)), "every refusal counted", 10, ok=lambda v: sum(v) >= burst)
    poll.close()
    elapsed = time.monotonic() - t0
    answered, unanswered = done
    bound = budget + budget * elapsed + 1
    check_eq(answered + unanswered, burst, "refusals counted (answered, unanswered: %r)" % (done,))
    check(1 <= answered <= bound, "%d of %d refused connections got a handshake in %.2f s, want 1 to %.0f"
          % (answered, burst, elapsed, bound))
    for c in socks:
        c.close()
    print("  %d refused ClientHellos in %.2f s: %d handshakes (budget %d/s), %d closed unanswered; "
          "a beanstalk put answered %.3f s after the burst began"
          % (burst, elapsed, answered, budget, unanswered, took))


def tube_waiting(s, tube):
    """How many clients wait on tube (stats-tube over the beanstalk port)."""
    c = socket.create_connection(("127.0.0.1", s.tcp_port), timeout=IO_TIMEOUT)
    try:
        c.sendall(b"stats-tube %s\r\n" % tube.encode())
        data = b""
        while b"\r\n" not in data:
            data += c.recv(65536)
        if not data.startswith(b"OK "):
            return 0
        size = int(data.split(b"\r\n", 1)[0][3:])
        while len(data.split(b"\r\n", 1)[1]) < size + 2:
            data += c.recv(65536)
    finally:
        c.close()
    for line in data.decode().split("\n"):
        if line.startswith("current-waiting:"):
            return int(line.split(":")[1])
    return 0


def test_sighup_reload():
    cert_dir = tempfile.mkdtemp(dir=T.dir)
    cert, key = os.path.join(cert_dir, "live.crt"), os.path.join(cert_dir, "live.key")
    shutil.copy(T.server[0], cert)
    shutil.copy(T.server[1], key)
    s = Server(cert=(cert, key)).start()
    old = file_serial(T.server[0])
    check_eq(peer_serial(s.port), old, "serial before the reload")
    kept = https(s.port)
    check_eq(call(kept, "GET", "/livez")[0], 200, "keep-alive connection before the reload")
    new_cert, new_key = T.ca.issue("reloaded", dns=["localhost"], ips=["127.0.0.1"])
    new = file_serial(new_cert)
    for src, dst in ((new_cert, cert), (new_key, key)):
        shutil.copy(src, dst + ".tmp")
        os.rename(dst + ".tmp", dst)
    s.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: peer_serial(s.port) == new, "new connections get the new certificate", timeout=IO_TIMEOUT)
    status, _, _ = call(kept, "POST", "/tubes/reload/jobs", body=b"still here")
    check_eq(status, 201, "the open keep-alive connection after the reload")
    # a bad certificate file: the one in use stays
    with open(cert, "w") as f:
        f.write("-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----\n")
    s.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "tls_reload_failed" in s.stderr(), "the failed reload is logged", timeout=IO_TIMEOUT)
    check_eq(peer_serial(s.port), new, "serial after a bad reload")
    check_eq(call(kept, "GET", "/livez")[0], 200, "the keep-alive connection after a bad reload")
    check(s.proc.poll() is None, "the server stopped on a bad reload")


def requested_ca_names(port):
    """The CA names the server's certificate request lists (openssl
    s_client's "Acceptable client certificate CA names")."""
    out = subprocess.run(["openssl", "s_client", "-connect", "127.0.0.1:%d" % port, "-servername", "localhost",
                          "-CAfile", T.ca.cert], input=b"", capture_output=True, timeout=IO_TIMEOUT + 5)
    text = out.stdout.decode("latin-1")
    _, found, rest = text.partition("Acceptable client certificate CA names")
    check(found, "no certificate request seen by s_client: %s" % text[-800:])
    return [line.strip() for line in rest.split("\n")[1:] if line.startswith(("CN", "/CN", "C =", "O ="))]


def test_sighup_reloads_client_ca():
    """The client CA file is read again at SIGHUP too: after it names another
    CA, that CA's certificates are accepted and the old CA's refused, and
    the certificate request names the new CA (so a client with several
    certificates picks the right one)."""
    ca_dir = tempfile.mkdtemp(dir=T.dir)
    ca_file = os.path.join(ca_dir, "clients.crt")
    shutil.copy(T.ca.cert, ca_file)
    s = Server(["--http-tls-ca", ca_file, "--http-tls-verify-client"]).start()
    check(not handshake_refused(s.port, T.alice), "a certificate of the CA in the file was refused")
    check_eq(requested_ca_names(s.port), ["CN = beangate test CA"], "the CA names requested at start")
    new_ca = tlsfiles.TestCA(ca_dir, "new client CA")
    bob = new_ca.issue("bob", cn="bob", client=True)
    check(handshake_refused(s.port, bob), "a certificate of a CA not yet in the file was accepted")
    shutil.copy(new_ca.cert, ca_file + ".tmp")
    os.rename(ca_file + ".tmp", ca_file)
    s.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: not handshake_refused(s.port, bob), "the new CA's certificate to be accepted",
               timeout=IO_TIMEOUT)
    check(handshake_refused(s.port, T.alice), "a certificate of the CA no longer in the file was accepted")
    check_eq(requested_ca_names(s.port), ["CN = new client CA"], "the CA names requested after the reload")


def test_sighup_reload_under_load():
    """Four keep-alive clients put without pause through three reloads
    (and a bad one): every put is answered 201 on the connection it began
    on, none is dropped, and every job is there."""
    cert_dir = tempfile.mkdtemp(dir=T.dir)
    cert, key = os.path.join(cert_dir, "live.crt"), os.path.join(cert_dir, "live.key")
    shutil.copy(T.server[0], cert)
    shutil.copy(T.server[1], key)
    s = Server(cert=(cert, key)).start()
    stop = threading.Event()
    counts, errors = [0] * 4, []

    def client(i):
        try:
            c = https(s.port)
            call(c, "GET", "/livez")
            first = c.sock
            while not stop.is_set():
                status, _, _ = call(c, "POST", "/tubes/load/jobs", body=b"job")
                if status != 201 or c.sock is not first:
                    errors.append("client %d: status %d, same connection: %s" % (i, status, c.sock is first))
                    return
                counts[i] += 1
        except Exception as e:  # any failure is the finding
            errors.append("client %d: %s: %s" % (i, type(e).__name__, e))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    serials = []
    for n in range(3):
        new_cert, new_key = T.ca.issue("load%d" % n, dns=["localhost"], ips=["127.0.0.1"])
        for src, dst in ((new_key, key), (new_cert, cert)):
            shutil.copy(src, dst + ".tmp")
            os.rename(dst + ".tmp", dst)
        before = sum(counts)
        s.proc.send_signal(signal.SIGHUP)
        serial = file_serial(new_cert)
        wait_until(lambda: peer_serial(s.port) == serial, "reload %d reaches new connections" % n, timeout=IO_TIMEOUT)
        wait_until(lambda: sum(counts) > before + 20 or errors, "puts go on after reload %d" % n, timeout=IO_TIMEOUT)
        serials.append(serial)
    with open(cert, "w") as f:
        f.write("not a certificate\n")
    s.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "tls_reload_failed" in s.stderr(), "the bad reload is logged", timeout=IO_TIMEOUT)
    before = sum(counts)
    wait_until(lambda: sum(counts) > before + 20 or errors, "puts go on after the bad reload", timeout=IO_TIMEOUT)
    stop.set()
    for t in threads:
        t.join(IO_TIMEOUT)
    check(not errors, "a client failed across the reloads: %s" % errors)
    check_eq(peer_serial(s.port), serials[-1], "serial after the bad reload")
    code, body = curl(s.port, "https://localhost:%d/tubes/load" % s.port)
    check_eq(json.loads(body)["current_jobs_ready"], sum(counts), "jobs put across the reloads")


def test_host_and_origin_guard_over_https():
    s = Server().start()
    c = https(s.port)
    own = "localhost:%d" % s.port
    status, _, body = call(c, "POST", "/tubes/g/jobs", b"x", {"Host": "evil.example"})
    check_eq((status, json.loads(body)["code"]), (421, "HOST_NOT_ALLOWED"), "a foreign Host over HTTPS")
    c = https(s.port)
    status, _, _ = call(c, "POST", "/tubes/g/jobs", b"x", {"Host": own, "Origin": "https://" + own})
    check_eq(status, 201, "the server's own https:// origin")
    status, _, body = call(c, "POST", "/tubes/g/jobs", b"x", {"Host": own, "Origin": "https://evil.example"})
    check_eq((status, json.loads(body)["code"]), (403, "ORIGIN_NOT_ALLOWED"), "a foreign origin over HTTPS")
    c = https(s.port)
    status, _, body = call(c, "POST", "/tubes/g/jobs", b"x", {"Host": own, "Sec-Fetch-Site": "cross-site",
                                                              "Origin": "https://" + own})
    check_eq(status, 403, "Sec-Fetch-Site: cross-site over HTTPS")


def test_healthcheck_over_https():
    """`beangate --healthcheck` (Docker's HEALTHCHECK) finds an HTTPS
    gateway ready (asked in plain text, it is told to use TLS, and asks
    again over TLS); one that requires client certificates cannot be asked."""
    s = Server().start()
    out = subprocess.run([T.binary, "--healthcheck=127.0.0.1:%d" % s.port], capture_output=True, timeout=15)
    check_eq((out.returncode, out.stdout), (0, b"healthy\n"), "--healthcheck of an HTTPS gateway")
    m = Server(["--http-tls-ca", T.ca.cert, "--http-tls-verify-client"]).start()
    out = subprocess.run([T.binary, "--healthcheck=127.0.0.1:%d" % m.port], capture_output=True, timeout=15)
    check_eq((out.returncode, out.stdout), (1, b"unhealthy\n"), "--healthcheck when client certificates are required")


def test_shared_pair_and_flag_errors():
    s = Server(["--tls-cert", T.server[0], "--tls-key", T.server[1], "--http-tls"])
    s.argv = lambda: [T.binary, "-l", "127.0.0.1", "-p", str(s.tcp_port), "--http-listen", "127.0.0.1",
                      "--http-port", str(s.port)] + s.extra
    s.start()
    code, body = curl(s.port, "https://localhost:%d/livez" % s.port)
    check_eq(code, 200, "--http-tls with --tls-cert and --tls-key")
    for flags in (["--http-tls"], ["--http-tls-cert", T.server[0]], ["--http-tls-key", T.server[1]],
                  ["--http-tls-cert", T.server[0], "--http-tls-key", T.server[1], "--http-tls-verify-client"],
                  ["--http-tls-ca", T.ca.cert],
                  ["--http-tls-cert", T.dir + "/missing.crt", "--http-tls-key", T.server[1]]):
        out = subprocess.run([T.binary, "-p", "0", "--http-port", "0"] + flags, capture_output=True, timeout=10)
        check_eq(out.returncode, 5, "exit status (usage) with %s" % " ".join(flags))
        check(b"event=bad_flag" in out.stderr, "no bad_flag line for %s: %s" % (flags, out.stderr[-300:]))


TESTS = [
    test_curl_put_reserve_delete_stats,
    test_openssl_s_client,
    test_no_renegotiation,
    test_keep_alive_over_tls,
    test_http10_and_chunked_over_tls,
    test_mtls_required,
    test_mtls_optional,
    test_stalled_handshake_closed_at_header_deadline,
    test_plain_http_to_https_port,
    test_refused_at_connection_limit,
    test_tls_refusals_within_budget,
    test_sighup_reload,
    test_sighup_reloads_client_ca,
    test_sighup_reload_under_load,
    test_host_and_origin_guard_over_https,
    test_healthcheck_over_https,
    test_shared_pair_and_flag_errors,
]


def setup(_names):
    if tlsfiles is None:
        raise testlib.Skip("python3-cryptography is not installed")
    for tool in ("curl", "openssl"):
        if not shutil.which(tool):
            raise testlib.Skip("%s is not installed" % tool)
    T.dir = tempfile.mkdtemp(prefix="beangate-https-")
    T.ca = tlsfiles.TestCA(T.dir)
    T.server = T.ca.issue("server", dns=["localhost"], ips=["127.0.0.1"])
    T.alice = T.ca.issue("alice", cn="alice", client=True)
    T.mallory = tlsfiles.TestCA(T.dir, "other CA").issue("mallory", cn="mallory", client=True)


def after(error):
    """Stop the test's servers: each must exit 0 and report nothing to a sanitizer."""
    problems = []
    for s in T.servers:
        status = s.stop()
        err = s.stderr()
        if status != 0:
            problems.append("server exited with %r: %s" % (status, err[-600:]))
        report = testlib.sanitizer_report(err)
        if report:
            problems.append(report)
    T.servers = []
    return problems


def main(argv):
    args = testlib.parse_args(testlib.arg_parser(__doc__), argv)
    T.binary = args.binary
    try:
        return testlib.run("https", TESTS, args, namespace=globals(), setup=setup, after=after, all_skipped=77)
    finally:
        if T.dir:
            shutil.rmtree(T.dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
