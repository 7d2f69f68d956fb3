//! The sandbox Codex asks for on each call (`FileSystemSandboxContext`, as Codex 0.171 sends
//! it) → the corral session that enforces it. corral's modes are coarser than Codex's entry
//! lists, so the rule is: the session is never wider than what was asked, nor than the front's
//! ceiling (`--max-mode`); an entry corral cannot enforce fails the call, saying which.
//!
//! What maps:
//! - `permissions.type = "disabled"` or `"external"`, `file_system.type = "unrestricted"`, or
//!   no sandbox on a process: danger-full-access.
//! - `managed` + `restricted` with `{special root} read`: read-only; plus `{special
//!   project_roots} write` (or explicit `{path} write` entries): workspace-write, the workspace
//!   roots (and those paths) writable; `slash_tmp` / `tmpdir` write: `/tmp` / `$TMPDIR` too.
//! - `project_roots` subpaths `.git`, `.codex`, `.agents`, `.aws` read-only: corral protects
//!   those itself. Any other read-only subpath is refused while it exists in a root (corral
//!   cannot keep it read-only); a missing one is accepted.
//! - `network = "enabled"`: the network on; anything else off.

use super::rpc::RpcError;
use super::uri;
use crate::api::SandboxMode;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Names corral keeps read-only at every writable root's top by itself.
const PROTECTED_BY_CORRAL: [&str; 4] = [".git", ".codex", ".agents", ".aws"];

/// The corral session a call needs (the front keeps one per distinct value).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionSpec {
    pub cwd: PathBuf,
    pub mode: Mode,
    /// Writable roots besides the cwd (workspace-write).
    pub writable_roots: Vec<PathBuf>,
    pub network: bool,
    pub slash_tmp: bool,
    pub tmpdir: bool,
}

/// corral's modes, ordered by what they allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mode {
    ReadOnly,
    WorkspaceWrite,
    DangerFullAccess,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::ReadOnly => "read-only",
            Mode::WorkspaceWrite => "workspace-write",
            Mode::DangerFullAccess => "danger-full-access",
        }
    }

    pub fn api(self) -> SandboxMode {
        match self {
            Mode::ReadOnly => SandboxMode::ReadOnly,
            Mode::WorkspaceWrite => SandboxMode::WorkspaceWrite,
            Mode::DangerFullAccess => SandboxMode::DangerFullAccess,
        }
    }
}

/// The session for a call whose sandbox is `sandbox` (JSON `null` or absent: none) and whose
/// own working directory is `call_cwd`, within the ceiling `max`.
pub fn session_for(sandbox: &Value, call_cwd: &Path, max: Mode) -> Result<SessionSpec, RpcError> {
    let spec = requested(sandbox, call_cwd)?;
    if spec.mode > max {
        return Err(RpcError::invalid_params(format!(
            "Codex asked for a {} sandbox; this corral exec-server allows at most {} \
             (--max-mode). Run Codex with a narrower --sandbox, or start the front with a \
             wider --max-mode if the operator's policy allows it",
            spec.mode.name(),
            max.name()
        )));
    }
    Ok(spec)
}

/// The session for reads that carry no sandbox (`fs/*` with `sandbox: null`): read-only.
pub fn read_only_at(cwd: &Path) -> SessionSpec {
    SessionSpec {
        cwd: cwd.to_path_buf(),
        mode: Mode::ReadOnly,
        writable_roots: Vec::new(),
        network: false,
        slash_tmp: false,
        tmpdir: false,
    }
}

fn requested(sandbox: &Value, call_cwd: &Path) -> Result<SessionSpec, RpcError> {
    let cwd = match sandbox.get("cwd").filter(|v| !v.is_null()) {
        Some(v) => uri::to_path("sandbox.cwd", v)?,
        None => call_cwd.to_path_buf(),
    };
    let full = |network: bool| SessionSpec {
        cwd: cwd.clone(),
        mode: Mode::DangerFullAccess,
        writable_roots: Vec::new(),
        network,
        slash_tmp: true,
        tmpdir: true,
    };
    if sandbox.is_null() {
        return Ok(full(true));
    }
    let permissions = sandbox.get("permissions").unwrap_or(&Value::Null);
    let network = permissions.get("network").and_then(Value::as_str) == Some("enabled");
    match permissions.get("type").and_then(Value::as_str) {
        Some("disabled") | Some("external") => return Ok(full(true)),
        Some("managed") => {}
        other => {
            return Err(RpcError::invalid_params(format!(
                "sandbox.permissions.type {other:?} is not one corral understands \
                 (disabled, external, managed)"
            )));
        }
    }
    let fs = permissions.get("file_system").unwrap_or(&Value::Null);
    match fs.get("type").and_then(Value::as_str) {
        Some("unrestricted") => return Ok(full(network)),
        Some("restricted") => {}
        other => {
            return Err(RpcError::invalid_params(format!(
                "sandbox.permissions.file_system.type {other:?} is not one corral understands \
                 (restricted, unrestricted)"
            )));
        }
    }
    let workspace_roots: Vec<PathBuf> = match sandbox.get("workspaceRoots") {
        Some(Value::Array(roots)) => roots
            .iter()
            .map(|r| uri::to_path("sandbox.workspaceRoots[]", r))
            .collect::<Result<_, _>>()?,
        _ => vec![cwd.clone()],
    };
    let mut spec = SessionSpec {
        cwd: cwd.clone(),
        mode: Mode::ReadOnly,
        writable_roots: Vec::new(),
        network,
        slash_tmp: false,
        tmpdir: false,
    };
    let mut reads_root = false;
    let entries = fs.get("entries").and_then(Value::as_array);
    for entry in entries.into_iter().flatten() {
        let access = entry.get("access").and_then(Value::as_str).unwrap_or("");
        let path = entry.get("path").unwrap_or(&Value::Null);
        let unsupported = || {
            RpcError::invalid_params(format!(
                "corral cannot enforce the sandbox entry {entry}: it grants whole-disk reads, \
                 writes to whole directories, and keeps .git, .codex, .agents and .aws \
                 read-only"
            ))
        };
        match (path.get("type").and_then(Value::as_str), access) {
            (Some("special"), _) => {
                let value = path.get("value").unwrap_or(&Value::Null);
                let kind = value.get("kind").and_then(Value::as_str).unwrap_or("");
                let subpath = value.get("subpath").and_then(Value::as_str);
                match (kind, subpath, access) {
                    ("root", None, "read") => reads_root = true,
                    ("project_roots", None, "write") => spec.mode = Mode::WorkspaceWrite,
                    ("project_roots", None, "read") => {}
                    ("project_roots", Some(sub), "read") => {
                        let exists_in = workspace_roots
                            .iter()
                            .find(|r| std::fs::symlink_metadata(r.join(sub)).is_ok());
                        if let Some(root) =
                            exists_in.filter(|_| !PROTECTED_BY_CORRAL.contains(&sub))
                        {
                            return Err(RpcError::invalid_params(format!(
                                "Codex asked for {} to stay read-only; corral keeps only .git, \
                                 .codex, .agents and .aws read-only by itself, so it cannot enforce \
                                 this while that path exists",
                                root.join(sub).display()
                            )));
                        }
                    }
                    ("slash_tmp", None, "write") => spec.slash_tmp = true,
                    ("tmpdir", None, "write") => spec.tmpdir = true,
                    (_, _, "read") if kind != "root" => {}
                    _ => return Err(unsupported()),
                }
            }
            (Some("path"), "write") => {
                let p = uri::to_path(
                    "sandbox entry path",
                    path.get("path").unwrap_or(&Value::Null),
                )?;
                spec.mode = Mode::WorkspaceWrite;
                spec.writable_roots.push(p);
            }
            (Some("path"), "read") => {}
            _ => return Err(unsupported()),
        }
    }
    if !reads_root {
        return Err(RpcError::invalid_params(
            "corral cannot enforce a sandbox that does not read the whole disk (no `root` read \
             entry): corral's sandboxed modes read everything the user can",
        ));
    }
    if spec.mode == Mode::WorkspaceWrite {
        for root in workspace_roots {
            if root != spec.cwd && !spec.writable_roots.contains(&root) {
                spec.writable_roots.push(root);
            }
        }
    } else if !spec.writable_roots.is_empty() || spec.slash_tmp || spec.tmpdir {
        spec.mode = Mode::WorkspaceWrite;
    }
    spec.writable_roots.sort();
    spec.writable_roots.dedup();
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(kind: &str, sub: Option<&str>, access: &str) -> Value {
        let mut value = json!({"kind": kind});
        if let Some(s) = sub {
            value["subpath"] = json!(s);
        }
        json!({"path": {"type": "special", "value": value}, "access": access})
    }

    fn managed(entries: Vec<Value>, network: &str) -> Value {
        json!({
            "permissions": {"type": "managed",
                "file_system": {"type": "restricted", "entries": entries},
                "network": network},
            "cwd": "file:///work/ws",
            "workspaceRoots": ["file:///work/ws"],
        })
    }

    #[test]
    fn codex_workspace_write_maps_to_workspace_write() {
        let s = managed(
            vec![
                entry("root", None, "read"),
                entry("project_roots", None, "write"),
                entry("project_roots", Some(".git"), "read"),
                entry("project_roots", Some(".agents"), "read"),
                entry("project_roots", Some(".codex"), "read"),
                entry("project_roots", Some(".corral-test-missing"), "read"),
                entry("slash_tmp", None, "write"),
            ],
            "restricted",
        );
        let spec = session_for(&s, Path::new("/elsewhere"), Mode::WorkspaceWrite).unwrap();
        assert_eq!(spec.mode, Mode::WorkspaceWrite);
        assert_eq!(spec.cwd, PathBuf::from("/work/ws"));
        assert!(spec.writable_roots.is_empty());
        assert!(spec.slash_tmp && !spec.tmpdir && !spec.network);
    }

    #[test]
    fn read_only_and_network() {
        let s = managed(vec![entry("root", None, "read")], "enabled");
        let spec = session_for(&s, Path::new("/x"), Mode::ReadOnly).unwrap();
        assert_eq!((spec.mode, spec.network), (Mode::ReadOnly, true));
    }

    #[test]
    fn wider_than_the_ceiling_or_unenforceable_is_refused() {
        let full = json!({"permissions": {"type": "disabled"}});
        let e = session_for(&full, Path::new("/x"), Mode::WorkspaceWrite).unwrap_err();
        assert!(e.message.contains("--max-mode"), "{}", e.message);
        assert!(session_for(&Value::Null, Path::new("/x"), Mode::WorkspaceWrite).is_err());
        assert_eq!(
            session_for(&full, Path::new("/x"), Mode::DangerFullAccess)
                .unwrap()
                .mode,
            Mode::DangerFullAccess
        );
        let ww = managed(
            vec![
                entry("root", None, "read"),
                entry("project_roots", None, "write"),
            ],
            "restricted",
        );
        assert!(session_for(&ww, Path::new("/x"), Mode::ReadOnly).is_err());
        // No whole-disk read: corral cannot narrow reads.
        let narrow = managed(vec![entry("project_roots", None, "write")], "restricted");
        assert!(session_for(&narrow, Path::new("/x"), Mode::WorkspaceWrite).is_err());
        // A denied path inside.
        let deny = managed(
            vec![
                entry("root", None, "read"),
                json!({"path": {"type": "path", "path": "file:///etc"}, "access": "none"}),
            ],
            "restricted",
        );
        assert!(session_for(&deny, Path::new("/x"), Mode::WorkspaceWrite).is_err());
    }

    #[test]
    fn a_read_only_subpath_corral_does_not_protect_is_refused_while_it_exists() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(".ssh")).unwrap();
        let root = uri::from_path(dir.path());
        let mut s = managed(
            vec![
                entry("root", None, "read"),
                entry("project_roots", None, "write"),
                entry("project_roots", Some(".ssh"), "read"),
            ],
            "restricted",
        );
        s["cwd"] = json!(root);
        s["workspaceRoots"] = json!([root]);
        let e = session_for(&s, Path::new("/x"), Mode::WorkspaceWrite).unwrap_err();
        assert!(e.message.contains(".ssh"), "{}", e.message);
    }
}
