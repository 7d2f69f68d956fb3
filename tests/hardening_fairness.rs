//! H23: fair under churn. One user opening and closing sessions as fast as it can — 16
//! concurrent clients, each session on a cwd of its own, so every open costs a resolver helper
//! and a new worker — keeps another user's `OpenSession` + first call + close and its health
//! check within 5× of idle at the 99th percentile, measured in the same run on this machine.
//! The daemon runs in memory and pids cgroups of its own with caps, so a failure cannot hurt
//! the machine. A test binary of its own (not a module of tests/it): the measurement wants the
//! machine to itself, which a lock can give it only among the tests of one binary.

// The harness is shared with tests/it, which uses all of it; this binary uses a part.
#[allow(dead_code, unused_imports, unused_macros)]
mod common;

use common::{Daemon, DaemonCgroup, TestUser, connect_as};
use corral::api::{self, SandboxMode, sessions_client::SessionsClient, tools_client::ToolsClient};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tonic::transport::Channel;

/// The two tests of this file one at a time: the churn measurement wants the machine to itself.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Concurrent clients of the user who churns (the red team's 16 threads).
const CHURNERS: usize = 16;
/// Rounds of the other user's open + first call + close per phase.
const ROUNDS: usize = 30;
/// Health checks per phase.
const CHECKS: usize = 100;

/// Opens a workspace-write session on `cwd`, runs `true` in it, closes it.
async fn round(channel: &Channel, cwd: &Path) -> Result<(), tonic::Status> {
    let mut sessions = SessionsClient::new(channel.clone());
    let id = sessions
        .open_session(api::OpenSessionRequest {
            cwd: cwd.to_string_lossy().into_owned(),
            mode: SandboxMode::WorkspaceWrite as i32,
            ..Default::default()
        })
        .await?
        .into_inner()
        .session_id;
    let ran = ToolsClient::new(channel.clone())
        .shell(api::ShellRequest {
            session_id: id.clone(),
            command: vec!["true".into()],
            ..Default::default()
        })
        .await;
    sessions
        .close_session(api::CloseSessionRequest { session_id: id })
        .await?;
    let ran = ran?.into_inner();
    assert_eq!(ran.exit_code, 0, "{ran:?}");
    Ok(())
}

async fn health(channel: &Channel) {
    let r = tonic_health::pb::health_client::HealthClient::new(channel.clone())
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.status, 1, "not SERVING");
}

/// The other user's latencies in one phase: (rounds p99, health p99), and the medians.
struct Phase {
    round_p50: Duration,
    round_p99: Duration,
    health_p50: Duration,
    health_p99: Duration,
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    let i = ((samples.len() as f64 * p).ceil() as usize).clamp(1, samples.len()) - 1;
    samples[i]
}

async fn measure(channel: &Channel, cwd: &Path) -> Phase {
    let mut rounds = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let t = Instant::now();
        round(channel, cwd).await.unwrap();
        rounds.push(t.elapsed());
        // A caller that pauses between turns, as an agent does.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut checks = Vec::with_capacity(CHECKS);
    for _ in 0..CHECKS {
        let t = Instant::now();
        health(channel).await;
        checks.push(t.elapsed());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Phase {
        round_p50: percentile(&mut rounds, 0.5),
        round_p99: percentile(&mut rounds, 0.99),
        health_p50: percentile(&mut checks, 0.5),
        health_p99: percentile(&mut checks, 0.99),
    }
}

/// One churning client: fresh cwd, open, `true`, close, as fast as it can until `stop`.
async fn churn(
    channel: Channel,
    base: PathBuf,
    n: usize,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    refused: Arc<AtomicU64>,
) {
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let cwd = base.join(format!("c{n}-{i}"));
        i += 1;
        match round(&channel, &cwd).await {
            Ok(()) => done.fetch_add(1, Ordering::Relaxed),
            Err(_) => refused.fetch_add(1, Ordering::Relaxed),
        };
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn h23_another_users_churn_keeps_my_p99_within_5x_of_idle() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let Some(memory) = DaemonCgroup::create("h23", 8 << 30) else {
        assert!(
            !nix::unistd::geteuid().is_root(),
            "root without a v1 memory controller"
        );
        return;
    };
    let Some(pids) = DaemonCgroup::create_in("pids", "h23", "pids.max", 4000) else {
        panic!("root without a v1 pids controller");
    };
    let join = format!(
        "echo $$ > {}/cgroup.procs; echo $$ > {}/cgroup.procs; exec \"$@\"",
        memory.0.display(),
        pids.0.display()
    );
    let d = Daemon::start_wrapped(&["sh", "-c", &join, "sh"], &[]).await;
    let socket = PathBuf::from(d.open_to_local_users());
    let alice = TestUser::create("h23a");
    let bob = TestUser::create("h23b");
    // Alice's cwds, made ahead so the churn measures the daemon, not mkdir.
    let alice_base = alice.dir.join("churn");
    common::host_sh(&format!(
        "mkdir -p {0} && cd {0} && for n in $(seq 0 {1}); do for i in $(seq 0 400); do \
         mkdir c$n-$i; done; done && chown -R {2}:{3} {0}",
        alice_base.display(),
        CHURNERS - 1,
        alice.uid,
        alice.gid
    ));
    let bob_ch = connect_as(&socket, bob.uid, bob.gid).await.unwrap();
    // Warm-up: the first round pays for page-cache misses of the binary.
    round(&bob_ch, &bob.dir).await.unwrap();
    let idle = measure(&bob_ch, &bob.dir).await;

    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let mut churners = Vec::new();
    for n in 0..CHURNERS {
        let ch = connect_as(&socket, alice.uid, alice.gid).await.unwrap();
        churners.push(tokio::spawn(churn(
            ch,
            alice_base.clone(),
            n,
            stop.clone(),
            done.clone(),
            refused.clone(),
        )));
    }
    // Let the churn reach its pace.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let t = Instant::now();
    let busy = measure(&bob_ch, &bob.dir).await;
    let churn_secs = t.elapsed().as_secs_f64();
    let churned = done.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    for c in churners {
        c.await.unwrap();
    }
    let report = format!(
        "idle: round p50 {:?} p99 {:?}, health p50 {:?} p99 {:?}; under churn ({} sessions by \
         alice, {} refused, {:.1} s): round p50 {:?} p99 {:?}, health p50 {:?} p99 {:?}",
        idle.round_p50,
        idle.round_p99,
        idle.health_p50,
        idle.health_p99,
        churned,
        refused.load(Ordering::Relaxed),
        churn_secs,
        busy.round_p50,
        busy.round_p99,
        busy.health_p50,
        busy.health_p99
    );
    eprintln!("H23: {report}");
    assert!(churned > 0, "the churn never got a session: {report}");
    assert!(
        busy.round_p99 <= idle.round_p99 * 5,
        "open + first call p99 over 5x idle: {report}"
    );
    assert!(
        busy.health_p99 <= idle.health_p99 * 5,
        "health p99 over 5x idle: {report}"
    );
}

/// H23's budget through the real surface: past its burst a user's starts wait their turn (at
/// the rule's rate), and one that would wait longer than 10 s is refused at once with
/// RESOURCE_EXHAUSTED naming the key to change and a google.rpc.RetryInfo; another user's
/// budget is untouched.
#[tokio::test]
async fn h23_a_start_over_budget_waits_its_turn_or_is_refused_with_when_to_retry() {
    use tonic_types::StatusExt;
    let _alone = ONE_AT_A_TIME.lock().await;
    let conf_dir = common::outside();
    let conf = conf_dir.path().join("corral.toml");
    std::fs::write(
        &conf,
        "[policy.default]\nsandbox_starts_per_second = 1\nsandbox_start_burst = 2\n",
    )
    .unwrap();
    let d = Daemon::start(&["--config", conf.to_str().unwrap()]).await;
    let cwd = common::scratch();
    // The burst: two opens at once, no wait.
    let t = Instant::now();
    for _ in 0..2 {
        d.try_open(cwd.path(), SandboxMode::ReadOnly).await.unwrap();
    }
    assert!(
        t.elapsed() < Duration::from_millis(900),
        "{:?}",
        t.elapsed()
    );
    // The third waits about a second.
    let t = Instant::now();
    d.try_open(cwd.path(), SandboxMode::ReadOnly).await.unwrap();
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(800) && waited < Duration::from_secs(3),
        "third start waited {waited:?}"
    );
    // Ten more queued behind it (not awaited here) fill the next ten seconds...
    let mut queued = Vec::new();
    for _ in 0..10 {
        let mut sessions = d.sessions().await;
        let cwd = cwd.path().to_string_lossy().into_owned();
        queued.push(tokio::spawn(async move {
            sessions
                .open_session(api::OpenSessionRequest {
                    cwd,
                    mode: SandboxMode::ReadOnly as i32,
                    ..Default::default()
                })
                .await
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // ... so the next is refused at once, saying why and when to retry.
    let t = Instant::now();
    let refused = d
        .try_open(cwd.path(), SandboxMode::ReadOnly)
        .await
        .unwrap_err();
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert!(
        refused.message().contains("sandbox_starts_per_second")
            && refused.message().contains("policy.default"),
        "{}",
        refused.message()
    );
    let retry = refused
        .get_details_retry_info()
        .and_then(|r| r.retry_delay)
        .expect("a RetryInfo");
    assert!(
        retry > Duration::ZERO && retry <= Duration::from_secs(2),
        "{retry:?}"
    );
    for q in queued {
        q.abort();
    }
    // Another user's budget is its own: served at once.
    let other = TestUser::create("h23r");
    let socket = PathBuf::from(d.open_to_local_users());
    let ch = connect_as(&socket, other.uid, other.gid).await.unwrap();
    let t = Instant::now();
    round(&ch, &other.dir).await.unwrap();
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
}
