//! The worker's confinement sequence, top to bottom (spec/sandbox.md §3.1). It runs in a fresh,
//! single-threaded process before the first request is read; each step is one layer module.
//!
//! A layer that fails aborts confinement with an error naming it, unless the operator listed it
//! in `degraded` (and it may be degraded at all): then it is skipped and reported as such.

use crate::sandbox::error::LayerError;
use crate::sandbox::policy::SandboxPolicy;
use crate::sandbox::report::{Layer, LayerReport, LayerStatus};
use crate::sandbox::watcher::Guard;
use crate::sandbox::{caps, identity, landlock, limits, namespaces, seccomp, userns};
use std::os::fd::{AsRawFd, RawFd};

/// A confined worker: what each layer reported, and the protected-name guard (created as the
/// caller before seccomp, which denies `inotify_init` to everything after it).
pub struct Confined {
    pub reports: Vec<LayerReport>,
    pub guard: Option<Guard>,
}

/// Confines the calling process according to `policy`. `keep_fds` survive (the request socket).
/// Note: in sandboxed modes this forks (the new PID namespace applies to children) and returns
/// only in the child, which is PID 1 of the namespace.
pub fn confine(
    policy: &SandboxPolicy,
    degraded: &[Layer],
    keep_fds: &[RawFd],
) -> Result<Confined, LayerError> {
    let mut reports = Vec::new();
    let sandboxed = policy.mode.is_sandboxed();
    let mut step =
        |layer: Layer, apply: &mut dyn FnMut() -> Result<LayerReport, LayerError>| match apply() {
            Ok(report) => {
                reports.push(report);
                Ok(())
            }
            Err(err) if layer.can_be_degraded() && degraded.contains(&layer) => {
                reports.push(LayerReport {
                    layer,
                    status: LayerStatus::Degraded,
                    detail: format!("{err}; without it: {}", layer.lost_when_missing()),
                    missing: vec![layer.lost_when_missing().to_string()],
                });
                Ok(())
            }
            Err(err) => Err(err),
        };
    let not_applicable = |layer: Layer| LayerReport {
        layer,
        status: LayerStatus::NotApplicable,
        detail: "danger-full-access: not applied".into(),
        missing: Vec::new(),
    };

    // A daemon that is not root serves only its own uid (the daemon refuses other callers), so
    // its workers have no identity to take, and build their namespaces in a user namespace.
    let unprivileged = userns::needed();
    let daemon_uid = nix::unistd::geteuid().as_raw();
    // Whether this process holds capabilities of its own user namespace (set below).
    let mut in_own_user_namespace = false;
    // Whether the read-only view is in place (read by Landlock, which leaves some read-only-mode
    // rights to it).
    let mut read_only_mounts = false;

    // 1. Namespaces and the filesystem view, while still privileged. Without root, the
    //    privilege is that of a user namespace entered first (the daemon's uid mapped to
    //    itself, see userns.rs).
    step(Layer::Namespaces, &mut || {
        if !sandboxed {
            return Ok(not_applicable(Layer::Namespaces));
        }
        let mut detail = Vec::new();
        if unprivileged {
            detail.push(userns::enter_own_user_namespace()?);
            in_own_user_namespace = true;
        }
        namespaces::enter_namespaces(policy)?;
        read_only_mounts = true;
        detail.push("mount, pid, uts, ipc (and net when off)".to_string());
        Ok(LayerReport::enforced(Layer::Namespaces, detail.join("; ")))
    })?;
    // The working directory commands start from, opened once the mounts are in place (H24:
    // later commands `fchdir` to it instead of following its path, which a swapped parent
    // could redirect). A missing cwd is the first command's error, as before.
    let _ = crate::tools::shell::pinned_cwd::pin(&policy.cwd);
    // 2. Identity: become the session owner. Keep the permitted set across the uid change so the
    //    capability drop below can still empty the bounding set.
    step(Layer::Identity, &mut || {
        if unprivileged && policy.identity.is_none() {
            return Ok(LayerReport::not_applicable(
                Layer::Identity,
                format!(
                    "not applicable: the daemon runs as uid {daemon_uid}, not root, and serves \
                     only that uid; commands run as uid {daemon_uid}"
                ),
            ));
        }
        if sandboxed {
            caps::keep_capabilities_across_uid_change()?;
        }
        identity::apply_identity(policy)?;
        Ok(LayerReport::enforced(
            Layer::Identity,
            match &policy.identity {
                Some(id) => format!("uid {} gid {} groups {:?}", id.uid, id.gid, id.groups),
                None => "the daemon's own identity".to_string(),
            },
        ))
    })?;
    // The guard's fanotify group, charged to the caller's uid, made while fanotify_init is
    // still allowed (H13: commands may not make their own) and with CAP_SYS_ADMIN, so that
    // its events say which creations the sandbox made (H27).
    let guard = if sandboxed && !policy.writable_roots.is_empty() {
        let _ = caps::raise_effective_to_permitted();
        Some(Guard::new(policy).map_err(|e| {
            LayerError::new(
                "watcher",
                format_args!("cannot create the fanotify group that guards protected names: {e}"),
                "Raise fs.fanotify.max_user_groups, or close other fanotify users of this uid",
            )
        })?)
    } else {
        None
    };
    if sandboxed {
        // 3. Capabilities: every set emptied, securebits locked, verified — the root worker's
        //    and the user namespace's alike. Only a non-root worker whose namespaces layer was
        //    degraded holds nothing to lock them with; it empties what it holds (caps.rs).
        if unprivileged && !in_own_user_namespace {
            step(
                Layer::Capabilities,
                &mut caps::drop_capabilities_without_privilege,
            )?;
        } else {
            step(Layer::Capabilities, &mut caps::drop_all_capabilities)?;
        }
        // 4. no_new_privs, before Landlock and seccomp.
        step(Layer::NoNewPrivs, &mut caps::set_no_new_privs)?;
        // 5. Landlock. It may leave reads and truncation to the read-only view and seccomp only
        //    when both are certain: the view was built, and seccomp, applied next, may not be
        //    skipped (its failure stops confinement before anything runs).
        let cover = landlock::Cover {
            read_only_mounts,
            seccomp_required: !(Layer::Seccomp.can_be_degraded()
                && degraded.contains(&Layer::Seccomp)),
        };
        step(Layer::Landlock, &mut || landlock::apply(policy, cover))?;
        // 6. seccomp, last of the filters: it also forbids what the steps above needed.
        step(Layer::Seccomp, &mut || seccomp::apply(policy))?;
    } else {
        for layer in [
            Layer::Capabilities,
            Layer::NoNewPrivs,
            Layer::Landlock,
            Layer::Seccomp,
        ] {
            reports.push(not_applicable(layer));
        }
    }
    // 7. Resource limits, non-dumpable, inherited descriptors closed (but the guard's).
    let mut keep: Vec<RawFd> = keep_fds.to_vec();
    keep.extend(guard.as_ref().map(|g| g.fd().as_raw_fd()));
    keep.extend(crate::tools::shell::pinned_cwd::fd());
    let report = limits::apply(&policy.limits, &keep)?;
    reports.push(report);
    Ok(Confined { reports, guard })
}
