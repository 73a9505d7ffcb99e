#!/usr/bin/env bash
# make test: go test -race -count=1 ./... in every module of the repository
# (the root and each nested go.mod, which the root's ./... does not reach).
# The root's ./... holds its unit tests and ./integration, its real-server
# tests, which start their server through internal/testserver.
# The modules run side by side (each test binary starts its own servers;
# much of a module's time is spent waiting on them), examples/outgress
# after the others; each module's output is kept and printed whole, in
# order, when it is done. Every module runs
# even when one fails; the failures are listed at the end. After each
# module it prints how many real-server tests ran and how many skipped for
# want of a server (go test alone prints "ok" either way).
# examples/outgress is tested as a user would have it: a copy outside the
# repository (examples/outgress/scripts/standalone.sh), which also proves
# that it stands on its own.
# Two modules are left out unless asked for, so that a plain make test
# downloads nothing it will not run:
#   internal/containertest  only with VALKEY_IMAGE set (needs a Docker engine)
#   benchmarks              benchmarks only (see BENCHMARKS.md); make lint builds it
set -uo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# module DIR: tests one module and prints how many of its real-server tests
# ran and skipped, the skipped count last, alone on its line, for the tally.
module() {
  local mod=$1 tally=$work/tally.${1//\//_} start=$SECONDS rc=0
  : >"$tally"
  if [ "$mod" = ./examples/outgress ]; then
    echo "== go build, vet and test -race -count=1 ./... in a copy of $mod outside the repository"
    ADMIT_SERVER_TALLY="$tally" bash "$mod/scripts/standalone.sh" -race -count=1 || rc=$?
  else
    echo "== go test -race -count=1 ./... in $mod"
    (cd "$mod" && ADMIT_SERVER_TALLY="$tally" go test -race -count=1 ./...) || rc=$?
  fi
  # A name that ran on a server is not also counted as skipped.
  local ran skipped n_ran n_skipped
  ran=$(awk -F'\t' '$1 == "ran" { print $2 "\t" $3 }' "$tally" | sort -u)
  skipped=$(awk -F'\t' '$1 == "skipped" { print $2 "\t" $3 }' "$tally" | sort -u | comm -23 - <(echo "$ran"))
  n_ran=$(grep -c . <<<"$ran" || true) n_skipped=$(grep -c . <<<"$skipped" || true)
  echo "   real-server tests in $mod: $n_ran ran, $n_skipped skipped ($((SECONDS - start)) s for the module)"
  echo "$n_skipped" >"$tally.skipped"
  return $rc
}

mods=() pids=()
for mod in $(find . -name go.mod -not -path './.git/*' | sed 's|/go.mod$||' | sort); do # no -printf: BSD find (macOS) lacks it
  case $mod in
  ./internal/containertest)
    if [ -z "${VALKEY_IMAGE:-}" ]; then
      echo "== skipped $mod: set VALKEY_IMAGE=valkey/valkey:8.0 where a Docker engine runs (docs/testing.md)"
      continue
    fi ;;
  ./benchmarks)
    echo "== skipped $mod: benchmarks only (BENCHMARKS.md)"
    continue ;;
  esac
  if [ "$mod" = ./examples/outgress ]; then
    continue # after the others (below)
  fi
  module "$mod" >"$work/log.${#mods[@]}" 2>&1 &
  pids+=($!) mods+=("$mod")
done
# examples/outgress after the others, not beside them: its load test runs
# two CPU hogs, which would slow the timing of the library's own tests.
failed=() skipped_total=0
# done_module I RC: module I ended with RC; prints its log and counts it.
done_module() {
  local mod=${mods[$1]}
  [ "$2" = 0 ] || failed+=("$mod")
  cat "$work/log.$1"
  skipped_total=$((skipped_total + $(cat "$work/tally.${mod//\//_}.skipped" 2>/dev/null || echo 0)))
}
for i in "${!pids[@]}"; do
  rc=0
  wait "${pids[$i]}" || rc=$?
  done_module "$i" "$rc"
done
if [ -d ./examples/outgress ]; then
  mods+=(./examples/outgress) rc=0
  module ./examples/outgress >"$work/log.$((${#mods[@]} - 1))" 2>&1 || rc=$?
  done_module $((${#mods[@]} - 1)) "$rc"
fi
if [ "$skipped_total" -gt 0 ]; then
  echo "$skipped_total real-server tests skipped: no Valkey server. Put valkey-server on PATH or set"
  echo "VALKEY_SERVER=/path/to/valkey-server (or VALKEY_ADDR=host:port); see docs/testing.md."
fi
if [ ${#failed[@]} -gt 0 ]; then
  echo "make test: FAILED in ${failed[*]}" >&2
  exit 1
fi
