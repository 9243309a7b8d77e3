//! Planning a bundle: what the cache vouches for each segment, and the cuts
//! that let it vouch for more (a run of hits among unseen hashes, replays of
//! several requests, each hash's own floor).

use super::*;

/// Replays a segment holds at most for its floors to be left unasked: the
/// push function looks for up to 4 hashes in the first row of the span that
/// holds any of them, which is the row just above the floor of the lowest.
const FEW_REPLAYS: usize = 4;

/// How far from its length the floors of a segment's first and last hashes
/// may lie apart for the segment to be taken for one run of the log: two
/// arrival steps of a sealed run of one block (`guest/src/ring/run.rs`), so
/// that a recent retry is taken for one, while ids picked at random from a
/// window of thousands rarely are.
const RUN_SLACK: i64 = 32;

/// A bundle as planned: its segments, what is sent for each, and the clock
/// floor its vouches hold from.
pub(super) struct PlannedBundle {
    pub(super) segments: Vec<InFlight>,
    pub(super) pushes: Vec<SegmentPush>,
    pub(super) clock_floor: ClockFloor,
}

impl Worker {
    /// Asks the cache for each segment's `p_verified`. A segment whose local
    /// hits form one run among hashes the cache has not seen (a retry
    /// coalesced with fresh pushes) is cut around that run, and the pieces
    /// are planned again: the hits then narrow the probe of their own piece
    /// only, and the other pieces stay vouched instead of being read for
    /// over the whole span. The push function probes a later segment of a
    /// partition against the earlier ones of its bundle, so the cut changes
    /// no verdict, and the pieces keep the messages' order. A segment of
    /// hits only may be cut per request (see [`Worker::cut_replays`]). Where
    /// hits are scattered among fresh messages, the requests that replay
    /// only are taken apart, a piece each, after the rest
    /// ([`CoalescedSegment::part_replaying_requests`]): they are judged
    /// without the partition's lock, and do not hold the fresh messages'
    /// segment to the locked probe. Hits scattered within requests leave
    /// the segment whole (one probe and one log row, not many small
    /// segments).
    ///
    /// The bundle carries its clock floor: the cache judged age by `now`, so
    /// its vouches hold only once PostgreSQL's clock is past `now` less the
    /// slack.
    ///
    /// The slots' transactionIds and payloads move into the pushes (they are
    /// views of request bodies, and a copy touches a body's reference count):
    /// once planned, a slot is answered from its message id and hash only.
    pub(super) fn plan(&mut self, segments: Vec<InFlight>) -> PlannedBundle {
        let now = self.now();
        let first = self.ask(now, &segments);
        let mut planned: Vec<(InFlight, Option<Plan>)> = Vec::with_capacity(segments.len());
        for (in_flight, plan) in segments.into_iter().zip(first) {
            let InFlight { partition_id, window_seconds, state, p_verified, segment } = in_flight;
            match segment.cut_around(&plan.local_hits) {
                Ok(pieces) => {
                    for segment in pieces {
                        planned.push((InFlight { partition_id, window_seconds, state, p_verified, segment }, None));
                    }
                }
                Err(segment) => match segment.part_replaying_requests(&plan.local_hits) {
                    Ok(pieces) => {
                        for segment in pieces {
                            planned.push((InFlight { partition_id, window_seconds, state, p_verified, segment }, None));
                        }
                    }
                    Err(segment) => {
                        for (segment, plan) in self.cut_replays(now, partition_id, window_seconds, segment, plan) {
                            planned.push((InFlight { partition_id, window_seconds, state, p_verified, segment }, Some(plan)));
                        }
                    }
                },
            }
        }
        let cut: Vec<&InFlight> = planned.iter().filter(|(_, plan)| plan.is_none()).map(|(s, _)| s).collect();
        if !cut.is_empty() {
            let mut again = self.ask(now, &cut).into_iter();
            for (_, plan) in planned.iter_mut().filter(|(_, plan)| plan.is_none()) {
                *plan = again.next();
            }
        }
        let planned: Vec<(InFlight, Plan)> =
            planned.into_iter().map(|(s, plan)| (s, plan.expect("every segment and run is planned"))).collect();
        let floors = self.hash_floors(now, &planned);
        let mut pushes = Vec::with_capacity(planned.len());
        let mut segments = Vec::with_capacity(planned.len());
        for ((mut in_flight, plan), hash_floors) in planned.into_iter().zip(floors) {
            in_flight.state = plan.state;
            in_flight.p_verified = plan.p_verified;
            self.metrics.flush_size(in_flight.segment.slots.len());
            let replays = in_flight.segment.all_named(&plan.local_hits);
            let slots = &mut in_flight.segment.slots;
            pushes.push(SegmentPush {
                partition_id: in_flight.partition_id,
                p_verified: plan.p_verified,
                planned_window_seconds: in_flight.window_seconds,
                hashes: in_flight.segment.hashes.clone(),
                message_ids: slots.iter().map(|s| s.message.message_id).collect(),
                transaction_ids: slots.iter_mut().map(|s| std::mem::take(&mut s.message.transaction_id)).collect(),
                payloads: slots.iter_mut().map(|s| std::mem::replace(&mut s.message.payload, Payload::null())).collect(),
                hash_floors,
                replays,
            });
            segments.push(in_flight);
        }
        PlannedBundle { segments, pushes, clock_floor: self.clock_floor(now) }
    }

    /// Cuts a segment of replays only (every slot a local hit: likely all
    /// duplicates, so no piece writes a log row) where its leading request
    /// changes, when the cache floors each piece apart from the others. A
    /// segment is probed from its lowest floor, and replays of different
    /// requests are rarely one run of the log, so the probe of the whole
    /// reads the span from the lowest original up; each piece is probed
    /// from its own floor instead, usually one slice of one row. Pieces that
    /// share a floor (old hits, floored at the start of a large run) would
    /// each read that span again: then the segment stays whole, with its
    /// own plan.
    fn cut_replays(
        &mut self,
        now: Millis,
        partition_id: i64,
        window_seconds: i32,
        segment: CoalescedSegment,
        plan: Plan,
    ) -> Vec<(CoalescedSegment, Plan)> {
        let changes = if segment.all_named(&plan.local_hits) { segment.request_changes() } else { Vec::new() };
        if changes.is_empty() {
            return vec![(segment, plan)];
        }
        let window_ms = window_ms(window_seconds);
        let bounds: Vec<usize> = std::iter::once(0).chain(changes.iter().copied()).chain([segment.slots.len()]).collect();
        let queries: Vec<CacheSegment<'_>> = bounds
            .windows(2)
            .map(|piece| CacheSegment {
                partition: partition_id,
                window_ms,
                hashes: &segment.hashes[16 * piece[0]..16 * piece[1]],
            })
            .collect();
        let plans = self.cache_plan(now, &queries);
        let mut floors: Vec<i64> = plans.iter().map(|plan| plan.p_verified).collect();
        floors.sort_unstable();
        floors.dedup();
        if floors.len() < plans.len() {
            return vec![(segment, plan)];
        }
        segment.cut_at(&changes).into_iter().zip(plans).collect()
    }

    /// Each hash's own floor, for every segment of replays only (every slot
    /// a local hit) of more than [`FEW_REPLAYS`] messages that does not look
    /// like one run of the log, from plan calls that ask for hashes alone: a
    /// lone hash's `p_verified` is its own floor. A segment is probed from
    /// its lowest floor, and replays of ids stored far apart (a redelivery
    /// storm) would read every row above it; with its hashes' floors the
    /// push function looks for each original in the 128 offsets above its
    /// own floor.
    ///
    /// A retry of one request stored whole is one run, which the probe finds
    /// in one slice above the lowest floor: its first and last hashes are
    /// asked for first, and a segment whose floors lie as far apart as its
    /// ends (within [`RUN_SLACK`]) is sent without floors. `None` too where
    /// a hash alone is not a hit (then nothing is claimed) or all the floors
    /// are one (old hits floored at the start of one large run: no floor
    /// narrows more than the segment's own).
    fn hash_floors(&mut self, now: Millis, planned: &[(InFlight, Plan)]) -> Vec<Option<Vec<i64>>> {
        let replays: Vec<bool> = planned
            .iter()
            .map(|(s, plan)| s.segment.slots.len() > FEW_REPLAYS && s.segment.all_named(&plan.local_hits))
            .collect();
        if !replays.contains(&true) {
            return vec![None; planned.len()];
        }
        let ends: Vec<Vec<u8>> = planned
            .iter()
            .zip(&replays)
            .filter(|(_, replay)| **replay)
            .map(|((s, _), _)| [&s.segment.hashes[..16], &s.segment.hashes[s.segment.hashes.len() - 16..]].concat())
            .collect();
        let mut end_floors =
            self.floors_alone(now, planned.iter().zip(&replays).filter(|(_, r)| **r).map(|(p, _)| &p.0).zip(&ends)).into_iter();
        let scattered: Vec<bool> = planned
            .iter()
            .zip(&replays)
            .map(|((s, _), &replay)| {
                let floors = if replay { end_floors.next().flatten() } else { None };
                floors.is_some_and(|floors| {
                    let spread = floors[1] - floors[0] - (s.segment.slots.len() as i64 - 1);
                    spread.abs() > RUN_SLACK
                })
            })
            .collect();
        let wanted =
            planned.iter().zip(&scattered).filter(|(_, scattered)| **scattered).map(|(p, _)| (&p.0, &p.0.segment.hashes));
        let mut floors = self.floors_alone(now, wanted).into_iter();
        scattered
            .iter()
            .map(|&scattered| {
                let floors = if scattered { floors.next().flatten() } else { None };
                floors.filter(|floors| floors.iter().any(|&floor| floor != floors[0]))
            })
            .collect()
    }

    /// For each segment with some of its hashes, one plan call asking for
    /// each of those hashes alone: their floors, in order, or `None` for a
    /// segment one of whose hashes alone is not a hit.
    fn floors_alone<'a, B: AsRef<[u8]> + 'a>(
        &mut self,
        now: Millis,
        segments: impl Iterator<Item = (&'a InFlight, B)>,
    ) -> Vec<Option<Vec<i64>>> {
        let asked: Vec<(i64, u64, B)> =
            segments.map(|(s, hashes)| (s.partition_id, window_ms(s.window_seconds), hashes)).collect();
        if asked.is_empty() {
            return Vec::new();
        }
        let queries: Vec<CacheSegment<'_>> = asked
            .iter()
            .flat_map(|(partition, window_ms, hashes)| {
                hashes.as_ref().chunks_exact(16).map(|hash| CacheSegment {
                    partition: *partition,
                    window_ms: *window_ms,
                    hashes: hash,
                })
            })
            .collect();
        let mut alone = self.cache_plan(now, &queries).into_iter();
        asked
            .iter()
            .map(|(_, _, hashes)| {
                // Each segment takes exactly its own answers, whatever they say.
                let floors: Vec<Option<i64>> = (&mut alone)
                    .take(hashes.as_ref().len() / 16)
                    .map(|plan| (plan.local_hits == [0]).then_some(plan.p_verified))
                    .collect();
                floors.into_iter().collect()
            })
            .collect()
    }

    /// One plan call: the cache's answer for each segment, in order. A local
    /// hit is a hint, never a verdict: the cache has already narrowed
    /// `p_verified` below the hit's original, so the probe finds it (and the
    /// first occurrence of every hash).
    fn ask<S: std::borrow::Borrow<InFlight>>(&mut self, now: Millis, segments: &[S]) -> Vec<Plan> {
        let queries: Vec<CacheSegment<'_>> = segments
            .iter()
            .map(|s| {
                let s = s.borrow();
                CacheSegment { partition: s.partition_id, window_ms: window_ms(s.window_seconds), hashes: &s.segment.hashes }
            })
            .collect();
        self.cache_plan(now, &queries)
    }

    /// One plan call, timed.
    pub(super) fn cache_plan(&mut self, now: Millis, queries: &[CacheSegment<'_>]) -> Vec<Plan> {
        let started = Instant::now();
        let plans = self.cache.plan(now, queries);
        self.metrics.guest_call(started.elapsed());
        assert_eq!(plans.len(), queries.len(), "the cache answers every segment");
        plans
    }

    /// What a bundle planned at `now` assumes of PostgreSQL's clock: the
    /// cache judged age by `now`, so its vouches hold once PostgreSQL's clock
    /// is past `now` less the slack.
    pub(super) fn clock_floor(&self, now: Millis) -> ClockFloor {
        ClockFloor(now.saturating_sub(Millis::from(self.skew_slack_ms())))
    }
}
