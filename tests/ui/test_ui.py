#!/usr/bin/env python3
"""Browser tests of the dashboard (/ui/): the real beangate binary, driven
through the page in headless Chromium over WebDriver (python3-selenium and
chromium-driver, Debian packages).

Usage:
  python3 tests/ui/test_ui.py build/beangate

Starts the binary on free loopback ports, opens http://127.0.0.1:PORT/ui/
and checks what a user sees and does: counts that follow jobs put over TCP
and HTTP, the tubes table (paging, sort, filter), pause, unpause, kick N,
kick and delete a job (with the confirmation), put from the form, bodies
that hold <script> and <img onerror> shown as text, the bearer-token
prompt, keyboard use, colour contrast, phone width, no Content-Security-
Policy violation, and the server's memory under fast polling. Saves a
screenshot of each view at 390 and 1280 px wide to
<build>/test-artifacts/ui/<view>-<width>.png.

Every wait is a WebDriverWait on a condition (or a poll of the server with a
deadline); nothing sleeps. Prints PASS/FAIL/SKIP per test and ends with
`ui: N passed, M failed`; exits 1 on failure, and 77 (ctest: skipped) with
a SKIP line when Chromium, its driver or selenium is missing.
BEANGATE_UI_ONLY="test_a test_b" runs only those tests.
"""

import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))
import testlib  # noqa: E402
from testlib import SANITIZER_MARKERS, LineSocket, check, check_eq, free_port, signal_and_wait  # noqa: E402

SKIP_EXIT = 77
START_TIMEOUT = 15.0
WAIT = 10.0              # every wait on the page gives up after this
HTTP_TIMEOUT = 10.0
TOKEN = "ui-test-token-5c1f0e9a7d"
WIDTHS = (390, 1280)


def load_selenium():
    """The selenium modules, or (None, why) (testlib.selenium_missing)."""
    why = testlib.selenium_missing()
    if why:
        return None, why
    from selenium import webdriver
    from selenium.common.exceptions import (NoSuchElementException, StaleElementReferenceException,
                                            TimeoutException)
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select, WebDriverWait
    return {"Select": Select, "webdriver": webdriver, "Service": Service, "By": By, "Keys": Keys, "WebDriverWait": WebDriverWait,
            "ActionChains": ActionChains,
            "TimeoutException": TimeoutException,
            "ignored": (NoSuchElementException, StaleElementReferenceException)}, None


find_browser = testlib.find_browser


# ---- the server ------------------------------------------------------------------

class Server:
    """One beangate process on free loopback ports."""

    def __init__(self, binary, args=(), env=None):
        self.binary, self.args, self.env = binary, list(args), dict(env or {})
        self.proc = None

    def start(self):
        last = ""
        for _ in range(5):
            self.tcp_port, self.http_port = free_port(), free_port()
            self.err = tempfile.TemporaryFile()
            env = {k: v for k, v in os.environ.items() if not k.startswith("BEANGATE_")}
            env.update(self.env)
            self.proc = subprocess.Popen([self.binary, "-l", "127.0.0.1", "-p", str(self.tcp_port),
                                          "--http-port", str(self.http_port)] + self.args,
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.err,
                                         env=env)
            deadline = time.monotonic() + START_TIMEOUT
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    if self.request("GET", "/livez")[0] == 200:
                        return self
                except (OSError, http.client.HTTPException):
                    pass
                time.sleep(0.05)   # the process is starting: poll its port
            self.proc.kill()
            self.proc.wait()
            last = self.stderr()
        raise AssertionError("beangate did not start: %s" % last[-1000:])

    def stderr(self):
        self.err.seek(0)
        return self.err.read().decode("utf-8", "replace")

    def stop(self):
        """SIGTERM: the exit status must be 0 and stderr free of sanitizer reports."""
        status = signal_and_wait(self.proc, signal.SIGTERM, 10)
        err = self.stderr()
        bad = [m for m in SANITIZER_MARKERS if m in err]
        check(not bad, "sanitizer report: %s" % err[-3000:])
        check_eq(status, 0, "exit status after SIGTERM (stderr: %s)" % err[-1000:])

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.http_port

    def request(self, method, path, body=None, token=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=HTTP_TIMEOUT)
        headers = {"Authorization": "Bearer " + token} if token else {}
        try:
            conn.request(method, path, body=body, headers=headers)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def api(self, method, path, body=None, want=200, token=None):
        status, data = self.request(method, path, body, token)
        check_eq(status, want, "%s %s (%r)" % (method, path, data[:200]))
        return json.loads(data) if data and want != 204 else None

    def put(self, tube, body, **params):
        q = "&".join("%s=%s" % kv for kv in params.items())
        return self.api("POST", "/tubes/%s/jobs%s" % (quote(tube), "?" + q if q else ""), body, want=201)["id"]

    def tube(self, tube):
        return self.api("GET", "/tubes/" + quote(tube))

    def rss_kib(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            return int(re.search(r"VmRSS:\s+(\d+) kB", f.read()).group(1))

    def requests_served(self):
        """HTTP requests answered so far (beangate_http_requests_total)."""
        _, data = self.request("GET", "/metrics")
        return sum(float(line.rsplit(" ", 1)[1]) for line in data.decode().splitlines()
                   if line.startswith("beangate_http_requests_total{"))


def quote(tube):
    import urllib.parse
    return urllib.parse.quote(tube, safe="")


class Beanstalk(LineSocket):
    """A beanstalk TCP connection, for jobs put and buried over the other protocol."""

    def __init__(self, port):
        super().__init__(port, HTTP_TIMEOUT)

    def cmd(self, text):
        self.s.sendall(text if isinstance(text, bytes) else text.encode())
        return self.line()

    def put(self, tube, body):
        self.cmd("use %s\r\n" % tube)
        reply = self.cmd(b"put 0 0 60 %d\r\n%s\r\n" % (len(body), body))
        check(reply.startswith(b"INSERTED "), "beanstalk put: %r" % reply)
        return int(reply.split()[1])

    def stats(self, command):
        """The YAML of a stats command (stats-tube X, stats-job N) as a dict of strings."""
        reply = self.cmd(command + "\r\n")
        check(reply.startswith(b"OK "), "beanstalk %s: %r" % (command, reply))
        data = self.body(int(reply.split()[1])).decode()
        return dict(line.split(": ", 1) for line in data.splitlines()[1:] if ": " in line)

    def reserve_and_bury(self, tube):
        self.cmd("watch %s\r\n" % tube)
        reply = self.cmd("reserve-with-timeout 0\r\n")
        check(reply.startswith(b"RESERVED "), "beanstalk reserve: %r" % reply)
        self.line()   # the body
        jid = int(reply.split()[1])
        check_eq(self.cmd("bury %d 0\r\n" % jid), b"BURIED", "beanstalk bury")
        return jid


# ---- a push receiver -----------------------------------------------------------------

class Receiver:
    """A push subscriber: a threaded http.server on a free port whose
    answer(receiver, path, n) gives the status of the n-th POST to path
    (1-based; it may block, for example on the receiver's `gate`). Requests
    are counted per path."""

    def __init__(self, answer):
        import http.server
        import threading
        self.gate = threading.Event()
        self.lock = threading.Lock()
        self.got = {}
        rx = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with rx.lock:
                    n = rx.got[self.path] = rx.got.get(self.path, 0) + 1
                self.send_response(answer(rx, self.path, n))
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path):
        return "http://127.0.0.1:%d%s" % (self.httpd.server_address[1], path)

    def close(self):
        self.gate.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def held_or_500(rx, path, n):
    """The shared server's subscriber: POST /ok is held until the gate
    opens, then answered 204; any other path 500 at once."""
    if path != "/ok":
        return 500
    rx.gate.wait(60)
    return 204


# The shared server's subscriptions: ui-push is delivered to /ok (held
# until the receiver's gate opens); ui-push-fail to a URL that looks like
# markup and answers 500, buried after one attempt; ui-push-retry to the
# same, retried after 600 s (so it stays backing off).
MARKUP_PATH = '/fail/"><svg/onload=window.__xss=5><script>window.__xss=6</script>'


def push_args(rx):
    return ["--push", "tube=ui-push url=%s concurrency=2" % rx.url("/ok"),
            "--push", "tube=ui-push-fail url=%s attempts=1" % rx.url(MARKUP_PATH),
            "--push", "tube=ui-push-retry url=%s attempts=5 backoff=600..600" % rx.url("/retry")]


# ---- the browser ---------------------------------------------------------------------

class Browser:
    def __init__(self, sel, chromium, driver):
        self.sel = sel
        self.profile = tempfile.mkdtemp(prefix="beangate-ui-chromium-")
        opts = sel["webdriver"].ChromeOptions()
        # the background-networking flags: Chromium's own connections are
        # refused on a closed network, and it must not wait for them
        for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     "--disable-dev-shm-usage", "--user-data-dir=" + self.profile, "--window-size=1280,900"):
            opts.add_argument(flag)
        opts.binary_location = chromium
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.d = sel["webdriver"].Chrome(service=sel["Service"](driver), options=opts)
        self.logs = []

    def quit(self):
        try:
            self.d.quit()
        finally:
            shutil.rmtree(self.profile, ignore_errors=True)

    def wait(self, cond, what, timeout=WAIT):
        """Until cond() is truthy (its value), or AssertionError."""
        try:
            return self.sel["WebDriverWait"](self.d, timeout, poll_frequency=0.05,
                                             ignored_exceptions=self.sel["ignored"]).until(lambda d: cond())
        except self.sel["TimeoutException"]:
            raise AssertionError("timed out after %.0f s waiting for %s" % (timeout, what)) from None

    def css(self, selector):
        return self.d.find_element(self.sel["By"].CSS_SELECTOR, selector)

    def all(self, selector):
        return self.d.find_elements(self.sel["By"].CSS_SELECTOR, selector)

    def button(self, text, within="body"):
        """The visible button whose text is text."""
        for b in self.all(within + " button"):
            if b.text.strip() == text and b.is_displayed():
                return b
        raise self.sel["ignored"][0]("no button %r" % text)

    def js(self, script, *args):
        return self.d.execute_script(script, *args)

    def open(self, server, hash_path, poll=None):
        """Load the page at #hash_path (a fresh page: state from a former view is gone)."""
        query = "?poll=%d" % poll if poll else ""
        self.d.get("%s/ui/%s#%s" % (server.url, query, hash_path))

    def heading(self, text):
        self.wait(lambda: self.css("main h1").text == text, "the heading %r (have %r)" % (text, self.safe_text("main h1")))

    def safe_text(self, selector):
        try:
            return self.css(selector).text
        except Exception:
            return None

    def fact(self, key, within="main"):
        """The number in the <dd data-key=key> of a facts list."""
        text = self.css('%s dd[data-key="%s"]' % (within, key)).text
        return int(text.replace(",", "")) if re.fullmatch(r"[0-9,]+", text) else text

    def wait_fact(self, key, want, within="main"):
        self.wait(lambda: self.fact(key, within) == want,
                  "%s = %r (shown: %r)" % (key, want, self.safe_text('%s dd[data-key="%s"]' % (within, key))))

    def notice(self):
        return self.css("#notice").text

    def collect_logs(self):
        self.logs += self.d.get_log("browser")

    def type_into(self, selector, text):
        el = self.css(selector)
        el.clear()
        el.send_keys(text)
        return el

    def screenshot(self, path, width):
        """The whole page, laid out at width, into path (PNG)."""
        import base64
        self.d.set_window_size(width, 900)
        w, h = self.js("const e = document.documentElement;"
                       "return [Math.max(e.scrollWidth, window.innerWidth), e.scrollHeight]")
        shot = self.d.execute_cdp_cmd("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": w, "height": min(h, 4000), "scale": 1}})
        with open(path, "wb") as f:
            f.write(base64.b64decode(shot["data"]))
        self.d.set_window_size(1280, 900)


# ---- the tests ------------------------------------------------------------------------

class Ctx:
    pass


C = Ctx()


def test_no_html_sinks_in_the_sources():
    """The page builds its DOM from nodes and text only: none of the calls
    that parse a string as HTML or code appears in ui/*.js, no inline
    script or style in index.html."""
    ui = os.path.join(REPO, "ui")
    sinks = re.compile(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function|"
                       r"setAttribute\(\s*['\"]on|\.style\b|srcdoc")
    for name in sorted(os.listdir(ui)):
        with open(os.path.join(ui, name), encoding="utf-8", errors="replace") as f:
            text = f.read()
        if name.endswith(".js"):
            code = re.sub(r"/\*.*?\*/|^\s*//.*$", "", text, flags=re.S | re.M)   # comments may name them
            found = sinks.findall(code)
            check(not found, "ui/%s uses %s" % (name, sorted(set(found))))
        if name.endswith(".html"):
            check(not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", text), "ui/%s has an inline <script>" % name)
            check(not re.search(r"<style|\sstyle=|\son[a-z]+=", text, re.I), "ui/%s has inline style or a handler" % name)


def test_page_loads_under_its_policy():
    """The page and its modules load under the server's CSP: the overview
    is filled in from GET /stats, with no element that has a style
    attribute and no script but the module."""
    b, s = C.browser, C.server
    b.open(s, "/overview")
    b.heading("Overview")
    version = s.api("GET", "/stats")["version"]
    b.wait(lambda: b.fact("version") == version, "the version from GET /stats")
    check_eq(b.js("return document.querySelectorAll('[style]').length"), 0, "elements with a style attribute")
    check_eq(b.js("return Array.from(document.scripts).map(s => s.type + ' ' + new URL(s.src).pathname)"),
             ["module /ui/app.js"], "scripts of the page")
    check_eq(b.js("return document.title"), "Overview · beangate", "title")


def test_overview_counts_follow_tcp_and_http():
    """Jobs put over TCP and over HTTP show in the overview's counts; the
    rates see the puts, the reserves and the deletes of either protocol."""
    b, s = C.browser, C.server
    b.open(s, "/overview")
    b.heading("Overview")
    b.wait(lambda: isinstance(b.fact("ready"), int), "the ready count")
    st = s.api("GET", "/stats")
    ready, total = st["current_jobs_ready"], st["total_jobs"]
    b.wait_fact("ready", ready)
    tube = "ui-overview"
    bs = Beanstalk(s.tcp_port)
    try:
        for i in range(3):
            bs.put(tube, b"tcp %d" % i)
        for i in range(2):
            s.put(tube, b"http %d" % i)
        b.wait_fact("ready", ready + 5)
        b.wait_fact("total", total + 5)
        b.wait(lambda: peak(b, "Puts") > 0, "a put rate above 0")
        # reserve and delete one job over each protocol
        bs.cmd("watch %s\r\n" % tube)
        reply = bs.cmd("reserve-with-timeout 0\r\n")
        bs.line()
        check_eq(bs.cmd("delete %s\r\n" % reply.split()[1].decode()), b"DELETED", "TCP delete")
        job = s.api("POST", "/tubes/%s/reservations" % tube)
        s.api("DELETE", "/jobs/%d?reservation=%s" % (job["id"], job["reservation"]), want=204)
    finally:
        bs.close()
    b.wait_fact("ready", ready + 3)
    b.wait(lambda: peak(b, "Reserves") > 0 and peak(b, "Deletes") > 0, "reserve and delete rates above 0")


def chart(b, title):
    """The overview's chart of that title (figure.chart-box)."""
    for fig in b.all("figure.chart-box"):
        if fig.find_element(b.sel["By"].CSS_SELECTOR, ".chart-title").text == title:
            return fig
    raise AssertionError("no chart %r" % title)


def peak(b, title):
    """The largest value a chart draws over its 15 minutes (its data-max)."""
    return float(chart(b, title).get_attribute("data-max") or 0)


def test_tubes_table_pages_sort_filter():
    """250 tubes: the table shows 100 at a time; the filter, the pager and
    the sort buttons (driven from the keyboard) ask the server for the
    right page."""
    b, s = C.browser, C.server
    names = ["pg-%03d" % i for i in range(250)]
    for i, name in enumerate(names):
        for _ in range(1 + (i % 3)):
            s.put(name, b"x")
    busiest = "pg-137"
    for _ in range(6):
        s.put(busiest, b"more")
    b.open(s, "/tubes")
    b.heading("Tubes")
    total = s.api("GET", "/stats")["current_tubes"]
    b.wait(lambda: b.css("table.tubes caption").text == "Tubes 1–100 of %d" % total, "the caption for %d tubes" % total)
    check_eq(len(b.all("table.tubes tbody tr")), 100, "rows on a page")
    b.type_into("#tube-filter", "pg-")
    b.wait(lambda: b.css("table.tubes caption").text == "Tubes 1–100 of 250 matching the filter", "the filtered caption")
    check_eq(b.css("table.tubes tbody tr th a").text, "pg-000", "first row, by name")
    b.button("Next").click()
    b.wait(lambda: b.css("table.tubes caption").text.startswith("Tubes 101–200 of 250"), "page 2")
    check_eq(b.css("table.tubes tbody tr th a").text, "pg-100", "first row of page 2")
    check(b.css(".pager .page-info").text == "Page 2 of 3", "page info %r" % b.css(".pager .page-info").text)
    # sort by Ready from the keyboard: most first, then fewest first
    ready = b.button("Ready", "table.tubes thead")
    ready.send_keys(b.sel["Keys"].ENTER)
    b.wait(lambda: b.css("table.tubes tbody tr th a").text == busiest, "the busiest tube first")
    check_eq(ready.find_element(b.sel["By"].XPATH, "..").get_attribute("aria-sort"), "descending", "aria-sort")
    check(b.css(".pager .page-info").text == "Page 1 of 3", "a new sort starts on page 1")
    ready.send_keys(b.sel["Keys"].SPACE)
    b.wait(lambda: b.css("table.tubes tbody tr th a").text == "pg-000", "fewest first (ties by name)")
    check("order=asc" in b.d.current_url and "filter=pg-" in b.d.current_url, "the state is in the address: %s"
          % b.d.current_url)
    b.css("table.tubes tbody tr th a").click()
    b.heading("Tube pg-000")


def test_tube_kick_pause_unpause():
    """Through the tube view: kick 2 of 3 buried jobs, kick the last one
    from its peek, pause for 120 s (Enter in the field), unpause; the
    server's numbers follow each action."""
    b, s = C.browser, C.server
    tube = "ui-actions"
    bs = Beanstalk(s.tcp_port)
    try:
        for i in range(4):
            bs.put(tube, b"job %d" % i)
        buried = [bs.reserve_and_bury(tube) for _ in range(3)]
    finally:
        bs.close()
    b.open(s, "/tubes/" + tube)
    b.heading("Tube " + tube)
    b.wait_fact("buried", 3)
    b.type_into("#kick-bound", "2")
    b.button("Kick").click()
    b.wait(lambda: "Kicked 2 jobs" in b.notice(), "the kick's message (have %r)" % b.notice())
    st = s.tube(tube)
    check_eq((st["current_jobs_buried"], st["current_jobs_ready"]), (1, 3), "buried, ready after kick 2")
    b.wait_fact("buried", 1)
    panel = b.css('article[aria-label="Oldest buried"]')
    b.wait(lambda: panel.find_element(b.sel["By"].CSS_SELECTOR, 'dd[data-key="id"]').text == str(buried[2]),
           "the oldest buried job in its panel")
    b.button("Kick this job", 'article[aria-label="Oldest buried"]').click()
    b.wait(lambda: s.tube(tube)["current_jobs_buried"] == 0, "the peeked job kicked")
    b.wait_fact("buried", 0)
    field = b.type_into("#pause-seconds", "120")
    field.send_keys(b.sel["Keys"].ENTER)
    b.wait(lambda: s.tube(tube)["pause"] == 120, "the tube paused for 120 s")
    b.wait(lambda: str(b.fact("pause")).startswith("Yes"), "the view shows the pause")
    unpause = b.button("Unpause")
    b.wait(lambda: unpause.is_enabled(), "Unpause enabled")
    unpause.click()
    b.wait(lambda: s.tube(tube)["pause_time_left"] == 0 and s.tube(tube)["pause"] == 0, "the tube unpaused")
    b.wait_fact("pause", "No")


def test_delete_asks_first():
    """Delete asks for confirmation: Escape and Cancel keep the job (focus
    back on the button), the dialog's Delete job deletes it, from the tube
    view and from the job view."""
    b, s = C.browser, C.server
    tube = "ui-delete"
    jid = s.put(tube, b"delete me")
    b.open(s, "/tubes/" + tube)
    b.heading("Tube " + tube)
    panel = 'article[aria-label="Next ready"]'
    b.wait(lambda: b.css(panel + ' dd[data-key="id"]').text == str(jid), "the job in the ready panel")
    delete = b.button("Delete this job", panel)
    delete.click()
    dialog = b.css("#confirm-dialog")
    b.wait(lambda: dialog.get_attribute("open") is not None, "the confirmation dialog")
    check("Delete job %d of tube %s" % (jid, tube) in dialog.text, "the question names the job: %r" % dialog.text)
    b.d.switch_to.active_element.send_keys(b.sel["Keys"].ESCAPE)
    b.wait(lambda: dialog.get_attribute("open") is None, "Escape closes the dialog")
    b.wait(lambda: b.d.switch_to.active_element == delete, "focus back on the Delete button")
    s.api("GET", "/jobs/%d" % jid)
    delete.click()
    b.wait(lambda: dialog.get_attribute("open") is not None, "the dialog again")
    b.button("Cancel", "#confirm-dialog").click()
    b.wait(lambda: dialog.get_attribute("open") is None, "Cancel closes the dialog")
    s.api("GET", "/jobs/%d" % jid)
    delete.click()
    b.wait(lambda: dialog.get_attribute("open") is not None, "the dialog a third time")
    b.button("Delete job", "#confirm-dialog").click()
    b.wait(lambda: s.request("GET", "/jobs/%d" % jid)[0] == 404, "the job deleted")
    b.wait(lambda: "Job %d deleted." % jid in b.notice(), "the delete's message")

    jid = s.put(tube, b"and me")
    b.open(s, "/jobs/%d" % jid)
    b.heading("Job %d" % jid)
    b.wait_fact("state", "ready")
    b.button("Delete").click()
    b.wait(lambda: dialog.get_attribute("open") is not None, "the job view's dialog")
    b.button("Delete job", "#confirm-dialog").click()
    b.wait(lambda: b.css(".notice-inline").is_displayed(), "the job view says it is gone")
    check_eq(s.request("GET", "/jobs/%d" % jid)[0], 404, "the job deleted from the job view")


def test_put_from_the_form():
    b, s = C.browser, C.server
    tube = "ui-put"
    s.put(tube, b"first")
    b.open(s, "/tubes/" + tube)
    b.heading("Tube " + tube)
    b.type_into("#put-body", "hello from the form\nline 2")
    b.type_into("#put-priority", "5")
    b.type_into("#put-delay", "0")
    b.button("Put job").click()
    b.wait(lambda: re.search(r"Put job (\d+) \(ready\)", b.notice()), "the put's message (have %r)" % b.notice())
    jid = int(re.search(r"Put job (\d+)", b.notice()).group(1))
    job = s.api("GET", "/jobs/%d" % jid)
    check_eq((job["tube"], job["priority"], job["state"]), (tube, 5, "ready"), "the job put from the form")
    check_eq(s.request("GET", "/jobs/%d/body" % jid)[1], b"hello from the form\nline 2", "its body")
    b.wait_fact("ready", 2)
    # a bad number is refused in the page, before any request
    b.type_into("#put-priority", "-1")
    b.button("Put job").click()
    b.wait(lambda: "Priority: a whole number" in b.notice(), "the bad priority refused")
    check_eq(b.css("#put-priority").get_attribute("aria-invalid"), "true", "the field marked invalid")
    check_eq(b.d.switch_to.active_element.get_attribute("id"), "put-priority", "focus on the bad field")
    check_eq(s.tube(tube)["total_jobs"], 2, "nothing put with a bad priority")


def dots_path(tube):
    """/tubes/NAME for the server's own checks, a name of dots written %2E
    (an HTTP client may normalize a literal ".." away, as browsers do)."""
    return "/tubes/" + (tube.replace(".", "%2E") if set(tube) == {"."} else quote(tube))


def test_tubes_named_dot_and_dot_dot():
    """Tubes "." and ".." (valid names): each view shows its tube, and its
    Kick, Pause and Put reach that tube, not /kick, /pause and /jobs (a
    browser drops "." and ".." path segments, even written %2E)."""
    b, s = C.browser, C.server
    ids = []
    for tube in (".", ".."):
        bs = Beanstalk(s.tcp_port)
        try:
            ids += [bs.put(tube, b"dots 1"), bs.put(tube, b"dots 2")]
            bs.reserve_and_bury(tube)
        finally:
            bs.close()
        b.open(s, "/tubes/" + tube)
        b.heading("Tube " + tube)
        b.wait_fact("buried", 1)
        b.wait_fact("ready", 1)
        b.type_into("#kick-bound", "1")
        b.button("Kick").click()
        b.wait(lambda: "Kicked 1 job" in b.notice(), "the kick's message in %r (have %r)" % (tube, b.notice()))
        check_eq(s.api("GET", dots_path(tube))["current_jobs_buried"], 0, "buried in %r after its kick" % tube)
        b.type_into("#pause-seconds", "120").send_keys(b.sel["Keys"].ENTER)
        b.wait(lambda: s.api("GET", dots_path(tube))["pause"] == 120, "tube %r paused for 120 s" % tube)
        b.type_into("#put-body", "put into " + tube)
        b.button("Put job").click()
        b.wait(lambda: re.search(r"Put job (\d+)", b.notice()), "the put's message (have %r)" % b.notice())
        jid = int(re.search(r"Put job (\d+)", b.notice()).group(1))
        ids.append(jid)
        check_eq(s.api("GET", "/jobs/%d" % jid)["tube"], tube, "the tube of the job put from the view of %r" % tube)
        b.wait_fact("ready", 3)
        b.open(s, "/jobs/%d" % jid)
        b.heading("Job %d" % jid)
        link = b.wait(lambda: [a for a in b.all("main a") if a.text == tube], "a link to tube %r in the job view" % tube)
        check_eq(link[0].get_attribute("href").split("#", 1)[1], "/tubes/" + tube, "the job view's link to its tube")
    for jid in ids:   # the tubes go away again, for the tests that count tubes
        s.api("DELETE", "/jobs/%d" % jid, want=204)


XSS_BODIES = [
    b"<script>window.__xss = 1</script>",
    b'<img src=x onerror="window.__xss = 2">',
    b'{"html": "<img src=x onerror=window.__xss=3>", "s": "</pre><script>window.__xss=4</script>"}',
]


def no_markup_ran(b, what):
    check_eq(b.js("return window.__xss === undefined"), True, "%s: a body's script ran" % what)
    check_eq(b.js("return document.querySelectorAll('main img, main script, main iframe').length"), 0,
             "%s: markup from a body became elements" % what)


def test_bodies_with_markup_are_text():
    """Bodies that hold <script> and <img onerror> are shown as their text,
    in the peek panel and the job view, as text, hex and JSON; nothing of
    them runs or becomes an element. A tube name with $ ( ) ; shows as is."""
    b, s = C.browser, C.server
    tube = "ui-xss$(x);y"
    ids = [s.put(tube, body, priority=i) for i, body in enumerate(XSS_BODIES)]
    b.open(s, "/tubes/" + quote(tube))
    b.heading("Tube " + tube)
    pre = 'article[aria-label="Next ready"] pre.body'
    b.wait(lambda: b.css(pre).text == XSS_BODIES[0].decode(), "the first body as text in the peek")
    no_markup_ran(b, "peek")
    for jid, body in zip(ids, XSS_BODIES):
        b.open(s, "/jobs/%d" % jid)
        b.heading("Job %d" % jid)
        b.wait(lambda: b.css("main pre.body").text != "", "the body of job %d" % jid)
        text = body.decode()
        if body.startswith(b"{"):
            check_eq(b.css("main pre.body").text, json.dumps(json.loads(text), indent=2), "pretty JSON")
            b.button("Text").click()
        b.wait(lambda: b.css("main pre.body").text == text, "the body as text")
        b.button("Hex").send_keys(b.sel["Keys"].SPACE)
        b.wait(lambda: b.css("main pre.body").text.startswith("00000000  %02x %02x" % (body[0], body[1])), "hex")
        check_eq(b.button("Hex").get_attribute("aria-pressed"), "true", "the Hex button pressed")
        no_markup_ran(b, "job %d" % jid)
        check_eq(b.css('dd[data-key="tube"] a').text, tube, "the tube name as text")
    b.open(s, "/tubes")
    b.type_into("#tube-filter", "ui-xss")
    b.wait(lambda: b.css("table.tubes tbody tr th a").text == tube, "the odd tube name in the table")
    no_markup_ran(b, "tubes table")


def sub_fact(b, tube, key):
    """A figure of the card of tube's subscription, as shown."""
    return b.safe_text('section[aria-label="Subscription %s"] [data-key="%s"]' % (tube, key))


def test_subscriptions_view():
    """The Subscriptions view follows push delivery live: jobs held by the
    receiver show in flight (2 of concurrency 2), then delivered once it
    answers; a 500 shows as the subscription's last failure, linked to its
    job, whose view shows the last delivery error; a retry waiting shows as
    backing off. The URL, which looks like markup, is shown as text, and
    nothing of it runs. The tube view links to the subscription, and the
    view is reached from the keyboard. Screenshots at 390 and 1280 px."""
    b, s, rx = C.browser, C.server, C.receiver
    b.open(s, "/subscriptions")
    b.heading("Subscriptions")
    card = 'section[aria-label="Subscription ui-push"]'
    b.wait(lambda: sub_fact(b, "ui-push", "delivered") is not None, "the ui-push card")
    delivered = int(sub_fact(b, "ui-push", "delivered").replace(",", ""))
    check_eq(sub_fact(b, "ui-push", "in_flight"), "0 of 2", "in flight before any job")
    ids = [s.put("ui-push", b"held %d" % i) for i in range(3)]
    b.wait(lambda: sub_fact(b, "ui-push", "in_flight") == "2 of 2",
           "2 of 2 in flight (shown: %r)" % sub_fact(b, "ui-push", "in_flight"))
    check_eq(rx.got.get("/ok"), 2, "requests the receiver holds")
    rx.gate.set()
    b.wait(lambda: sub_fact(b, "ui-push", "delivered") == str(delivered + 3) and
           sub_fact(b, "ui-push", "in_flight") == "0 of 2",
           "3 more delivered, none in flight (shown: %r, %r)" % (sub_fact(b, "ui-push", "delivered"),
                                                               sub_fact(b, "ui-push", "in_flight")))
    for jid in ids:
        s.api("GET", "/jobs/%d" % jid, want=404)
    # a 500: buried at once (attempts=1); another retried in 600 s
    failed = s.put("ui-push-fail", b"fails")
    retried = s.put("ui-push-retry", b"fails, retried later")
    b.wait(lambda: sub_fact(b, "ui-push-fail", "buried") == "1", "the failed job buried")
    b.wait(lambda: sub_fact(b, "ui-push-retry", "backing_off") == "1", "the other backing off")
    check_eq(sub_fact(b, "ui-push-retry", "retried_by_reason"), "http_5xx 1", "retried by reason")
    check_eq(sub_fact(b, "ui-push-fail", "buried_by_reason"), "attempts_exhausted 1", "buried by reason")
    last = sub_fact(b, "ui-push-fail", "last_error")
    check(last.startswith("Job %d: HTTP 500 (http_5xx: the endpoint answered a server error (5xx)), attempt 1, " % failed)
          and " ago (" in last and last.endswith(" UTC)"), "the last failure: %r" % last)
    fail_card = 'section[aria-label="Subscription ui-push-fail"]'
    check_eq(b.css(fail_card + " .url").text, C.receiver.url(MARKUP_PATH), "the URL as text")
    no_markup_ran(b, "subscriptions view")
    check_eq(b.js("return document.querySelectorAll('main svg').length"), 0, "an svg from the URL")
    b.css(card + " h2 a").click()
    b.heading("Tube ui-push")
    b.wait(lambda: "Push delivery: its jobs are POSTed to " + rx.url("/ok") in b.css("main p.pushed").text,
           "the tube view names its subscription")
    # the job's last delivery error, reached from the subscription's link
    b.open(s, "/subscriptions")
    b.heading("Subscriptions")
    b.wait(lambda: b.css(fail_card + ' [data-key="last_error"] a').text == "Job %d" % failed, "the job link")
    b.css(fail_card + ' [data-key="last_error"] a').send_keys(b.sel["Keys"].ENTER)
    b.heading("Job %d" % failed)
    section = 'section[aria-label="Last delivery error"]'
    b.wait(lambda: b.css(section).is_displayed() and b.fact("status", section) == 500, "the last delivery error")
    check_eq((b.fact("error", section), b.fact("attempt", section)),
             ("http_5xx: the endpoint answered a server error (5xx)", 1), "error and attempt")
    check(re.fullmatch(r"\d+s ago \(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\)", b.fact("at", section)),
          "when: %r" % b.fact("at", section))
    check_eq(b.fact("state"), "buried", "the job's state")
    no_markup_ran(b, "job view")
    # a job without a failure shows no such card
    plain = s.put("ui-plain", b"never pushed")
    b.open(s, "/jobs/%d" % plain)
    b.heading("Job %d" % plain)
    b.wait(lambda: b.fact("state") == "ready", "the plain job's stats")
    check(not b.css(section).is_displayed(), "a last delivery error shown for a job without one")
    # from the keyboard: the view is the fourth of the navigation
    b.open(s, "/overview")
    b.heading("Overview")
    b.js("document.querySelector('.brand').focus()")
    order = []
    for _ in range(4):
        b.sel["ActionChains"](b.d).send_keys(b.sel["Keys"].TAB).perform()
        order.append(b.d.switch_to.active_element.text.strip())
    check_eq(order, ["Overview", "Tubes", "Clients", "Subscriptions"], "the tab stops after the brand")
    b.d.switch_to.active_element.send_keys(b.sel["Keys"].ENTER)
    b.heading("Subscriptions")
    check_eq(b.css('.nav a[aria-current="page"]').text, "Subscriptions", "the current view marked")
    os.makedirs(C.artifacts, exist_ok=True)
    for width in WIDTHS:
        b.d.set_window_size(width, 900)
        b.open(s, "/subscriptions")
        b.heading("Subscriptions")
        b.wait(lambda: "…" not in b.css("main").text and "Connecting" not in b.css("#live").text, "filled in")
        widths = b.js("return [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        check(widths[0] <= widths[1], "at %d px: page %d px wide, screen %d" % (width, widths[0], widths[1]))
        for name, path in (("subscriptions", None), ("job-delivery-error", "/jobs/%d" % failed)):
            if path:
                b.open(s, path)
                b.wait(lambda: b.css(section).is_displayed(), "the job's delivery error")
            shot = os.path.join(C.artifacts, "%s-%d.png" % (name, width))
            b.screenshot(shot, width)
            check(os.path.getsize(shot) > 5000, "screenshot %s" % shot)
    b.d.set_window_size(1280, 900)
    s.api("DELETE", "/jobs/%d" % failed, want=204)
    s.api("DELETE", "/jobs/%d" % retried, want=204)
    s.api("DELETE", "/jobs/%d" % plain, want=204)


# ---- issue 26: a tube's jobs, bulk actions, clients, history ----------------------------

def job_rows(b):
    """The ids of the jobs table's rows, in order."""
    return [int(tr.get_attribute("data-id")) for tr in b.all("table.jobs tbody tr[data-id]")]


def open_jobs(b, s, tube, state, heading=True):
    b.open(s, "/tubes/%s/jobs?state=%s" % (quote(tube), state))
    if heading:
        b.heading("Jobs of tube " + tube)
    b.wait(lambda: b.css('.tabs button[aria-pressed="true"]').get_attribute("data-state") == state,
           "the %s tab chosen" % state)


def tab_counts(b):
    """{state: count} as the tabs show them ("Buried 3")."""
    out = {}
    for t in b.all(".tabs button"):
        m = re.fullmatch(r"[A-Z][a-z]+ ([0-9,]+)", t.text.strip())
        out[t.get_attribute("data-state")] = int(m.group(1).replace(",", "")) if m else None
    return out


def stats_tube(s, tube):
    """stats-tube over the beanstalk protocol: {field: int}."""
    bs = Beanstalk(s.tcp_port)
    try:
        return {k: int(v) if v.strip().isdigit() else v for k, v in bs.stats("stats-tube %s" % tube).items()}
    finally:
        bs.close()


def test_tube_jobs_paged_by_state():
    """A tube's jobs, a state at a time, in the order the server serves
    them: 110 ready jobs in pages of 50 (Next, Previous: the cursor stack),
    a page size of 20, the buried tab in burial order, a job put at
    priority 0 shows first, a body on demand (markup in it stays text),
    and the go-to-job box."""
    b, s = C.browser, C.server
    tube = "ui-browse"
    ids = [s.put(tube, b"job %d" % i) for i in range(110)]   # 3 pages of 50, the last one short
    bs = Beanstalk(s.tcp_port)
    try:
        buried = []
        for i in range(2):
            bs.put(tube, b"to bury %d" % i)   # priority 0 over TCP: reserved before the others
            buried.append(bs.reserve_and_bury(tube))
        marked = s.put(tube, XSS_BODIES[1], priority=0)
        delayed = [s.put(tube, b"later %d" % i, delay=600) for i in range(2)]
    finally:
        bs.close()
    st = stats_tube(s, tube)
    ready_now = st["current-jobs-ready"]
    open_jobs(b, s, tube, "ready")
    b.wait(lambda: tab_counts(b) == {"ready": ready_now, "delayed": 2, "buried": len(buried), "reserved": 0},
           "the tabs' counts (have %r)" % tab_counts(b))
    b.wait(lambda: len(job_rows(b)) == 50, "a page of 50")
    rows = job_rows(b)
    check_eq(rows[0], marked, "priority 0 first")
    ready_order = [marked] + [j for j in ids if j not in buried]
    check_eq(rows, ready_order[:50], "the first page in serving order")
    check(b.css("table.jobs caption").text.startswith("Ready jobs 1–50 of %d" % ready_now),
          "caption %r" % b.css("table.jobs caption").text)
    check(not b.button("Previous", ".pager").is_enabled(), "no Previous on the first page")
    b.button("Next", ".pager").click()
    b.wait(lambda: job_rows(b)[:1] == ready_order[50:51], "page 2")
    check_eq(job_rows(b), ready_order[50:100], "page 2 in serving order")
    b.button("Next", ".pager").click()
    b.wait(lambda: job_rows(b) == ready_order[100:], "page 3 (the rest)")
    check(not b.button("Next", ".pager").is_enabled(), "no Next on the last page")
    b.button("Previous", ".pager").click()
    b.wait(lambda: job_rows(b) == ready_order[50:100], "back to page 2")
    b.button("Previous", ".pager").click()
    b.wait(lambda: job_rows(b) == ready_order[:50], "back to page 1")
    # a page size of 20, kept in the address
    sel = b.css("#jobs-limit")
    b.sel["Select"](sel).select_by_visible_text("20")
    b.wait(lambda: len(job_rows(b)) == 20, "a page of 20")
    check("limit=20" in b.d.current_url, "the page size in the address: %s" % b.d.current_url)
    # a new job at priority 0 comes first on the next poll
    urgent = s.put(tube, b"urgent", priority=0)
    b.wait(lambda: job_rows(b)[:2] == [marked, urgent], "the urgent job near the top (ids %r)" % job_rows(b)[:3])
    # the body on demand, as text; the markup in it is text
    row = 'table.jobs tr[data-id="%d"]' % marked
    b.button("Body", row).click()
    pre = 'table.jobs tr[data-id="%d"] + tr.body-row pre.body' % marked
    b.wait(lambda: b.css(pre).text == XSS_BODIES[1].decode(), "the body shown as text")
    check_eq(b.button("Body", row).get_attribute("aria-expanded"), "true", "aria-expanded")
    no_markup_ran(b, "jobs table")
    # the buried tab: burial order, the delayed tab
    b.css('.tabs button[data-state="buried"]').click()
    b.wait(lambda: job_rows(b) == buried, "the buried jobs in burial order (have %r)" % job_rows(b))
    check("state=buried" in b.d.current_url, "the state in the address")
    b.css('.tabs button[data-state="delayed"]').click()
    b.wait(lambda: job_rows(b) == delayed, "the delayed jobs, soonest first")
    # kick one delayed job from its row
    b.button("Kick", 'table.jobs tr[data-id="%d"]' % delayed[0]).click()
    b.wait(lambda: s.api("GET", "/jobs/%d" % delayed[0])["state"] == "ready", "the delayed job kicked")
    b.wait(lambda: job_rows(b) == delayed[1:], "the kicked job left the delayed page")
    # go to a job by id
    b.type_into("#jobs-goto", str(buried[1])).send_keys(b.sel["Keys"].ENTER)
    b.heading("Job %d" % buried[1])


def test_bulk_actions_confirm_with_count():
    """Delete all buried, kick all delayed, delete all ready: each asks with
    the count ("Delete 4 buried jobs of tube ...?"), Cancel does nothing, and
    the answer's count is shown; beanstalk's stats-tube shows the result
    and the other states untouched."""
    b, s = C.browser, C.server
    tube = "ui-bulk"
    for i in range(5):
        s.put(tube, b"ready %d" % i, priority=10)
    for i in range(3):
        s.put(tube, b"delayed %d" % i, delay=600)
    bs = Beanstalk(s.tcp_port)
    try:
        for i in range(4):
            bs.cmd("use %s\r\n" % tube)
            reply = bs.cmd(b"put 0 0 60 6\r\nburied\r\n")
            check(reply.startswith(b"INSERTED"), "put: %r" % reply)
            bs.reserve_and_bury(tube)
    finally:
        bs.close()
    before = stats_tube(s, tube)
    check_eq((before["current-jobs-ready"], before["current-jobs-delayed"], before["current-jobs-buried"]), (5, 3, 4),
             "ready, delayed, buried before")
    dialog = b.css("#confirm-dialog")
    open_jobs(b, s, tube, "buried")
    b.wait(lambda: len(job_rows(b)) == 4, "the 4 buried jobs")
    b.css('.bulk button[data-bulk="delete"]').click()
    b.wait(lambda: dialog.get_attribute("open") is not None, "the confirmation")
    check("Delete 4 buried jobs of tube %s?" % tube in dialog.text, "the question names the count: %r" % dialog.text)
    b.button("Cancel", "#confirm-dialog").click()
    b.wait(lambda: dialog.get_attribute("open") is None, "Cancel closes it")
    check_eq(stats_tube(s, tube)["current-jobs-buried"], 4, "nothing deleted after Cancel")
    b.css('.bulk button[data-bulk="delete"]').click()
    b.wait(lambda: dialog.get_attribute("open") is not None, "the confirmation again")
    b.button("Delete 4 jobs", "#confirm-dialog").click()
    b.wait(lambda: "Deleted 4 buried jobs of tube %s." % tube in b.notice(), "the count deleted (%r)" % b.notice())
    after = stats_tube(s, tube)
    check_eq((after["current-jobs-buried"], after["current-jobs-ready"], after["current-jobs-delayed"]), (0, 5, 3),
             "buried gone, ready and delayed untouched")
    check_eq(after["cmd-delete"] - before["cmd-delete"], 4, "the deletes counted in the tube's cmd-delete")
    b.wait(lambda: job_rows(b) == [] and tab_counts(b)["buried"] == 0, "the table empty")
    # kick all delayed
    b.css('.tabs button[data-state="delayed"]').click()
    b.wait(lambda: len(job_rows(b)) == 3, "the 3 delayed jobs")
    b.css('.bulk button[data-bulk="kick"]').click()
    b.wait(lambda: dialog.get_attribute("open") is not None, "the kick's confirmation")
    check("Kick 3 delayed jobs of tube %s?" % tube in dialog.text, "the kick names the count: %r" % dialog.text)
    b.button("Kick 3 jobs", "#confirm-dialog").click()
    b.wait(lambda: "Kicked 3 delayed jobs" in b.notice(), "the count kicked (%r)" % b.notice())
    after = stats_tube(s, tube)
    check_eq((after["current-jobs-delayed"], after["current-jobs-ready"]), (0, 8), "delayed kicked to ready")
    # delete all ready
    b.css('.tabs button[data-state="ready"]').click()
    b.wait(lambda: len(job_rows(b)) == 8, "the 8 ready jobs")
    b.css('.bulk button[data-bulk="delete"]').click()
    b.wait(lambda: "Delete 8 ready jobs of tube %s?" % tube in dialog.text, "the question for ready")
    b.button("Delete 8 jobs", "#confirm-dialog").click()
    b.wait(lambda: "Deleted 8 ready jobs" in b.notice(), "the ready jobs deleted (%r)" % b.notice())
    check_eq(s.request("GET", "/tubes/" + tube)[0], 404, "the tube, empty, is gone")
    # the reserved tab offers no bulk action
    b.css('.tabs button[data-state="reserved"]').click()
    b.wait(lambda: not b.css(".bulk").is_displayed(), "no bulk action for reserved jobs")


def test_clients_view_and_close():
    """The Clients view lists a beanstalk worker (its peer, tube used, tubes
    watched, its reserved job linked to the job page) and a waiting one;
    the job page names the client that holds it (a link back); Close asks
    first, ends the connection, and the job is ready again over beanstalk.
    A push subscription's URL (markup here) is text, and it has no Close."""
    b, s = C.browser, C.server
    tube, other = "ui-clients", "ui-clients-wait"
    jid = s.put(tube, b"held by a worker")
    worker, waiter = Beanstalk(s.tcp_port), Beanstalk(s.tcp_port)
    try:
        worker.cmd("use %s\r\n" % tube)
        worker.cmd("watch %s\r\n" % tube)
        reply = worker.cmd("reserve-with-timeout 0\r\n")
        check_eq(reply.split()[:2], [b"RESERVED", str(jid).encode()], "the worker's reserve")
        worker.line()
        waiter.cmd("watch %s\r\n" % other)
        waiter.s.sendall(b"reserve-with-timeout 120\r\n")   # waits: no answer read
        peer = "127.0.0.1:%d" % worker.s.getsockname()[1]
        waiter_peer = "127.0.0.1:%d" % waiter.s.getsockname()[1]
        b.open(s, "/clients?protocol=beanstalk")
        b.heading("Clients")

        def row_of(p):
            for tr in b.all("table.clients tbody tr"):
                cells = [c.text for c in tr.find_elements(b.sel["By"].CSS_SELECTOR, "th, td")]
                if cells[2] == p:
                    return cells
            return None
        b.wait(lambda: row_of(peer) is not None, "the worker's row (peer %s)" % peer)
        b.wait(lambda: row_of(waiter_peer) and row_of(waiter_peer)[8].startswith("yes"), "the waiter waiting")
        cells = row_of(peer)
        client = int(cells[0])
        check_eq(cells[1], "beanstalk", "protocol")
        check_eq(cells[5], tube, "the tube used")
        check(tube in cells[6], "the tubes watched: %r" % cells[6])
        check_eq(cells[7], "1: %d" % jid, "the reserved job")
        check_eq(cells[8], "no", "the worker is not waiting")
        check(other in row_of(waiter_peer)[6], "the waiter watches %s" % other)
        no_markup_ran(b, "clients")
        # the reserved job's link, and back from the job page
        b.css('table.clients tr[data-id="%d"] a[href="#/jobs/%d"]' % (client, jid)).click()
        b.heading("Job %d" % jid)
        b.wait(lambda: b.fact("reserved_by") == "client %d" % client, "the job names its client")
        b.css('dd[data-key="reserved_by"] a').click()
        b.heading("Client %d" % client)
        b.wait(lambda: len(b.all('table.clients tbody tr[data-id="%d"]' % client)) == 1, "the client's row alone")
        check_eq(len(b.all("table.clients tbody tr")), 1, "one row")
        # close it, after a question
        dialog = b.css("#confirm-dialog")
        b.button("Close", 'table.clients tr[data-id="%d"]' % client).click()
        b.wait(lambda: dialog.get_attribute("open") is not None, "the confirmation")
        check("Close client %d (beanstalk, %s)? Its reserved job goes back to ready." % (client, peer) in dialog.text,
              "the question: %r" % dialog.text)
        b.button("Close client", "#confirm-dialog").click()
        b.wait(lambda: "Client %d closed." % client in b.notice(), "the close's message (%r)" % b.notice())
        worker.s.settimeout(WAIT)
        check_eq(worker.s.recv(100), b"", "the worker's connection closed by the server")
        check_eq(stats_job_state(s, jid), "ready", "the job ready again (stats-job)")
        b.wait(lambda: "There is no client %d now" % client in b.css("main").text, "the client gone from the view")
    finally:
        worker.close()
        waiter.close()
    s.api("DELETE", "/jobs/%d" % jid, want=204)
    # push subscriptions: their URL (one of them markup) as text, no Close
    b.open(s, "/clients?protocol=push")
    b.heading("Clients")
    b.wait(lambda: any(MARKUP_PATH in c.text for c in b.all("table.clients tbody td")), "the markup URL as text")
    no_markup_ran(b, "clients of push")
    check_eq(visible_buttons(b, "table.clients tbody"), [], "a push subscription cannot be closed")


def stats_job_state(s, jid):
    bs = Beanstalk(s.tcp_port)
    try:
        return bs.stats("stats-job %d" % jid)["state"]
    finally:
        bs.close()


def test_history_charts_and_tube_rates():
    """A page opened now shows the minutes before it: with one poll only
    (?poll=60000) the Puts chart already has the puts made before the page
    was opened (GET /stats/history), with its axes (x: 15 min ago to now;
    y: 0 to a round maximum per second); the tubes table and the tube view
    show the tube's put rate on their first poll."""
    b, s = C.browser, C.server
    tube = "ui-rates"
    for i in range(40):
        s.put(tube, b"r%d" % i)
    deadline = time.monotonic() + WAIT
    while max(s.api("GET", "/stats/history")["series"]["put"] or [0]) <= 0:
        check(time.monotonic() < deadline, "the server's history has no put")
        time.sleep(0.1)   # the server samples once a second: wait for a sample
    b.open(s, "/overview", poll=60000)
    b.heading("Overview")
    b.wait(lambda: "Connecting" not in b.css("#live").text, "the first poll")
    b.wait(lambda: peak(b, "Puts") > 0, "the puts before the page in its chart")
    fig = chart(b, "Puts")
    ticks = [e.text for e in fig.find_elements(b.sel["By"].CSS_SELECTOR, ".chart-x span")]
    check_eq(ticks, ["15 min ago", "10 min", "5 min", "now"], "the x axis")
    top = fig.find_element(b.sel["By"].CSS_SELECTOR, ".chart-ymax").text
    check(re.fullmatch(r"[0-9.,]+/s", top) and float(top[:-2].replace(",", "")) >= peak(b, "Puts"),
          "the y axis' top %r above the peak %r" % (top, peak(b, "Puts")))
    check("per second" in fig.text, "the unit named: %r" % fig.text)
    check(len(fig.find_element(b.sel["By"].CSS_SELECTOR, "polyline").get_attribute("points").split()) > 1,
          "a line of more than one point")
    # per-tube rates at once
    b.open(s, "/tubes?filter=%s" % tube, poll=60000)
    b.wait(lambda: b.css("table.tubes tbody tr th a").text == tube, "the tube's row")
    cells = lambda: [c.text for c in b.all("table.tubes tbody tr td")]
    b.wait(lambda: cells()[6].endswith("/s") and cells()[6] != "0/s", "a put rate on the first poll (%r)" % cells())
    b.open(s, "/tubes/" + tube, poll=60000)
    b.heading("Tube " + tube)
    b.wait(lambda: str(b.fact("put_rate")).endswith("/s"), "the tube's put rate on the first poll")


def test_hex_view_fits_the_screen():
    """A binary body's hex view has as many bytes a line as its box fits: 16
    at 1280 px on the job page, fewer at 375 px, and never runs out of its
    box or the page; in the jobs table too."""
    b, s = C.browser, C.server
    tube = "ui-hex"
    bs = Beanstalk(s.tcp_port)
    try:
        jid = bs.put(tube, bytes(range(256)) * 2)
    finally:
        bs.close()
    pre = "main pre.body.hex"
    fits = "const p = document.querySelector(arguments[0]); return [p.scrollWidth, p.clientWidth, " \
           "+p.dataset.perRow, document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    try:
        for width, rows in ((1280, {16}), (375, {4, 8})):
            b.d.set_window_size(width, 900)
            b.open(s, "/jobs/%d" % jid)
            b.heading("Job %d" % jid)
            b.wait(lambda: b.all(pre), "the hex view (a binary body opens as hex)")
            got = b.wait(lambda: b.js(fits, pre) if b.js(fits, pre)[2] else None, "the hex laid out")
            check(got[0] <= got[1], "at %d px the hex runs out of its box: %r" % (width, got))
            check(got[2] in rows, "at %d px, %d bytes a line" % (width, got[2]))
            check(got[3] <= got[4], "at %d px the page is wider than the screen: %r" % (width, got))
        b.d.set_window_size(1280, 900)
        open_jobs(b, s, tube, "ready")
        b.wait(lambda: job_rows(b) == [jid], "the job's row")
        b.button("Body", 'table.jobs tr[data-id="%d"]' % jid).click()
        inner = "table.jobs tr.body-row pre.body.hex"
        b.wait(lambda: b.all(inner) and b.js(fits, inner)[2] > 0, "the hex in the jobs table")
        got = b.js(fits, inner)
        check(got[0] <= got[1] and got[2] == 16, "the jobs table's hex: %r" % got)
    finally:
        b.d.set_window_size(1280, 900)
    s.api("DELETE", "/jobs/%d" % jid, want=204)


def test_token_prompt():
    """With bearer tokens on, the page (which needs none) asks for one: a
    wrong token is refused and asked again; the right one shows the
    overview and is kept in sessionStorage only; Escape closes the prompt,
    and the page offers it again."""
    b = C.browser
    s = Server(C.binary, env={"BEANGATE_HTTP_TOKENS": TOKEN}).start()
    try:
        b.open(s, "/overview")
        dialog = b.css("#token-dialog")
        b.wait(lambda: dialog.get_attribute("open") is not None, "the token prompt")
        check_eq(b.d.switch_to.active_element.get_attribute("id"), "token-input", "focus in the token field")
        b.type_into("#token-input", "not-the-token").send_keys(b.sel["Keys"].ENTER)
        b.wait(lambda: "refused" in b.css("#token-msg").text and dialog.get_attribute("open") is not None,
               "the wrong token refused")
        check_eq(b.js("return sessionStorage.getItem('beangate-token')"), None, "a refused token is not kept")
        b.type_into("#token-input", TOKEN).send_keys(b.sel["Keys"].ENTER)
        b.wait(lambda: dialog.get_attribute("open") is None, "the prompt closed")
        version = s.api("GET", "/stats", token=TOKEN)["version"]
        b.wait(lambda: b.fact("version") == version, "the overview with the token")
        check_eq(b.js("return sessionStorage.getItem('beangate-token')"), TOKEN, "the token in sessionStorage")
        check_eq(b.js("return localStorage.length + document.cookie.length"), 0, "no token elsewhere")
        # a new load in the same tab keeps it; forgetting it asks again
        b.open(s, "/tubes")
        b.wait(lambda: b.css("table.tubes caption").text.startswith("Tubes 1–"), "the tubes with the kept token")
        b.button("Forget token").click()
        b.wait(lambda: dialog.get_attribute("open") is not None, "the prompt after forgetting the token")
        b.d.switch_to.active_element.send_keys(b.sel["Keys"].ESCAPE)
        b.wait(lambda: dialog.get_attribute("open") is None, "Escape closes the prompt")
        b.heading("A token is needed")
        b.button("Enter a token").click()
        b.wait(lambda: dialog.get_attribute("open") is not None, "the prompt offered again")
        b.type_into("#token-input", TOKEN).send_keys(b.sel["Keys"].ENTER)
        b.heading("Tubes")   # the view of the address, now with the token
    finally:
        b.js("sessionStorage.clear()")
        b.open(C.server, "/overview")   # away from the server about to stop
        s.stop()


def visible_buttons(b, within):
    """The texts of the buttons shown inside the element of a selector (the
    body viewer's mode buttons left out)."""
    return sorted(e.text for e in b.css(within).find_elements(b.sel["By"].CSS_SELECTOR, "button:not(.seg)")
                  if e.is_displayed())


def test_scoped_token_sees_no_actions():
    """Issue 23: a read-only token (read:*) sees a tube, its next buried job,
    its jobs table, a job and the clients, with no action: no Actions card,
    no kick, delete or bulk buttons, no Close; the unscoped token of the same
    server sees them all. A token that may produce but not manage sees only
    the put form, and is told that it may not see the clients."""
    b = C.browser
    reader, producer, unscoped = "ui-reader-3e0a51c9d2", "ui-producer-a7d4e0b615", "ui-all-62f0c8b3e9"
    with tempfile.NamedTemporaryFile("w", prefix="beangate-ui-tokens-", delete=False) as f:
        f.write("%s read:*\n%s produce,read:ui-scoped\n%s\n" % (reader, producer, unscoped))
    os.chmod(f.name, 0o600)
    s = Server(C.binary, args=["--http-token-file", f.name]).start()
    tube = "ui-scoped"
    watcher = None
    try:
        watcher = Beanstalk(s.tcp_port)   # a client to list
        bs = Beanstalk(s.tcp_port)
        try:
            bs.put(tube, b"kept")
            job = bs.reserve_and_bury(tube)
        finally:
            bs.close()
        buried = 'article[aria-label="Oldest buried"]'
        for token, actions, peek_buttons, job_buttons in (
                (reader, None, [], []),
                (producer, ["Put job"], [], []),
                (unscoped, ["Kick", "Pause", "Put job", "Unpause"], ["Delete this job", "Kick this job"],
                 ["Delete", "Kick"])):
            b.open(s, "/tubes/" + tube)
            b.js("sessionStorage.setItem('beangate-token', arguments[0])", token)
            b.d.refresh()   # a fresh page with this token
            b.heading("Tube " + tube)
            b.wait_fact("buried", 1)
            b.wait(lambda: b.css(buried).find_element(b.sel["By"].CSS_SELECTOR, 'dd[data-key="id"]').text
                   == str(job), "the buried job in its panel")
            card = b.css('section[aria-label="Actions"]')
            if actions is None:
                b.wait(lambda: not card.is_displayed(), "no Actions card for %s" % token)
            else:
                b.wait(lambda: visible_buttons(b, 'section[aria-label="Actions"]') == actions,
                       "the actions of %s: %r" % (token, actions))
            b.wait(lambda: visible_buttons(b, buried) == peek_buttons,
                   "the buried job's buttons for %s: %r" % (token, peek_buttons))
            b.open(s, "/jobs/%d" % job)
            b.wait_fact("state", "buried")
            b.wait(lambda: visible_buttons(b, 'section[aria-label="Statistics"]') == job_buttons,
                   "the job's buttons for %s: %r" % (token, job_buttons))
            # the jobs table: bulk and row actions only for manage
            open_jobs(b, s, tube, "buried")
            b.wait(lambda: job_rows(b) == [job], "the buried job in the table")
            bulk = ["Delete all buried", "Kick all buried"] if job_buttons else []
            b.wait(lambda: sorted(e.text for e in b.all(".bulk button") if e.is_displayed()) == bulk,
                   "the bulk actions of %s: %r" % (token, bulk))
            b.wait(lambda: visible_buttons(b, "table.jobs tbody") == sorted(["Body"] + job_buttons),
                   "the row's buttons for %s" % token)
            # clients: read:* sees them (Close needs manage:*), a token without read:* is told so
            b.open(s, "/clients?protocol=beanstalk")
            b.heading("Clients")
            if token == producer:
                b.wait(lambda: "may not see the clients" in b.css("main").text, "the producer told it may not see clients")
            else:
                b.wait(lambda: len(b.all("table.clients tbody tr")) == 1, "the open connection's row for %s" % token)
                b.wait(lambda: visible_buttons(b, "table.clients tbody") == (["Close"] if job_buttons else []),
                       "Close for %s" % token)
    finally:
        if watcher:
            watcher.close()
        b.js("sessionStorage.clear()")
        b.open(C.server, "/overview")   # away from the server about to stop
        s.stop()
        os.unlink(f.name)


def test_keyboard():
    """Tab order: skip link, brand, the views, then the page; Enter follows
    a link; the focused element has a visible outline; Space presses a
    button."""
    b, s = C.browser, C.server
    b.d.get("about:blank")   # a new load: focus starts at the top (a hash change would keep it)
    b.open(s, "/overview")
    b.heading("Overview")
    keys = b.sel["Keys"]
    order = []
    for _ in range(5):
        b.sel["ActionChains"](b.d).send_keys(keys.TAB).perform()
        order.append(b.d.switch_to.active_element.text.strip())
    check_eq(order, ["Skip to content", "beangate", "Overview", "Tubes", "Clients"], "tab order of the header")
    b.sel["ActionChains"](b.d).key_down(keys.SHIFT).send_keys(keys.TAB).key_up(keys.SHIFT).perform()
    tubes = b.d.switch_to.active_element
    check_eq(tubes.text.strip(), "Tubes", "Shift+Tab goes back")
    style = b.js("const s = getComputedStyle(arguments[0]); return [s.outlineStyle, parseFloat(s.outlineWidth)]", tubes)
    check(style[0] != "none" and style[1] >= 2, "the focused link's outline: %r" % style)
    tubes.send_keys(keys.ENTER)
    b.heading("Tubes")
    check_eq(b.css('.nav a[aria-current="page"]').text, "Tubes", "the current view marked")


def relative_luminance_js():
    return r"""
      function lum(c) {
        const [r, g, b] = c.map(v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
        return 0.2126 * r + 0.7152 * g + 0.0722 * b;
      }
      function rgba(s) { const m = s.match(/[\d.]+/g).map(Number); return m.length === 3 ? m.concat([1]) : m; }
      function background(el) {
        for (; el; el = el.parentElement) {
          const c = rgba(getComputedStyle(el).backgroundColor);
          if (c[3] > 0.99) return c.slice(0, 3);
        }
        return [255, 255, 255];
      }
      const bad = [];
      const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
      for (let n = walker.nextNode(); n; n = walker.nextNode()) {
        const el = n.parentElement;
        if (!n.textContent.trim() || !el || !el.getClientRects().length) continue;
        const cs = getComputedStyle(el);
        if (cs.visibility === "hidden" || el.closest("[hidden], dialog:not([open])")) continue;
        const fg = rgba(cs.color).slice(0, 3), bg = background(el);
        const [a, b] = [lum(fg), lum(bg)].sort((x, y) => y - x);
        const ratio = (a + 0.05) / (b + 0.05);
        const size = parseFloat(cs.fontSize), bold = parseInt(cs.fontWeight, 10) >= 700;
        const need = size >= 24 || (bold && size >= 18.66) ? 3 : 4.5;
        if (ratio < need) bad.push(n.textContent.trim().slice(0, 30) + " " + ratio.toFixed(2) + " < " + need);
      }
      return bad;"""


# Open in browser b each view a page-wide check walks (overview, tubes, the
# tube's view, its jobs, clients, subscriptions, then each job of job_ids),
# wait for its first poll, and yield its path.
def opened_views(b, s, tube, job_ids):
    views = [("/overview", "Overview"), ("/tubes", "Tubes"), ("/tubes/" + tube, "Tube " + tube),
             ("/tubes/%s/jobs?state=ready" % tube, "Jobs of tube " + tube), ("/clients", "Clients"),
             ("/subscriptions", "Subscriptions")] + [("/jobs/%d" % j, "Job %d" % j) for j in job_ids]
    for path, heading in views:
        b.open(s, path)
        b.heading(heading)
        b.wait(lambda: "Connecting" not in b.css("#live").text, "the first poll")
        yield path


def buried_by_push(s):
    """A job of ui-push-fail, buried after its one attempt got a 500: its
    view shows a last delivery error."""
    jid = s.put("ui-push-fail", b"fails")
    deadline = time.monotonic() + WAIT
    while s.api("GET", "/jobs/%d" % jid)["state"] != "buried":
        check(time.monotonic() < deadline, "job %d not buried by push" % jid)
        time.sleep(0.05)   # push delivery works on its own: poll its result
    return jid


def test_contrast():
    """Every visible text of every view has at least WCAG AA contrast with
    what is behind it (4.5:1; 3:1 for large text), disabled buttons
    included."""
    b, s = C.browser, C.server
    tube = "ui-contrast"
    jid = s.put(tube, b'{"a": 1}')
    s.put(tube, b"later", delay=600)
    failed = buried_by_push(s)
    for path in opened_views(b, s, tube, (failed, jid)):
        bad = b.js(relative_luminance_js())
        check_eq(bad, [], "texts below AA contrast on %s" % path)
    b.button("Delete").click()   # the job view's
    b.wait(lambda: b.css("#confirm-dialog").get_attribute("open") is not None, "the dialog")
    check_eq(b.js(relative_luminance_js()), [], "texts below AA contrast in the dialog")
    b.d.switch_to.active_element.send_keys(b.sel["Keys"].ESCAPE)


def test_phone_width():
    """At 390 px no view is wider than the screen (the tubes table scrolls
    in its own box)."""
    b, s = C.browser, C.server
    tube = "ui-phone"
    jid = s.put(tube, b"x" * 300)
    failed = buried_by_push(s)
    b.d.set_window_size(390, 844)
    try:
        for path in opened_views(b, s, tube, (failed, jid)):
            widths = b.js("return [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
            check(widths[0] <= widths[1], "%s at 390 px: page %d px wide, screen %d" % (path, widths[0], widths[1]))
    finally:
        b.d.set_window_size(1280, 900)


def test_screenshots():
    """Each view at 390 and 1280 px, saved as test artifacts."""
    b, s = C.browser, C.server
    tube = "emails"
    ids = [s.put(tube, json.dumps({"to": "user%d@example.com" % i, "template": "welcome"}).encode())
           for i in range(3)]
    s.put(tube, b"reminder in an hour", delay=3600)
    os.makedirs(C.artifacts, exist_ok=True)
    views = (("overview", "/overview", "Overview"), ("tubes", "/tubes", "Tubes"),
             ("tube", "/tubes/" + tube, "Tube " + tube), ("job", "/jobs/%d" % ids[0], "Job %d" % ids[0]),
             ("tube-jobs", "/tubes/%s/jobs?state=ready" % tube, "Jobs of tube " + tube),
             ("clients", "/clients", "Clients"))
    for name, path, heading in views:
        for width in WIDTHS:
            b.d.set_window_size(width, 900)
            b.open(s, path)
            b.heading(heading)
            b.wait(lambda: "Connecting" not in b.css("#live").text and "…" not in b.css("main").text, "%s filled in" % name)
            path_png = os.path.join(C.artifacts, "%s-%d.png" % (name, width))
            b.screenshot(path_png, width)
            check(os.path.getsize(path_png) > 5000, "screenshot %s" % path_png)
    print("  screenshots in %s" % C.artifacts, flush=True)


def test_server_memory_steady():
    """A page left open must not grow the server: the tubes view polled
    every 100 ms (ten times the normal rate) by a fresh server with 200
    tubes; its RSS after 300 requests and after 1000 more differ by less
    than 512 KiB. Under ASan the polling runs all the same, but RSS is not
    compared (freed memory waits in ASan's quarantine, up to 256 MiB; the
    leak check at exit covers that build)."""
    b = C.browser
    s = Server(C.binary).start()
    try:
        for i in range(200):
            s.put("mem-%03d" % i, b"x")
        b.open(s, "/tubes", poll=100)
        b.heading("Tubes")

        def served(n, what):
            deadline = time.monotonic() + 120
            while s.requests_served() < n:
                check(time.monotonic() < deadline, "%s: only %d requests served" % (what, s.requests_served()))
                time.sleep(0.2)   # the page polls on its own: check its progress now and then
        served(300, "warm-up")
        start = s.rss_kib()
        served(s.requests_served() + 1000, "the run")
        end = s.rss_kib()
        print("  server RSS %d KiB -> %d KiB over 1000 requests" % (start, end), flush=True)
        if not C.sanitized:
            check(end - start < 512, "RSS grew by %d KiB (limit 512)" % (end - start))
    finally:
        b.open(C.server, "/overview")
        s.stop()


class OtherOrigin:
    """A page of another origin (http://127.0.0.1:PORT/, a blank page from
    a threaded http.server), to call the gateway from as a web app would."""

    def __enter__(self):
        import http.server
        import threading

        class Page(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                page = b"<!doctype html><title>another app</title><p>another origin</p>"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

            def log_message(self, *args):
                pass
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
        self.httpd.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


# Put, reserve raw and delete with the token header, from the page on screen:
# what each step answered, or the error that stopped it.
CALL_FROM_PAGE = r"""
const [base, token, tube, done] = arguments;
(async () => {
  const out = {};
  try {
    const auth = token ? {Authorization: "Bearer " + token} : {};
    const put = await fetch(base + "/tubes/" + tube + "/jobs", {method: "POST", headers: auth, body: "from another origin"});
    out.put = put.status; out.location = put.headers.get("Location");
    const res = await fetch(base + "/tubes/" + tube + "/reservations",
                            {method: "POST", headers: {...auth, Accept: "application/octet-stream"}});
    out.reserve = res.status; out.id = res.headers.get("X-Job-Id"); out.token = res.headers.get("X-Reservation");
    out.body = await res.text();
    const del = await fetch(base + "/jobs/" + out.id, {method: "DELETE", headers: {...auth, "X-Reservation": out.token}});
    out.delete = del.status;
  } catch (e) {
    out.error = String(e);
  }
  done(out);
})();"""


def test_cors_from_another_origin():
    """A page of another origin calls the gateway in a real browser: with
    its origin in --http-cors-origins (and a bearer token) the preflights
    pass and it puts, reserves raw (reading X-Job-Id and X-Reservation) and
    deletes with the token header; a server that lists another origin, or
    none (the default), gives the page nothing to read."""
    b = C.browser
    b.collect_logs()
    with OtherOrigin() as page:
        allowed = Server(C.binary, ["--http-cors-origins", page.url], env={"BEANGATE_HTTP_TOKENS": TOKEN}).start()
        other = Server(C.binary, ["--http-cors-origins", "https://app.example.com"]).start()
        try:
            b.d.get(page.url + "/")
            got = b.d.execute_async_script(CALL_FROM_PAGE, allowed.url, TOKEN, "cors-ui")
            check_eq(got.get("error"), None, "the calls from %s: %r" % (page.url, got))
            check_eq((got["put"], got["reserve"], got["body"], got["delete"]), (201, 200, "from another origin", 204),
                     "put, reserve, body, delete from the page")
            check_eq(got["location"], "/jobs/%s" % got["id"], "Location read by the page")
            check(got["token"], "X-Reservation read by the page: %r" % got)
            allowed.api("GET", "/tubes/cors-ui", want=404, token=TOKEN)   # the job deleted, the tube gone
            for server, why in ((other, "another origin listed"), (C.server, "CORS off")):
                got = b.d.execute_async_script(CALL_FROM_PAGE, server.url, "", "cors-ui")
                check("error" in got and "fetch" in got["error"].lower(),
                      "%s: the page read an answer: %r" % (why, got))
        finally:
            b.d.get_log("browser")   # the refused calls above are logged as errors: expected
            b.open(C.server, "/overview")
            allowed.stop()
            other.stop()

def test_no_policy_violations_or_script_errors():
    """Over every test above, the browser logged no Content-Security-Policy
    violation and no script error; the only failed loads are the 404s of
    absent jobs, the 401s of the token test and the 403s of a token that may
    not list clients."""
    b = C.browser
    b.collect_logs()
    bad = []
    for e in b.logs:
        msg = e.get("message", "")
        if re.search(r"Failed to load resource: the server responded with a status of (401|403|404)", msg):
            continue
        if e.get("level") in ("SEVERE", "WARNING") or "Content Security Policy" in msg or "Refused" in msg:
            bad.append("%s %s" % (e.get("level"), msg[:300]))
    check_eq(bad, [], "browser console errors")


TESTS = [
    test_no_html_sinks_in_the_sources,
    test_page_loads_under_its_policy,
    test_overview_counts_follow_tcp_and_http,
    test_tubes_table_pages_sort_filter,
    test_tube_kick_pause_unpause,
    test_delete_asks_first,
    test_put_from_the_form,
    test_tubes_named_dot_and_dot_dot,
    test_bodies_with_markup_are_text,
    test_subscriptions_view,
    test_tube_jobs_paged_by_state,
    test_bulk_actions_confirm_with_count,
    test_clients_view_and_close,
    test_history_charts_and_tube_rates,
    test_hex_view_fits_the_screen,
    test_token_prompt,
    test_scoped_token_sees_no_actions,
    test_keyboard,
    test_contrast,
    test_phone_width,
    test_screenshots,
    test_server_memory_steady,
    test_cors_from_another_origin,
    test_no_policy_violations_or_script_errors,   # last: reads the whole log
]


def main(argv):
    if len(argv) != 2:
        print("usage: %s PATH/TO/beangate" % argv[0], file=sys.stderr)
        return 2
    C.binary = os.path.abspath(argv[1])
    if not os.access(C.binary, os.X_OK):
        print("not an executable: %s" % C.binary, file=sys.stderr)
        return 2
    sel, why = load_selenium()
    paths, why2 = find_browser()
    if not sel or not paths:
        print("SKIP ui: %s" % (why or why2), flush=True)
        print("ui: 0 passed, 0 failed, 1 skipped", flush=True)
        return SKIP_EXIT
    build = os.path.dirname(C.binary)
    C.artifacts = os.path.join(build, "test-artifacts", "ui")
    cache = os.path.join(build, "CMakeCache.txt")
    C.sanitized = os.path.exists(cache) and "BEANGATE_SANITIZE:BOOL=ON" in open(cache).read()
    only = set(os.environ.get("BEANGATE_UI_ONLY", "").split()) or None
    passed = failed = 0
    t_all = time.monotonic()
    try:
        C.receiver = Receiver(held_or_500)
        C.server = Server(C.binary, push_args(C.receiver)).start()
        C.browser = Browser(sel, *paths)
    except Exception as e:
        print("FAIL setup: %s: %s" % (type(e).__name__, e), flush=True)
        print("ui: 0 passed, 1 failed", flush=True)
        return 1
    try:
        for fn in TESTS:
            if only and fn.__name__ not in only:
                continue
            t0 = time.monotonic()
            try:
                fn()
            except AssertionError as e:
                failed += 1
                print("FAIL %s: %s" % (fn.__name__, e), flush=True)
                try:
                    C.browser.d.save_screenshot(os.path.join(tempfile.gettempdir(), "beangate-ui-%s.png" % fn.__name__))
                except Exception:
                    pass
                continue
            except Exception as e:   # a broken test, or WebDriver gave up
                failed += 1
                print("FAIL %s: %s: %s" % (fn.__name__, type(e).__name__, str(e)[:1500]), flush=True)
                continue
            passed += 1
            print("PASS %s (%.1f s)" % (fn.__name__, time.monotonic() - t0), flush=True)
    finally:
        C.browser.quit()
        C.receiver.close()
        try:
            C.server.stop()
            passed += 1
            print("PASS server_stops_cleanly", flush=True)
        except AssertionError as e:
            failed += 1
            print("FAIL server_stops_cleanly: %s" % e, flush=True)
    print("total time %.1f s" % (time.monotonic() - t_all), flush=True)
    print("ui: %d passed, %d failed" % (passed, failed), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
