# Sourced by the scripts beside it, from the repository's root, with a name:
#   source bench/sql/fresh_database.sh NAME
# Creates the database stile_t_NAME_<pid> (in $db; psql's connection flags in
# $conn), has a gateway of this build install the schema and functions in it,
# and drops it when the script exits.
db="stile_t_${1}_$$"
conn=(-h "${PGHOST:-127.0.0.1}" -U "${PGUSER:-postgres}")
psql "${conn[@]}" -d postgres -qc "CREATE DATABASE $db"
trap 'psql "${conn[@]}" -d postgres -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)"' EXIT
port=$((20000 + $$ % 20000))
target/release/stile serve --listen "127.0.0.1:$port" \
    --database-url "host=${PGHOST:-127.0.0.1} user=${PGUSER:-postgres} dbname=$db" >/dev/null 2>&1 &
gateway=$!
until curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; do
    kill -0 "$gateway" 2>/dev/null || { echo "the gateway exited before it served" >&2; exit 1; }
    sleep 0.2
done
kill "$gateway"; wait "$gateway" || true
