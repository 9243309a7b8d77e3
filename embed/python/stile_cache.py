"""A thin Python host for stile's dedup cache component, on wasmtime-py's
component API (`wasmtime.component`, wasmtime >= 38 on PyPI).

    cache = CacheComponent("target/stile_dedup.wasm")   # compile once
    shard = cache.shard(budget_bytes=64 << 20)           # one store + instance per shard
    plans = shard.plan(now_ms, [Segment(partition=7, window_ms=3_600_000, hashes=b"...")])

Values cross as wasmtime-py converts them: s64/u64 are ints, list<u8> is
bytes, list<u32> a list of ints, enums are their names as strings, records
are `wasmtime.component.Record` objects whose attributes carry the WIT's
kebab-case names (hence `setattr`/`getattr` below), and `result<_, e>`
comes back as None or the error's name. The component imports nothing, so
the linker stays empty.

wasmtime-py lowers a `list<u8>` one byte at a time in Python (about 1 us per
byte, so 16 us per hash). `fast_bytes()`, on by default, replaces that one
conversion with a bulk copy whose layout it first learns from wasmtime-py's
own conversion of a byte, and it stays off if that check fails. Set
STILE_CACHE_FAST_BYTES=0 to keep wasmtime-py's conversion.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

import wasmtime
from wasmtime import _ffi as ffi
from wasmtime import component as wc
from wasmtime.component import _types as wc_types

INTERFACE = "stile:dedup/cache@0.1.0"
HASH_LEN = 16


@dataclass
class Segment:
    partition: int
    window_ms: int
    hashes: bytes  # 16 bytes per message, big-endian xxh3-128


@dataclass
class Commit:
    partition: int
    base_offset: int
    created_ms: int
    hashes: bytes


@dataclass
class TxnsRow:
    base_offset: int
    end_offset: int
    created_ms: int
    hashes: bytes


@dataclass
class Hydration:
    partition: int
    window_ms: int
    last_offset: int
    rows: List[TxnsRow] = field(default_factory=list)


@dataclass
class Plan:
    p_verified: int  # push with it as is; -1 = the cache cannot vouch
    local_hits: List[int]
    state: str  # vouching | cold | gap | rebuild | suppressed


class HydrateError(Exception):
    """`hydrate` installed nothing: `kind` is "malformed" or "window-off"."""

    def __init__(self, kind: str):
        super().__init__(kind)
        self.kind = kind


_slow_list_lowering = wc_types.ListType.convert_to_c


def _byte_layout() -> Optional[tuple]:
    """How wasmtime-py lays out one `u8` value: (size, template, offset of the
    byte), learned from its own conversion; None if it is not one plain byte
    in an otherwise fixed struct."""
    size = ctypes.sizeof(ffi.wasmtime_component_val_t)

    def encoded(byte: int) -> bytes:
        val = ffi.wasmtime_component_val_t()
        ctypes.memset(ctypes.byref(val), 0, size)
        wc_types.U8().convert_to_c(None, byte, ctypes.pointer(val))
        return ctypes.string_at(ctypes.byref(val), size)

    zero, a5, x5a = encoded(0), encoded(0xA5), encoded(0x5A)
    offsets = [i for i in range(size) if zero[i] != a5[i]]
    if len(offsets) != 1 or a5[offsets[0]] != 0xA5 or x5a[offsets[0]] != 0x5A:
        return None
    if any(x5a[i] != zero[i] for i in range(size) if i != offsets[0]):
        return None
    return size, zero, offsets[0]


def _bulk_list_lowering(layout: tuple):
    size, template, offset = layout

    def convert_to_c(self, store, val, ptr):  # type: ignore[no-untyped-def]
        if not (isinstance(val, (bytes, bytearray)) and self._is_bytes()):
            return _slow_list_lowering(self, store, val, ptr)
        count = len(val)
        raw = ffi.wasmtime_component_vallist_t()
        ffi.wasmtime_component_vallist_new_uninit(raw, count)
        if count:
            values = bytearray(template * count)
            values[offset::size] = val
            ctypes.memmove(raw.data, (ctypes.c_char * len(values)).from_buffer(values), len(values))
        ptr.contents.kind = ffi.WASMTIME_COMPONENT_LIST
        ptr.contents.of.list = raw

    return convert_to_c


def fast_bytes(enabled: bool = True) -> bool:
    """Turns the bulk lowering of `list<u8>` on or off; answers whether it is on."""
    layout = _byte_layout() if enabled else None
    wc_types.ListType.convert_to_c = _bulk_list_lowering(layout) if layout else _slow_list_lowering
    return layout is not None


FAST_BYTES = fast_bytes(os.environ.get("STILE_CACHE_FAST_BYTES", "1") != "0")


def _record(**fields: Any) -> wc.Record:
    """A WIT record from snake_case keyword arguments."""
    record = wc.Record()
    for name, value in fields.items():
        setattr(record, name.replace("_", "-"), value)
    return record


def _get(record: wc.Record, name: str) -> Any:
    return getattr(record, name.replace("_", "-"))


STATS_FIELDS = (
    "entries", "vouching", "bytes", "hashes", "generations", "suppressed",
    "segments_planned", "segments_vouched", "hashes_checked", "bloom_maybes",
    "local_hits", "hydrations", "evictions", "expired_generations",
)


class CacheComponent:
    """The compiled component; compile once, make a shard per cache shard."""

    def __init__(self, path: str, engine: Optional[wasmtime.Engine] = None):
        self.engine = engine or wasmtime.Engine()
        self.component = wc.Component.from_file(self.engine, path)
        self.linker = wc.Linker(self.engine)  # empty: the component imports nothing

    def shard(self, budget_bytes: int, skew_slack_ms: int = 5000) -> "Shard":
        return Shard(self, budget_bytes, skew_slack_ms)


class Shard:
    """One shard's cache: its own store, instance and `shard` resource."""

    def __init__(self, component: CacheComponent, budget_bytes: int, skew_slack_ms: int = 5000):
        self.store = wasmtime.Store(component.engine)
        instance = component.linker.instantiate(self.store, component.component)
        interface = instance.get_export_index(self.store, INTERFACE)
        if interface is None:
            raise RuntimeError(f"the component does not export {INTERFACE}")

        def func(name: str) -> wc.Func:
            index = instance.get_export_index(self.store, name, interface)
            found = instance.get_func(self.store, index) if index is not None else None
            if found is None:
                raise RuntimeError(f"the component does not export {name}")
            return found

        self._plan = func("[method]shard.plan")
        self._record_commits = func("[method]shard.record-commits")
        self._admit = func("[method]shard.admit")
        self._hydrate = func("[method]shard.hydrate")
        self._expire = func("[method]shard.expire")
        self._forget = func("[method]shard.forget")
        self._stats = func("[method]shard.stats")
        config = _record(budget_bytes=budget_bytes, skew_slack_ms=skew_slack_ms)
        self.handle = self._call(func("[constructor]shard"), config, method=False)

    def _call(self, f: wc.Func, *args: Any, method: bool = True) -> Any:
        result = f(self.store, self.handle, *args) if method else f(self.store, *args)
        f.post_return(self.store)
        return result

    def plan(self, now_ms: int, segments: Sequence[Segment]) -> List[Plan]:
        wit_segments = [_record(partition=s.partition, window_ms=s.window_ms, hashes=bytes(s.hashes)) for s in segments]
        plans = self._call(self._plan, now_ms, wit_segments)
        return [Plan(_get(p, "p_verified"), list(_get(p, "local_hits")), p.state) for p in plans]

    def record_commits(self, now_ms: int, commits: Sequence[Commit]) -> None:
        wit_commits = [
            _record(partition=c.partition, base_offset=c.base_offset, created_ms=c.created_ms, hashes=bytes(c.hashes))
            for c in commits
        ]
        self._call(self._record_commits, now_ms, wit_commits)

    def admit(self, now_ms: int, partition: int, window_ms: int, estimate_hashes: int) -> str:
        """"hydrate" or "suppressed"."""
        return self._call(self._admit, now_ms, partition, window_ms, estimate_hashes)

    def hydrate(self, now_ms: int, hydration: Hydration) -> None:
        """Installs the read; raises HydrateError if it installed nothing."""
        rows = [
            _record(base_offset=r.base_offset, end_offset=r.end_offset, created_ms=r.created_ms, hashes=bytes(r.hashes))
            for r in hydration.rows
        ]
        wit_hydration = _record(
            partition=hydration.partition, window_ms=hydration.window_ms, last_offset=hydration.last_offset, rows=rows
        )
        error = self._call(self._hydrate, now_ms, wit_hydration)
        if error is not None:
            raise HydrateError(error)

    def expire(self, now_ms: int) -> None:
        self._call(self._expire, now_ms)

    def forget(self, partition: int) -> None:
        self._call(self._forget, partition)

    def stats(self) -> Dict[str, int]:
        stats = self._call(self._stats)
        return {name: _get(stats, name) for name in STATS_FIELDS}

    def close(self) -> None:
        """Drops the resource (the store goes with the object)."""
        if self.handle is not None:
            self.handle.drop(self.store)
            self.handle = None
