#!/usr/bin/env bash
# standalone.sh: proves that examples/outgress stands on its own. It copies
# the directory out of the repository, points the copy's replace of
# github.com/admitkit/admit at this checkout by absolute path (the only
# tie left, since the copy imports nothing under admit/internal), and runs
# go build, go vet and go test there. Extra arguments go to go test, for
# example: scripts/standalone.sh -race -count=1
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)   # examples/outgress
root=$(cd "$here/../.." && pwd)          # the admit checkout
# The same place for the same checkout, so that the build cache, which
# keys a package by its directory, serves the next run too.
tmp=${TMPDIR:-/tmp}/admit-outgress-standalone-$(printf %s "$root" | cksum | cut -d ' ' -f 1)
trap 'rm -rf "$tmp"' EXIT
rm -rf "$tmp" && mkdir -p "$tmp"
cp -R "$here" "$tmp/outgress"
cd "$tmp/outgress"
go mod edit -replace "github.com/admitkit/admit=$root"
if grep -rn --include='*.go' '"github.com/admitkit/admit/internal/' .; then
  echo "standalone: the copy imports admit/internal (above); it cannot build outside the repository" >&2
  exit 1
fi
echo "== outgress standalone in $tmp/outgress (replace github.com/admitkit/admit => $root)"
go build ./...
go vet ./...
go test "$@" ./...
