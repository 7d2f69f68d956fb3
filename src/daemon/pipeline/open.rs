//! Opening a session (OpenSession): the request checked, the caller's rule applied (modes,
//! roots, caps), the policy resolved as the caller, the worker started, the session stored;
//! and a proxied session's network rules, set when it opens and changed later
//! (SetNetworkRules).

use crate::api;
use crate::daemon::caller::identity::{Caller, RootCallers, worker_identity};
use crate::daemon::egress::{PROXY_PORT, Registration, proxy_env};
use crate::daemon::error::CallError;
use crate::daemon::pipeline::admit::CorralService;
use crate::daemon::pipeline::audit::Outcome;
use crate::daemon::session::sessions::{self, SandboxRequest, Session, StoreError};
use crate::egress::rules::Rules;
use crate::sandbox::policy::Egress;
use std::sync::Arc;

impl CorralService {
    /// NETWORK_MODE_PROXY: the session's proxy with its rules (a malformed rule is the
    /// request's error, naming it), registered under the session's id; its sandbox gets the
    /// proxy's port and its commands the proxy variables.
    fn egress_for(
        &self,
        caller: Caller,
        id: &str,
        asked: &mut SandboxRequest,
    ) -> Result<Option<Registration>, CallError> {
        let Some(proxy) = &asked.proxy else {
            return Ok(None);
        };
        if asked.mode == crate::sandbox::policy::Mode::DangerFullAccess {
            return Err(CallError::invalid_field(
                "network_mode",
                &format!(
                    "profile `{}` is danger-full-access, which always has the host's network; \
                     NETWORK_MODE_PROXY needs a read-only or workspace-write profile",
                    asked.profile
                ),
            ));
        }
        let rules = rules_of(&proxy.allow, &proxy.deny)?;
        self.egress.check_bound(&rules)?;
        let (audit, session, uid) = (self.audit.clone(), id.to_string(), caller.uid);
        let registration = self.egress.register(
            id,
            (rules, &proxy.allow, &proxy.deny),
            Arc::new(move |decision| audit.egress(uid, &session, &decision)),
        );
        asked.egress = Some(Egress {
            port: PROXY_PORT,
            session: id.to_string(),
        });
        asked.env.extend(proxy_env(PROXY_PORT));
        Ok(Some(registration))
    }

    /// SetNetworkRules: a proxied session's new rules, for its next connections. A sandboxed
    /// caller (a command that found the session's id) may not widen any session's network.
    /// Every attempt, refused or not, is an audit line (what a session may reach is changing).
    pub(in crate::daemon) fn change_network_rules(
        &self,
        caller: Caller,
        req: &api::SetNetworkRulesRequest,
    ) -> Result<(), CallError> {
        let started = std::time::Instant::now();
        let result = self.replace_network_rules(caller, req);
        let outcome = match &result {
            Ok(()) => "ok".to_string(),
            Err(e) => Outcome::failed(e).name,
        };
        let rules: Vec<String> = (req.allow_domains.iter().map(|r| format!("allow {r}")))
            .chain(req.deny_domains.iter().map(|r| format!("deny {r}")))
            .collect();
        self.audit.network_rules(
            caller,
            caller.credential.and_then(|i| self.auth.name(i)),
            &req.session_id,
            rules,
            &outcome,
        );
        crate::daemon::metrics::call("set_network_rules", &outcome, started.elapsed());
        result
    }

    fn replace_network_rules(
        &self,
        caller: Caller,
        req: &api::SetNetworkRulesRequest,
    ) -> Result<(), CallError> {
        crate::daemon::caller::peer::refuse_if_sandboxed(caller)?;
        let session = self.session(&req.session_id, caller)?;
        let Some(egress) = &session.egress else {
            return Err(CallError::Unmet(format!(
                "session `{}` is not a NETWORK_MODE_PROXY session: it has no network rules to \
                 change (its network is {}); open a session with network_mode \
                 NETWORK_MODE_PROXY",
                session.id,
                if session.policy.network { "on" } else { "off" }
            )));
        };
        let rules = rules_of(&req.allow_domains, &req.deny_domains)?;
        self.egress.check_bound(&rules)?;
        egress.replace(rules, &req.allow_domains, &req.deny_domains);
        tracing::info!(session = %session.id, allow = ?req.allow_domains, deny = ?req.deny_domains, "network rules changed");
        Ok(())
    }

    /// GetEgressLog: a proxied session's latest decisions.
    pub(in crate::daemon) fn egress_log(
        &self,
        caller: Caller,
        session_id: &str,
    ) -> Result<api::GetEgressLogResponse, CallError> {
        let session = self.session(session_id, caller)?;
        match &session.egress {
            Some(egress) => Ok(egress.log()),
            None => Err(CallError::Unmet(format!(
                "session `{}` is not a NETWORK_MODE_PROXY session: it has no egress log",
                session.id
            ))),
        }
    }

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
        // A proxied session's proxy exists before its worker does: the worker's start places
        // the proxy's listener in its sandbox, and fails without it.
        let egress = self.egress_for(caller, &id, asked)?;
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
            .insert(Session::new(id, opening, policy.clone(), egress))
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

/// A proxy's rules from a request's lists; a malformed rule is INVALID_ARGUMENT naming it
/// (`allow_domains[1]`).
fn rules_of(allow: &[String], deny: &[String]) -> Result<Rules, CallError> {
    Rules::new(allow, deny).map_err(|e| {
        let (field, list) = match e.list {
            "deny" => ("deny_domains", deny),
            _ => ("allow_domains", allow),
        };
        let at = list.iter().position(|r| *r == e.rule).unwrap_or(0);
        CallError::invalid_field(&format!("{field}[{at}]"), &e.to_string())
    })
}
