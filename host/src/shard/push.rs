//! Pushing one bundle: its answer segment by segment, a refused segment
//! isolated from the rest, and the partitions another session holds left
//! out.

use super::*;

/// What became of a bundle: one result per segment, in order, and the
/// partitions found locked by another session.
pub(super) struct Pushed {
    pub(super) results: Vec<Result<SegmentOutcome, PushFailure>>,
    pub(super) locked_elsewhere: Vec<i64>,
}

/// Pushes a bundle and answers each of its segments, in order.
///
/// A bundle whose wait for a row lock outlasted the lock timeout goes to
/// [`push_around_locks`]. When PostgreSQL refuses the bundle for a reason
/// that may belong to one segment, [`push_one_by_one`] isolates it.
pub(super) async fn push_isolating(db: &Db, metrics: &Metrics, clock_floor: ClockFloor, pushes: &[SegmentPush]) -> Pushed {
    match db.push_bundle(clock_floor, pushes).await {
        Ok(outcomes) => Pushed { results: outcomes.into_iter().map(Ok).collect(), locked_elsewhere: Vec::new() },
        Err(error) if error.is_lock_timeout() => push_around_locks(db, metrics, clock_floor, pushes, &error).await,
        Err(error) => {
            Pushed { results: push_one_by_one(db, metrics, clock_floor, pushes, &error).await, locked_elsewhere: Vec::new() }
        }
    }
}

/// After PostgreSQL refused a bundle with `error`: when the refusal may
/// belong to one segment (anything but the database being unavailable),
/// each segment is pushed again on its own, in order, so that a message
/// PostgreSQL cannot take fails its own segment's requests and no other.
/// The refused bundle wrote nothing (it was one transaction), and a segment
/// pushed alone keeps its plan: a later segment of a partition is probed
/// above `p_verified`, which covers whatever an earlier one stored or did
/// not.
async fn push_one_by_one(
    db: &Db,
    metrics: &Metrics,
    clock_floor: ClockFloor,
    pushes: &[SegmentPush],
    error: &DbError,
) -> Vec<Result<SegmentOutcome, PushFailure>> {
    if error.is_unavailable() || pushes.len() == 1 {
        if let Some(occurrences) = BUNDLE_FAILED.occurred() {
            tracing::warn!(error = %error, segments = pushes.len(), occurrences, "bundle failed");
        }
        return vec![Err(PushFailure::from(error)); pushes.len()];
    }
    if let Some(occurrences) = BUNDLE_REFUSED.occurred() {
        tracing::warn!(error = %error, segments = pushes.len(), occurrences, "bundle refused; pushing its segments one by one");
    }
    metrics.bundle_split();
    let mut results = Vec::with_capacity(pushes.len());
    for push in pushes {
        let result = match db.push_bundle(clock_floor, std::slice::from_ref(push)).await {
            Ok(mut outcomes) => Ok(outcomes.pop().expect("the push function answers its one segment")),
            Err(error) => {
                if let Some(occurrences) = SEGMENT_REFUSED.occurred() {
                    tracing::warn!(error = %error, partition_id = push.partition_id, occurrences, "segment refused");
                }
                Err(PushFailure::from(&error))
            }
        };
        results.push(result);
    }
    results
}

/// After a bundle's lock wait timed out (it wrote nothing: it was one
/// transaction), asks PostgreSQL which of its partitions another session
/// holds, fails their segments (503, a retry is safe) and pushes the others
/// again without them, once. When none is found locked (a table lock, or a
/// wait that has passed), every segment fails as unavailable.
async fn push_around_locks(
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
