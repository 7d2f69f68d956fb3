//! How a client command fails: [`Failure`] (the gRPC status code, when the daemon answered with
//! one, and the message), its one line for a person and its JSON for --json.

use serde_json::json;

/// A client command's failure: what went wrong, and the gRPC status code when the daemon
/// answered with one (a connection or argument problem has none).
#[derive(Debug)]
pub(in crate::client) struct Failure {
    pub code: Option<tonic::Code>,
    pub message: String,
    /// A stdio front (`corral mcp`, `corral exec-server --listen stdio`) failed before its
    /// client's `initialize` was read: the reason is also the answer to it.
    pub before_handshake: bool,
}

impl From<String> for Failure {
    fn from(message: String) -> Self {
        Self {
            code: None,
            message,
            before_handshake: true,
        }
    }
}

impl From<tonic::Status> for Failure {
    fn from(s: tonic::Status) -> Self {
        Self {
            code: Some(s.code()),
            message: s.message().to_string(),
            before_handshake: true,
        }
    }
}

/// Where a command reports plain text (cp), a failure is its one line.
impl From<Failure> for String {
    fn from(f: Failure) -> String {
        f.text()
    }
}

impl Failure {
    /// A stdio front's failure after its client's handshake began (nothing left to answer).
    pub fn after_handshake(message: String) -> Self {
        Self {
            code: None,
            message,
            before_handshake: false,
        }
    }

    /// One line for a person: `NotFound: …`, or the message alone.
    pub(super) fn text(&self) -> String {
        match self.code {
            Some(code) => format!("{code:?}: {}", self.message),
            None => self.message.clone(),
        }
    }

    /// `{"error": {"code": "NOT_FOUND", "message": …}}` for --json (`code` is null when the
    /// daemon was not reached or did not answer with a status).
    pub(super) fn json(&self) -> serde_json::Value {
        json!({"error": {"code": self.code.map(grpc_code_name), "message": self.message}})
    }
}

pub(in crate::client) fn status_text(s: tonic::Status) -> String {
    format!("{:?}: {}", s.code(), s.message())
}

/// A gRPC status code's canonical name (`NOT_FOUND`), as every gRPC library spells it: the
/// CLI's JSON errors.
fn grpc_code_name(code: tonic::Code) -> String {
    let name = format!("{code:?}");
    // CamelCase → SCREAMING_SNAKE_CASE.
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}
