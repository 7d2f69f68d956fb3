//! Opening a session (OpenSession): the request checked, the caller's rule applied (modes,
//! roots, caps), the policy resolved as the caller, the worker started, the session stored.

use crate::api;
use crate::daemon::caller::identity::{Caller, RootCallers, worker_identity};
use crate::daemon::error::CallError;
use crate::daemon::pipeline::admit::CorralService;
use crate::daemon::session::sessions::{self, Session, StoreError};

impl CorralService {
    pub(in crate::daemon) async fn open(
        &self,
        caller: Caller,
        req: api::OpenSessionRequest,
    ) -> Result<api::OpenSessionResponse, CallError> {
        crate::daemon::caller::peer::refuse_if_in_a_corral_sandbox(caller)?;
        let mut opening = sessions::validate(&req)?;
        let id = sessions::new_session_id()
            .map_err(|e| CallError::Internal(format!("cannot draw a random session id: {e}")))?;
        let mode_given = req.mode != api::SandboxMode::Unspecified as i32;
        let asked = &mut opening.sandbox;
        self.executor.resolve_profile(asked, mode_given)?;
        asked.owner_uid = caller.uid;
        asked.env = crate::daemon::session::environment::session_env(
            caller.uid,
            std::mem::take(&mut asked.env),
        );
        asked.identity = worker_identity(caller, self.root_callers)?;
        let rule = self.rule_for(caller, asked.identity.as_ref());
        rule.check_mode(asked.mode).map_err(CallError::Denied)?;
        if self.sessions.owned_by(caller.uid) >= rule.max_sessions {
            return Err(CallError::exhausted(format!(
                "uid {} already has {} open sessions, the most policy rule `{}` allows; close some",
                caller.uid, rule.max_sessions, rule.name
            )));
        }
        if caller.uid == 0
            && self.root_callers == RootCallers::Confined
            && asked.mode == crate::sandbox::policy::Mode::DangerFullAccess
        {
            return Err(CallError::Denied(
                "root callers may use the sandboxed modes only (root_callers = confined); \
                 danger-full-access for root needs root_callers = trusted"
                    .into(),
            ));
        }
        if asked.mode == crate::sandbox::policy::Mode::DangerFullAccess {
            crate::daemon::caller::peer::refuse_if_sandboxed(caller)?;
        }
        asked.rule = Some(rule.clone());
        let policy = self.executor.policy_for(&opening.sandbox).await?;
        // H10: the operator's `roots_under` holds for the canonical form of every root the
        // session really gets, from every source (cwd, writable_roots, TMPDIR, /tmp).
        for dir in std::iter::once(&policy.cwd).chain(&policy.writable_roots) {
            rule.check_root(dir).map_err(CallError::Denied)?;
        }
        let paths = |v: &[std::path::PathBuf]| -> Vec<String> {
            v.iter().map(|p| p.to_string_lossy().into_owned()).collect()
        };
        let writable_roots = paths(&policy.writable_roots);
        let skipped_writable_roots = paths(&policy.skipped_roots);
        let full = |n| {
            CallError::exhausted(format!(
                "too many open sessions ({n}); close sessions you no longer use"
            ))
        };
        if self.sessions.len() >= self.sessions.max_sessions() {
            return Err(full(self.sessions.max_sessions()));
        }
        self.check_worker_cap(caller.uid, Some(&rule), &policy)
            .await?;
        let mut policy = policy;
        self.executor.open(&mut policy).await?;
        let session = match self
            .sessions
            .insert(Session::new(id, opening, policy.clone()))
        {
            Ok(s) => s,
            Err(StoreError::Full(n)) => {
                self.executor.pool().release(&policy).await;
                return Err(full(n));
            }
        };
        tracing::info!(session = %session.id, uid = caller.uid, pid = caller.pid, cwd = %session.cwd().display(), mode = session.mode().as_str(), "session opened");
        Ok(api::OpenSessionResponse {
            session_id: session.id.clone(),
            skipped_writable_roots,
            writable_roots,
        })
    }
}
