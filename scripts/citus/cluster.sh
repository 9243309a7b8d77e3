#!/usr/bin/env bash
# Runs a three-node Citus cluster (a coordinator and two workers) on this machine, beside the
# system PostgreSQL 15, to try stile's layout of docs/scale-out.md.
#
#   CITUS_SRC=/path/to/citus cluster.sh build   build and install Citus unless already installed
#   cluster.sh start                            create (first time) and start the three nodes
#   cluster.sh stop                             stop them
#   cluster.sh psql [args]                      psql to the coordinator's stile database
#   cluster.sh url                              print the coordinator's URL
#   cluster.sh distribute                       migrate the stile database and distribute it
#                                               (distribute.sql beside this script)
#   cluster.sh reset                            drop the stile database and make it afresh
#   cluster.sh check [checker args]             the exactness checker against the coordinator for
#                                               CHECK_SECONDS (120), a worker and then the
#                                               coordinator restarted
#
# STILE_BIN (default target/release/stile) and CHECKER_BIN (target/release/checker) are the
# gateway and the checker of this checkout: `cargo build --release --workspace` makes both.
# CITUS_DIR (default /tmp/stile-citus) holds the data directories; ports are 5601 (coordinator),
# 5602 and 5603 (workers). Authentication is trust on 127.0.0.1: this is a test cluster.
set -euo pipefail

PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
PG_CONFIG=${PG_CONFIG:-$PG_BIN/pg_config}
[[ -x $PG_CONFIG ]] || PG_CONFIG=pg_config
CITUS_DIR=${CITUS_DIR:-/tmp/stile-citus}
CITUS_VERSION=${CITUS_VERSION:-13.2.2}
PORTS=(5601 5602 5603)
COORD=${PORTS[0]}
DB=stile
SUPERUSER=postgres

# PostgreSQL refuses to run as root, so as root the servers run as the postgres user, like the
# system cluster on port 5432 does.
if [[ $(id -u) == 0 ]]; then
    as_pg() { runuser -u postgres -- "$@"; }
else
    as_pg() { "$@"; }
fi

psql_at() {
    local port=$1 db=$2
    shift 2
    "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U "$SUPERUSER" -d "$db" "$@"
}

installed() {
    local so
    so="$("$PG_CONFIG" --pkglibdir)/citus.so"
    # The library carries its release in the string citus_version() prints, so a library of
    # another release is rebuilt rather than trusted.
    [[ -f $so ]] && grep -aq "Citus $CITUS_VERSION" "$so"
}

build() {
    if installed; then
        echo "Citus $CITUS_VERSION is already installed in $("$PG_CONFIG" --pkglibdir)."
        return
    fi
    : "${CITUS_SRC:?set CITUS_SRC to a Citus $CITUS_VERSION source directory}"
    local compat=$CITUS_SRC/src/include/pg_version_compat.h
    local dbcommands
    dbcommands="$("$PG_CONFIG" --includedir-server)/commands/dbcommands.h"
    # Newer minor releases of PostgreSQL 15 (15.20 here) declare have_createdb_privilege in
    # dbcommands.h, which clashes with the static copy Citus defines for PostgreSQL 15; renaming
    # Citus's copy lets both exist.
    if grep -q 'have_createdb_privilege' "$dbcommands" &&
        ! grep -q 'citus_have_createdb_privilege' "$compat"; then
        local line
        line=$(grep -n '^have_createdb_privilege(void)$' "$compat" | cut -d: -f1)
        sed -i "$((line - 1))i #define have_createdb_privilege citus_have_createdb_privilege" "$compat"
    fi
    # The build is niced because it shares the machine's cores with other work.
    (
        cd "$CITUS_SRC"
        [[ -f Makefile.global ]] || nice -n 10 ./configure PG_CONFIG="$PG_CONFIG"
        nice -n 10 make -j2
        make install
    )
    installed || { echo "citus.so of $CITUS_VERSION not found after install" >&2; exit 1; }
}

running() {
    as_pg "$PG_BIN/pg_ctl" -D "$CITUS_DIR/$1" status >/dev/null 2>&1
}

start() {
    installed || { echo "Citus $CITUS_VERSION is not installed: run '$0 build' first" >&2; exit 1; }
    mkdir -p "$CITUS_DIR"
    [[ $(id -u) == 0 ]] && chown postgres: "$CITUS_DIR"
    local port
    for port in "${PORTS[@]}"; do
        local data=$CITUS_DIR/$port
        if [[ ! -f $data/PG_VERSION ]]; then
            as_pg "$PG_BIN/initdb" -D "$data" -U "$SUPERUSER" --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
            # The socket lives in CITUS_DIR so that any user may run the cluster; prepared
            # transactions are needed for Citus's two-phase commit across nodes; every database
            # with the extension holds a background worker of its own, so trial databases
            # beside stile need more than the default eight; the coordinator opens connections to
            # the workers for its own, so the workers need room for more than the gateways'.
            cat >>"$data/postgresql.conf" <<EOF
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$CITUS_DIR'
shared_preload_libraries = 'citus'
max_prepared_transactions = 100
max_worker_processes = 32
max_connections = 300
shared_buffers = 64MB
EOF
        fi
        running "$port" || as_pg "$PG_BIN/pg_ctl" -D "$data" -l "$CITUS_DIR/$port.log" -w start >/dev/null
    done
    for port in "${PORTS[@]}"; do
        if [[ -z $(psql_at "$port" postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$DB'") ]]; then
            psql_at "$port" postgres -c "CREATE DATABASE $DB"
        fi
        psql_at "$port" "$DB" -c "SET client_min_messages = warning" -c "CREATE EXTENSION IF NOT EXISTS citus"
    done
    # Registering nodes is idempotent in Citus: adding a known node returns its id again.
    psql_at "$COORD" "$DB" -c "SELECT citus_set_coordinator_host('127.0.0.1', $COORD)" >/dev/null
    for port in "${PORTS[@]:1}"; do
        psql_at "$COORD" "$DB" -c "SELECT citus_add_node('127.0.0.1', $port)" >/dev/null
    done
    url
}

stop() {
    local port
    for port in "${PORTS[@]}"; do
        if running "$port"; then
            as_pg "$PG_BIN/pg_ctl" -D "$CITUS_DIR/$port" -m fast -w stop >/dev/null
        fi
    done
}

url() {
    echo "postgres://$SUPERUSER@127.0.0.1:$COORD/$DB"
}

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
STILE_BIN=${STILE_BIN:-$ROOT/target/release/stile}
CHECKER_BIN=${CHECKER_BIN:-$ROOT/target/release/checker}

# The gateway migrates the schema on the coordinator (tables are made there, local), then Citus
# distributes them; later migrations' DDL is propagated by Citus.
distribute() {
    "$STILE_BIN" migrate --database-url "$(url)"
    if [[ -n $(psql_at "$COORD" "$DB" -tAc "SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'stile.partitions'::regclass") ]]; then
        echo "already distributed"
        return
    fi
    psql_at "$COORD" "$DB" -c "SET client_min_messages = warning" -f "$HERE/distribute.sql" >/dev/null
    psql_at "$COORD" "$DB" -c "SELECT logicalrelid, partmethod, colocationid FROM pg_dist_partition ORDER BY 1"
}

reset() {
    psql_at "$COORD" postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null
    local port
    for port in "${PORTS[@]:1}"; do
        psql_at "$port" postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null
    done
    start
}

# Restarts one node with pg_ctl (the checker's own PostgreSQL restart knows only clusters that
# pg_ctlcluster manages).
restart_node() {
    as_pg "$PG_BIN/pg_ctl" -D "$CITUS_DIR/$1" -m fast -w restart -l "$CITUS_DIR/$1.log" >/dev/null
    echo "restarted the node on port $1 at $(date +%T)"
}

# The checker against the coordinator for CHECK_SECONDS (120), gateways killed as it does by
# default, with a worker restarted a third of the way in and the coordinator two thirds in.
check() {
    local seconds=${CHECK_SECONDS:-120} checker_pid status=0
    "$CHECKER_BIN" --database-url "$(url)" --pg-restart-every 0 --seconds "$seconds" "$@" &
    checker_pid=$!
    (sleep $((seconds / 3)) && restart_node "${PORTS[1]}" && sleep $((seconds / 3)) && restart_node "$COORD") &
    wait "$checker_pid" || status=$?
    wait || true
    return "$status"
}

case ${1:-} in
    build) build ;;
    start) start ;;
    stop) stop ;;
    psql) shift; psql_at "$COORD" "$DB" "$@" ;;
    url) url ;;
    distribute) distribute ;;
    reset) reset ;;
    check) shift; check "$@" ;;
    *) echo "usage: $0 build|start|stop|psql|url|distribute|reset|check" >&2; exit 2 ;;
esac
