//! A session's effective policy: its profile, the policy the path resolver builds for it as
//! the caller, the per-user start budget every sandbox start waits on (H23), and the start-up
//! probe of a sandbox as sessions will get it.

use super::Executor;
use crate::daemon::error::CallError;
use crate::daemon::session::sessions::SandboxRequest;
use crate::daemon::workers::start_rate::Turn;
use crate::sandbox::policy::{Mode, SandboxPolicy};
use crate::sandbox::profile::Profile;
use crate::sandbox::report::Layer;
use crate::sandbox::roots::SessionParams;
use std::path::PathBuf;

/// The uid the start-up probe runs as when the daemon is root (`nobody` on most systems).
const PROBE_UID: u32 = 65534;

impl Executor {
    /// The session's profile: the named one (its mode must match the request's, if given) or
    /// the mode's built-in one. Fills in the session's mode from a named profile.
    pub fn resolve_profile(
        &self,
        session: &mut SandboxRequest,
        mode_given: bool,
    ) -> Result<Profile, CallError> {
        if session.profile.is_empty() {
            let profile = self.profiles.for_mode(session.mode).clone();
            session.profile = profile.name.clone();
            return Ok(profile);
        }
        let profile = self
            .profiles
            .get(&session.profile)
            .cloned()
            .ok_or_else(|| {
                CallError::invalid_field(
                    "profile",
                    &format!(
                        "profile `{}` does not exist; this daemon has: {}",
                        session.profile,
                        self.profiles.names().collect::<Vec<_>>().join(", ")
                    ),
                )
            })?;
        if mode_given && profile.mode != session.mode {
            return Err(CallError::invalid_field(
                "mode",
                &format!(
                    "profile `{}` is a {} profile, but mode {} was requested; omit mode or make \
                     it match",
                    profile.name,
                    profile.mode.as_str(),
                    session.mode.as_str()
                ),
            ));
        }
        session.mode = profile.mode;
        if profile.mode == Mode::DangerFullAccess {
            session.network_access = true;
        }
        Ok(profile)
    }

    /// The effective policy of a session (spec/sandbox.md §2.2–2.3), resolved as the caller by
    /// the path resolver: the daemon itself never looks at the paths (§8.6 H5).
    pub async fn policy_for(&self, session: &SandboxRequest) -> Result<SandboxPolicy, CallError> {
        self.wait_for_start_turn(session).await?;
        let profile = match self.profiles.get(&session.profile) {
            Some(p) if p.mode == session.mode => p.clone(),
            _ => self.profiles.for_mode(session.mode).clone(),
        };
        if (session.network_access || session.proxy.is_some()) && !profile.network_allowed {
            return Err(CallError::Denied(format!(
                "sandbox profile `{}` does not allow network access",
                profile.name
            )));
        }
        let params = SessionParams {
            mode: session.mode,
            cwd: session.cwd.clone(),
            writable_roots: session.writable_roots.clone(),
            network_access: session.network_access,
            exclude_tmpdir_env_var: session.exclude_tmpdir_env_var,
            exclude_slash_tmp: session.exclude_slash_tmp,
            env: session
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            masked_paths: crate::sandbox::masks::masked_paths(&self.state_paths, session.owner_uid),
            identity: session.identity.clone(),
            limits: {
                let mut limits = match &session.rule {
                    Some(rule) => rule.limits(&profile.limits),
                    None => profile.limits.clone(),
                };
                // Without a memory cgroup, each process of the worker is held to the limit.
                if !self.pool.has_memory_cgroups() {
                    limits.data_bytes = limits.memory_bytes;
                }
                limits
            },
            writable_sources: profile.writable.clone(),
            protected_names: profile.protected_names.clone(),
        };
        let mut policy = self.resolver.resolve(&params).await?;
        // The egress proxy's place is the daemon's, not the resolver's; an escalated call's
        // danger-full-access policy has the host's network instead.
        if session.mode.is_sandboxed() {
            policy.egress = session.egress.clone();
        }
        for root in &policy.writable_roots {
            if let Some(state) = self.state_paths.iter().find(|s| s.starts_with(root)) {
                return Err(self.state_in_root(session, root, state));
            }
        }
        Ok(policy)
    }

    /// The refusal of a writable root that holds corral's own state: which request field
    /// brought the root in, and the flag or setting that leaves it out (a BadRequest naming
    /// that field). Compared as written, never by looking at the paths (§8.6 H5): /tmp and
    /// `$TMPDIR` are what their sources add, the cwd and the extra roots are the rest.
    pub(super) fn state_in_root(
        &self,
        session: &SandboxRequest,
        root: &std::path::Path,
        state: &std::path::Path,
    ) -> CallError {
        let what = if self.socket_dir.as_deref() == Some(state) {
            format!(
                "{}, the directory of the daemon's socket, which clients connect to",
                state.display()
            )
        } else {
            state.display().to_string()
        };
        let tmpdir = session.env.get("TMPDIR").map(std::path::Path::new);
        let (field, fix) = if root == std::path::Path::new("/tmp") && !session.exclude_slash_tmp {
            (
                "exclude_slash_tmp",
                "leave /tmp out of the session's writable roots: exclude_slash_tmp \
                 (`--exclude-slash-tmp` on corral mcp, open-session, exec, invoke, cp), or run \
                 the daemon with its socket and state outside /tmp (e.g. /run/corral)",
            )
        } else if tmpdir == Some(root) && !session.exclude_tmpdir_env_var {
            (
                "exclude_tmpdir_env_var",
                "leave $TMPDIR out of the session's writable roots: exclude_tmpdir_env_var \
                 (`--exclude-tmpdir-env-var` on corral mcp, open-session, exec, invoke), or set \
                 another TMPDIR",
            )
        } else if root == session.cwd {
            (
                "cwd",
                "choose a working directory (or mode) that does not contain it",
            )
        } else {
            ("writable_roots", "choose a narrower writable root")
        };
        CallError::invalid_field(
            field,
            &format!(
                "writable root {} contains corral's own state ({what}), which no sandbox may \
                 write; {fix}",
                root.display(),
            ),
        )
    }

    /// Every resolution starts a resolver helper and usually a worker: it is a start of the
    /// session owner's budget (H23), waited for here, before any process is made.
    pub(super) async fn wait_for_start_turn(
        &self,
        session: &SandboxRequest,
    ) -> Result<(), CallError> {
        let Some(rule) = &session.rule else {
            return Ok(());
        };
        let budget = rule.start_budget;
        match self
            .starts
            .take(session.owner_uid, budget, std::time::Instant::now())
        {
            Turn::Now => Ok(()),
            Turn::After(wait) => {
                tokio::time::sleep(wait).await;
                Ok(())
            }
            Turn::Refused { retry_after } => Err(CallError::starting_too_fast(
                session.owner_uid,
                &rule.name,
                budget.per_second,
                retry_after,
            )),
        }
    }

    /// Builds a throw-away read-only worker to learn which layers this host enforces.
    pub async fn probe(&self) -> Result<Vec<crate::api::Layer>, CallError> {
        let session = SandboxRequest {
            cwd: PathBuf::from("/"),
            mode: crate::sandbox::policy::Mode::ReadOnly,
            writable_roots: Vec::new(),
            network_access: false,
            exclude_tmpdir_env_var: true,
            exclude_slash_tmp: true,
            env: Default::default(),
            profile: String::new(),
            // The uid whose sessions the probe stands for: any, as root; else the only one.
            owner_uid: nix::unistd::geteuid().as_raw(),
            // As root, probe as an unprivileged user, so a host that cannot switch identities
            // (no CAP_SETUID/SETGID, e.g. a restricted container) shows up before any call.
            identity: nix::unistd::geteuid()
                .is_root()
                .then(|| crate::sandbox::policy::Identity {
                    uid: PROBE_UID,
                    gid: PROBE_UID,
                    groups: Vec::new(),
                }),
            rule: None,
            proxy: None,
            egress: None,
        };
        let policy = self.policy_for(&session).await?;
        let worker = crate::daemon::workers::pool::Worker::spawn(
            &crate::wire::spec::WorkerSpec {
                policy,
                degraded: self.pool.degraded().to_vec(),
                replaces_a_dead_worker: false,
                stopped_by: None,
            },
            None,
        )
        .await?;
        let mut layers = worker.layers.clone();
        // The memory limit's fallback is the daemon's knowledge, not the worker's: say it with
        // the limits the worker reported (spec/sandbox.md §8.6 H11).
        if let Some(why) = self.pool.no_memory_cgroup_because()
            && let Some(limits) = layers.iter_mut().find(|l| l.name == Layer::Limits.as_str())
        {
            limits.detail.push_str(&format!(
                "; memory: no memory cgroup for workers ({why}), so each process is held to \
                 RLIMIT_DATA instead of one limit for the whole worker"
            ));
        }
        Ok(layers)
    }
}
