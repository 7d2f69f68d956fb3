//! Paths on the wire are `file://` URIs (Codex 0.171 rejects native paths); here they become
//! absolute paths and back.

use super::rpc::RpcError;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The absolute path a `file://` URI names. A native path, another scheme, a host, or a
/// relative path is refused with INVALID_PARAMS naming the field.
pub fn to_path(field: &str, value: &Value) -> Result<PathBuf, RpcError> {
    let Some(text) = value.as_str() else {
        return Err(RpcError::invalid_params(format!(
            "`{field}` must be a file:// URI string"
        )));
    };
    let url = url::Url::parse(text).map_err(|e| {
        RpcError::invalid_params(format!("`{field}` is not a file:// URI ({e}): {text:?}"))
    })?;
    if url.scheme() != "file" {
        return Err(RpcError::invalid_params(format!(
            "`{field}` must be a file:// URI, not {:?}",
            url.scheme()
        )));
    }
    url.to_file_path().map_err(|()| {
        RpcError::invalid_params(format!(
            "`{field}` must name a local absolute path: {text:?}"
        ))
    })
}

/// The `file://` URI of an absolute path.
pub fn from_path(path: &Path) -> String {
    url::Url::from_file_path(path)
        .map(String::from)
        .unwrap_or_else(|()| format!("file://{}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn uris_and_paths_round_trip_and_native_paths_are_refused() {
        let p = to_path("cwd", &json!("file:///tmp/a%20b/c")).unwrap();
        assert_eq!(p, PathBuf::from("/tmp/a b/c"));
        assert_eq!(from_path(&p), "file:///tmp/a%20b/c");
        assert_eq!(from_path(Path::new("/")), "file:///");
        for bad in [
            json!("/tmp/x"),
            json!("http://x/y"),
            json!("file://host/x"),
            json!(5),
        ] {
            let e = to_path("path", &bad).unwrap_err();
            assert_eq!(e.code, super::super::rpc::INVALID_PARAMS, "{bad}");
            assert!(e.message.contains("`path`"), "{}", e.message);
        }
    }
}
