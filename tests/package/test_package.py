#!/usr/bin/env python3
"""The Debian package (debian/): build it, lint it, install it, run it, purge it.

    tests/package/test_package.py build/beangate            # the checks of debian/ alone (ctest)
    tests/package/test_package.py --install                 # as root on Debian; scripts/test.sh package

Without --install (as ctest runs it): debian/control's Build-Depends are
scripts/install-deps.sh's build packages, and every variable that
debian/beangate.default names is one the built BINARY knows. Nothing is
installed.

With --install it builds the package with scripts/build-deb.sh, runs lintian (no error or
warning), installs it with apt-get, and runs the installed server: where
systemd is PID 1, as beangate.service (on free ports set in the installed
/etc/default/beangate); elsewhere with the unit's own command line, user,
Environment= and EnvironmentFile (ExecStart, User= and Group= read from the
installed unit, the variables from the installed /etc/default/beangate),
with BEANGATE_PORT and BEANGATE_HTTP_PORT moved to free ports: a beangate
of the user's may hold 11300. It puts and reserves jobs over TCP and HTTP,
stops the server and finds the unreserved job again after a restart (the log
in /var/lib/beangate), serves a socket passed as fd 3 (socket activation),
then removes the package (the log and the conffile stay) and purges it
(/usr/bin/beangate, the units, the conffile and /var/lib/beangate gone).

That changes the system, so it runs only as root with dpkg and apt-get, and
refuses (SKIP, exit 77) when a beangate package it did not install is there,
or /etc/default/beangate or /var/lib/beangate exist: purging would delete
them. ctest runs only the checks without --install for that reason.
"""
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import testlib  # noqa: E402
from testlib import Skip, check, check_eq  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
UNIT = "/lib/systemd/system/beangate.service"
SOCKET_UNIT = "/lib/systemd/system/beangate.socket"
DEFAULTS = "/etc/default/beangate"
STATE_DIR = "/var/lib/beangate"
BINARY = "/usr/bin/beangate"
POLICY_RC = "/usr/sbin/policy-rc.d"
READY_TIMEOUT = 20.0
APT_ENV = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
# other apt runs on the machine (another install): wait for dpkg's lock instead of failing
APT = ["apt-get", "-o", "DPkg::Lock::Timeout=300"]

state = {"out": None, "deb": None, "installed": False, "server": None}


def sh(argv, timeout=600, env=None):
    """Run argv; (status, stdout and stderr together as text)."""
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=timeout, env=env)
    return p.returncode, p.stdout.decode("utf-8", "replace")


def package_status():
    """dpkg's status of beangate ("install ok installed", "deinstall ok config-files"), "" if unknown."""
    status, out = sh(["dpkg-query", "-W", "-f=${Status}", "beangate"])
    return out.strip() if status == 0 else ""


def systemd_runs():
    return os.path.isdir("/run/systemd/system")


def setup(names):
    """Skip unless this machine may get the package installed and purged; a directory for the build."""
    if os.geteuid() != 0:
        raise Skip("not root: installing a package needs root")
    for tool in ("dpkg", "apt-get", "dpkg-buildpackage", "dh", "lintian"):
        if shutil.which(tool) is None:
            raise Skip("no %s here (scripts/install-deps.sh test installs debhelper and lintian)" % tool)
    status = package_status()
    if status and not status.endswith("not-installed"):
        raise Skip("a beangate package is already there (%s), not installed by this test: "
                   "purging it would delete its log" % status)
    for path in (DEFAULTS, STATE_DIR, UNIT):
        if os.path.exists(path):
            raise Skip("%s exists (not from a package): the purge at the end would delete it" % path)
    state["out"] = tempfile.mkdtemp(prefix="beangate-deb-")


# ---- the package ---------------------------------------------------------------

def install_deps_build_packages():
    """The build packages of scripts/install-deps.sh (its first pkgs=(...) list)."""
    with open(os.path.join(REPO, "scripts", "install-deps.sh"), encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"^pkgs=\((.*?)\)", text, re.S | re.M)
    check(m is not None, "scripts/install-deps.sh has no pkgs=(...) list")
    return set(m.group(1).split()) - {"build-essential"}


def control_build_depends():
    """debian/control's Build-Depends, without versions and without debhelper-compat."""
    with open(os.path.join(REPO, "debian", "control"), encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"^Build-Depends:(.*?)(?=^\S|^$)", text, re.S | re.M)
    check(m is not None, "debian/control has no Build-Depends")
    names = {re.sub(r"\s*\(.*", "", d).strip() for d in m.group(1).split(",")}
    return {n for n in names if n and n != "debhelper-compat"}


def unknown_variables(defaults, binary):
    """The BEANGATE_* names in the file defaults (set or commented out) that `binary -h` does not list."""
    with open(defaults, encoding="utf-8") as f:
        named = set(re.findall(r"^#?(BEANGATE_[A-Z0-9_]+)=", f.read(), re.M))
    check(named, "%s names no BEANGATE_* variable" % defaults)
    status, usage = sh([binary, "-h"])
    check_eq(status, 0, "%s -h exit status" % binary)
    return sorted(n for n in named if not re.search(r"\b%s\b" % n, usage))


def test_defaults_file_names_known_variables():
    unknown = unknown_variables(os.path.join(REPO, "debian", "beangate.default"), ARGS.binary)
    check(not unknown, "debian/beangate.default names variables %s -h does not know: %s"
          % (ARGS.binary, " ".join(unknown)))


def test_build_depends_match_install_deps():
    check_eq(sorted(control_build_depends()), sorted(install_deps_build_packages()),
             "debian/control's Build-Depends against scripts/install-deps.sh's build packages")


def test_build():
    status, out = sh([os.path.join(REPO, "scripts", "build-deb.sh"), state["out"]], timeout=1800)
    check(status == 0, "scripts/build-deb.sh failed (%d):\n%s" % (status, out[-3000:]))
    deb = out.strip().splitlines()[-1]
    check(deb.endswith(".deb") and os.path.isfile(deb), "build-deb.sh printed no package: %r" % out[-500:])
    state["deb"] = deb
    status, contents = sh(["dpkg-deb", "-c", deb])
    for path in ("./usr/bin/beangate", "./usr/share/man/man1/beangate.1.gz", "." + UNIT, "." + SOCKET_UNIT,
                 "." + DEFAULTS, "./usr/share/doc/beangate/copyright", "./usr/share/doc/beangate/operations.md.gz"):
        check(re.search(r" %s$" % re.escape(path), contents, re.M), "the package lacks %s" % path)
    status, info = sh(["dpkg-deb", "-I", deb, "conffiles"])
    check_eq(info.split(), [DEFAULTS], "the package's conffiles")


def needs(key):
    if not state[key]:
        raise Skip("an earlier step failed (no %s)" % key)


def test_lintian():
    needs("deb")
    changes = state["deb"][:-len(".deb")] + ".changes"
    status, out = sh(["lintian", "--fail-on", "error,warning", changes], timeout=900)
    check(status == 0, "lintian reports errors or warnings (%d):\n%s" % (status, out[-3000:]))


def test_install():
    needs("deb")
    # where systemd runs, the service is started by hand below, on free ports:
    # policy-rc.d keeps the postinst from starting it on 11300
    made_policy = False
    if systemd_runs() and not os.path.exists(POLICY_RC):
        with open(POLICY_RC, "w") as f:
            f.write("#!/bin/sh\nexit 101\n")
        os.chmod(POLICY_RC, 0o755)
        made_policy = True
    try:
        status, out = sh(APT + ["install", "-y", "--no-install-recommends", state["deb"]], env=APT_ENV)
    finally:
        if made_policy:
            os.unlink(POLICY_RC)
    state["installed"] = package_status() != ""
    check(status == 0, "apt-get install failed (%d):\n%s" % (status, out[-3000:]))
    check_eq(package_status(), "install ok installed", "dpkg's status of beangate")
    for path in (BINARY, UNIT, SOCKET_UNIT, DEFAULTS):
        check(os.path.exists(path), "%s is not there after the installation" % path)
    user = pwd.getpwnam("beangate")
    st = os.stat(STATE_DIR)
    check(st.st_uid == user.pw_uid and (st.st_mode & 0o777) == 0o700,
          "%s: owner uid %d, mode %o; want user beangate (uid %d), mode 700"
          % (STATE_DIR, st.st_uid, st.st_mode & 0o777, user.pw_uid))


# ---- the installed unit and /etc/default/beangate ---------------------------------------

def unit_settings(path):
    """The [Service] settings of a unit file: {name: [values in order]} (an empty value resets)."""
    settings, section = {}, None
    with open(path, encoding="utf-8") as f:
        for raw in f:
            line = raw.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("["):
                section = line
                continue
            if section == "[Service]" and "=" in line:
                name, value = line.split("=", 1)
                if value == "":
                    settings[name] = []
                else:
                    settings.setdefault(name, []).append(value)
    return settings


def environment_file(path):
    """NAME=value lines of an EnvironmentFile (comments and blank lines skipped; quotes removed)."""
    env = {}
    with open(path, encoding="utf-8") as f:
        for raw in f:
            line = raw.strip()
            if not line or line[0] in "#;":
                continue
            check("=" in line, "%s: not NAME=value: %r" % (path, line))
            name, value = line.split("=", 1)
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
                value = value[1:-1]
            env[name.strip()] = value
    return env


def service_command():
    """(argv, user, group, environment) of the installed beangate.service, as systemd would run it."""
    unit = unit_settings(UNIT)
    check_eq(len(unit.get("ExecStart", [])), 1, "ExecStart lines of %s" % UNIT)
    argv = unit["ExecStart"][0].split()
    check("$" not in unit["ExecStart"][0], "ExecStart uses a variable; this test runs it literally")
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
    for assignment in unit.get("Environment", []):
        for word in assignment.split():
            name, value = word.split("=", 1)
            env[name] = value
    for spec in unit.get("EnvironmentFile", []):
        optional = spec.startswith("-")
        path = spec.lstrip("-")
        if os.path.exists(path) or not optional:
            env.update(environment_file(path))
    return argv, unit.get("User", [None])[-1], unit.get("Group", [None])[-1], env


def test_defaults_are_documented_values():
    needs("installed")
    argv, user, group, env = service_command()
    check_eq(argv[0], BINARY, "the unit's ExecStart binary")
    check_eq(user, "beangate", "the unit's User=")
    for name, want in (("BEANGATE_LISTEN", "127.0.0.1"), ("BEANGATE_PORT", "11300"),
                       ("BEANGATE_HTTP_LISTEN", "127.0.0.1"), ("BEANGATE_HTTP_PORT", "11301"),
                       ("BEANGATE_BINLOG_DIR", STATE_DIR)):
        check_eq(env.get(name), want, "%s as the service sees it" % name)
    unknown = unknown_variables(DEFAULTS, BINARY)
    check(not unknown, "%s names variables %s -h does not know: %s" % (DEFAULTS, BINARY, " ".join(unknown)))


class Server:
    """The installed server run as the unit would run it, on free ports."""

    def __init__(self, inherited=None):
        argv, user, group, env = service_command()
        self.port, self.http_port = testlib.free_port(), testlib.free_port()
        env.update(BEANGATE_PORT=str(self.port), BEANGATE_HTTP_PORT=str(self.http_port))
        drop = ["setpriv", "--reuid=" + user, "--regid=" + (group or user), "--init-groups", "--"] if user else []
        pass_fds, launch = (), drop + argv
        if inherited is not None:
            # socket activation as systemd does it: the socket as fd 3,
            # LISTEN_FDS=1 and LISTEN_PID the pid of the process that execs beangate
            self.port = inherited.getsockname()[1]
            os.set_inheritable(inherited.fileno(), True)
            env["LISTEN_FDS"] = "1"
            launch = ["sh", "-c", 'exec 3<&%d; export LISTEN_PID=$$; exec "$@"' % inherited.fileno(), "sh"] + launch
            pass_fds = (inherited.fileno(),)
        self.proc_holder = testlib.ServerProcess()
        self.proc = self.proc_holder.spawn(launch, env=env, pass_fds=pass_fds, cwd="/")
        status = testlib.wait_ready(self.proc, self.ready, READY_TIMEOUT)
        if status != "ok":
            err = self.proc_holder.stderr()
            self.proc_holder.kill()
            raise AssertionError("the installed server is not ready (%s): %s" % (status, err[-2000:]))

    def ready(self):
        conn = testlib.LineSocket(self.port, 2)
        try:
            conn.s.sendall(b"list-tube-used\r\n")
            if conn.line() != b"USING default":
                return False
        finally:
            conn.close()
        with urllib.request.urlopen("http://127.0.0.1:%d/readyz" % self.http_port, timeout=2) as r:
            return r.status == 200

    def beanstalk(self, request):
        """Send one request on a new connection: its reply line."""
        conn = testlib.LineSocket(self.port, 10)
        try:
            conn.s.sendall(request)
            return conn.line()
        finally:
            conn.close()

    def reserve_and_delete(self):
        """Reserve a job over TCP and delete it: its body."""
        conn = testlib.LineSocket(self.port, 10)
        try:
            conn.s.sendall(b"reserve-with-timeout 0\r\n")
            words = conn.line().split()
            check(len(words) == 3 and words[0] == b"RESERVED", "reserve over TCP: %r" % words)
            body = conn.body(int(words[2]))
            conn.s.sendall(b"delete %s\r\n" % words[1])
            check_eq(conn.line(), b"DELETED", "delete of the reserved job")
            return body
        finally:
            conn.close()

    def http(self, method, path, body=None):
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.http_port, path), data=body, method=method)
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()

    def stop(self):
        """SIGTERM, as systemd's KillSignal: the exit status (0 for a clean stop)."""
        status = testlib.signal_and_wait(self.proc, signal.SIGTERM, 30)
        check_eq(status, 0, "the server's exit status after SIGTERM (stderr: %s)"
                 % self.proc_holder.stderr()[-1000:])


def started(inherited=None):
    needs("installed")
    if systemd_runs():
        return None
    state["server"] = Server(inherited)
    return state["server"]


def systemd_service_roundtrip():
    """Where systemd runs: the conffile's ports moved to free ones, the service started and checked."""
    port, http_port = testlib.free_port(), testlib.free_port()
    with open(DEFAULTS, encoding="utf-8") as f:
        text = f.read()
    text = re.sub(r"^BEANGATE_PORT=.*$", "BEANGATE_PORT=%d" % port, text, flags=re.M)
    text = re.sub(r"^BEANGATE_HTTP_PORT=.*$", "BEANGATE_HTTP_PORT=%d" % http_port, text, flags=re.M)
    with open(DEFAULTS, "w", encoding="utf-8") as f:
        f.write(text)
    status, out = sh(["systemctl", "start", "beangate.service"], timeout=60)
    check(status == 0, "systemctl start beangate failed: %s" % out)
    testlib.wait_until(lambda: testlib.port_open(port), "beangate.service on port %d" % port, READY_TIMEOUT)
    conn = testlib.LineSocket(port, 10)
    try:
        conn.s.sendall(b"put 0 0 60 5\r\nhello\r\nreserve-with-timeout 0\r\n")
        check(conn.line().startswith(b"INSERTED "), "put to beangate.service")
        check(conn.line().startswith(b"RESERVED "), "reserve from beangate.service")
        check_eq(conn.body(5), b"hello", "the reserved body")
    finally:
        conn.close()
    status, out = sh(["systemctl", "stop", "beangate.service"], timeout=60)
    check(status == 0, "systemctl stop beangate failed: %s" % out)


def test_put_and_reserve_over_tcp_and_http():
    needs("installed")
    if systemd_runs():
        systemd_service_roundtrip()
        return
    srv = started()
    line = srv.beanstalk(b"put 0 0 60 9\r\nover tcp!\r\n")
    check(line.startswith(b"INSERTED "), "put over TCP: %r" % line)
    status, reply = srv.http("POST", "/tubes/default/jobs", b"over http")
    check_eq(status, 201, "put over HTTP")
    check_eq(srv.reserve_and_delete(), b"over tcp!", "the body reserved over TCP (priority 0, before the other)")
    srv.stop()
    state["server"] = None


def test_log_survives_a_restart():
    """The job left ready above is in the log of /var/lib/beangate: a new start reserves it over HTTP."""
    needs("installed")
    if systemd_runs():
        raise Skip("systemd runs here: the service's restart is systemd's business")
    srv = started()
    status, reply = srv.http("POST", "/tubes/default/reservations?timeout=0")
    check_eq(status, 200, "reserve over HTTP after the restart")
    check(b'"body":"over http"' in reply, "the job put over HTTP before the restart: %r" % reply[:300])
    srv.stop()
    state["server"] = None
    check(any(os.scandir(STATE_DIR)), "%s is empty: the log is not where the unit says" % STATE_DIR)


def test_socket_activation():
    """The installed beangate.socket's address family, as fd 3: the server serves on it."""
    needs("installed")
    if systemd_runs():
        raise Skip("systemd runs here: socket activation is systemd's to do")
    socket_unit = {}
    with open(SOCKET_UNIT, encoding="utf-8") as f:
        for line in f:
            if line.startswith("ListenStream="):
                socket_unit.setdefault("ListenStream", []).append(line.strip().split("=", 1)[1])
    check_eq(len(socket_unit.get("ListenStream", [])), 1, "ListenStream= lines of %s (beangate uses one)" % SOCKET_UNIT)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        srv = started(listener)
        line = srv.beanstalk(b"put 0 0 60 6\r\nsocket\r\n")
        check(line.startswith(b"INSERTED "), "put on the inherited socket: %r" % line)
        srv.stop()
        state["server"] = None
    finally:
        listener.close()


# ---- upgrade, remove and purge --------------------------------------------------------------

def test_upgrade_keeps_conffile_and_log():
    """The package installed again over itself (dpkg's upgrade path: prerm upgrade, postinst configure
    with the old version) keeps a changed /etc/default/beangate and the log directory."""
    needs("installed")
    with open(DEFAULTS, "a", encoding="utf-8") as f:
        f.write("BEANGATE_VERBOSE=1\n")
    before = sorted(e.name for e in os.scandir(STATE_DIR))
    status, out = sh(APT + ["install", "-y", "--reinstall", "-o", "Dpkg::Options::=--force-confold",
                            state["deb"]], env=APT_ENV)
    check(status == 0, "reinstallation failed (%d):\n%s" % (status, out[-2000:]))
    with open(DEFAULTS, encoding="utf-8") as f:
        check(f.read().endswith("BEANGATE_VERBOSE=1\n"), "the upgrade undid the change to %s" % DEFAULTS)
    check_eq(sorted(e.name for e in os.scandir(STATE_DIR)), before, "the files of %s after the upgrade" % STATE_DIR)


def test_remove_keeps_log_and_conffile():
    needs("installed")
    status, out = sh(APT + ["remove", "-y", "beangate"], env=APT_ENV)
    check(status == 0, "apt-get remove failed (%d):\n%s" % (status, out[-2000:]))
    check(not os.path.exists(BINARY), "%s is still there after remove" % BINARY)
    check(not os.path.exists(UNIT), "%s is still there after remove" % UNIT)
    check(os.path.exists(DEFAULTS), "remove deleted the conffile %s" % DEFAULTS)
    check(os.path.isdir(STATE_DIR), "remove deleted the log directory %s" % STATE_DIR)


def purge_and_check():
    """Purge the package this test installed: binary, units, conffile and log directory gone."""
    if not state["installed"]:
        return
    if state["server"] is not None:
        state["server"].proc_holder.kill()
        state["server"] = None
    status, out = sh(APT + ["purge", "-y", "beangate"], env=APT_ENV)
    check(status == 0, "apt-get purge failed (%d):\n%s" % (status, out[-2000:]))
    state["installed"] = False
    check_eq(package_status(), "", "dpkg's status of beangate after purge")
    left = [p for p in (BINARY, UNIT, SOCKET_UNIT, DEFAULTS, STATE_DIR) if os.path.exists(p)]
    check(not left, "still there after purge: %s" % " ".join(left))


def test_purge_removes_everything():
    needs("installed")
    purge_and_check()


def cleanup_after_all():
    """Whatever happened: a package this test installed is purged, its build directory removed."""
    try:
        purge_and_check()
    finally:
        if state["out"]:
            shutil.rmtree(state["out"], ignore_errors=True)


STATIC_TESTS = [test_build_depends_match_install_deps, test_defaults_file_names_known_variables]
INSTALL_TESTS = [test_build_depends_match_install_deps, test_build, test_lintian, test_install,
                 test_defaults_are_documented_values, test_put_and_reserve_over_tcp_and_http,
                 test_log_survives_a_restart, test_socket_activation, test_upgrade_keeps_conffile_and_log,
                 test_remove_keeps_log_and_conffile,
                 test_purge_removes_everything]
ARGS = None

if __name__ == "__main__":
    parser = testlib.arg_parser(__doc__, binary="optional")
    parser.add_argument("--install", action="store_true",
                        help="build, install, run and purge the package (root; changes the system)")
    ARGS = testlib.parse_args(parser, sys.argv)
    if not ARGS.install:
        if not ARGS.binary:
            parser.error("give the beangate binary (or --install)")
        sys.exit(testlib.run("package", STATIC_TESTS, ARGS))
    if not ARGS.list:
        # checked before the run: its `last` cleanup would count as a pass
        try:
            setup(None)
        except Skip as e:
            print("SKIP setup: %s" % e, flush=True)
            print("package: 0 passed, 0 failed, 1 skipped", flush=True)
            sys.exit(77)
    sys.exit(testlib.run("package", INSTALL_TESTS, ARGS, last=[cleanup_after_all]))
