//! The bound on what requests in progress hold.
//!
//! Producers can offer more than PostgreSQL takes; without a bound, every
//! request the gateway accepts is read, parsed and queued, and memory grows
//! with the backlog. [`Intake`] holds a budget of bytes. A request takes its
//! charge before its body is read and keeps it until its answer is built;
//! while the budget is spent, new requests wait with their bodies unread, so
//! the backlog stays in the producers' sockets and TCP pushes back on them.
//! Waiters are served in arrival order.
//!
//! A request is charged [`CHARGE_PER_BODY_BYTE`] bytes per body byte: the
//! body, the items parsed from it (owned strings and payloads, about the body
//! again) and the answer built for them. A body of unknown length is charged
//! the body limit up front, and the excess is given back once it is read, so
//! that no two requests can each hold part of the budget while both wait for
//! more. A charge above the whole budget is cut to the budget: that request
//! then runs alone.

use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Bytes a request is charged per byte of its body.
pub const CHARGE_PER_BODY_BYTE: usize = 3;

/// The budget of bytes held by requests in progress.
#[derive(Debug)]
pub struct Intake {
    room: Arc<Semaphore>,
    limit_bytes: usize,
    /// Requests that found no room and waited for it.
    waited: Counter,
}

/// What one request holds of the budget; given back when dropped.
#[derive(Debug)]
pub struct Held {
    permit: OwnedSemaphorePermit,
}

impl Intake {
    /// A budget of `limit_bytes` (at least one byte), counting the requests
    /// that wait for room in `waited`.
    pub fn new(limit_bytes: usize, waited: Counter) -> Intake {
        let limit_bytes = limit_bytes.clamp(1, Semaphore::MAX_PERMITS);
        Intake { room: Arc::new(Semaphore::new(limit_bytes)), limit_bytes, waited }
    }

    /// Waits for room for a body of `body_bytes`, then holds it.
    pub async fn admit(&self, body_bytes: usize) -> Held {
        let charge = self.charge(body_bytes);
        let permit = match self.room.clone().try_acquire_many_owned(charge) {
            Ok(permit) => permit,
            Err(_) => {
                self.waited.inc();
                self.room.clone().acquire_many_owned(charge).await.expect("the intake's semaphore is never closed")
            }
        };
        Held { permit }
    }

    /// The bytes held now.
    pub fn held_bytes(&self) -> usize {
        self.limit_bytes - self.room.available_permits()
    }

    pub fn limit_bytes(&self) -> usize {
        self.limit_bytes
    }

    fn charge(&self, body_bytes: usize) -> u32 {
        let charge = body_bytes.saturating_mul(CHARGE_PER_BODY_BYTE).clamp(1, self.limit_bytes);
        u32::try_from(charge).unwrap_or(u32::MAX)
    }
}

impl Held {
    /// Gives back what a body read at `body_bytes` does not need of the charge
    /// it was admitted with (a body of unknown length is charged the limit).
    pub fn shrink_to(&mut self, intake: &Intake, body_bytes: usize) {
        let keep = intake.charge(body_bytes) as usize;
        if self.permit.num_permits() > keep {
            drop(self.permit.split(self.permit.num_permits() - keep));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_request_waits_while_the_budget_is_spent_and_runs_once_room_is_given_back() {
        let waited = Counter::default();
        let intake = Intake::new(3 * 100, waited.clone());
        let first = intake.admit(60).await;
        assert_eq!(intake.held_bytes(), 180);
        let mut second = std::pin::pin!(intake.admit(60));
        assert!(futures::poll!(second.as_mut()).is_pending(), "180 + 180 bytes exceed the budget of 300");
        assert_eq!(waited.get(), 1);
        drop(first);
        let second = second.await;
        assert_eq!(intake.held_bytes(), 180);
        drop(second);
        assert_eq!(intake.held_bytes(), 0);
    }

    #[tokio::test]
    async fn a_charge_above_the_budget_is_cut_to_it() {
        let intake = Intake::new(1000, Counter::default());
        let held = intake.admit(10_000).await;
        assert_eq!(intake.held_bytes(), 1000);
        drop(held);
        assert_eq!(intake.held_bytes(), 0);
    }

    #[tokio::test]
    async fn a_body_of_unknown_length_gives_back_what_it_did_not_need() {
        let intake = Intake::new(1 << 20, Counter::default());
        let mut held = intake.admit(usize::MAX).await;
        assert_eq!(intake.held_bytes(), 1 << 20);
        held.shrink_to(&intake, 100);
        assert_eq!(intake.held_bytes(), 300);
    }
}
