//! Counts the calls in flight, so shutdown waits for calls rather than for idle connections.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::Notify;

#[derive(Clone, Default)]
pub struct InFlight {
    count: Arc<AtomicUsize>,
    idle: Arc<Notify>,
}

/// Held for the duration of one call.
pub struct CallGuard(InFlight);

impl InFlight {
    pub fn enter(&self) -> CallGuard {
        self.count.fetch_add(1, Ordering::SeqCst);
        CallGuard(self.clone())
    }

    pub fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// Resolves once no call is in flight.
    pub async fn wait_idle(&self) {
        loop {
            let notified = self.idle.notified();
            if self.count() == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}
