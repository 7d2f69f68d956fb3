//! The session table: 128-bit random ids, validation of OpenSession's input, idle expiry.

use crate::api;
use crate::sandbox::policy::{Mode, SandboxPolicy};
use crate::sync::LockExt;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a session's sandbox is built from: the request as validated, its profile, and whom
/// it is for. The path resolver turns it into the session's policy, as the caller; an
/// escalated call's danger-full-access policy and a refreshed one are built from it too.
#[derive(Debug, Clone)]
pub struct SandboxRequest {
    pub cwd: PathBuf,
    pub mode: Mode,
    pub writable_roots: Vec<PathBuf>,
    pub network_access: bool,
    pub exclude_tmpdir_env_var: bool,
    pub exclude_slash_tmp: bool,
    pub env: BTreeMap<String, String>,
    /// The sandbox profile's name (`sandbox-profiles/NAME.toml`).
    pub profile: String,
    /// The uid that opened the session; only it may use the session.
    pub owner_uid: u32,
    /// Who the session's worker runs as (`None`: the daemon's own identity, or root).
    pub identity: Option<crate::sandbox::policy::Identity>,
    /// The owner's policy rule (limits and its name for refusals). `None` only for the
    /// start-up probe, which stands for no caller.
    pub rule: Option<crate::daemon::caller::rules::Rule>,
    /// NETWORK_MODE_PROXY: the rules of the session's egress proxy, as the client wrote them.
    pub proxy: Option<ProxyRules>,
    /// The egress proxy's place in the sandbox, once the session has one (see
    /// [`SandboxPolicy::egress`]); copied into every policy resolved for the session.
    pub egress: Option<crate::sandbox::policy::Egress>,
}

/// A proxied session's allow and deny rules (`allow_domains`, `deny_domains`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyRules {
    pub allow: Vec<String>,
    pub deny: Vec<String>,
}

/// An OpenSession request, validated: the sandbox it asks for and the session's options.
#[derive(Debug)]
pub struct Opening {
    pub sandbox: SandboxRequest,
    pub tools: crate::calls::ToolSet,
    pub background_terminal_max_timeout_ms: u64,
    pub project_doc_max_bytes: u64,
    pub approvals: crate::daemon::pipeline::approvals::SessionApprovals,
}

/// What a session fixes for its calls. Built once, whole, when its policy is resolved.
#[derive(Debug)]
pub struct Session {
    pub id: String,
    /// What its sandbox was built from.
    pub sandbox: SandboxRequest,
    /// The effective sandbox policy computed at OpenSession, with its roots pinned: the mode,
    /// cwd and writable roots calls run with.
    pub policy: SandboxPolicy,
    /// The policy the session's calls use now: `policy` until protection changed (a protected
    /// name appeared) and the session moved to a worker built for the new state.
    live_policy: Mutex<SandboxPolicy>,
    /// Serialises moving the session to a new worker.
    pub refreshing: tokio::sync::Mutex<()>,
    /// The danger-full-access policy its escalated calls use, once one has run: the session
    /// holds that worker too, and releases it when it closes.
    pub escalated_policy: std::sync::OnceLock<SandboxPolicy>,
    /// Cancelled when the session closes or expires: its calls in flight are cancelled too
    /// (their process trees killed).
    pub closed: tokio_util::sync::CancellationToken,
    /// The tools the session offers (ListTools lists exactly these; Invoke refuses others).
    pub tools: crate::calls::ToolSet,
    /// The ceiling of an empty write_stdin poll (ms); 0: Codex's default.
    pub background_terminal_max_timeout_ms: u64,
    /// GetPromptContext's project-doc byte budget (0: no docs).
    pub project_doc_max_bytes: u64,
    /// Where its long-lived processes live (see `processes.rs`).
    pub processes: crate::daemon::session::processes::ProcessHomes,
    /// Workers the session left (its protection changed) but still holds, because processes
    /// it started live there; released when it closes.
    pub held_policies: Mutex<Vec<SandboxPolicy>>,
    /// The approval policy and the calls waiting for a decision (spec/sandbox.md §5.2).
    pub approvals: crate::daemon::pipeline::approvals::SessionApprovals,
    /// NETWORK_MODE_PROXY: the session's egress proxy, registered while the session lives.
    pub egress: Option<crate::daemon::egress::Registration>,
}

impl Session {
    pub fn new(
        id: String,
        opening: Opening,
        policy: SandboxPolicy,
        egress: Option<crate::daemon::egress::Registration>,
    ) -> Session {
        Session {
            id,
            sandbox: opening.sandbox,
            live_policy: Mutex::new(policy.clone()),
            policy,
            refreshing: Default::default(),
            escalated_policy: Default::default(),
            closed: Default::default(),
            tools: opening.tools,
            background_terminal_max_timeout_ms: opening.background_terminal_max_timeout_ms,
            project_doc_max_bytes: opening.project_doc_max_bytes,
            processes: Default::default(),
            held_policies: Default::default(),
            approvals: opening.approvals,
            egress,
        }
    }

    /// The session's mode (what it was opened with; an escalated call runs outside it).
    pub fn mode(&self) -> Mode {
        self.policy.mode
    }

    /// The session's working directory, as resolved for its policy.
    pub fn cwd(&self) -> &Path {
        &self.policy.cwd
    }

    pub fn owner_uid(&self) -> u32 {
        self.sandbox.owner_uid
    }

    pub fn rule(&self) -> Option<&crate::daemon::caller::rules::Rule> {
        self.sandbox.rule.as_ref()
    }

    /// The policy calls run under now (see `live_policy`).
    pub fn current_policy(&self) -> SandboxPolicy {
        self.live_policy.locked().clone()
    }

    /// The session's calls run under `policy` from now on.
    pub fn move_to(&self, policy: SandboxPolicy) {
        *self.live_policy.locked() = policy;
    }

    /// The longest command timeout the owner's policy rule allows, in milliseconds.
    pub fn timeout_ceiling_ms(&self) -> u64 {
        self.rule().map_or(u64::MAX, |r| r.timeout_ceiling_ms)
    }
}

/// A rejected OpenSession: the field and the reason (INVALID_ARGUMENT).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: &str, message: String) -> FieldError {
        FieldError {
            field: field.to_string(),
            message,
        }
    }
}

impl From<FieldError> for crate::daemon::error::CallError {
    fn from(e: FieldError) -> Self {
        crate::daemon::error::CallError::InvalidField {
            field: e.field,
            message: e.message,
        }
    }
}

/// The largest `background_terminal_max_timeout_ms` a session may ask for: one hour.
const MAX_BACKGROUND_TERMINAL_TIMEOUT_MS: u64 = 3_600_000;

/// Checks an OpenSession request: what it asks for, before the profile, the caller and the
/// policy are known.
pub fn validate(req: &api::OpenSessionRequest) -> Result<Opening, FieldError> {
    let mode = match api::SandboxMode::try_from(req.mode) {
        Ok(api::SandboxMode::ReadOnly) => Mode::ReadOnly,
        Ok(api::SandboxMode::WorkspaceWrite) => Mode::WorkspaceWrite,
        Ok(api::SandboxMode::DangerFullAccess) => Mode::DangerFullAccess,
        Ok(api::SandboxMode::Unspecified) if !req.profile.is_empty() => Mode::ReadOnly,
        Ok(api::SandboxMode::Unspecified) => {
            return Err(FieldError::new(
                "mode",
                "mode is required: SANDBOX_MODE_READ_ONLY, SANDBOX_MODE_WORKSPACE_WRITE or \
                 SANDBOX_MODE_DANGER_FULL_ACCESS"
                    .into(),
            ));
        }
        Err(_) => {
            return Err(FieldError::new(
                "mode",
                format!("mode {} is not a known SandboxMode", req.mode),
            ));
        }
    };
    if req.cwd.is_empty() {
        return Err(FieldError::new(
            "cwd",
            "cwd is required: an absolute path of an existing directory".into(),
        ));
    }
    let cwd = PathBuf::from(&req.cwd);
    if !cwd.is_absolute() {
        return Err(FieldError::new(
            "cwd",
            format!("cwd must be an absolute path, got `{}`", req.cwd),
        ));
    }
    // Whether the cwd exists and is a directory is decided by the path resolver, as the caller:
    // the root daemon never stats a caller's path (spec/sandbox.md §8.6 H5, H15).
    let mut writable_roots = Vec::with_capacity(req.writable_roots.len());
    for (i, root) in req.writable_roots.iter().enumerate() {
        if !Path::new(root).is_absolute() {
            return Err(FieldError::new(
                &format!("writable_roots[{i}]"),
                format!("writable_roots[{i}] must be an absolute path, got `{root}`"),
            ));
        }
        writable_roots.push(PathBuf::from(root));
    }
    let tools = tool_set(req)?;
    let (network_access, proxy) = network_of(req, mode)?;
    if req.background_terminal_max_timeout_ms > MAX_BACKGROUND_TERMINAL_TIMEOUT_MS {
        return Err(FieldError::new(
            "background_terminal_max_timeout_ms",
            format!(
                "background_terminal_max_timeout_ms is {}; at most {MAX_BACKGROUND_TERMINAL_TIMEOUT_MS} \
                 (one hour), or 0 for Codex's default",
                req.background_terminal_max_timeout_ms
            ),
        ));
    }
    let project_doc_max_bytes = project_doc_budget(
        "project_doc_max_bytes",
        req.project_doc_max_bytes,
        crate::tools::prompt_context::DEFAULT_PROJECT_DOC_MAX_BYTES,
    )?;
    let (approval_policy, approval_timeout) = crate::daemon::pipeline::approvals::settings(req)?;
    Ok(Opening {
        sandbox: SandboxRequest {
            cwd,
            mode,
            writable_roots,
            network_access,
            exclude_tmpdir_env_var: req.exclude_tmpdir_env_var,
            exclude_slash_tmp: req.exclude_slash_tmp,
            env: req
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            profile: req.profile.clone(),
            owner_uid: 0,
            identity: None,
            rule: None,
            proxy,
            egress: None,
        },
        tools,
        background_terminal_max_timeout_ms: req.background_terminal_max_timeout_ms,
        project_doc_max_bytes,
        approvals: crate::daemon::pipeline::approvals::SessionApprovals::new(
            approval_policy,
            approval_timeout,
        ),
    })
}

/// How a session reaches the network: on (danger-full-access always), off, or through the
/// egress proxy with its rules.
fn network_of(
    req: &api::OpenSessionRequest,
    mode: Mode,
) -> Result<(bool, Option<ProxyRules>), FieldError> {
    use api::NetworkMode;
    let full = mode == Mode::DangerFullAccess;
    let (on, proxied) = match NetworkMode::try_from(req.network_mode) {
        Ok(NetworkMode::Unspecified) => (req.network_access || full, false),
        Ok(NetworkMode::On) => (true, false),
        Ok(NetworkMode::Off | NetworkMode::Proxy) if req.network_access => {
            return Err(FieldError::new(
                "network_mode",
                "network_mode contradicts network_access: true; set only network_mode".into(),
            ));
        }
        Ok(NetworkMode::Off | NetworkMode::Proxy) if full => {
            return Err(FieldError::new(
                "network_mode",
                "danger-full-access always has the host's network; NETWORK_MODE_OFF and \
                 NETWORK_MODE_PROXY need read-only or workspace-write"
                    .into(),
            ));
        }
        Ok(NetworkMode::Off) => (false, false),
        Ok(NetworkMode::Proxy) => (false, true),
        Err(_) => {
            return Err(FieldError::new(
                "network_mode",
                format!(
                    "network_mode {} is not a known NetworkMode",
                    req.network_mode
                ),
            ));
        }
    };
    let has_rules = !req.allow_domains.is_empty() || !req.deny_domains.is_empty();
    if has_rules && !proxied {
        let field = if req.allow_domains.is_empty() {
            "deny_domains"
        } else {
            "allow_domains"
        };
        return Err(FieldError::new(
            field,
            format!(
                "{field} applies to NETWORK_MODE_PROXY only; set network_mode to \
                 NETWORK_MODE_PROXY (the CLI: --network proxy)"
            ),
        ));
    }
    let rules = proxied.then(|| ProxyRules {
        allow: req.allow_domains.clone(),
        deny: req.deny_domains.clone(),
    });
    Ok((on, rules))
}

/// A project-doc byte budget (OpenSession's, or GetPromptContext's override): unset is
/// `default`; at most `MAX_PROJECT_DOC_MAX_BYTES`.
pub fn project_doc_budget(
    field: &'static str,
    asked: Option<u64>,
    default: u64,
) -> Result<u64, FieldError> {
    use crate::tools::prompt_context::MAX_PROJECT_DOC_MAX_BYTES;
    match asked {
        None => Ok(default),
        Some(n) if n <= MAX_PROJECT_DOC_MAX_BYTES => Ok(n),
        Some(n) => Err(FieldError::new(
            field,
            format!(
                "{field} is {n}; at most {MAX_PROJECT_DOC_MAX_BYTES} (1 MiB), 0 for no project \
                 docs, or unset for Codex's default (32768)"
            ),
        )),
    }
}

/// The shell tool an API value names; UNSPECIFIED is Codex's default, unified exec.
pub fn shell_tool(value: i32) -> Result<crate::calls::ShellTool, String> {
    use crate::calls::ShellTool;
    match api::ShellTool::try_from(value) {
        Ok(api::ShellTool::Unspecified | api::ShellTool::UnifiedExec) => Ok(ShellTool::UnifiedExec),
        Ok(api::ShellTool::ShellCommand) => Ok(ShellTool::ShellCommand),
        Ok(api::ShellTool::Shell) => Ok(ShellTool::Shell),
        Ok(api::ShellTool::None) => Ok(ShellTool::None),
        Err(_) => Err(format!("shell_tool {value} is not a known ShellTool")),
    }
}

/// The session's tool set from OpenSession's options; unspecified options take Codex's defaults.
fn tool_set(req: &api::OpenSessionRequest) -> Result<crate::calls::ToolSet, FieldError> {
    use crate::calls::{ApplyPatchTool, ToolSet};
    let shell = shell_tool(req.shell_tool).map_err(|e| FieldError::new("shell_tool", e))?;
    let apply_patch = match api::ApplyPatchTool::try_from(req.apply_patch_tool) {
        Ok(api::ApplyPatchTool::Unspecified | api::ApplyPatchTool::Freeform) => {
            ApplyPatchTool::Freeform
        }
        Ok(api::ApplyPatchTool::Function) => ApplyPatchTool::Function,
        Ok(api::ApplyPatchTool::None) => ApplyPatchTool::None,
        Err(_) => {
            return Err(FieldError::new(
                "apply_patch_tool",
                format!(
                    "apply_patch_tool {} is not a known ApplyPatchTool",
                    req.apply_patch_tool
                ),
            ));
        }
    };
    let defaults = ToolSet::default();
    Ok(ToolSet {
        shell,
        apply_patch,
        update_plan: req.update_plan.unwrap_or(defaults.update_plan),
        view_image: req.view_image.unwrap_or(defaults.view_image),
        no_image_input: req.no_image_input,
    })
}

/// A fresh 128-bit session id from the OS CSPRNG, as 32 lowercase hex digits.
pub fn new_session_id() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

struct Entry {
    session: Arc<Session>,
    last_used: Instant,
}

/// The live sessions. Cheap to clone (shared).
#[derive(Clone)]
pub struct SessionStore {
    inner: Arc<Mutex<HashMap<String, Entry>>>,
    idle_timeout: Duration,
    max_sessions: usize,
}

/// Why a session could not be stored.
#[derive(Debug, PartialEq, Eq)]
pub enum StoreError {
    Full(usize),
}

impl SessionStore {
    pub fn new(idle_timeout: Duration, max_sessions: usize) -> Self {
        Self {
            inner: Arc::default(),
            idle_timeout,
            max_sessions,
        }
    }

    pub fn idle_timeout(&self) -> Duration {
        self.idle_timeout
    }

    pub fn max_sessions(&self) -> usize {
        self.max_sessions
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        // A panic while holding the lock cannot leave the map inconsistent (single inserts and
        // removes), so a poisoned lock is still safe to use.
        self.inner.locked()
    }

    pub fn insert(&self, session: Session) -> Result<Arc<Session>, StoreError> {
        let mut table = self.table();
        if table.len() >= self.max_sessions {
            return Err(StoreError::Full(self.max_sessions));
        }
        let session = Arc::new(session);
        table.insert(
            session.id.clone(),
            Entry {
                session: session.clone(),
                last_used: Instant::now(),
            },
        );
        Ok(session)
    }

    /// The live session with this id, marking it used; `None` if unknown, closed or expired
    /// (an expired one is removed by [`SessionStore::expire_idle`], which releases its worker).
    pub fn get(&self, id: &str) -> Option<Arc<Session>> {
        let mut table = self.table();
        let entry = table.get_mut(id)?;
        if entry.last_used.elapsed() > self.idle_timeout {
            return None;
        }
        entry.last_used = Instant::now();
        Some(entry.session.clone())
    }

    pub fn remove(&self, id: &str) -> Option<Arc<Session>> {
        let session = self.table().remove(id).map(|e| e.session)?;
        session.closed.cancel();
        Some(session)
    }

    /// Drops sessions idle longer than the timeout and returns them.
    pub fn expire_idle(&self) -> Vec<Arc<Session>> {
        let mut table = self.table();
        let expired: Vec<String> = table
            .iter()
            .filter(|(_, e)| e.last_used.elapsed() > self.idle_timeout)
            .map(|(id, _)| id.clone())
            .collect();
        expired
            .iter()
            .filter_map(|id| table.remove(id).map(|e| e.session))
            .inspect(|s| s.closed.cancel())
            .collect()
    }

    /// The live sessions `uid` owns with how long each has been idle, ordered by id.
    pub fn list_owned(&self, uid: u32) -> Vec<(Arc<Session>, Duration)> {
        let mut owned: Vec<_> = self
            .table()
            .values()
            .filter(|e| e.session.owner_uid() == uid && e.last_used.elapsed() <= self.idle_timeout)
            .map(|e| (e.session.clone(), e.last_used.elapsed()))
            .collect();
        owned.sort_by(|a, b| a.0.id.cmp(&b.0.id));
        owned
    }

    /// Open sessions owned by `uid`.
    pub fn owned_by(&self, uid: u32) -> usize {
        self.table()
            .values()
            .filter(|e| e.session.owner_uid() == uid)
            .count()
    }

    pub fn len(&self) -> usize {
        self.table().len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(cwd: &str, mode: api::SandboxMode) -> api::OpenSessionRequest {
        api::OpenSessionRequest {
            cwd: cwd.into(),
            mode: mode as i32,
            ..Default::default()
        }
    }

    #[test]
    fn validation_names_the_field() {
        let ro = api::SandboxMode::ReadOnly;
        assert_eq!(validate(&request("", ro)).unwrap_err().field, "cwd");
        assert!(
            validate(&request("rel", ro))
                .unwrap_err()
                .message
                .contains("absolute")
        );
        assert_eq!(
            validate(&request("/", api::SandboxMode::Unspecified))
                .unwrap_err()
                .field,
            "mode"
        );
        let mut r = request("/", ro);
        r.writable_roots = vec!["/tmp".into(), "rel".into()];
        assert_eq!(validate(&r).unwrap_err().field, "writable_roots[1]");
        assert_eq!(
            validate(&request("/", ro)).unwrap().sandbox.mode,
            Mode::ReadOnly
        );
    }

    #[test]
    fn project_doc_budget_defaults_and_bounds() {
        let ro = api::SandboxMode::ReadOnly;
        assert_eq!(
            validate(&request("/", ro)).unwrap().project_doc_max_bytes,
            32 * 1024
        );
        let mut r = request("/", ro);
        for ok in [0, 1, 1024 * 1024] {
            r.project_doc_max_bytes = Some(ok);
            assert_eq!(validate(&r).unwrap().project_doc_max_bytes, ok);
        }
        r.project_doc_max_bytes = Some(1024 * 1024 + 1);
        let e = validate(&r).unwrap_err();
        assert_eq!(e.field, "project_doc_max_bytes");
        assert!(e.message.contains("at most 1048576"), "{}", e.message);
    }

    #[test]
    fn ids_are_128_bit_hex_and_distinct() {
        let a = new_session_id().unwrap();
        let b = new_session_id().unwrap();
        assert_eq!(a.len(), 32);
        assert!(
            a.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert_ne!(a, b);
    }

    #[test]
    fn store_limits_and_expires() {
        let store = SessionStore::new(Duration::from_millis(50), 1);
        let session = |id: &str| {
            let opening = validate(&request("/", api::SandboxMode::ReadOnly)).unwrap();
            Session::new(
                id.into(),
                opening,
                SandboxPolicy::bare(Mode::ReadOnly, "/"),
                None,
            )
        };
        store.insert(session("a")).unwrap();
        assert_eq!(store.insert(session("b")).unwrap_err(), StoreError::Full(1));
        assert!(store.get("a").is_some());
        std::thread::sleep(Duration::from_millis(80));
        assert!(store.get("a").is_none());
        assert_eq!(store.expire_idle().len(), 1);
        assert!(store.is_empty());
    }
}
