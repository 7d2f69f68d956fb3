//! `fs/*` on corral's Files service. Each call runs in the corral session for the sandbox it
//! carries (`sandbox: null`, which Codex 0.171 sends on its reads: a read-only session at the
//! front's cwd — it reads what the user can, and writes nothing), so a write is confined exactly
//! like the session's commands: inside the writable roots, never to `.git`, `.codex`, `.agents`.

use super::handlers::{Front, rpc_error, string};
use super::rpc::RpcError;
use super::sandbox;
use super::sessions::ExecSession;
use super::uri;
use crate::api::{self, EntryKind, files_client::FilesClient};
use base64::Engine;
use serde_json::{Value, json};

/// The methods served here (the rest of `fs/*` answers METHOD_NOT_FOUND).
pub fn serves(method: &str) -> bool {
    matches!(
        method,
        "fs/readFile"
            | "fs/writeFile"
            | "fs/getMetadata"
            | "fs/readDirectory"
            | "fs/createDirectory"
            | "fs/remove"
            | "fs/copy"
    )
}

pub async fn call(
    front: &Front,
    s: &ExecSession,
    method: &str,
    params: Value,
) -> Result<Value, RpcError> {
    let session = session_of(front, s, &params).await?;
    let mut files =
        FilesClient::new(s.channel()).max_decoding_message_size(crate::client::MAX_MESSAGE_BYTES);
    let path = |field: &str| -> Result<String, RpcError> {
        Ok(
            uri::to_path(field, params.get(field).unwrap_or(&Value::Null))?
                .to_string_lossy()
                .into_owned(),
        )
    };
    let flag = |field: &str| params.get(field).and_then(Value::as_bool).unwrap_or(false);
    match method {
        "fs/readFile" => {
            let r = files
                .read_bytes(api::ReadBytesRequest {
                    session_id: session,
                    path: path("path")?,
                })
                .await
                .map_err(|st| rpc_error(&st))?
                .into_inner();
            Ok(json!({ "dataBase64": base64::engine::general_purpose::STANDARD.encode(r.data) }))
        }
        "fs/writeFile" => {
            let data = base64::engine::general_purpose::STANDARD
                .decode(string(&params, "dataBase64")?)
                .map_err(|e| {
                    RpcError::invalid_params(format!("`dataBase64` is not base64: {e}"))
                })?;
            files
                .write_bytes(api::WriteBytesRequest {
                    session_id: session,
                    path: path("path")?,
                    data,
                    ..Default::default()
                })
                .await
                .map_err(|st| rpc_error(&st))?;
            Ok(json!({}))
        }
        "fs/getMetadata" => {
            let p = path("path")?;
            let stat = |follow| {
                let mut files = files.clone();
                let (session, p) = (session.clone(), p.clone());
                async move {
                    files
                        .stat(api::StatRequest {
                            session_id: session,
                            path: p,
                            follow_symlinks: follow,
                        })
                        .await
                        .map(tonic::Response::into_inner)
                        .map_err(|st| rpc_error(&st))
                }
            };
            let link = stat(false).await?;
            let is_symlink = link.kind() == EntryKind::Symlink;
            // A symlink is reported as what it leads to, and as a symlink.
            let target = if is_symlink {
                stat(true).await.unwrap_or(link.clone())
            } else {
                link
            };
            Ok(json!({
                "isDirectory": target.kind() == EntryKind::Directory,
                "isFile": target.kind() == EntryKind::File,
                "isSymlink": is_symlink,
                "size": target.size,
                "createdAtMs": target.created_ms,
                "modifiedAtMs": target.modified_ms,
            }))
        }
        "fs/readDirectory" => {
            let r = files
                .list_directory(api::ListDirectoryRequest {
                    session_id: session,
                    path: path("path")?,
                })
                .await
                .map_err(|st| rpc_error(&st))?
                .into_inner();
            let entries: Vec<Value> = r
                .entries
                .iter()
                .map(|e| {
                    json!({
                        "fileName": e.name,
                        "isDirectory": e.kind() == EntryKind::Directory,
                        "isFile": e.kind() == EntryKind::File,
                    })
                })
                .collect();
            Ok(json!({ "entries": entries }))
        }
        "fs/createDirectory" => {
            files
                .make_directory(api::MakeDirectoryRequest {
                    session_id: session,
                    path: path("path")?,
                    recursive: flag("recursive"),
                })
                .await
                .map_err(|st| rpc_error(&st))?;
            Ok(json!({}))
        }
        "fs/remove" => {
            files
                .remove(api::RemoveRequest {
                    session_id: session,
                    path: path("path")?,
                    recursive: flag("recursive"),
                    force: flag("force"),
                })
                .await
                .map_err(|st| rpc_error(&st))?;
            Ok(json!({}))
        }
        "fs/copy" => {
            files
                .copy(api::CopyRequest {
                    session_id: session,
                    source_path: path("sourcePath")?,
                    destination_path: path("destinationPath")?,
                    recursive: flag("recursive"),
                })
                .await
                .map_err(|st| rpc_error(&st))?;
            Ok(json!({}))
        }
        other => Err(RpcError::new(
            super::rpc::METHOD_NOT_FOUND,
            format!("corral's exec-server does not implement `{other}`"),
        )),
    }
}

/// The corral session a call runs in: the one for its sandbox, or a read-only one at the
/// front's cwd when it carries none.
async fn session_of(front: &Front, s: &ExecSession, params: &Value) -> Result<String, RpcError> {
    let spec = match params.get("sandbox").filter(|v| !v.is_null()) {
        Some(sandbox) => sandbox::session_for(sandbox, &front.cwd, front.max)?,
        None => sandbox::read_only_at(&front.cwd),
    };
    s.corral_session(&spec).await
}
