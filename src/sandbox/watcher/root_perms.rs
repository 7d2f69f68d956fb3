//! Keeping each writable root closed to other users during a call (spec/sandbox.md §8.6 H14):
//! group/other write bits it gained are cleared, and its access ACL is put back as the worker
//! found it. Apart from the name guard because it guards permissions, not names; the guard
//! only calls it at its rescans and when a call ends.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// H14: clears group/other write bits a root gained since the worker started.
pub(super) fn restore_roots(roots: &[(PathBuf, u32)]) -> Vec<(PathBuf, u32)> {
    restore_roots_with(roots, |root| std::fs::symlink_metadata(root).ok())
}

/// The access ACL xattr a root's ACL entries live in.
const ACCESS_ACL: &std::ffi::CStr = c"system.posix_acl_access";

/// `root`'s access ACL, `None` when it has none (or it cannot be read: then it is not
/// restored either).
pub(super) fn access_acl(root: &Path) -> Option<Vec<u8>> {
    let c = std::ffi::CString::new(root.as_os_str().as_bytes()).ok()?;
    let mut buf = vec![0u8; 4096];
    // SAFETY: a valid path and attribute name; the buffer's length is passed with it.
    let n = unsafe {
        libc::lgetxattr(
            c.as_ptr(),
            ACCESS_ACL.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return None;
    }
    buf.truncate(n as usize);
    Some(buf)
}

/// H14 for ACLs: puts back each root's access ACL as the worker found it (removes one the
/// root did not have). Reports the roots whose ACL changed, with their mode now.
pub(super) fn restore_root_acls(roots: &[(PathBuf, Option<Vec<u8>>)]) -> Vec<(PathBuf, u32)> {
    let mut restored = Vec::new();
    for (root, original) in roots {
        let now = access_acl(root);
        if now == *original {
            continue;
        }
        let Ok(c) = std::ffi::CString::new(root.as_os_str().as_bytes()) else {
            continue;
        };
        // SAFETY: a valid path and attribute name; the value is a byte slice with its length.
        let ok = unsafe {
            match original {
                Some(v) => libc::lsetxattr(
                    c.as_ptr(),
                    ACCESS_ACL.as_ptr(),
                    v.as_ptr().cast(),
                    v.len(),
                    0,
                ),
                None => libc::lremovexattr(c.as_ptr(), ACCESS_ACL.as_ptr()),
            }
        } == 0;
        if ok && let Ok(m) = std::fs::symlink_metadata(root) {
            restored.push((root.clone(), m.mode() & 0o7777));
        }
    }
    restored
}

/// [`restore_roots`] with each root's current metadata from `stat` (a finishing call has most
/// of them already).
pub(super) fn restore_roots_with(
    roots: &[(PathBuf, u32)],
    stat: impl Fn(&Path) -> Option<std::fs::Metadata>,
) -> Vec<(PathBuf, u32)> {
    let mut restored = Vec::new();
    for (root, original) in roots {
        let Some(meta) = stat(root) else {
            continue;
        };
        let now = meta.mode() & 0o7777;
        let gained = now & 0o022 & !original;
        if gained != 0 {
            let back = now & !gained;
            if std::fs::set_permissions(root, std::fs::Permissions::from_mode(back)).is_ok() {
                restored.push((root.clone(), back));
            }
        }
    }
    restored
}
