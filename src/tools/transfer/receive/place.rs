//! How a staging leaves: renamed into place when the stream ended complete (exclusively, over a
//! non-directory, or swapped with a directory whose old tree is then removed), or removed when
//! the [`Receiver`] is dropped unfinished.

use super::{Receiver, Stage, already_exists, kind_mismatch};
use crate::tools::transfer::{Kind, fsx, sys_error};
use crate::tools::{ErrorKind, ToolError};
use nix::errno::Errno;
use std::ffi::OsStr;
use std::os::fd::AsFd;
use std::path::Path;

impl Receiver {
    /// Renames `staged` to the destination: exclusively when nothing is there (or overwrite is
    /// off), over a non-directory, or swapped with a directory whose old tree is then removed.
    pub(super) fn place(&mut self, staged: &OsStr, kind: Kind) -> Result<(), ToolError> {
        let parent = self.dest.parent.as_fd();
        let name = self.dest.name.as_os_str();
        let path = self.dest.path.clone();
        let existing = self.dest.existing()?;
        match existing {
            None => fsx::rename_noreplace(parent, staged, name, kind == Kind::Directory).map_err(
                |e| match e {
                    Errno::EEXIST | Errno::ENOTEMPTY => ToolError::new(
                        ErrorKind::AlreadyExists,
                        format!(
                            "{} appeared while the transfer ran; nothing was changed",
                            path.display()
                        ),
                    ),
                    e => sys_error("cannot rename into place", &path, e),
                },
            )?,
            Some(existing) if !self.overwrite => return Err(already_exists(&path, &existing)),
            Some(existing) if !existing.replaceable_by(kind) => {
                return Err(kind_mismatch(&path, &existing, kind));
            }
            Some(_) if kind != Kind::Directory => {
                nix::fcntl::renameat(parent, staged, parent, name)
                    .map_err(|e| sys_error("cannot rename into place", &path, e))?
            }
            Some(_) => match fsx::exchange(parent, staged, name) {
                Some(result) => {
                    result.map_err(|e| sys_error("cannot swap into place", &path, e))?;
                    // The staging name now holds the old tree; the new one is in place.
                    self.remove_old(staged);
                }
                None => {
                    // No RENAME_EXCHANGE here: move the old tree aside, then the new one in.
                    let aside = fsx::staging_name(name, "old");
                    nix::fcntl::renameat(parent, name, parent, aside.as_os_str())
                        .map_err(|e| sys_error("cannot move aside", &path, e))?;
                    if let Err(e) = nix::fcntl::renameat(parent, staged, parent, name) {
                        let _ = nix::fcntl::renameat(parent, aside.as_os_str(), parent, name);
                        return Err(sys_error("cannot rename into place", &path, e));
                    }
                    self.remove_old(&aside);
                }
            },
        }
        // The rename is durable before the call answers.
        let _ = nix::unistd::fsync(parent);
        Ok(())
    }

    /// Removes a replaced tree. The new one is in place already, so a failure here is only
    /// reported, not an error of the transfer.
    fn remove_old(&self, name: &OsStr) {
        if let Err(e) = fsx::remove_tree(self.dest.parent.as_fd(), name) {
            eprintln!(
                "corral: the replaced tree of {} could not be removed completely ({e}); its \
                 rest is at {}",
                self.dest.path.display(),
                self.dest
                    .path
                    .parent()
                    .unwrap_or(Path::new("/"))
                    .join(name)
                    .display()
            );
        }
    }
}

impl Drop for Receiver {
    /// An unfinished transfer leaves nothing behind.
    fn drop(&mut self) {
        let stage = std::mem::replace(&mut self.stage, Stage::Empty);
        let Some(staged) = stage.staged().map(OsStr::to_os_string) else {
            return;
        };
        // Close everything of the staging first.
        drop(stage);
        let _ = fsx::remove_tree(self.dest.parent.as_fd(), &staged);
    }
}
