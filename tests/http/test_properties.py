#!/usr/bin/env python3
"""Property-based tests of the HTTP API from openapi/openapi.yaml: requests
generated for every operation of the document, sent to a real beangate.

Usage:
  python3 tests/http/test_properties.py build/beangate [--seed N] [-k NAME]

For each operation (path and method) Hypothesis draws requests from the
document's parameter and body schemas: valid values, values out of range
(integers past 2^32, 2^63 and 2^64, negative ones), odd strings (empty,
"..", NUL, non-ASCII, 300 bytes), parameters the document does not know,
and broken bodies. Every answer must keep the promises of the document:
  - no 5xx, and the server is alive and stops cleanly at the end (with no
    sanitizer report: ctest runs this in the ASan build too);
  - the status is one the document declares for that operation;
  - the Content-Type is one it declares for that status, and the body
    validates (jsonschema, draft 2020-12) against its schema: JSON and
    problem+json parsed as JSON, application/yaml as YAML; no body where
    none is declared (HEAD, 204, 304, or a response without content).
Hypothesis shrinks a failure to a small request and prints it.

Seeded and bounded: the seed is 22 unless --seed N or BEANGATE_TEST_SEED=N
gives another; BEANGATE_PROPERTY_EXAMPLES=N draws N requests per operation
(default 48, about 2,200 requests in all). Long-poll timeouts are drawn
from 0 and 1 only, under --http-max-wait 1, so the run stays short.
Further tests pin down what such runs found (each failed before its fix).

Needs python3-hypothesis, python3-jsonschema and python3-yaml (Debian;
another python3 finds them in /usr/lib/python3/dist-packages too); exits
77 (skipped) without them.
"""

import http.client
import json
import os
import re
import signal
import shutil
import sys
import tempfile
import time
import traceback
import urllib.parse
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))
import testlib  # noqa: E402
from testlib import check, check_eq, clean_env, free_port, port_open  # noqa: E402

SPEC_PATH = os.path.join(REPO, "openapi", "openapi.yaml")
DEFAULT_SEED = 22
DEFAULT_EXAMPLES = 48
SKIP_EXIT = 77
START_TIMEOUT = 15.0
STOP_TIMEOUT = 10.0
HTTP_TIMEOUT = 10.0
METHODS = ("get", "head", "post", "put", "delete", "patch", "options")
# Strings that have broken parsers before: numbers in other spellings and past
# every integer type, path tricks, NUL, control and non-ASCII characters.
ODD_STRINGS = ["", " ", "0", "-0", "-1", "+1", "01", "1.5", "1e3", "0x10", "1 ", " 1", "NaN", "null", "[]",
               str(2**32), str(2**32 - 1), str(2**63 - 1), str(2**63), str(2**64 - 1), str(2**64),
               str(-2**63 - 1), "9" * 40, ".", "..", "a/b", "%", "%2F", "%00", "\x00", "\x7f", "\u00e9",
               "\u202e", "\U0001f600", "x" * 300, "-tube", "tube name", "a,b", ",", "a,,b"]
HUGE_INTEGERS = [2**31, 2**32, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 10**30, -1, -2**63 - 1]
POOL_TUBES = ["emails", ".", "..", "a-b", "t_1"]   # filled with jobs before the run


def import_debian(name):
    """Module name, looked for in Debian's /usr/lib/python3/dist-packages too
    (another python3, pyenv or a virtualenv, does not search it); None if absent."""
    try:
        return __import__(name)
    except ImportError:
        if "/usr/lib/python3/dist-packages" not in sys.path:
            sys.path.append("/usr/lib/python3/dist-packages")
        try:
            return __import__(name)
        except ImportError:
            return None


yaml, hypothesis, jsonschema = (import_debian(n) for n in ("yaml", "hypothesis", "jsonschema"))
_missing = ["python3-" + n for n, m in (("yaml", yaml), ("hypothesis", hypothesis), ("jsonschema", jsonschema))
            if m is None]
if hypothesis:
    import hypothesis.configuration
    from hypothesis import strategies as st


class C:
    """The suite's state: the server, the document, what the run saw."""
    binary = None
    seed = DEFAULT_SEED
    examples = DEFAULT_EXAMPLES
    server = None
    doc = None
    tokens = []    # reservation tokens of the fixture jobs
    requests = 0
    operations = set()
    statuses = {}  # status: how many answers had it


# ---- the server ------------------------------------------------------------------

class Server(testlib.ServerProcess):
    """beangate on free loopback ports, long-polls capped at 1 s, with a push
    subscription (so /subscriptions has one to show)."""

    def start(self):
        for _ in range(3):
            self.tcp_port, self.http_port = free_port(), free_port()
            self.spawn([C.binary, "-l", "127.0.0.1", "-p", str(self.tcp_port), "--http-listen", "127.0.0.1",
                        "--http-port", str(self.http_port), "--http-max-wait", "1",
                        "--push", "tube=props-push url=http://127.0.0.1:1/ attempts=1"], env=clean_env())
            status = testlib.wait_ready(self.proc, lambda: port_open(self.http_port), START_TIMEOUT)
            if status == "ok":
                return self
            self.kill()
            if not testlib.port_taken(self.stderr()):
                break
        raise AssertionError("beangate did not start: %s" % self.stderr()[-2000:])

    def request(self, method, target, headers=None, body=None):
        """(status, {lower-case header: value}, body bytes) of one request on a new connection."""
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=HTTP_TIMEOUT)
        try:
            conn.request(method, target, body=body, headers=headers or {})
            r = conn.getresponse()
            data = r.read()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, data
        finally:
            conn.close()


# ---- the document ----------------------------------------------------------------

def deref(node):
    """node with a local $ref ("#/a/b") replaced by its target, repeatedly; the
    target's siblings of the $ref (a description) are dropped."""
    while isinstance(node, dict) and "$ref" in node:
        target = C.doc
        for part in node["$ref"].lstrip("#/").split("/"):
            target = target[part.replace("~1", "/").replace("~0", "~")]
        node = target
    return node


def operations():
    """[(path, method, operation, parameters)] of the document, the path's own
    parameters merged with the operation's."""
    ops = []
    for path, item in C.doc["paths"].items():
        shared = [deref(p) for p in item.get("parameters", [])]
        for method in METHODS:
            if method in item:
                op = item[method]
                own = [deref(p) for p in op.get("parameters", [])]
                names = {(p["name"], p["in"]) for p in own}
                params = own + [p for p in shared if (p["name"], p["in"]) not in names]
                ops.append((path, method.upper(), op, params))
    return ops


# ---- strategies ------------------------------------------------------------------

def from_schema(schema):
    """A strategy of values valid for a JSON schema (the subset the document uses)."""
    schema = deref(schema)
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "oneOf" in schema or "anyOf" in schema:
        base = {k: v for k, v in schema.items() if k not in ("oneOf", "anyOf")}
        choices = []
        for alt in schema.get("oneOf", []) + schema.get("anyOf", []):
            alt = deref(alt)
            merged = dict(base, **{k: v for k, v in alt.items() if k != "required"})
            merged["required"] = base.get("required", []) + alt.get("required", [])
            choices.append(from_schema(merged))
        return st.one_of(choices)
    kind = schema.get("type")
    if kind == "integer":
        return st.integers(schema.get("minimum"), schema.get("maximum"))
    if kind == "boolean":
        return st.booleans()
    if kind == "string":
        if "pattern" in schema:
            low, high = schema.get("minLength", 0), schema.get("maxLength", 40)
            return st.from_regex(schema["pattern"], fullmatch=True).filter(lambda s: low <= len(s) <= high)
        return st.text(min_size=schema.get("minLength", 0), max_size=min(schema.get("maxLength", 40), 40))
    if kind == "array":
        return st.lists(from_schema(schema["items"]), min_size=schema.get("minItems", 0),
                        max_size=min(schema.get("maxItems", 5), 5))
    if kind == "object" or "properties" in schema:
        props = schema.get("properties", {})
        required = [k for k in schema.get("required", []) if k in props]
        optional = {k: from_schema(v) for k, v in props.items() if k not in required}
        return st.fixed_dictionaries({k: from_schema(props[k]) for k in required}, optional=optional)
    return st.text(max_size=20)


def odd_value():
    """A strategy of values a parameter's schema does not allow (or just barely does)."""
    return st.one_of(st.sampled_from(ODD_STRINGS), st.sampled_from(HUGE_INTEGERS),
                     st.text(max_size=30), st.integers())


def parameter_value(param, odd=True):
    """A strategy of a parameter's value: from its schema, a sample of the
    fixture's names and ids where they make a hit likely, or (odd) an odd value.
    Long-poll timeouts are 0 or 1 (any longer wait is cut to 1 s anyway)."""
    name, schema = param["name"], deref(param.get("schema", {}))
    valid = from_schema(schema)
    if name == "tube":
        valid = st.one_of(st.sampled_from(POOL_TUBES), valid)
    elif name == "tubes":
        valid = st.one_of(st.lists(st.sampled_from(POOL_TUBES), min_size=1, max_size=3), valid)
    elif name == "id":
        valid = st.one_of(st.integers(0, 80), valid)
    elif name == "timeout":
        valid = st.sampled_from([0, 0, 0, 0, 0, 1])
    elif name in ("reservation", "X-Reservation") and C.tokens:
        valid = st.one_of(st.sampled_from(C.tokens), valid)
    elif name == "asset":
        valid = st.one_of(st.sampled_from(["index.html", "app.js", "style.css", "favicon.svg"]), valid)
    value = st.one_of(valid, valid, odd_value()) if odd else valid
    if param["in"] == "path":   # an empty segment makes another path, not a value of this one
        value = value.filter(lambda v: v != "")
    return value


def as_text(value):
    """A parameter's value as the string that goes on the wire (form style:
    arrays comma-separated)."""
    if isinstance(value, list):
        return ",".join(as_text(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def path_segment(text):
    """A path parameter as one segment: percent-encoded, dots-only names
    written %2E (a client library may drop a literal ".." segment)."""
    if text and set(text) == {"."}:
        return "%2E" * len(text)
    return urllib.parse.quote(text, safe="")


def header_safe(text):
    """Can text go in a header value (http.client refuses the rest)?"""
    return all(0x20 <= ord(c) < 0x7f for c in text) and text == text.strip()


BODY_TYPES = ["application/octet-stream", "application/json", "text/plain; charset=utf-8", None]


def batch_body():
    """A strategy of batch put bodies: valid documents, documents with extra
    keys holding huge integers, wrong shapes, and bytes that are not JSON."""
    schema = deref(C.doc["components"]["schemas"]["BatchPutRequest"])
    valid = from_schema(schema)
    extra = st.dictionaries(st.text(max_size=8), st.one_of(st.sampled_from(HUGE_INTEGERS), st.text(max_size=8)),
                            max_size=2)

    def with_extra(pair):
        doc, more = pair
        if isinstance(doc, dict):
            doc = dict(more, **doc)
            for entry in doc.get("jobs", []):
                if isinstance(entry, dict) and more:
                    entry.update(more)
        return json.dumps(doc).encode()

    odd_json = st.sampled_from([b"", b"{", b"[]", b"null", b'{"jobs": {}}', b'{"jobs": []}', b'{"jobs": [1]}',
                                b'{"jobs": [{}]}', b'{"jobs": [{"body": "x", "body_base64": "eA=="}]}',
                                b'{"jobs": [{"body_base64": "e"}]}', b'{"jobs": [{"body": "x", "ttr": 1e3}]}',
                                b'{"jobs": [{"body": "x"}]}\x00', b'\xff\xfe', b'{"jobs": [{"body": "\\ud800"}]}',
                                json.dumps({"jobs": [{"body": "x"}] * 101}).encode()])
    return st.one_of(valid.map(lambda d: json.dumps(d).encode()), st.tuples(valid, extra).map(with_extra), odd_json,
                     st.binary(max_size=64))


def request_strategy(path, method, op, params):
    """A strategy of (target, headers, body) for one operation: half of them
    with every parameter valid (else one odd value spoils most requests)."""
    def fields_of(odd):
        fields = {}
        for p in params:
            value = parameter_value(p, odd)
            fields[(p["in"], p["name"])] = value if p.get("required") else st.one_of(st.none(), value)
        return st.fixed_dictionaries(fields)
    unknown = st.dictionaries(st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8),
                              st.one_of(st.sampled_from(ODD_STRINGS), st.text(max_size=10)), max_size=2)
    body = st.none()
    if "requestBody" in op:
        content = deref(op["requestBody"]).get("content", {})
        if "application/json" in content:
            body = st.tuples(batch_body(), st.sampled_from(["application/json", None, "text/plain"]))
        else:
            body = st.tuples(st.binary(max_size=2048), st.sampled_from(BODY_TYPES))

    def build(drawn):
        values, extra, payload, accept = drawn
        target, query, headers = path, [], {}
        for (where, name), value in values.items():
            if value is None:
                continue
            text = as_text(value)
            if where == "path":
                target = target.replace("{%s}" % name, path_segment(text))
            elif where == "query":
                query.append((name, text))
            elif where == "header":
                if not header_safe(text):
                    continue
                headers[name] = text
        query += [(k, v) for k, v in extra.items() if not any(k == q for q, _ in query)]
        if query:
            target += "?" + "&".join("%s=%s" % (urllib.parse.quote(k, safe=""), urllib.parse.quote(v, safe=""))
                                     for k, v in query)
        data = None
        if payload is not None:
            data, ctype = payload
            if ctype:
                headers["Content-Type"] = ctype
        if accept:
            headers["Accept"] = accept
        return target, headers, data

    accept = st.sampled_from([None, None, "application/json", "application/octet-stream", "*/*", "text/html"])
    return st.tuples(st.one_of(fields_of(False), fields_of(True)), unknown, body, accept).map(build)


# ---- checking an answer ------------------------------------------------------------

def media_type(value):
    return (value or "").split(";")[0].strip().lower()


def declared_content(content, ctype):
    """The media type object of content that ctype matches, or None."""
    for name, media in content.items():
        if name == ctype or name == "*/*" or (name.endswith("/*") and ctype.startswith(name[:-1])):
            return media or {}
    return None


_parsed_yaml = {}


def parse_body(ctype, body):
    """The body as the value its schema describes, or raise ValueError."""
    if ctype == "application/json" or ctype.endswith("+json"):
        return json.loads(body)
    if ctype in ("application/yaml", "application/x-yaml"):
        if body not in _parsed_yaml:   # the same 100 KB each time: parse it once
            _parsed_yaml[body] = yaml.load(body, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        return _parsed_yaml[body]
    return body.decode("utf-8")   # text: a string; a UnicodeDecodeError is a ValueError


_validators = {}


def validator_of(schema):
    """A draft 2020-12 validator of schema, its $refs resolved in the document
    (one per schema: building them is slow)."""
    if id(schema) not in _validators:
        with warnings.catch_warnings():   # RefResolver: deprecated in newer jsonschema, the one Debian 12 has
            warnings.simplefilter("ignore", DeprecationWarning)
            resolver = jsonschema.RefResolver("", C.doc)
        _validators[id(schema)] = jsonschema.Draft202012Validator(schema, resolver=resolver)
    return _validators[id(schema)]


def conformance_problems(method, op, status, headers, body):
    """What in one answer breaks the document (a list of sentences)."""
    if status >= 500:
        return ["a %d (%s)" % (status, body[:300])]
    responses = op["responses"]
    key = next((k for k in (str(status), "%dXX" % (status // 100), "default") if k in responses), None)
    if key is None:
        return ["status %d is not declared (declared: %s); body %r" % (status, " ".join(responses), body[:300])]
    response = deref(responses[key])
    content = response.get("content")
    if method == "HEAD" or status in (204, 304):
        return ["a %s answer %d with a body" % (method, status)] if body else []
    if not content:   # then no body either
        return ["%d with a body (%s), none declared: %r" % (status, headers.get("content-type"), body[:100])
                ] if body else []
    ctype = media_type(headers.get("content-type"))
    media = declared_content(content, ctype)
    if media is None:
        return ["%d with Content-Type %r, declared: %s" % (status, ctype, ", ".join(content))]
    schema = media.get("schema")
    if not schema or schema.get("format") == "binary" or deref(schema).get("format") == "binary":
        return []
    try:
        value = parse_body(ctype, body)
    except ValueError as e:
        return ["%d %s body does not parse: %s (%r)" % (status, ctype, e, body[:200])]
    errors = sorted(validator_of(schema).iter_errors(value), key=lambda e: list(e.path))
    return ["%d %s body breaks its schema at %s: %s" % (status, ctype, "/".join(map(str, e.path)) or "(top)",
                                                        e.message[:300]) for e in errors[:3]]


# ---- setup -------------------------------------------------------------------------

def fill_pool():
    """Jobs in the pool tubes (ready, delayed, buried, reserved over HTTP) and
    the tokens of the reserved ones."""
    s = C.server
    for tube in POOL_TUBES:
        seg = path_segment(tube)
        for i in range(6):
            status, _, _ = s.request("POST", "/tubes/%s/jobs?delay=%d" % (seg, 3600 if i == 5 else 0), body=b"j%d" % i)
            check_eq(status, 201, "fixture put into %r" % tube)
        status, _, data = s.request("POST", "/tubes/%s/reservations?count=2" % seg)
        check_eq(status, 200, "fixture reservation in %r" % tube)
        jobs = json.loads(data)["jobs"]
        C.tokens += [j["reservation"] for j in jobs]
        status, _, _ = s.request("POST", "/jobs/%d/bury" % jobs[1]["id"],
                                 headers={"X-Reservation": jobs[1]["reservation"]})
        check_eq(status, 200, "fixture bury in %r" % tube)


def setup(names):
    if _missing:
        raise testlib.Skip("%s not installed (scripts/install-deps.sh test)" % " and ".join(_missing))
    with open(SPEC_PATH, encoding="utf-8") as f:
        C.doc = yaml.safe_load(f)
    C.server = Server().start()
    fill_pool()


# ---- the tests ---------------------------------------------------------------------

def sender(path, method, op):
    """The property of one operation: send a generated request, check the answer."""
    def send(req):
        target, headers, body = req
        status, got_headers, data = C.server.request(method, target, headers, body)
        C.requests += 1
        C.operations.add((method, path))
        C.statuses[status] = C.statuses.get(status, 0) + 1
        problems = conformance_problems(method, op, status, got_headers, data)
        assert not problems, "%s %s %r body %r: %s" % (method, target, headers, (body or b"")[:120],
                                                       "; ".join(problems))
    return send


def test_generated_requests_keep_the_document():
    """Hypothesis-generated requests for every operation of openapi.yaml: no
    5xx, every status, content type and body as declared."""
    failures = []
    t0 = time.monotonic()
    ops = operations()
    for path, method, op, params in ops:
        prop = hypothesis.given(request_strategy(path, method, op, params))(sender(path, method, op))
        prop = hypothesis.settings(max_examples=C.examples, database=None, deadline=None, derandomize=False,
                                   suppress_health_check=list(hypothesis.HealthCheck),
                                   verbosity=hypothesis.Verbosity.quiet)(prop)
        prop = hypothesis.seed(C.seed)(prop)
        t_op = time.monotonic()
        try:
            prop()
        except Exception as e:   # a broken promise (AssertionError), or the server closed or hung up
            where = traceback.format_exception(type(e), e, e.__traceback__)[-2].strip().splitlines()[0]
            text = (str(e).strip() or where).splitlines()[0][:1500]
            failures.append(text if isinstance(e, AssertionError) and str(e).strip()
                            else "%s %s: %s: %s" % (method, path, type(e).__name__, text))
        if os.environ.get("BEANGATE_PROPERTY_VERBOSE"):
            print("  %-7s %-28s %.1f s" % (method, path, time.monotonic() - t_op), flush=True)
        check(C.server.proc.poll() is None, "beangate exited during %s %s (status %r): %s"
              % (method, path, C.server.proc.returncode, C.server.stderr()[-3000:]))
    print("  %d requests over %d operations (of %d in the document), seed %d, %d examples each, %.1f s"
          % (C.requests, len(C.operations), len(ops), C.seed, C.examples, time.monotonic() - t0), flush=True)
    print("  statuses: %s" % ", ".join("%d: %d" % kv for kv in sorted(C.statuses.items())), flush=True)
    check_eq(len(C.operations), len(ops), "operations that got requests")
    check(not failures, "%d operations answered against the document:\n    %s"
          % (len(failures), "\n    ".join(failures)))


def test_batch_number_out_of_range_says_so():
    """A batch put whose JSON holds an integer beyond int64, even under a key
    beangate ignores, is refused as a whole (jansson reads no such number)
    with a detail that says why, not "send {jobs} with 1 to 100 entries"."""
    s = C.server
    for doc in (b'{"jobs": [{"body": "x"}], "note": 99999999999999999999}',
                b'{"jobs": [{"body": "x", "priority": 18446744073709551616}]}'):
        status, _, data = s.request("POST", "/tubes/emails/jobs/batch", {"Content-Type": "application/json"}, doc)
        check_eq(status, 400, "batch put of %r" % doc)
        detail = json.loads(data)["detail"]
        check("1 to 100 entries" not in detail and "-9223372036854775808..9223372036854775807" in detail,
              "the detail names the number range: %r" % detail)
    status, _, data = s.request("POST", "/tubes/emails/jobs/batch", {"Content-Type": "application/json"},
                                b'{"jobs": [{"body": "x"}], "note": 9223372036854775807}')
    check_eq(status, 200, "a batch put with int64's largest under an ignored key (%r)" % data[:200])
    check_eq(json.loads(data)["results"][0]["status"], 201, "its entry")


def test_empty_reservation_token_is_bad_format():
    """An empty token (?reservation= or an empty X-Reservation) is a malformed
    request, 400, not a token that does not match (409)."""
    s = C.server
    status, _, data = s.request("POST", "/tubes/emails/jobs", body=b"token test")
    jid = json.loads(data)["id"]
    for target, headers in (("/jobs/%d?reservation=" % jid, {}), ("/jobs/%d" % jid, {"X-Reservation": ""})):
        for method, action in (("DELETE", ""), ("POST", "/release"), ("POST", "/touch")):
            path = target.replace("/jobs/%d" % jid, "/jobs/%d%s" % (jid, action), 1)
            status, _, data = s.request(method, path, headers)
            check_eq(status, 400, "%s %s %r (%r)" % (method, path, headers, data[:200]))
            check("empty" in json.loads(data)["detail"], "the detail says the token is empty: %r" % data)
    check_eq(s.request("GET", "/jobs/%d" % jid)[0], 200, "the job is still there")


def test_empty_body_with_idempotency_key():
    """A put with an empty body and an Idempotency-Key stores the job, and
    the retry gets it again (the sanitizer build aborted on the first: an
    empty body is no bytes at NULL, which its hash passed to memcpy)."""
    s = C.server
    answers = [s.request("POST", "/tubes/emails/jobs", {"Idempotency-Key": "empty-body-1"}, b"") for _ in range(2)]
    check_eq([a[0] for a in answers], [201, 201], "two puts of an empty body under one key")
    first, again = (json.loads(a[2]) for a in answers)
    check_eq(again["id"], first["id"], "the retry answered with the first job")
    check_eq(s.request("GET", "/jobs/%d/body" % first["id"])[2], b"", "its body")


def test_token_for_a_ready_job_is_refused_as_documented():
    """DELETE of a ready job with a token is 409 RESERVATION_MISMATCH (the
    token claims a reservation that has ended), and the document says so."""
    s = C.server
    status, _, data = s.request("POST", "/tubes/a-b/jobs", body=b"stale token")
    jid = json.loads(data)["id"]
    status, _, data = s.request("POST", "/jobs/%d/reservations" % jid)
    check_eq(status, 200, "reserve job %d" % jid)
    token = json.loads(data)["reservation"]
    check_eq(s.request("POST", "/jobs/%d/release" % jid, {"X-Reservation": token})[0], 200, "release it")
    status, _, data = s.request("DELETE", "/jobs/%d" % jid, {"X-Reservation": token})
    check_eq((status, json.loads(data)["code"]), (409, "RESERVATION_MISMATCH"), "delete of the ready job, old token")
    check_eq(s.request("DELETE", "/jobs/%d" % jid)[0], 204, "delete of the ready job without a token")
    described = " ".join(C.doc["paths"]["/jobs/{id}"]["delete"]["description"].split())
    check("token given for a job that is no longer reserved under it" in described
          and "RESERVATION_MISMATCH" in described,
          "DELETE /jobs/{id} says a token for a job no longer reserved is refused: %r" % described)


def test_document_states_its_conventions():
    """What the runs found undocumented is in the document: unknown query
    parameters are ignored, the bearer token is a security scheme on every
    operation that needs one (those the route table marks GW_AUTH_TOKEN),
    and /openapi.yaml's YAML is not declared a string (parsed, it is an object)."""
    info = C.doc["info"]["description"]
    check("nknown query parameters are ignored" in info, "info.description says unknown query parameters are ignored")
    schemes = C.doc.get("components", {}).get("securitySchemes", {})
    bearer = [name for name, s in schemes.items() if s.get("type") == "http" and s.get("scheme") == "bearer"]
    check_eq(len(bearer), 1, "bearer security schemes in components.securitySchemes (have %r)" % schemes)
    with open(os.path.join(REPO, "gateway", "router.c"), encoding="utf-8") as f:
        router = f.read()
    auth = {}
    for pattern, method, level in re.findall(r'\{"(/[^"]*)", GW_(GET|POST|DELETE),[^}]*?GW_AUTH_([A-Z]+)', router):
        path = re.sub(r"\*", "{}", pattern)
        auth[(path, method)] = level
    check(len(auth) >= 25, "read the route table's auth column: %d rows" % len(auth))
    top = C.doc.get("security")
    for path, item in C.doc["paths"].items():
        for method in ("get", "head", "post", "delete"):
            if method not in item:
                continue
            row_method = "GET" if method == "head" else method.upper()   # HEAD is served by the GET row
            level = auth.get((re.sub(r"\{[^}]*\}", "{}", path), row_method))
            check(level is not None, "%s %s is in the route table" % (method, path))
            security = item[method].get("security", top)
            named = {name for alt in (security or []) for name in alt}
            anonymous = security == [] or any(alt == {} for alt in security or [])
            if level in ("TOKEN", "METRICS"):
                check(bearer[0] in named, "%s %s needs the bearer token; its security: %r" % (method, path, security))
            elif level in ("OPEN", "PUBLIC"):
                check(anonymous and not named, "%s %s is open; its security: %r" % (method, path, security))
            check(level != "TOKEN" or anonymous,
                  "%s %s: tokens are optional (off unless configured): %r" % (method, path, security))
    schema = C.doc["paths"]["/openapi.yaml"]["get"]["responses"]["200"]["content"]["application/yaml"]["schema"]
    check("type" not in deref(schema), "the schema of /openapi.yaml's YAML has no type (parsed, it is an object; "
          "unparsed, text): %r" % schema)


def server_alive_and_stops_cleanly():
    """Alive after everything, /livez 200, exit 0 on SIGTERM, no sanitizer report."""
    s = C.server
    if s is None:
        return
    check(s.proc.poll() is None, "beangate exited (status %r): %s" % (s.proc.returncode, s.stderr()[-3000:]))
    check_eq(s.request("GET", "/livez")[0], 200, "GET /livez at the end")
    status = testlib.signal_and_wait(s.proc, signal.SIGTERM, STOP_TIMEOUT)
    report = testlib.sanitizer_report(s.stderr())
    check(report is None, "sanitizer report: %s" % report)
    check_eq(status, 0, "exit status after SIGTERM")


TESTS = [
    test_generated_requests_keep_the_document,
    test_batch_number_out_of_range_says_so,
    test_empty_reservation_token_is_bad_format,
    test_empty_body_with_idempotency_key,
    test_token_for_a_ready_job_is_refused_as_documented,
    test_document_states_its_conventions,
]


def main(argv):
    parser = testlib.arg_parser(__doc__)
    seed_given = "--seed" in argv or os.environ.get("BEANGATE_TEST_SEED", "").isdigit()
    args = testlib.parse_args(parser, argv)
    if not seed_given:
        args.seed = DEFAULT_SEED
    C.binary, C.seed = args.binary, args.seed
    C.examples = int(os.environ.get("BEANGATE_PROPERTY_EXAMPLES", DEFAULT_EXAMPLES))
    # Hypothesis keeps a cache in ./.hypothesis unless told otherwise: a
    # directory of this run's instead, not the source tree
    home = tempfile.mkdtemp(prefix="beangate-hypothesis-")
    if hypothesis:
        hypothesis.configuration.set_hypothesis_home_dir(home)
    try:
        return testlib.run("properties", TESTS, args, namespace=globals(), setup=setup,
                           last=(server_alive_and_stops_cleanly,), all_skipped=SKIP_EXIT)
    finally:
        if C.server is not None:
            C.server.kill()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
