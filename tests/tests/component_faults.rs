//! A trapping guest never changes a verdict: the host retires the instance,
//! answers as an empty cache would (`-1`, cold), rebuilds it from the shared
//! `InstancePre`, and the rebuilt cache vouches again once hydrated. One that
//! cannot be rebuilt leaves the shard answering as an empty cache.
//!
//! Each test compiles its own engine, because the fault switch belongs to the
//! engine and the tests of this binary run in parallel.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::atomic::Ordering;

use stile::component::COMPONENT;
use stile::wasm::{WasmEngine, WasmShard};
use stile_guest::{
    Admission, Commit, DedupCache, EntryState, HASH_LEN, HydrateError, Hydration, Millis, NO_VOUCH, Offset, Plan, Segment,
    ShardConfig, Stats, TxnsRow,
};

const CONFIG: ShardConfig = ShardConfig { budget_bytes: 1 << 30, skew_slack_ms: 5_000 };
const WINDOW_MS: u64 = 60_000;
const PARTITION: i64 = 42;
const T0: Millis = 1_700_000_000_000;

fn hash(id: u64) -> [u8; HASH_LEN] {
    xxhash_rust::xxh3::xxh3_128(id.to_string().as_bytes()).to_be_bytes()
}

fn hashes(ids: impl IntoIterator<Item = u64>) -> Vec<u8> {
    ids.into_iter().flat_map(hash).collect()
}

fn plan(shard: &mut WasmShard, now_ms: Millis, bytes: &[u8]) -> Plan {
    let plans = shard.plan(now_ms, &[Segment { partition: PARTITION, window_ms: WINDOW_MS, hashes: bytes }]);
    assert_eq!(plans.len(), 1, "one plan per segment, even from a failing instance");
    plans.into_iter().next().expect("one plan")
}

fn cold() -> Plan {
    Plan { p_verified: NO_VOUCH, local_hits: Vec::new(), state: EntryState::Cold }
}

/// Hydrates the partition with ids `0..=last_offset`, one per offset.
fn hydrate(shard: &mut WasmShard, now_ms: Millis, last_offset: Offset) -> Result<(), HydrateError> {
    let bytes = hashes(0..=last_offset as u64);
    let rows = [TxnsRow { base_offset: 0, end_offset: last_offset, created_ms: now_ms, hashes: &bytes }];
    shard.hydrate(now_ms, &Hydration { partition: PARTITION, window_ms: WINDOW_MS, last_offset, rows: &rows })
}

/// An instance that cannot be rebuilt: the shard goes on without one,
/// answering every call as an empty cache at once, and starts one again when
/// instantiation works again (after its backoff).
#[test]
fn a_shard_whose_instance_cannot_be_rebuilt_answers_as_an_empty_cache_until_it_can() {
    let engine = WasmEngine::new(COMPONENT).expect("compile the component");
    let mut shard = WasmShard::new(&engine, CONFIG).expect("instantiate");
    assert_eq!(hydrate(&mut shard, T0, 9), Ok(()));
    engine.faults().refuse_instances.store(true, Ordering::Relaxed);
    engine.faults().trap_per_million.store(1_000_000, Ordering::Relaxed);
    assert_eq!(plan(&mut shard, T0 + 1, &hashes([100])), cold(), "the trap retires the instance");
    assert!(!shard.is_live(), "and none can be made");
    engine.faults().trap_per_million.store(0, Ordering::Relaxed);
    for i in 0..100 {
        assert_eq!(plan(&mut shard, T0 + 2 + i, &hashes([100, 3])), cold());
        assert_eq!(shard.admit(T0 + 2 + i, PARTITION, WINDOW_MS, 10), Admission::Suppressed);
        assert_eq!(hydrate(&mut shard, T0 + 2 + i, 9), Err(HydrateError::Lost));
        assert_eq!(shard.stats(), Stats::default());
    }
    engine.faults().refuse_instances.store(false, Ordering::Relaxed);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !shard.is_live() {
        assert!(std::time::Instant::now() < deadline, "no instance 10 s after instantiation works again");
        std::thread::yield_now();
        shard.stats();
    }
    assert_eq!(hydrate(&mut shard, T0 + 200, 9), Ok(()));
    assert_eq!(
        plan(&mut shard, T0 + 201, &hashes([100, 101])),
        Plan { p_verified: 9, local_hits: vec![], state: EntryState::Vouching }
    );
}

#[test]
fn every_call_traps_then_the_rebuilt_instance_vouches_again() {
    let engine = WasmEngine::new(COMPONENT).expect("compile the component");
    let mut shard = WasmShard::new(&engine, CONFIG).expect("instantiate");

    // Healthy: hydrated with ids 0..=9, it vouches for fresh ids and hits
    // stored ones.
    assert_eq!(shard.admit(T0, PARTITION, WINDOW_MS, 10), Admission::Hydrate);
    assert_eq!(hydrate(&mut shard, T0, 9), Ok(()));
    assert_eq!(
        plan(&mut shard, T0 + 1, &hashes([100, 101])),
        Plan { p_verified: 9, local_hits: vec![], state: EntryState::Vouching }
    );
    assert_eq!(plan(&mut shard, T0 + 2, &hashes([100, 3])).local_hits, [1]);
    assert_eq!(shard.rebuilds(), 0);

    // Every call traps.
    engine.faults().trap_per_million.store(1_000_000, Ordering::Relaxed);
    let mut rebuilds = shard.rebuilds();
    let mut expect_one_more_rebuild = |shard: &WasmShard, what: &str| {
        rebuilds += 1;
        assert_eq!(shard.rebuilds(), rebuilds, "{what} did not retire the instance");
    };
    for (i, ids) in [vec![100, 101], vec![3], vec![], vec![5, 200, 7]].into_iter().enumerate() {
        let now = T0 + 10 + i as Millis;
        let bytes = hashes(ids);
        assert_eq!(plan(&mut shard, now, &bytes), cold(), "a trapping instance answers -1, cold, with no hints");
        expect_one_more_rebuild(&shard, "plan");
    }
    // Several segments in one flush: one plan each, all -1.
    let (a, b) = (hashes([1]), hashes([300]));
    let segments = [
        Segment { partition: PARTITION, window_ms: WINDOW_MS, hashes: &a },
        Segment { partition: 7, window_ms: WINDOW_MS, hashes: &b },
    ];
    assert_eq!(shard.plan(T0 + 20, &segments), [cold(), cold()]);
    expect_one_more_rebuild(&shard, "a two-segment plan");
    assert_eq!(shard.admit(T0 + 21, PARTITION, WINDOW_MS, 10), Admission::Suppressed, "a failed gate admits nothing");
    expect_one_more_rebuild(&shard, "admit");
    assert_eq!(hydrate(&mut shard, T0 + 22, 9), Err(HydrateError::Lost), "a failed hydration installs nothing");
    expect_one_more_rebuild(&shard, "hydrate");
    let bytes = hashes([10]);
    shard.record_commits(T0 + 23, &[Commit { partition: PARTITION, base_offset: 10, created_ms: T0 + 23, hashes: &bytes }]);
    expect_one_more_rebuild(&shard, "record_commits");
    shard.expire(T0 + 24);
    expect_one_more_rebuild(&shard, "expire");
    shard.forget(PARTITION);
    expect_one_more_rebuild(&shard, "forget");
    assert_eq!(shard.stats(), Stats::default(), "a failed stats call reads as an empty cache");
    expect_one_more_rebuild(&shard, "stats");

    // Faults off: the rebuilt instance is empty, so cold until hydrated, and
    // then it vouches again.
    engine.faults().trap_per_million.store(0, Ordering::Relaxed);
    let rebuilt = shard.rebuilds();
    assert_eq!(plan(&mut shard, T0 + 30, &hashes([100])), cold());
    assert_eq!(shard.stats().entries, 0);
    assert_eq!(shard.admit(T0 + 31, PARTITION, WINDOW_MS, 11), Admission::Hydrate);
    assert_eq!(hydrate(&mut shard, T0 + 32, 10), Ok(()));
    assert_eq!(
        plan(&mut shard, T0 + 33, &hashes([100, 101])),
        Plan { p_verified: 10, local_hits: vec![], state: EntryState::Vouching }
    );
    // 0 was committed at offset 0: nothing below it to vouch for.
    let hit = plan(&mut shard, T0 + 34, &hashes([100, 10, 0]));
    assert_eq!((hit.p_verified, hit.local_hits, hit.state), (NO_VOUCH, vec![1, 2], EntryState::Vouching));
    let bytes = hashes([100, 101]);
    shard.record_commits(T0 + 35, &[Commit { partition: PARTITION, base_offset: 11, created_ms: T0 + 35, hashes: &bytes }]);
    assert_eq!(plan(&mut shard, T0 + 36, &hashes([102])).p_verified, 12);
    let stats = shard.stats();
    assert_eq!((stats.entries, stats.vouching, stats.hashes, stats.hydrations), (1, 1, 13, 1));
    assert_eq!(shard.rebuilds(), rebuilt, "no rebuild once the faults stop");
}

/// The gateway's loop over an event stream with a third of the guest calls
/// trapping: whenever a plan vouches, none of its hashes is committed at or
/// below the offset it vouches for. Traps cost vouching, never soundness.
#[test]
fn random_traps_never_make_a_plan_unsound() {
    let engine = WasmEngine::new(COMPONENT).expect("compile the component");
    let mut shard = WasmShard::new(&engine, CONFIG).expect("instantiate");
    engine.faults().trap_per_million.store(300_000, Ordering::Relaxed);

    // What PostgreSQL holds: hash -> offset, and the allocator.
    let mut stored: HashMap<[u8; HASH_LEN], Offset> = HashMap::new();
    let mut rows: Vec<(Offset, Vec<u8>)> = Vec::new();
    let mut last_offset: Offset = NO_VOUCH;
    let (mut vouched, mut narrowed, mut refused, mut hydrations) = (0u32, 0u32, 0u32, 0u32);
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for flush in 0..2_000u64 {
        let now = T0 + flush as Millis * 10;
        // Eight events: mostly new ids, some repeats of ids already stored.
        let ids: Vec<u64> =
            (0..8).map(|_| if next() % 4 == 0 { next() % (flush * 8 + 1) } else { flush * 8 + next() % 8 }).collect();
        let bytes = hashes(ids.iter().copied());
        let plan = plan(&mut shard, now, &bytes);
        if plan.p_verified >= 0 {
            for (i, chunk) in bytes.chunks_exact(HASH_LEN).enumerate() {
                let hash: [u8; HASH_LEN] = chunk.try_into().expect("16 bytes");
                if let Some(&offset) = stored.get(&hash) {
                    assert!(
                        offset > plan.p_verified,
                        "flush {flush}: id {} stored at {offset}, vouched {}",
                        ids[i],
                        plan.p_verified
                    );
                }
            }
            if plan.local_hits.is_empty() {
                vouched += 1;
            } else {
                narrowed += 1;
            }
        } else if plan.state != EntryState::Vouching {
            // The host's rebuild path: the gate, then a full read.
            if shard.admit(now, PARTITION, WINDOW_MS, stored.len() as u64) == Admission::Hydrate {
                let txns: Vec<TxnsRow<'_>> = rows
                    .iter()
                    .map(|(base, bytes)| TxnsRow {
                        base_offset: *base,
                        end_offset: base + (bytes.len() / HASH_LEN) as Offset - 1,
                        created_ms: now,
                        hashes: bytes,
                    })
                    .collect();
                let hydration = Hydration { partition: PARTITION, window_ms: WINDOW_MS, last_offset, rows: &txns };
                hydrations += u32::from(shard.hydrate(now, &hydration).is_ok());
            }
        } else {
            refused += 1;
        }
        // The push function writes the first occurrence of every id not yet
        // stored, whatever the plan said.
        let mut written = Vec::new();
        for chunk in bytes.chunks_exact(HASH_LEN) {
            let hash: [u8; HASH_LEN] = chunk.try_into().expect("16 bytes");
            if let Entry::Vacant(slot) = stored.entry(hash) {
                slot.insert(last_offset + 1 + (written.len() / HASH_LEN) as Offset);
                written.extend_from_slice(&hash);
            }
        }
        if !written.is_empty() {
            let base = last_offset + 1;
            last_offset += (written.len() / HASH_LEN) as Offset;
            shard.record_commits(now, &[Commit { partition: PARTITION, base_offset: base, created_ms: now, hashes: &written }]);
            rows.push((base, written));
        }
    }
    println!(
        "vouched {vouched}, narrowed by a local hit {narrowed}, -1 with a local hit {refused}, hydrations {hydrations}, rebuilds {}",
        shard.rebuilds()
    );
    assert!(shard.rebuilds() > 500, "the faults ran: {} rebuilds", shard.rebuilds());
    assert!(vouched > 50 && narrowed > 50 && hydrations > 50, "the cache still worked between faults");
}
