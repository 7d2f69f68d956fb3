//! What one call's guard found ([`GuardReport`]) and the output lines it becomes
//! (spec/sandbox.md §9). Apart from the guard so the texts a client sees, and the rule that
//! merges two findings, are in one short place; the worker's command runner prints them.

use std::path::{Path, PathBuf};

/// The output line for a blocked creation (spec/sandbox.md §9).
pub fn blocked_message(path: &Path) -> String {
    format!(
        "sandbox blocked creation of protected workspace metadata path {}",
        path.display()
    )
}

/// The output line when a blocked name could not be taken away.
pub fn not_removed_message(path: &Path, cause: &str) -> String {
    format!(
        "sandbox blocked creation of protected workspace metadata path {} but could NOT remove \
         it ({cause}); it is still there — remove it before running git or codex in that \
         directory",
        path.display()
    )
}

/// The output line for a root whose permissions were restored.
pub fn root_mode_message(root: &Path, mode: u32) -> String {
    format!(
        "sandbox blocked making writable root {} writable by other users (its mode was set \
         back to {mode:04o})",
        root.display()
    )
}

/// The output line when the guard stopped the sandbox (H18).
pub fn stopped_message(path: &Path) -> String {
    format!(
        "sandbox stopped every process of this session: a command created protected path {} \
         (sandbox.md H18); later commands and patches of this session are refused — open a new \
         session",
        path.display()
    )
}

/// What one call's guard found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GuardReport {
    /// Guarded paths that appeared and were taken away (each once, in order).
    pub removed: Vec<PathBuf>,
    /// Guarded paths that appeared and could not be taken away, with why.
    pub not_removed: Vec<(PathBuf, String)>,
    /// Roots whose group/other write bits were cleared again, with the mode restored.
    pub roots_restored: Vec<(PathBuf, u32)>,
    /// The sandbox was stopped because a command made this protected path (H18).
    pub stopped: Option<PathBuf>,
}

impl GuardReport {
    pub fn is_empty(&self) -> bool {
        self.removed.is_empty()
            && self.not_removed.is_empty()
            && self.roots_restored.is_empty()
            && self.stopped.is_none()
    }

    /// One line per finding, for the command's output.
    pub fn lines(&self) -> Vec<String> {
        let mut out: Vec<String> = self.stopped.iter().map(|p| stopped_message(p)).collect();
        out.extend(self.removed.iter().map(|p| blocked_message(p)));
        out.extend(
            self.not_removed
                .iter()
                .map(|(p, cause)| not_removed_message(p, cause)),
        );
        out.extend(
            self.roots_restored
                .iter()
                .map(|(r, mode)| root_mode_message(r, *mode)),
        );
        out
    }

    pub(super) fn merge(&mut self, other: GuardReport) {
        for p in other.removed {
            if !self.removed.contains(&p) {
                self.removed.push(p);
            }
        }
        for (p, c) in other.not_removed {
            if !self.not_removed.iter().any(|(q, _)| *q == p) {
                self.not_removed.push((p, c));
            }
        }
        for (r, m) in other.roots_restored {
            if !self.roots_restored.iter().any(|(q, _)| *q == r) {
                self.roots_restored.push((r, m));
            }
        }
        if self.stopped.is_none() {
            self.stopped = other.stopped;
        }
    }
}
