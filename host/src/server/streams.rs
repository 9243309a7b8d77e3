//! The tasks HTTP/2 runs its streams on, kept so that shutdown can end them.
//!
//! hyper serves each HTTP/2 stream on a task of its own, spawned through the
//! connection's executor, outside the connection's task. Aborting a
//! connection's task therefore leaves its streams' handlers running, holding
//! the shard handles that the shard workers wait to see dropped before they
//! stop. [`StreamTasks`] spawns every stream on a tracked task that ends
//! when shutdown cancels it, so that aborting the connections ends their
//! streams too.

use std::future::Future;
use std::time::Instant;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The executor of every HTTP/2 connection's streams.
#[derive(Clone, Debug, Default)]
pub struct StreamTasks {
    tracker: TaskTracker,
    cancel: CancellationToken,
}

impl<F> hyper::rt::Executor<F> for StreamTasks
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, stream: F) {
        let cancel = self.cancel.clone();
        self.tracker.spawn(async move {
            tokio::select! {
                _ = stream => {}
                () = cancel.cancelled() => {}
            }
        });
    }
}

impl StreamTasks {
    /// Ends every stream still served, and waits until their tasks are gone
    /// or `give_up_at` has come. Returns how many were left then.
    pub async fn cancel(&self, give_up_at: Instant) -> usize {
        self.cancel.cancel();
        self.tracker.close();
        let _ = tokio::time::timeout_at(give_up_at.into(), self.tracker.wait()).await;
        self.tracker.len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use hyper::rt::Executor as _;

    use super::*;

    #[tokio::test]
    async fn cancelling_drops_every_stream_still_running() {
        let tasks = StreamTasks::default();
        let held = Arc::new(());
        for _ in 0..3 {
            let held = held.clone();
            tasks.execute(async move {
                let _held = held;
                std::future::pending::<()>().await;
            });
        }
        tasks.execute(async {});
        let left = tasks.cancel(Instant::now() + Duration::from_secs(5)).await;
        assert_eq!((left, Arc::strong_count(&held)), (0, 1), "every stream's future was dropped");
    }
}
