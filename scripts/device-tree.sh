#!/usr/bin/env bash
# The device tool sends this checkout (tracked and untracked-not-ignored files, plus what `carry` names) and
# refuses more than 64 MiB; the shipped checkpoints alone are about 60. A device command that reads only some
# of them leaves the others behind for the call, and puts them back after it:
#   bash scripts/device-tree.sh away checkpoints/infill checkpoints/multi   # out of the index and the tree
#   bash scripts/device-tree.sh size                                        # MiB that would travel
#   bash scripts/device-tree.sh back                                        # as they were
# `away` keeps them in .device-away/ (git-ignored) and takes them out of the index, so that nothing travels
# for them; commit nothing in between (the index would record them as deleted): `back` first.
set -euo pipefail
cd "$(dirname "$0")/.."
AWAY=.device-away

size() {
    git ls-files -z --cached --others --exclude-standard | xargs -0 -r du -cb 2>/dev/null | tail -1 |
        awk '{printf "%.1f MiB travel (tracked and untracked-not-ignored files; carried paths add to it)\n", $1 / 1048576}'
}

case "${1:-}" in
away)
    shift
    [ $# -gt 0 ] || { echo "usage: bash scripts/device-tree.sh away PATH..." >&2; exit 2; }
    for path in "$@"; do  # every path checked before any is moved
        path=${path%/}
        [ -e "$path" ] || { echo "device-tree: $path does not exist" >&2; exit 1; }
        [ ! -e "$AWAY/$path" ] || { echo "device-tree: $AWAY/$path exists: run 'back' first" >&2; exit 1; }
    done
    for path in "$@"; do
        path=${path%/}
        mkdir -p "$AWAY/$(dirname "$path")"
        git rm -r -q --cached "$path"
        mv "$path" "$AWAY/$path"
        echo "$path" >>"$AWAY/paths"
        echo "away: $path"
    done
    size
    ;;
back)
    [ -d "$AWAY" ] || { echo "device-tree: nothing is away"; exit 0; }
    while IFS= read -r path; do
        mkdir -p "$(dirname "$path")"
        mv "$AWAY/$path" "$path"
        git add "$path"
        echo "back: $path"
    done <"$AWAY/paths"
    rm -rf "$AWAY"
    ;;
size)
    size
    ;;
*)
    echo "usage: bash scripts/device-tree.sh away PATH... | back | size" >&2
    exit 2
    ;;
esac
