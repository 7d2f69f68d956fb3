//! Approval policies (spec/sandbox.md §5.2): which command calls need the user's decision,
//! and the calls parked until it comes.
//!
//! corral never talks to a user. A call that needs a decision is parked here, keyed by a
//! 128-bit random id, and the client gets an approval request instead of a result; the call
//! runs only when the session's owner answers DecideApproval with an approval before the
//! deadline. The parked call is the exact call the client made, so a decision can never run
//! anything else. Parked calls are bounded per session and die with it.
//!
//! The rules themselves ([`before_run`], [`after_denial`]) are pure functions of the policy
//! and the facts the pipeline knows; `service.rs` applies them in its one call pipeline.

use crate::api;
pub use crate::calls::facts::Command;
use crate::daemon::caller::identity::Caller;
use crate::daemon::error::CallError;
use crate::daemon::session::sessions::FieldError;
use crate::daemon::session::sessions::Session;
use crate::sync::LockExt;
use crate::wire::worker_request::Call;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// What the model gets when the user denies a command or never answers: Codex normalises its
/// `rejected by user` to this for command tools (`codex-rs/core/src/tools/events.rs`).
pub const REJECTED_BY_USER: &str = "exec command rejected by user";

/// The reason shown for a retry after a sandbox denial (Codex's
/// `build_denial_reason_from_output`).
pub const RETRY_REASON: &str = "command failed; retry without sandbox?";

/// How long a parked call waits for a decision unless the session says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// The longest wait a session may ask for: one hour.
const MAX_TIMEOUT_MS: u64 = 3_600_000;

/// Calls one session may have waiting for a decision at once.
pub const MAX_PENDING: usize = 16;

/// Decided and expired ids remembered per session, so a second (or late) decision gets its
/// own clear error rather than NOT_FOUND; the oldest are forgotten first.
const MAX_SETTLED: usize = 256;

/// `approved_for_session` grants kept per session; past it, commands are simply asked again.
const MAX_GRANTS: usize = 1024;

/// Codex's `AskForApproval`, plus corral's behaviour before approval policies existed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// Nothing is asked; an escalation the model asks for runs if the operator allows it.
    #[default]
    Unset,
    Untrusted,
    OnFailure,
    OnRequest,
    Never,
}

impl Policy {
    /// The name Codex's refusal text uses (`{approval_policy:?}` of `AskForApproval`).
    pub fn codex_name(self) -> &'static str {
        match self {
            Policy::Untrusted => "UnlessTrusted",
            Policy::OnFailure => "OnFailure",
            Policy::OnRequest => "OnRequest",
            Policy::Never | Policy::Unset => "Never",
        }
    }

    /// Whether a sandbox denial may lead to a retry question under this policy.
    pub fn retries_after_denial(self) -> bool {
        matches!(self, Policy::Untrusted | Policy::OnFailure)
    }
}

/// What approving a request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `untrusted`: the command has not run; approved, it runs sandboxed.
    BeforeRun,
    /// The sandbox denied the command; approved, it runs again without the sandbox.
    RetryUnsandboxed,
    /// The model asked to run outside the sandbox (`on-request`); approved, it does.
    Escalate,
}

impl Kind {
    /// Whether approval runs the call outside the sandbox.
    pub fn unsandboxed(self) -> bool {
        !matches!(self, Kind::BeforeRun)
    }

    pub fn api(self) -> api::ApprovalKind {
        match self {
            Kind::BeforeRun => api::ApprovalKind::BeforeRun,
            Kind::RetryUnsandboxed => api::ApprovalKind::RetryUnsandboxed,
            Kind::Escalate => api::ApprovalKind::Escalate,
        }
    }

    /// The audit log's name of the question.
    pub fn audit_name(self) -> &'static str {
        match self {
            Kind::BeforeRun => "before_run",
            Kind::RetryUnsandboxed => "retry_unsandboxed",
            Kind::Escalate => "escalate",
        }
    }
}

/// The user's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Approved,
    ApprovedForSession,
    Denied,
}

impl Decision {
    /// `None` for UNSPECIFIED or a value this daemon does not know.
    pub fn from_api(value: i32) -> Option<Decision> {
        match api::ApprovalDecision::try_from(value) {
            Ok(api::ApprovalDecision::Approved) => Some(Decision::Approved),
            Ok(api::ApprovalDecision::ApprovedForSession) => Some(Decision::ApprovedForSession),
            Ok(api::ApprovalDecision::Denied) => Some(Decision::Denied),
            Ok(api::ApprovalDecision::Unspecified) | Err(_) => None,
        }
    }

    /// The audit log's name of the decision.
    pub fn audit_name(self) -> &'static str {
        match self {
            Decision::Approved => "approved",
            Decision::ApprovedForSession => "approved_for_session",
            Decision::Denied => "denied",
        }
    }
}

/// The session options: the policy and how long a question waits.
pub fn settings(req: &api::OpenSessionRequest) -> Result<(Policy, Duration), FieldError> {
    let policy = match api::ApprovalPolicy::try_from(req.approval_policy) {
        Ok(api::ApprovalPolicy::Unspecified) => Policy::Unset,
        Ok(api::ApprovalPolicy::Untrusted) => Policy::Untrusted,
        Ok(api::ApprovalPolicy::OnFailure) => Policy::OnFailure,
        Ok(api::ApprovalPolicy::OnRequest) => Policy::OnRequest,
        Ok(api::ApprovalPolicy::Never) => Policy::Never,
        Err(_) => {
            return Err(FieldError::new(
                "approval_policy",
                format!(
                    "approval_policy {} is not a known ApprovalPolicy (UNTRUSTED, ON_FAILURE, \
                     ON_REQUEST or NEVER)",
                    req.approval_policy
                ),
            ));
        }
    };
    let timeout = match req.approval_timeout_ms {
        None => DEFAULT_TIMEOUT,
        Some(ms) if (1..=MAX_TIMEOUT_MS).contains(&ms) => Duration::from_millis(ms),
        Some(ms) => {
            return Err(FieldError::new(
                "approval_timeout_ms",
                format!(
                    "approval_timeout_ms is {ms}; give 1 to {MAX_TIMEOUT_MS} (one hour), or leave \
                     it unset for 600000 (ten minutes)"
                ),
            ));
        }
    };
    Ok((policy, timeout))
}

/// The shell the session's worker runs scripts with: its user's login shell if that exists,
/// else `/bin/bash`, else `/bin/sh` (the worker's own rule, `default_user_shell`, seen from the
/// daemon), so the argv a user approves is the argv that runs.
pub fn shell_of(session: &Session) -> String {
    let uid = session
        .policy
        .identity
        .as_ref()
        .map_or_else(|| nix::unistd::geteuid().as_raw(), |i| i.uid);
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map(|u| u.shell)
        .filter(|s| !s.as_os_str().is_empty() && s.is_file())
        .or_else(|| {
            let bash = std::path::PathBuf::from("/bin/bash");
            bash.is_file().then_some(bash)
        })
        .map_or_else(
            || "/bin/sh".to_string(),
            |s| s.to_string_lossy().into_owned(),
        )
}

/// What `approved_for_session` granted for a command in a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Grant {
    /// It may run in the sandbox without asking.
    Sandboxed,
    /// It may also run outside the sandbox without asking.
    Unsandboxed,
}

/// What a governed call does before it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    Run {
        escalated: bool,
    },
    Ask(Kind),
    /// The model asked for escalation and may not have it: Codex's refusal text with this
    /// policy name.
    Refuse(&'static str),
}

/// §5.2's "before the first run" and "model asks for escalation" columns. `may_escalate`: the
/// operator allows this caller danger-full-access; `known_safe`: §9 says the argv only reads;
/// `grant`: what `approved_for_session` already covers.
pub fn before_run(
    policy: Policy,
    asks_escalation: bool,
    may_escalate: bool,
    known_safe: bool,
    grant: Option<Grant>,
) -> Gate {
    if asks_escalation {
        return match policy {
            // corral's behaviour before approval policies: the operator decides alone.
            Policy::Unset if may_escalate => Gate::Run { escalated: true },
            Policy::OnRequest if may_escalate => match grant {
                Some(Grant::Unsandboxed) => Gate::Run { escalated: true },
                _ => Gate::Ask(Kind::Escalate),
            },
            // Without the operator's leave nobody is asked: the refusal stands as before.
            Policy::Unset | Policy::OnRequest => Gate::Refuse(Policy::Never.codex_name()),
            Policy::Untrusted | Policy::OnFailure | Policy::Never => {
                Gate::Refuse(policy.codex_name())
            }
        };
    }
    match policy {
        Policy::Untrusted if !known_safe && grant.is_none() => Gate::Ask(Kind::BeforeRun),
        _ => Gate::Run { escalated: false },
    }
}

/// §5.2's "after a sandbox denial" column for a call that ran sandboxed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterDenial {
    /// The denial is the result.
    Stand,
    Ask,
    /// `approved_for_session` already covers running it unsandboxed.
    Retry,
}

pub fn after_denial(policy: Policy, may_escalate: bool, grant: Option<Grant>) -> AfterDenial {
    if !policy.retries_after_denial() || !may_escalate {
        return AfterDenial::Stand;
    }
    if grant == Some(Grant::Unsandboxed) {
        AfterDenial::Retry
    } else {
        AfterDenial::Ask
    }
}

/// A call waiting for a decision.
pub struct Parked {
    /// The exact call the client made: what approval runs.
    pub call: Call,
    pub kind: Kind,
    pub asks_escalation: bool,
    pub command: Command,
    pub request: api::ApprovalRequest,
    /// Who made the call (for the audit line when it expires unanswered).
    pub caller: Caller,
    pub expires: Instant,
}

enum Slot {
    Pending(Box<Parked>),
    Decided(Decision),
    /// Expired at this Unix time (ms).
    Expired(u64),
}

#[derive(Default)]
struct State {
    slots: HashMap<String, Slot>,
    /// Settled ids, oldest first (bounded by MAX_SETTLED).
    settled: VecDeque<String>,
    grants: HashMap<(Vec<String>, String), Grant>,
}

impl State {
    fn pending(&self) -> usize {
        self.slots
            .values()
            .filter(|s| matches!(s, Slot::Pending(_)))
            .count()
    }

    fn settle(&mut self, id: &str, slot: Slot) {
        self.slots.insert(id.to_string(), slot);
        self.settled.push_back(id.to_string());
        while self.settled.len() > MAX_SETTLED {
            if let Some(old) = self.settled.pop_front() {
                self.slots.remove(&old);
            }
        }
    }
}

/// Why a decision was not taken. Nothing runs in any of these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Unknown here: never issued, another session's or identity's, or long forgotten.
    NotFound,
    /// Decided before (with this decision).
    AlreadyDecided(Decision),
    /// Its deadline passed (Unix time, ms).
    Expired(u64),
}

impl Refusal {
    /// The answer to a decision refused for this reason: nothing ran.
    pub fn error(&self, id: &str) -> CallError {
        match self {
            Refusal::NotFound => CallError::NotFound(format!(
                "approval `{id}` not found in this session: it was never issued here, belongs \
                 to another session, or was settled long ago; nothing ran"
            )),
            Refusal::AlreadyDecided(d) => CallError::Unmet(format!(
                "approval `{id}` was already decided ({}); a decision is final and nothing ran \
                 again",
                d.audit_name()
            )),
            Refusal::Expired(at) => CallError::Expired(format!(
                "approval `{id}` expired at {} before a decision arrived; nothing ran. Give the \
                 model the request's rejected_output (`{REJECTED_BY_USER}`)",
                crate::daemon::pipeline::audit::rfc3339(
                    std::time::UNIX_EPOCH + std::time::Duration::from_millis(*at)
                ),
            )),
        }
    }
}

/// One session's approval state. Cheap to clone (shared).
#[derive(Clone, Default)]
pub struct SessionApprovals {
    pub policy: Policy,
    /// How long a parked call waits.
    pub timeout: Duration,
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for SessionApprovals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionApprovals")
            .field("policy", &self.policy)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl SessionApprovals {
    pub fn new(policy: Policy, timeout: Duration) -> Self {
        Self {
            policy,
            timeout,
            state: Arc::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Every update is a single insert or remove, so a poisoned lock is still consistent.
        self.state.locked()
    }

    /// Parks a call under `id`; `Err` with the limit when the session already has
    /// [`MAX_PENDING`] calls waiting.
    pub fn park(&self, id: &str, parked: Parked) -> Result<(), usize> {
        let mut state = self.state();
        if state.pending() >= MAX_PENDING {
            return Err(MAX_PENDING);
        }
        state
            .slots
            .insert(id.to_string(), Slot::Pending(Box::new(parked)));
        Ok(())
    }

    /// Takes the parked call `id` for `decision` (at `now`): it is settled whatever the
    /// decision, so it can be decided once only.
    pub fn take(&self, id: &str, decision: Decision, now: Instant) -> Result<Box<Parked>, Refusal> {
        let mut state = self.state();
        match state.slots.remove(id) {
            None => Err(Refusal::NotFound),
            Some(Slot::Decided(d)) => {
                state.slots.insert(id.to_string(), Slot::Decided(d));
                Err(Refusal::AlreadyDecided(d))
            }
            Some(Slot::Expired(at)) => {
                state.slots.insert(id.to_string(), Slot::Expired(at));
                Err(Refusal::Expired(at))
            }
            Some(Slot::Pending(parked)) if now >= parked.expires => {
                let at = parked.request.expires_at_unix_ms;
                state.settle(id, Slot::Expired(at));
                Err(Refusal::Expired(at))
            }
            Some(Slot::Pending(parked)) => {
                state.settle(id, Slot::Decided(decision));
                Ok(parked)
            }
        }
    }

    /// What [`SessionApprovals::take`] would refuse, without taking anything.
    pub fn check(&self, id: &str, now: Instant) -> Result<(), Refusal> {
        match self.state().slots.get(id) {
            None => Err(Refusal::NotFound),
            Some(Slot::Decided(d)) => Err(Refusal::AlreadyDecided(*d)),
            Some(Slot::Expired(at)) => Err(Refusal::Expired(*at)),
            Some(Slot::Pending(p)) if now >= p.expires => {
                Err(Refusal::Expired(p.request.expires_at_unix_ms))
            }
            Some(Slot::Pending(_)) => Ok(()),
        }
    }

    /// The deadline of `id` passed (or its session closed): if it is still waiting, it expires
    /// now and is returned for the audit line.
    pub fn expire(&self, id: &str) -> Option<Box<Parked>> {
        let mut state = self.state();
        match state.slots.remove(id) {
            Some(Slot::Pending(parked)) => {
                let at = parked.request.expires_at_unix_ms;
                state.settle(id, Slot::Expired(at));
                Some(parked)
            }
            Some(other) => {
                state.slots.insert(id.to_string(), other);
                None
            }
            None => None,
        }
    }

    /// Records `approved_for_session` for this command in this directory.
    pub fn grant(&self, command: &Command, grant: Grant) {
        let mut state = self.state();
        let key = (command.argv.clone(), command.cwd.clone());
        if !state.grants.contains_key(&key) && state.grants.len() >= MAX_GRANTS {
            return;
        }
        let entry = state.grants.entry(key).or_insert(grant);
        *entry = (*entry).max(grant);
    }

    /// What `approved_for_session` covers for this exact command in this directory (Codex keys
    /// its session approvals on the command and its cwd).
    pub fn granted(&self, command: &Command) -> Option<Grant> {
        self.state()
            .grants
            .get(&(command.argv.clone(), command.cwd.clone()))
            .copied()
    }
}

/// The Unix time in ms `after` from now.
pub fn unix_ms_after(after: Duration) -> u64 {
    (SystemTime::now() + after)
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A fresh approval id: 128 random bits as 32 hex digits.
pub fn new_id() -> Result<String, getrandom::Error> {
    crate::daemon::session::sessions::new_session_id()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Policy; 5] = [
        Policy::Unset,
        Policy::Untrusted,
        Policy::OnFailure,
        Policy::OnRequest,
        Policy::Never,
    ];

    /// §5.2's table, "before the first run": only untrusted asks, and not for a known-safe
    /// command or one approved for the session.
    #[test]
    fn before_the_first_run() {
        for policy in ALL {
            let want = if policy == Policy::Untrusted {
                Gate::Ask(Kind::BeforeRun)
            } else {
                Gate::Run { escalated: false }
            };
            assert_eq!(
                before_run(policy, false, true, false, None),
                want,
                "{policy:?}"
            );
            assert_eq!(
                before_run(policy, false, false, false, None),
                want,
                "{policy:?}"
            );
            assert_eq!(
                before_run(policy, false, true, true, None),
                Gate::Run { escalated: false },
                "known safe under {policy:?}"
            );
        }
        for grant in [Grant::Sandboxed, Grant::Unsandboxed] {
            assert_eq!(
                before_run(Policy::Untrusted, false, true, false, Some(grant)),
                Gate::Run { escalated: false }
            );
        }
    }

    /// §5.2's table, "model asks for escalation".
    #[test]
    fn escalation_requests() {
        assert_eq!(
            before_run(Policy::OnRequest, true, true, false, None),
            Gate::Ask(Kind::Escalate)
        );
        // A sandboxed grant does not cover running unsandboxed.
        assert_eq!(
            before_run(Policy::OnRequest, true, true, false, Some(Grant::Sandboxed)),
            Gate::Ask(Kind::Escalate)
        );
        assert_eq!(
            before_run(
                Policy::OnRequest,
                true,
                true,
                false,
                Some(Grant::Unsandboxed)
            ),
            Gate::Run { escalated: true }
        );
        // The operator does not allow it: no question, the refusal stands.
        assert_eq!(
            before_run(Policy::OnRequest, true, false, false, None),
            Gate::Refuse("Never")
        );
        for (policy, name) in [
            (Policy::Untrusted, "UnlessTrusted"),
            (Policy::OnFailure, "OnFailure"),
            (Policy::Never, "Never"),
        ] {
            for may in [true, false] {
                // Known safe or granted changes nothing: the model may not ask.
                assert_eq!(
                    before_run(policy, true, may, true, Some(Grant::Unsandboxed)),
                    Gate::Refuse(name),
                    "{policy:?}"
                );
            }
        }
        assert_eq!(
            before_run(Policy::Unset, true, true, false, None),
            Gate::Run { escalated: true }
        );
        assert_eq!(
            before_run(Policy::Unset, true, false, false, None),
            Gate::Refuse("Never")
        );
    }

    /// §5.2's table, "after a sandbox denial".
    #[test]
    fn after_a_sandbox_denial() {
        for policy in ALL {
            let asks = matches!(policy, Policy::Untrusted | Policy::OnFailure);
            let want = if asks {
                AfterDenial::Ask
            } else {
                AfterDenial::Stand
            };
            assert_eq!(after_denial(policy, true, None), want, "{policy:?}");
            assert_eq!(
                after_denial(policy, true, Some(Grant::Sandboxed)),
                want,
                "{policy:?}"
            );
            // Without the operator's leave there is no question.
            assert_eq!(after_denial(policy, false, None), AfterDenial::Stand);
            assert_eq!(
                after_denial(policy, false, Some(Grant::Unsandboxed)),
                AfterDenial::Stand
            );
        }
        assert_eq!(
            after_denial(Policy::OnFailure, true, Some(Grant::Unsandboxed)),
            AfterDenial::Retry
        );
    }

    fn session_opts(policy: i32, timeout: Option<u64>) -> api::OpenSessionRequest {
        api::OpenSessionRequest {
            approval_policy: policy,
            approval_timeout_ms: timeout,
            ..Default::default()
        }
    }

    #[test]
    fn session_settings_are_validated() {
        assert_eq!(
            settings(&session_opts(0, None)).unwrap(),
            (Policy::Unset, DEFAULT_TIMEOUT)
        );
        assert_eq!(
            settings(&session_opts(1, Some(5))).unwrap(),
            (Policy::Untrusted, Duration::from_millis(5))
        );
        assert_eq!(settings(&session_opts(4, None)).unwrap().0, Policy::Never);
        assert_eq!(
            settings(&session_opts(9, None)).unwrap_err().field,
            "approval_policy"
        );
        for bad in [0, MAX_TIMEOUT_MS + 1] {
            let e = settings(&session_opts(2, Some(bad))).unwrap_err();
            assert_eq!(e.field, "approval_timeout_ms");
            assert!(e.message.contains("3600000"), "{}", e.message);
        }
    }

    fn parked(expires: Instant) -> Parked {
        Parked {
            call: Call::Shell(api::ShellRequest::default()),
            kind: Kind::BeforeRun,
            asks_escalation: false,
            command: Command {
                argv: vec!["rm".into(), "x".into()],
                cwd: "/w".into(),
                justification: String::new(),
            },
            request: api::ApprovalRequest {
                expires_at_unix_ms: 42,
                ..Default::default()
            },
            caller: Caller {
                uid: 1,
                gid: 1,
                pid: None,
                credential: None,
                credential_sandboxed_only: false,
            },
            expires,
        }
    }

    #[test]
    fn a_parked_call_is_decided_once() {
        let a = SessionApprovals::new(Policy::Untrusted, DEFAULT_TIMEOUT);
        let later = Instant::now() + Duration::from_secs(60);
        a.park("id", parked(later)).unwrap();
        assert_eq!(
            a.take("nope", Decision::Approved, Instant::now()).err(),
            Some(Refusal::NotFound)
        );
        assert_eq!(a.check("id", Instant::now()), Ok(()));
        assert_eq!(a.check("nope", Instant::now()), Err(Refusal::NotFound));
        assert_eq!(a.check("id", later), Err(Refusal::Expired(42)));
        assert!(a.take("id", Decision::Denied, Instant::now()).is_ok());
        assert_eq!(
            a.check("id", Instant::now()),
            Err(Refusal::AlreadyDecided(Decision::Denied))
        );
        assert_eq!(
            a.take("id", Decision::Approved, Instant::now()).err(),
            Some(Refusal::AlreadyDecided(Decision::Denied))
        );
        assert!(a.expire("id").is_none(), "a decided call does not expire");
    }

    #[test]
    fn a_late_decision_finds_it_expired() {
        let a = SessionApprovals::new(Policy::Untrusted, DEFAULT_TIMEOUT);
        let now = Instant::now();
        a.park("id", parked(now)).unwrap();
        assert_eq!(
            a.take("id", Decision::Approved, now).err(),
            Some(Refusal::Expired(42))
        );
        // And so it stays.
        assert_eq!(
            a.take("id", Decision::Approved, now).err(),
            Some(Refusal::Expired(42))
        );
        a.park("other", parked(now + Duration::from_secs(60)))
            .unwrap();
        assert!(a.expire("other").is_some());
        assert!(a.expire("other").is_none());
        assert_eq!(
            a.take("other", Decision::Approved, now).err(),
            Some(Refusal::Expired(42))
        );
    }

    #[test]
    fn pending_calls_are_bounded_and_settled_ids_forgotten_oldest_first() {
        let a = SessionApprovals::new(Policy::Untrusted, DEFAULT_TIMEOUT);
        let later = Instant::now() + Duration::from_secs(60);
        for i in 0..MAX_PENDING {
            a.park(&i.to_string(), parked(later)).unwrap();
        }
        assert_eq!(a.park("one more", parked(later)), Err(MAX_PENDING));
        a.take("0", Decision::Approved, Instant::now()).unwrap();
        a.park("one more", parked(later)).unwrap();
        // Settling frees room; settled ids are remembered up to a bound.
        for i in 1..MAX_PENDING {
            a.take(&i.to_string(), Decision::Denied, Instant::now())
                .unwrap();
        }
        a.take("one more", Decision::Denied, Instant::now())
            .unwrap();
        assert_eq!(
            a.take("1", Decision::Approved, Instant::now()).err(),
            Some(Refusal::AlreadyDecided(Decision::Denied))
        );
        for i in 0..MAX_SETTLED {
            let id = format!("s{i}");
            a.park(&id, parked(later)).unwrap();
            a.take(&id, Decision::Denied, Instant::now()).unwrap();
        }
        // "0" was settled first and is forgotten now.
        assert_eq!(
            a.take("0", Decision::Approved, Instant::now()).err(),
            Some(Refusal::NotFound)
        );
    }

    #[test]
    fn grants_are_per_command_and_directory_and_only_grow() {
        let a = SessionApprovals::new(Policy::OnFailure, DEFAULT_TIMEOUT);
        let c = parked(Instant::now()).command;
        assert_eq!(a.granted(&c), None);
        a.grant(&c, Grant::Unsandboxed);
        a.grant(&c, Grant::Sandboxed);
        assert_eq!(a.granted(&c), Some(Grant::Unsandboxed));
        let elsewhere = Command {
            cwd: "/other".into(),
            ..c.clone()
        };
        assert_eq!(a.granted(&elsewhere), None);
        let longer = Command {
            argv: vec!["rm".into(), "x".into(), "y".into()],
            ..c
        };
        assert_eq!(a.granted(&longer), None);
    }
}
