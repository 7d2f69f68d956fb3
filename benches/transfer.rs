//! File transfer throughput: `corral cp` of one large file into a session (Upload) and back out
//! (Download), through a real daemon over its Unix socket, against `cp` of the same file on the
//! same disk in the same run.
//!
//! `cargo bench --bench transfer` (harness = false: `cargo test` never runs it). One run:
//!
//! - writes a `$CORRAL_BENCH_BYTES` file (default 1 GiB) of pseudo-random bytes under
//!   `target/tmp` (so every variant reads it from the page cache);
//! - then, `$CORRAL_BENCH_RUNS` rounds (default 3), each in a rotating order:
//!   (a) `cp SRC DST` — the baseline (page cache; cp does not flush);
//!   (b) `cp SRC DST && sync --data DST` — the same, durable, as corral's transfers are (each
//!   file is `fdatasync`ed before it is renamed into place);
//!   (c) `corral cp SRC :up.bin --session S` (Upload into a workspace-write session);
//!   (d) `corral cp :up.bin DST --session S` (Download to the local disk);
//! - checks each copy is byte-identical (first round), deletes it, and reports the median
//!   seconds, MB/s (10^6 bytes) and the ratio to (a) and to (b).
//!
//! The corral times include the CLI starting, connecting and the session lookup (an open session
//! is named with `--session`), the gRPC stream over the Unix socket, the daemon ↔ worker frames,
//! and the staging + flush + rename on the receiving side.
//!
//! Environment: `CORRAL_BENCH_BYTES`, `CORRAL_BENCH_RUNS`, `CORRAL_BIN`.

mod support;

use corral::api::SandboxMode;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use support::{Daemon, corral_bin, env_usize, fail, load_average, median};

/// Writes `bytes` pseudo-random bytes (xorshift; incompressible, not sparse) to `path`.
fn make_file(path: &Path, bytes: usize) {
    let mut f = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path).unwrap());
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut block = vec![0u8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        for chunk in block.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
        }
        let n = left.min(block.len());
        f.write_all(&block[..n]).unwrap();
        left -= n;
    }
    f.flush().unwrap();
}

/// Runs a command, failing the bench if it fails; its wall time.
fn timed(cmd: &mut Command) -> Duration {
    let t = Instant::now();
    let out = cmd
        .output()
        .unwrap_or_else(|e| fail(&format!("{cmd:?}: {e}")));
    let d = t.elapsed();
    if !out.status.success() {
        fail(&format!(
            "{cmd:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    d
}

fn same(a: &Path, b: &Path) {
    let ok = Command::new("cmp")
        .args(["-s"])
        .arg(a)
        .arg(b)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        fail(&format!("{} differs from {}", b.display(), a.display()));
    }
}

fn main() {
    let bytes = env_usize("CORRAL_BENCH_BYTES", 1 << 30);
    let runs = env_usize("CORRAL_BENCH_RUNS", 3).max(1);
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let local = tempfile::tempdir_in(&tmp).expect("tempdir");
    let ws = tempfile::tempdir_in(&tmp).expect("tempdir");
    let src = local.path().join("src.bin");
    eprintln!("writing a {bytes}-byte source file…");
    make_file(&src, bytes);
    let corral = corral_bin();
    support::block_on(async {
        let daemon = Daemon::start().await.unwrap_or_else(|e| fail(&e));
        let session = daemon
            .open_session(api_request(ws.path()))
            .await
            .unwrap_or_else(|e| fail(&e));
        let socket = daemon_socket(&daemon);
        let dst = local.path().join("dst.bin");
        let uploaded = ws.path().join("up.bin");
        let names = [
            "(a) cp",
            "(b) cp + sync --data",
            "(c) corral cp upload",
            "(d) corral cp download",
        ];
        let mut times: Vec<Vec<Duration>> = vec![Vec::new(); names.len()];
        for round in 0..runs {
            for k in 0..names.len() {
                let v = (k + round) % names.len();
                let d = match v {
                    0 => timed(Command::new("cp").arg(&src).arg(&dst)),
                    1 => timed(Command::new("bash").arg("-c").arg(format!(
                        "cp '{}' '{}' && sync --data '{}'",
                        src.display(),
                        dst.display(),
                        dst.display()
                    ))),
                    2 => timed(
                        Command::new(&corral)
                            .args(["cp", "--session", &session, "--socket", &socket])
                            .arg(&src)
                            .arg(":up.bin"),
                    ),
                    _ => {
                        if !uploaded.exists() {
                            // The download needs the uploaded file: upload it first, untimed.
                            timed(
                                Command::new(&corral)
                                    .args(["cp", "--session", &session, "--socket", &socket])
                                    .arg(&src)
                                    .arg(":up.bin"),
                            );
                        }
                        timed(
                            Command::new(&corral)
                                .args(["cp", "--session", &session, "--socket", &socket])
                                .arg(":up.bin")
                                .arg(&dst),
                        )
                    }
                };
                times[v].push(d);
                let copy = if v == 2 { &uploaded } else { &dst };
                if round == 0 {
                    same(&src, copy);
                }
                // Each variant writes a new file (the download's source stays).
                if v != 2 {
                    let _ = std::fs::remove_file(&dst);
                }
            }
        }
        let med: Vec<Duration> = times
            .iter_mut()
            .map(|t| {
                t.sort();
                median(t)
            })
            .collect();
        println!(
            "\n{bytes} bytes, {runs} rounds (median), load average {}\n",
            load_average()
        );
        println!("| variant | seconds | MB/s | ratio to (a) | ratio to (b) |");
        println!("|---|---:|---:|---:|---:|");
        for (name, d) in names.iter().zip(&med) {
            let s = d.as_secs_f64();
            println!(
                "| {name} | {s:.2} | {:.0} | {:.2}× | {:.2}× |",
                bytes as f64 / 1e6 / s,
                s / med[0].as_secs_f64(),
                s / med[1].as_secs_f64()
            );
        }
        drop(daemon);
    });
}

fn api_request(ws: &Path) -> corral::api::OpenSessionRequest {
    corral::api::OpenSessionRequest {
        exclude_slash_tmp: true,
        exclude_tmpdir_env_var: true,
        ..support::session_request(ws, SandboxMode::WorkspaceWrite)
    }
}

fn daemon_socket(d: &Daemon) -> String {
    d.socket_path().display().to_string()
}
