#!/usr/bin/env bash
# Build the Debian package beangate_<version>_<arch>.deb (debian/) into OUT_DIR:
#
#   scripts/build-deb.sh [OUT_DIR]       # default: build-deb/
#
# Runs `dpkg-buildpackage -us -uc -b` on a temporary copy of the source (git's
# tracked and untracked-but-not-ignored files; without git, the tree less its
# build directories), so the checkout stays clean. Needs debhelper and the
# build packages of scripts/install-deps.sh (debian/control's
# Build-Depends). The package's version is debian/changelog's, which must be
# the program's own (BEANGATE_VERSION in core/core.h): a mismatch stops the
# build. Prints the path of the .deb on its last line.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "${1:-$repo/build-deb}" && cd "${1:-$repo/build-deb}" && pwd)

program_version=$(sed -n 's/^#define BEANGATE_VERSION "\(.*\)"$/\1/p' "$repo/core/core.h")
package_version=$(cd "$repo" && dpkg-parsechangelog -S Version)
if [ "$package_version" != "$program_version" ]; then
    echo "build-deb: debian/changelog says $package_version, core/core.h's BEANGATE_VERSION $program_version:" \
         "add a changelog entry (dch -v $program_version)" >&2
    exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
src="$work/beangate-$package_version"
mkdir "$src"
if git -C "$repo" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    # a file deleted in the work tree but still in the index is left out
    (cd "$repo" && git ls-files -z --cached --others --exclude-standard) |
        tar -C "$repo" --null -T - --ignore-failed-read -cf - 2>/dev/null | tar -C "$src" -xf -
else
    tar -C "$repo" --exclude='./build*' --exclude='./cmake-build*' --exclude='./.git' -cf - . | tar -C "$src" -xf -
fi
[ -f "$src/debian/rules" ] || { echo "build-deb: no debian/rules in the copy of $repo" >&2; exit 1; }

(cd "$src" && dpkg-buildpackage -us -uc -b) >"$work/build.log" 2>&1 || {
    tail -n 40 "$work/build.log" >&2
    echo "build-deb: dpkg-buildpackage failed (the last lines above)" >&2
    exit 1
}
arch=$(dpkg-architecture -qDEB_HOST_ARCH)
deb="beangate_${package_version}_${arch}.deb"
# the package, its debug symbols (beangate-dbgsym) and the build's record
# (.changes, .buildinfo: lintian checks them too)
cp "$work"/beangate*_"${package_version}"_"${arch}".{deb,changes,buildinfo} "$out/"
echo "$out/$deb"
