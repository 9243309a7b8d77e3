//! The one place the host converts between the core's types and the WIT's,
//! as wasmtime's `bindgen!` generates them in [`super`]. Any Rust host of
//! the component can use these with its own engine and store.

use stile_guest as core;

use super::wit;

pub fn config(config: core::ShardConfig) -> wit::ShardConfig {
    wit::ShardConfig { budget_bytes: config.budget_bytes, skew_slack_ms: config.skew_slack_ms }
}

pub fn segments(segments: &[core::Segment<'_>]) -> Vec<wit::Segment> {
    segments.iter().map(|s| wit::Segment { partition: s.partition, window_ms: s.window_ms, hashes: s.hashes.to_vec() }).collect()
}

pub fn commits(commits: &[core::Commit<'_>]) -> Vec<wit::Commit> {
    commits
        .iter()
        .map(|c| wit::Commit {
            partition: c.partition,
            base_offset: c.base_offset,
            created_ms: c.created_ms,
            hashes: c.hashes.to_vec(),
        })
        .collect()
}

pub fn hydration(hydration: &core::Hydration<'_>) -> wit::Hydration {
    wit::Hydration {
        partition: hydration.partition,
        window_ms: hydration.window_ms,
        last_offset: hydration.last_offset,
        rows: hydration
            .rows
            .iter()
            .map(|r| wit::TxnsRow {
                base_offset: r.base_offset,
                end_offset: r.end_offset,
                created_ms: r.created_ms,
                hashes: r.hashes.to_vec(),
            })
            .collect(),
    }
}

pub fn plan(plan: wit::Plan) -> core::Plan {
    let state = match plan.state {
        wit::EntryState::Vouching => core::EntryState::Vouching,
        wit::EntryState::Cold => core::EntryState::Cold,
        wit::EntryState::Gap => core::EntryState::Gap,
        wit::EntryState::Rebuild => core::EntryState::Rebuild,
        wit::EntryState::Suppressed => core::EntryState::Suppressed,
    };
    core::Plan { p_verified: plan.p_verified, local_hits: plan.local_hits, state }
}

pub fn admission(admission: wit::Admission) -> core::Admission {
    match admission {
        wit::Admission::Hydrate => core::Admission::Hydrate,
        wit::Admission::Suppressed => core::Admission::Suppressed,
    }
}

pub fn hydrate_error(error: wit::HydrateError) -> core::HydrateError {
    match error {
        wit::HydrateError::Malformed => core::HydrateError::Malformed,
        wit::HydrateError::WindowOff => core::HydrateError::WindowOff,
    }
}

pub fn stats(s: wit::Stats) -> core::Stats {
    core::Stats {
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
