//! The worker's clock: a lower bound of PostgreSQL's, from the readings
//! every push and hydration returns and the monotonic time since.

use super::*;

/// Warns, once per process, that this host's wall clock is off PostgreSQL's
/// by more than the skew slack.
pub(super) fn warn_clock_offset(offset_ms: i64, slack_ms: u32) {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if WARNED.swap(true, Ordering::Relaxed) {
        return;
    }
    let direction = if offset_ms > 0 { "ahead of" } else { "behind" };
    tracing::warn!(
        offset_ms,
        slack_ms,
        "this host's clock is {:.1} s {direction} PostgreSQL's; stile judges age by PostgreSQL's clock, so verdicts \
         are unaffected, but the host's time sync needs fixing",
        offset_ms.unsigned_abs() as f64 / 1000.0
    );
}

/// The host's wall clock, in milliseconds since the Unix epoch: only to
/// measure how far it is from PostgreSQL's.
pub(super) fn wall_clock_ms() -> Millis {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    Millis::try_from(since.as_millis()).unwrap_or(Millis::MAX)
}

impl Worker {
    /// The cache's clock-skew slack: hydrations read this much further back
    /// than the window, a bundle's vouches hold from its `now` less this on,
    /// and readings of PostgreSQL's clock may fall this far below the `now`
    /// already given before they count as a step back. The cache's own, so
    /// that the floor never assumes less than the cache's expiry did.
    pub(super) fn skew_slack_ms(&self) -> u32 {
        self.cache.config().skew_slack_ms
    }

    /// The cache's `now`: PostgreSQL's clock as bounded from below, held
    /// monotone.
    pub(super) fn now(&mut self) -> Millis {
        let mono_ms = self.mono_ms(Instant::now());
        self.clock.now(mono_ms)
    }

    /// Milliseconds of the monotonic clock at `instant`.
    pub(super) fn mono_ms(&self, instant: Instant) -> Millis {
        Millis::try_from(instant.saturating_duration_since(self.mono_origin).as_millis()).unwrap_or(Millis::MAX)
    }

    /// Takes a reading of PostgreSQL's clock into the cache's clock. One that
    /// shows the clock stepped back replaces the cache: its `now` restarts
    /// lower, and the cache requires it monotone. Segments in flight are
    /// unaffected (their commits find no entry and are ignored).
    pub(super) fn read_db_clock(&mut self, reading: DbReading) {
        let mono_ms = self.mono_ms(reading.received);
        if let Reading::SteppedBack { by_ms } = self.clock.observe(reading.db_ms, mono_ms) {
            tracing::warn!(
                shard = self.id,
                by_ms,
                "PostgreSQL's clock stepped back; this shard's dedup cache starts afresh (verdicts are unaffected)"
            );
            self.metrics.database_clock_stepped_back();
            self.cache.reset();
        }
    }
}
