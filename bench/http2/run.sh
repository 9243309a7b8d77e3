#!/usr/bin/env bash
# Single-message pushes over HTTP/2 (a few connections, many streams each) against HTTP/1.1 (one
# request in flight on each of many connections), in one run, alternated, with h2load (Debian's
# `nghttp2-client`) as the client of both. Prints the rate and the gateway's and PostgreSQL's CPU
# per 1,000 messages of each run, and their medians.
#
#   cargo build --release -p stile
#   bench/http2/run.sh            # ROUNDS=3 SECS=15 H2="8x32" H1=256
#
# Every push carries one message without a transactionId, so each is a new message (a body
# h2load cannot vary): the comparison is of the transport, the bundling behind it being the same.
# One h2load runs per partition (PARTS=4), each with its share of the connections.
# One gateway with its defaults serves every run, on a database made for the run and dropped after.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-3}
SECS=${SECS:-15}
H2=${H2:-8x32}
H1=${H1:-256}
PARTS=${PARTS:-4}
PORT=${PORT:-6695}
STILE=${STILE_BIN:-target/release/stile}
DB=stile_http2_$$
export PGHOST=${PGHOST:-127.0.0.1} PGUSER=${PGUSER:-postgres}
command -v h2load >/dev/null || { echo "h2load is missing: apt-get install nghttp2-client" >&2; exit 1; }

work=$(mktemp -d)
gateway=
cleanup() {
  [ -n "$gateway" ] && kill "$gateway" 2>/dev/null && wait "$gateway" 2>/dev/null
  psql -qX -d postgres -c "DROP DATABASE IF EXISTS $DB" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
psql -qX -d postgres -c "CREATE DATABASE $DB" >/dev/null
"$STILE" serve --listen "127.0.0.1:$PORT" --database-url "host=$PGHOST user=$PGUSER dbname=$DB" >"$work/gateway.log" 2>&1 &
gateway=$!
until grep -qs "listening on" "$work/gateway.log"; do
  kill -0 "$gateway" 2>/dev/null || { cat "$work/gateway.log" >&2; exit 1; }
  sleep 0.1
done
for part in $(seq 1 "$PARTS"); do
  printf '{"items":[{"queue":"h2bench","partition":"p%s","payload":{"n":1}}]}' "$part" >"$work/body-$part.json"
done
url="http://127.0.0.1:$PORT/api/v1/push"

# CPU time in clock ticks of a process, and of every PostgreSQL backend.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
pg_ticks() {
  local total=0 pid
  for pid in $(pgrep -x postgres || true); do
    total=$((total + $(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0)))
  done
  echo "$total"
}
hz=$(getconf CLK_TCK)

# Runs one h2load per partition at once, each with the given arguments and a share of the
# connections (`-c` is given per partition); prints "rate gateway_ms_per_1000 pg_ms_per_1000".
measure() {
  local g0 p0 g1 p1 part rate=0 answered=0 ok=0 out clients=()
  g0=$(ticks "$gateway"); p0=$(pg_ticks)
  for part in $(seq 1 "$PARTS"); do
    h2load "$@" -D "$SECS" --warm-up-time=2 -d "$work/body-$part.json" -H 'content-type: application/json' "$url" \
      >"$work/h2load-$part.out" 2>&1 &
    clients+=($!)
  done
  wait "${clients[@]}"
  g1=$(ticks "$gateway"); p1=$(pg_ticks)
  for part in $(seq 1 "$PARTS"); do
    out=$(cat "$work/h2load-$part.out")
    rate=$(awk -v a="$rate" -v b="$(grep -oP 'finished in [0-9.]+s, \K[0-9.]+(?= req/s)' <<<"$out")" 'BEGIN {print a + b}')
    answered=$((answered + $(grep -oP 'requests: .*? \K\d+(?= succeeded)' <<<"$out")))
    ok=$((ok + $(grep -oP 'status codes: \K\d+(?= 2xx)' <<<"$out")))
  done
  [ "$ok" = "$answered" ] || echo "not every answer was 2xx: $ok of $answered" >&2
  # The CPU counted includes the warm-up; the messages counted are those of the warm-up too, at
  # the same rate: per 1,000 the two agree.
  awk -v rate="$rate" -v secs="$SECS" -v g=$((g1 - g0)) -v p=$((p1 - p0)) -v hz="$hz" 'BEGIN {
    msgs = rate * (secs + 2);
    printf "%.0f %.2f %.2f\n", rate, g * 1000 / hz * 1000 / msgs, p * 1000 / hz * 1000 / msgs }'
}

conns=${H2%x*}
streams=${H2#*x}
[ $((conns % PARTS)) = 0 ] && [ $((H1 % PARTS)) = 0 ] || { echo "connections must divide among $PARTS partitions" >&2; exit 1; }
echo "# HTTP/2 ${conns} connections x ${streams} streams vs HTTP/1.1 ${H1} connections, over ${PARTS} partitions; ${SECS} s each, ${ROUNDS} rounds; $(nproc) cores; $(psql -qXAt -d postgres -c 'SHOW server_version') synchronous_commit=$(psql -qXAt -d postgres -c 'SHOW synchronous_commit')"
echo "round | protocol | msg/s | gateway CPU ms / 1,000 | PostgreSQL CPU ms / 1,000"
h2_rates=() h1_rates=() h2_cpu=() h1_cpu=() h2_pg=() h1_pg=()
for round in $(seq 1 "$ROUNDS"); do
  read -r rate cpu pg < <(measure -c $((conns / PARTS)) -m "$streams" -t 1)
  echo "$round | HTTP/2 ${conns}x${streams} | $rate | $cpu | $pg"
  h2_rates+=("$rate") h2_cpu+=("$cpu") h2_pg+=("$pg")
  read -r rate cpu pg < <(measure --h1 -c $((H1 / PARTS)) -m 1 -t 1)
  echo "$round | HTTP/1.1 ${H1} | $rate | $cpu | $pg"
  h1_rates+=("$rate") h1_cpu+=("$cpu") h1_pg+=("$pg")
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
m2=$(median "${h2_rates[@]}") m1=$(median "${h1_rates[@]}")
echo "median | HTTP/2 ${conns}x${streams} | $m2 | $(median "${h2_cpu[@]}") | $(median "${h2_pg[@]}")"
echo "median | HTTP/1.1 ${H1} | $m1 | $(median "${h1_cpu[@]}") | $(median "${h1_pg[@]}")"
awk -v a="$m2" -v b="$m1" 'BEGIN { printf "HTTP/2 / HTTP/1.1 rate: %.2fx\n", a / b }'
