#!/usr/bin/env bash
# Property-based fuzzing of the HTTP API from its OpenAPI document
# (host/openapi.json): schemathesis, pinned in requirements.txt beside this
# script, generates valid and invalid requests for every operation and sends
# them to a real gateway (target/release/stile) on a fresh database. No answer
# may be a 5xx, and every documented answer must match its schema. Afterwards
# SQL holds what PostgreSQL stored to the exactness invariant: no
# transactionId stored twice within a partition.
#
#   tests/api-fuzz/run.sh [SECONDS]      (default 240, or $API_FUZZ_SECONDS)
#
# hooks.py beside this script tells schemathesis how to draw what the
# schema alone cannot (a timer's payload: base64 of JSON).
#
# SECONDS is the time schemathesis runs, in two passes: every operation but
# configure first (so every queue keeps its one-hour window and any second
# copy of an id is a violation), then the invariant, then configure alone.
# Needs `cargo build --release -p stile` and PostgreSQL on 127.0.0.1:5432
# with trust authentication, as $PGUSER (else postgres, else root). The
# venv is target/api-fuzz-venv; logs and reports go to target/api-fuzz/.
# Exits non-zero on any failure; schemathesis prints a curl command that
# reproduces each one, and $API_FUZZ_SEED repeats a run's generation.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

seconds="${1:-${API_FUZZ_SECONDS:-240}}"
seed="${API_FUZZ_SEED:-$RANDOM$RANDOM}"
stile="$root/target/release/stile"
venv="$root/target/api-fuzz-venv"
out="$root/target/api-fuzz"
document="$root/host/openapi.json"

say() { printf 'api-fuzz: %s\n' "$*"; }

[ -x "$stile" ] || { say "$stile is missing: cargo build --release -p stile" >&2; exit 2; }
mkdir -p "$out"

# A Python without CPython's spurious "AST constructor recursion depth
# mismatch" SystemError (gh-106905: 3.11 before 3.11.8, 3.12 before 3.12.2),
# which Hypothesis, under schemathesis, runs into at random on deep schemas.
usable_python() {
    "$1" -c 'import sys
v = sys.version_info[:3]
sys.exit(0 if v >= (3, 10) and not ((3, 11) <= v < (3, 11, 8) or (3, 12) <= v < (3, 12, 2)) else 1)' 2>/dev/null
}
# The venv, made and kept as the Queen client test keeps its own; made again
# when its interpreter is one of those.
if [ -x "$venv/bin/python" ] && ! usable_python "$venv/bin/python"; then
    rm -rf "$venv"
fi
if [ ! -x "$venv/bin/python" ]; then
    python=""
    pyenv_root=$(pyenv root 2>/dev/null || true)
    for candidate in ${API_FUZZ_PYTHON:-} python3 python3.14 python3.13 python3.12 python3.10 \
        $( [ -n "$pyenv_root" ] && ls -d "$pyenv_root"/versions/3.*/bin/python3 2>/dev/null | sort -rV ); do
        if usable_python "$candidate"; then
            python=$candidate
            break
        fi
    done
    [ -n "$python" ] || { say "no usable Python 3.10+ (see usable_python; set API_FUZZ_PYTHON)" >&2; exit 2; }
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r tests/api-fuzz/requirements.txt

# The PostgreSQL role: $PGUSER, or the first of postgres and root that the
# server lets in.
user="${PGUSER:-}"
if [ -z "$user" ]; then
    for candidate in postgres root; do
        if psql -h 127.0.0.1 -p 5432 -U "$candidate" -d postgres -XAtqc 'SELECT 1' >/dev/null 2>&1; then
            user=$candidate
            break
        fi
    done
fi
[ -n "$user" ] || { say "no PostgreSQL role on 127.0.0.1:5432 lets this script in (set PGUSER)" >&2; exit 2; }

# A database of its own, named as the Rust tests name theirs.
db="stile_t_$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
psql_db() { psql -h 127.0.0.1 -p 5432 -U "$user" -d "$db" -X -v ON_ERROR_STOP=1 "$@"; }
createdb -h 127.0.0.1 -p 5432 -U "$user" "$db"

gateway_pid=""
cleanup() {
    if [ -n "$gateway_pid" ] && kill -0 "$gateway_pid" 2>/dev/null; then
        kill -TERM "$gateway_pid" 2>/dev/null || true
        wait "$gateway_pid" 2>/dev/null || true
    fi
    dropdb -h 127.0.0.1 -p 5432 -U "$user" --force --if-exists "$db" || true
}
trap cleanup EXIT

port=$("$venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
url="http://127.0.0.1:$port"
say "gateway on $url, database $db (role $user), seed $seed, ${seconds} s of fuzzing"
"$stile" serve --listen "127.0.0.1:$port" --database-url "host=127.0.0.1 port=5432 user=$user dbname=$db" \
    >"$out/gateway.log" 2>&1 &
gateway_pid=$!
for _ in $(seq 1 60); do
    curl -sf "$url/health" >/dev/null 2>&1 && break
    kill -0 "$gateway_pid" 2>/dev/null || { cat "$out/gateway.log" >&2; say "the gateway exited" >&2; exit 1; }
    sleep 0.5
done
curl -sf "$url/health" >/dev/null || { cat "$out/gateway.log" >&2; say "the gateway did not answer /health" >&2; exit 1; }

# The document the gateway serves must be the one kept in the repository.
cmp -s <(curl -sf "$url/api/v1/openapi.json") "$document" \
    || { say "GET /api/v1/openapi.json differs from host/openapi.json" >&2; exit 1; }

failed=0
fuzz() {
    local name=$1 budget=$2
    shift 2
    say "schemathesis: $name (${budget} s)"
    # From target/api-fuzz, where schemathesis keeps the failures it found
    # (.schemathesis/) and replays them first on the next run.
    (cd "$out" && SCHEMATHESIS_HOOKS="$root/tests/api-fuzz/hooks.py" "$venv/bin/schemathesis" run "$document" --url "$url" \
        --checks not_a_server_error,response_schema_conformance \
        --max-time "$budget" --max-examples 100 --workers 2 --seed "$seed" \
        --request-timeout 30 --generation-database none --suppress-health-check all \
        --report junit --report-junit-path "$out/$name.junit.xml" --no-color "$@") \
        2>&1 | tee "$out/$name.log" \
        || failed=1
    kill -0 "$gateway_pid" 2>/dev/null || { say "the gateway died during $name" >&2; failed=1; }
}

first=$((seconds * 5 / 6))
fuzz every-operation "$((first > 0 ? first : 1))" --exclude-operation-id configure

# The exactness invariant. No configure ran, so every queue kept the default
# window of an hour, longer than this run: a transactionId stored twice in a
# partition (by a push, a transaction or a timer's fire) is a duplicate the
# gateway failed to see. It is checked on both stored forms: the ids in
# stile.segments and their hashes in stile.txns.
say "the exactness invariant"
windows=$(psql_db -XAtqc "SELECT count(*) FROM stile.queues WHERE dedup_window_seconds <> 3600")
[ "$windows" = 0 ] || { say "$windows queues have another window; the invariant below assumes an hour" >&2; failed=1; }
stored_twice=$(psql_db -XAtq <<'SQL'
SELECT p.queue || ' / ' || p.name || ' / ' || left(d.txn, 80) || ': ' || d.copies || ' copies'
  FROM (SELECT s.partition_id, t.txn, count(*) AS copies
          FROM stile.segments s
         CROSS JOIN LATERAL unnest(s.transaction_ids) AS t(txn)
         GROUP BY s.partition_id, t.txn
        HAVING count(*) > 1) d
  JOIN stile.partitions p ON p.id = d.partition_id
UNION ALL
SELECT 'partition ' || d.partition_id || ', hash ' || encode(d.h, 'hex') || ': ' || d.copies || ' copies'
  FROM (SELECT x.partition_id, h.h, count(*) AS copies
          FROM stile.txns x
         CROSS JOIN LATERAL stile.unnest_hashes(x.hashes) AS h
         GROUP BY x.partition_id, h.h
        HAVING count(*) > 1) d;
SQL
)
if [ -n "$stored_twice" ]; then
    say "stored twice within a partition:" >&2
    printf '%s\n' "$stored_twice" >&2
    failed=1
fi
psql_db -XAtq -F ' ' <<'SQL' | while read -r what count; do say "stored: $count $what"; done
SELECT 'messages', coalesce(sum(end_offset - base_offset + 1), 0) FROM stile.segments
UNION ALL SELECT 'partitions', count(*) FROM stile.partitions
UNION ALL SELECT 'keys', count(*) FROM stile.kv
UNION ALL SELECT 'pending-timers', count(*) FROM stile.timers;
SQL

fuzz configure "$((seconds - first > 0 ? seconds - first : 1))" --include-operation-id configure

if grep -n "panicked" "$out/gateway.log" >&2; then
    say "the gateway panicked (target/api-fuzz/gateway.log)" >&2
    failed=1
fi
if [ "$failed" != 0 ]; then
    say "FAILED (seed $seed; logs in target/api-fuzz/)" >&2
    exit 1
fi
say "no 5xx, every answer as documented, no transactionId stored twice"
