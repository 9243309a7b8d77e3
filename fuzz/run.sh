#!/usr/bin/env bash
# Bounded fuzzing of stile's cargo-fuzz targets (see fuzz/README.md):
#   cache_ops   the cache core's operation sequences against no-false-vouch
#   parse_push       the push-body parser: no panic, and the limits hold
#   parse_push_diff  the one-pass push-body reader against the stepwise
#                    serde_json reading: same verdicts, items and messages
#
#   fuzz/run.sh [SECONDS_PER_TARGET]      (default 30, or $FUZZ_SECONDS)
#
# Installs cargo-fuzz if it is missing. Runs on the project's pinned stable
# toolchain: cargo-fuzz passes nightly-only flags (-Z...), which
# RUSTC_BOOTSTRAP=1 lets stable accept, so no nightly toolchain is needed.
# Exits non-zero if a target crashed (the input is kept in
# fuzz/artifacts/TARGET/) or could not be built. The corpus grows in
# fuzz/corpus/TARGET/ across runs (not committed); fuzz/seeds/ holds the
# committed seeds.
set -uo pipefail
cd "$(dirname "$0")"
seconds="${1:-${FUZZ_SECONDS:-30}}"
export RUSTC_BOOTSTRAP=1

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz"
    cargo install cargo-fuzz --locked || { echo "fuzz: cannot install cargo-fuzz" >&2; exit 2; }
fi

# -a: debug assertions on, so the cache's own debug_assert!s fire too.
echo "fuzz: building the targets (address sanitizer, debug assertions)"
if ! cargo fuzz build -a >target-build.log 2>&1; then
    cat target-build.log >&2
    echo "fuzz: the targets did not build" >&2
    exit 2
fi

mkdir -p logs
failed=0
summary=()
for target in cache_ops parse_push parse_push_diff; do
    # parse_push_diff shares parse_push's seeds and dictionary.
    inputs="${target%_diff}"
    mkdir -p "corpus/$target"
    extra=()
    dirs=("corpus/$target")
    if [ -d "seeds/$inputs" ]; then
        dirs+=("seeds/$inputs")
    fi
    if [ -f "$inputs.dict" ]; then
        extra+=("-dict=$PWD/$inputs.dict")
    fi
    log="logs/$target.log"
    echo "fuzz: $target for ${seconds}s (log: fuzz/$log)"
    cargo fuzz run -a "$target" "${dirs[@]}" -- \
        -max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 -print_final_stats=1 "${extra[@]}" >"$log" 2>&1
    status=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    corpus=$(ls "corpus/$target" | wc -l)
    if [ "$status" -ne 0 ]; then
        failed=1
        echo "fuzz: $target FAILED (exit $status); the crashing input is in fuzz/artifacts/$target/:" >&2
        grep -n -A40 -E "panicked|ERROR: |SUMMARY|deadly signal|timeout" "$log" | head -80 >&2
        summary+=("$target CRASHED")
    else
        summary+=("$target clean (${runs:-?} runs, corpus $corpus)")
    fi
done
(IFS=";"; echo "fuzz: ${summary[*]}")
exit "$failed"
