//! /proc figures for a daemon and the processes below it (workers, their commands), shared by
//! the load and growth benches.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// /proc figures for the daemon and everything below it.
#[derive(Clone, Copy, Default, Debug)]
pub struct Sample {
    pub daemon_rss: u64,
    pub workers_rss: u64,
    pub workers: usize,
    /// Descendant processes (workers, their commands, helpers).
    pub processes: usize,
    pub threads: u64,
    pub daemon_fds: usize,
    pub workers_fds: usize,
    /// utime + stime + cutime + cstime of the daemon and its descendants, in clock ticks.
    pub cpu_ticks: u64,
    /// The daemon's own share of `cpu_ticks` (utime + stime).
    pub daemon_ticks: u64,
}

pub fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: fields start after the last ')'.
    let rest = &s[s.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_string).collect())
}

pub fn rss_bytes(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024
}

pub fn fd_count(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

pub fn sample(daemon: i32) -> Sample {
    // Parent of every process, to find the daemon's descendants.
    let mut parent: Vec<(i32, i32, Vec<String>)> = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        if let Some(f) = stat_fields(pid) {
            let ppid = f.get(1).and_then(|p| p.parse().ok()).unwrap_or(0);
            parent.push((pid, ppid, f));
        }
    }
    let mut tree = vec![daemon];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        tree.extend(
            parent
                .iter()
                .filter(|(_, pp, _)| *pp == p)
                .map(|(c, _, _)| *c),
        );
        i += 1;
    }
    let num = |f: &Vec<String>, i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let mut s = Sample::default();
    for (pid, _, f) in parent.iter().filter(|(p, _, _)| tree.contains(p)) {
        // Fields after the name: state is index 0, so field k (1-based, proc(5)) is k - 3.
        s.cpu_ticks += num(f, 11) + num(f, 12) + num(f, 13) + num(f, 14);
        s.threads += num(f, 17);
        if *pid == daemon {
            s.daemon_ticks = num(f, 11) + num(f, 12);
            s.daemon_rss = rss_bytes(*pid);
            s.daemon_fds = fd_count(*pid);
        } else {
            s.processes += 1;
            let rss = rss_bytes(*pid);
            s.workers_rss += rss;
            s.workers_fds += fd_count(*pid);
            // Workers are the daemon's direct children (commands are below them).
            if parent.iter().any(|(c, pp, _)| c == pid && *pp == daemon) {
                s.workers += 1;
            }
        }
    }
    s
}

pub fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

pub fn self_cpu_ticks() -> u64 {
    stat_fields(std::process::id() as i32).map_or(0, |f| {
        f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
            + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
    })
}

pub fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

/// Proportional set size of `pid` (`Pss:` of /proc/PID/smaps_rollup): private pages plus each
/// shared page divided by the number of processes mapping it, so summing it over many workers
/// that map the same binary and libraries counts those pages once, unlike RSS.
pub fn pss_bytes(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Pss:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024
}

/// The daemon's descendants (workers and everything below them), without the daemon.
pub fn descendants(daemon: i32) -> Vec<i32> {
    let mut parent: Vec<(i32, i32)> = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        if let Some(f) = stat_fields(pid) {
            parent.push((pid, f.get(1).and_then(|p| p.parse().ok()).unwrap_or(0)));
        }
    }
    let mut tree = vec![daemon];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        tree.extend(parent.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    tree.remove(0);
    tree
}

/// Peak daemon and below-the-daemon RSS, sampled on a thread every `every` until stopped.
pub struct PeakSampler {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Sample>>,
}

impl PeakSampler {
    pub fn start(daemon: i32, every: Duration) -> PeakSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut peak = sample(daemon);
            while !flag.load(Ordering::Relaxed) {
                std::thread::sleep(every);
                let s = sample(daemon);
                peak.daemon_rss = peak.daemon_rss.max(s.daemon_rss);
                peak.workers_rss = peak.workers_rss.max(s.workers_rss);
                peak.workers = peak.workers.max(s.workers);
                peak.processes = peak.processes.max(s.processes);
                peak.daemon_fds = peak.daemon_fds.max(s.daemon_fds);
                peak.workers_fds = peak.workers_fds.max(s.workers_fds);
            }
            peak
        });
        PeakSampler {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops sampling; the peaks (one last sample included).
    pub fn finish(mut self) -> Sample {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .expect("sampler thread")
            .join()
            .expect("sampler thread panicked")
    }
}
