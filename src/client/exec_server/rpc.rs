//! The JSON-RPC envelope in Codex's dialect: `id` (integer or string), `method`, `params`, and
//! `result` or `error {code, message}`; no `"jsonrpc"` member on output (accepted on input); a
//! JSON array is a batch of requests. What a message *means* is `handlers.rs`'s business.

use serde_json::{Map, Value, json};

/// JSON-RPC's own codes, and the one Codex's server uses for a missing path.
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL_ERROR: i64 = -32603;
/// `fs/*` on a path that does not exist (what Codex 0.171's own server answers, with the OS
/// error's text as the message).
pub const NOT_FOUND: i64 = -32004;

/// The largest message accepted (Codex's own server takes 64 MiB).
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// A failed request's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    pub fn invalid_params(message: impl Into<String>) -> Self {
        Self::new(INVALID_PARAMS, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(INTERNAL_ERROR, message)
    }
}

/// One incoming message.
#[derive(Debug, PartialEq)]
pub enum Incoming {
    Request {
        id: Value,
        method: String,
        params: Value,
    },
    Notification {
        method: String,
        params: Value,
    },
    /// A response or error from the client: Codex's server closes the connection on one (the
    /// server sends no requests of its own here).
    Response,
}

/// Parses one message (not a batch). `Err` is the error to answer with `id: -1`.
pub fn parse_one(value: Value) -> Result<Incoming, RpcError> {
    let Value::Object(mut m) = value else {
        return Err(RpcError::new(
            INVALID_REQUEST,
            "a JSON-RPC message must be an object",
        ));
    };
    let params = m.remove("params").unwrap_or(Value::Null);
    match (m.remove("method"), m.remove("id")) {
        (Some(Value::String(method)), Some(id @ (Value::Number(_) | Value::String(_)))) => {
            Ok(Incoming::Request { id, method, params })
        }
        (Some(Value::String(method)), None) => Ok(Incoming::Notification { method, params }),
        (Some(Value::String(_)), Some(_)) => Err(RpcError::new(
            INVALID_REQUEST,
            "`id` must be a number or a string",
        )),
        (Some(_), _) => Err(RpcError::new(INVALID_REQUEST, "`method` must be a string")),
        (None, Some(_)) if m.contains_key("result") || m.contains_key("error") => {
            Ok(Incoming::Response)
        }
        (None, _) => Err(RpcError::new(INVALID_REQUEST, "a message needs a `method`")),
    }
}

/// What a text frame (or line) holds: one message, a batch, or something that is no JSON.
pub enum Frame {
    One(Value),
    Batch(Vec<Value>),
}

/// Parses a frame's text; `Err` is the error to answer with `id: -1`.
pub fn parse_frame(text: &str) -> Result<Frame, RpcError> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Array(items)) if items.is_empty() => {
            Err(RpcError::new(INVALID_REQUEST, "an empty batch"))
        }
        Ok(Value::Array(items)) => Ok(Frame::Batch(items)),
        Ok(v) => Ok(Frame::One(v)),
        Err(e) => Err(RpcError::new(
            INVALID_REQUEST,
            format!("malformed JSON-RPC message: {e}"),
        )),
    }
}

pub fn result(id: Value, result: Value) -> Value {
    json!({ "id": id, "result": result })
}

pub fn error(id: Value, e: &RpcError) -> Value {
    json!({ "id": id, "error": { "code": e.code, "message": e.message } })
}

pub fn notification(method: &str, params: Value) -> Value {
    let mut m = Map::new();
    m.insert("method".into(), Value::String(method.into()));
    m.insert("params".into(), params);
    Value::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_notifications_and_responses_are_told_apart() {
        let r = parse_one(json!({"id": 3, "method": "process/read", "params": {"a": 1}})).unwrap();
        assert_eq!(
            r,
            Incoming::Request {
                id: json!(3),
                method: "process/read".into(),
                params: json!({"a": 1})
            }
        );
        let n = parse_one(json!({"jsonrpc": "2.0", "method": "initialized"})).unwrap();
        assert_eq!(
            n,
            Incoming::Notification {
                method: "initialized".into(),
                params: Value::Null
            }
        );
        assert_eq!(
            parse_one(json!({"id": "x", "result": {}})).unwrap(),
            Incoming::Response
        );
        assert_eq!(parse_one(json!([1])).unwrap_err().code, INVALID_REQUEST);
        assert_eq!(
            parse_one(json!({"id": 1, "method": 5})).unwrap_err().code,
            INVALID_REQUEST
        );
        // A null id is no id a response could carry back.
        assert_eq!(
            parse_one(json!({"id": null, "method": "m"}))
                .unwrap_err()
                .code,
            INVALID_REQUEST
        );
    }

    #[test]
    fn output_has_no_jsonrpc_member() {
        let v = result(json!(1), json!({}));
        assert_eq!(v.to_string(), r#"{"id":1,"result":{}}"#);
        let e = error(json!(-1), &RpcError::new(INVALID_REQUEST, "bad"));
        assert_eq!(
            e.to_string(),
            r#"{"id":-1,"error":{"code":-32600,"message":"bad"}}"#
        );
        assert!(matches!(
            parse_frame("{"),
            Err(RpcError {
                code: INVALID_REQUEST,
                ..
            })
        ));
        assert!(parse_frame("[]").is_err());
    }
}
