//! The event-window seed's tests, and the floors of retries, on the shard.

use stile_guest::Shard;
use stile_guest::testing::{floors, window};

#[test]
fn window_semantics() {
    window::window_semantics(&mut Shard::new(window::CONFIG));
}

#[test]
fn memory_bounded_by_rate_times_window() {
    let report = window::memory_bounded_by_rate_times_window(&mut Shard::new(window::CONFIG));
    println!("{report:?}");
}

#[test]
fn retries_floor_within_an_arrival_step() {
    let furthest = floors::retries_floor_within_an_arrival_step(&mut Shard::new(window::CONFIG), 400);
    println!("the furthest floor was {furthest} offsets below its retry's original");
}
