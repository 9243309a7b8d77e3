//! Warnings limited to one line per cause per interval.
//!
//! A cause a client can repeat at will (a partition that cannot be hydrated,
//! a timer that cannot be fired) must not let one request write megabytes of
//! log. Each such cause has a [`Limited`] of its own: the first occurrence is
//! written at once, the ones after it within the interval are only counted,
//! and the next line written says how many occurrences it stands for.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often a limited cause may write a line.
pub const INTERVAL: Duration = Duration::from_secs(10);

/// One cause's limit.
#[derive(Debug)]
pub struct Limited {
    interval: Duration,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// When the last line was written; `None` before the first.
    written_at: Option<Instant>,
    /// Occurrences since that line, not written.
    held_back: u64,
}

impl Limited {
    /// A cause that writes at most one line per `interval`.
    pub const fn new(interval: Duration) -> Limited {
        Limited { interval, state: Mutex::new(State { written_at: None, held_back: 0 }) }
    }

    /// Counts one occurrence. Answers `Some(n)` when a line is due now, `n`
    /// being the occurrences it stands for (this one and those held back
    /// since the last line), and `None` when this one is only counted.
    pub fn occurred(&self) -> Option<u64> {
        self.occurred_at(Instant::now())
    }

    fn occurred_at(&self, now: Instant) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        state.held_back += 1;
        let due = state.written_at.is_none_or(|at| now.saturating_duration_since(at) >= self.interval);
        if !due {
            return None;
        }
        state.written_at = Some(now);
        Some(std::mem::take(&mut state.held_back))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_counting_what_it_stands_for() {
        let limited = Limited::new(Duration::from_secs(10));
        let start = Instant::now();
        assert_eq!(limited.occurred_at(start), Some(1));
        let within: Vec<_> = (1..=9_999).map(|ms| limited.occurred_at(start + Duration::from_millis(ms))).collect();
        assert!(within.iter().all(Option::is_none), "occurrences within the interval are only counted");
        // The next line, an interval after the first, stands for the 9,999
        // held back and itself.
        assert_eq!(limited.occurred_at(start + Duration::from_secs(10)), Some(10_000));
        assert_eq!(limited.occurred_at(start + Duration::from_secs(11)), None);
        assert_eq!(limited.occurred_at(start + Duration::from_secs(25)), Some(2));
    }
}
