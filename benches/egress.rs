//! The egress proxy (NETWORK_MODE_PROXY) against the network on, same daemon, same run.
//!
//! `cargo bench --bench egress` (harness = false). An HTTP server in this process, on
//! 127.0.0.2, serves `/big` (`CORRAL_BENCH_BYTES` bytes, default 100 MB, with Content-Length)
//! and `/tiny` (3 bytes), closing each connection after its response. The release daemon's
//! `[egress.hosts]` answers `bench.test` with 127.0.0.2 and `allowed_networks` lets the proxy
//! reach loopback. Two read-only sessions: one proxied (`allow_domains = ["bench.test"]`), one
//! with `network_access: true`. curl runs inside them through the typed Shell RPC:
//!
//! - throughput: `curl -o /dev/null -w '%{speed_download}…' http://bench.test:PORT/big` in the
//!   proxied session, plain HTTP through the proxy (absolute-form) and through a CONNECT tunnel
//!   (`--proxytunnel`), against the same curl in the network-on session straight to the server
//!   (`--noproxy '*' --resolve bench.test:PORT:127.0.0.2`); `CORRAL_BENCH_RUNS` (default 10)
//!   downloads per variant, rotating order, median MB/s. Goal: proxy ÷ direct ≥ 0.8. Each
//!   download's CPU is recorded too: curl's (bash's `time`), the daemon's (its threads'
//!   `/proc/PID/task/*/schedstat`, so the proxy's share) and this process's (the server's).
//! - connection set-up: one curl per round fetches `/tiny` from fresh connections
//!   (`Connection: close`, checked with `%{num_connects}`), printing `-w` per transfer, so
//!   curl's own start is not in the times; the first transfer of each invocation is dropped.
//!   `CORRAL_BENCH_N` (default 50) transfers per variant over `CORRAL_BENCH_ROUNDS` (default
//!   5) invocations, variants rotating. p50/p90 of `%{time_starttransfer}` (connect + request +
//!   first byte of the answer); the added p50 (proxy − direct). Goal: ≤ 1 ms.
//!
//! A fourth row, for reading the others: the same curl on the host, outside any sandbox
//! (`std::process::Command`, not the Shell RPC).
//!
//! Environment also: `CORRAL_BIN` (another daemon binary).

mod support;

use corral::api::{self, SandboxMode, tools_client::ToolsClient};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;
use support::{Daemon, env_usize, fail, load_average};
use tonic::transport::Channel;

const HOST: &str = "bench.test";

/// The loopback origin: `/big` is `big` bytes of a fixed pattern, anything else `ok\n`; every
/// response carries Content-Length and `Connection: close`.
fn upstream(big: usize) -> u16 {
    let listener =
        TcpListener::bind("127.0.0.2:0").unwrap_or_else(|e| fail(&format!("bind 127.0.0.2: {e}")));
    let port = listener.local_addr().unwrap().port();
    let chunk: Arc<Vec<u8>> = Arc::new((0..1 << 20).map(|i| (i % 251) as u8).collect());
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let chunk = chunk.clone();
            std::thread::spawn(move || {
                let _ = conn.set_nodelay(true);
                let mut reader = BufReader::new(&conn);
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    return;
                }
                let is_big = line.split_whitespace().nth(1) == Some("/big");
                let mut header = String::new();
                while reader.read_line(&mut header).unwrap_or(0) > 0 && header != "\r\n" {
                    header.clear();
                }
                let len = if is_big { big } else { 3 };
                let mut w = &conn;
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
                );
                if !is_big {
                    let _ = w.write_all(format!("{head}ok\n").as_bytes());
                    return;
                }
                if w.write_all(head.as_bytes()).is_err() {
                    return;
                }
                let mut left = big;
                while left > 0 {
                    let n = left.min(chunk.len());
                    if w.write_all(&chunk[..n]).is_err() {
                        return;
                    }
                    left -= n;
                }
            });
        }
    });
    port
}

#[derive(Clone, Copy, PartialEq)]
enum Variant {
    Direct,
    Proxy,
    Tunnel,
    Host,
}

impl Variant {
    const ALL: [Variant; 4] = [
        Variant::Direct,
        Variant::Proxy,
        Variant::Tunnel,
        Variant::Host,
    ];

    fn label(self) -> &'static str {
        match self {
            Variant::Direct => "direct (network on, `--noproxy '*'`)",
            Variant::Proxy => "proxy, plain HTTP (absolute-form)",
            Variant::Tunnel => "proxy, CONNECT (`--proxytunnel`)",
            Variant::Host => "(host curl, no sandbox, no corral)",
        }
    }

    fn curl(self, port: u16) -> String {
        match self {
            Variant::Direct | Variant::Host => {
                format!("curl -sS --noproxy '*' --resolve {HOST}:{port}:127.0.0.2")
            }
            Variant::Proxy => "curl -sS".into(),
            Variant::Tunnel => "curl -sS --proxytunnel".into(),
        }
    }
}

struct Bench {
    tools: ToolsClient<Channel>,
    daemon_pid: u32,
    direct: String,
    proxied: String,
    port: u16,
}

impl Bench {
    async fn sh(&mut self, v: Variant, script: &str) -> String {
        if v == Variant::Host {
            let out = std::process::Command::new("bash")
                .args(["-c", script])
                .output()
                .unwrap_or_else(|e| fail(&format!("bash: {e}")));
            // stdout, then stderr: the order curl's `-w` and bash's `time` come in anyway.
            let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.push_str(&String::from_utf8_lossy(&out.stderr));
            if !out.status.success() {
                fail(&format!("`{script}` on the host: {}\n{text}", out.status));
            }
            return text;
        }
        let session = if v == Variant::Direct {
            &self.direct
        } else {
            &self.proxied
        };
        let r = self
            .tools
            .shell(api::ShellRequest {
                session_id: session.clone(),
                command: vec!["bash".into(), "-c".into(), script.into()],
                timeout_ms: Some(300_000),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|s| fail(&format!("Shell: {s:?}")))
            .into_inner();
        let c = r.combined.unwrap_or_default();
        let mut bytes = c.head;
        bytes.extend_from_slice(&c.tail);
        let out = String::from_utf8_lossy(&bytes).into_owned();
        if r.exit_code != 0 {
            fail(&format!(
                "`{script}` exited {} in the {} session:\n{out}",
                r.exit_code,
                v.label()
            ));
        }
        out
    }

    /// One big download: curl's average speed in bytes per second and the CPU it took (curl's,
    /// the daemon's, this process's, i.e. the server's).
    async fn download(&mut self, v: Variant, bytes: usize) -> (f64, [Duration; 3]) {
        // bash's `time` reports curl's user + system CPU after curl's own `-w` line.
        let script = format!(
            "TIMEFORMAT='%3U %3S'; time {} -o /dev/null \
             -w '%{{http_code}} %{{size_download}} %{{speed_download}}\\n' http://{HOST}:{}/big",
            v.curl(self.port),
            self.port
        );
        let (daemon0, self0) = (thread_cpu(self.daemon_pid), self_cpu());
        let out = self.sh(v, &script).await;
        let (daemon1, self1) = (thread_cpu(self.daemon_pid), self_cpu());
        let f: Vec<&str> = out.split_whitespace().collect();
        let secs = |x: &str| Duration::from_secs_f64(x.parse().unwrap_or_else(|_| fail(&out)));
        match f.as_slice() {
            [code, size, speed, user, sys] if *code == "200" && size.parse() == Ok(bytes) => (
                speed.parse().unwrap_or_else(|_| fail(&out)),
                [
                    secs(user) + secs(sys),
                    daemon1.saturating_sub(daemon0),
                    self1.saturating_sub(self0),
                ],
            ),
            _ => fail(&format!("{}: unexpected curl output: {out}", v.label())),
        }
    }

    /// `n` tiny transfers, each on a connection of its own, in one curl; per transfer
    /// (time_connect, time_pretransfer, time_starttransfer) in seconds, the first dropped.
    async fn tiny(&mut self, v: Variant, n: usize) -> Vec<[f64; 3]> {
        let script = format!(
            "a=(); for i in $(seq 0 {n}); do a+=(-o /dev/null http://{HOST}:{}/tiny?$i); done; \
             {} -H 'Connection: close' -w '%{{http_code}} %{{num_connects}} %{{time_connect}} \
             %{{time_pretransfer}} %{{time_starttransfer}}\\n' \"${{a[@]}}\"",
            self.port,
            v.curl(self.port)
        );
        let out = self.sh(v, &script).await;
        let rows: Vec<[f64; 3]> = out
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                match f.as_slice() {
                    [code, conns, c, p, s] if *code == "200" && *conns == "1" => {
                        [c, p, s].map(|x| x.parse().unwrap_or_else(|_| fail(l)))
                    }
                    _ => fail(&format!(
                        "{}: a transfer that was not 200 on a new connection: {l}\n{out}",
                        v.label()
                    )),
                }
            })
            .collect();
        if rows.len() != n + 1 {
            fail(&format!(
                "{}: {} transfers, not {}",
                v.label(),
                rows.len(),
                n + 1
            ));
        }
        rows[1..].to_vec()
    }
}

/// CPU time of every live thread of `pid` (`/proc/PID/task/*/schedstat`, nanoseconds on CPU).
fn thread_cpu(pid: u32) -> Duration {
    let ns: u64 = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
                .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0);
    Duration::from_nanos(ns)
}

/// This process's CPU time, ended threads included (`getrusage(RUSAGE_SELF)`).
fn self_cpu() -> Duration {
    // SAFETY: getrusage only writes the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Nearest-rank percentile of sorted samples.
fn pct(sorted: &[f64], q: f64) -> f64 {
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn main() {
    support::block_on(async {
        let bytes = env_usize("CORRAL_BENCH_BYTES", 100_000_000);
        let runs = env_usize("CORRAL_BENCH_RUNS", 10).max(1);
        let n = env_usize("CORRAL_BENCH_N", 50).max(1);
        let rounds = env_usize("CORRAL_BENCH_ROUNDS", 5).clamp(1, n);
        let port = upstream(bytes);
        let config = format!(
            "[egress]\nallowed_networks = [\"127.0.0.0/8\"]\n\n[egress.hosts]\n\"{HOST}\" = [\"127.0.0.2\"]\n"
        );
        let load_before = load_average();
        let daemon = Daemon::start_with_config(Some(&config))
            .await
            .unwrap_or_else(|e| fail(&e));
        let dirs = (
            tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir"),
            tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir"),
        );
        let proxied = daemon
            .open_session(api::OpenSessionRequest {
                network_mode: api::NetworkMode::Proxy as i32,
                allow_domains: vec![HOST.into()],
                ..support::session_request(dirs.0.path(), SandboxMode::ReadOnly)
            })
            .await
            .unwrap_or_else(|e| fail(&e));
        let direct = daemon
            .open_session(api::OpenSessionRequest {
                network_access: true,
                ..support::session_request(dirs.1.path(), SandboxMode::ReadOnly)
            })
            .await
            .unwrap_or_else(|e| fail(&e));
        let channel = daemon.channel().await.unwrap_or_else(|e| fail(&e));
        let mut b = Bench {
            tools: ToolsClient::new(channel),
            daemon_pid: daemon.pid(),
            direct,
            proxied,
            port,
        };
        let proxy_env = b.sh(Variant::Proxy, "echo \"$http_proxy\"").await;
        let curl_version = b.sh(Variant::Direct, "curl --version | head -1").await;

        // Warm-up: one small fetch each (workers, the proxy's first connection).
        for v in Variant::ALL {
            b.tiny(v, 2).await;
        }

        // Throughput, variants rotating.
        let mut speeds: [Vec<f64>; 4] = Default::default();
        let mut cpu = [[Duration::ZERO; 3]; 4];
        for r in 0..runs {
            for k in 0..4 {
                let i = (r + k) % 4;
                let (speed, used) = b.download(Variant::ALL[i], bytes).await;
                speeds[i].push(speed);
                for (total, d) in cpu[i].iter_mut().zip(used) {
                    *total += d;
                }
            }
        }

        // Connection set-up, variants rotating.
        let mut times: [Vec<[f64; 3]>; 4] = Default::default();
        for r in 0..rounds {
            let per = n / rounds + usize::from(r < n % rounds);
            for k in 0..4 {
                let i = (r + k) % 4;
                let got = b.tiny(Variant::ALL[i], per).await;
                times[i].extend(got);
            }
        }

        println!(
            "egress bench: load average before {load_before}, after {}, {} CPUs; {}; \
             proxy at {}",
            load_average(),
            support::cpus(),
            curl_version.trim(),
            proxy_env.trim()
        );
        println!(
            "\nthroughput: {bytes} bytes from 127.0.0.2 by curl in the sandbox, {runs} runs \
             per variant, rotating\n"
        );
        println!(
            "| variant | median MB/s | min–max MB/s | ratio to direct | CPU ms per 100 MB: curl \
             / daemon / server / sum |"
        );
        println!("|---|---:|---:|---:|---:|");
        let mb = 1e6;
        let direct_median = median(&mut speeds[0].clone()) / mb;
        for (i, v) in Variant::ALL.into_iter().enumerate() {
            let s = &mut speeds[i];
            let m = median(s) / mb;
            let per = |d: Duration| d.as_secs_f64() * 1e3 * 1e8 / (runs * bytes) as f64;
            let [c, d, srv] = cpu[i].map(per);
            println!(
                "| {} | {m:.0} | {:.0}–{:.0} | {:.2}× | {c:.0} / {d:.0} / {srv:.0} / {:.0} |",
                v.label(),
                s[0] / mb,
                s[s.len() - 1] / mb,
                m / direct_median,
                c + d + srv
            );
        }
        let ratio = |i: usize| median(&mut speeds[i].clone()) / mb / direct_median;
        let worst = ratio(1).min(ratio(2));
        println!(
            "throughput proxy ÷ direct: absolute-form {:.2}×, CONNECT {:.2}× (goal ≥ 0.8×): {}",
            ratio(1),
            ratio(2),
            if worst >= 0.8 { "met" } else { "NOT met" }
        );

        println!(
            "\nconnection set-up: {n} transfers of 3 bytes per variant, each on a new connection, \
             {rounds} curl invocations per variant (first transfer of each dropped), rotating\n"
        );
        println!(
            "| variant | connect p50 ms | pretransfer p50 ms | starttransfer p50 ms | \
             starttransfer p90 ms | added p50 ms |"
        );
        println!("|---|---:|---:|---:|---:|---:|");
        let col = |t: &[[f64; 3]], j: usize| {
            let mut v: Vec<f64> = t.iter().map(|r| r[j] * 1e3).collect();
            v.sort_by(f64::total_cmp);
            v
        };
        let base = pct(&col(&times[0], 2), 0.5);
        let mut added = [0.0; 4];
        for (i, v) in Variant::ALL.into_iter().enumerate() {
            let st = col(&times[i], 2);
            added[i] = pct(&st, 0.5) - base;
            println!(
                "| {} | {:.3} | {:.3} | {:.3} | {:.3} | {} |",
                v.label(),
                pct(&col(&times[i], 0), 0.5),
                pct(&col(&times[i], 1), 0.5),
                pct(&st, 0.5),
                pct(&st, 0.9),
                if i == 0 {
                    "baseline".into()
                } else {
                    format!("{:+.3}", added[i])
                }
            );
        }
        println!(
            "added p50 time to first byte: absolute-form {:.3} ms, CONNECT {:.3} ms (goal ≤ 1 ms): {}",
            added[1],
            added[2],
            if added[1].max(added[2]) <= 1.0 {
                "met"
            } else {
                "NOT met"
            }
        );
    });
}
