//! How fast each user may start sandboxes (spec/sandbox.md §8.7 H23): every session open,
//! escalation and refresh starts a path resolver and often a worker — process creation,
//! namespaces, mounts — and one user doing that in a loop took the CPU from everyone else
//! (red team 2026-11-27, finding 7: another user's p99 10–60× slower). So each user has a
//! budget of starts: a burst, then a steady rate. A start over budget waits its turn (cheaply:
//! an async sleep, no process), so a churning user queues behind itself, never behind others;
//! one that would wait longer than [`MAX_WAIT`] is refused with RESOURCE_EXHAUSTED and when to
//! retry.
//!
//! The budget is a generic cell rate algorithm: per user, the theoretical arrival time of the
//! next start. One short lock, no timers, nothing kept for a user idle past its burst window.

use crate::sync::LockExt;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The longest a start waits for its turn before it is refused.
pub const MAX_WAIT: Duration = Duration::from_secs(10);

/// A user's budget: `per_second` starts on average, up to `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Budget {
    pub per_second: u32,
    pub burst: u32,
}

/// The starts of every user.
#[derive(Default)]
pub struct StartRate {
    /// uid → when the user's budget is full again (its next start's theoretical arrival).
    next: Mutex<HashMap<u32, Instant>>,
}

/// A start over budget: wait this long, or (over [`MAX_WAIT`]) do not start.
#[derive(Debug, PartialEq)]
pub enum Turn {
    Now,
    After(Duration),
    Refused { retry_after: Duration },
}

impl StartRate {
    /// Takes one start from `uid`'s budget at `now`: when it may go.
    pub fn take(&self, uid: u32, budget: Budget, now: Instant) -> Turn {
        let interval = Duration::from_secs(1) / budget.per_second.max(1);
        // The burst is the backlog of starts the budget absorbs without waiting.
        let window = interval * budget.burst.max(1).saturating_sub(1);
        let mut next = self.next.locked();
        // Forget users whose budget is full again (bounded table under many users).
        if next.len() > 1024 {
            next.retain(|_, t| *t > now);
        }
        let arrival = next.get(&uid).copied().filter(|t| *t > now).unwrap_or(now);
        let wait = arrival.saturating_duration_since(now + window);
        if wait > MAX_WAIT {
            return Turn::Refused {
                retry_after: wait - MAX_WAIT,
            };
        }
        next.insert(uid, arrival + interval);
        if wait.is_zero() {
            Turn::Now
        } else {
            Turn::After(wait)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: Budget = Budget {
        per_second: 10,
        burst: 3,
    };

    #[test]
    fn a_burst_goes_at_once_then_starts_are_spaced_by_the_rate() {
        let r = StartRate::default();
        let t = Instant::now();
        for _ in 0..3 {
            assert_eq!(r.take(1, B, t), Turn::Now);
        }
        assert_eq!(r.take(1, B, t), Turn::After(Duration::from_millis(100)));
        assert_eq!(r.take(1, B, t), Turn::After(Duration::from_millis(200)));
        // Time passing refills the budget.
        assert_eq!(r.take(1, B, t + Duration::from_secs(1)), Turn::Now);
    }

    #[test]
    fn one_users_backlog_does_not_delay_another() {
        let r = StartRate::default();
        let t = Instant::now();
        for _ in 0..20 {
            r.take(1, B, t);
        }
        assert_eq!(r.take(2, B, t), Turn::Now);
    }

    #[test]
    fn a_wait_past_the_limit_is_refused_and_takes_nothing() {
        let r = StartRate::default();
        let t = Instant::now();
        // 10 per second, burst 3: the 103rd start at once would wait 10 s.
        let mut refused = None;
        for i in 0..200 {
            if let Turn::Refused { retry_after } = r.take(1, B, t) {
                refused = Some((i, retry_after));
                break;
            }
        }
        let (i, retry_after) = refused.expect("refused at some point");
        assert_eq!(i, 103);
        assert!(retry_after <= Duration::from_millis(100), "{retry_after:?}");
        // A refusal took no place in the queue: the same start is refused again, no later.
        assert!(matches!(r.take(1, B, t), Turn::Refused { .. }));
        assert_eq!(
            r.take(1, B, t + Duration::from_millis(100)),
            Turn::After(MAX_WAIT)
        );
    }
}
