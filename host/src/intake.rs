//! The bound on what requests in progress hold, and who waits for room.
//!
//! Producers can offer more than PostgreSQL takes; without a bound, every
//! request the gateway accepts is read, parsed and queued, and memory grows
//! with the backlog. [`Intake`] holds a budget of bytes, and a request is
//! admitted before it reads its body: one that declares its length takes its
//! whole charge at once ([`CHARGE_PER_BODY_BYTE`] bytes per body byte: the
//! body, the items parsed from it, and the answer built for them).
//!
//! The invariant this module keeps: **a request never waits for room while it
//! holds any.** Waiting happens only at admission, holding nothing, so
//! requests can never wait on each other in a circle; every holder is on its
//! way to an answer, bounded by the time limits on its client and on
//! PostgreSQL. A body sent without a length (chunked) is admitted for a first
//! slice and then grows only into room that is free at that moment; when
//! there is none, it is refused rather than left to wait while it holds.
//!
//! Under a backlog the gateway sheds rather than queues without end: requests
//! wait for room in arrival order, as many as the recent rate of admission
//! would let in within most of the queue's time limit ([`DrainRate`]; at
//! least one budget's worth), and none longer than that limit; past either, a
//! request is refused ([`Shed`]) before its body is read, and its client is
//! told to retry. Bounding the backlog by time rather than by bytes keeps
//! clients that retry a 503 at once from spinning while a wait of a few
//! seconds would have served them: a refused request's body is still read and
//! thrown away, and its client sends it again, which costs the CPU that the
//! admitted requests need.
//!
//! Large requests may hold at most the budget less a reserve
//! ([`RESERVE_FRACTION`]): the reserve is for small requests, so that a few
//! large bodies arriving slowly, or large answers a client does not read,
//! cannot stall a producer's small push behind them.
//!
//! An answer is held too, from the moment it is built until the connection
//! has taken its last byte ([`HeldBody`]). A push's answer keeps what its
//! body was charged (taking more of the room there is when it needs it,
//! never waiting); a read reserves room for its answer before it asks
//! PostgreSQL ([`Intake::reserve_answer`]) and builds no more than that.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// Bytes a request is charged per byte of its body.
pub const CHARGE_PER_BODY_BYTE: usize = 3;

/// A charge at or below this is small: it may use the whole budget, the
/// reserve included. 64 KiB of body: a push of a few hundred messages.
pub const SMALL_CHARGE_BYTES: usize = CHARGE_PER_BODY_BYTE * (64 << 10);

/// The share of the budget (one part in this many) that only small
/// requests may hold.
pub const RESERVE_FRACTION: usize = 8;

/// The first slice of a body sent without a length, admitted before it is
/// read; past it, the body grows only into free room.
pub const UNDECLARED_FIRST_SLICE_BYTES: usize = 64 << 10;

/// How long after a refusal the intake still reports itself saturated.
const SATURATION_MEMORY: Duration = Duration::from_secs(1);

/// The share of the queue's time limit the backlog may take to drain, at the
/// recent rate of admission: the rest is a margin for the rate to fall, so
/// that a request let wait is seldom refused at the limit.
const BACKLOG_SHARE_OF_QUEUE_TIMEOUT: f64 = 0.8;

/// How long a window of the admission rate lasts.
const DRAIN_WINDOW: Duration = Duration::from_secs(1);

/// How an intake is set up.
#[derive(Clone, Copy, Debug)]
pub struct IntakeConfig {
    /// The most bytes requests in progress may hold (at least one byte).
    pub limit_bytes: usize,
    /// The longest a request waits for room before it is refused.
    pub queue_timeout: Duration,
}

/// The counters an intake reports to.
#[derive(Clone, Debug, Default)]
pub struct IntakeCounters {
    /// Requests that found no room and waited for it.
    pub waited: Counter,
    /// Requests refused for want of room.
    pub shed: Counter,
    /// Requests whose client hung up while they waited for room.
    pub abandoned: Counter,
}

/// The budget of bytes held by requests in progress.
#[derive(Debug)]
pub struct Intake {
    /// The whole budget: every charge is taken from it.
    room: Arc<Semaphore>,
    /// The budget less the reserve: a large charge is taken from it too.
    large_room: Arc<Semaphore>,
    limit_bytes: usize,
    large_limit_bytes: usize,
    queue_timeout: Duration,
    /// Charges of the requests waiting for room now, and their number.
    waiting_bytes: AtomicUsize,
    waiting_requests: AtomicUsize,
    /// When the last request was refused, in milliseconds since `born`.
    last_shed_ms: AtomicU64,
    born: Instant,
    drain: DrainRate,
    counters: IntakeCounters,
}

/// Why a request was refused room: it was not admitted, holds nothing, and
/// may be sent again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shed {
    /// The requests already waiting for room would not all be let in within
    /// the queue's time limit.
    Backlog,
    /// No room came within the queue's time limit.
    Timeout(Duration),
    /// A body sent without a length grew past the room that was free.
    NoRoomToGrow,
    /// The client hung up while the request waited: nobody would hear its
    /// answer, so it is not read or run.
    Abandoned,
}

impl std::fmt::Display for Shed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Shed::Backlog => {
                f.write_str("the gateway is at capacity and its backlog would not drain within the queue time limit; retry")
            }
            Shed::Timeout(limit) => {
                write!(f, "the gateway had no room for this request within {} s; retry", limit.as_secs_f64())
            }
            Shed::NoRoomToGrow => {
                f.write_str("the gateway has no room for more of this body (sent without a Content-Length); retry")
            }
            Shed::Abandoned => f.write_str("the client hung up while the request waited for room"),
        }
    }
}

/// What one request holds of the budget; given back when dropped.
#[derive(Debug, Default)]
pub struct Held {
    /// The charge, from the whole budget.
    permit: Option<OwnedSemaphorePermit>,
    /// The same charge from the large requests' share, when it is large.
    large: Option<OwnedSemaphorePermit>,
}

/// A snapshot of the intake, for `/health` and `/metrics`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IntakeState {
    pub held_bytes: usize,
    pub limit_bytes: usize,
    pub waiting_requests: usize,
    /// Requests wait for room now, or one was refused within the last second.
    pub saturated: bool,
}

impl Intake {
    pub fn new(config: IntakeConfig, counters: IntakeCounters) -> Intake {
        let limit_bytes = config.limit_bytes.clamp(1, Semaphore::MAX_PERMITS);
        let large_limit_bytes = (limit_bytes - limit_bytes / RESERVE_FRACTION).max(1);
        Intake {
            room: Arc::new(Semaphore::new(limit_bytes)),
            large_room: Arc::new(Semaphore::new(large_limit_bytes)),
            limit_bytes,
            large_limit_bytes,
            queue_timeout: config.queue_timeout,
            waiting_bytes: AtomicUsize::new(0),
            waiting_requests: AtomicUsize::new(0),
            last_shed_ms: AtomicU64::new(u64::MAX),
            born: Instant::now(),
            drain: DrainRate::new(),
            counters,
        }
    }

    /// Admits a request whose body is `body_bytes` long: takes its whole
    /// charge, waiting for room in arrival order when there is none, or
    /// refuses it. `held` must hold nothing: a request waits only before it
    /// holds any room.
    ///
    /// A request that waited is let in only if `hung_up` says its client is
    /// still there: after a burst, the requests of clients that gave up
    /// leave the queue as their turns come, at the cost of a look at their
    /// sockets, instead of being read, run and stored for nobody while the
    /// requests behind them wait.
    pub async fn admit(&self, held: &mut Held, body_bytes: usize, hung_up: impl Fn() -> bool) -> Result<(), Shed> {
        assert_eq!(held.bytes(), 0, "a request waits for room only while it holds none");
        let charge = self.charge_for(body_bytes);
        if charge == 0 {
            return Ok(());
        }
        if let Some(taken) = self.try_take(charge) {
            self.drain.admitted(charge);
            *held = taken;
            return Ok(());
        }
        let backlog = self.waiting_bytes.fetch_add(charge, Ordering::AcqRel) + charge;
        let mut waiting = Waiting { intake: self, charge, queued: false };
        if backlog > self.backlog_limit_bytes() {
            return Err(self.shed(Shed::Backlog));
        }
        waiting.queue();
        match tokio::time::timeout(self.queue_timeout, self.take(charge)).await {
            Ok(_) if hung_up() => {
                self.counters.abandoned.inc();
                Err(Shed::Abandoned)
            }
            Ok(taken) => {
                self.drain.admitted(charge);
                *held = taken;
                Ok(())
            }
            Err(_) => Err(self.shed(Shed::Timeout(self.queue_timeout))),
        }
    }

    /// The most bytes of requests that may wait for room: what the recent
    /// rate of admission lets in within most of the queue's time limit, and
    /// at least one budget.
    fn backlog_limit_bytes(&self) -> usize {
        let drains = self.drain.bytes_per_second() * self.queue_timeout.as_secs_f64() * BACKLOG_SHARE_OF_QUEUE_TIMEOUT;
        // A float past usize's range saturates in the cast.
        (drains as usize).max(self.limit_bytes)
    }

    /// Grows what `held` holds for a body sent without a length to the
    /// charge of `body_bytes`, into room that is free now. Never waits: the
    /// request already holds room.
    pub fn grow(&self, held: &mut Held, body_bytes: usize) -> Result<(), Shed> {
        let charge = self.charge_for(body_bytes);
        let more = charge.saturating_sub(held.bytes());
        if more == 0 {
            return Ok(());
        }
        let large_more = if charge > SMALL_CHARGE_BYTES { charge - held.large_bytes() } else { 0 };
        let large = match large_more {
            0 => None,
            more => Some(try_acquire(&self.large_room, more).ok_or_else(|| self.shed(Shed::NoRoomToGrow))?),
        };
        let permit = try_acquire(&self.room, more).ok_or_else(|| self.shed(Shed::NoRoomToGrow))?;
        held.merge(Held { permit: Some(permit), large });
        Ok(())
    }

    /// Reserves room for a read's answer of at most `want` bytes, from what
    /// is free now; never waits. The answer must then be built within the
    /// reservation's [`Held::bytes`], which may be less than `want` (or 0
    /// when no room is free at all).
    pub fn reserve_answer(&self, want: usize) -> Held {
        let want = want.min(self.large_limit_bytes);
        let free_large = self.large_room.available_permits().min(self.room.available_permits());
        let large = want.min(free_large);
        if large > SMALL_CHARGE_BYTES
            && let Some(taken) = self.try_take(large)
        {
            return taken;
        }
        let small = want.min(SMALL_CHARGE_BYTES).min(self.room.available_permits());
        if small == 0 {
            return Held::default();
        }
        try_acquire(&self.room, small).map_or_else(Held::default, |permit| Held { permit: Some(permit), large: None })
    }

    /// Holds `answer_bytes` for an answer built with `held` (what its
    /// request held for its body, or reserved for its answer): gives back
    /// what the answer does not need, or takes more of the room there is
    /// now. It never waits: the answer's bytes exist already, and waiting
    /// would only keep them longer (and hold up `/metrics` and `/health`
    /// behind a full budget).
    pub fn hold_answer(&self, mut held: Held, answer_bytes: usize) -> Held {
        let want = answer_bytes.clamp(1, self.limit_bytes);
        if held.bytes() >= want {
            held.shrink_to(want);
            return held;
        }
        loop {
            let more = (want - held.bytes()).min(self.room.available_permits());
            if more == 0 {
                return held;
            }
            if let Some(permit) = try_acquire(&self.room, more) {
                held.merge(Held { permit: Some(permit), large: None });
                return held;
            }
        }
    }

    /// The bytes held now.
    pub fn held_bytes(&self) -> usize {
        self.limit_bytes - self.room.available_permits()
    }

    pub fn limit_bytes(&self) -> usize {
        self.limit_bytes
    }

    /// What the intake holds, and whether it is saturated.
    pub fn state(&self) -> IntakeState {
        let waiting_requests = self.waiting_requests.load(Ordering::Acquire);
        let last_shed = self.last_shed_ms.load(Ordering::Acquire);
        let recently_shed =
            last_shed != u64::MAX && self.millis_since_born().saturating_sub(last_shed) < SATURATION_MEMORY.as_millis() as u64;
        IntakeState {
            held_bytes: self.held_bytes(),
            limit_bytes: self.limit_bytes,
            waiting_requests,
            saturated: waiting_requests > 0 || recently_shed,
        }
    }

    /// The charge of a body of `body_bytes`, cut so that it can be admitted:
    /// a large one to the large requests' share (it then runs alone among
    /// them).
    fn charge_for(&self, body_bytes: usize) -> usize {
        let charge = body_bytes.saturating_mul(CHARGE_PER_BODY_BYTE);
        if charge > SMALL_CHARGE_BYTES { charge.min(self.large_limit_bytes) } else { charge.min(self.limit_bytes) }
    }

    /// Takes `charge` from free room, without waiting.
    fn try_take(&self, charge: usize) -> Option<Held> {
        let large = if charge > SMALL_CHARGE_BYTES { Some(try_acquire(&self.large_room, charge)?) } else { None };
        let permit = try_acquire(&self.room, charge)?;
        Some(Held { permit: Some(permit), large })
    }

    /// Waits for `charge`, in arrival order: a large charge first for its
    /// share, then for the whole budget.
    async fn take(&self, charge: usize) -> Held {
        let large = if charge > SMALL_CHARGE_BYTES { Some(acquire(&self.large_room, charge).await) } else { None };
        let permit = acquire(&self.room, charge).await;
        Held { permit: Some(permit), large }
    }

    fn shed(&self, why: Shed) -> Shed {
        self.counters.shed.inc();
        self.last_shed_ms.store(self.millis_since_born(), Ordering::Release);
        why
    }

    fn millis_since_born(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
    }
}

/// The rate at which charges are admitted, over the last whole window of
/// [`DRAIN_WINDOW`]: about the rate at which room is given back while
/// requests wait for it, which is when it is asked.
#[derive(Debug)]
struct DrainRate {
    admitted_bytes: AtomicU64,
    window: std::sync::Mutex<DrainWindow>,
}

#[derive(Debug)]
struct DrainWindow {
    started: Instant,
    admitted_at_start: u64,
    bytes_per_second: f64,
}

impl DrainRate {
    fn new() -> DrainRate {
        let window = DrainWindow { started: Instant::now(), admitted_at_start: 0, bytes_per_second: 0.0 };
        DrainRate { admitted_bytes: AtomicU64::new(0), window: std::sync::Mutex::new(window) }
    }

    fn admitted(&self, charge: usize) {
        self.admitted_bytes.fetch_add(charge as u64, Ordering::Relaxed);
    }

    /// The rate of the last whole window; a window that has ended is closed
    /// here. After a quiet spell, the first window of a burst measures the
    /// quiet too, and the rate is low until it has passed.
    fn bytes_per_second(&self) -> f64 {
        let admitted = self.admitted_bytes.load(Ordering::Relaxed);
        let mut window = self.window.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let elapsed = window.started.elapsed();
        if elapsed >= DRAIN_WINDOW {
            let bytes = admitted.saturating_sub(window.admitted_at_start);
            *window = DrainWindow {
                started: Instant::now(),
                admitted_at_start: admitted,
                bytes_per_second: bytes as f64 / elapsed.as_secs_f64(),
            };
        }
        window.bytes_per_second
    }
}

/// A request's charge counted in the backlog until dropped; once it has
/// passed the backlog's check, the request is counted among the waiting too.
struct Waiting<'a> {
    intake: &'a Intake,
    charge: usize,
    queued: bool,
}

impl Waiting<'_> {
    fn queue(&mut self) {
        self.intake.counters.waited.inc();
        self.intake.waiting_requests.fetch_add(1, Ordering::AcqRel);
        self.queued = true;
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.intake.waiting_bytes.fetch_sub(self.charge, Ordering::AcqRel);
        if self.queued {
            self.intake.waiting_requests.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

fn permits(bytes: usize) -> u32 {
    u32::try_from(bytes).expect("the budget fits a semaphore")
}

fn try_acquire(semaphore: &Arc<Semaphore>, bytes: usize) -> Option<OwnedSemaphorePermit> {
    semaphore.clone().try_acquire_many_owned(permits(bytes)).ok()
}

async fn acquire(semaphore: &Arc<Semaphore>, bytes: usize) -> OwnedSemaphorePermit {
    semaphore.clone().acquire_many_owned(permits(bytes)).await.expect("the intake's semaphores are never closed")
}

impl Held {
    /// The bytes this request holds.
    pub fn bytes(&self) -> usize {
        self.permit.as_ref().map_or(0, OwnedSemaphorePermit::num_permits)
    }

    /// Adds what `other` holds to this request's hold.
    pub fn absorb(&mut self, other: Held) {
        self.merge(other);
    }

    fn large_bytes(&self) -> usize {
        self.large.as_ref().map_or(0, OwnedSemaphorePermit::num_permits)
    }

    fn merge(&mut self, other: Held) {
        for (mine, theirs) in [(&mut self.permit, other.permit), (&mut self.large, other.large)] {
            match (mine.as_mut(), theirs) {
                (Some(holding), Some(more)) => holding.merge(more),
                (None, more) => *mine = more,
                (Some(_), None) => {}
            }
        }
    }

    /// Gives back all but `bytes` (at least one).
    fn shrink_to(&mut self, bytes: usize) {
        assert!(bytes >= 1);
        for permit in [&mut self.permit, &mut self.large].into_iter().flatten() {
            let extra = permit.num_permits().saturating_sub(bytes);
            if extra > 0 {
                drop(permit.split(extra));
            }
        }
    }
}

/// An answer's bytes with the room they hold, given back once the
/// connection has taken the last of them (or dropped them unsent). Handed
/// out in slices, so that hyper asks for the next only when it has room to
/// write it: the charge is held about as long as the bytes are.
#[derive(Debug)]
pub struct HeldBody {
    rest: Bytes,
    held: Held,
}

/// The most an answer hands hyper at once.
const ANSWER_SLICE_BYTES: usize = 64 << 10;

impl HeldBody {
    pub fn new(answer: Bytes, held: Held) -> HeldBody {
        HeldBody { rest: answer, held }
    }
}

impl Body for HeldBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.rest.is_empty() {
            self.held = Held::default();
            return Poll::Ready(None);
        }
        let take = self.rest.len().min(ANSWER_SLICE_BYTES);
        Poll::Ready(Some(Ok(Frame::data(self.rest.split_to(take)))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.rest.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt as _;

    use super::*;

    fn intake(limit_bytes: usize) -> Intake {
        Intake::new(IntakeConfig { limit_bytes, queue_timeout: Duration::from_secs(5) }, IntakeCounters::default())
    }

    /// The client of a request that has not hung up.
    fn still_there() -> bool {
        false
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_request_whose_client_hung_up_is_not_let_in_and_its_turn_passes_to_the_next() {
        let intake = intake(1 << 20);
        // 900,000 bytes held leave no room for a charge of 180,000.
        let mut first = Held::default();
        intake.admit(&mut first, 300_000, still_there).await.unwrap();
        let gone = std::sync::atomic::AtomicBool::new(false);
        let (mut abandoned, mut next) = (Held::default(), Held::default());
        {
            let mut abandoning = std::pin::pin!(intake.admit(&mut abandoned, 60_000, || gone.load(Ordering::Relaxed)));
            assert!(futures::poll!(abandoning.as_mut()).is_pending());
            let mut waiting = std::pin::pin!(intake.admit(&mut next, 60_000, still_there));
            assert!(futures::poll!(waiting.as_mut()).is_pending());
            assert_eq!(intake.state().waiting_requests, 2);
            gone.store(true, Ordering::Relaxed);
            drop(first);
            assert_eq!(abandoning.await, Err(Shed::Abandoned));
            waiting.await.unwrap();
        }
        assert_eq!(abandoned.bytes(), 0, "an abandoned request holds nothing");
        assert_eq!((next.bytes(), intake.held_bytes(), intake.state().waiting_requests), (180_000, 180_000, 0));
        assert_eq!(intake.counters.abandoned.get(), 1);
        assert_eq!(intake.counters.shed.get(), 0, "a request nobody waits for is not a refusal");
    }

    #[tokio::test]
    async fn a_request_takes_its_whole_charge_at_admission_and_gives_it_back_when_dropped() {
        let intake = intake(1 << 20);
        let mut held = Held::default();
        intake.admit(&mut held, 100_000, still_there).await.unwrap();
        assert_eq!((held.bytes(), intake.held_bytes()), (300_000, 300_000));
        drop(held);
        assert_eq!(intake.held_bytes(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_waits_holding_nothing_and_is_admitted_once_room_is_given_back() {
        let intake = intake(1 << 20);
        let mut first = Held::default();
        intake.admit(&mut first, 200_000, still_there).await.unwrap();
        let mut second = Held::default();
        {
            let mut admit = std::pin::pin!(intake.admit(&mut second, 200_000, still_there));
            assert!(futures::poll!(admit.as_mut()).is_pending(), "600,000 + 600,000 bytes exceed the budget");
            assert_eq!(intake.state().waiting_requests, 1);
            assert!(intake.state().saturated);
            assert_eq!(intake.held_bytes(), 600_000, "the waiting request holds nothing");
            drop(first);
            admit.await.unwrap();
        }
        assert_eq!((second.bytes(), intake.state().waiting_requests), (600_000, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_that_finds_no_room_within_the_queue_limit_is_shed_holding_nothing() {
        let intake = intake(1 << 20);
        let mut first = Held::default();
        intake.admit(&mut first, 300_000, still_there).await.unwrap();
        let started = Instant::now();
        let mut second = Held::default();
        let shed = intake.admit(&mut second, 300_000, still_there).await.unwrap_err();
        assert_eq!(shed, Shed::Timeout(Duration::from_secs(5)));
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        assert_eq!((second.bytes(), intake.held_bytes()), (0, 900_000));
        assert_eq!(intake.counters.shed.get(), 1);
    }

    #[tokio::test]
    async fn past_a_budget_of_waiting_requests_a_request_is_shed_at_once() {
        let intake = Arc::new(intake(1 << 20));
        let mut first = Held::default();
        intake.admit(&mut first, 300_000, still_there).await.unwrap();
        let waiter = {
            let intake = intake.clone();
            tokio::spawn(async move {
                let mut held = Held::default();
                intake.admit(&mut held, 300_000, still_there).await.map(|()| held.bytes())
            })
        };
        while intake.state().waiting_requests == 0 {
            tokio::task::yield_now().await;
        }
        let mut third = Held::default();
        assert_eq!(
            intake.admit(&mut third, 200_000, still_there).await,
            Err(Shed::Backlog),
            "900,000 + 600,000 wait past the budget"
        );
        drop(first);
        assert_eq!(waiter.await.unwrap(), Ok(900_000));
    }

    #[tokio::test(start_paused = true)]
    async fn the_backlog_lets_wait_what_the_recent_rate_admits_within_the_queue_limit() {
        let intake = Arc::new(intake(1 << 20));
        // One window admitting 3,000,000 bytes a second, about three budgets:
        // in 80 % of the 5 s limit, 12,000,000 bytes may wait.
        for _ in 0..10 {
            let mut held = Held::default();
            intake.admit(&mut held, 100_000, still_there).await.unwrap();
        }
        tokio::time::advance(DRAIN_WINDOW).await;
        assert_eq!(intake.drain.bytes_per_second(), 3_000_000.0);
        let mut first = Held::default();
        intake.admit(&mut first, 300_000, still_there).await.unwrap();
        let mut waiters = Vec::new();
        for _ in 0..13 {
            let intake = intake.clone();
            waiters.push(tokio::spawn(async move {
                let mut held = Held::default();
                intake.admit(&mut held, 300_000, still_there).await.map(|()| held.bytes())
            }));
        }
        while intake.state().waiting_requests < 13 {
            tokio::task::yield_now().await;
        }
        assert_eq!(intake.counters.shed.get(), 0, "11,700,000 bytes wait, thirteen budgets' worth");
        let mut past = Held::default();
        assert_eq!(intake.admit(&mut past, 300_000, still_there).await, Err(Shed::Backlog), "12,600,000 bytes would wait");
        drop(first);
        for waiter in waiters {
            assert_eq!(waiter.await.unwrap(), Ok(900_000));
        }
    }

    #[tokio::test]
    async fn large_requests_leave_the_reserve_to_small_ones() {
        let intake = intake(800_000);
        let mut large = Held::default();
        intake.admit(&mut large, 200_000, still_there).await.unwrap();
        assert_eq!(large.bytes(), 600_000);
        let mut another_large = Held::default();
        assert!(intake.try_take(200_000).is_none(), "the large share is 700,000 bytes");
        let mut small = Held::default();
        intake.admit(&mut small, 30_000, still_there).await.unwrap();
        assert_eq!(intake.held_bytes(), 690_000, "a small request uses the reserve");
        drop(large);
        intake.admit(&mut another_large, 200_000, still_there).await.unwrap();
    }

    #[tokio::test]
    async fn a_body_without_a_length_grows_into_free_room_and_is_refused_when_there_is_none() {
        let intake = intake(1 << 20);
        let mut other = Held::default();
        intake.admit(&mut other, 250_000, still_there).await.unwrap();
        let mut held = Held::default();
        intake.admit(&mut held, UNDECLARED_FIRST_SLICE_BYTES, still_there).await.unwrap();
        assert_eq!(intake.held_bytes(), 750_000 + SMALL_CHARGE_BYTES);
        assert_eq!(intake.grow(&mut held, 70_000), Err(Shed::NoRoomToGrow), "210,000 bytes pass the large share left");
        assert_eq!(intake.held_bytes(), 750_000 + SMALL_CHARGE_BYTES, "a refused growth takes nothing");
        drop(other);
        intake.grow(&mut held, 70_000).unwrap();
        assert_eq!((held.bytes(), intake.held_bytes()), (210_000, 210_000));
    }

    #[tokio::test]
    async fn a_charge_above_the_large_share_is_cut_to_it() {
        let intake = intake(800_000);
        let mut held = Held::default();
        intake.admit(&mut held, 10_000_000, still_there).await.unwrap();
        assert_eq!(intake.held_bytes(), 700_000);
    }

    #[tokio::test]
    async fn a_read_reserves_what_is_free_and_never_waits() {
        let intake = intake(800_000);
        let reserved = intake.reserve_answer(10_000_000);
        assert_eq!(reserved.bytes(), 700_000, "a read is large: it leaves the reserve");
        let small = intake.reserve_answer(10_000_000);
        assert_eq!(small.bytes(), 100_000, "what is left is the reserve, for a small answer");
        assert_eq!(intake.reserve_answer(1000).bytes(), 0, "nothing is free");
        let answer = intake.hold_answer(reserved, 5000);
        assert_eq!(intake.held_bytes(), 105_000, "the answer gives back what it did not use");
        drop((answer, small));
        assert_eq!(intake.held_bytes(), 0);
    }

    #[tokio::test]
    async fn an_answer_holds_its_own_size_until_its_last_byte_is_taken() {
        let intake = intake(1 << 20);
        let mut held = Held::default();
        intake.admit(&mut held, 1000, still_there).await.unwrap();
        let held = intake.hold_answer(held, 200_000);
        assert_eq!(intake.held_bytes(), 200_000);
        let mut body = HeldBody::new(Bytes::from(vec![b'x'; 200_000]), held);
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first.len(), ANSWER_SLICE_BYTES);
        assert_eq!(intake.held_bytes(), 200_000, "held while bytes remain");
        let mut rest = first.len();
        while let Some(frame) = body.frame().await {
            rest += frame.unwrap().into_data().unwrap().len();
        }
        assert_eq!((rest, intake.held_bytes()), (200_000, 0));
        let small = intake.hold_answer(Held::default(), 10);
        drop(HeldBody::new(Bytes::from_static(b"0123456789"), small));
        assert_eq!(intake.held_bytes(), 0, "an answer dropped unsent gives its room back");
    }

    #[tokio::test]
    async fn an_answer_takes_the_room_there_is_and_never_waits() {
        let intake = intake(1000);
        let mut body = Held::default();
        intake.admit(&mut body, 100, still_there).await.unwrap();
        let answer = intake.hold_answer(Held::default(), 800);
        assert_eq!((answer.bytes(), intake.held_bytes()), (700, 1000), "the answer took what was left");
        let none = intake.hold_answer(Held::default(), 500);
        assert_eq!(none.bytes(), 0, "with no room left, an answer is sent without waiting");
    }
}
