#!/usr/bin/env bash
# The clock table: two gateways whose wall clocks are off PostgreSQL's (libfaketime), kill -9
# every 20 s, PostgreSQL restarted every 60 s, producers retrying; every answer checked against
# SQL afterwards. Prints one line per row: the offsets, the window, and the checker's verdict.
#
#   cargo build --release -p stile -p stile-tests
#   bench/checker/clock-table.sh
#
# A row of the 120 s window runs for 240 s, so that ids leave the window and may be stored again;
# a row of the 3,600 s window runs for 120 s (a clock off by more than the window makes every
# stored id look expired to a cache that trusts the gateway's clock, at once).
#
# STILE_BIN=path runs another gateway binary (for instance an older build) through the same rows;
# CHECKER=path another checker.
set -uo pipefail
cd "$(dirname "$0")/../.."
rows=(
  "+2,-2 120 240"
  "+30,-30 120 240"
  "+90,-90 120 240"
  "-150,-150 120 240"
  "+150,+150 120 240"
  "+1800,-1800 3600 120"
  "+7200,-7200 3600 120"
  "+7200:-7200,-7200:+7200 3600 120"
)
for row in "${rows[@]}"; do
  read -r clocks window seconds <<<"$row"
  out=$("${CHECKER:-target/release/checker}" --roles plain --gateways 2 --clocks "$clocks" --window "$window" \
    --seconds "$seconds" --kill-every 20 --pg-restart-every 60 --short-window 0 2>&1)
  status=$?
  printf '%-26s window %5s s | %s | %s | %s | exit %s\n' "$clocks" "$window" \
    "$(grep -m1 '^answers:' <<<"$out")" "$(grep -m1 '^stored:' <<<"$out")" "$(grep -m1 '^violations:' <<<"$out")" "$status"
done
