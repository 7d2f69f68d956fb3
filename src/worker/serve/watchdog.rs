//! The watchdog: a call run on the reader thread holds up every frame behind it (the other
//! calls, and the cancels and credits of running ones), so when one runs past `INLINE_BUDGET`
//! the watchdog starts another thread to take over reading. It sleeps while no call runs there.

use super::Serving;
use super::calls::read_loop;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How long a call may run on the reader thread before another thread takes over reading: a
/// file call on a slow or hung file system stalls the worker's other calls (and the cancels and
/// credits of running ones) for about this long, not for as long as it takes.
const INLINE_BUDGET: Duration = Duration::from_millis(5);
/// How often the watchdog looks at the call running on the reader thread.
const WATCH_TICK: Duration = Duration::from_millis(2);
/// Ticks without a call on the reader thread after which the watchdog sleeps until the next one
/// (an idle worker does not wake every tick).
const WATCH_IDLE_TICKS: u32 = 50;

pub(super) fn start_watchdog(serving: &Arc<Serving>) {
    let watched = serving.clone();
    match std::thread::Builder::new()
        .name("watchdog".into())
        .spawn(move || watch(&watched))
    {
        Ok(handle) => {
            let _ = serving.watchdog.set(handle.thread().clone());
        }
        // Without a watchdog nothing could take over from a stuck reader: no call runs inline.
        Err(e) => eprintln!("corral worker: no watchdog thread ({e}); every call gets a thread"),
    }
}

/// Hands the reader role to another thread when a call has run on the reader thread for longer
/// than [`INLINE_BUDGET`].
fn watch(serving: &Arc<Serving>) {
    let mut rescued = 0u64;
    let mut seen_calls = 0u64;
    let mut idle = 0u32;
    loop {
        std::thread::sleep(WATCH_TICK);
        let since = serving.inline_since.load(Ordering::SeqCst);
        let calls = serving.inline_calls.load(Ordering::Relaxed);
        if since == 0 && calls == seen_calls {
            idle += 1;
            if idle >= WATCH_IDLE_TICKS {
                // Parked until the reader runs a call: it unparks us when it sees the flag, or
                // we see its call here (both use SeqCst, so one of the two happens).
                serving.watchdog_parked.store(true, Ordering::SeqCst);
                if serving.inline_since.load(Ordering::SeqCst) == 0 {
                    std::thread::park();
                }
                serving.watchdog_parked.store(false, Ordering::SeqCst);
                idle = 0;
            }
            continue;
        }
        idle = 0;
        seen_calls = calls;
        let now = serving.epoch.elapsed().as_nanos() as u64;
        if since != 0
            && since != rescued
            && now.saturating_sub(since) >= INLINE_BUDGET.as_nanos() as u64
        {
            rescued = since;
            let reader = serving.clone();
            if let Err(e) = serving.threads.run(move || read_loop(&reader)) {
                eprintln!("corral worker: cannot start a thread to take over reading: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{WorkerReply, frame};
    use crate::worker::serve::tests::{lines_of, read_request, state};
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    use std::time::Instant;

    #[test]
    fn a_call_stuck_on_the_reader_thread_is_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "one\ntwo\n").unwrap();
        let (mut ours, theirs) = UnixStream::pair().unwrap();
        let writer = theirs.try_clone().unwrap();
        let serving = Serving::new(theirs, writer, state(dir.path()));
        start_watchdog(&serving);
        // As if the reader thread had left the reader role for a call that never ends: nobody
        // reads, and a call has been running since the start.
        serving.inline_since.store(1, Ordering::SeqCst);
        serving.inline_calls.fetch_add(1, Ordering::SeqCst);
        if serving.watchdog_parked.load(Ordering::SeqCst) {
            serving.watchdog.get().unwrap().unpark();
        }
        ours.write_all(&read_request(1, "a.txt")).unwrap();
        ours.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let started = Instant::now();
        let reply: WorkerReply = frame::read_blocking(&mut ours)
            .expect("another thread took over reading and answered")
            .unwrap();
        assert_eq!((reply.id, lines_of(&reply)), (1, 2));
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }
}
