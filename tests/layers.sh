#!/usr/bin/env bash
# layers.sh - the include arrows point down only (docs/architecture.md, §1).
#
#   server/   may include anything below it
#   gateway/  core/, io/, gateway/     (a front-end: never server/)
#   io/       core/, io/               (never a front-end or server/)
#   core/     core/ only               (pure)
#
# Every `#include "..."` of every .c and .h file in those four directories
# is resolved against the including file's directory; a target in a layer
# the file may not use is printed, and the test fails. System includes
# (<...>) are not arrows between our layers and are not looked at.
#
# usage: tests/layers.sh [SOURCE_ROOT]     (default: the checkout of this script)
set -u
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root" || exit 2

# The layers a file in layer $1 may include, space separated.
allowed() {
    case $1 in
        core) echo "core" ;;
        io) echo "core io" ;;
        gateway) echo "core io gateway" ;;
        server) echo "core io gateway server" ;;
    esac
}

bad=0 arrows=0
for layer in core io gateway server; do
    [ -d "$layer" ] || continue
    ok=" $(allowed "$layer") "
    while IFS= read -r file; do
        dir=$(dirname "$file")
        # the quoted includes of this file, one per line
        while IFS= read -r target; do
            [ -n "$target" ] || continue
            arrows=$((arrows + 1))
            resolved=$(realpath -m --relative-to=. "$dir/$target")
            to=${resolved%%/*}
            [ "$to" = "$resolved" ] && to=.   # a file at the root
            case $ok in
                *" $to "*) ;;
                *) echo "layers: $file includes \"$target\" ($to/): $layer/ may include only $(allowed "$layer" | sed 's/ /, /g')"
                   bad=$((bad + 1)) ;;
            esac
        done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$file")
    done < <(find "$layer" -name '*.[ch]' | sort)
done

if [ "$arrows" -eq 0 ]; then
    echo "layers: no #include \"...\" found under $root: wrong directory?"
    exit 1
fi
if [ "$bad" -ne 0 ]; then
    echo "layers: $bad include(s) point up or sideways ($arrows looked at)"
    exit 1
fi
echo "layers: $arrows includes, every one points down or within its layer"
