//! The firer every gateway runs: it takes due timers a batch at a time and
//! pushes their messages, each batch in one transaction with the timers'
//! deletion, and sets aside a timer that fails on its own.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::value::RawValue;

use super::sql::{self, DueTimer};
use super::{FirerWake, MAX_SLEEP, TimerId};
use crate::db::DbError;
use crate::gateway::{Gateway, RequestPlan};
use crate::log_limit::{self, Limited};
use crate::payload::{self, Payload};
use crate::push::PushItem;

/// Fires due timers until none is due, then sleeps until the next one is
/// (at most [`MAX_SLEEP`], less when a schedule through this gateway wakes
/// it). Runs for the gateway's life.
pub async fn fire_loop(gateway: Arc<Gateway>, wake: Arc<FirerWake>) {
    let mut firer = Firer::default();
    loop {
        let sleep = match firer.fire(&gateway).await {
            Step::Fired | Step::Again => continue,
            Step::Idle { skipped } => {
                let due = sql::next_due(gateway.db(), &skipped).await;
                let sleep = match due {
                    Ok(Some(due)) if due.is_zero() => HELD_ELSEWHERE_PAUSE,
                    Ok(Some(due)) => due.min(MAX_SLEEP),
                    Ok(None) | Err(_) => MAX_SLEEP,
                };
                firer.next_retry(Instant::now()).map_or(sleep, |retry| sleep.min(retry))
            }
            Step::Unavailable(error) => {
                if let Some(occurrences) = FIRER_UNAVAILABLE.occurred() {
                    tracing::warn!(error = %error, occurrences, "firing timers failed: the database is unavailable; retrying");
                }
                Duration::from_secs(1)
            }
        };
        tokio::select! {
            () = tokio::time::sleep(sleep) => {}
            () = wake.woken() => {}
        }
    }
}

/// Most timers one fire takes.
pub const FIRE_BATCH: i32 = 512;
/// Most payload bytes one fire takes beyond its first timer (which it takes
/// whatever its size, a payload being bounded by the body limit it was
/// scheduled under). At its peak a fire holds its payloads several times
/// over (as PostgreSQL sent them, as read, as pushed, and pages the
/// allocator has yet to give back), and one queue's large timers delay
/// another queue's by about a fire: a few megabytes keep both small, far
/// below PostgreSQL's 1 GB message, at no cost to small timers, whose
/// batches the count bounds first.
pub const FIRE_BATCH_BYTES: i64 = 4 << 20;
/// How long a firer waits before looking again when a due timer is held by
/// another gateway's firer.
const HELD_ELSEWHERE_PAUSE: Duration = Duration::from_millis(50);
/// The first wait before a timer that failed on its own is tried again; it
/// doubles with each failure, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// One warning per interval for each of the firer's causes.
static FIRER_UNAVAILABLE: Limited = Limited::new(log_limit::INTERVAL);
static BATCH_FAILED: Limited = Limited::new(log_limit::INTERVAL);
static TIMER_SET_ASIDE: Limited = Limited::new(log_limit::INTERVAL);

/// What a firer keeps between fires.
#[derive(Debug)]
struct Firer {
    /// Most timers the next fire takes: [`FIRE_BATCH`], halved after a fire
    /// of several fails (so that a timer at fault ends up alone, and is set
    /// aside), doubled again after each fire that commits.
    limit: i32,
    /// Timers that failed on their own, left out of fires until their
    /// backoff ends.
    set_aside: HashMap<TimerId, SetAside>,
}

#[derive(Clone, Copy, Debug)]
struct SetAside {
    /// Left out of fires until then.
    until: Instant,
    /// Failures in a row.
    failures: u32,
}

/// What one fire came to.
#[derive(Debug)]
enum Step {
    /// Timers fired: look again at once.
    Fired,
    /// A fire failed and the firer has narrowed down its cause: try again at
    /// once.
    Again,
    /// Nothing was due, apart from the timers set aside (`skipped`).
    Idle { skipped: Vec<TimerId> },
    /// The database could not be reached.
    Unavailable(DbError),
}

impl Default for Firer {
    fn default() -> Firer {
        Firer { limit: FIRE_BATCH, set_aside: HashMap::new() }
    }
}

impl Firer {
    /// One fire, and what the firer learns from it.
    async fn fire(&mut self, gateway: &Gateway) -> Step {
        let now = Instant::now();
        // A timer set aside is tried again once its backoff ends; one that
        // has not come back since (cancelled, re-scheduled, fired by another
        // gateway) is forgotten.
        self.set_aside.retain(|_, aside| now.saturating_duration_since(aside.until) < MAX_BACKOFF);
        let skipped: Vec<TimerId> =
            self.set_aside.iter().filter(|(_, aside)| aside.until > now).map(|(id, _)| id.clone()).collect();
        let batch = sql::Batch { count: self.limit, bytes: FIRE_BATCH_BYTES, skip: &skipped };
        match fire_batch(gateway, batch).await {
            Ok(fired) if fired.is_empty() => Step::Idle { skipped },
            Ok(fired) => {
                for id in &fired {
                    self.set_aside.remove(id);
                }
                self.limit = self.limit.saturating_mul(2).min(FIRE_BATCH);
                Step::Fired
            }
            Err(Failed { taken, at_fault, error }) => {
                if !at_fault.is_empty() {
                    for id in at_fault {
                        self.set_aside_one(gateway, id, &error, now);
                    }
                    return Step::Again;
                }
                match taken.as_slice() {
                    [] => Step::Unavailable(error),
                    [one] => {
                        // A lone timer's fire that lost its connection is
                        // its own fault only if the database still answers
                        // (PostgreSQL closes a connection that sends it a
                        // message it refuses).
                        if error.is_unavailable() && gateway.db().ping().await.is_err() {
                            return Step::Unavailable(error);
                        }
                        self.set_aside_one(gateway, one.clone(), &error, now);
                        Step::Again
                    }
                    several => {
                        self.limit = i32::try_from(several.len() / 2).unwrap_or(FIRE_BATCH).max(1);
                        if let Some(occurrences) = BATCH_FAILED.occurred() {
                            tracing::warn!(
                                error = %error,
                                timers = several.len(),
                                occurrences,
                                "a fire of several timers failed; firing fewer at a time to find any at fault"
                            );
                        }
                        Step::Again
                    }
                }
            }
        }
    }

    /// Leaves `id` out of fires for a backoff that doubles with each of its
    /// failures in a row.
    fn set_aside_one(&mut self, gateway: &Gateway, id: TimerId, error: &DbError, now: Instant) {
        let failures = self.set_aside.get(&id).map_or(0, |aside| aside.failures).saturating_add(1);
        let backoff = FIRST_BACKOFF.saturating_mul(1 << failures.saturating_sub(1).min(16)).min(MAX_BACKOFF);
        gateway.metrics().timer_set_aside();
        if let Some(occurrences) = TIMER_SET_ASIDE.occurred() {
            tracing::warn!(
                queue = %id.queue,
                timer_key = %id.timer_key,
                error = %error,
                failures,
                retry_in_s = backoff.as_secs(),
                occurrences,
                "a timer cannot be fired; it is set aside and tried again later, and the others fire meanwhile"
            );
        }
        self.set_aside.insert(id, SetAside { until: now + backoff, failures });
    }

    /// How long until the next backoff of a set-aside timer ends (those
    /// that have ended are in the fires already).
    fn next_retry(&self, now: Instant) -> Option<Duration> {
        self.set_aside.values().filter(|aside| aside.until > now).map(|aside| aside.until - now).min()
    }
}

/// A fire that did not commit: the timers it had taken (back in the table
/// with the rollback), those it found at fault itself, and why.
#[derive(Debug)]
struct Failed {
    taken: Vec<TimerId>,
    at_fault: Vec<TimerId>,
    error: DbError,
}

impl From<DbError> for Failed {
    fn from(error: DbError) -> Failed {
        Failed { taken: Vec::new(), at_fault: Vec::new(), error }
    }
}

/// Takes a batch of due timers and pushes their messages, in one
/// transaction. Answers the timers fired.
async fn fire_batch(gateway: &Gateway, batch: sql::Batch<'_>) -> Result<Vec<TimerId>, Failed> {
    let mut client = gateway.db().pool().get().await.map_err(DbError::from)?;
    let tx = client.transaction().await.map_err(DbError::from)?;
    let due = sql::take_due(&tx, batch).await?;
    if due.is_empty() {
        tx.rollback().await.map_err(DbError::from)?;
        return Ok(Vec::new());
    }
    let taken: Vec<TimerId> = due.iter().map(DueTimer::id).collect();
    let failed = |at_fault: Vec<TimerId>, error: DbError| Failed { taken: taken.clone(), at_fault, error };
    let mut items = Vec::with_capacity(due.len());
    let mut message_ids = Vec::with_capacity(due.len());
    let mut unreadable = Vec::new();
    let mut unreadable_error = None;
    for timer in due {
        let id = timer.id();
        // A payload is held to what a push takes (a decoder can read it
        // back, and PostgreSQL's jsonb can hold it). One that is not was
        // written by something other than a gateway (the table is plain
        // SQL): the rollback leaves it pending, and the firer sets it aside.
        match RawValue::from_string(timer.payload).and_then(|raw| Payload::checked(&raw)) {
            Ok(payload) => {
                items.push(PushItem {
                    queue: timer.queue.into(),
                    partition: timer.partition.into(),
                    transaction_id: Some(timer.txn.into()),
                    payload,
                });
                message_ids.push(timer.message_id);
            }
            Err(e) => {
                unreadable_error.get_or_insert_with(|| {
                    DbError::Protocol(format!("a timer's payload is not one a push takes: {}", payload::refusal(&e)))
                });
                unreadable.push(id);
            }
        }
    }
    if let Some(error) = unreadable_error {
        return Err(failed(unreadable, error));
    }
    let plan = RequestPlan::with_message_ids(items, message_ids);
    let pushed = gateway.push_in(&tx, plan).await.map_err(|e| failed(Vec::new(), e))?;
    tx.commit().await.map_err(|e| failed(Vec::new(), e.into()))?;
    gateway.committed_elsewhere(pushed.committed).await;
    gateway.metrics().timers_fired(taken.len() as u64);
    Ok(taken)
}
