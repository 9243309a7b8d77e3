//! The cache core against the no-false-vouch invariant.
//!
//! The input bytes are decoded into a `stile_guest::testing::Scenario` (a
//! shard configuration, the host's wall clock against PostgreSQL's, a hash
//! space, windows, and up to 80 operations: pushes of up to three segments,
//! foreign commits, replays, stale and fresh rebuilds through the admission
//! gate, window changes, expiry, forgets, torn inputs, steps of either
//! clock), which the property
//! driver runs through a native `Shard` next to its model of PostgreSQL. Any
//! violation — above all a `p_verified` at or above an offset that holds one
//! of the segment's hashes inside the window — is a crash.

#![no_main]

use arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use stile_guest::ShardConfig;
use stile_guest::testing::{Estimate, MalformedInput, Op, PARTITIONS, PushSegment, Scenario, run};

fuzz_target!(|data: &[u8]| {
    let Ok(scenario) = decode(&mut Unstructured::new(data)) else { return };
    if let Err(violation) = run(&scenario, stile_guest::Shard::new) {
        panic!("{violation}\nscenario: {scenario:#?}");
    }
});

fn decode(u: &mut Unstructured<'_>) -> Result<Scenario> {
    let budget_bytes = match u.int_in_range(0..=5u8)? {
        0 | 1 => u.int_in_range(20_000u64..=300_000)?,
        2 => 2_000_000,
        _ => 1 << 40,
    };
    let skew_slack_ms = *u.choose(&[0u32, 1_000, 5_000])?;
    let config = ShardConfig { budget_bytes, skew_slack_ms };
    let wall_skew_ms =
        if u.ratio(2u8, 3)? { u.int_in_range(-1_000i64..=1_000)? } else { u.int_in_range(-10_000_000i64..=10_000_000)? };
    let hash_space = *u.choose(&[8u64, 64, 4_096, 1 << 40])?;
    let mix_hashes = u.ratio(4u8, 5)?;
    let mut windows_ms = [0u64; PARTITIONS.len()];
    for window in &mut windows_ms {
        *window = window_ms(u)?;
    }
    let mut ops = Vec::new();
    while !u.is_empty() && ops.len() < 80 {
        ops.push(op(u)?);
    }
    if ops.is_empty() {
        return Err(arbitrary::Error::NotEnoughData);
    }
    Ok(Scenario { wall_skew_ms, config, hash_space, mix_hashes, windows_ms, ops })
}

fn window_ms(u: &mut Unstructured<'_>) -> Result<u64> {
    Ok(*u.choose(&[0u64, 1_000, 1_000, 10_000, 10_000, 60_000, 60_000, 60_000, 60_000])?)
}

fn partition(u: &mut Unstructured<'_>) -> Result<usize> {
    Ok(*u.choose(&[0usize, 0, 0, 1, 1, 2, 3])?)
}

fn op(u: &mut Unstructured<'_>) -> Result<Op> {
    // Weights as in the proptest strategy: pushes, ticks and rebuilds most.
    Ok(match u.int_in_range(0..=25u8)? {
        0..=3 => Op::Tick {
            ms: match u.int_in_range(0..=5u8)? {
                0..=2 => u.int_in_range(0..=1_999)?,
                3 | 4 => u.int_in_range(0..=19_999)?,
                _ => u.int_in_range(20_000..=79_999)?,
            },
        },
        4..=11 => {
            let count = u.int_in_range(1..=3usize)?;
            let mut segments = Vec::with_capacity(count);
            for _ in 0..count {
                segments.push(push_segment(u)?);
            }
            Op::Push { segments }
        }
        12 => {
            let partition = partition(u)?;
            let count = u.int_in_range(1..=5usize)?;
            let ids = (0..count).map(|_| u.arbitrary()).collect::<Result<Vec<u64>>>()?;
            Op::Foreign { partition, ids }
        }
        13 => Op::Replay { partition: partition(u)? },
        14 => Op::Snapshot { partition: partition(u)? },
        15..=18 => Op::Rebuild {
            partition: partition(u)?,
            stale: u.ratio(3u8, 10)?,
            estimate: *u.choose(&[Estimate::Zero, Estimate::Model, Estimate::Huge])?,
            extra_slack_ms: *u.choose(&[0u32, 5_000, 20_000])?,
            shuffle: u.arbitrary()?,
        },
        19 => Op::SetWindow { partition: partition(u)?, window_ms: window_ms(u)? },
        20 => Op::Expire,
        21 => Op::Forget { partition: partition(u)? },
        22 => Op::StepDatabaseClock { ms: clock_step(u)? },
        23 => Op::StepWallClock { ms: clock_step(u)? },
        _ => Op::Malformed {
            partition: partition(u)?,
            input: *u.choose(&[MalformedInput::Segment, MalformedInput::Commit, MalformedInput::Hydration])?,
        },
    })
}

/// Steps within the skew slack, past it, and past the longest window, either
/// way.
fn clock_step(u: &mut Unstructured<'_>) -> Result<i64> {
    if u.arbitrary()? { u.int_in_range(-6_000i64..=6_000) } else { u.int_in_range(-200_000i64..=200_000) }
}

fn push_segment(u: &mut Unstructured<'_>) -> Result<PushSegment> {
    let partition = partition(u)?;
    let count = u.int_in_range(0..=9usize)?;
    // Small ids often, so that repeats are frequent in any hash space.
    let ids = (0..count)
        .map(|_| if u.ratio(1u8, 2)? { Ok(u64::from(u.int_in_range(0..=15u8)?)) } else { u.arbitrary() })
        .collect::<Result<Vec<u64>>>()?;
    let range = if u.ratio(1u8, 10)? {
        let start = if u.arbitrary()? { u.arbitrary()? } else { u.int_in_range(0..=8_191u64)? };
        Some((start, u.int_in_range(1..=5_999u16)?))
    } else {
        None
    };
    let fresh = match u.int_in_range(0..=6u8)? {
        0..=3 => 0,
        4 | 5 => u.int_in_range(1..=4u16)?,
        _ => u.int_in_range(100..=4_999u16)?,
    };
    Ok(PushSegment { partition, ids, range, fresh, reported: u.ratio(9u8, 10)? })
}
