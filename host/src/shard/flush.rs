//! Flushing: the ready partitions' segments out as one bundle, and each
//! bundle's outcome back to its requests and the cache.

use super::hydrate::needs_hydration;
use super::plan::PlannedBundle;
use super::push::{Pushed, push_isolating};
use super::*;

/// The hashes of a segment's stored messages, in offset order: what the
/// cache records for the commit.
pub(super) fn stored_hashes(slots: &[Slot], per_message: &[MessageOutcome]) -> Vec<u8> {
    let mut hashes = Vec::with_capacity(16 * slots.len());
    for (slot, message) in slots.iter().zip(per_message) {
        if let MessageOutcome::Stored { .. } = message {
            hashes.extend_from_slice(&slot.message.hash);
        }
    }
    hashes
}

impl Worker {
    /// Sends every ready partition's next segment as one bundle, and a
    /// contended partition's on its own.
    pub(super) fn flush_ready(&mut self) {
        self.flush_shared();
        self.flush_contended();
    }

    /// Sends every ready partition that is not contended as one bundle, in
    /// ascending partition order: bundles stay deterministic, and the push
    /// function takes its locks in that order anyway.
    fn flush_shared(&mut self) {
        if self.bundles_in_flight >= self.config.max_in_flight {
            return;
        }
        let mut segments: Vec<InFlight> = Vec::new();
        let partitions = &mut self.partitions;
        let max_segment = self.config.max_segment;
        self.queued.retain(|&partition_id| {
            let partition = partitions.get_mut(&partition_id).expect("a queued partition has a state");
            if partition.busy || partition.contended.is_some() {
                return true;
            }
            segments.push(partition.take_in_flight(partition_id, max_segment));
            !partition.queue.is_empty()
        });
        if segments.is_empty() {
            return;
        }
        debug_assert!(segments.is_sorted_by_key(|s| s.partition_id));
        self.bundles_in_flight += 1;
        self.send(Lane::Shared, segments);
    }

    /// Plans `segments` and puts their push in flight.
    pub(super) fn send(&mut self, lane: Lane, segments: Vec<InFlight>) {
        let PlannedBundle { segments, pushes, clock_floor } = self.plan(segments);
        let db = self.db.clone();
        let metrics = self.metrics.clone();
        self.in_flight.push(Box::pin(async move {
            let started = Instant::now();
            let Pushed { results, locked_elsewhere } = push_isolating(&db, &metrics, clock_floor, &pushes).await;
            let received = Instant::now();
            Done::Bundle { lane, segments, clock_floor, results, locked_elsewhere, sql: received - started, received }
        }));
    }

    pub(super) fn complete(&mut self, done: Done) {
        match done {
            Done::Bundle { lane, segments, clock_floor, results, locked_elsewhere, sql, received } => {
                match lane {
                    Lane::Shared => self.bundles_in_flight -= 1,
                    Lane::Contended => self.contended_in_flight = false,
                }
                self.note_contention(lane, &segments, &results, &locked_elsewhere);
                self.metrics.sql_call(sql);
                assert_eq!(segments.len(), results.len(), "every segment has a result");
                if let Some(db_ms) = results.iter().flatten().map(|o| o.clock_ms).max() {
                    self.read_db_clock(DbReading { db_ms, received });
                }
                let mut stored = Vec::with_capacity(segments.len());
                for (segment, result) in segments.into_iter().zip(results) {
                    match result {
                        Ok(outcome) => stored.push((segment, outcome)),
                        Err(failure) => self.failed(segment, failure),
                    }
                }
                self.committed(stored, clock_floor);
            }
            Done::Hydration { partition_id, window_seconds, result, received } => {
                if let Ok(rows) = &result {
                    self.read_db_clock(DbReading { db_ms: rows.clock_ms, received });
                }
                self.hydrated(partition_id, window_seconds, result);
            }
        }
    }

    pub(super) fn committed(&mut self, stored: Vec<(InFlight, SegmentOutcome)>, clock_floor: ClockFloor) {
        if stored.is_empty() {
            return;
        }
        let now = self.now();
        let mut commits: Vec<OwnedCommit> = Vec::new();
        let mut wants_hydration: Vec<WantsHydration> = Vec::new();
        for (in_flight, outcome) in stored {
            let InFlight { partition_id, window_seconds: planned, state, p_verified, segment } = in_flight;
            self.metrics.segment(outcome.probe);
            if p_verified >= 0 && outcome.clock_ms < clock_floor.0 {
                self.metrics.vouch_refused();
            }
            let window_seconds = outcome.window_seconds;
            let partition = self.partitions.get_mut(&partition_id).expect("a partition in flight has a state");
            partition.busy = false;
            // The window in force wins over the memoised one; the next plan
            // carries it, and the cache rebuilds under it.
            partition.observe_window(window_seconds, Instant::now());
            let CoalescedSegment { slots, hashes } = segment;
            let per_message = outcome.per_message(slots.len());
            if let Some(stored) = outcome.stored {
                let hashes = if outcome.duplicates.is_empty() { hashes } else { stored_hashes(&slots, &per_message) };
                commits.push(OwnedCommit {
                    partition: partition_id,
                    base_offset: stored.base_offset,
                    created_ms: stored.created_ms,
                    hashes,
                });
            }
            for (slot, message) in slots.into_iter().zip(per_message) {
                let outcome = match message {
                    MessageOutcome::Stored { offset } => Outcome::Queued { message_id: slot.message.message_id, offset },
                    MessageOutcome::Duplicate(d) => Outcome::Duplicate { message_id: d.message_id, offset: d.offset },
                };
                self.deliver(slot, outcome);
            }
            if window_seconds > 0 && (needs_hydration(state) || window_seconds != planned) {
                wants_hydration.push(WantsHydration { partition_id, window_seconds });
            }
        }
        self.record(now, &commits);
        for WantsHydration { partition_id, window_seconds } in wants_hydration {
            self.maybe_hydrate(now, partition_id, window_seconds);
        }
    }

    pub(super) fn record(&mut self, now: Millis, commits: &[OwnedCommit]) {
        if commits.is_empty() {
            return;
        }
        let commits: Vec<Commit<'_>> = commits.iter().map(OwnedCommit::borrow).collect();
        let started = Instant::now();
        self.cache.record_commits(now, &commits);
        self.metrics.guest_call(started.elapsed());
    }

    /// Answers every request with a message in `in_flight` with `failure`.
    pub(super) fn failed(&mut self, in_flight: InFlight, failure: PushFailure) {
        if let Some(partition) = self.partitions.get_mut(&in_flight.partition_id) {
            partition.busy = false;
        }
        for slot in in_flight.segment.slots {
            for waiter in slot.waiters() {
                if let Some(request) = self.requests.remove(&waiter.request) {
                    let _ = request.reply.send(Err(failure.clone()));
                }
            }
        }
    }

    /// Delivers a slot's final outcome: the leader gets it as is, every other
    /// waiter inherits it as a duplicate of the leader's result.
    pub(super) fn deliver(&mut self, slot: Slot, leader: Outcome) {
        let inherited = match leader {
            Outcome::Queued { message_id, offset } | Outcome::Duplicate { message_id, offset } => {
                Outcome::Duplicate { message_id, offset }
            }
        };
        for (position, waiter) in slot.waiters().enumerate() {
            let outcome = if position == 0 { leader } else { inherited };
            let Some(request) = self.requests.get_mut(&waiter.request) else { continue };
            let cell = &mut request.outcomes[waiter.index as usize];
            debug_assert!(cell.is_none(), "each message is answered once");
            *cell = Some(outcome);
            request.remaining -= 1;
            if request.remaining == 0 {
                let request = self.requests.remove(&waiter.request).expect("present");
                let outcomes = request.outcomes.into_iter().map(|o| o.expect("all answered")).collect();
                let _ = request.reply.send(Ok(outcomes));
            }
        }
    }
}
