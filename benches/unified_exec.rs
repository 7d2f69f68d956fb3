//! Long-lived processes: exec_command and the Processes service against bare spawns.
//!
//! `cargo bench --bench unified_exec` (harness = false: `cargo test` never runs it). One run
//! measures, interleaved round-robin so load drift hits every variant alike:
//!
//! - (a) bare `/bin/bash -c true` (`std::process::Command::status`), the baseline for (b), (c);
//! - (b) `exec_command {"cmd":"true","login":false}` through `Invoke`, workspace-write session;
//! - (c) `StartProcess ["true"]` then `ReadProcess` (waiting) until the output closes;
//! - (d) a PTY echo round trip: `WriteProcess "x\n"` to a `cat` on a PTY, then `ReadProcess`
//!   after the cursor until the echo is back; baseline (e) the same round trip to a local
//!   `cat` on pipes without corral.
//!
//! Then a throughput run: `head -c $CORRAL_BENCH_BYTES /dev/zero` (default 1 GiB) read through
//! the resumable cursor (4 MiB reads), against `head -c … /dev/zero > /dev/null` on the host.
//! The process is not slowed for its reader (as in Codex, output beyond the 1 MiB window is
//! dropped), so the run reports the bytes delivered and the bytes the reader lost.
//!
//! Environment: `CORRAL_BENCH_N` (default 200), `CORRAL_BENCH_WARMUP` (default 20),
//! `CORRAL_BENCH_BYTES`, `CORRAL_BIN`.

mod support;

use corral::api::{
    self, SandboxMode, bridge_client::BridgeClient, processes_client::ProcessesClient,
    start_process_request::Command as StartCommand,
};
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::{Daemon, env_usize, load_average, pct, us};
use tonic::transport::Channel;

struct Bench {
    bridge: BridgeClient<Channel>,
    processes: ProcessesClient<Channel>,
    session: String,
}

fn argv(args: &[&str]) -> Option<StartCommand> {
    Some(StartCommand::Argv(api::Argv {
        args: args.iter().map(|s| s.to_string()).collect(),
    }))
}

impl Bench {
    async fn exec_true(&mut self) -> Duration {
        let t = Instant::now();
        let r = self
            .bridge
            .invoke(api::InvokeRequest {
                session_id: self.session.clone(),
                name: "exec_command".into(),
                arguments: r#"{"cmd":"true","login":false}"#.into(),
                ..Default::default()
            })
            .await
            .expect("exec_command")
            .into_inner();
        let d = t.elapsed();
        assert!(
            r.output.contains("Process exited with code 0"),
            "{}",
            r.output
        );
        d
    }

    async fn start(&mut self, command: Option<StartCommand>, tty: bool) -> i32 {
        self.processes
            .start_process(api::StartProcessRequest {
                session_id: self.session.clone(),
                command,
                tty,
                ..Default::default()
            })
            .await
            .expect("start")
            .into_inner()
            .process_id
    }

    async fn read(
        &mut self,
        id: i32,
        after: Option<u64>,
        wait_ms: u32,
    ) -> api::ReadProcessResponse {
        self.processes
            .read_process(api::ReadProcessRequest {
                session_id: self.session.clone(),
                process_id: id,
                after_seq: after,
                wait_ms,
                max_bytes: 4 * 1024 * 1024,
            })
            .await
            .expect("read")
            .into_inner()
    }

    async fn terminate(&mut self, id: i32) {
        self.processes
            .terminate_process(api::TerminateProcessRequest {
                session_id: self.session.clone(),
                process_id: id,
            })
            .await
            .expect("terminate");
    }

    async fn start_true(&mut self) -> Duration {
        let t = Instant::now();
        let id = self.start(argv(&["true"]), false).await;
        loop {
            let r = self.read(id, None, 1_000).await;
            if r.state.expect("state").closed {
                break;
            }
        }
        let d = t.elapsed();
        self.terminate(id).await;
        d
    }

    /// One echo round trip to a PTY `cat`; `cursor` is the reader's position.
    async fn echo(&mut self, id: i32, cursor: &mut Option<u64>) -> Duration {
        let t = Instant::now();
        self.processes
            .write_process(api::WriteProcessRequest {
                session_id: self.session.clone(),
                process_id: id,
                data: b"x\n".to_vec(),
                close_stdin: false,
            })
            .await
            .expect("write");
        // The terminal echoes the input and cat writes it back: "x\r\n" twice.
        let mut got = 0;
        while got < 6 {
            let r = self.read(id, *cursor, 1_000).await;
            got += r.chunks.iter().map(|c| c.data.len()).sum::<usize>();
            *cursor = r.last_seq;
        }
        t.elapsed()
    }
}

fn report(label: &str, samples: &mut [Duration], baseline: Option<Duration>) -> Duration {
    samples.sort();
    let p50 = pct(samples, 0.5);
    let ratio = baseline
        .map(|b| format!("{:.2}×", p50.as_secs_f64() / b.as_secs_f64()))
        .unwrap_or_else(|| "baseline".into());
    println!(
        "| {label} | {:.0} | {:.0} | {:.0} | {ratio} |",
        us(p50),
        us(pct(samples, 0.9)),
        us(pct(samples, 0.99)),
    );
    p50
}

fn main() {
    support::block_on(async {
        let n = env_usize("CORRAL_BENCH_N", 200);
        let warmup = env_usize("CORRAL_BENCH_WARMUP", 20);
        let total_bytes = env_usize("CORRAL_BENCH_BYTES", 1 << 30);
        let daemon = Daemon::start().await.unwrap_or_else(|e| support::fail(&e));
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
        let session = daemon
            .open_session(support::session_request(
                dir.path(),
                SandboxMode::WorkspaceWrite,
            ))
            .await
            .unwrap_or_else(|e| support::fail(&e));
        let channel = daemon.channel().await.expect("connect");
        let mut b = Bench {
            bridge: BridgeClient::new(channel.clone()),
            processes: ProcessesClient::new(channel).max_decoding_message_size(64 << 20),
            session,
        };

        let tty_cat = b.start(argv(&["cat"]), true).await;
        let mut cursor = None;
        let mut local = Command::new("cat")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("cat");
        let mut local_in = local.stdin.take().unwrap();
        let mut local_out = local.stdout.take().unwrap();

        let mut bare = Vec::new();
        let mut exec = Vec::new();
        let mut typed = Vec::new();
        let mut echo = Vec::new();
        let mut local_echo = Vec::new();
        for i in 0..warmup + n {
            let t = Instant::now();
            let ok = Command::new("/bin/bash")
                .args(["-c", "true"])
                .status()
                .unwrap();
            let d_bare = t.elapsed();
            assert!(ok.success());
            let d_exec = b.exec_true().await;
            let d_typed = b.start_true().await;
            let d_echo = b.echo(tty_cat, &mut cursor).await;
            let t = Instant::now();
            local_in.write_all(b"x\n").unwrap();
            let mut buf = [0u8; 2];
            local_out.read_exact(&mut buf).unwrap();
            let d_local = t.elapsed();
            if i >= warmup {
                bare.push(d_bare);
                exec.push(d_exec);
                typed.push(d_typed);
                echo.push(d_echo);
                local_echo.push(d_local);
            }
        }
        drop(local_in);
        let _ = local.wait();
        b.terminate(tty_cat).await;

        println!(
            "unified_exec bench: n = {n} per variant (after {warmup} warm-up rounds), load average {}, {} CPUs\n",
            load_average(),
            support::cpus()
        );
        println!("| variant | p50 µs | p90 µs | p99 µs | p50 ratio |");
        println!("|---|---|---|---|---|");
        let base = report("(a) bare `/bin/bash -c true`", &mut bare, None);
        report(
            "(b) exec_command `true` (Invoke), workspace-write",
            &mut exec,
            Some(base),
        );
        report(
            "(c) StartProcess `true` + ReadProcess to close",
            &mut typed,
            Some(base),
        );
        let local = report(
            "(e) local pipe echo to `cat` (no corral)",
            &mut local_echo,
            None,
        );
        report(
            "(d) PTY echo round trip: WriteProcess + ReadProcess",
            &mut echo,
            Some(local),
        );

        // Throughput through the resumable cursor.
        let t = Instant::now();
        let ok = Command::new("sh")
            .args([
                "-c",
                &format!("head -c {total_bytes} /dev/zero > /dev/null"),
            ])
            .status()
            .unwrap();
        assert!(ok.success());
        let host = t.elapsed();
        let t = Instant::now();
        let id = b
            .start(
                argv(&["head", "-c", &total_bytes.to_string(), "/dev/zero"]),
                false,
            )
            .await;
        let (mut delivered, mut lost, mut cursor, mut end) = (0u64, 0u64, None, 0u64);
        loop {
            let r = b.read(id, cursor, 1_000).await;
            for c in &r.chunks {
                lost += c.offset - end;
                delivered += c.data.len() as u64;
                end = c.offset + c.data.len() as u64;
            }
            cursor = r.last_seq;
            let state = r.state.expect("state");
            if state.closed && !r.more && end == state.output_bytes {
                break;
            }
        }
        let through = t.elapsed();
        b.terminate(id).await;
        let mib = |bytes: u64, d: Duration| bytes as f64 / (1 << 20) as f64 / d.as_secs_f64();
        println!(
            "\n| throughput | seconds | MiB/s | note |\n|---|---|---|---|\n\
             | host `head -c {total_bytes} /dev/zero > /dev/null` | {:.2} | {:.0} | baseline |\n\
             | the same through ReadProcess (4 MiB reads) | {:.2} | {:.0} delivered | {} MiB delivered, {} MiB lost ({:.1}%), ratio {:.2}× |",
            host.as_secs_f64(),
            mib(total_bytes as u64, host),
            through.as_secs_f64(),
            mib(delivered, through),
            delivered >> 20,
            lost >> 20,
            100.0 * lost as f64 / total_bytes as f64,
            through.as_secs_f64() / host.as_secs_f64(),
        );
    });
}
