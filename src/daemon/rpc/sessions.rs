//! The Sessions service's gRPC face.

use crate::api::{self, sessions_server::Sessions};
use crate::calls;
use crate::daemon::error::CallError;
use crate::daemon::pipeline::admit::CorralService;
use tonic::{Request, Response, Status};

#[tonic::async_trait]
impl Sessions for CorralService {
    async fn open_session(
        &self,
        request: Request<api::OpenSessionRequest>,
    ) -> Result<Response<api::OpenSessionResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        Ok(Response::new(
            self.open(caller, request.into_inner()).await?,
        ))
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

    async fn set_network_rules(
        &self,
        request: Request<api::SetNetworkRulesRequest>,
    ) -> Result<Response<api::SetNetworkRulesResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        self.change_network_rules(caller, request.get_ref())?;
        Ok(Response::new(api::SetNetworkRulesResponse {}))
    }

    async fn get_egress_log(
        &self,
        request: Request<api::GetEgressLogRequest>,
    ) -> Result<Response<api::GetEgressLogResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        Ok(Response::new(
            self.egress_log(caller, &request.get_ref().session_id)?,
        ))
    }

    async fn list_sessions(
        &self,
        request: Request<api::ListSessionsRequest>,
    ) -> Result<Response<api::ListSessionsResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        // A session id is a capability: a sandboxed caller that found a wider session's id
        // could use it. Such a caller sees none.
        if crate::daemon::caller::peer::is_sandboxed(caller.pid, caller.uid) {
            return Err(CallError::Denied(
                "ListSessions is refused to a caller that runs inside a sandbox".into(),
            )
            .into());
        }
        // A credential that may not have danger-full-access does not see such sessions.
        let full = crate::daemon::caller::peer::full_access_refusal(caller).is_none();
        let sessions = self
            .sessions
            .list_owned(caller.uid)
            .into_iter()
            .filter(|(s, _)| full || s.mode() != crate::sandbox::policy::Mode::DangerFullAccess)
            .map(|(s, idle)| {
                let policy = s.current_policy();
                let paths = |v: &[std::path::PathBuf]| -> Vec<String> {
                    v.iter().map(|p| p.to_string_lossy().into_owned()).collect()
                };
                api::SessionInfo {
                    session_id: s.id.clone(),
                    cwd: policy.cwd.to_string_lossy().into_owned(),
                    mode: match s.mode() {
                        crate::sandbox::policy::Mode::ReadOnly => api::SandboxMode::ReadOnly,
                        crate::sandbox::policy::Mode::WorkspaceWrite => {
                            api::SandboxMode::WorkspaceWrite
                        }
                        crate::sandbox::policy::Mode::DangerFullAccess => {
                            api::SandboxMode::DangerFullAccess
                        }
                    } as i32,
                    writable_roots: paths(&policy.writable_roots),
                    network_access: s.sandbox.network_access,
                    network_mode: match s.policy.net() {
                        crate::sandbox::policy::Net::Off => api::NetworkMode::Off,
                        crate::sandbox::policy::Net::Proxy => api::NetworkMode::Proxy,
                        crate::sandbox::policy::Net::On => api::NetworkMode::On,
                    } as i32,
                    profile: s.sandbox.profile.clone(),
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
                    name: e.failed_layer().unwrap_or("sandbox").into(),
                    status: api::LayerStatus::Unavailable as i32,
                    detail: e.message(),
                }],
            },
            landlock_abi: crate::sandbox::landlock::kernel_abi().unwrap_or(0),
            session_idle_timeout_seconds: self.sessions.idle_timeout().as_secs(),
            profiles: self.executor.profiles().names().map(String::from).collect(),
            max_sessions: self.sessions.max_sessions() as u64,
        }))
    }
}
