#!/usr/bin/env bash
# Runs the cache component's foreign-host tests: Node (jco) and Python
# (wasmtime-py) each replay tests/trace/cache-trace.json against
# target/stile_dedup.wasm and must answer as stile's native core did.
#
#   cargo build --release -p stile     # writes target/stile_dedup.wasm
#   embed/run-tests.sh [--bench]       # --bench also prints each host's call overhead
#
# Installs what it needs itself: the Node packages pinned in
# embed/node/package-lock.json (npm ci), and embed/python/requirements.txt
# into embed/python/.venv (or with pip --user where venv is unavailable).
# Exits non-zero if any step or test fails, or if a host runs no tests.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

bench=0
for arg in "$@"; do
  case "$arg" in
    --bench) bench=1 ;;
    *) echo "usage: embed/run-tests.sh [--bench]" >&2; exit 2 ;;
  esac
done

step() { printf '\n== %s\n' "$*"; }
fail() { echo "embed/run-tests.sh: $*" >&2; exit 1; }

component=$root/target/stile_dedup.wasm
[ -s "$component" ] || fail "$component is missing; run \`cargo build --release -p stile\` first"
echo "component: $component ($(wc -c <"$component") bytes)"

step "node: install (npm ci) and transpile with jco"
command -v node >/dev/null || fail "node is not installed"
cd "$root/embed/node"
npm ci --no-audit --no-fund --loglevel=error
rm -rf generated
npm run --silent transpile
echo "node $(node --version), jco $(npx --no-install jco --version)"

step "node: replay the trace (node --test)"
node_report=$(mktemp)
trap 'rm -f "$node_report"' EXIT
set +e
node --test --test-reporter=spec --test-reporter-destination=stdout \
  --test-reporter=tap --test-reporter-destination="$node_report" test/
node_status=$?
set -e
[ "$node_status" -eq 0 ] || fail "node tests failed (exit $node_status)"
node_passed=$(sed -n 's/^# pass \([0-9]*\)$/\1/p' "$node_report")
[ "${node_passed:-0}" -gt 0 ] || fail "node ran no tests"

step "python: install (venv + pip)"
cd "$root/embed/python"
if [ -x .venv/bin/python ] || python3 -m venv .venv >/dev/null 2>&1; then
  python=$root/embed/python/.venv/bin/python
  "$python" -m pip install --quiet --disable-pip-version-check -r requirements.txt
else
  echo "python3 -m venv is unavailable; installing with pip --user"
  python=python3
  "$python" -m pip install --quiet --disable-pip-version-check --user -r requirements.txt
fi
echo "$("$python" --version), wasmtime-py $("$python" -c 'import importlib.metadata as m; print(m.version("wasmtime"))')"

step "python: replay the trace (pytest)"
set +e
"$python" -m pytest -v -p no:cacheprovider test_trace.py
py_status=$?
set -e
# pytest exits 5 when it collected no tests: that is a failure here too.
[ "$py_status" -ne 5 ] || fail "pytest collected no tests"
[ "$py_status" -eq 0 ] || fail "python tests failed (exit $py_status)"

if [ "$bench" -eq 1 ]; then
  step "benchmarks"
  (cd "$root/embed/node" && node bench.mjs)
  (cd "$root/embed/python" && "$python" bench.py)
fi

step "every host replayed the trace"
