//! The worker's call threads: each call runs on its own thread (a shell command may run for
//! minutes while other calls proceed), and finished threads wait for the next call instead of
//! exiting, so a call does not pay for creating a thread.

use crate::sync::LockExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};

type Job = Box<dyn FnOnce() + Send>;

/// Threads that run jobs; grows to the largest number of calls in flight at once.
pub struct CallThreads {
    jobs: Sender<Job>,
    queue: Arc<Mutex<Receiver<Job>>>,
    idle: Arc<AtomicUsize>,
}

impl Default for CallThreads {
    fn default() -> Self {
        let (jobs, queue) = channel();
        Self {
            jobs,
            queue: Arc::new(Mutex::new(queue)),
            idle: Arc::default(),
        }
    }
}

impl CallThreads {
    /// Runs `job` on an idle thread, or on a new one if none is idle.
    pub fn run(&self, job: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
        // Claim an idle thread; if there is none, start one for this job.
        let claimed = self
            .idle
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if claimed {
            // The claimed thread is (or is about to be) waiting on the queue; it never exits.
            let _ = self.jobs.send(Box::new(job));
            return Ok(());
        }
        let queue = self.queue.clone();
        let idle = self.idle.clone();
        std::thread::Builder::new()
            .name("call".into())
            .spawn(move || {
                job();
                loop {
                    idle.fetch_add(1, Ordering::SeqCst);
                    let next = queue.locked().recv();
                    match next {
                        Ok(job) => job(),
                        // The worker is shutting down.
                        Err(_) => return,
                    }
                }
            })
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn threads_are_reused_and_calls_run_concurrently() {
        let pool = CallThreads::default();
        let (tx, rx) = channel();
        for i in 0..3 {
            let tx = tx.clone();
            pool.run(move || {
                std::thread::sleep(Duration::from_millis(50));
                tx.send((i, std::thread::current().id())).unwrap();
            })
            .unwrap();
        }
        let first: Vec<_> = (0..3).map(|_| rx.recv().unwrap()).collect();
        // Three at once need three threads.
        let ids: std::collections::HashSet<_> = first.iter().map(|(_, t)| *t).collect();
        assert_eq!(ids.len(), 3);
        std::thread::sleep(Duration::from_millis(20));
        let tx2 = tx.clone();
        pool.run(move || tx2.send((9, std::thread::current().id())).unwrap())
            .unwrap();
        let (_, reused) = rx.recv().unwrap();
        assert!(ids.contains(&reused), "an idle thread was reused");
    }
}
