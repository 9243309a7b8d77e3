"""Call overhead of stile's dedup cache component in Python (wasmtime-py's
component API): a `stats` call (the floor of a call's cost) and `plan` of one
segment of 64 and 1,024 fresh hashes, against an empty partition (the cost of
crossing into the component) and against one holding 65,536 hashes.

    python bench.py [seconds-per-case, default 1] [path/to/stile_dedup.wasm]

STILE_CACHE_FAST_BYTES=0 measures wasmtime-py's own byte-at-a-time lowering.
"""

import hashlib
import sys
import time
from pathlib import Path

from importlib import metadata

import stile_cache
from stile_cache import CacheComponent, Hydration, Segment, TxnsRow

ROOT = Path(__file__).resolve().parents[2]


def hashes(prefix, count):
    # Any 16 bytes per message will do for timing; the real thing is
    # xxh3-128 of the transactionId, big-endian.
    return b"".join(hashlib.md5(f"{prefix}-{i}".encode()).digest() for i in range(count))


def per_call_ns(f, seconds):
    for _ in range(5):
        f()
    calls = 0
    start = time.perf_counter_ns()
    deadline = start + int(seconds * 1e9)
    now = start
    while now < deadline:
        for _ in range(4):
            f()
        calls += 4
        now = time.perf_counter_ns()
    return (now - start) / calls


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    path = sys.argv[2] if len(sys.argv) > 2 else str(ROOT / "target" / "stile_dedup.wasm")
    now = int(time.time() * 1000)
    window_ms = 3_600_000
    empty, held = 8, 9
    shard = CacheComponent(path).shard(budget_bytes=256 << 20)
    shard.hydrate(now, Hydration(empty, window_ms, -1, []))
    rows = [TxnsRow(row * 4096, row * 4096 + 4095, now, hashes(f"held-{row}", 4096)) for row in range(16)]
    shard.hydrate(now, Hydration(held, window_ms, 65_535, rows))

    lowering = "bulk" if stile_cache.FAST_BYTES else "wasmtime-py's"
    print(
        f"benchmark: one shard in python {sys.version.split()[0]}, wasmtime-py {metadata.version('wasmtime')}"
        f" ({lowering} list<u8> lowering)"
    )
    print(f"  stats()                                 {per_call_ns(shard.stats, seconds):>9.0f} ns/call")
    boundary = []
    for partition, what, p_verified in ((empty, "empty partition", -1), (held, "65,536 held", 65_535)):
        for size in (64, 1024):
            segment = [Segment(partition, window_ms, hashes("fresh", size))]

            def plan():
                (answer,) = shard.plan(now, segment)
                assert answer.p_verified == p_verified, answer

            t = per_call_ns(plan, seconds)
            if partition == empty:
                boundary.append((size, t))
            label = f"plan, {what}, 1 x {size:>5} hashes"
            print(f"  {label:<40}{t:>9.0f} ns/call {t / size:>7.1f} ns/hash")
    (n1, t1), (n2, t2) = boundary
    per_hash = (t2 - t1) / (n2 - n1)
    print(f"  crossing (empty partition): {t1 - per_hash * n1:.0f} ns per plan call + {per_hash:.1f} ns per hash")
    shard.close()


if __name__ == "__main__":
    main()
