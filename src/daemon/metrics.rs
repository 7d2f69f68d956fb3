//! Prometheus metrics (off by default; loopback by default when on): calls by tool and
//! outcome, call latency, commands running, live workers, sandbox denials. Labels never carry
//! ids, paths or commands.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Calls, by `tool` and `outcome`.
pub const CALLS: &str = "corral_calls_total";
/// Call latency in seconds, by `tool`.
pub const CALL_SECONDS: &str = "corral_call_duration_seconds";
/// Shell commands running now.
pub const RUNNING_COMMANDS: &str = "corral_running_commands";
/// Sandbox workers alive now.
pub const WORKERS: &str = "corral_workers";
/// Calls that ended in a sandbox denial, by `tool`.
pub const DENIALS: &str = "corral_sandbox_denials_total";

/// Whether the exporter is installed. Without it every metric goes nowhere, so calls skip
/// building their labels (a few allocations per call).
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Starts the exporter's HTTP listener on `addr` (serving `/metrics`).
pub fn install(addr: SocketAddr) -> Result<(), String> {
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets(&[0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0])
        .map_err(|e| format!("metrics: {e}"))?
        .install()
        .map_err(|e| format!("metrics: cannot listen on {addr}: {e}"))?;
    metrics::describe_counter!(CALLS, "Tool calls by tool and outcome");
    metrics::describe_histogram!(CALL_SECONDS, "Tool call latency in seconds");
    metrics::describe_gauge!(RUNNING_COMMANDS, "Shell commands running");
    metrics::describe_gauge!(WORKERS, "Sandbox workers alive");
    metrics::describe_counter!(DENIALS, "Calls that ended in a sandbox denial");
    INSTALLED.store(true, Ordering::SeqCst);
    Ok(())
}

/// The label of every tool name outside `calls::facts::CALL_NAMES`.
pub const OTHER: &str = "other";

/// The `tool` label for a call's tool name: the name itself when it is one of corral's
/// (a fixed set), else [`OTHER`]. An Invoke's name is the caller's text: as a label it would
/// show any local user who reaches the endpoint (plain HTTP, no identity) what one user
/// chose to send (H26), and every new name would be a new series kept for the daemon's life.
pub fn tool_label(tool: &str) -> &'static str {
    crate::calls::facts::CALL_NAMES
        .iter()
        .copied()
        .find(|t| *t == tool)
        .unwrap_or(OTHER)
}

/// Records one finished call.
pub fn call(tool: &str, outcome: &str, elapsed: Duration) {
    if !INSTALLED.load(Ordering::Relaxed) {
        return;
    }
    let tool = tool_label(tool);
    metrics::counter!(CALLS, "tool" => tool, "outcome" => outcome.to_string()).increment(1);
    metrics::histogram!(CALL_SECONDS, "tool" => tool).record(elapsed.as_secs_f64());
    if outcome == "denied" {
        denial(tool);
    }
}

/// Records a sandbox denial whose call did not end with it (it waits for a retry decision).
pub fn denial(tool: &str) {
    if !INSTALLED.load(Ordering::Relaxed) {
        return;
    }
    metrics::counter!(DENIALS, "tool" => tool_label(tool)).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tool_keeps_its_label_and_any_other_name_is_other() {
        for name in crate::calls::tool_names() {
            assert_eq!(tool_label(name), name);
        }
        assert_eq!(tool_label("decide_approval"), "decide_approval");
        assert_eq!(tool_label("mcp__secret__create_issue"), OTHER);
        assert_eq!(tool_label("read_file\n"), OTHER);
    }
}
