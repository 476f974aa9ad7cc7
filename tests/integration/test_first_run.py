#!/usr/bin/env python3
"""The first run of a new user: the README and the two commands it starts with.

Usage: python3 tests/integration/test_first_run.py

Checks, with the files of this checkout:
- README.md starts with exactly two commands: scripts/run.sh, scripts/test.sh;
- it links every document: docs/*.md and the man page docs/beangate.1, and
  every relative link in it leads to a file that exists;
- its shell examples use only commands that a fresh Debian has, or say what
  to install (`apt-get install PACKAGE`) for the others. "A fresh Debian" is
  Debian 12 with its required and important packages (what debootstrap
  installs by default): no curl, nc, telnet, git, sudo, man or python3;
- the container stage (docker/smoke-test, and scripts/test.sh container)
  is skipped with its reason, and passes, where `docker info` and
  `podman info` fail; a forced engine that fails is a failure; a working
  docker (or podman) is used;
- nothing but .ci/run names the CI machines' podman wrapper;
- every test suite (tests/unit/test_*.c, tests/*/test_*.py, tests/*/run_*.sh)
  is registered in tests/CMakeLists.txt, with no `if(EXISTS ...)` that would
  let one vanish when its file is missing.

Python 3 standard library only. The runner is tests/lib/testlib.py's (-k NAME
runs one test); the last line is `first-run: N passed, M failed, K skipped`;
exit status 1 if any failed.
"""

import os
import re
import shlex
import stat
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import testlib  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
README = os.path.join(REPO, "README.md")
SKIP_STATUS = 77

# Commands of Debian 12's required and important packages, and bash's
# builtins, that examples may use without saying anything.
FRESH = set("""
    . [ alias bg cd command echo eval exec exit export false fg jobs kill printf pwd read
    set shift source test trap true type ulimit umask unset wait
    awk basename cat chmod chown cmp cp cut date dd df diff dirname du env find flock free
    grep gzip head hostname id install ip journalctl less ln ls mkdir mktemp more mv nano
    nproc od pgrep pidof pkill ping ps readlink realpath rm rmdir sed seq sh sleep sort ss
    stat su systemctl tail tar tee timeout touch tr uname uniq unshare vi wc xargs yes
""".split())

# Commands a fresh Debian lacks, and the package that has them: an example
# may use one if the README says `apt-get install PACKAGE` somewhere.
NEEDS = {
    "curl": "curl", "wget": "wget", "nc": "netcat-openbsd", "telnet": "telnet", "git": "git",
    "sudo": "sudo", "man": "man-db", "python3": "python3", "jq": "jq", "docker": "docker.io",
    "podman": "podman", "podman-compose": "podman-compose", "gearman": "gearman-tools",
    "gearadmin": "gearman-tools", "beanstalkd": "beanstalkd", "node": "nodejs", "npm": "npm",
    "cmake": "cmake", "make": "make", "gcc": "gcc", "promtool": "prometheus",
}

# The project's own programs.
OWN = ("scripts/", "build/", "build-asan/", "docker/", "tests/", "bench/", "fuzz/", ".ci/", "./")

SEPARATORS = {"|", "||", "&&", ";", "&", "(", ")", "{", "}", "!", "$", "`"}
REDIRECTIONS = {"<", ">", ">>", "<>", ">&", "<&", "&>", "&>>", ">|", "<<", "<<<"}


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def readme():
    with open(README, encoding="utf-8") as f:
        return f.read()


def shell_blocks(text):
    """The ```sh blocks of a markdown text: lists of logical lines."""
    blocks = []
    for m in re.finditer(r"^```(?:sh|bash|shell)\n(.*?)^```$", text, re.S | re.M):
        joined = re.sub(r"\\\n", " ", m.group(1))
        blocks.append([ln for ln in joined.splitlines() if ln.strip()])
    return blocks


def command_words(line):
    """The program name of every simple command on a shell line."""
    lex = shlex.shlex(line, posix=True, punctuation_chars="();<>|&")
    lex.whitespace_split = True
    lex.commenters = "#"
    words, expect_command, skip_next = [], True, False
    for tok in lex:
        if skip_next:
            skip_next = False
            continue
        if tok in SEPARATORS:
            expect_command = True
            continue
        if tok in REDIRECTIONS:
            skip_next = True
            continue
        if expect_command:
            if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", tok) or re.match(r"^\d+$", tok):
                continue        # an assignment before the command, or a redirection's fd
            words.append(tok)
            expect_command = False
    return words


def test_readme_starts_with_the_two_commands():
    text = readme()
    m = re.match(r"```sh\n(.*?)\n```\n", text, re.S)
    check(m, "README.md does not start with a ```sh block: %r" % text[:200])
    lines = m.group(1).splitlines()
    check([ln.split()[0] for ln in lines] == ["scripts/run.sh", "scripts/test.sh"],
          "README.md's first block is not exactly scripts/run.sh and scripts/test.sh: %r" % lines)


def test_readme_links_every_document():
    text = readme()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    targets = {ln.split("#")[0] for ln in links if not re.match(r"^[a-z]+:", ln)}
    docs = sorted(n for n in os.listdir(os.path.join(REPO, "docs")) if n.endswith(".md") or n == "beangate.1")
    check("beangate.1" in docs and "user-guide.md" in docs, "docs/ lacks the man page or the user guide: %r" % docs)
    missing = ["docs/" + n for n in docs if "docs/" + n not in targets]
    check(not missing, "README.md does not link %s" % ", ".join(missing))
    broken = sorted(t for t in targets if t and not os.path.exists(os.path.join(REPO, t)))
    check(not broken, "README.md links files that do not exist: %s" % ", ".join(broken))


def test_readme_examples_run_on_a_fresh_debian():
    text = readme()
    installed = set(re.findall(r"apt-get install (?:-\S+ )*([a-z0-9][a-z0-9.+-]*(?: [a-z0-9][a-z0-9.+-]*)*)", text))
    packages = {p for group in installed for p in group.split()}
    blocks = shell_blocks(text)
    check(len(blocks) >= 3, "README.md has only %d shell blocks" % len(blocks))
    problems = []
    for block in blocks:
        for line in block:
            for word in command_words(line):
                if word in FRESH or word.startswith(OWN):
                    continue
                if word in NEEDS:
                    if NEEDS[word] not in packages:
                        problems.append("%r needs %s, and the README does not say `apt-get install %s`: %r"
                                        % (word, NEEDS[word], NEEDS[word], line))
                    continue
                problems.append("%r: not known to be on a fresh Debian (add it to FRESH or NEEDS in %s): %r"
                                % (word, os.path.basename(__file__), line))
    check(not problems, "README.md's shell examples:\n  " + "\n  ".join(problems))


def test_the_parser_sees_every_command():
    # the check above is only as good as command_words
    cases = {
        "printf 'put 0 0 60 5\\r\\nhello\\r\\n' | nc -q1 127.0.0.1 11300": ["printf", "nc"],
        "exec 3<>/dev/tcp/127.0.0.1/11300   # connect": ["exec"],
        "head -n 3 <&3 && X=1 curl -s x; sudo true": ["head", "curl", "sudo"],
        "kill -USR1 $(pidof beangate)": ["kill", "pidof"],
        "(cd build && make) >/dev/null 2>&1": ["cd", "make"],
    }
    for line, want in cases.items():
        got = command_words(line)
        check(got == want, "command_words(%r) = %r, want %r" % (line, got, want))


# ---- the container stage ----------------------------------------------------------

def fake_tools(tmp, tools):
    """A directory of fake programs: tools maps a name to (exit status of
    `NAME info`, exit status of anything else[, exit status of `NAME image`
    and `NAME pull`, 0 if not given]); every call is logged."""
    d = os.path.join(tmp, "bin")
    os.makedirs(d, exist_ok=True)
    log = os.path.join(tmp, "calls")
    for name, codes in tools.items():
        info_rc, other_rc, base_rc = (tuple(codes) + (0,))[:3]
        path = os.path.join(d, name)
        with open(path, "w") as f:
            f.write('#!/bin/sh\necho "%s $*" >>%s\n'
                    'if [ "$1" = info ]; then echo "fake %s: no engine here" >&2; exit %d; fi\n'
                    'if [ "$1" = image ] || [ "$1" = pull ]; then\n'
                    '  echo "Error: fake %s: no registry here" >&2; exit %d; fi\n'
                    'echo "fake %s: cannot $1" >&2; exit %d\n'
                    % (name, shlex.quote(log), name, info_rc, name, base_rc, name, other_rc))
        os.chmod(path, stat.S_IRWXU)
    return d, log


def run(argv, path_first, env=None, timeout=300):
    e = dict(os.environ, PATH=path_first + ":" + os.environ.get("PATH", "/usr/bin:/bin"))
    e.pop("DOCKER_SMOKE_ENGINE", None)
    e.update(env or {})
    r = subprocess.run(argv, cwd=REPO, env=e, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def calls(log):
    try:
        with open(log) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def test_container_stage_skips_without_an_engine():
    with tempfile.TemporaryDirectory() as tmp:
        d, _ = fake_tools(tmp, {"docker": (1, 1), "podman": (1, 1)})
        rc, out, err = run([os.path.join(REPO, "docker/smoke-test")], d)
        check(rc == SKIP_STATUS, "docker/smoke-test without an engine: exit %d, want %d; stdout %r stderr %r"
              % (rc, SKIP_STATUS, out[-800:], err[-800:]))
        want = ("SKIP container image: no working container engine: `docker info` fails (fake docker: no "
                "engine here); `podman info` fails (fake podman: no engine here)")
        check(want in out.splitlines(), "no line %r in %r" % (want, out))
        # the README's test command, container stage only: passes, says SKIP and why
        rc, out, err = run([os.path.join(REPO, "scripts/test.sh"), "container"], d)
        check(rc == 0, "scripts/test.sh container without an engine: exit %d; stdout %r stderr %r"
              % (rc, out[-800:], err[-800:]))
        lines = out.splitlines()
        check(lines and lines[-1].startswith("all test suites passed (container), 1 skipped"),
              "last line of scripts/test.sh: %r" % lines[-3:])
        check(("SKIP " + want[len("SKIP "):]) in lines, "scripts/test.sh did not print %r: %r" % (want, lines))


def test_container_stage_forced_engine_fails():
    with tempfile.TemporaryDirectory() as tmp:
        d, log = fake_tools(tmp, {"docker": (1, 1), "podman": (1, 1), "wrapper": (0, 1)})
        rc, out, _ = run([os.path.join(REPO, "docker/smoke-test")], d,
                         env={"DOCKER_SMOKE_ENGINE": os.path.join(d, "wrapper")})
        check(rc == 1, "a forced engine that cannot build: exit %d, want 1; stdout %r" % (rc, out[-800:]))
        check("SKIP" not in out and "FAIL image builds" in out, "stdout %r" % out[-800:])
        check(any(c.startswith("wrapper build") for c in calls(log)), "the forced engine was not asked to "
              "build: %r" % calls(log))


def test_container_stage_uses_a_working_engine():
    for tools, used in (({"docker": (0, 1), "podman": (0, 1)}, "docker build -t"),
                        ({"docker": (1, 1), "podman": (0, 1)}, "podman build --format docker")):
        with tempfile.TemporaryDirectory() as tmp:
            d, log = fake_tools(tmp, tools)
            rc, out, _ = run([os.path.join(REPO, "docker/smoke-test")], d)
            check(rc == 1 and "FAIL image builds" in out, "%r: exit %d, stdout %r" % (tools, rc, out[-800:]))
            check(any(c.startswith(used) for c in calls(log)), "%r: no `%s` call: %r" % (tools, used, calls(log)))


def test_container_stage_skips_without_the_base_image():
    """A working engine that can neither find nor pull the Dockerfile's base
    image (no network) skips with the reason; a forced engine does not."""
    with tempfile.TemporaryDirectory() as tmp:
        d, log = fake_tools(tmp, {"docker": (1, 1), "podman": (0, 1, 1)})
        rc, out, err = run([os.path.join(REPO, "docker/smoke-test")], d)
        check(rc == SKIP_STATUS, "an engine without the base image: exit %d, want %d; stdout %r stderr %r"
              % (rc, SKIP_STATUS, out[-800:], err[-800:]))
        want = ("SKIP container image: podman cannot fetch the base image debian:bookworm-slim: "
                "Error: fake podman: no registry here")
        check(want in out.splitlines(), "no line %r in %r" % (want, out))
        check(not any(c.startswith("podman build") for c in calls(log)), "it built anyway: %r" % calls(log))
        rc, out, _ = run([os.path.join(REPO, "docker/smoke-test")], d,
                         env={"DOCKER_SMOKE_ENGINE": os.path.join(d, "podman")})
        check(rc == 1 and "SKIP" not in out, "a forced engine without the base image: exit %d, stdout %r"
              % (rc, out[-800:]))


def test_only_ci_names_the_ci_wrapper():
    try:
        files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                               check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        files = [os.path.relpath(os.path.join(dp, f), REPO) for dp, dns, fs in os.walk(REPO)
                 for f in fs if not dp.startswith(os.path.join(REPO, "build"))]
    needle = "shared/tools/" + "podman-local"   # split, so that this file does not name it
    naming = []
    for rel in files:
        try:
            with open(os.path.join(REPO, rel), encoding="utf-8", errors="replace") as f:
                if needle in f.read():
                    naming.append(rel)
        except (IsADirectoryError, FileNotFoundError):
            continue
    check(naming == [".ci/run"], "files that name %s: %r (want only .ci/run)" % (needle, naming))


def test_every_suite_is_registered_with_ctest():
    """A suite that ctest does not run is a suite that silently passes."""
    with open(os.path.join(REPO, "tests", "CMakeLists.txt"), encoding="utf-8") as f:
        cmake = f.read()
    check("if(EXISTS" not in cmake.replace(" ", ""),
          "tests/CMakeLists.txt registers a suite only if its file exists: a missing file must fail")
    suites = []
    for sub, names in sorted((os.path.relpath(dp, os.path.join(REPO, "tests")), fs)
                             for dp, _, fs in os.walk(os.path.join(REPO, "tests"))):
        for name in names:
            if re.match(r"^(test_\w+\.(c|py)|run_\w+\.sh)$", name) and os.sep not in sub:
                suites.append(os.path.join(sub, name))
    check(len(suites) >= 10, "only %d suite files found under tests/: %r" % (len(suites), suites))
    missing = [s for s in suites if s not in cmake]
    check(not missing, "suites not registered in tests/CMakeLists.txt: %s" % ", ".join(missing))


TESTS = [
    test_readme_starts_with_the_two_commands,
    test_readme_links_every_document,
    test_the_parser_sees_every_command,
    test_readme_examples_run_on_a_fresh_debian,
    test_container_stage_skips_without_an_engine,
    test_container_stage_forced_engine_fails,
    test_container_stage_uses_a_working_engine,
    test_container_stage_skips_without_the_base_image,
    test_only_ci_names_the_ci_wrapper,
    test_every_suite_is_registered_with_ctest,
]


if __name__ == "__main__":
    sys.exit(testlib.main_without_binary("first-run", __doc__, TESTS, sys.argv, globals()))
