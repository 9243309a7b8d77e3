//! Hydration: a partition's entry built from a full-window read of its log,
//! on connections of their own.

use super::*;

/// Whether an entry in `state` can only be made to vouch by a hydration.
pub(super) fn needs_hydration(state: EntryState) -> bool {
    matches!(state, EntryState::Cold | EntryState::Gap | EntryState::Rebuild)
}

impl Worker {
    /// Runs the admission gate and, if it admits, a full-window hydration.
    pub(super) fn maybe_hydrate(&mut self, now: Millis, partition_id: i64, window_seconds: i32) {
        let Some(partition) = self.partitions.get_mut(&partition_id) else { return };
        if partition.busy || !self.config.hydrate {
            return;
        }
        // The shard keeps its own footprint hints; with none, an unknown
        // partition is estimated empty, and the budget evicts or suppresses
        // if the rows prove it wrong.
        match self.cache.admit(now, partition_id, window_ms(window_seconds), 0) {
            Admission::Suppressed => return,
            Admission::Hydrate => {}
        }
        partition.busy = true;
        let db = self.db.clone();
        let slack_ms = self.skew_slack_ms();
        self.in_flight.push(Box::pin(async move {
            let result = db.hydration(partition_id, window_seconds, slack_ms).await;
            Done::Hydration { partition_id, window_seconds, result, received: Instant::now() }
        }));
    }

    pub(super) fn hydrated(&mut self, partition_id: i64, window_seconds: i32, result: Result<HydrationRows, DbError>) {
        if let Some(partition) = self.partitions.get_mut(&partition_id) {
            partition.busy = false;
        }
        let rows = match result {
            Ok(rows) => rows,
            // A partition a transaction created is planned for before the
            // transaction commits, and its row is not visible here until
            // then (nor ever, if it rolls back): nothing is wrong, and the
            // next push hydrates it.
            Err(DbError::NotFound(_)) => return,
            Err(error) => {
                if let Some(occurrences) = HYDRATION_FAILED.occurred() {
                    tracing::warn!(
                        partition_id,
                        error = %error,
                        occurrences,
                        "hydration failed; the partition is probed in full until it succeeds"
                    );
                }
                return;
            }
        };
        // The gate again, with the window's real size: a window the budget
        // cannot hold is refused here rather than copied into the instance,
        // whose memory would keep that peak for its life.
        let now = self.now();
        let hashes = rows.rows.iter().map(|row| row.hashes.len() as u64 / 16).sum::<u64>();
        if let Admission::Suppressed = self.cache.admit(now, partition_id, window_ms(window_seconds), hashes) {
            self.metrics.hydration_suppressed();
            return;
        }
        let txns: Vec<TxnsRow<'_>> = rows.rows.iter().map(OwnedRow::borrow).collect();
        let hydration = Hydration {
            partition: partition_id,
            window_ms: window_ms(window_seconds),
            last_offset: rows.last_offset,
            rows: &txns,
        };
        let started = Instant::now();
        let cache = &mut self.cache;
        let installed = self.long_calls.run(|| cache.hydrate(now, &hydration));
        self.metrics.guest_call(started.elapsed());
        self.metrics.hydration(installed);
    }
}
