#!/usr/bin/env bash
# Instructions the server runs per script call, the 0b7bc55 baseline beside
# the shipped script, on every decision path: callgrind counts instructions,
# not seconds, so the figures repeat whatever else the machine does.
#
#   scripts/script-instructions.sh                      # valkey-server from PATH
#   SERVER=redis-server scripts/script-instructions.sh  # or another server binary
#   BASELINE=testdata/script_5550b58.lua scripts/script-instructions.sh
#                       # another baseline: a script taking the shipped arguments
#   CURRENT=/tmp/variant.lua scripts/script-instructions.sh   # a variant to weigh
#   SERVER=/opt/admit-servers/bin/valkey-server-9.1.2 scripts/script-instructions.sh
#                       # a server of server-matrix.sh (the CI machine's): a shell
#                       # wrapper, which valgrind follows into the server
#   SCOPE=processCommand scripts/script-instructions.sh
#                       # count inside another server function (default
#                       # evalShaCommand); processCommand adds the command's
#                       # dispatch
#
# The server runs under valgrind --tool=callgrind on 127.0.0.1 (a free port
# from 7390 up), counting only inside evalShaCommand (or SCOPE): the script, the
# commands it runs and the Lua garbage collector's steps, as commandstats'
# usec for EVALSHA times them (reading the request and writing the reply
# are left out, and so is the server's cron, whose share grew with the
# machine's load). valkey-benchmark (or redis-benchmark) sends CALLS
# EVALSHAs per script and path on one connection; each figure is the
# instructions of that run divided by CALLS. Each script is loaded alone
# after SCRIPT FLUSH: the collector's work grows with the Lua heap, so a
# script measured beside others loaded earlier would pay for them (40
# more scripts loaded: 2% more instructions a call). Two runs agree within
# about 1%. It needs valgrind (callgrind_control) and
# about a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
SERVER=${SERVER:-valkey-server}
CALLS=${CALLS:-2000}
BASELINE=${BASELINE:-testdata/script_0b7bc55.lua}
CURRENT=${CURRENT:-script.lua}
BENCH=$(command -v valkey-benchmark || command -v redis-benchmark)
CLI=$(command -v valkey-cli || command -v redis-cli)
port=7390
while (echo >/dev/tcp/127.0.0.1/$port) 2>/dev/null; do port=$((port + 1)); done
out=$(mktemp -d)
SCOPE=${SCOPE:-evalShaCommand}
opts=(--toggle-collect="$SCOPE")
# a wrapper script (#!) execs the server: valgrind must follow it
[ "$(head -c2 "$(command -v "$SERVER")")" = '#!' ] && opts+=(--trace-children=yes)
valgrind "${opts[@]}" --tool=callgrind --callgrind-out-file="$out/cg.out" --dump-instr=no \
  "$SERVER" --port $port --bind 127.0.0.1 --save '' --appendonly no >"$out/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -rf "$out"' EXIT
cli() { "$CLI" -p $port "$@"; }
for _ in $(seq 100); do cli ping >/dev/null 2>&1 && break; sleep 0.2; done
# instructions of CALLS runs of a command, from zeroed counters to a dump
run() {
  callgrind_control -z $server >/dev/null 2>&1
  "$BENCH" -p $port -c 1 -n "$CALLS" -q "$@" >/dev/null
  local before
  before=$(ls "$out" | grep -c '^cg.out.' || true)
  for _ in $(seq 20); do # a loaded machine may take a while to write the dump
    callgrind_control -d $server >/dev/null 2>&1 || true
    [ "$(ls "$out" | grep -c '^cg.out.' || true)" -gt "$before" ] && break
    sleep 0.5
  done
  grep -h -E '^(summary|totals):' "$(ls -t "$out"/cg.out.* | head -1)" | head -1 | awk '{print $2}'
}
open="1 1000000"        # MaxLimit, a million tokens: never runs dry
shut="3600000000 1"     # one per hour, burst 1: denies once drained
# each path: keys, then the buckets' specs
paths=("one-bucket-allowed|1|$open" "one-bucket-denied|1|$shut"
  "allowed|2|$open|$open" "denied-by-first|2|$shut|$open" "denied-by-second|2|$open|$shut")
printf '%-20s %12s %12s %8s\n' path baseline current ratio
for p in "${paths[@]}"; do
  IFS='|' read -r name n s1 s2 <<<"$p"
  declare -A got=()
  for script in baseline current; do
    case $script in
      baseline) src=$BASELINE ;; # 0b7bc55: µs per token, burst, expiry (ms)
      current) src=$CURRENT ;;   # µs per token, burst, cost
    esac
    cli script flush >/dev/null
    sha=$(cli script load "$(cat $src)")
    args=()
    for spec in "$s1" ${s2:+"$s2"}; do
      read -r per burst <<<"$spec"
      if [ $script = baseline ] && [ "$BASELINE" = testdata/script_0b7bc55.lua ]; then args+=("$per" "$burst" $(((per * burst + 999) / 1000))); else args+=("$per" "$burst" 1); fi
    done
    keys=("{$name}:$script:1"); [ "$n" = 2 ] && keys+=("{$name}:$script:2")
    cli evalsha "$sha" "$n" "${keys[@]}" "${args[@]}" >/dev/null # drains a shut bucket
    cli evalsha "$sha" "$n" "${keys[@]}" "${args[@]}" >/dev/null
    total=$(run evalsha "$sha" "$n" "${keys[@]}" "${args[@]}")
    got[$script]=$((total / CALLS))
  done
  awk -v n="$name" -v b="${got[baseline]}" -v c="${got[current]}" 'BEGIN { printf "%-20s %12d %12d %8.3f\n", n, b, c, c / b }'
done
echo "($("$SERVER" --version | cut -d' ' -f1-3), $CALLS calls a run, instructions per call inside $SCOPE)"
