//! Partitions whose row lock another session holds: a bundle whose lock wait
//! outlasts `--lock-timeout` goes again without them, and they go out on
//! their own, one at a time, on a connection of their own.

use super::flush::{Pushed, push_one_by_one};
use super::*;

/// The connection of a shard's pool that pushes contended partitions, one
/// segment at a time (see [`PartitionState::contended`]).
pub(super) const CONTENDED_CONNECTIONS: usize = 1;

/// After a bundle's lock wait timed out (it wrote nothing: it was one
/// transaction), asks PostgreSQL which of its partitions another session
/// holds, fails their segments (503, a retry is safe) and pushes the others
/// again without them, once. When none is found locked (a table lock, or a
/// wait that has passed), every segment fails as unavailable.
pub(super) async fn push_around_locks(
    db: &Db,
    metrics: &Metrics,
    clock_floor: ClockFloor,
    pushes: &[SegmentPush],
    error: &DbError,
) -> Pushed {
    metrics.bundle_lock_timeout();
    let mut partition_ids: Vec<i64> = pushes.iter().map(|p| p.partition_id).collect();
    partition_ids.dedup();
    let locked_elsewhere = db.partitions_locked_elsewhere(&partition_ids).await.unwrap_or_else(|asking| {
        if let Some(occurrences) = LOCKS_UNKNOWN.occurred() {
            tracing::warn!(error = %asking, occurrences, "cannot tell which partitions are locked elsewhere");
        }
        Vec::new()
    });
    if let Some(occurrences) = LOCK_WAIT_TIMED_OUT.occurred() {
        tracing::warn!(error = %error, segments = pushes.len(), ?locked_elsewhere, occurrences, "a bundle's lock wait timed out");
    }
    if locked_elsewhere.is_empty() {
        return Pushed { results: vec![Err(PushFailure::from(error)); pushes.len()], locked_elsewhere };
    }
    let locked = |push: &SegmentPush| locked_elsewhere.contains(&push.partition_id);
    let free: Vec<SegmentPush> = pushes.iter().filter(|push| !locked(push)).cloned().collect();
    let free_results = if free.is_empty() {
        Vec::new()
    } else {
        match db.push_bundle(clock_floor, &free).await {
            Ok(outcomes) => outcomes.into_iter().map(Ok).collect(),
            Err(error) => push_one_by_one(db, metrics, clock_floor, &free, &error).await,
        }
    };
    let mut free_results = free_results.into_iter();
    let locked_failure = PushFailure::Unavailable(format!("the partition's row is locked by another session ({error})"));
    let results = pushes
        .iter()
        .map(|push| {
            if locked(push) {
                Err(locked_failure.clone())
            } else {
                free_results.next().expect("one result per segment pushed again")
            }
        })
        .collect();
    Pushed { results, locked_elsewhere }
}

impl Worker {
    /// Sends the next segment of the contended partition whose turn it is,
    /// alone, unless one is in flight already.
    pub(super) fn flush_contended(&mut self) {
        if self.contended_in_flight {
            return;
        }
        let next = self
            .queued
            .iter()
            .map(|id| (*id, &self.partitions[id]))
            .filter(|(_, p)| !p.busy)
            .filter_map(|(id, p)| Some((p.contended?, id)))
            .min();
        let Some((_, partition_id)) = next else { return };
        let partition = self.partitions.get_mut(&partition_id).expect("a queued partition has a state");
        partition.contended = Some(Instant::now());
        let segment = partition.take_in_flight(partition_id, self.config.max_segment);
        if partition.queue.is_empty() {
            self.queued.remove(&partition_id);
        }
        self.contended_in_flight = true;
        self.send(Lane::Contended, vec![segment]);
    }

    /// Marks the partitions found locked by another session contended, and
    /// clears a contended partition whose segment got through.
    pub(super) fn note_contention(
        &mut self,
        lane: Lane,
        segments: &[InFlight],
        results: &[Result<SegmentOutcome, PushFailure>],
        locked_elsewhere: &[i64],
    ) {
        for id in locked_elsewhere {
            if let Some(partition) = self.partitions.get_mut(id) {
                if partition.contended.is_none()
                    && let Some(occurrences) = PARTITION_LOCKED.occurred()
                {
                    tracing::warn!(
                        shard = self.id,
                        partition_id = id,
                        occurrences,
                        "partition row locked by another session; pushing it on its own until it is free"
                    );
                }
                partition.contended.get_or_insert_with(Instant::now);
            }
        }
        if lane == Lane::Contended {
            for (segment, result) in segments.iter().zip(results) {
                if result.is_ok()
                    && let Some(partition) = self.partitions.get_mut(&segment.partition_id)
                {
                    partition.contended = None;
                }
            }
        }
    }
}
