"""Replays tests/trace/cache-trace.json (recorded from stile's native core)
against the component in wasmtime-py, and requires identical answers."""

import json
import os
from pathlib import Path

import pytest

import stile_cache
from stile_cache import CacheComponent, Commit, Hydration, HydrateError, Segment, TxnsRow

ROOT = Path(__file__).resolve().parents[2]
COMPONENT = Path(os.environ.get("STILE_DEDUP_WASM", ROOT / "target" / "stile_dedup.wasm"))
TRACE = json.loads((ROOT / "tests" / "trace" / "cache-trace.json").read_text())


def hashes(hexes):
    return bytes.fromhex("".join(hexes))


def kebab(name):
    return name.replace("_", "-")


def perform(shard, call):
    """One call of the trace; answers what it answered, in the trace's form."""
    kind = call["call"]
    if kind == "plan":
        segments = [Segment(s["partition"], s["window-ms"], hashes(s["hashes"])) for s in call["segments"]]
        return [
            {"p-verified": p.p_verified, "local-hits": p.local_hits, "state": p.state}
            for p in shard.plan(call["now-ms"], segments)
        ]
    if kind == "record-commits":
        commits = [
            Commit(c["partition"], c["base-offset"], c["created-ms"], hashes(c["hashes"])) for c in call["commits"]
        ]
        return shard.record_commits(call["now-ms"], commits)
    if kind == "admit":
        return shard.admit(call["now-ms"], call["partition"], call["window-ms"], call["estimate-hashes"])
    if kind == "hydrate":
        h = call["hydration"]
        rows = [TxnsRow(r["base-offset"], r["end-offset"], r["created-ms"], hashes(r["hashes"])) for r in h["rows"]]
        try:
            shard.hydrate(call["now-ms"], Hydration(h["partition"], h["window-ms"], h["last-offset"], rows))
            return {"ok": None}
        except HydrateError as error:
            return {"err": error.kind}
    if kind == "expire":
        return shard.expire(call["now-ms"])
    if kind == "forget":
        return shard.forget(call["partition"])
    if kind == "stats":
        return {kebab(name): value for name, value in shard.stats().items()}
    raise ValueError(f"unknown call {kind}")


@pytest.fixture(scope="module")
def component():
    if not COMPONENT.exists():
        pytest.fail(f"{COMPONENT} is missing: run `cargo build --release -p stile` first")
    return CacheComponent(str(COMPONENT))


def test_the_trace_is_the_format_this_host_reads():
    assert (TRACE["format"], TRACE["version"], TRACE["interface"]) == ("stile-dedup-trace", 1, "stile:dedup/cache@0.1.0")
    assert len(TRACE["calls"]) > 50


@pytest.fixture(params=[True, False], ids=["bulk-bytes", "wasmtime-py-bytes"])
def lowering(request):
    """Runs a test with the bulk `list<u8>` lowering on, then off."""
    assert stile_cache.fast_bytes(request.param) == request.param
    yield request.param
    stile_cache.fast_bytes(stile_cache.FAST_BYTES)


def test_the_component_answers_every_call_as_the_native_core_did(component, lowering):
    config = TRACE["config"]
    shard = component.shard(config["budget-bytes"], config["skew-slack-ms"])
    try:
        for index, call in enumerate(TRACE["calls"]):
            actual = perform(shard, call)
            where = f"call #{index} ({call['call']}) [{call.get('note', '')}]"
            assert actual == call.get("expect"), where
    finally:
        shard.close()


def test_the_bulk_lowering_is_on_with_the_pinned_wasmtime():
    assert stile_cache.FAST_BYTES, "wasmtime-py's value layout changed: the bulk list<u8> lowering is off"


def test_shards_are_independent(component):
    a = component.shard(1 << 20)
    b = component.shard(1 << 20)
    a.hydrate(0, Hydration(partition=1, window_ms=60_000, last_offset=-1))
    assert (a.stats()["entries"], b.stats()["entries"]) == (1, 0)
    a.close()
    b.close()
