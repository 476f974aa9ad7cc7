"""Small helpers shared by the Python test suites under tests/, and the one
runner every suite uses (arg_parser, parse_args, run).

Python 3 standard library only. A suite finds this module with
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
    from testlib import ...
so every suite stays runnable on its own (`python3 tests/X/Y.py build/beangate`).
Only helpers whose behaviour is the same in every suite live here; where
suites differ (the exception raised, how two byte strings are described) the
difference is a parameter, given explicitly by the suite.

Every suite's command line (arg_parser):
    python3 tests/X/Y.py [BINARY] [-k NAME]... [--seed N] [--list]
-k NAME runs only that test (the leading test_ may be left out), and may be
repeated; BEANGATE_TEST_ONLY="NAME ..." does the same from the environment
(for ctest). --seed N (or BEANGATE_TEST_SEED=N) repeats a run's random
choices; the seed is printed first. Each test prints one line:
    PASS name (1.2 s)
    FAIL name: why
    SKIP name: why
and the last line is `<suite>: N passed, M failed, K skipped`. The exit
status is 0 if nothing failed, 1 if a test failed (or none ran), 2 for a bad
command line, and a suite's own status (77 for ctest) when every test was
skipped.
"""

import argparse
import fcntl
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import time
import traceback

# Substrings of stderr that mean an ASan/UBSan/LSan report (suites may add more, e.g. TSan).
SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "runtime error", "LeakSanitizer")


_PORTS_GIVEN = set()


# A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read it back,
# close), never one this process was given before: the kernel may hand the same
# port out again once it is closed, and two servers of one test then clash (the
# replication suite's CI run once got one port for two NATS nodes).
def free_port():
    while True:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        finally:
            s.close()
        if port not in _PORTS_GIVEN:
            _PORTS_GIVEN.add(port)
            return port


def rss_kib(pid):
    """The resident set of process pid in KiB (VmRSS of /proc/PID/status)."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS for pid %d" % pid)


def is_asan_build(binary):
    """Whether binary is built with AddressSanitizer (it calls __asan_init;
    the runtime is a shared library, so its messages are not in the file)."""
    with open(binary, "rb") as f:
        return b"__asan_init" in f.read()


# The environment without any BEANGATE_* variable, plus extra: a server
# started by a test sees only the settings the test gives it.
def clean_env(extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("BEANGATE_")}
    env.update(extra or {})
    return env


# Nonzero if something accepts connections on 127.0.0.1:port.
def port_open(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


# Raise exc(msg) unless cond is true (exc: AssertionError, or a suite's own failure class).
def check(cond, msg, exc=AssertionError):
    if not cond:
        raise exc(msg)


# Raise exc("what: got %r, want %r") if got != want; for two byte strings bytes_diff(got, want, what) words it.
def check_eq(got, want, what, exc=AssertionError, bytes_diff=None):
    if got != want:
        if (bytes_diff is not None and isinstance(got, (bytes, bytearray))
                and isinstance(want, (bytes, bytearray))):
            raise exc(bytes_diff(got, want, what))
        raise exc("%s: got %r, want %r" % (what, got, want))


# Poll fn() every `step` seconds until ok(value) (default: a true value),
# and return that value; raise exc("timed out waiting for WHAT (last: ...)")
# after timeout. The one place where a test waits for something.
def wait_until(fn, what, timeout=5.0, exc=AssertionError, step=0.05, ok=bool):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if ok(last):
            return last
        time.sleep(step)
    raise exc("timed out after %.1f s waiting for %s (last: %s)" % (timeout, what, repr(last)[:600]))


# Close sock (a socket, or anything with close()), ignoring an OSError: the peer may be gone.
def close_quietly(sock):
    try:
        sock.close()
    except OSError:
        pass


# A TCP connection to 127.0.0.1:port reading CRLF-ended lines and counted
# bodies (beanstalk's framing); the peer closing raises exc("<what>: connection closed").
class LineSocket:
    def __init__(self, port, timeout, what="beanstalk", exc=AssertionError):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""
        self.what = what
        self.exc = exc

    def _fill(self):
        data = self.s.recv(65536)
        if not data:
            raise self.exc("%s: connection closed" % self.what)
        self.buf += data

    # The next line, without its CRLF.
    def line(self):
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    # The next n bytes, and the CRLF after them (dropped).
    def body(self, n):
        while len(self.buf) < n + 2:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data

    def close(self):
        close_quietly(self.s)


class _NotReady(Exception):
    pass


# A server process started: poll ready() (an exception of not_yet counts as
# "not yet") until it is true: "ok"; "exited" if proc ended first; "timeout".
def wait_ready(proc, ready, timeout, step=0.02, not_yet=(OSError, AssertionError)):
    def probe():
        if proc.poll() is not None:
            return "exited"
        try:
            return "ok" if ready() else None
        except not_yet:
            return None
    try:
        return wait_until(probe, "the server to be ready", timeout, exc=_NotReady, step=step)
    except _NotReady:
        return "timeout"


# Whether a fresh beanstalk connection (anything with send and read_line; closed here)
# answers list-tube-used with the default tube: the server's loop runs.
def uses_default_tube(conn):
    try:
        conn.send(b"list-tube-used\r\n")
        return conn.read_line() == b"USING default\r\n"
    finally:
        conn.close()


# Whether a server's stderr says it could not bind a port (another process took it meanwhile).
def port_taken(err):
    return "cannot listen" in err or "in use" in err


# A server child process whose stderr goes to a temporary file: spawn it, read its
# stderr, kill it; start_retrying spawns again on fresh ports after a port clash.
# Put the open file f in append mode. A child's stderr file shares its offset with
# us: without O_APPEND, seeking back to read it moves where the child writes next,
# and a line written during the read overwrites an earlier one.
def set_append(f):
    fcntl.fcntl(f.fileno(), fcntl.F_SETFL, fcntl.fcntl(f.fileno(), fcntl.F_GETFL) | os.O_APPEND)


# A fresh temporary file in append mode, for a child's stderr read while it writes.
def append_tempfile():
    f = tempfile.TemporaryFile()
    set_append(f)
    return f


class ServerProcess:
    def __init__(self):
        self.proc = None
        self.err = None

    # Start argv with stdin closed, stdout to `stdout` and stderr to err_file (open for
    # reading too; put in append mode), or to a fresh append_tempfile().
    def spawn(self, argv, stdout=subprocess.DEVNULL, env=None, err_file=None, **popen):
        self.err = err_file or append_tempfile()
        set_append(self.err)
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=self.err,
                                     env=env, **popen)
        return self.proc

    # What the process wrote on stderr so far, as text ("" if there is no (open) file).
    def stderr(self):
        try:
            self.err.seek(0)
            return self.err.read().decode("utf-8", "replace")
        except (AttributeError, OSError, ValueError):
            return ""

    # SIGKILL the process if it still runs, and reap it.
    def kill(self):
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()

    # Call launch() (which picks ports and calls spawn) until ready() answers, at most
    # `attempts` times while retry(stderr) holds after a failed try (which is killed);
    # the last wait_ready status: "ok", "exited" or "timeout".
    def start_retrying(self, launch, ready, timeout, attempts, retry=port_taken, **wait):
        for _ in range(attempts):
            launch()
            status = wait_ready(self.proc, ready, timeout, **wait)
            if status == "ok":
                break
            self.kill()
            if not retry(self.stderr()):
                break
        return status


# The disk-fault test hook of the binary (docs/durability.md, "Testing disk faults"):
# a control file that BEANGATE_TEST_DISK_FAULTS names; its lines make calls on the
# log's *.wal files fail ("write EIO", "sync EIO once", "sync delay 300ms", ...). The
# server reads it again when its size or mtime changed, so each set() gives the file
# a new mtime even within one clock tick.
class DiskFaults:
    def __init__(self, path):
        self.path = path
        self._mtime_ns = 0
        self.clear()

    # The environment entry that makes a server use this file.
    def env(self):
        return {"BEANGATE_TEST_DISK_FAULTS": self.path}

    def set(self, lines):
        with open(self.path, "w") as f:
            f.write("".join(line + "\n" for line in lines))
        self._mtime_ns = max(time.time_ns(), self._mtime_ns + 1_000_000)
        os.utime(self.path, ns=(self._mtime_ns, self._mtime_ns))

    def clear(self):
        self.set([])


# Index of the first byte where got and want differ (the shorter length if one is a prefix of the other).
def first_difference(got, want):
    n = min(len(got), len(want))
    return next((k for k in range(n) if got[k] != want[k]), n)


# repr of bytes (or "None"); past limit bytes: the first limit bytes, the total length and the last 40.
def show(data, limit):
    if data is None:
        return "None"
    data = bytes(data)
    if len(data) <= limit:
        return repr(data)
    return "%r...(%d bytes in all, last: %r)" % (data[:limit], len(data), data[-40:])


# Send sig to proc if it still runs, wait up to timeout: its exit status, or None if it hung (then SIGKILLed).
def signal_and_wait(proc, sig, timeout):
    if proc.poll() is None:
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            pass
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
        return None


# The output (stdout and stderr) of `binary -h`, b"" if it takes over 10 s: which flags it has.
def binary_usage(binary):
    try:
        return subprocess.run([binary, "-h"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=10).stdout
    except subprocess.TimeoutExpired:
        return b""


# Run binary args to its end: (status, stdout, stderr) as text; AssertionError on a timeout or a sanitizer report.
def run_binary(binary, args, timeout, env=None, err_limit=1500):
    try:
        p = subprocess.run([binary] + list(args), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError("%r did not exit within %d s (killed)" % (args, timeout)) from None
    err = p.stderr.decode("utf-8", "replace")
    check(sanitizer_report(err) is None, "%r: sanitizer report on stderr: %s" % (args, err[:err_limit]))
    return p.returncode, p.stdout.decode("utf-8", "replace"), err


# The sanitizer report in a process's stderr (from the line of its first
# marker on, at most limit characters), or None if there is none.
def sanitizer_report(err, markers=SANITIZER_MARKERS, limit=20000):
    starts = [err.find(m) for m in markers if m in err]
    if not starts:
        return None
    start = err.rfind("\n", 0, min(starts)) + 1
    return err[start:start + limit]


# The fenced code block that follows the HTML comment starting with marker in
# the document at path (a document's example that a test runs as it is).
def doc_block(path, marker):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"<!-- %s[^>]*-->\s*```\w*\n(.*?)\n```" % re.escape(marker), text, re.S)
    check(m is not None, "%s has no code block after <!-- %s" % (os.path.basename(path), marker))
    return m.group(1)


# ---- the runner -------------------------------------------------------------------

class Skip(Exception):
    """Raised by a test that cannot run here; the message says why."""


# The command line of a suite: BINARY (binary=True; "optional": may be left
# out; False: none), -k NAME..., --seed N, --list. The suite may add options.
def arg_parser(doc, binary=True):
    p = argparse.ArgumentParser(description=(doc or "").strip().split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    if binary:
        p.add_argument("binary", nargs="?" if binary == "optional" else None,
                       help="the beangate binary under test")
    p.add_argument("-k", dest="only", action="append", default=[], metavar="NAME",
                   help="run only this test (test_ may be left out); may be repeated; "
                        "BEANGATE_TEST_ONLY=\"NAME ...\" does the same")
    p.add_argument("--seed", type=int, help="seed of the random choices (default: a random one, "
                                            "printed; BEANGATE_TEST_SEED=N does the same)")
    p.add_argument("--list", action="store_true", help="print the names of the tests and exit")
    return p


# Parse argv[1:] with parser: the binary made absolute (exit 2 if it is not an
# executable), the names of -k and of BEANGATE_TEST_ONLY (and of the suite's
# older variables, only_env) in args.only, and args.seed chosen.
def parse_args(parser, argv, only_env=()):
    args = parser.parse_args(argv[1:])
    if getattr(args, "binary", None):
        args.binary = os.path.abspath(args.binary)
        if not os.access(args.binary, os.X_OK):
            parser.error("not an executable: %s" % args.binary)
    for var in ("BEANGATE_TEST_ONLY",) + tuple(only_env):
        args.only += os.environ.get(var, "").split()
    if args.seed is None:
        env_seed = os.environ.get("BEANGATE_TEST_SEED", "")
        args.seed = int(env_seed) if env_seed.isdigit() else random.randrange(1 << 30)
    return args


# Why the list of tests is not every test_* function of the module
# (namespace: its globals()): a test written and never run is worse than none.
def registry_problems(tests, namespace):
    if namespace is None:
        return []
    names = [fn.__name__ for fn in tests]
    defined = {n for n, v in namespace.items() if n.startswith("test_") and callable(v)
               and getattr(v, "__module__", None) == namespace.get("__name__")}
    problems = []
    missing = sorted(defined - set(names))
    if missing:
        problems.append("test functions missing from the list of tests: %s" % " ".join(missing))
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        problems.append("tests listed twice: %s" % " ".join(twice))
    return problems


# Run a suite's tests and print one line each and the summary; the exit status.
#   suite: the summary's name; tests: the test functions, in order; args: of parse_args.
#   namespace: the module's globals(), checked by registry_problems.
#   setup(names): before the tests (names: those selected); an exception fails the
#     run, Skip skips it (see all_skipped).
#   call(fn): runs one test (default fn()); skip(fn): a reason not to run it, or None.
#   after(error): after each test (error: its failure, or None), e.g. stops its
#     servers; returns problems (sanitizer reports...) that make it fail.
#   last: checks run after the tests whatever happened (a server's clean stop),
#     reported like tests; finish(): prints what the suite adds before the summary.
#   failures: exceptions that are a failed check (their message is enough);
#     any other exception is a broken test and gets its traceback.
#   all_skipped: the exit status when every test run was skipped.
def run(suite, tests, args, namespace=None, setup=None, call=None, skip=None, after=None,
        last=(), finish=None, failures=(AssertionError, subprocess.TimeoutExpired), all_skipped=0):
    tests = list(tests)
    if getattr(args, "list", False):
        for fn in tests:
            print(fn.__name__)
        return 0
    known = {fn.__name__ for fn in tests}
    wanted = {n if n in known else "test_" + n for n in args.only}
    unknown = sorted(n for n in args.only if n not in known and "test_" + n not in known)
    if unknown:
        print("%s: no test named %s (--list shows them)" % (suite, " ".join(unknown)), file=sys.stderr)
        return 2
    selected = [fn for fn in tests if not wanted or fn.__name__ in wanted]
    random.seed(args.seed)
    print("seed %d (--seed %d repeats this run's random choices)" % (args.seed, args.seed), flush=True)
    counts = {"passed": 0, "failed": 0, "skipped": 0}

    def report(name, error, t0):
        if error is None:
            counts["passed"] += 1
            print("PASS %s (%.1f s)" % (name, time.monotonic() - t0), flush=True)
        else:
            counts["failed"] += 1
            print("FAIL %s: %s" % (name, error), flush=True)

    def one(fn, name, plain=False):   # plain: a `last` check, neither skipped nor run by call
        why = skip(fn) if skip and not plain else None
        if why:
            counts["skipped"] += 1
            print("SKIP %s: %s" % (name, why), flush=True)
            return
        t0 = time.monotonic()
        error = skipped = None
        try:
            fn() if plain or not call else call(fn)
        except Skip as e:
            skipped = str(e)
        except failures as e:
            error = str(e) or type(e).__name__
        except Exception as e:  # a broken test or an unexpected error
            error = "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc().rstrip())
        try:
            problems = after(error) if after else []
        except Exception as e:  # a broken hook fails the test it ran after
            problems = ["after the test: %s: %s\n%s" % (type(e).__name__, e, traceback.format_exc().rstrip())]
        if problems:
            error = "\n  and ".join(([error] if error else []) + list(problems))
        if skipped is not None and error is None:
            counts["skipped"] += 1
            print("SKIP %s: %s" % (name, skipped), flush=True)
        else:
            report(name, error, t0)

    t_all = time.monotonic()
    for problem in registry_problems(tests, namespace):
        report("registry", problem, t_all)
    try:
        if setup:
            try:
                setup([fn.__name__ for fn in selected])
            except Skip as e:  # the whole suite cannot run here
                counts["skipped"] += 1
                print("SKIP setup: %s" % e, flush=True)
                selected = []
            except Exception as e:
                report("setup", "%s: %s" % (type(e).__name__, e), t_all)
                selected = []
        for fn in selected:
            one(fn, fn.__name__)
    finally:
        for check_fn in last:
            one(check_fn, check_fn.__name__, plain=True)
        if finish:
            finish()
        print("total time %.1f s" % (time.monotonic() - t_all), flush=True)
        print("%s: %d passed, %d failed, %d skipped" % (suite, counts["passed"], counts["failed"],
                                                        counts["skipped"]), flush=True)
    if counts["failed"] or not any(counts.values()):
        return 1
    return all_skipped if not counts["passed"] else 0


# The whole main of a suite that needs no binary and no hooks: parse argv by the
# suite's docstring and run its tests under its name; the exit status.
def main_without_binary(suite, doc, tests, argv, namespace):
    return run(suite, tests, parse_args(arg_parser(doc, binary=False), argv), namespace=namespace)


# ---- browser tests (tests/ui, tests/security) ------------------------------------------

def selenium_missing():
    """None when selenium imports, else why not. Debian's python3-selenium
    lives in /usr/lib/python3/dist-packages, which another python3 (pyenv, a
    virtualenv) does not search: look there too."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        sys.path.append("/usr/lib/python3/dist-packages")
        try:
            import selenium  # noqa: F401,F811
        except ImportError as e:
            return "python3-selenium is not installed (%s)" % e
    return None


def find_browser():
    """(chromium, chromedriver) paths, or (None, why)."""
    import shutil
    chromium = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser"),
                                 "/usr/lib/chromium/chromium") if p and os.access(p, os.X_OK)), None)
    driver = next((p for p in (shutil.which("chromedriver"), "/usr/lib/chromium/chromedriver")
                   if p and os.access(p, os.X_OK)), None)
    if not chromium:
        return None, "chromium is not installed (apt-get install chromium)"
    if not driver:
        return None, "chromedriver is not installed (apt-get install chromium-driver)"
    return (chromium, driver), None
