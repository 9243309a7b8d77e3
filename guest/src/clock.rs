//! The database's clock, as a host can bound it from below.
//!
//! The cache judges age by the `now` its host passes in: it drops a
//! generation once its newest hash is older than `now - window - slack`, and
//! then vouches that every offset below the dropped ones is outside the
//! window. That is sound only while `now - slack` is at or below the clock of
//! the database that decides verdicts: the clock that stamps `created_ms` and
//! measures the window. A host's wall clock is not that clock (a VM resumed
//! without time sync, a container with a wrong clock, a time-sync step), so
//! the host must not use it.
//!
//! [`DbClock`] derives `now` from readings of the database's clock (stile's
//! push function and hydration read return one each) and the host's
//! monotonic clock since. A reading `db_ms` received when the monotonic clock
//! read `mono_ms` proves that the database's clock is at least
//! `db_ms + (t - mono_ms)` at monotonic time `t`, for as long as the
//! database's clock runs forward: the reading was taken before it was
//! received. The bound follows the latest reading (a better one at once, a
//! worse one too: it is a lower bound all the same, and so the two machines'
//! clock rates cannot drift apart between readings), and `now` is held
//! monotone over it.
//!
//! The database's own clock can step. Forwards, the bound merely lags until
//! the next reading. Backwards, rows carry `created_ms` values ahead of the
//! database's new clock, and a bound from before the step is no longer one.
//! The cache assumes nothing about the order of `created_ms` (a generation is
//! judged by its newest hash, so rows from the future simply stay longer),
//! and the push function refuses a vouch whenever its clock is behind the
//! `now - slack` the cache planned under, so nothing unsound can follow from
//! it. The first reading more than `tolerance_ms` below the `now` already
//! given reveals the step: [`DbClock::observe`] answers
//! [`Reading::SteppedBack`], `now` restarts from that reading, and the host
//! replaces its caches, which were given a `now` that the database's clock
//! will not reach for a while (the cache requires `now` monotone, and would
//! otherwise have every vouch refused until then).

use crate::api::Millis;

/// A lower bound of the database's clock, held monotone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DbClock {
    /// `db_ms - mono_ms` of the latest reading, or of a better one since.
    offset_ms: Millis,
    /// The latest `now` answered: `now` never goes back between resets.
    held_ms: Millis,
    /// How far below the `now` already answered a reading may fall before
    /// it counts as a step back. The push function honours vouches made up
    /// to the cache's skew slack ahead of its clock, so this is the skew
    /// slack.
    tolerance_ms: Millis,
}

/// What a reading revealed.
#[must_use = "a step back requires replacing the caches this clock fed"]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reading {
    /// `now` stays within the tolerance of the database's clock.
    Consistent,
    /// The database's clock was `by_ms` behind the `now` already given: it
    /// stepped back. `now` restarted from this reading: replace every cache
    /// that was given a `now` by this clock.
    SteppedBack { by_ms: Millis },
}

impl DbClock {
    /// A clock from a first reading: the database's clock read `db_ms`, and
    /// the answer arrived when the host's monotonic clock read `mono_ms`.
    pub fn new(db_ms: Millis, mono_ms: Millis, tolerance_ms: u32) -> DbClock {
        DbClock { offset_ms: db_ms.saturating_sub(mono_ms), held_ms: db_ms, tolerance_ms: Millis::from(tolerance_ms) }
    }

    /// Takes a further reading into account.
    pub fn observe(&mut self, db_ms: Millis, mono_ms: Millis) -> Reading {
        self.offset_ms = db_ms.saturating_sub(mono_ms);
        let by_ms = self.held_ms.saturating_sub(db_ms);
        if by_ms <= self.tolerance_ms {
            return Reading::Consistent;
        }
        self.held_ms = db_ms;
        Reading::SteppedBack { by_ms }
    }

    /// The bound at monotonic time `mono_ms`, not held: for measuring how far
    /// another clock is from the database's.
    pub fn estimate(&self, mono_ms: Millis) -> Millis {
        self.offset_ms.saturating_add(mono_ms)
    }

    /// The `now` to give the cache at monotonic time `mono_ms`: the bound,
    /// never below an earlier answer.
    pub fn now(&mut self, mono_ms: Millis) -> Millis {
        self.held_ms = self.held_ms.max(self.estimate(mono_ms));
        self.held_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DB: Millis = 1_700_000_000_000;

    #[test]
    fn the_bound_follows_the_monotonic_clock_from_the_latest_reading() {
        let mut clock = DbClock::new(DB, 1_000, 5_000);
        assert_eq!(clock.now(1_000), DB);
        assert_eq!(clock.now(4_000), DB + 3_000);
        // A reading delayed in transit is a lower bound too: followed, with
        // `now` held.
        assert_eq!(clock.observe(DB + 3_500, 4_600), Reading::Consistent);
        assert_eq!(clock.now(4_600), DB + 3_500);
        assert_eq!(clock.now(5_000), DB + 3_900);
        // A better one (the database's clock stepped forward) raises it.
        assert_eq!(clock.observe(DB + 60_000, 5_000), Reading::Consistent);
        assert_eq!(clock.now(5_000), DB + 60_000);
        assert_eq!(clock.estimate(6_000), DB + 61_000);
    }

    #[test]
    fn a_step_back_within_the_tolerance_keeps_the_bound_and_now_monotone() {
        let mut clock = DbClock::new(DB, 0, 5_000);
        assert_eq!(clock.now(10_000), DB + 10_000);
        assert_eq!(clock.observe(DB + 5_000, 10_000), Reading::Consistent);
        assert_eq!(clock.now(10_000), DB + 10_000);
    }

    #[test]
    fn a_step_back_past_the_tolerance_restarts_the_bound() {
        let mut clock = DbClock::new(DB, 0, 5_000);
        assert_eq!(clock.now(10_000), DB + 10_000);
        assert_eq!(clock.observe(DB - 50_000, 10_000), Reading::SteppedBack { by_ms: 60_000 });
        assert_eq!(clock.now(10_000), DB - 50_000, "now restarts with the caches it feeds");
        assert_eq!(clock.now(11_000), DB - 49_000);
        // Steps smaller than the tolerance add up against the `now` given.
        assert_eq!(clock.observe(DB - 52_000, 11_000), Reading::Consistent);
        assert_eq!(clock.observe(DB - 55_000, 11_000), Reading::SteppedBack { by_ms: 6_000 });
    }

    #[test]
    fn a_monotonic_clock_faster_than_the_database_clock_never_gets_ahead_by_more_than_between_readings() {
        // The host's monotonic clock runs 1 % fast; a reading every 10 s.
        let mut clock = DbClock::new(DB, 0, 5_000);
        for step in 1..=10_000 {
            let mono = step * 10_100;
            assert!(clock.now(mono) <= DB + step * 10_000 + 100, "{step}");
            assert_eq!(clock.observe(DB + step * 10_000, mono), Reading::Consistent, "{step}");
        }
    }

    #[test]
    fn extreme_readings_saturate_rather_than_wrap() {
        let mut clock = DbClock::new(Millis::MIN, Millis::MAX, 5_000);
        assert_eq!(clock.now(Millis::MAX), -1);
        assert_eq!(clock.observe(Millis::MAX, Millis::MIN), Reading::Consistent);
        assert_eq!(clock.now(0), Millis::MAX);
    }
}
