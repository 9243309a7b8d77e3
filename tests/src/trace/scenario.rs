//! The recorded scenario: every call the trace makes, in order, with
//! assertions that keep each call's note true of the answer it records.

use stile_guest::{Admission, EntryState, HASH_LEN, HydrateError, Millis, Offset, PartitionId, Plan, ShardConfig, Stats};

use super::model::{OwnedSegment, Trace};
use super::pg::Pg;
use super::recorder::Recorder;

/// The recorded scenario. Every phase is one paragraph of calls; the notes
/// in the file say what each call exercises.
pub fn record() -> Trace {
    use Admission::{Hydrate, Suppressed};
    use EntryState::{Cold, Gap, Rebuild, Vouching};

    /// The window of every partition but the one whose window changes.
    const W: u64 = 60_000;
    const SLACK: u32 = ShardConfig::DEFAULT_SKEW_SLACK_MS;
    /// Small enough that a few partitions with one bloom generation each
    /// (about 8.5 KiB apiece) crowd it, so that the gate refuses and evicts
    /// within a few hundred hashes.
    const BUDGET: u64 = 47 * 1024;

    /// One plan's answer, for the checks that keep the notes true.
    fn answer(plans: &[Plan]) -> (Offset, Vec<u32>, EntryState) {
        assert_eq!(plans.len(), 1);
        (plans[0].p_verified, plans[0].local_hits.clone(), plans[0].state)
    }

    let config = ShardConfig { budget_bytes: BUDGET, skew_slack_ms: SLACK };
    let mut r = Recorder::new(config);
    let mut pg = Pg::default();
    let seg =
        |partition: PartitionId, window_ms: u64, hashes: &[u8]| OwnedSegment { partition, window_ms, hashes: hashes.to_vec() };
    // 2023-11-14T22:13:20Z; `now` only moves forward from here.
    let mut now: Millis = 1_700_000_000_000;

    // -- A new partition: cold, admitted, hydrated empty, then vouching. ----
    r.note("a fresh shard holds nothing");
    assert_eq!(r.stats(), Stats::default());
    let a = pg.fresh(3);
    r.note("partition 1 is new to the shard: cold, -1");
    assert_eq!(answer(&r.plan(now, vec![seg(1, W, &a)])), (-1, vec![], Cold));
    r.note("a partition new in PostgreSQL (estimate 0) is always admitted");
    assert_eq!(r.admit(now, 1, W, 0), Hydrate);
    r.note("an empty partition: no rows, last-offset -1");
    assert_eq!(r.hydrate(now, pg.read(1, W, SLACK, now)), Ok(()));
    now += 10;
    r.note("vouching for an empty partition: p-verified is its allocator, -1");
    assert_eq!(answer(&r.plan(now, vec![seg(1, W, &a)])), (-1, vec![], Vouching));
    now += 10;
    let commit = pg.commit(1, now, a.clone());
    r.note("offsets 0..2 committed right after the vouched allocator: the entry extends");
    r.record_commits(now, vec![commit]);
    now += 10;
    let b = pg.fresh(4);
    r.note("fresh hashes: vouches up to offset 2");
    assert_eq!(answer(&r.plan(now, vec![seg(1, W, &b)])), (2, vec![], Vouching));
    let commit = pg.commit(1, now, b.clone());
    r.record_commits(now, vec![commit]);
    now += 10;
    let c = concat(&[&pg.fresh(2), &pick(&a, &[1]), &pg.fresh(1), &pick(&b, &[3])]);
    r.note("hashes 2 and 4 of this segment were committed before, the older at offset 1: local hits, probe from there");
    assert_eq!(answer(&r.plan(now, vec![seg(1, W, &c)])), (0, vec![2, 4], Vouching));
    // PostgreSQL finds the two duplicates; the other three are stored.
    let commit = pg.commit(1, now, pick(&c, &[0, 1, 3]));
    r.record_commits(now, vec![commit]);
    r.stats();

    // -- A partition with history: hydration from rows. --------------------
    now += 1_000;
    // Partition 2's history, written by other gateways before this shard saw
    // the partition: a row older than the window, then two recent ones.
    let old = pg.fresh(5);
    pg.commit(2, now - W as Millis - 20_000, old.clone());
    let d1 = pg.fresh(6);
    pg.commit(2, now - 30_000, d1.clone());
    let d2 = pg.fresh(3);
    pg.commit(2, now - 1_000, d2.clone());
    let e = pg.fresh(2);
    r.note("one flush, two partitions, answered in order: 2 is cold, 1 vouches");
    let plans = r.plan(now, vec![seg(2, W, &e), seg(1, W, &e)]);
    assert_eq!((plans[0].state, plans[1].state), (Cold, Vouching));
    r.note("partition 2 has about 9 hashes in its window");
    assert_eq!(r.admit(now, 2, W, 9), Hydrate);
    let mut bad = pg.read(2, W, SLACK, now);
    bad.rows[0].end_offset += 1;
    r.note("a row whose hash count does not match its offsets: malformed, nothing installed");
    assert_eq!(r.hydrate(now, bad), Err(HydrateError::Malformed));
    let mut bad = pg.read(2, W, SLACK, now);
    bad.last_offset -= 1;
    r.note("a row ending past last-offset: malformed");
    assert_eq!(r.hydrate(now, bad), Err(HydrateError::Malformed));
    let mut overlapping = pg.read(2, W, SLACK, now);
    let mut twin = overlapping.rows[0].clone();
    twin.base_offset = twin.end_offset;
    twin.hashes.truncate(HASH_LEN);
    overlapping.rows.push(twin);
    r.note("rows that overlap: malformed");
    assert_eq!(r.hydrate(now, overlapping), Err(HydrateError::Malformed));
    r.note("still cold after three refused hydrations");
    assert_eq!(answer(&r.plan(now, vec![seg(2, W, &e)])).2, Cold);
    r.note("every row, oldest first, including one older than the window plus slack (it only widens coverage)");
    assert_eq!(r.hydrate(now, pg.read_all(2, W)), Ok(()));
    r.note("a hash from the 30-second-old row, committed at offset 10: local hit, probe from there");
    assert_eq!(answer(&r.plan(now, vec![seg(2, W, &concat(&[&e, &pick(&d1, &[5])]))])), (9, vec![2], Vouching));
    r.note("fresh hashes vouch up to partition 2's allocator, 13");
    assert_eq!(answer(&r.plan(now, vec![seg(2, W, &e)])), (13, vec![], Vouching));
    let commit = pg.commit(2, now, e.clone());
    r.record_commits(now, vec![commit]);
    r.stats();

    // -- Gaps, overlaps and ignored commits. --------------------------------
    now += 1_000;
    // Another gateway commits to partition 1; this shard never sees it.
    let foreign = pg.fresh(2);
    pg.commit(1, now, foreign.clone());
    let f = pg.fresh(2);
    let mine = pg.commit(1, now, f);
    let other = pg.fresh(1);
    let unknown = pg.commit(9, now, other);
    r.note("one report, two commits: partition 9 has no entry (ignored); partition 1's starts 2 past verified-upto + 1 (a gap)");
    r.record_commits(now, vec![unknown, mine]);
    now += 10;
    let g = pg.fresh(1);
    r.note("a gap answers -1 until rehydrated");
    assert_eq!(answer(&r.plan(now, vec![seg(1, W, &g)])), (-1, vec![], Gap));
    r.note("a gap is a cheap admission whatever the estimate");
    assert_eq!(r.admit(now, 1, W, 1_000_000), Hydrate);
    r.note("a full-window read, newest row first");
    assert_eq!(r.hydrate(now, pg.read(1, W, SLACK, now)), Ok(()));
    r.note("rehydrated: the other gateway's hashes are known (this one was committed at offset 11)");
    assert_eq!(answer(&r.plan(now, vec![seg(1, W, &concat(&[&g, &pick(&foreign, &[1])]))])), (10, vec![1], Vouching));
    assert_eq!(answer(&r.plan(now, vec![seg(1, W, &g)])), (13, vec![], Vouching));
    let commit = pg.commit(1, now, g.clone());
    r.record_commits(now, vec![commit.clone()]);
    now += 10;
    r.note("the same commit reported twice: it overlaps verified-upto, the entry needs a rebuild");
    r.record_commits(now, vec![commit]);
    let h = pg.fresh(1);
    r.note("rebuild answers -1");
    assert_eq!(answer(&r.plan(now, vec![seg(1, W, &h)])), (-1, vec![], Rebuild));
    let commit = pg.commit(1, now, h.clone());
    r.note("commits while a rebuild is pending change nothing");
    r.record_commits(now, vec![commit]);
    assert_eq!(answer(&r.plan(now, vec![seg(1, W, &h)])), (-1, vec![], Rebuild));
    r.stats();
    r.note("a rebuild with room in the budget is admitted");
    assert_eq!(r.admit(now, 1, W, 20), Hydrate);
    assert_eq!(r.hydrate(now, pg.read(1, W, SLACK, now)), Ok(()));
    assert_eq!(answer(&r.plan(now, vec![seg(1, W, &pg.fresh(1))])), (15, vec![], Vouching));
    r.stats();
    // Partition 1's newest commit is the one just recorded.
    let newest = now;

    // -- Expiry: `now` moves past the window plus slack. ---------------------
    now = newest + W as Millis + Millis::from(SLACK);
    r.note("exactly window plus slack after partition 1's newest commit: nothing expires yet");
    r.note("partition 1's first commit, at offset 0: local hits, nothing below to vouch for");
    assert_eq!(answer(&r.plan(now, vec![seg(1, W, &a)])), (-1, vec![0, 1, 2], Vouching));
    assert_eq!(r.stats().expired_generations, 0);
    now += 1;
    r.note("one millisecond later partition 1's only generation is older than window plus slack: planning expires it, no hits");
    assert_eq!(answer(&r.plan(now, vec![seg(1, W, &a)])), (15, vec![], Vouching));
    assert_eq!(r.stats().expired_generations, 1);
    now += 40_000;
    r.note("expire frees the idle partition 2 as well");
    r.expire(now);
    assert_eq!(r.stats().expired_generations, 2);

    // -- Window changes, and window 0. ---------------------------------------
    now += 1_000;
    let k = pg.fresh(72);
    r.note("partition 1's window doubled: rebuild");
    assert_eq!(answer(&r.plan(now, vec![seg(1, 2 * W, &k)])), (-1, vec![], Rebuild));
    r.note("sticky: the old window does not bring it back");
    assert_eq!(answer(&r.plan(now, vec![seg(1, W, &k)])), (-1, vec![], Rebuild));
    r.note("a window change on a resident entry is no cheap admission, but it fits");
    assert_eq!(r.admit(now, 1, 2 * W, 30), Hydrate);
    assert_eq!(r.hydrate(now, pg.read(1, 2 * W, SLACK, now)), Ok(()));
    r.note("under the doubled window the expired hashes are held again");
    assert_eq!(answer(&r.plan(now, vec![seg(1, 2 * W, &concat(&[&k, &pick(&a, &[0])]))])), (-1, vec![72], Vouching));
    assert_eq!(answer(&r.plan(now, vec![seg(1, 2 * W, &k)])), (15, vec![], Vouching));
    let commit = pg.commit(1, now, k);
    r.note("72 hashes committed at once: the generation passes 64 and builds its bloom filter");
    r.record_commits(now, vec![commit]);
    r.note("window 0 turns deduplication off: -1, cold, and partition 2's entry is dropped");
    assert_eq!(answer(&r.plan(now, vec![seg(2, 0, &pg.fresh(1))])), (-1, vec![], Cold));
    r.note("admitting with window 0 always answers hydrate");
    assert_eq!(r.admit(now, 2, 0, 1_000_000), Hydrate);
    r.note("and hydrating with window 0 answers window-off");
    assert_eq!(r.hydrate(now, pg.read(2, 0, SLACK, now)), Err(HydrateError::WindowOff));
    assert_eq!(r.stats().entries, 1);

    // -- Budget pressure: suppression, cooldown, eviction. -------------------
    now += 1_000;
    let history = pg.fresh(100);
    pg.commit(3, now - 10_000, history);
    r.note("partition 3 has history: admitted and hydrated with 100 hashes");
    assert_eq!(r.admit(now, 3, W, 100), Hydrate);
    assert_eq!(r.hydrate(now, pg.read(3, W, SLACK, now)), Ok(()));
    assert_eq!(answer(&r.plan(now, vec![seg(3, W, &pg.fresh(1))])), (99, vec![], Vouching));
    r.stats();
    let history = pg.fresh(1000);
    pg.commit(4, now - 10_000, history);
    r.note(
        "partition 4 holds 1,000 hashes, which the host estimates at 1,200 (18 bytes each): \
         they fit only by evicting 1 or 3, both used within 5 s: suppressed",
    );
    assert_eq!(r.admit(now, 4, W, 1200), Suppressed);
    r.note("a suppressed partition answers -1");
    assert_eq!(answer(&r.plan(now, vec![seg(4, W, &pg.fresh(1))])), (-1, vec![], EntryState::Suppressed));
    assert_eq!(r.stats().suppressed, 1);
    now += 10_000;
    r.note("during the 30 s cooldown the gate is not re-tested, though 1 and 3 are idle now");
    assert_eq!(r.admit(now, 4, W, 1200), Suppressed);
    assert_eq!(answer(&r.plan(now, vec![seg(3, W, &pg.fresh(1))])), (99, vec![], Vouching));
    now += 21_000;
    r.note("the cooldown is over: it fits once the least recently used idle partition, 1, is evicted");
    assert_eq!(r.admit(now, 4, W, 1200), Hydrate);
    assert_eq!(r.hydrate(now, pg.read(4, W, SLACK, now)), Ok(()));
    let stats = r.stats();
    assert_eq!((stats.entries, stats.evictions, stats.suppressed), (2, 1, 0));
    r.note("the evicted partition is cold again");
    assert_eq!(answer(&r.plan(now, vec![seg(1, 2 * W, &pg.fresh(1))])), (-1, vec![], Cold));
    let more = pg.fresh(300);
    let commit = pg.commit(4, now, more);
    r.note("300 more hashes for partition 4 take the shard over its budget: the idle partition 3 is evicted");
    r.record_commits(now, vec![commit]);
    let stats = r.stats();
    assert_eq!((stats.entries, stats.evictions), (1, 2));
    assert!(stats.bytes <= BUDGET);
    r.note(
        "partition 1's remembered footprint overrides the host's estimate of 1 hash; partition 4 was used just now: suppressed",
    );
    assert_eq!(r.admit(now, 1, 2 * W, 1), Suppressed);

    // -- Forget. -------------------------------------------------------------
    now += 1_000;
    r.note("forget clears partition 1's cooldown and footprint");
    r.forget(1);
    assert_eq!(answer(&r.plan(now, vec![seg(1, 2 * W, &pg.fresh(1))])), (-1, vec![], Cold));
    r.note("so the host's estimate counts again, and it fits");
    assert_eq!(r.admit(now, 1, 2 * W, 1), Hydrate);
    assert_eq!(r.hydrate(now, pg.read(1, 2 * W, SLACK, now)), Ok(()));
    r.note("forget drops an entry");
    r.forget(4);
    assert_eq!(answer(&r.plan(now, vec![seg(4, W, &pg.fresh(1))])), (-1, vec![], Cold));
    r.note("forgetting an unknown partition is harmless");
    r.forget(77);
    now += W as Millis * 3;
    r.expire(now);
    let stats = r.stats();
    assert_eq!((stats.entries, stats.generations, stats.hashes), (1, 0, 0));
    r.finish()
}

/// The hashes at `indexes` (counted in hashes) of a flat hash list.
pub fn pick(hashes: &[u8], indexes: &[usize]) -> Vec<u8> {
    indexes.iter().flat_map(|&i| hashes[i * HASH_LEN..(i + 1) * HASH_LEN].iter().copied()).collect()
}

/// Concatenates flat hash lists.
pub fn concat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}
