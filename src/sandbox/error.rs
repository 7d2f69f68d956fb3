//! The one error type every confinement layer returns.
//!
//! A layer that cannot be applied must abort the worker with a message that names the layer, the
//! cause and the host fix (spec/sandbox.md §6), never with a panic. The daemon maps this error to
//! `FAILED_PRECONDITION`; it may also turn it into a "degraded" [`LayerReport`] when the operator
//! allowed that layer to be missing (see [`crate::sandbox::report::Layer::can_be_degraded`]).
//!
//! [`LayerReport`]: crate::sandbox::report::LayerReport

use std::fmt;

/// A layer failed to apply. `Display` is exactly `message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerError {
    /// The layer's name as reported to clients (`capabilities`, `no_new_privs`, `landlock`,
    /// `seccomp`, `limits`, ...), see [`crate::sandbox::report::Layer::as_str`].
    pub layer: &'static str,
    /// Always starts with `sandbox setup failed: `.
    pub message: String,
}

/// Every setup failure starts with this, so logs and tests can recognise it.
pub const SETUP_FAILED_PREFIX: &str = "sandbox setup failed: ";

impl LayerError {
    /// The usual shape: `sandbox setup failed: {layer} could not be applied: {cause}. {fix}`.
    /// This mirrors the `sandbox unavailable: …` text of §6 that the daemon shows to clients.
    /// A final period is added to `fix` when it has none.
    pub fn new(layer: &'static str, cause: impl fmt::Display, fix: &str) -> Self {
        let stop = if fix.ends_with('.') { "" } else { "." };
        Self {
            layer,
            message: format!(
                "{SETUP_FAILED_PREFIX}{layer} could not be applied: {cause}. {fix}{stop}"
            ),
        }
    }

    /// A message whose wording the spec fixes (e.g. the capability self-check of §3.4). `text`
    /// comes after the prefix.
    pub fn fixed(layer: &'static str, text: impl fmt::Display) -> Self {
        Self {
            layer,
            message: format!("{SETUP_FAILED_PREFIX}{text}"),
        }
    }
}

/// The parts of a layer failure, as the worker reports them to the daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetupParts<'a> {
    pub cause: &'a str,
    pub fix: &'a str,
}

impl LayerError {
    /// The cause and the fix of a [`LayerError::new`]-shaped failure (either prefix), `None`
    /// for fixed wording. The message is the only place they are kept, since some layers build
    /// the error directly; this is the one place that splits it.
    pub fn parts(&self) -> Option<SetupParts<'_>> {
        let rest = self
            .message
            .strip_prefix(SETUP_FAILED_PREFIX)
            .or_else(|| self.message.strip_prefix("sandbox unavailable: "))?;
        let rest = rest
            .strip_prefix(self.layer)?
            .strip_prefix(" could not be applied: ")?;
        let (cause, fix) = rest.split_once(". ").unwrap_or((rest, ""));
        Some(SetupParts {
            cause: cause.trim_end_matches('.'),
            fix,
        })
    }
}

impl fmt::Display for LayerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for LayerError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_names_layer_cause_and_fix() {
        let e = LayerError::new(
            "seccomp",
            "seccomp(2) returned EINVAL",
            "Use a kernel with CONFIG_SECCOMP_FILTER=y",
        );
        assert_eq!(e.layer, "seccomp");
        assert_eq!(
            e.to_string(),
            "sandbox setup failed: seccomp could not be applied: seccomp(2) returned EINVAL. Use a kernel with CONFIG_SECCOMP_FILTER=y."
        );
        let f = LayerError::fixed(
            "capabilities",
            "capabilities remain after dropping them (CapEff=0000000000000001)",
        );
        assert!(f.to_string().starts_with(SETUP_FAILED_PREFIX));
        assert_eq!(f.parts(), None);
        assert_eq!(
            e.parts(),
            Some(SetupParts {
                cause: "seccomp(2) returned EINVAL",
                fix: "Use a kernel with CONFIG_SECCOMP_FILTER=y."
            })
        );
    }
}
