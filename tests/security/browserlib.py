"""What the browser tests of docs/security.md share: a beangate process on
free loopback ports, an attacker's web server on another port, and headless
Chromium through WebDriver (Debian's chromium, chromium-driver and
python3-selenium) that resolves attacker.example to 127.0.0.1, so that the
attacker's pages are of another site than the gateway's and a name can be
"rebound" to the gateway's address.

A suite calls run(suite, doc, tests, argv): it exits 77 (ctest: skipped)
with a SKIP line naming what is missing when the browser, its driver or
selenium is not installed.
"""

import http.client
import http.server
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import testlib  # noqa: E402
from testlib import check, free_port  # noqa: E402

ATTACKER = "attacker.example"   # Chromium maps it to 127.0.0.1
WAIT = 10.0                     # every wait gives up after this
START_TIMEOUT = 10.0


def load_selenium():
    """The selenium modules, or (None, why) (testlib.selenium_missing)."""
    why = testlib.selenium_missing()
    if why:
        return None, why
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    return {"webdriver": webdriver, "Service": Service}, None


find_browser = testlib.find_browser


# ---- the server under test ----------------------------------------------------------

class Server(testlib.ServerProcess):
    """beangate on free loopback ports: beanstalk, HTTP and Gearman."""
    binary = None

    def __init__(self, args=()):
        super().__init__()
        self.args = list(args)
        self.port = self.http_port = self.gearman_port = None

    def start(self):
        def launch():
            self.port, self.http_port, self.gearman_port = free_port(), free_port(), free_port()
            self.spawn([self.binary, "-l", "127.0.0.1", "-p", str(self.port), "--http-listen", "127.0.0.1",
                        "--http-port", str(self.http_port), "--gearman-listen", "127.0.0.1",
                        "--gearman-port", str(self.gearman_port)] + self.args, env=testlib.clean_env())
        status = self.start_retrying(launch, lambda: self.get("/livez")[0] == 200, START_TIMEOUT, attempts=5)
        check(status == "ok", "beangate did not start (%s): %s" % (status, self.stderr()[-600:]))
        return self

    def stop(self):
        """Stop it with SIGTERM; a sanitizer report or a bad exit fails."""
        if self.proc is None:
            return
        status = testlib.signal_and_wait(self.proc, 15, 10)
        err = self.stderr()
        self.kill()
        report = testlib.sanitizer_report(err)
        check(not report, "sanitizer report: %s" % report)
        check(status == 0, "exit status %r after SIGTERM; stderr %s" % (status, err[-600:]))

    def request(self, method, path, body=None, headers=None):
        """(status, headers dict with lower-case names, body) from a plain
        client (no Origin, no Sec-Fetch-*)."""
        c = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=WAIT)
        try:
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            c.close()

    def get(self, path):
        return self.request("GET", path)

    def json(self, path):
        status, _, body = self.get(path)
        check(status == 200, "GET %s: %d %r" % (path, status, body[:300]))
        return json.loads(body)

    def tube(self, name):
        """The tube's stats, or None if it does not exist."""
        status, _, body = self.get("/tubes/" + name)
        return json.loads(body) if status == 200 else None

    def put(self, tube, body):
        status, _, data = self.request("POST", "/tubes/%s/jobs" % tube, body=body)
        check(status == 201, "put: %d %r" % (status, data[:300]))
        return json.loads(data)["id"]

    def beanstalk(self, line):
        """One beanstalk command's first reply line (and what came with it)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=WAIT) as s:
            s.sendall(line)
            data = b""
            while b"\r\n" not in data:
                chunk = s.recv(65536)
                check(chunk, "beanstalk closed on %r" % line)
                data += chunk
            return data


# ---- the attacker's web server ----------------------------------------------------------

class Attacker:
    """Serves the pages set with page(path, html) on a free loopback port,
    reached by the browser as http://attacker.example:PORT (another site
    than the gateway's 127.0.0.1)."""

    def __init__(self):
        pages = self.pages = {}

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                html = pages.get(self.path.split("?")[0])
                data = (html or "not found").encode()
                self.send_response(200 if html else 404)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def origin(self):
        return "http://%s:%d" % (ATTACKER, self.port)

    def page(self, path, html):
        self.pages[path] = html
        return self.origin + path

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


# ---- the browser --------------------------------------------------------------------------

class Browser:
    """Headless Chromium that resolves attacker.example to 127.0.0.1."""

    def __init__(self, sel, chromium, driver):
        self.profile = tempfile.mkdtemp(prefix="beangate-security-chromium-")
        opts = sel["webdriver"].ChromeOptions()
        for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     "--disable-dev-shm-usage", "--user-data-dir=" + self.profile,
                     "--host-resolver-rules=MAP %s 127.0.0.1" % ATTACKER):
            opts.add_argument(flag)
        opts.binary_location = chromium
        self.d = sel["webdriver"].Chrome(service=sel["Service"](driver), options=opts)
        self.d.set_script_timeout(WAIT)

    def quit(self):
        try:
            self.d.quit()
        finally:
            shutil.rmtree(self.profile, ignore_errors=True)

    def open(self, url):
        self.d.get(url)

    def run_async(self, script, *args):
        """Run script (its last argument is the callback) in the page."""
        return self.d.execute_async_script(script, *args)

    def fetch(self, url, options):
        """fetch(url, options) from the page: {status, body} of the answer
        (status 0 for an opaque no-cors answer), or {error} if it failed."""
        return self.run_async("""
            const done = arguments[arguments.length - 1];
            fetch(arguments[0], arguments[1]).then(
                r => r.text().then(body => done({status: r.status, type: r.type, body: body})),
                e => done({error: String(e)}));""", url, options)

    def submit_form(self, action, body_text, enctype="text/plain"):
        """Post a form of the page to action: one field whose name is
        body_text and value is empty (a text/plain form sends "NAME=\\r\\n"),
        in a frame of the page, so that the page stays."""
        self.run_async("""
            const [action, text, enctype, done] = arguments;
            const frame = document.createElement('iframe');
            frame.name = 'sink' + Math.random();
            document.body.appendChild(frame);
            const form = document.createElement('form');
            form.method = 'POST';
            form.action = action;
            form.enctype = enctype;
            form.target = frame.name;
            const field = document.createElement('input');
            field.type = 'hidden';
            field.name = text;
            field.value = '';
            form.appendChild(field);
            document.body.appendChild(form);
            frame.addEventListener('load', () => done(true), {once: true});
            form.submit();
            setTimeout(() => done(false), 5000);""", action, body_text, enctype)


def wait_until(fn, what, timeout=WAIT):
    return testlib.wait_until(fn, what, timeout)


def run(suite, doc, tests, argv, namespace):
    """Parse argv (the binary), start the attacker's server and the browser
    (or skip with 77), run tests(server_args...) and report."""
    args = testlib.parse_args(testlib.arg_parser(doc), argv)
    Server.binary = args.binary
    sel, why = load_selenium()
    found, why2 = find_browser() if sel else (None, None)
    if not sel or not found:
        print("SKIP %s: %s" % (suite, why or why2), flush=True)
        print("%s: 0 passed, 0 failed, 1 skipped" % suite, flush=True)
        return 77
    env = {"attacker": None, "browser": None}

    def setup(names):
        env["attacker"] = Attacker()
        try:
            env["browser"] = Browser(sel, *found)
        except Exception as e:
            raise testlib.Skip("chromium does not start here: %s" % str(e).splitlines()[0])

    def call(fn):
        fn(env["browser"], env["attacker"])

    try:
        return testlib.run(suite, tests, args, namespace=namespace, setup=setup, call=call, all_skipped=77)
    finally:
        if env["browser"]:
            env["browser"].quit()
        if env["attacker"]:
            env["attacker"].close()
