//! A warning when the HTTP/2 layer refuses a client's request or connection.
//!
//! h2 (under hyper and tonic) resets a stream, or closes the connection, on a protocol error
//! before tonic or corral see the request, and reports it only as a DEBUG event: the client sees
//! the reset while the daemon's log, at its default level, says nothing. h2 has no API for these
//! refusals, so this layer watches its debug events (whatever --log-level says) and the daemon
//! logs a rate-limited WARN for each refusal. Part of the binary, installed by `init_logging` in
//! main.rs.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// At most one warning per interval: a client repeating a bad request must not flood the log.
/// The refusals in between are counted in the next warning.
const INTERVAL: Duration = Duration::from_secs(10);

/// The layer: sends each refusal worth a warning to [`report`].
pub struct Watch {
    limiter: Mutex<Limiter>,
    tx: UnboundedSender<Refusal>,
}

pub struct Refusal {
    message: String,
    /// Refusals since the last warning that were not logged.
    unlogged: u64,
}

/// The layer and the receiving end for [`report`].
pub fn watch() -> (Watch, UnboundedReceiver<Refusal>) {
    let (tx, rx) = unbounded_channel();
    let limiter = Mutex::new(Limiter::default());
    (Watch { limiter, tx }, rx)
}

/// The callsites the layer looks at (its per-layer filter): h2's DEBUG events that carry only a
/// message. Its per-frame events carry a `frame` field and its I/O errors an `error` field, so
/// they are never even built for this layer.
pub fn watched(meta: &Metadata<'_>) -> bool {
    let target = meta.target();
    meta.is_event()
        && *meta.level() == Level::DEBUG
        && (target == "h2" || target.starts_with("h2::"))
        && meta.fields().iter().all(|f| f.name() == "message")
}

/// h2 words each refusal of a peer's protocol error as `stream error REASON -- …`,
/// `connection error REASON -- …` or, for a request's pseudo-headers, `malformed headers: …`.
fn is_refusal(message: &str) -> bool {
    message.starts_with("stream error ")
        || message.starts_with("connection error ")
        || message.starts_with("malformed headers")
}

impl<S: Subscriber> Layer<S> for Watch {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut message = Message(String::new());
        event.record(&mut message);
        if !is_refusal(&message.0) {
            return;
        }
        let admitted = self
            .limiter
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .admit(Instant::now());
        if let Some(unlogged) = admitted {
            // Logged by a task, not here: an event emitted while the subscriber is dispatching
            // another one would re-enter its per-layer filter state.
            let _ = self.tx.send(Refusal {
                message: message.0,
                unlogged,
            });
        }
    }
}

/// Logs the refusals the layer lets through, until the layer is gone.
pub async fn report(mut rx: UnboundedReceiver<Refusal>) {
    while let Some(r) = rx.recv().await {
        tracing::warn!(
            unlogged_since_last = r.unlogged,
            "HTTP/2 refused a client's request or connection before it reached corral (the client \
             saw a stream reset or the connection closed): {}",
            r.message
        );
    }
}

struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

#[derive(Default)]
struct Limiter {
    last: Option<Instant>,
    unlogged: u64,
}

impl Limiter {
    /// `Some(refusals not logged since the last warning)` when this one may be logged.
    fn admit(&mut self, now: Instant) -> Option<u64> {
        if let Some(last) = self.last
            && now.duration_since(last) < INTERVAL
        {
            self.unlogged += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.unlogged))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_h2s_protocol_error_reports() {
        assert!(is_refusal(
            "malformed headers: malformed authority (b\"a b\"): invalid uri character"
        ));
        assert!(is_refusal(
            "stream error PROTOCOL_ERROR -- malformed header block; stream=StreamId(1)"
        ));
        assert!(is_refusal(
            "connection error PROTOCOL_ERROR -- read_preface: invalid preface"
        ));
        // The patched h2 (vendor/h2) serves a request with an unparseable :authority: not a
        // refusal.
        assert!(!is_refusal(
            "ignoring malformed authority (b\"/run/corral.sock\"): invalid uri character; the \
             request has none"
        ));
        assert!(!is_refusal(
            "received settings ACK; applying Settings { .. }"
        ));
    }

    #[test]
    fn limiter_logs_the_first_then_one_per_interval_with_the_count_between() {
        let mut l = Limiter::default();
        let t0 = Instant::now();
        assert_eq!(l.admit(t0), Some(0));
        assert_eq!(l.admit(t0 + Duration::from_secs(1)), None);
        assert_eq!(l.admit(t0 + INTERVAL - Duration::from_millis(1)), None);
        assert_eq!(l.admit(t0 + INTERVAL), Some(2));
        assert_eq!(l.admit(t0 + INTERVAL + Duration::from_secs(1)), None);
        assert_eq!(l.admit(t0 + INTERVAL * 3), Some(1));
    }
}
