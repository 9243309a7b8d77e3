//! The event-window seed's tests, on the shard.

use stile_guest::Shard;
use stile_guest::testing::window;

#[test]
fn window_semantics() {
    window::window_semantics(&mut Shard::new(window::CONFIG));
}

#[test]
fn memory_bounded_by_rate_times_window() {
    let report = window::memory_bounded_by_rate_times_window(&mut Shard::new(window::CONFIG));
    println!("{report:?}");
}
