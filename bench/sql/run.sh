#!/usr/bin/env bash
# Push-function benchmark: stile.push (forced probe, vouched, retry, window 0) against
# the plain unique-index table. Needs a PostgreSQL reachable with libpq's
# defaults or STILE_TEST_DATABASE_URL; creates and drops its own database.
#
#   bench/sql/run.sh                       # every mode, window and segment size (~5 min)
#   bench/sql/run.sh --sizes 100 --windows 0,100000 --reps 3
#
# Arguments go to the program (bench/src/bin/sql_bench.rs); --help lists them.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p stile-bench --bin sql_bench
exec target/release/sql_bench "$@"
