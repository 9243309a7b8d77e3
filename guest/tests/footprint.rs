//! The budget's accounting against what the shard really allocates, for the
//! case that dominates a churning workload: many partitions holding a few
//! hashes each. The only test in its binary, so that nothing else allocates
//! while it counts.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use stile_guest::{Admission, Commit, DedupCache, Hydration, Segment, Shard, ShardConfig};

/// The system allocator, counting the bytes live in it.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const WINDOW_MS: u64 = 60_000;

#[test]
fn the_accounting_covers_what_small_partitions_allocate() {
    // The last case seals blocks: runs, their fences and arrival steps.
    for hashes_each in [1usize, 5, 20, 63, 64, 200, 600, 10_000] {
        let before = LIVE.load(Ordering::Relaxed);
        let mut shard = Shard::new(ShardConfig { budget_bytes: 1 << 40, skew_slack_ms: 5_000 });
        let partitions = if hashes_each > 1_000 { 400i64 } else { 5_000 };
        for partition in 0..partitions {
            assert_eq!(shard.admit(0, partition, WINDOW_MS, 0), Admission::Hydrate);
            shard.hydrate(0, &Hydration { partition, window_ms: WINDOW_MS, last_offset: -1, rows: &[] }).expect("hydrates");
            let hashes: Vec<u8> = (0..hashes_each as u128)
                .flat_map(|i| {
                    ((partition as u128) << 64 | i).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835).to_be_bytes()
                })
                .collect();
            let plans = shard.plan(1, &[Segment { partition, window_ms: WINDOW_MS, hashes: &hashes }]);
            assert_eq!(plans[0].p_verified, -1);
            shard.record_commits(1, &[Commit { partition, base_offset: 0, created_ms: 1, hashes: &hashes }]);
        }
        let allocated = LIVE.load(Ordering::Relaxed) - before;
        let accounted = shard.stats().bytes as usize;
        println!(
            "{hashes_each:>4} hashes each: {:>6.0} B allocated, {:>6.0} B accounted per partition ({:.2})",
            allocated as f64 / partitions as f64,
            accounted as f64 / partitions as f64,
            accounted as f64 / allocated as f64
        );
        // Within a few percent over (the accounting rounds up), never far
        // under: an entry the budget undercounts lets the cache outgrow it.
        let ratio = accounted as f64 / allocated as f64;
        assert!((0.95..1.3).contains(&ratio), "{hashes_each} hashes each: accounted/allocated = {ratio:.2}");
        drop(shard);
    }
}
