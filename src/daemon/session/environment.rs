//! The environment commands start from (spec/sandbox.md §8.6 H16): a sane default built from the
//! caller's passwd entry, replaced entry by entry by the session's own `env`. Nothing of the
//! daemon's own environment (which may hold secrets) is ever part of it.

use std::collections::BTreeMap;

/// `PATH` for commands: system directories only, never `.` or an empty element (either would
/// run programs from the working directory).
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The default environment of a session owned by `uid`: `HOME`, `USER`, `LOGNAME`, `SHELL` from
/// its passwd entry (left out when there is none), `PATH` and `LANG=C.UTF-8`. No `TMPDIR`: the
/// session's `TMPDIR` decides a writable root, so only the session may set it.
pub fn default_env(uid: u32) -> Vec<(String, String)> {
    let mut env = Vec::with_capacity(6);
    if let Ok(Some(user)) = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        env.push(("HOME".into(), user.dir.to_string_lossy().into_owned()));
        env.push(("USER".into(), user.name.clone()));
        env.push(("LOGNAME".into(), user.name));
        env.push(("SHELL".into(), user.shell.to_string_lossy().into_owned()));
    }
    env.push(("PATH".into(), DEFAULT_PATH.into()));
    env.push(("LANG".into(), "C.UTF-8".into()));
    env
}

/// The defaults under the session's own variables: a session entry replaces the default of the
/// same name, every other default stays.
pub fn merge(
    defaults: Vec<(String, String)>,
    session: BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = defaults.into_iter().collect();
    env.extend(session);
    env
}

/// The environment a session of `uid` runs its commands with, given the session's own `env`.
pub fn session_env(uid: u32, session: BTreeMap<String, String>) -> BTreeMap<String, String> {
    merge(default_env(uid), session)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn session_entries_replace_defaults_one_by_one() {
        let defaults = vec![
            ("PATH".to_string(), DEFAULT_PATH.to_string()),
            ("LANG".to_string(), "C.UTF-8".to_string()),
            ("HOME".to_string(), "/root".to_string()),
        ];
        let merged = merge(defaults, map(&[("PATH", "/bin"), ("EXTRA", "1")]));
        assert_eq!(
            merged,
            map(&[
                ("EXTRA", "1"),
                ("HOME", "/root"),
                ("LANG", "C.UTF-8"),
                ("PATH", "/bin"),
            ])
        );
    }

    #[test]
    fn defaults_come_from_the_passwd_entry_and_hold_no_tmpdir() {
        let env: BTreeMap<_, _> = default_env(0).into_iter().collect();
        let root = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(0))
            .unwrap()
            .unwrap();
        assert_eq!(env["HOME"], root.dir.to_string_lossy());
        assert_eq!(env["USER"], root.name);
        assert_eq!(env["LOGNAME"], root.name);
        assert_eq!(env["SHELL"], root.shell.to_string_lossy());
        assert_eq!(env["LANG"], "C.UTF-8");
        assert!(!env.contains_key("TMPDIR"));
        let path = &env["PATH"];
        assert!(
            path.split(':').all(|p| p.starts_with('/')),
            "relative or empty PATH element in {path}"
        );
    }

    #[test]
    fn a_uid_without_passwd_entry_gets_path_and_lang_only() {
        // No passwd entry is expected for this uid on any test machine.
        let env: BTreeMap<_, _> = default_env(3_999_999_999).into_iter().collect();
        assert_eq!(
            env.keys().map(String::as_str).collect::<Vec<_>>(),
            ["LANG", "PATH"]
        );
    }
}
