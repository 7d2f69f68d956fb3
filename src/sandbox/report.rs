//! What the worker tells the daemon about each confinement layer: applied fully, partially,
//! skipped because the operator allowed it to be missing (degraded), or not applicable to the mode.
//!
//! The daemon forwards these to the typed result, the audit record, the Capabilities RPC and the
//! health service (spec/sandbox.md §6), so every entry says in words what is enforced or lost.

use serde::{Deserialize, Serialize};

#[cfg(test)]
use crate::sandbox::error::LayerError;

/// The confinement layers, in the order the worker applies them (spec/sandbox.md §3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    Namespaces,
    Identity,
    Capabilities,
    NoNewPrivs,
    Landlock,
    Seccomp,
    Limits,
}

impl Layer {
    /// Application order (§3.1).
    pub const ORDER: [Layer; 7] = [
        Layer::Namespaces,
        Layer::Identity,
        Layer::Capabilities,
        Layer::NoNewPrivs,
        Layer::Landlock,
        Layer::Seccomp,
        Layer::Limits,
    ];

    /// The name used in messages, reports and the operator's degraded-mode list.
    pub const fn as_str(self) -> &'static str {
        match self {
            Layer::Namespaces => "namespaces",
            Layer::Identity => "identity",
            Layer::Capabilities => "capabilities",
            Layer::NoNewPrivs => "no_new_privs",
            Layer::Landlock => "landlock",
            Layer::Seccomp => "seccomp",
            Layer::Limits => "limits",
        }
    }

    /// Only these may be listed for degraded mode (§6); the capability drop and no_new_privs
    /// never may, and the limits cost nothing to apply so they are never skipped either.
    pub const fn can_be_degraded(self) -> bool {
        matches!(
            self,
            Layer::Namespaces | Layer::Identity | Layer::Landlock | Layer::Seccomp
        )
    }

    /// What a session loses when this layer is missing (shown with a degraded report).
    pub const fn lost_when_missing(self) -> &'static str {
        match self {
            Layer::Namespaces => {
                "no protected paths, no metadata protection outside the writable roots, no private /proc, /dev or network"
            }
            Layer::Identity => "commands run with the daemon's uid instead of the caller's",
            Layer::Capabilities => "root keeps its capabilities (never allowed)",
            Layer::NoNewPrivs => "setuid binaries could gain privileges (never allowed)",
            Layer::Landlock => {
                "writes outside the writable roots are stopped only by the read-only mounts; no signal or abstract-socket scoping"
            }
            Layer::Seccomp => {
                "no syscall filter: network, io_uring, ptrace, namespace and host-global syscalls are not filtered"
            }
            Layer::Limits => "no resource limits",
        }
    }
}

impl std::fmt::Display for Layer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How far a layer is in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerStatus {
    /// Everything the layer is meant to do is in force.
    Enforced,
    /// In force, but some features are missing on this host (listed in `missing`), e.g. a Landlock
    /// ABI older than the newest the crate knows.
    PartiallyEnforced,
    /// Not applied; the operator allowed it to be missing. `detail` holds the setup error.
    Degraded,
    /// The mode does not use this layer (danger-full-access).
    NotApplicable,
}

/// One line of the worker's confinement report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerReport {
    pub layer: Layer,
    pub status: LayerStatus,
    /// Human-readable summary of what is in force (or the error, when degraded).
    pub detail: String,
    /// Features of the layer that are not in force on this host, in words.
    pub missing: Vec<String>,
}

impl LayerReport {
    pub fn enforced(layer: Layer, detail: impl Into<String>) -> Self {
        Self {
            layer,
            status: LayerStatus::Enforced,
            detail: detail.into(),
            missing: Vec::new(),
        }
    }

    /// `Enforced` when nothing is missing, otherwise `PartiallyEnforced`.
    pub fn with_missing(layer: Layer, detail: impl Into<String>, missing: Vec<String>) -> Self {
        Self {
            layer,
            status: if missing.is_empty() {
                LayerStatus::Enforced
            } else {
                LayerStatus::PartiallyEnforced
            },
            detail: detail.into(),
            missing,
        }
    }

    pub fn not_applicable(layer: Layer, why: impl Into<String>) -> Self {
        Self {
            layer,
            status: LayerStatus::NotApplicable,
            detail: why.into(),
            missing: Vec::new(),
        }
    }

    #[cfg(test)]
    /// Turns a setup failure into a degraded report, if the layer may be degraded at all.
    /// The caller checks the operator's list; this only refuses the layers §6 never allows
    /// to be missing, returning the original error for them (fail closed).
    pub fn degraded(layer: Layer, error: LayerError) -> Result<Self, LayerError> {
        if !layer.can_be_degraded() {
            return Err(error);
        }
        Ok(Self {
            layer,
            status: LayerStatus::Degraded,
            detail: error.message,
            missing: vec![layer.lost_when_missing().to_string()],
        })
    }

    #[cfg(test)]
    /// Whether the layer is (at least partly) in force.
    pub fn is_in_force(&self) -> bool {
        matches!(
            self.status,
            LayerStatus::Enforced | LayerStatus::PartiallyEnforced
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_and_no_new_privs_can_never_be_degraded() {
        for layer in Layer::ORDER {
            let err = LayerError::new(layer.as_str(), "test cause", "test fix.");
            let r = LayerReport::degraded(layer, err.clone());
            if matches!(
                layer,
                Layer::Capabilities | Layer::NoNewPrivs | Layer::Limits
            ) {
                assert_eq!(r, Err(err));
            } else {
                let r = r.unwrap();
                assert_eq!(r.status, LayerStatus::Degraded);
                assert!(!r.is_in_force());
                assert!(r.detail.contains("test cause"));
                assert_eq!(r.missing, vec![layer.lost_when_missing().to_string()]);
            }
        }
    }

    #[test]
    fn with_missing_picks_status() {
        assert_eq!(
            LayerReport::with_missing(Layer::Landlock, "x", vec![]).status,
            LayerStatus::Enforced
        );
        assert_eq!(
            LayerReport::with_missing(Layer::Landlock, "x", vec!["y".into()]).status,
            LayerStatus::PartiallyEnforced
        );
    }
}
