//! The WebAssembly component: `wit/dedup.wit`'s `cache` interface, exported
//! over the native core. This module only converts between the generated WIT
//! types and the core's; every decision is the core's.

use alloc::vec::Vec;
use core::cell::RefCell;

use crate::api;
use crate::cache::DedupCache as _;
use crate::shard::Shard as CoreShard;

wit_bindgen::generate!({
    path: "../wit",
    world: "dedup",
});

use exports::stile::dedup::cache as wit;

struct Component;

impl wit::Guest for Component {
    type Shard = ShardResource;
}

/// One shard's cache behind the resource handle. The component model calls
/// into an instance one call at a time, so the `RefCell` never contends.
struct ShardResource(RefCell<CoreShard>);

impl wit::GuestShard for ShardResource {
    fn new(config: wit::ShardConfig) -> Self {
        let config = api::ShardConfig { budget_bytes: config.budget_bytes, skew_slack_ms: config.skew_slack_ms };
        ShardResource(RefCell::new(CoreShard::new(config)))
    }

    fn plan(&self, now_ms: wit::Millis, segments: Vec<wit::Segment>) -> Vec<wit::Plan> {
        let segments: Vec<api::Segment<'_>> =
            segments.iter().map(|s| api::Segment { partition: s.partition, window_ms: s.window_ms, hashes: &s.hashes }).collect();
        let plans = self.0.borrow_mut().plan(now_ms, &segments);
        plans.into_iter().map(plan_to_wit).collect()
    }

    fn record_commits(&self, now_ms: wit::Millis, commits: Vec<wit::Commit>) {
        let commits: Vec<api::Commit<'_>> = commits
            .iter()
            .map(|c| api::Commit {
                partition: c.partition,
                base_offset: c.base_offset,
                created_ms: c.created_ms,
                hashes: &c.hashes,
            })
            .collect();
        self.0.borrow_mut().record_commits(now_ms, &commits);
    }

    fn admit(&self, now_ms: wit::Millis, partition: wit::PartitionId, window_ms: u64, estimate_hashes: u64) -> wit::Admission {
        match self.0.borrow_mut().admit(now_ms, partition, window_ms, estimate_hashes) {
            api::Admission::Hydrate => wit::Admission::Hydrate,
            api::Admission::Suppressed => wit::Admission::Suppressed,
        }
    }

    fn hydrate(&self, now_ms: wit::Millis, hydration: wit::Hydration) -> Result<(), wit::HydrateError> {
        let rows: Vec<api::TxnsRow<'_>> = hydration
            .rows
            .iter()
            .map(|r| api::TxnsRow {
                base_offset: r.base_offset,
                end_offset: r.end_offset,
                created_ms: r.created_ms,
                hashes: &r.hashes,
            })
            .collect();
        let hydration = api::Hydration {
            partition: hydration.partition,
            window_ms: hydration.window_ms,
            last_offset: hydration.last_offset,
            rows: &rows,
        };
        self.0.borrow_mut().hydrate(now_ms, &hydration).map_err(|e| match e {
            api::HydrateError::Malformed => wit::HydrateError::Malformed,
            api::HydrateError::WindowOff => wit::HydrateError::WindowOff,
            api::HydrateError::Lost => unreachable!("only a host answers Lost"),
        })
    }

    fn expire(&self, now_ms: wit::Millis) {
        self.0.borrow_mut().expire(now_ms);
    }

    fn forget(&self, partition: wit::PartitionId) {
        self.0.borrow_mut().forget(partition);
    }

    fn stats(&self) -> wit::Stats {
        let s = self.0.borrow_mut().stats();
        wit::Stats {
            entries: s.entries,
            vouching: s.vouching,
            bytes: s.bytes,
            hashes: s.hashes,
            generations: s.generations,
            suppressed: s.suppressed,
            segments_planned: s.segments_planned,
            segments_vouched: s.segments_vouched,
            hashes_checked: s.hashes_checked,
            bloom_maybes: s.bloom_maybes,
            local_hits: s.local_hits,
            hydrations: s.hydrations,
            evictions: s.evictions,
            expired_generations: s.expired_generations,
        }
    }
}

fn plan_to_wit(plan: api::Plan) -> wit::Plan {
    let state = match plan.state {
        api::EntryState::Vouching => wit::EntryState::Vouching,
        api::EntryState::Cold => wit::EntryState::Cold,
        api::EntryState::Gap => wit::EntryState::Gap,
        api::EntryState::Rebuild => wit::EntryState::Rebuild,
        api::EntryState::Suppressed => wit::EntryState::Suppressed,
    };
    wit::Plan { p_verified: plan.p_verified, local_hits: plan.local_hits, state }
}

export!(Component);
