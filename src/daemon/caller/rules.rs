//! Operator policy: which modes each user (or group) may request, whether they may escalate,
//! where their sessions may live, and their limits. Read from the `[policy]` tables of the config
//! file; reloaded on SIGHUP (an invalid reload keeps the old policy). A refusal names the rule.
//!
//! ```toml
//! [policy.default]                 # everyone without a more specific rule
//! modes = ["read-only", "workspace-write"]
//! allow_escalation = false
//! roots_under = []                 # if set: cwd and writable roots must lie under one of these
//! max_sessions = 64                # open sessions per user
//! max_workers = 16                 # sandbox workers per user (one per distinct session policy)
//! timeout_ceiling_ms = 600000      # longest command timeout
//! max_concurrent_commands = 8      # shell commands running at once, per user
//! max_processes = 2048             # rlimits of the user's sandboxes (override the profile)
//! max_open_files = 4096
//! max_file_size_bytes = 8589934592
//! max_memory_bytes = 4294967296     # memory of one sandbox worker and its commands together
//! max_user_memory_bytes = 8589934592 # memory of all of the user's workers together (H21)
//! sandbox_starts_per_second = 8    # sandboxes a user may start (open, escalate), on average (H23)
//! sandbox_start_burst = 16         # ... and at once, before the rate applies
//!
//! [policy.users.alice]             # a user's rule wins over their groups' rules
//! modes = ["read-only", "workspace-write", "danger-full-access"]
//!
//! [policy.groups.ci]               # the first matching group, in name order
//! max_sessions = 256
//! ```
//! Keys a rule leaves out come from `policy.default`, then from the built-in defaults.

use crate::daemon::workers::start_rate::Budget;
use crate::sandbox::policy::{Identity, Mode};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One rule as written; every key optional.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    pub modes: Option<Vec<Mode>>,
    pub allow_escalation: Option<bool>,
    pub roots_under: Option<Vec<PathBuf>>,
    pub max_sessions: Option<usize>,
    /// Sandbox workers (processes) one user's sessions may keep alive at once.
    pub max_workers: Option<usize>,
    pub timeout_ceiling_ms: Option<u64>,
    /// Shell commands one user may run at once.
    pub max_concurrent_commands: Option<usize>,
    /// rlimits for the user's sandboxes (override the profile's).
    pub max_processes: Option<u64>,
    pub max_open_files: Option<u64>,
    pub max_file_size_bytes: Option<u64>,
    /// The memory limit of each of the user's sandbox workers (H11).
    pub max_memory_bytes: Option<u64>,
    pub max_user_memory_bytes: Option<u64>,
    pub sandbox_starts_per_second: Option<u32>,
    pub sandbox_start_burst: Option<u32>,
}

/// The `[policy]` table.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    #[serde(default)]
    pub default: RuleConfig,
    #[serde(default)]
    pub users: BTreeMap<String, RuleConfig>,
    #[serde(default)]
    pub groups: BTreeMap<String, RuleConfig>,
}

/// Built-in per-user caps: one user cannot fill the daemon's shared tables (spec H12).
pub const DEFAULT_MAX_SESSIONS: usize = 64;
pub const DEFAULT_MAX_WORKERS: usize = 16;
/// Built-in start budget (H23): enough for an agent platform opening sessions in bursts; one
/// user's loop beyond it waits its turn instead of taking the CPU from others.
pub const DEFAULT_STARTS_PER_SECOND: u32 = 8;
pub const DEFAULT_START_BURST: u32 = 16;
/// The smallest per-user memory ceiling an operator may set: below it no worker starts.
pub const MIN_USER_MEMORY_BYTES: u64 = 64 << 20;

/// The rule that applies to one caller, resolved, with its name for refusals.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// e.g. `policy.users.alice`, `policy.groups.ci`, `policy.default`.
    pub name: String,
    pub modes: Vec<Mode>,
    pub allow_escalation: bool,
    pub roots_under: Vec<PathBuf>,
    pub max_sessions: usize,
    pub max_workers: usize,
    pub timeout_ceiling_ms: u64,
    pub max_concurrent_commands: usize,
    pub max_processes: Option<u64>,
    pub max_open_files: Option<u64>,
    pub max_file_size_bytes: Option<u64>,
    /// The memory limit of each of the user's sandbox workers (H11).
    pub max_memory_bytes: Option<u64>,
    /// Memory of all of the user's workers together (a per-user parent cgroup); `None`: the
    /// daemon's default (see `cgroup::default_limit_bytes`).
    pub max_user_memory_bytes: Option<u64>,
    /// How fast the user may start sandboxes (H23).
    pub start_budget: Budget,
}

impl PolicyConfig {
    /// Checks the policy (absolute paths, sane limits); errors name the rule and key.
    pub fn validate(&self) -> Result<(), String> {
        let rules = std::iter::once(("policy.default".to_string(), &self.default))
            .chain(
                self.users
                    .iter()
                    .map(|(n, r)| (format!("policy.users.{n}"), r)),
            )
            .chain(
                self.groups
                    .iter()
                    .map(|(n, r)| (format!("policy.groups.{n}"), r)),
            );
        for (name, rule) in rules {
            for root in rule.roots_under.iter().flatten() {
                if !root.is_absolute() {
                    return Err(format!(
                        "{name}.roots_under: `{}` must be an absolute path",
                        root.display()
                    ));
                }
            }
            if rule.max_sessions == Some(0) {
                return Err(format!("{name}.max_sessions must be greater than zero"));
            }
            if rule.max_workers == Some(0) {
                return Err(format!("{name}.max_workers must be greater than zero"));
            }
            if rule.sandbox_starts_per_second == Some(0) || rule.sandbox_start_burst == Some(0) {
                return Err(format!(
                    "{name}.sandbox_starts_per_second and sandbox_start_burst must be greater \
                     than zero"
                ));
            }
            if rule
                .max_user_memory_bytes
                .is_some_and(|b| b < MIN_USER_MEMORY_BYTES)
            {
                return Err(format!(
                    "{name}.max_user_memory_bytes must be at least {MIN_USER_MEMORY_BYTES} (64 MiB)"
                ));
            }
            if rule.timeout_ceiling_ms == Some(0) {
                return Err(format!(
                    "{name}.timeout_ceiling_ms must be greater than zero"
                ));
            }
        }
        Ok(())
    }

    /// The rule for a caller: their user rule, else their first group rule (by name), else the
    /// default; missing keys filled from the default rule, then the built-ins.
    pub fn rule_for(&self, user: Option<&str>, groups: &[String]) -> Rule {
        let (name, specific) = match user.and_then(|u| self.users.get(u).map(|r| (u, r))) {
            Some((u, r)) => (format!("policy.users.{u}"), Some(r)),
            None => match self
                .groups
                .iter()
                .find(|(g, _)| groups.iter().any(|mine| mine == *g))
            {
                Some((g, r)) => (format!("policy.groups.{g}"), Some(r)),
                None => ("policy.default".to_string(), None),
            },
        };
        let d = &self.default;
        Rule {
            name,
            modes: pick(specific, d, |r| r.modes.clone()).unwrap_or_else(|| {
                vec![Mode::ReadOnly, Mode::WorkspaceWrite, Mode::DangerFullAccess]
            }),
            allow_escalation: pick(specific, d, |r| r.allow_escalation).unwrap_or(true),
            roots_under: pick(specific, d, |r| r.roots_under.clone()).unwrap_or_default(),
            max_sessions: pick(specific, d, |r| r.max_sessions).unwrap_or(DEFAULT_MAX_SESSIONS),
            max_workers: pick(specific, d, |r| r.max_workers).unwrap_or(DEFAULT_MAX_WORKERS),
            timeout_ceiling_ms: pick(specific, d, |r| r.timeout_ceiling_ms).unwrap_or(u64::MAX),
            max_concurrent_commands: pick(specific, d, |r| r.max_concurrent_commands)
                .unwrap_or(usize::MAX),
            max_processes: pick(specific, d, |r| r.max_processes),
            max_open_files: pick(specific, d, |r| r.max_open_files),
            max_file_size_bytes: pick(specific, d, |r| r.max_file_size_bytes),
            max_memory_bytes: pick(specific, d, |r| r.max_memory_bytes),
            max_user_memory_bytes: pick(specific, d, |r| r.max_user_memory_bytes),
            start_budget: Budget {
                per_second: pick(specific, d, |r| r.sandbox_starts_per_second)
                    .unwrap_or(DEFAULT_STARTS_PER_SECOND),
                burst: pick(specific, d, |r| r.sandbox_start_burst).unwrap_or(DEFAULT_START_BURST),
            },
        }
    }
}

/// A key from the specific rule, else from the default rule.
fn pick<T>(
    specific: Option<&RuleConfig>,
    default: &RuleConfig,
    key: impl Fn(&RuleConfig) -> Option<T>,
) -> Option<T> {
    specific.and_then(&key).or_else(|| key(default))
}

impl Rule {
    /// The profile's rlimits with this rule's overrides.
    pub fn limits(
        &self,
        profile: &crate::sandbox::policy::ResourceLimits,
    ) -> crate::sandbox::policy::ResourceLimits {
        let mut limits = profile.clone();
        if let Some(n) = self.max_processes {
            limits.processes = n;
        }
        if let Some(n) = self.max_memory_bytes {
            limits.memory_bytes = n;
        }
        if let Some(n) = self.max_user_memory_bytes {
            limits.user_memory_bytes = n;
        }
        if let Some(n) = self.max_open_files {
            limits.open_files = n;
        }
        if let Some(n) = self.max_file_size_bytes {
            limits.file_size_bytes = n;
        }
        limits
    }

    /// A session that would start a new worker for `uid`, who already has `live` of them.
    pub fn check_workers(&self, uid: u32, live: usize) -> Result<(), String> {
        if live < self.max_workers {
            return Ok(());
        }
        Err(format!(
            "uid {uid} already has {live} sandbox workers, the most policy rule `{}` allows \
             (max_workers); close sessions, or reuse the mode, cwd and roots of an open one",
            self.name
        ))
    }

    pub fn check_mode(&self, mode: Mode) -> Result<(), String> {
        if self.modes.contains(&mode) {
            return Ok(());
        }
        let allowed: Vec<&str> = self.modes.iter().map(|m| m.as_str()).collect();
        Err(format!(
            "mode {} is not allowed by policy rule `{}` (allowed: {})",
            mode.as_str(),
            self.name,
            allowed.join(", ")
        ))
    }

    pub fn check_root(&self, path: &Path) -> Result<(), String> {
        if self.roots_under.is_empty() || self.roots_under.iter().any(|r| path.starts_with(r)) {
            return Ok(());
        }
        Err(format!(
            "{} is outside the directories policy rule `{}` allows ({})",
            path.display(),
            self.name,
            self.roots_under
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }
}

/// The user name and group names of an identity (for rule lookup).
pub fn names_of(uid: u32, identity: Option<&Identity>) -> (Option<String>, Vec<String>) {
    let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten();
    let gids: Vec<u32> = match identity {
        Some(id) => id.groups.iter().copied().chain([id.gid]).collect(),
        None => user.iter().map(|u| u.gid.as_raw()).collect(),
    };
    let groups = gids
        .into_iter()
        .filter_map(|g| {
            nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(g))
                .ok()
                .flatten()
        })
        .map(|g| g.name)
        .collect();
    (user.map(|u| u.name), groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> PolicyConfig {
        #[derive(Deserialize)]
        struct Wrap {
            policy: PolicyConfig,
        }
        toml::from_str::<Wrap>(text).unwrap().policy
    }

    #[test]
    fn user_rules_win_over_groups_and_fill_from_the_default() {
        let p = config(
            r#"
            [policy.default]
            modes = ["read-only"]
            max_sessions = 2
            [policy.users.alice]
            modes = ["read-only", "workspace-write"]
            [policy.groups.ci]
            max_sessions = 50
            "#,
        );
        let alice = p.rule_for(Some("alice"), &["ci".into()]);
        assert_eq!(alice.name, "policy.users.alice");
        assert_eq!(alice.max_sessions, 2, "filled from the default");
        assert!(alice.check_mode(Mode::WorkspaceWrite).is_ok());
        let bob = p.rule_for(Some("bob"), &["ci".into()]);
        assert_eq!(
            (bob.name.as_str(), bob.max_sessions),
            ("policy.groups.ci", 50)
        );
        let err = bob.check_mode(Mode::DangerFullAccess).unwrap_err();
        assert!(
            err.contains("policy.groups.ci") && err.contains("read-only"),
            "{err}"
        );
        assert_eq!(p.rule_for(None, &[]).name, "policy.default");
    }

    #[test]
    fn per_user_caps_default_to_the_built_ins() {
        let r = config("[policy.default]\nmodes = [\"read-only\"]\n").rule_for(None, &[]);
        assert_eq!((r.max_sessions, r.max_workers), (64, 16));
        assert!(r.check_workers(7, 15).is_ok());
        assert!(r.check_workers(7, 16).unwrap_err().contains("max_workers"));
        let r = config("[policy.users.ci]\nmax_workers = 2\n").rule_for(Some("ci"), &[]);
        assert_eq!((r.max_sessions, r.max_workers), (64, 2));
    }

    #[test]
    fn validation_names_rule_and_key() {
        let p = config("[policy.users.x]\nroots_under = [\"rel\"]\n");
        assert!(
            p.validate()
                .unwrap_err()
                .contains("policy.users.x.roots_under")
        );
        let p = config("[policy.default]\nmax_sessions = 0\n");
        assert!(
            p.validate()
                .unwrap_err()
                .contains("policy.default.max_sessions")
        );
    }

    #[test]
    fn roots_under_confines_session_directories() {
        let p = config("[policy.default]\nroots_under = [\"/srv/work\"]\n");
        let r = p.rule_for(None, &[]);
        assert!(r.check_root(Path::new("/srv/work/a")).is_ok());
        assert!(
            r.check_root(Path::new("/etc"))
                .unwrap_err()
                .contains("policy.default")
        );
    }
}
