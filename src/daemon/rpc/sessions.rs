//! The Sessions service's gRPC face.

use crate::api::{self, sessions_server::Sessions};
use crate::calls;
use crate::daemon::caller::identity::{RootCallers, worker_identity};
use crate::daemon::pipeline::admit::CorralService;
use crate::daemon::rpc::status::invalid_field;
use crate::daemon::session::sessions::{self, StoreError};
use tonic::{Request, Response, Status};

#[tonic::async_trait]
impl Sessions for CorralService {
    async fn open_session(
        &self,
        request: Request<api::OpenSessionRequest>,
    ) -> Result<Response<api::OpenSessionResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        crate::daemon::caller::peer::refuse_if_in_a_corral_sandbox(caller)?;
        let req = request.into_inner();
        let mut session =
            sessions::validate(&req).map_err(|e| invalid_field(&e.field, &e.message))?;
        session.id = sessions::new_session_id()
            .map_err(|e| Status::internal(format!("cannot draw a random session id: {e}")))?;
        let mode_given = req.mode != api::SandboxMode::Unspecified as i32;
        self.executor.resolve_profile(&mut session, mode_given)?;
        session.owner_uid = caller.uid;
        session.env = crate::daemon::session::environment::session_env(
            caller.uid,
            std::mem::take(&mut session.env),
        );
        session.identity = worker_identity(caller, self.root_callers)?;
        let rule = self.rule_for(caller, session.identity.as_ref());
        rule.check_mode(session.mode)
            .map_err(Status::permission_denied)?;
        if self.sessions.owned_by(caller.uid) >= rule.max_sessions {
            return Err(Status::resource_exhausted(format!(
                "uid {} already has {} open sessions, the most policy rule `{}` allows; close some",
                caller.uid, rule.max_sessions, rule.name
            )));
        }
        session.rule = Some(rule);
        if caller.uid == 0
            && self.root_callers == RootCallers::Confined
            && session.mode == crate::sandbox::policy::Mode::DangerFullAccess
        {
            return Err(Status::permission_denied(
                "root callers may use the sandboxed modes only (root_callers = confined); \
                 danger-full-access for root needs root_callers = trusted",
            ));
        }
        if session.mode == crate::sandbox::policy::Mode::DangerFullAccess {
            crate::daemon::caller::peer::refuse_if_sandboxed(caller)?;
        }
        let policy = self.executor.policy_for(&session).await?;
        // H10: the operator's `roots_under` holds for the canonical form of every root the
        // session really gets, from every source (cwd, writable_roots, TMPDIR, /tmp).
        if let Some(rule) = &session.rule {
            for dir in std::iter::once(&policy.cwd).chain(&policy.writable_roots) {
                rule.check_root(dir).map_err(Status::permission_denied)?;
            }
        }
        let paths = |v: &[std::path::PathBuf]| -> Vec<String> {
            v.iter().map(|p| p.to_string_lossy().into_owned()).collect()
        };
        let writable_roots = paths(&policy.writable_roots);
        let skipped_writable_roots = paths(&policy.skipped_roots);
        let full = |n| {
            Status::resource_exhausted(format!(
                "too many open sessions ({n}); close sessions you no longer use"
            ))
        };
        if self.sessions.len() >= self.sessions.max_sessions() {
            return Err(full(self.sessions.max_sessions()));
        }
        self.check_worker_cap(caller.uid, session.rule.as_ref(), &policy)
            .await?;
        let mut policy = policy;
        self.executor.open(&mut policy).await?;
        session.policy = Some(policy.clone());
        let session = match self.sessions.insert(session) {
            Ok(s) => s,
            Err(StoreError::Full(n)) => {
                self.executor.pool().release(&policy).await;
                return Err(full(n));
            }
        };
        tracing::info!(session = %session.id, uid = caller.uid, pid = caller.pid, cwd = %session.cwd.display(), mode = session.mode.as_str(), "session opened");
        Ok(Response::new(api::OpenSessionResponse {
            session_id: session.id.clone(),
            skipped_writable_roots,
            writable_roots,
        }))
    }

    async fn close_session(
        &self,
        request: Request<api::CloseSessionRequest>,
    ) -> Result<Response<api::CloseSessionResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        let id = request.into_inner().session_id;
        self.session(&id, caller)?;
        if let Some(session) = self.sessions.remove(&id) {
            self.executor.close(&session).await;
        }
        tracing::info!(session = %id, "session closed");
        Ok(Response::new(api::CloseSessionResponse {}))
    }

    async fn list_sessions(
        &self,
        request: Request<api::ListSessionsRequest>,
    ) -> Result<Response<api::ListSessionsResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        // A session id is a capability: a sandboxed caller that found a wider session's id
        // could use it. Such a caller sees none.
        if crate::daemon::caller::peer::is_sandboxed(caller.pid, caller.uid) {
            return Err(Status::permission_denied(
                "ListSessions is refused to a caller that runs inside a sandbox",
            ));
        }
        // A credential that may not have danger-full-access does not see such sessions.
        let full = crate::daemon::caller::peer::full_access_refusal(caller).is_none();
        let sessions = self
            .sessions
            .list_owned(caller.uid)
            .into_iter()
            .filter(|(s, _)| full || s.mode != crate::sandbox::policy::Mode::DangerFullAccess)
            .map(|(s, idle)| {
                let policy = s.current_policy();
                let paths = |v: &[std::path::PathBuf]| -> Vec<String> {
                    v.iter().map(|p| p.to_string_lossy().into_owned()).collect()
                };
                api::SessionInfo {
                    session_id: s.id.clone(),
                    cwd: policy.as_ref().map_or_else(
                        || s.cwd.to_string_lossy().into_owned(),
                        |p| p.cwd.to_string_lossy().into_owned(),
                    ),
                    mode: match s.mode {
                        crate::sandbox::policy::Mode::ReadOnly => api::SandboxMode::ReadOnly,
                        crate::sandbox::policy::Mode::WorkspaceWrite => {
                            api::SandboxMode::WorkspaceWrite
                        }
                        crate::sandbox::policy::Mode::DangerFullAccess => {
                            api::SandboxMode::DangerFullAccess
                        }
                    } as i32,
                    writable_roots: policy
                        .as_ref()
                        .map_or_else(Vec::new, |p| paths(&p.writable_roots)),
                    network_access: s.network_access,
                    profile: s.profile.clone(),
                    tools: s.tools.names().into_iter().map(String::from).collect(),
                    idle_seconds: idle.as_secs(),
                }
            })
            .collect();
        Ok(Response::new(api::ListSessionsResponse { sessions }))
    }

    async fn get_capabilities(
        &self,
        request: Request<api::GetCapabilitiesRequest>,
    ) -> Result<Response<api::GetCapabilitiesResponse>, Status> {
        self.auth.caller_of(&request)?;
        Ok(Response::new(api::GetCapabilitiesResponse {
            api_version: "corral.v1".into(),
            server_version: env!("CARGO_PKG_VERSION").into(),
            tools: calls::tool_names().into_iter().map(String::from).collect(),
            default_session_tools: calls::ToolSet::default()
                .names()
                .into_iter()
                .map(String::from)
                .collect(),
            layers: match self.host_layers.as_ref() {
                Ok(layers) => layers.clone(),
                Err(e) => vec![api::Layer {
                    // The layer the §6 message names, when it has that shape.
                    name: e
                        .strip_prefix("sandbox unavailable: ")
                        .and_then(|rest| rest.split_once(" could not be applied"))
                        .map_or("sandbox", |(layer, _)| layer)
                        .into(),
                    status: api::LayerStatus::Unavailable as i32,
                    detail: e.clone(),
                }],
            },
            landlock_abi: crate::sandbox::landlock::kernel_abi().unwrap_or(0),
            session_idle_timeout_seconds: self.sessions.idle_timeout().as_secs(),
            profiles: self.executor.profiles().names().map(String::from).collect(),
            max_sessions: self.sessions.max_sessions() as u64,
        }))
    }
}
