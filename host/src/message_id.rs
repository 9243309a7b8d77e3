//! Message ids: UUIDv7, minted a request's worth at a time.
//!
//! The items of one request take their ids from one reading of the clock
//! and one turn of the process's context (RFC 9562's counter, as `uuid`
//! keeps it for `Uuid::now_v7`): ids stay unique and increase across the
//! process, and a request of 100 items reads the clock and takes the lock
//! once, not a hundred times.

use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use uuid::timestamp::context::ContextV7;
use uuid::{Timestamp, Uuid};

/// The process's context: the last timestamp and the counter under it.
static CONTEXT: Mutex<ContextV7> = Mutex::new(ContextV7::new());

/// `count` new message ids, each greater than every id minted before it in
/// this process.
pub fn mint(count: usize) -> Vec<Uuid> {
    let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let (seconds, nanos) = (since_epoch.as_secs(), since_epoch.subsec_nanos());
    let context = CONTEXT.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    (0..count).map(|_| Uuid::new_v7(Timestamp::from_unix(&*context, seconds, nanos))).collect()
}

/// One new message id (see [`mint`]).
pub fn one() -> Uuid {
    mint(1)[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_version_7_and_increase_within_and_across_requests() {
        let before = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
        let mut ids: Vec<Uuid> = (0..50).flat_map(|n| mint(n % 7)).collect();
        ids.push(one());
        let after = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
        assert!(ids.len() > 100);
        for pair in ids.windows(2) {
            assert!(pair[0] < pair[1], "every id is greater than the one before: {} then {}", pair[0], pair[1]);
        }
        for id in &ids {
            assert_eq!(id.get_version_num(), 7);
            let (seconds, nanos) = id.get_timestamp().expect("a v7 id has a timestamp").to_unix();
            let ms = seconds * 1000 + u64::from(nanos) / 1_000_000;
            assert!((before..=after + 1).contains(&ms), "{ms} within {before}..={after}");
        }
    }

    #[test]
    fn ids_minted_on_many_threads_are_distinct() {
        let ids: Vec<Uuid> = std::thread::scope(|scope| {
            let minting: Vec<_> = (0..4).map(|_| scope.spawn(|| (0..200).flat_map(|_| mint(5)).collect::<Vec<_>>())).collect();
            minting.into_iter().flat_map(|t| t.join().unwrap()).collect()
        });
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), ids.len());
    }
}
