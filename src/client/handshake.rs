//! Saying why a stdio front stops before its handshake. `corral mcp` and `corral exec-server
//! --listen stdio` that cannot start (no daemon, a refused session, a bad option) print the
//! reason on stderr, but a client that started them shows only "connection closed": Codex and
//! the MCP Inspector keep no server stderr. So the front stays long enough to answer the
//! client's `initialize` (and any request before it) with a JSON-RPC error carrying the reason,
//! then exits non-zero.

use serde_json::{Value, json};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

/// The JSON-RPC dialect of the front.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// MCP: JSON-RPC 2.0, one message a line, `"jsonrpc": "2.0"` on every message.
    Mcp,
    /// Codex's exec-server over stdio: one message a line, no `"jsonrpc"` member on output.
    ExecServer,
}

/// JSON-RPC's "internal error": the server, not the request, is what failed.
const INTERNAL_ERROR: i64 = -32603;

/// How long to wait for the client's first request: a client that started the front sends
/// `initialize` at once; a person at a terminal already read stderr.
const WAIT: Duration = Duration::from_secs(10);

/// The answer to request `id`: an error with `reason`.
pub fn refusal(protocol: Protocol, id: &Value, reason: &str) -> Value {
    let mut answer = json!({"id": id, "error": {"code": INTERNAL_ERROR, "message": reason}});
    if protocol == Protocol::Mcp {
        answer["jsonrpc"] = json!("2.0");
    }
    answer
}

/// Reads the client's messages from stdin and answers every request with `reason` until
/// `initialize` has been answered, stdin ends, or [`WAIT`] passes. Notifications and lines
/// that are not JSON are skipped. Nothing is read from a terminal.
pub async fn refuse(protocol: Protocol, reason: &str) {
    use std::io::IsTerminal;
    if std::io::stdin().is_terminal() {
        return;
    }
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let mut stdout = tokio::io::stdout();
    let deadline = tokio::time::Instant::now() + WAIT;
    while let Ok(Ok(Some(line))) = tokio::time::timeout_at(deadline, lines.next_line()).await {
        let Ok(message) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let Some(id) = message.get("id").filter(|id| !id.is_null()) else {
            continue;
        };
        if message.get("method").is_none() {
            continue;
        }
        let mut out = refusal(protocol, id, reason).to_string();
        out.push('\n');
        if stdout.write_all(out.as_bytes()).await.is_err() || stdout.flush().await.is_err() {
            return;
        }
        if message.get("method").and_then(Value::as_str) == Some("initialize") {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_is_each_dialect_s_error_reply() {
        let mcp = refusal(Protocol::Mcp, &json!(0), "no daemon");
        assert_eq!(
            mcp,
            json!({"jsonrpc": "2.0", "id": 0, "error": {"code": -32603, "message": "no daemon"}})
        );
        let exec = refusal(Protocol::ExecServer, &json!("a"), "no daemon");
        assert_eq!(
            exec,
            json!({"id": "a", "error": {"code": -32603, "message": "no daemon"}})
        );
    }
}
