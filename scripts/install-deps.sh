#!/usr/bin/env bash
# Install what building and testing beangate needs on Debian 12, skipping
# what is already there. Usage: scripts/install-deps.sh [build|test]
#   build: compiler, CMake, libevent, libmicrohttpd, jansson, nettle, libnats
#          (replication through NATS JetStream; beangate builds without it),
#          GnuTLS (every TLS listener) and libcurl's GnuTLS build (HTTPS push)
#   test:  build + cmocka, clang/libFuzzer, Debian's beanstalkd (the
#          reference), python3, curl and jq (the shell examples of
#          docs/http.md), node/npm (client library suites),
#          gearmand + the gearman/gearadmin tools (the Gearman reference),
#          chromium + chromium-driver + python3-selenium (the dashboard's
#          browser tests), haproxy (the sharding and failover tests' proxy, Debian's
#          HAProxy 2.6), python3-yaml (its check of the Kubernetes
#          manifests and of openapi.yaml), python3-hypothesis and
#          python3-jsonschema (the property-based tests of the HTTP API) and
#          nats-server (the replication tests' JetStream cluster),
#          openssl and gnutls-bin (the TLS tests' clients and test CA),
#          nginx-light and wrk (bench/compare's HTTPS reference),
#          redis-server (bench/compare's Redis peer, Debian's Redis 7.0),
#          debhelper and lintian (the Debian package, debian/)
set -euo pipefail
mode="${1:-test}"

pkgs=(build-essential cmake pkg-config libevent-dev libmicrohttpd-dev libjansson-dev nettle-dev libnats-dev
      libgnutls28-dev libcurl4-gnutls-dev)
if [ "$mode" = test ]; then
    pkgs+=(libcmocka-dev clang libclang-rt-14-dev beanstalkd python3 procps iproute2 curl jq prometheus util-linux
           gearman-job-server gearman-tools chromium chromium-driver python3-selenium haproxy python3-yaml
           python3-hypothesis python3-jsonschema nats-server
           openssl gnutls-bin python3-cryptography nginx-light wrk redis-server debhelper lintian)
fi

missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# node and npm may come from Debian or from another packaging of Node.js
# that bundles npm (and conflicts with Debian's npm): check the commands
if [ "$mode" = test ]; then
    command -v node >/dev/null || missing+=(nodejs)
    command -v npm >/dev/null || missing+=(npm)
fi
[ ${#missing[@]} -eq 0 ] && exit 0

sudo_cmd=()
[ "$(id -u)" = 0 ] || sudo_cmd=(sudo)
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# Installing Debian's beanstalkd must not start it as a service on 11300,
# gearman-job-server a gearmand on 4730, nats-server one on 4222, redis-server
# one on 6379, nor haproxy
# its default /etc/haproxy/haproxy.cfg: the tests pick their own ports
# and must not share a machine with a stray server. policy-rc.d tells the
# packages not to start anything.
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | "${sudo_cmd[@]}" tee "$policy" >/dev/null
    "${sudo_cmd[@]}" chmod +x "$policy"
    made_policy=1
fi
trap '[ $made_policy = 1 ] && "${sudo_cmd[@]}" rm -f "$policy"' EXIT
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
# In case a policy-rc.d that was already there let the service start anyway:
# stop the gearmand the package started (its pid file, not a name search).
if [ -s /run/gearman/gearmand.pid ] && command -v invoke-rc.d >/dev/null; then
    "${sudo_cmd[@]}" invoke-rc.d --force gearman-job-server stop >&2 || true
fi
if [ -s /run/haproxy.pid ] && command -v invoke-rc.d >/dev/null; then
    "${sudo_cmd[@]}" invoke-rc.d --force haproxy stop >&2 || true
fi
for service in gearman-job-server haproxy nats-server redis-server; do
    if command -v systemctl >/dev/null && systemctl is-active --quiet "$service" 2>/dev/null; then
        "${sudo_cmd[@]}" systemctl disable --now "$service" >&2 || true
    fi
done
