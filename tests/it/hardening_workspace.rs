//! The escape suite's workspace properties (spec/sandbox.md §8.6 H1, H2, H4, H5, H8, H9, H10,
//! H13, H14, H15), each attempted through a real daemon with a baseline, the allowed path and a
//! host-side check — the red-team reproductions of ../shared/notes/redteam-2026-11.md and
//! variants of our own. Sessions run as a confined root caller (uid 0 with every capability
//! dropped: file permissions bind it like any user, as in the red-team's root-confined runs).

use crate::common::{self, Daemon, RunAs, count_lines, gitdir_script, host_sh, outside};
use corral::api::{self, SandboxMode};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A workspace-write session on `cwd` without /tmp (unless `tmp`), plus extra roots.
async fn ww(d: &Daemon, cwd: &Path, roots: &[&Path], tmp: bool) -> Result<String, tonic::Status> {
    d.try_open_with(api::OpenSessionRequest {
        cwd: cwd.to_string_lossy().into_owned(),
        mode: SandboxMode::WorkspaceWrite as i32,
        writable_roots: roots
            .iter()
            .map(|r| r.to_string_lossy().into_owned())
            .collect(),
        exclude_slash_tmp: !tmp,
        env: common::session_env(cwd),
        ..Default::default()
    })
    .await
}

fn exists(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok()
}

/// Runs the host's `git status` in `dir` (the victim's next command) and says whether the
/// planted fsmonitor hook ran (it writes `marker`).
fn host_git_runs_hook(dir: &Path, marker: &Path) -> bool {
    let _ = std::fs::remove_file(marker);
    host_sh(&format!(
        "cd '{}' && GIT_CEILING_DIRECTORIES='{}' timeout 10 git status >/dev/null 2>&1",
        dir.display(),
        dir.parent().unwrap().display()
    ));
    exists(marker)
}

/// Whether the host's git, started in `dir`, finds a repository there (and so reads its config).
fn host_git_discovers(dir: &Path) -> bool {
    let (code, out) = host_sh(&format!(
        "cd '{}' && GIT_CEILING_DIRECTORIES='{}' git config --get core.fsmonitor",
        dir.display(),
        dir.parent().unwrap().display()
    ));
    code == 0 && !out.trim().is_empty()
}

/// Finding 1 (F02): a prepared tree whose write bits were removed, renamed onto `.git`, used
/// to survive the watcher; the host's git then ran its fsmonitor. Variants: the root made 0555
/// too, `.codex` and `.agents` the same way, a hard link, a symlink, apply_patch.
#[tokio::test]
async fn h1_no_protected_name_survives_even_a_write_protected_tree() {
    let d = Daemon::start(&[]).await;
    let base = outside();
    let proj = base.path().join("proj");
    std::fs::create_dir(&proj).unwrap();
    let marker = base.path().join("pwned");
    let plant = |name: &str, extra: &str| {
        format!(
            "mkdir -p t/objects t/refs/heads && printf 'ref: refs/heads/main\\n' > t/HEAD && \
             printf '[core]\\n\\tfsmonitor = \"echo PWNED > {marker}; false\"\\n' > t/config && \
             chmod 555 t/objects t/refs/heads t/refs t && mv t {name} {extra}; \
             chmod 755 . 2>/dev/null; true",
            marker = marker.display()
        )
    };
    // Baseline: on the host the planted tree survives and git runs the hook.
    host_sh(&format!("cd '{}' && {}", proj.display(), plant(".git", "")));
    assert!(
        host_git_runs_hook(&proj, &marker),
        "baseline: the hook runs"
    );
    host_sh(&format!(
        "chmod -R u+w '{0}/.git' && rm -rf '{0}/.git'",
        proj.display()
    ));

    for (name, extra) in [
        (".git", ""),
        (".git", "&& chmod 555 ."),
        (".codex", ""),
        (".agents", "&& chmod 555 ."),
    ] {
        // H18: a session whose command made a protected name is stopped; each attempt gets
        // its own session.
        let id = ww(&d, &proj, &[], false).await.unwrap();
        let r = d.sh(&id, &plant(name, extra)).await;
        assert_ne!(r.exit_code, 0, "{name} {extra}: {}", r.output);
        assert!(r.response.sandbox_denied, "{name}");
        assert!(
            r.output.contains(&format!(
                "sandbox blocked creation of protected workspace metadata path {}/{name}",
                proj.display()
            )),
            "{}",
            r.output
        );
        assert!(!r.output.contains("could NOT remove"), "{}", r.output);
        assert!(
            r.output.contains("sandbox stopped every process"),
            "{}",
            r.output
        );
        let _ = std::fs::set_permissions(&proj, std::fs::Permissions::from_mode(0o755));
        assert!(!exists(&proj.join(name)), "{name} survived on the host");
        let refused = d.try_sh(&id, "true").await.unwrap_err();
        assert_eq!(
            refused.code(),
            tonic::Code::FailedPrecondition,
            "{refused:?}"
        );
        assert!(refused.message().contains("H18"), "{refused:?}");
    }
    assert!(
        !host_git_runs_hook(&proj, &marker),
        "the host's git ran a planted hook"
    );
    let leftovers: Vec<_> = std::fs::read_dir(&proj)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(leftovers.is_empty(), "left behind: {leftovers:?}");

    // A hard link and a symlink onto the names, and apply_patch: all refused.
    std::fs::write(proj.join("file"), "f").unwrap();
    let id = ww(&d, &proj, &[], false).await.unwrap();
    let r = d.sh(&id, "ln file .agents; ln -s /etc .codex").await;
    assert_ne!(r.exit_code, 0);
    assert!(!exists(&proj.join(".agents")) && !exists(&proj.join(".codex")));
    assert_eq!(std::fs::read_to_string(proj.join("file")).unwrap(), "f");
    let id = ww(&d, &proj, &[], false).await.unwrap();
    let (out, ok) = d
        .invoke(
            &id,
            "apply_patch",
            &serde_json::json!({"input": "*** Begin Patch\n*** Add File: .codex/config.toml\n+x\n*** End Patch\n"}).to_string(),
        )
        .await;
    assert!(!ok, "{out}");
    assert!(!exists(&proj.join(".codex")));
    // The allowed path still works.
    let r = d.sh(&id, "echo ok > fine.txt && cat fine.txt").await;
    assert_eq!((r.exit_code, r.output.as_str()), (0, "ok\n"));
}

/// H1, per call: a `.git` (or `.codex`) that appears on the host after the session opened is
/// read-only from the very next call — today's bug was that the worker built before it left it
/// writable. The session keeps working (it moves to a worker built for the new state).
#[tokio::test]
async fn h1_a_protected_name_created_after_open_is_protected_from_the_next_call() {
    let d = Daemon::start(&[]).await;
    let base = outside();
    let proj = base.path().join("proj");
    std::fs::create_dir(&proj).unwrap();
    let id = ww(&d, &proj, &[], false).await.unwrap();
    assert_eq!(d.sh(&id, "echo one > a.txt").await.exit_code, 0);

    // The host (a checkout tool, another session) creates them now.
    host_sh(&format!(
        "git init -q '{0}' && mkdir '{0}/.codex'",
        proj.display()
    ));
    let config_before = std::fs::read(proj.join(".git/config")).unwrap();
    let r = d
        .sh(
            &id,
            "echo '[core] fsmonitor = evil' >> .git/config; echo x > .git/hooks/pre-commit; \
             echo x > .codex/config.toml; rm -rf .git; echo two > b.txt",
        )
        .await;
    assert!(r.output.contains("Read-only file system"), "{}", r.output);
    assert_eq!(
        std::fs::read(proj.join(".git/config")).unwrap(),
        config_before
    );
    assert!(!exists(&proj.join(".git/hooks/pre-commit")));
    assert!(!exists(&proj.join(".codex/config.toml")));
    // Allowed path: ordinary files in the same call and later calls.
    assert_eq!(
        std::fs::read_to_string(proj.join("b.txt")).unwrap(),
        "two\n"
    );
    assert_eq!(d.sh(&id, "echo three > c.txt").await.exit_code, 0);
    // apply_patch too.
    let (out, ok) = d
        .invoke(
            &id,
            "apply_patch",
            &serde_json::json!({"input": "*** Begin Patch\n*** Add File: .git/hooks/post-checkout\n+evil\n*** End Patch\n"}).to_string(),
        )
        .await;
    assert!(!ok, "{out}");
    assert!(!exists(&proj.join(".git/hooks/post-checkout")));
}

/// Finding 2 (F28): the cwd itself made a git directory (`HEAD` + `objects/` + `refs/`), which
/// git discovers before any `.git` above. Variants: apply_patch writing `HEAD`; a `.git` file
/// whose gitdir did not exist yet (F22), created inside another writable root.
#[tokio::test]
async fn h2_a_root_cannot_become_a_git_dir_and_a_missing_gitdir_is_guarded() {
    let d = Daemon::start(&[]).await;
    let base = outside();
    let proj = base.path().join("proj");
    let other = base.path().join("other");
    std::fs::create_dir(&proj).unwrap();
    std::fs::create_dir(&other).unwrap();
    let marker = base.path().join("bare-pwned");
    let script = format!(
        "mkdir -p objects refs/heads && printf 'ref: refs/heads/main\\n' > HEAD && \
         printf '[core]\\n\\tbare = false\\n\\tworktree = {proj}\\n\\tfsmonitor = \"echo RAN > \
         {marker}; false\"\\n' > config",
        proj = proj.display(),
        marker = marker.display()
    );
    // Baseline on the host: git discovers the directory itself as a repository and trusts its
    // config (whether `git status` then runs the hook depends on the git version).
    host_sh(&format!("cd '{}' && {script}", proj.display()));
    assert!(
        host_git_discovers(&proj),
        "baseline: the root became a git dir"
    );
    host_sh(&format!(
        "cd '{}' && rm -rf objects refs HEAD config",
        proj.display()
    ));

    std::fs::write(
        proj.join(".git"),
        format!("gitdir: {}\n", other.join("g/wt").display()),
    )
    .unwrap();
    let id = ww(&d, &proj, &[&other], false).await.unwrap();
    let r = d.sh(&id, &script).await;
    assert_ne!(r.exit_code, 0, "{}", r.output);
    assert!(
        r.output.contains(&format!(
            "protected workspace metadata path {}/HEAD",
            proj.display()
        )),
        "{}",
        r.output
    );
    assert!(!exists(&proj.join("HEAD")));
    assert!(!host_git_discovers(&proj), "the root became a git dir");
    assert!(
        !host_git_runs_hook(&proj, &marker),
        "the host's git ran the planted config"
    );
    let id = ww(&d, &proj, &[&other], false).await.unwrap();
    let (out, ok) = d
        .invoke(
            &id,
            "apply_patch",
            &serde_json::json!({"input": "*** Begin Patch\n*** Add File: HEAD\n+ref: refs/heads/main\n*** End Patch\n"}).to_string(),
        )
        .await;
    assert!(!ok, "{out}");
    assert!(!exists(&proj.join("HEAD")));

    // The gitdir the `.git` file names cannot be created, in another root either.
    let r = d
        .sh(
            &id,
            &format!(
                "mkdir -p {0}/g/wt/hooks && echo evil > {0}/g/wt/hooks/post-checkout",
                other.display()
            ),
        )
        .await;
    assert_ne!(r.exit_code, 0, "{}", r.output);
    assert!(!exists(&other.join("g")), "the missing gitdir was created");
    // Allowed: a project directory named `objects`, files in the other root.
    let id = ww(&d, &proj, &[&other], false).await.unwrap();
    let r = d
        .sh(
            &id,
            &format!("mkdir -p objects/pack && echo ok > {}/f", other.display()),
        )
        .await;
    assert_eq!(r.exit_code, 0, "{}", r.output);
}

/// H2/H9, a variant found by review: a `.git` file's missing gitdir one level below an existing
/// directory of the root (`sub/wt`), built inside `sub` while `sub` is moved away and then moved
/// back — no event of the guard names `sub/wt`. Now `sub` is pinned like a protected gitdir's
/// parents, so it cannot be moved or removed, and a gitdir made in place is taken away.
#[tokio::test]
async fn h9_the_parents_of_a_missing_gitdir_cannot_be_moved_and_one_made_in_place_is_taken_away() {
    let d = Daemon::start(&[]).await;
    let base = outside();
    let proj = base.path().join("proj");
    std::fs::create_dir_all(proj.join("sub")).unwrap();
    let marker = base.path().join("moved-pwned");
    let wt = proj.join("sub/wt");
    std::fs::write(proj.join(".git"), format!("gitdir: {}\n", wt.display())).unwrap();
    let plant = |at: &str| {
        format!(
            "mkdir -p {at}/wt/objects {at}/wt/refs/heads && printf 'ref: refs/heads/main\\n' > \
             {at}/wt/HEAD && printf '[core]\\n\\tfsmonitor = \"echo RAN > {marker}; false\"\\n' > \
             {at}/wt/config",
            marker = marker.display()
        )
    };
    // Baseline on the host: the gitdir built in a moved-away parent makes git trust its config.
    host_sh(&format!(
        "cd '{}' && mv sub x && {} && mv x sub",
        proj.display(),
        plant("x")
    ));
    assert!(
        host_git_discovers(&proj),
        "baseline: the gitdir was planted"
    );
    std::fs::remove_dir_all(&wt).unwrap();

    let id = ww(&d, &proj, &[], false).await.unwrap();
    let r = d
        .sh(
            &id,
            &format!(
                "mv sub x; echo rc1=$?; rmdir sub; echo rc2=$?; mkdir x && mv -T x sub; \
                 echo rc3=$?; {}; mv -T x sub; echo rc4=$?; rm -rf x",
                plant("x")
            ),
        )
        .await;
    for rc in ["rc1=1", "rc2=1", "rc3=1", "rc4=1"] {
        assert!(r.output.contains(rc), "{rc}: {}", r.output);
    }
    assert!(exists(&proj.join("sub")), "sub stays: {}", r.output);
    assert!(!exists(&wt), "{}", r.output);
    // Made in place instead: taken away at once.
    let r = d.sh(&id, &plant("sub")).await;
    assert!(
        r.output.contains(&format!(
            "protected workspace metadata path {}",
            wt.display()
        )),
        "{}",
        r.output
    );
    assert!(!exists(&wt), "the gitdir survived the call");
    assert!(!host_git_discovers(&proj), "git found the gitdir");
    assert!(
        !host_git_runs_hook(&proj, &marker),
        "the host's git ran the planted config"
    );
    // Allowed: other directories move, and sub takes other files.
    let id = ww(&d, &proj, &[], false).await.unwrap();
    let r = d
        .sh(
            &id,
            "mkdir other && mv other moved && mkdir sub/fine && echo ok > sub/fine/f",
        )
        .await;
    assert_eq!(r.exit_code, 0, "{}", r.output);
    assert!(exists(&proj.join("moved")) && exists(&proj.join("sub/fine/f")));
    // sub removed on the host (it may), then the worker lost: the next worker, built for the
    // session's old protection, has nothing to pin there and the session goes on.
    std::fs::remove_dir_all(proj.join("sub")).unwrap();
    assert!(!common::procs::kill_serving_workers(&d).await.is_empty());
    let r = d.sh(&id, "echo still; mkdir sub").await;
    assert!(r.output.starts_with("still\n"), "{}", r.output);
    // What is guarded now is `sub` itself, the gitdir's first missing component.
    assert!(
        r.output.contains(&format!(
            "protected workspace metadata path {}",
            proj.join("sub").display()
        )),
        "{}",
        r.output
    );
    assert!(!exists(&proj.join("sub")));
}

/// Finding 4 (F06–F08): a root nested below another writable root, redirected by renaming its
/// parent and planting a symlink, then the worker killed so a new one re-resolves the path.
/// Now: the rename fails inside (the parent is pinned), a host-side swap (as another session or
/// a danger-full-access call could do) makes the next worker refuse instead of binding the
/// target, and a new session on the same path gets its own worker for the new inode.
#[tokio::test]
async fn h4_a_root_cannot_be_redirected_by_renaming_its_parents() {
    let d = Daemon::start(&[]).await;
    let base = tempfile::tempdir_in("/tmp").unwrap();
    let rtw = base.path();
    let proj = rtw.join("a/proj");
    std::fs::create_dir_all(&proj).unwrap();
    // The attacker's target: a directory outside every root (the victim's home in the notes).
    let victim = outside();
    std::fs::create_dir(victim.path().join("proj")).unwrap();
    let bashrc = victim.path().join("proj/.bashrc");
    std::fs::write(&bashrc, "safe\n").unwrap();

    let id = ww(&d, &proj, &[], true).await.unwrap();
    // Inside: the red-team's step 1 fails at the rename.
    let r = d
        .sh(
            &id,
            &format!("cd {} && mv a a.old; echo rc=$?", rtw.display()),
        )
        .await;
    assert!(
        r.output.contains("rc=1") && r.output.contains("busy"),
        "{}",
        r.output
    );
    assert!(proj.is_dir() && !exists(&rtw.join("a.old")));

    // The same swap done outside this sandbox (another session, a danger-full-access call),
    // then the worker dies: its replacement must not bind the new target.
    std::fs::rename(rtw.join("a"), rtw.join("a.old")).unwrap();
    std::os::unix::fs::symlink(victim.path(), rtw.join("a")).unwrap();
    host_sh(&format!("pkill -KILL -P {} -f __worker", d.pid()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let err = d
        .tools()
        .await
        .shell(api::ShellRequest {
            session_id: id.clone(),
            command: vec!["bash".into(), "-c".into(), "echo PWNED >> .bashrc".into()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("pinned"), "{}", err.message());
    assert_eq!(std::fs::read_to_string(&bashrc).unwrap(), "safe\n");
    // apply_patch through the same session is refused as well.
    let err = d
        .bridge()
        .await
        .invoke(api::InvokeRequest {
            session_id: id.clone(),
            name: "apply_patch".into(),
            arguments: serde_json::json!({"input": "*** Begin Patch\n*** Update File: .bashrc\n@@\n-safe\n+PWNED\n*** End Patch\n"}).to_string(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert_eq!(std::fs::read_to_string(&bashrc).unwrap(), "safe\n");
    // A new session naming the same path resolves it as it is now (the caller sees where), and
    // gets a worker of its own: the pool key holds the pinned identities.
    let fresh = d
        .sessions()
        .await
        .open_session(api::OpenSessionRequest {
            cwd: proj.display().to_string(),
            mode: SandboxMode::WorkspaceWrite as i32,
            exclude_slash_tmp: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        fresh.writable_roots,
        vec![victim.path().join("proj").display().to_string()]
    );
}

/// Finding 5 (X01, X03): a FIFO or /dev/zero named `commondir` used to wedge or OOM the root
/// daemon during OpenSession. Now the path is read by the resolver as the caller, bounded and
/// non-blocking; the refusal is prompt, and another client's health checks stay fast meanwhile.
#[tokio::test]
async fn h5_hostile_pointer_files_cost_the_daemon_nothing() {
    let d = Daemon::start(&[]).await;
    let base = outside();
    let (proj, g) = (base.path().join("proj"), base.path().join("g"));
    std::fs::create_dir_all(&proj).unwrap();
    std::fs::create_dir_all(&g).unwrap();
    nix::unistd::mkfifo(&g.join("commondir"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    std::fs::write(proj.join(".git"), format!("gitdir: {}\n", g.display())).unwrap();
    let g2 = base.path().join("g2");
    let proj2 = base.path().join("proj2");
    std::fs::create_dir_all(&g2).unwrap();
    std::fs::create_dir_all(&proj2).unwrap();
    std::os::unix::fs::symlink("/dev/zero", g2.join("commondir")).unwrap();
    std::fs::write(proj2.join(".git"), format!("gitdir: {}\n", g2.display())).unwrap();

    // Idle latency of health, then under four concurrent hostile OpenSessions.
    let health = |d: &Daemon| {
        let target = d.target().to_string();
        async move {
            let ch = corral::client::connect(&target).await.unwrap();
            let mut c = tonic_health::pb::health_client::HealthClient::new(ch);
            let mut times = Vec::new();
            for _ in 0..40 {
                let t = Instant::now();
                c.check(tonic_health::pb::HealthCheckRequest::default())
                    .await
                    .unwrap();
                times.push(t.elapsed());
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            times.sort();
            // (p90, max): one late sample on a shared machine is the scheduler; a daemon
            // frozen by the attack slows them all.
            (times[times.len() * 90 / 100], times[times.len() - 1])
        }
    };
    let idle = health(&d).await;
    let started = Instant::now();
    let attacks = futures_util::future::join_all(
        [&proj, &proj2, &proj, &proj2]
            .into_iter()
            .map(|p| ww(&d, p, &[], false)),
    );
    let (results, busy) = tokio::join!(attacks, health(&d));
    for r in &results {
        let err = r.as_ref().unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
        assert!(err.message().contains("commondir"), "{}", err.message());
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let ((idle_p90, _), (busy_p90, busy_max)) = (idle, busy);
    assert!(
        busy_p90 <= idle_p90 * 5 + Duration::from_millis(50),
        "health p90 {busy_p90:?} under attack vs {idle_p90:?} idle"
    );
    assert!(
        busy_max < Duration::from_secs(1),
        "a health check took {busy_max:?} under attack"
    );
    // Allowed path: an ordinary worktree pointer still opens.
    std::fs::remove_file(proj.join(".git")).unwrap();
    ww(&d, &proj, &[], false).await.unwrap();
}

/// Finding 8 (F05): a host read-only mount below a writable root used to become writable.
#[tokio::test]
async fn h8_read_only_submounts_stay_read_only() {
    let d = Daemon::start(&[]).await;
    let base = outside();
    let (proj, data) = (base.path().join("proj"), base.path().join("rodata"));
    std::fs::create_dir_all(proj.join("romnt")).unwrap();
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("file"), "original\n").unwrap();
    let mnt = proj.join("romnt");
    let (code, out) = host_sh(&format!(
        "mount --bind '{}' '{1}' && mount -o remount,bind,ro '{1}'",
        data.display(),
        mnt.display()
    ));
    assert_eq!(code, 0, "{out}");
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            host_sh(&format!("umount '{}'", self.0.display()));
        }
    }
    let _unmount = Unmount(mnt.clone());
    // Baseline: read-only on the host.
    assert_ne!(host_sh(&format!("echo x > '{}/file'", mnt.display())).0, 0);
    let id = ww(&d, &proj, &[], false).await.unwrap();
    let r = d
        .sh(&id, "echo x > romnt/file; echo y > romnt/new; echo ok > f")
        .await;
    assert!(r.output.contains("Read-only file system"), "{}", r.output);
    assert_eq!(
        std::fs::read_to_string(data.join("file")).unwrap(),
        "original\n"
    );
    assert!(!exists(&data.join("new")));
    assert_eq!(std::fs::read_to_string(proj.join("f")).unwrap(), "ok\n");
}

/// Finding 9 (F31): renaming the parent of a worktree's protected gitdir/common dir and
/// rebuilding it. Now every directory between the root and a protected path is a mount point.
#[tokio::test]
async fn h9_parents_of_a_protected_gitdir_cannot_be_renamed() {
    let d = Daemon::start(&[]).await;
    let base = outside();
    let src = base.path().join("src");
    let main = src.join("main");
    std::fs::create_dir_all(&main).unwrap();
    let (code, out) = host_sh(&format!(
        "cd '{}' && git init -q && git -c user.email=t@t -c user.name=t commit -q --allow-empty -m i && git worktree add -q ../wt",
        main.display()
    ));
    assert_eq!(code, 0, "{out}");
    let config_before = std::fs::read(main.join(".git/config")).unwrap();
    let id = ww(&d, &src.join("wt"), &[&src], false).await.unwrap();
    let r = d
        .sh(
            &id,
            &format!(
                "mv {0}/main {0}/main.moved; echo rc1=$?; mv {0}/main/.git {0}/main/git.moved; \
                 echo rc2=$?; mv {0}/main/.git/worktrees {0}/w; echo rc3=$?; echo x >> {0}/main/.git/config",
                src.display()
            ),
        )
        .await;
    for rc in ["rc1=1", "rc2=1", "rc3=1"] {
        assert!(r.output.contains(rc), "{rc}: {}", r.output);
    }
    assert!(main.join(".git/config").exists());
    assert_eq!(
        std::fs::read(main.join(".git/config")).unwrap(),
        config_before
    );
    // Allowed: ordinary files in the worktree and in the main checkout.
    let r = d
        .sh(
            &id,
            &format!("echo ok > f && echo ok > {}/g", main.display()),
        )
        .await;
    assert_eq!(r.exit_code, 0, "{}", r.output);
    // The main checkout removed on the host (it may be), then the worker lost: the next worker
    // has no gitdir to protect or pin there, and the first call gets a worker built for what is
    // there now, where `main` is the worktree's guarded missing gitdir.
    std::fs::remove_dir_all(&main).unwrap();
    assert!(!common::procs::kill_serving_workers(&d).await.is_empty());
    let r = d
        .sh(&id, &format!("echo still; mkdir {}", main.display()))
        .await;
    assert!(r.output.starts_with("still\n"), "{}", r.output);
    assert!(
        r.output.contains(&format!(
            "protected workspace metadata path {}",
            main.display()
        )),
        "{}",
        r.output
    );
    assert!(!exists(&main));
}

/// Finding 10 (F32): `roots_under` is checked on the canonical form of every root, from every
/// source: a symlink inside the allowed tree, `TMPDIR`, and `/tmp` itself.
#[tokio::test]
async fn h10_roots_under_holds_for_canonical_roots_from_every_source() {
    let allowed = outside();
    let elsewhere = outside();
    let conf = outside();
    let conf_file = conf.path().join("corral.toml");
    std::fs::write(
        &conf_file,
        format!(
            "[policy.users.root]\nroots_under = [\"{}\"]\n",
            allowed.path().display()
        ),
    )
    .unwrap();
    let d = Daemon::start(&["--config", conf_file.to_str().unwrap()]).await;
    std::os::unix::fs::symlink(elsewhere.path(), allowed.path().join("link")).unwrap();
    let inside = allowed.path().join("proj");
    std::fs::create_dir(&inside).unwrap();
    // Baseline/allowed: a plain directory under the allowed tree.
    ww(&d, &inside, &[], false).await.unwrap();
    // Through a symlink that leads out.
    let err = ww(&d, &allowed.path().join("link"), &[], false)
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    // /tmp is a root by default and lies outside.
    let err = ww(&d, &inside, &[], true).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("/tmp"), "{}", err.message());
    // TMPDIR outside.
    let mut env = common::session_env(&inside);
    env.insert("TMPDIR".into(), elsewhere.path().display().to_string());
    let err = d
        .try_open_with(api::OpenSessionRequest {
            cwd: inside.display().to_string(),
            mode: SandboxMode::WorkspaceWrite as i32,
            exclude_slash_tmp: true,
            env,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
}

/// H13 (R09): a sandbox cannot take the caller's per-uid inotify instances; H14 (F30): it cannot
/// open a root to other users.
#[tokio::test]
async fn h13_h14_no_inotify_instances_and_roots_stay_private() {
    let d = Daemon::start(&[]).await;
    let base = outside();
    let proj = base.path().join("proj");
    std::fs::create_dir(&proj).unwrap();
    std::fs::set_permissions(&proj, std::fs::Permissions::from_mode(0o755)).unwrap();
    let id = ww(&d, &proj, &[], false).await.unwrap();
    let probe = "import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); \
                 fd = libc.inotify_init1(0); print('fd', fd, 'errno', ctypes.get_errno())";
    // Baseline on the host.
    let (_, host) = host_sh(&format!("python3 -c \"{probe}\""));
    assert!(
        host.starts_with("fd ") && !host.starts_with("fd -1"),
        "{host}"
    );
    let r = d.sh(&id, &format!("python3 -c \"{probe}\"")).await;
    assert!(r.output.contains("fd -1 errno 1"), "{}", r.output);

    let r = d.sh(&id, "chmod 0777 .; chmod g+w .; echo ok > f").await;
    assert_ne!(r.exit_code, 0, "{}", r.output);
    assert!(
        r.output.contains("sandbox blocked making writable root"),
        "{}",
        r.output
    );
    let mode = std::fs::metadata(&proj).unwrap().mode() & 0o777;
    assert_eq!(mode & 0o022, 0, "the root is writable by others: {mode:o}");
    // Allowed: permissions of ordinary files inside the root.
    let r = d.sh(&id, "chmod 0640 f && stat -c %a f").await;
    assert_eq!((r.exit_code, r.output.trim()), (0, "640"));
}

/// H15 (X07–X11): a worker's policy is not in its argv (every local user can read /proc/PID/cmdline).
#[tokio::test]
async fn h15_worker_policy_is_not_in_argv() {
    let d = Daemon::start(&[]).await;
    let base = outside();
    let proj = base.path().join("secret-project-name");
    std::fs::create_dir(&proj).unwrap();
    let id = ww(&d, &proj, &[], false).await.unwrap();
    assert_eq!(d.sh(&id, "true").await.exit_code, 0);
    let (_, pids) = host_sh(&format!("pgrep -P {} -f __worker", d.pid()));
    let pids: Vec<&str> = pids.split_whitespace().collect();
    assert!(!pids.is_empty(), "no worker found");
    for pid in pids {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let text = String::from_utf8_lossy(&cmdline);
        assert!(!text.contains("secret-project-name"), "{text}");
        assert!(!text.contains("writable_roots"), "{text}");
    }

    // Paths the caller cannot see are resolved as the caller: an existing directory, a file
    // and a missing name inside another user's 0700 directory answer alike (the confined root
    // caller has no capability to look in). Baseline: root's own view tells them apart.
    let private = base.path().join("private");
    std::fs::create_dir_all(private.join("exists")).unwrap();
    std::fs::write(private.join("file"), "x").unwrap();
    std::os::unix::fs::chown(&private, Some(65534), Some(65534)).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    assert!(private.join("exists").is_dir() && !exists(&private.join("missing")));
    let mut answers = Vec::new();
    for name in ["exists", "file", "missing"] {
        let path = private.join(name);
        let err = d.try_open(&path, SandboxMode::ReadOnly).await.unwrap_err();
        answers.push((
            err.code(),
            err.message().replace(&path.display().to_string(), "PATH"),
        ));
    }
    assert!(
        answers.iter().all(|a| *a == answers[0]),
        "answers differ: {answers:?}"
    );
}

/// Found by our own attack review: apply_patch checks its targets, then writes by path; a
/// concurrent command swaps a directory on the way for a symlink to the root in between, so the
/// patch's `sub/.git/...` lands in the root's `.git` — after the command's guard has ended.
/// Patches now run under the guard too; whichever way the race goes, no `.git` (or bare-style
/// `HEAD`) is left at the root's top, and the patch that made one fails.
#[tokio::test]
async fn h1_apply_patch_racing_a_symlink_swap_plants_nothing() {
    let d = Daemon::start(&[]).await;
    let base = outside();
    let ws = base.path().join("ws");
    std::fs::create_dir_all(ws.join("sub")).unwrap();
    std::fs::create_dir_all(ws.join("bulk")).unwrap();
    let id = ww(&d, &ws, &[], false).await.unwrap();
    let mut patch = String::from("*** Begin Patch\n");
    for i in 0..2000 {
        patch.push_str(&format!("*** Add File: bulk/f{i:05}\n+x\n"));
    }
    for f in [
        "sub/.git/HEAD",
        "sub/.git/objects/keep",
        "sub/.git/refs/heads/keep",
        "sub/HEAD",
    ] {
        patch.push_str(&format!("*** Add File: {f}\n+ref: refs/heads/main\n"));
    }
    patch.push_str(
        "*** Add File: sub/.git/config\n+[core]\n+\tfsmonitor = \"touch PWNED; false\"\n",
    );
    patch.push_str("*** End Patch\n");
    let swapper = {
        let mut tools = d.tools().await;
        let id = id.clone();
        tokio::spawn(async move {
            tools
                .shell(api::ShellRequest {
                    session_id: id,
                    command: vec![
                        "bash".into(),
                        "-c".into(),
                        "for i in $(seq 3000); do [ -e bulk/f00600 ] && break; sleep 0.005; done; \
                         rm -rf sub; ln -s . sub"
                            .into(),
                    ],
                    timeout_ms: Some(30_000),
                    ..Default::default()
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (out, ok) = d
        .invoke(
            &id,
            "apply_patch",
            &serde_json::json!({ "input": patch }).to_string(),
        )
        .await;
    swapper.await.unwrap().unwrap();
    for name in [".git", "HEAD"] {
        assert!(
            !exists(&ws.join(name)),
            "{name} planted at the root (patch ok={ok}: {out:.300})"
        );
    }
    if exists(&ws.join("bulk/f01999"))
        && std::fs::symlink_metadata(ws.join("sub")).is_ok_and(|m| m.file_type().is_symlink())
    {
        // The swap came first: the patch tried to write through it and must have failed.
        assert!(!ok, "{out:.300}");
    }
}

/// Commits a change in `repo` with `run` (the host, as some user) and says whether a planted
/// hook ran (it writes `marker`).
fn commit_runs_hook(run: &dyn Fn(&str) -> (i32, String), repo: &Path, marker: &Path) -> bool {
    let _ = std::fs::remove_file(marker);
    run(&format!(
        "cd \"{}\" && echo x >> file && git add file && git commit -qm x >/dev/null 2>&1; true",
        repo.display()
    ));
    exists(marker)
}

/// H20 (red team finding 4, H1-05): a husky-style repository (`core.hooksPath .husky`) runs its
/// hooks from the worktree. The hooks directory — and a hooks path or fsmonitor hook an
/// included config file names — is read-only in the sandbox, so nothing the sandbox writes runs
/// at the host's next `git commit`. Baseline first: the same writes on the host do run.
#[tokio::test]
async fn h20_hooks_a_repository_runs_from_its_worktree_are_read_only() {
    let d = Daemon::start(&[]).await;
    let dir = outside();
    let repo = dir.path().join("repo");
    let marker = dir.path().join("HOOK-RAN");
    let (code, out) = host_sh(&format!(
        "git init -q '{0}' && cd '{0}' && git config user.email t@t && git config user.name t \
         && mkdir .husky && printf '#!/bin/sh\\nexit 0\\n' > .husky/pre-commit \
         && chmod +x .husky/pre-commit && git config core.hooksPath .husky \
         && printf '[core]\\n\\tfsmonitor = tools/fsmon\\n' > shared.gitconfig \
         && git config include.path ../shared.gitconfig",
        repo.display()
    ));
    assert_eq!(code, 0, "{out}");
    let plant = format!(
        "printf '#!/bin/sh\\ntouch {}\\n' > .husky/pre-commit",
        marker.display()
    );
    let host_commit = || commit_runs_hook(&host_sh, &repo, &marker);
    // Baseline: on the host, the same write makes the next commit run it.
    host_sh(&format!("cd '{}' && {plant}", repo.display()));
    assert!(host_commit(), "baseline: the planted hook did not run");
    host_sh(&format!(
        "cd '{}' && printf '#!/bin/sh\\nexit 0\\n' > .husky/pre-commit",
        repo.display()
    ));
    assert!(!host_commit());

    // Overwrite the hook, add another, replace the directory, change the included config.
    for attack in [
        plant.clone(),
        format!(
            "printf '#!/bin/sh\\ntouch {}\\n' > .husky/post-commit && chmod +x .husky/post-commit",
            marker.display()
        ),
        format!(
            "mv .husky .husky-old && mkdir .husky && printf '#!/bin/sh\\ntouch {}\\n' > .husky/pre-commit && chmod +x .husky/pre-commit",
            marker.display()
        ),
        "printf '[core]\\n\\thooksPath = evil\\n' > shared.gitconfig".to_string(),
        format!(
            "mkdir -p tools && printf '#!/bin/sh\\ntouch {}\\n' > tools/fsmon && chmod +x tools/fsmon",
            marker.display()
        ),
    ] {
        let id = ww(&d, &repo, &[], false).await.unwrap();
        let r = d.sh(&id, &attack).await;
        assert_ne!(r.exit_code, 0, "{attack}: {}", r.output);
        assert!(
            !host_commit(),
            "the host's commit ran a hook after: {attack}"
        );
        assert!(!exists(&repo.join("tools/fsmon")), "{attack}");
    }
    // The allowed path: the rest of the worktree stays writable.
    let id = ww(&d, &repo, &[], false).await.unwrap();
    let r = d.sh(&id, "echo ok > src.txt && cat src.txt").await;
    assert_eq!((r.exit_code, r.output.as_str()), (0, "ok\n"));
}

/// H24 (red team H4-02): another session of the same user swaps a parent of this session's
/// nested root for a symlink to a decoy (in its own namespace the parent is no mount point).
/// This session's commands still start in the directory pinned when its worker was built —
/// `pwd`, relative reads and writes — not in the decoy the path now leads to.
#[tokio::test]
async fn h24_commands_start_in_the_pinned_root_not_where_its_path_leads() {
    let d = Daemon::start(&[]).await;
    let base = outside();
    let b = base.path();
    let proj = b.join("a/proj");
    std::fs::create_dir_all(&proj).unwrap();
    std::fs::write(proj.join("file"), "real\n").unwrap();
    let decoy = b.join("decoy/proj");
    std::fs::create_dir_all(&decoy).unwrap();
    std::fs::write(decoy.join("file"), "decoy\n").unwrap();
    // A: the nested root `a/proj` inside the enclosing root `base`; its first command builds
    // the worker.
    let a = ww(&d, &proj, &[b], false).await.unwrap();
    let r = d.sh(&a, "pwd; cat file").await;
    let canonical = std::fs::canonicalize(&proj).unwrap();
    assert_eq!(r.output, format!("{}\nreal\n", canonical.display()));
    // B, the same user on `base`: swaps `a` for a link to the decoy.
    let s = ww(&d, b, &[], false).await.unwrap();
    let r = d
        .sh(&s, "mv a a.old && ln -s decoy a && cat a/proj/file")
        .await;
    assert_eq!(
        (r.exit_code, r.output.as_str()),
        (0, "decoy\n"),
        "{}",
        r.output
    );
    // A's next commands: in the real directory, wherever it now is.
    let r = d.sh(&a, "cat file; echo more >> file; pwd -P").await;
    assert_eq!(r.exit_code, 0, "{}", r.output);
    assert!(r.output.starts_with("real\n"), "{}", r.output);
    assert!(!r.output.contains("decoy"), "{}", r.output);
    assert_eq!(
        std::fs::read_to_string(b.join("a.old/proj/file")).unwrap(),
        "real\nmore\n"
    );
    assert_eq!(
        std::fs::read_to_string(decoy.join("file")).unwrap(),
        "decoy\n"
    );
    // exec_command (unified exec) the same way.
    let (out, _) = d.invoke(&a, "exec_command", r#"{"cmd":"cat file"}"#).await;
    assert!(out.contains("real") && !out.contains("decoy"), "{out}");
}

/// H24 for the file tools: after the same swap, every file tool of session A — read_file (an
/// absolute path under its cwd), list_dir, grep_files (default path, and a relative one with an
/// anchored include), view_image, apply_patch (relative paths), ReadBytes/WriteBytes and
/// Upload/Download — acts on the real tree (now at `a.old/proj` on the host), never on the
/// decoy, and shows the paths as before. Baseline, run before the tools reached paths through
/// the pinned descriptor: read_file answered `L1: decoy`, list_dir listed `decoy-only.txt`,
/// grep_files found `a/proj/decoy-only.txt`, and apply_patch and WriteBytes wrote into
/// `decoy/proj` (A's enclosing root `base` makes it writable).
#[tokio::test]
async fn h24_file_tools_act_on_the_pinned_root_not_where_its_path_leads() {
    h24_file_tools(&RunAs::Root).await;
}

/// The same with a daemon of an ordinary user (its workers in a user namespace).
#[tokio::test]
async fn h24_file_tools_act_on_the_pinned_root_without_root_too() {
    if let Some(who) = RunAs::next_ordinary_user("h24f") {
        h24_file_tools(&who).await;
    }
}

async fn h24_file_tools(who: &RunAs) {
    use api::{download_response::Item as Down, upload_request::Item as Up};
    let d = who.start(&[]).await;
    let base = who.outside();
    let b = base.path();
    let proj = b.join("a/proj");
    std::fs::create_dir_all(proj.join("sub")).unwrap();
    std::fs::write(proj.join("file"), "real\n").unwrap();
    std::fs::write(proj.join("real-only.txt"), "needle\n").unwrap();
    std::fs::write(proj.join("sub/deep.txt"), "needle deep\n").unwrap();
    let img = image::RgbaImage::from_pixel(2, 2, image::Rgba([1, 2, 3, 255]));
    image::DynamicImage::ImageRgba8(img)
        .save_with_format(proj.join("pic.png"), image::ImageFormat::Png)
        .unwrap();
    let decoy = b.join("decoy/proj");
    std::fs::create_dir_all(&decoy).unwrap();
    std::fs::write(decoy.join("file"), "decoy\n").unwrap();
    std::fs::write(decoy.join("decoy-only.txt"), "needle\n").unwrap();
    who.own(b);
    let canonical = std::fs::canonicalize(&proj).unwrap();
    let shown = canonical.display().to_string();
    // A's worker is built (and its cwd pinned) before the swap.
    let a = ww(&d, &proj, &[b], false).await.unwrap();
    assert_eq!(d.sh(&a, "cat file").await.output, "real\n");
    let s = ww(&d, b, &[], false).await.unwrap();
    let r = d.sh(&s, "mv a a.old && ln -s decoy a").await;
    assert_eq!(r.exit_code, 0, "{}", r.output);
    let real = b.join("a.old/proj");

    // read_file of an absolute path under the cwd.
    let (out, ok) = d
        .invoke(
            &a,
            "read_file",
            &serde_json::json!({ "file_path": format!("{shown}/file") }).to_string(),
        )
        .await;
    assert!(ok, "{out}");
    assert_eq!(out, "L1: real");
    // list_dir of the cwd: the real entries, the path as it was given.
    let (out, ok) = d
        .invoke(
            &a,
            "list_dir",
            &serde_json::json!({ "dir_path": shown }).to_string(),
        )
        .await;
    assert!(ok, "{out}");
    assert!(
        out.starts_with(&format!("Absolute path: {shown}\n")),
        "{out}"
    );
    assert!(
        out.contains("real-only.txt") && out.contains("sub/"),
        "{out}"
    );
    assert!(!out.contains("decoy"), "{out}");
    // grep_files in the cwd (no path): the real files, named under the cwd's path.
    let (out, ok) = d.invoke(&a, "grep_files", r#"{"pattern":"needle"}"#).await;
    assert!(ok, "{out}");
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            format!("{shown}/real-only.txt"),
            format!("{shown}/sub/deep.txt")
        ],
        "{out}"
    );
    // grep_files with a relative path and an anchored include glob.
    let (out, ok) = d
        .invoke(
            &a,
            "grep_files",
            r#"{"pattern":"needle","path":"sub","include":"sub/*.txt"}"#,
        )
        .await;
    assert!(ok, "{out}");
    assert_eq!(out, format!("{shown}/sub/deep.txt"));
    // view_image of a relative path: only the real tree has the image.
    let (out, ok) = d.invoke(&a, "view_image", r#"{"path":"pic.png"}"#).await;
    assert!(ok, "{out}");
    // apply_patch with relative paths: an added file, an updated one, one in a new directory.
    let patch = "*** Begin Patch\n*** Add File: added.txt\n+added\n*** Update File: file\n\
                 @@\n-real\n+patched\n*** Add File: new/dir/f.txt\n+nested\n*** End Patch";
    let (out, ok) = d
        .invoke(
            &a,
            "apply_patch",
            &serde_json::json!({ "input": patch }).to_string(),
        )
        .await;
    assert!(ok, "{out}");
    assert!(
        out.contains("A added.txt\nA new/dir/f.txt\nM file\n"),
        "{out}"
    );
    assert_eq!(
        std::fs::read_to_string(real.join("added.txt")).unwrap(),
        "added\n"
    );
    assert_eq!(
        std::fs::read_to_string(real.join("file")).unwrap(),
        "patched\n"
    );
    assert_eq!(
        std::fs::read_to_string(real.join("new/dir/f.txt")).unwrap(),
        "nested\n"
    );
    // ReadBytes and WriteBytes, relative.
    let r = d
        .files()
        .await
        .read_bytes(api::ReadBytesRequest {
            session_id: a.clone(),
            path: "file".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (r.path.as_str(), &r.data[..]),
        (&*format!("{shown}/file"), &b"patched\n"[..])
    );
    let w = d
        .files()
        .await
        .write_bytes(api::WriteBytesRequest {
            session_id: a.clone(),
            path: "written.bin".into(),
            data: b"written\n".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(w.path, format!("{shown}/written.bin"));
    assert_eq!(
        std::fs::read(real.join("written.bin")).unwrap(),
        b"written\n"
    );
    // Upload a file (relative destination), then download the cwd itself.
    let msgs = vec![
        api::UploadRequest {
            item: Some(Up::Start(api::UploadStart {
                session_id: a.clone(),
                path: "uploaded.txt".into(),
                ..Default::default()
            })),
        },
        api::UploadRequest {
            item: Some(Up::Entry(api::TransferEntry {
                path: String::new(),
                kind: api::EntryKind::File as i32,
                mode: Some(0o644),
                size: 9,
                link_target: String::new(),
            })),
        },
        api::UploadRequest {
            item: Some(Up::Data(b"uploaded\n".to_vec())),
        },
        api::UploadRequest {
            item: Some(Up::Finish(api::UploadFinish {
                entries: 1,
                bytes: 9,
            })),
        },
    ];
    let sum = d
        .files()
        .await
        .upload(tokio_stream::iter(msgs))
        .await
        .unwrap()
        .into_inner()
        .summary
        .unwrap();
    assert_eq!(sum.path, format!("{shown}/uploaded.txt"));
    assert_eq!(
        std::fs::read_to_string(real.join("uploaded.txt")).unwrap(),
        "uploaded\n"
    );
    for path in [".", shown.as_str()] {
        let mut stream = d
            .files()
            .await
            .download(api::DownloadRequest {
                session_id: a.clone(),
                path: path.into(),
            })
            .await
            .unwrap()
            .into_inner();
        let mut names = Vec::new();
        let mut summary = None;
        while let Some(msg) = stream.message().await.unwrap() {
            match msg.item.unwrap() {
                Down::Entry(e) => names.push(e.path),
                Down::Data(_) => {}
                Down::Summary(s) => summary = Some(s),
            }
        }
        assert!(
            names.iter().any(|n| n == "uploaded.txt") && names.iter().any(|n| n == "sub/deep.txt"),
            "{path}: {names:?}"
        );
        assert!(!names.iter().any(|n| n.contains("decoy")), "{names:?}");
        let want = if path == "." {
            format!("{shown}/.")
        } else {
            shown.clone()
        };
        assert_eq!(summary.unwrap().path, want);
    }

    // The decoy is untouched.
    let mut left: Vec<String> = std::fs::read_dir(&decoy)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["decoy-only.txt", "file"]);
    assert_eq!(
        std::fs::read_to_string(decoy.join("file")).unwrap(),
        "decoy\n"
    );
}

/// H20 with the user's global git config (review finding): `core.hooksPath = .githooks` in
/// `~/.gitconfig` points into every worktree. The sandbox cannot make that directory; the
/// host's next commit runs nothing. Baseline first: on the host the same hook runs.
#[tokio::test]
async fn h20_a_hooks_path_from_the_global_git_config_is_protected_too() {
    let user = common::TestUser::create("h20g");
    let home = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(user.uid))
        .unwrap()
        .unwrap()
        .dir;
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(home.join(".gitconfig"), "[core]\n\thooksPath = .githooks\n").unwrap();
    let repo = user.dir.join("repo");
    let marker = user.dir.join("GLOBAL-HOOK-RAN");
    host_sh(&format!(
        "chown -R {0}:{1} '{2}' && chmod 700 '{2}'",
        user.uid,
        user.gid,
        home.display()
    ));
    let as_user = |script: &str| {
        host_sh(&format!(
            "setpriv --reuid {} --regid {} --init-groups env HOME='{}' sh -c '{}'",
            user.uid,
            user.gid,
            home.display(),
            script
        ))
    };
    let (code, out) = as_user(&format!(
        "git init -q {0} && cd {0} && git config user.email t@t && git config user.name t",
        repo.display()
    ));
    assert_eq!(code, 0, "{out}");
    let plant = format!(
        "mkdir -p .githooks && printf \"#!/bin/sh\\ntouch {}\\n\" > .githooks/pre-commit \
         && chmod +x .githooks/pre-commit",
        marker.display()
    );
    let commit = || commit_runs_hook(&as_user, &repo, &marker);
    // Baseline on the host.
    as_user(&format!("cd {} && {plant}", repo.display()));
    assert!(commit(), "baseline: the global hooksPath hook did not run");
    as_user(&format!("rm -rf {}/.githooks", repo.display()));
    assert!(!commit());

    let d = Daemon::start(&[]).await;
    let socket = d.open_to_local_users();
    let (code, out, err) = user.corral(
        &socket,
        &[
            "exec",
            "--mode",
            "workspace-write",
            "--cwd",
            repo.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &plant,
        ],
    );
    assert_ne!(code, 0, "{out} {err}");
    assert!(
        err.contains("protected") || out.contains("protected"),
        "refused by the guard: {out} {err}"
    );
    assert!(
        !commit(),
        "the host's commit ran a hook the sandbox planted"
    );
    assert!(!exists(&repo.join(".githooks/pre-commit")));
    // The allowed path: the worktree itself is writable.
    let (code, _, err) = user.corral(
        &socket,
        &[
            "exec",
            "--mode",
            "workspace-write",
            "--cwd",
            repo.to_str().unwrap(),
            "--",
            "touch",
            "allowed.txt",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(exists(&repo.join("allowed.txt")));
    let _ = std::fs::remove_dir_all(&home);
}

/// H27: a protected name that a process outside the sandbox makes in a shared root while a
/// command runs (Codex's own sandbox makes its empty `.git`/`.codex`/`.agents` mount points in
/// `/tmp` this way) is never removed, and the call is not failed for it. What the sandbox then
/// makes inside it, or puts in its place, is stopped and taken away — the host's empty
/// directory is no way in.
#[tokio::test]
async fn h27_the_guard_leaves_what_the_host_made_and_stops_what_the_sandbox_made() {
    let d = Daemon::start(&[]).await;
    let base = outside();
    let proj = base.path().join("proj");
    let shared = base.path().join("shared");
    std::fs::create_dir(&proj).unwrap();
    std::fs::create_dir(&shared).unwrap();
    let made_by_host = |name: &'static str, then: &'static str| {
        let shared = shared.clone();
        async move {
            let host = tokio::task::spawn_blocking({
                let shared = shared.clone();
                move || {
                    std::thread::sleep(Duration::from_millis(400));
                    std::fs::create_dir(shared.join(name)).unwrap();
                }
            });
            (
                host,
                format!(
                    "cd '{}'; until [ -d {name} ]; do sleep 0.02; done; {then}",
                    shared.display()
                ),
            )
        }
    };

    // Baseline, what a host-made mount point looked like to the old guard: it is there when
    // the command looks, and the command goes on with exit 0.
    let id = ww(&d, &proj, &[&shared], false).await.unwrap();
    let (host, script) = made_by_host(".codex", "ls -a .codex; echo done").await;
    let r = d.sh(&id, &script).await;
    host.await.unwrap();
    assert_eq!(r.exit_code, 0, "{}", r.output);
    assert!(r.output.contains("done"), "{}", r.output);
    assert!(!r.output.contains("sandbox blocked"), "{}", r.output);
    assert!(
        exists(&shared.join(".codex")),
        "the host's .codex was removed"
    );
    // The session goes on (on a worker built with the host's .codex protected).
    let r = d.sh(&id, "echo next > file && cat file").await;
    assert_eq!((r.exit_code, r.output.as_str()), (0, "next\n"));
    std::fs::remove_dir(shared.join(".codex")).unwrap();

    // The sandbox fills a host-made empty .git: stopped, its entry taken away, the host's
    // directory kept.
    let counter = base.path().join("h27-runs");
    let id = ww(&d, &proj, &[&shared], false).await.unwrap();
    let fill = gitdir_script(".git", &counter);
    let (host, script) = made_by_host(".git", Box::leak(fill.into_boxed_str())).await;
    let r = d.sh(&id, &script).await;
    host.await.unwrap();
    assert_ne!(r.exit_code, 0, "{}", r.output);
    assert!(
        r.output
            .contains("sandbox stopped every process of this session"),
        "{}",
        r.output
    );
    assert!(exists(&shared.join(".git")), "the host's .git was removed");
    let left: Vec<_> = std::fs::read_dir(shared.join(".git"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "the sandbox's entries stayed: {left:?}");
    assert!(
        !host_git_discovers(&shared),
        "the host's git found a planted repository"
    );
    assert_eq!(count_lines(&counter), 0);
    std::fs::remove_dir(shared.join(".git")).unwrap();

    // The sandbox moves the host's .agents away and puts its own in its place: stopped, its
    // own taken away.
    let id = ww(&d, &proj, &[&shared], false).await.unwrap();
    let (host, script) = made_by_host(
        ".agents",
        "mkdir mine && touch mine/evil && mv .agents theirs && mv mine .agents",
    )
    .await;
    let r = d.sh(&id, &script).await;
    host.await.unwrap();
    assert!(
        r.output
            .contains("sandbox stopped every process of this session"),
        "{}",
        r.output
    );
    assert!(
        !exists(&shared.join(".agents/evil")),
        "the sandbox's .agents stayed"
    );

    // The host makes an empty `.git` *file* (a mount point for a file); the sandbox writes a
    // `gitdir:` pointer into it: stopped, and the file, its content now the sandbox's, taken
    // away before the host's git follows it.
    let planted = base.path().join("planted-gitdir");
    std::fs::create_dir(&planted).unwrap();
    host_sh(&format!(
        "cd '{}' && {}",
        planted.display(),
        gitdir_script(".", &counter)
    ));
    let id = ww(&d, &proj, &[&shared], false).await.unwrap();
    let host = tokio::task::spawn_blocking({
        let shared = shared.clone();
        move || {
            std::thread::sleep(Duration::from_millis(400));
            std::fs::write(shared.join(".git"), b"").unwrap();
        }
    });
    let script = format!(
        "cd '{}'; until [ -f .git ]; do sleep 0.02; done; echo 'gitdir: {}' > .git; sleep 5",
        shared.display(),
        planted.display()
    );
    let r = d.sh(&id, &script).await;
    host.await.unwrap();
    assert!(
        r.output
            .contains("sandbox stopped every process of this session"),
        "{}",
        r.output
    );
    assert!(
        !exists(&shared.join(".git")),
        "the rewritten .git file stayed"
    );
    assert!(
        !host_git_runs_hook(&shared, &counter),
        "the host's git ran the planted config"
    );
}

/// H28, submodules (red team): a sandbox rewrote a submodule's `.git` pointer to a gitdir it
/// made, and the host's `git status` in that folder ran its fsmonitor. Now every submodule's
/// `.git` that the root's `.gitmodules` lists is read-only like the root's own (and its
/// directory pinned), and `.gitmodules` itself is read-only. Baseline first, on the host.
#[tokio::test]
async fn h28_a_submodules_git_pointer_cannot_be_redirected() {
    let d = Daemon::start(&[]).await;
    let base = outside();
    let b = base.path();
    let counter = b.join("h28-runs");
    let (code, out) = host_sh(&format!(
        "cd '{0}' && git init -q up && git -C up -c user.email=t@t -c user.name=t commit -q \
         --allow-empty -m init && git init -q repo && cd repo && git -c protocol.file.allow=always \
         submodule add -q ../up sub && cp sub/.git '{0}/pointer-orig'",
        b.display()
    ));
    assert_eq!(code, 0, "{out}");
    let repo = b.join("repo");
    let sub = repo.join("sub");
    let redirect = format!(
        "cd '{}' && {} && echo \"gitdir: $PWD/evil\" > sub/.git",
        repo.display(),
        gitdir_script("evil", &counter)
    );
    // Baseline: on the host the rewritten pointer makes git in the submodule run the hook.
    host_sh(&redirect);
    assert!(
        host_git_runs_hook(&sub, &counter),
        "baseline: the hook did not run"
    );
    host_sh(&format!(
        "cd '{}' && cp ../pointer-orig sub/.git && rm -rf evil",
        repo.display()
    ));
    assert!(!host_git_runs_hook(&sub, &counter));

    for attack in [
        redirect.clone(),
        format!("cd '{}' && rm -f sub/.git", repo.display()),
        format!("cd '{}' && mv sub sub2", repo.display()),
        format!(
            "cd '{}' && printf '[submodule \"x\"]\\n\\tpath = x\\n' > .gitmodules",
            repo.display()
        ),
    ] {
        let id = ww(&d, &repo, &[], false).await.unwrap();
        let r = d.sh(&id, &attack).await;
        assert_ne!(r.exit_code, 0, "{attack}: {}", r.output);
        assert!(
            !host_git_runs_hook(&sub, &counter),
            "the hook ran after: {attack}"
        );
        assert_eq!(
            std::fs::read(sub.join(".git")).unwrap(),
            std::fs::read(b.join("pointer-orig")).unwrap(),
            "{attack}"
        );
        assert!(
            std::fs::read_to_string(repo.join(".gitmodules"))
                .unwrap()
                .contains("path = sub"),
            "{attack}"
        );
    }
    // The allowed path: the submodule's own files stay writable.
    let id = ww(&d, &repo, &[], false).await.unwrap();
    let r = d
        .sh(&id, "echo ok > sub/notes.txt && cat sub/notes.txt")
        .await;
    assert_eq!((r.exit_code, r.output.as_str()), (0, "ok\n"));
}

/// H28, linked worktrees: a worktree of the root's repository that lies below the root has a
/// `.git` file the host's git follows; the sandbox cannot point it at a gitdir it made, remove
/// it or move the worktree. Baseline on the host first.
#[tokio::test]
async fn h28_a_linked_worktrees_git_pointer_cannot_be_redirected() {
    let d = Daemon::start(&[]).await;
    let base = outside();
    let b = base.path();
    let counter = b.join("h28w-runs");
    let (code, out) = host_sh(&format!(
        "cd '{0}' && git init -q repo && cd repo && git -c user.email=t@t -c user.name=t \
         commit -q --allow-empty -m init && git worktree add -q wt && cp wt/.git \
         '{0}/pointer-orig'",
        b.display()
    ));
    assert_eq!(code, 0, "{out}");
    let repo = b.join("repo");
    let wt = repo.join("wt");
    let redirect = format!(
        "cd '{}' && {} && echo \"gitdir: $PWD/evil\" > wt/.git",
        repo.display(),
        gitdir_script("evil", &counter)
    );
    // Baseline: on the host the rewritten pointer makes git in the worktree run the hook.
    host_sh(&redirect);
    assert!(
        host_git_runs_hook(&wt, &counter),
        "baseline: the hook did not run"
    );
    host_sh(&format!(
        "cd '{}' && cp ../pointer-orig wt/.git && rm -rf evil",
        repo.display()
    ));
    assert!(!host_git_runs_hook(&wt, &counter));

    for attack in [
        redirect.clone(),
        format!("cd '{}' && rm -f wt/.git", repo.display()),
        format!("cd '{}' && mv wt wt2", repo.display()),
    ] {
        let id = ww(&d, &repo, &[], false).await.unwrap();
        let r = d.sh(&id, &attack).await;
        assert_ne!(r.exit_code, 0, "{attack}: {}", r.output);
        assert!(
            !host_git_runs_hook(&wt, &counter),
            "the hook ran after: {attack}"
        );
        assert_eq!(
            std::fs::read(wt.join(".git")).unwrap(),
            std::fs::read(b.join("pointer-orig")).unwrap(),
            "{attack}"
        );
    }
    // The allowed path: the worktree's own files stay writable.
    let id = ww(&d, &repo, &[], false).await.unwrap();
    let r = d
        .sh(&id, "echo ok > wt/notes.txt && cat wt/notes.txt")
        .await;
    assert_eq!((r.exit_code, r.output.as_str()), (0, "ok\n"));
}

/// `.aws` at a root's top is protected as Codex 0.171 (the pinned release) protects it, with
/// `.git`, `.codex` and `.agents`: an existing one is read-only (an AWS config there can name a
/// `credential_process` the host's AWS tools run), a missing one cannot be made. Baseline: the
/// host writes both.
#[tokio::test]
async fn dot_aws_at_a_roots_top_is_protected_as_codex_protects_it() {
    let d = Daemon::start(&[]).await;
    let base = outside();
    let root = base.path().join("proj");
    std::fs::create_dir_all(root.join(".aws")).unwrap();
    std::fs::write(root.join(".aws/config"), "[default]\n").unwrap();
    let plant = "printf '[default]\\ncredential_process = /tmp/evil\\n' > .aws/config";
    // Baseline on a copy: the host may write it.
    let copy = base.path().join("copy");
    std::fs::create_dir_all(copy.join(".aws")).unwrap();
    let (code, out) = host_sh(&format!("cd '{}' && {plant}", copy.display()));
    assert_eq!(code, 0, "{out}");
    let id = ww(&d, &root, &[], false).await.unwrap();
    let r = d.sh(&id, plant).await;
    assert_ne!(r.exit_code, 0, "{}", r.output);
    assert!(r.output.contains("Read-only file system"), "{}", r.output);
    assert_eq!(
        std::fs::read_to_string(root.join(".aws/config")).unwrap(),
        "[default]\n"
    );
    // A missing one cannot be made either.
    let fresh = base.path().join("fresh");
    std::fs::create_dir_all(&fresh).unwrap();
    let id = ww(&d, &fresh, &[], false).await.unwrap();
    let r = d.try_sh(&id, "mkdir .aws && echo made").await;
    assert!(
        r.as_ref()
            .map_or(true, |r| r.exit_code != 0 || !r.output.contains("made")),
        "{r:?}"
    );
    assert!(
        !fresh.join(".aws").exists(),
        "the sandbox made .aws on the host"
    );
    // The allowed path: the rest of the root stays writable.
    let id = ww(&d, &root, &[], false).await.unwrap();
    let r = d.sh(&id, "echo ok > notes && cat notes").await;
    assert_eq!((r.exit_code, r.output.as_str()), (0, "ok\n"));
}
