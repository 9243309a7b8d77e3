//! The bound on what requests in progress hold.
//!
//! Producers can offer more than PostgreSQL takes; without a bound, every
//! request the gateway accepts is read, parsed and queued, and memory grows
//! with the backlog. [`Intake`] holds a budget of bytes. A request is charged
//! for what it has actually read, as it reads it: [`CHARGE_PER_BODY_BYTE`]
//! bytes per body byte (the body, the items parsed from it, and the answer
//! built for them). While the budget is spent, a request waits for room
//! before it reads more, so the backlog stays in the producers' sockets and
//! TCP pushes back on them. Waiters are served in arrival order.
//!
//! A request that has read nothing holds nothing: a client that declares a
//! body and sends none (or sends it slowly) holds only what it sent, for at
//! most the body's time limit (`crate::conn`). Two requests that each hold
//! part of the budget and both wait for more are parted by that limit too:
//! the one that waits for its client past it is refused. A charge above the
//! whole budget is cut to the budget: that request then runs alone.
//!
//! An answer is held too, from the moment it is built until the connection
//! has taken its last byte ([`HeldBody`]): a read answered with megabytes to
//! a client that does not read them counts against the same bound, and new
//! bodies wait for it. An answer itself never waits: it takes the room there
//! is.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Bytes a request is charged per byte of its body.
pub const CHARGE_PER_BODY_BYTE: usize = 3;

/// The budget of bytes held by requests in progress.
#[derive(Debug)]
pub struct Intake {
    room: Arc<Semaphore>,
    limit_bytes: usize,
    /// Times a request found no room and waited for it.
    waited: Counter,
}

/// What one request holds of the budget; given back when dropped.
#[derive(Debug, Default)]
pub struct Held {
    permit: Option<OwnedSemaphorePermit>,
}

impl Intake {
    /// A budget of `limit_bytes` (at least one byte), counting the times a
    /// request waits for room in `waited`.
    pub fn new(limit_bytes: usize, waited: Counter) -> Intake {
        let limit_bytes = limit_bytes.clamp(1, Semaphore::MAX_PERMITS);
        Intake { room: Arc::new(Semaphore::new(limit_bytes)), limit_bytes, waited }
    }

    /// Waits for room for `body_bytes` more bytes of a body that `held`'s
    /// request has read, then adds their charge to `held`.
    pub async fn take_body(&self, held: &mut Held, body_bytes: usize) {
        self.grow(held, body_bytes.saturating_mul(CHARGE_PER_BODY_BYTE)).await;
    }

    /// Holds `answer_bytes` for an answer built with `held` (what its
    /// request held for its body): gives back what the answer does not
    /// need, or takes more of the room there is now. It never waits: the
    /// answer's bytes exist already, and waiting would only keep them longer
    /// (and hold up `/metrics` and `/health` behind a full budget). What it
    /// takes makes new bodies wait until it is sent.
    pub fn hold_answer(&self, mut held: Held, answer_bytes: usize) -> Held {
        let want = answer_bytes.clamp(1, self.limit_bytes);
        if held.bytes() > want {
            let permit = held.permit.as_mut().expect("holds more than one byte");
            drop(permit.split(permit.num_permits() - want));
            return held;
        }
        loop {
            let more = (want - held.bytes()).min(self.room.available_permits());
            if more == 0 {
                return held;
            }
            let charge = u32::try_from(more).expect("the budget fits a semaphore");
            if let Ok(permit) = self.room.clone().try_acquire_many_owned(charge) {
                held.merge(permit);
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

    /// Adds `bytes` to `held`, cut so that one request never holds more than
    /// the whole budget.
    async fn grow(&self, held: &mut Held, bytes: usize) {
        let bytes = bytes.min(self.limit_bytes - held.bytes());
        if bytes == 0 {
            return;
        }
        let charge = u32::try_from(bytes).expect("the budget fits a semaphore");
        let permit = match self.room.clone().try_acquire_many_owned(charge) {
            Ok(permit) => permit,
            Err(_) => {
                self.waited.inc();
                self.room.clone().acquire_many_owned(charge).await.expect("the intake's semaphore is never closed")
            }
        };
        held.merge(permit);
    }
}

impl Held {
    /// The bytes this request holds.
    pub fn bytes(&self) -> usize {
        self.permit.as_ref().map_or(0, OwnedSemaphorePermit::num_permits)
    }

    fn merge(&mut self, permit: OwnedSemaphorePermit) {
        match &mut self.permit {
            Some(holding) => holding.merge(permit),
            None => self.permit = Some(permit),
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

    #[tokio::test]
    async fn a_request_waits_while_the_budget_is_spent_and_runs_once_room_is_given_back() {
        let waited = Counter::default();
        let intake = Intake::new(3 * 100, waited.clone());
        let mut first = Held::default();
        intake.take_body(&mut first, 60).await;
        assert_eq!(intake.held_bytes(), 180);
        let mut second = Held::default();
        {
            let mut admit = std::pin::pin!(intake.take_body(&mut second, 60));
            assert!(futures::poll!(admit.as_mut()).is_pending(), "180 + 180 bytes exceed the budget of 300");
            assert_eq!(waited.get(), 1);
            drop(first);
            admit.await;
        }
        assert_eq!((second.bytes(), intake.held_bytes()), (180, 180));
        drop(second);
        assert_eq!(intake.held_bytes(), 0);
    }

    #[tokio::test]
    async fn a_request_holds_what_it_has_read_and_nothing_before() {
        let intake = Intake::new(1 << 20, Counter::default());
        let mut held = Held::default();
        assert_eq!(intake.held_bytes(), 0, "a declared body that has not arrived holds nothing");
        for _ in 0..4 {
            intake.take_body(&mut held, 100).await;
        }
        assert_eq!((held.bytes(), intake.held_bytes()), (1200, 1200));
    }

    #[tokio::test]
    async fn a_charge_above_the_budget_is_cut_to_it() {
        let intake = Intake::new(1000, Counter::default());
        let mut held = Held::default();
        intake.take_body(&mut held, 200).await;
        intake.take_body(&mut held, 10_000).await;
        assert_eq!(intake.held_bytes(), 1000);
        drop(held);
        assert_eq!(intake.held_bytes(), 0);
    }

    #[tokio::test]
    async fn an_answer_holds_its_own_size_until_its_last_byte_is_taken() {
        let intake = Intake::new(1 << 20, Counter::default());
        let mut held = Held::default();
        intake.take_body(&mut held, 1000).await;
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
        let intake = Intake::new(1000, Counter::default());
        let mut body = Held::default();
        intake.take_body(&mut body, 300).await;
        let answer = intake.hold_answer(Held::default(), 500);
        assert_eq!((answer.bytes(), intake.held_bytes()), (100, 1000), "the answer took what was left");
        let none = intake.hold_answer(Held::default(), 500);
        assert_eq!(none.bytes(), 0, "with no room left, an answer is sent without waiting");
    }
}
