//! Partitions whose row lock another session holds (found when a bundle's
//! lock wait outlasts `--lock-timeout`, see [`super::push`]): they go out on
//! their own, one at a time, on a connection of their own, until one gets
//! through.

use super::*;

/// The connection of a shard's pool that pushes contended partitions, one
/// segment at a time (see [`PartitionState::contended`]).
pub(super) const CONTENDED_CONNECTIONS: usize = 1;

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
