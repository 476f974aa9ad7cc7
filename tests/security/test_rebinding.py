#!/usr/bin/env python3
"""DNS rebinding against the HTTP gateway, in headless Chromium
(docs/security.md, "DNS rebinding"). A page of attacker.example whose name
the attacker points at 127.0.0.1 is of the origin
http://attacker.example:PORT: the browser lets its scripts read the
answers of that origin, which is now the gateway. Chromium's
--host-resolver-rules plays the rebound DNS. The gateway, on loopback,
must answer such requests 421 (their Host names attacker.example): no
dashboard, no job body, no delete. The gateway's own names keep working.

Usage: test_rebinding.py BINARY; exits 77 (skipped) without Chromium.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from browserlib import ATTACKER, Server, run  # noqa: E402
from testlib import check, check_eq  # noqa: E402


def test_rebound_page_gets_nothing(browser, attacker):
    """A page at attacker.example:PORT, rebound to the gateway: the
    dashboard, /stats, a job's body and a delete all get 421."""
    srv = Server().start()
    try:
        jid = srv.put("secrets", b"the secret body")
        rebound = "http://%s:%d" % (ATTACKER, srv.http_port)
        browser.open(rebound + "/ui/")
        check("421" in browser.d.page_source or "HOST_NOT_ALLOWED" in browser.d.page_source,
              "the dashboard loaded under %s: %r" % (rebound, browser.d.page_source[:300]))
        for method, path in (("GET", "/stats"), ("GET", "/jobs/%d/body" % jid), ("GET", "/ui/app.js"),
                             ("DELETE", "/jobs/%d" % jid)):
            got = browser.fetch(rebound + path, {"method": method})
            check_eq(got.get("status"), 421, "%s %s from the rebound page: %r" % (method, path, got))
            check("the secret body" not in got.get("body", ""), "the body leaked: %r" % got)
        check_eq(srv.get("/jobs/%d/body" % jid)[2], b"the secret body", "the job after the attack")
    finally:
        srv.stop()


def test_own_names_and_allowed_hosts_work(browser, attacker):
    """The gateway's own names (127.0.0.1, localhost) serve the dashboard
    and the API to the browser; a name given in --http-allowed-hosts does
    too (an operator's choice)."""
    srv = Server(["--http-allowed-hosts", ATTACKER]).start()
    try:
        jid = srv.put("mine", b"body")
        for base in ("http://127.0.0.1:%d" % srv.http_port, "http://localhost:%d" % srv.http_port,
                     "http://%s:%d" % (ATTACKER, srv.http_port)):
            browser.open(base + "/ui/")
            got = browser.fetch(base + "/jobs/%d" % jid, {"method": "GET"})
            check_eq(got.get("status"), 200, "GET a job from %s: %r" % (base, got))
    finally:
        srv.stop()
    srv = Server().start()
    try:
        base = "http://localhost:%d" % srv.http_port
        browser.open(base + "/ui/")
        check("<title>" in browser.d.page_source, "the dashboard at %s: %r" % (base, browser.d.page_source[:300]))
        jid = srv.put("mine", b"body")
        got = browser.fetch(base + "/jobs/%d" % jid, {"method": "DELETE"})
        check_eq(got.get("status"), 204, "the dashboard's own delete: %r" % got)
    finally:
        srv.stop()


TESTS = [test_rebound_page_gets_nothing, test_own_names_and_allowed_hosts_work]

if __name__ == "__main__":
    sys.exit(run("rebinding", __doc__, TESTS, sys.argv, globals()))
