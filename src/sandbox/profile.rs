//! Sandbox profiles: the modes as data (`sandbox-profiles/*.toml`). A profile names its mode
//! (whose enforcement is fixed in code and reviewed there) and says which paths are writable,
//! which names are protected, whether the network may be turned on, and the resource limits.
//!
//! The three built-in profiles are embedded in the binary, so the daemon runs with zero
//! configuration; an operator may point `profiles_dir` at a directory whose `*.toml` files
//! replace built-ins of the same name or add new ones. A file that does not parse stops the
//! daemon with a message naming the file, the line and the key.

use crate::sandbox::policy::{Mode, ResourceLimits};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The built-in profiles, by name.
const BUILTIN: [(&str, &str); 3] = [
    (
        "read-only",
        include_str!("../../sandbox-profiles/read-only.toml"),
    ),
    (
        "workspace-write",
        include_str!("../../sandbox-profiles/workspace-write.toml"),
    ),
    (
        "danger-full-access",
        include_str!("../../sandbox-profiles/danger-full-access.toml"),
    ),
];

/// Where a writable root comes from (spec/sandbox.md §2.2).
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum WritableSource {
    /// OpenSession's `writable_roots`.
    SessionRoots,
    /// The session's cwd.
    Cwd,
    /// `/tmp`, unless the session sets `exclude_slash_tmp`.
    SlashTmp,
    /// `$TMPDIR` from the session environment, unless `exclude_tmpdir_env_var`.
    TmpdirEnv,
    /// A fixed absolute path.
    Path(PathBuf),
}

impl WritableSource {
    fn parse(text: &str) -> Result<Self, String> {
        Ok(match text {
            "{session_roots}" => WritableSource::SessionRoots,
            "{cwd}" => WritableSource::Cwd,
            "{slash_tmp}" => WritableSource::SlashTmp,
            "{tmpdir}" => WritableSource::TmpdirEnv,
            p if Path::new(p).is_absolute() && !p.contains('{') => {
                WritableSource::Path(PathBuf::from(p))
            }
            other => {
                return Err(format!(
                    "`{other}` is neither a placeholder ({{session_roots}}, {{cwd}}, \
                     {{slash_tmp}}, {{tmpdir}}) nor an absolute path"
                ));
            }
        })
    }
}

/// One profile, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    pub name: String,
    pub description: String,
    pub mode: Mode,
    pub writable: Vec<WritableSource>,
    pub protected_names: Vec<String>,
    pub network_allowed: bool,
    pub limits: ResourceLimits,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileFile {
    description: String,
    mode: Mode,
    filesystem: FilesystemSection,
    network: NetworkSection,
    limits: ResourceLimits,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FilesystemSection {
    writable: Vec<String>,
    protected_names: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NetworkSection {
    allow: bool,
}

/// Parses one profile; errors name the file, the line and the key.
pub fn parse(name: &str, file: &str, text: &str) -> Result<Profile, String> {
    let raw: ProfileFile =
        toml::from_str(text).map_err(|e| format!("sandbox profile {file}: {e}"))?;
    let key_error = |key: &str, msg: String| {
        let line = text
            .lines()
            .position(|l| l.trim_start().starts_with(key))
            .map(|i| format!("line {}, ", i + 1))
            .unwrap_or_default();
        format!("sandbox profile {file}: {line}key `{key}`: {msg}")
    };
    let writable = raw
        .filesystem
        .writable
        .iter()
        .map(|w| WritableSource::parse(w))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| key_error("writable", e))?;
    if raw.mode != Mode::WorkspaceWrite && !writable.is_empty() {
        return Err(key_error(
            "writable",
            format!(
                "only a workspace-write profile has writable roots, this one is {}",
                raw.mode.as_str()
            ),
        ));
    }
    for n in &raw.filesystem.protected_names {
        if n.is_empty() || n.contains('/') || n == "." || n == ".." {
            return Err(key_error(
                "protected_names",
                format!("`{n}` is not a single file name"),
            ));
        }
    }
    Ok(Profile {
        name: name.to_string(),
        description: raw.description,
        mode: raw.mode,
        writable,
        protected_names: raw.filesystem.protected_names,
        network_allowed: raw.network.allow || raw.mode == Mode::DangerFullAccess,
        limits: raw.limits,
    })
}

/// All profiles the daemon knows, by name.
#[derive(Debug, Clone)]
pub struct ProfileSet {
    profiles: BTreeMap<String, Profile>,
}

impl ProfileSet {
    /// The embedded built-ins.
    pub fn builtin() -> Self {
        let profiles = BUILTIN
            .iter()
            .map(|(name, text)| {
                let file = format!("sandbox-profiles/{name}.toml (built in)");
                let profile = parse(name, &file, text)
                    .unwrap_or_else(|e| panic!("built-in profile is invalid: {e}"));
                (name.to_string(), profile)
            })
            .collect();
        Self { profiles }
    }

    /// The built-ins, replaced or extended by every `*.toml` in `dir`.
    pub fn load(dir: Option<&Path>) -> Result<Self, String> {
        let mut set = Self::builtin();
        let Some(dir) = dir else { return Ok(set) };
        let entries = std::fs::read_dir(dir)
            .map_err(|e| format!("cannot read profiles directory {}: {e}", dir.display()))?;
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .collect();
        paths.sort();
        for path in paths {
            let name = path
                .file_stem()
                .and_then(|s| s.to_str())
                .ok_or_else(|| format!("profile file name {} is not UTF-8", path.display()))?
                .to_string();
            let text = std::fs::read_to_string(&path)
                .map_err(|e| format!("cannot read sandbox profile {}: {e}", path.display()))?;
            let profile = parse(&name, &path.display().to_string(), &text)?;
            set.profiles.insert(name, profile);
        }
        Ok(set)
    }

    pub fn get(&self, name: &str) -> Option<&Profile> {
        self.profiles.get(name)
    }

    /// The built-in profile of a mode.
    pub fn for_mode(&self, mode: Mode) -> &Profile {
        self.profiles
            .get(mode.as_str())
            .expect("the built-in profile of every mode exists")
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.profiles.keys().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_describe_the_three_modes() {
        let set = ProfileSet::builtin();
        let ww = set.for_mode(Mode::WorkspaceWrite);
        assert_eq!(
            ww.writable,
            [
                WritableSource::SessionRoots,
                WritableSource::Cwd,
                WritableSource::SlashTmp,
                WritableSource::TmpdirEnv
            ]
        );
        assert_eq!(ww.protected_names, [".git", ".codex", ".agents", ".aws"]);
        assert!(set.for_mode(Mode::ReadOnly).writable.is_empty());
        assert_eq!(
            set.for_mode(Mode::DangerFullAccess).mode,
            Mode::DangerFullAccess
        );
        assert_eq!(
            set.for_mode(Mode::ReadOnly).limits,
            ResourceLimits::default()
        );
    }

    #[test]
    fn errors_name_the_file_line_and_key() {
        let bad = include_str!("../../sandbox-profiles/workspace-write.toml")
            .replace("\"{tmpdir}\"]", "\"{tmpdir}\", \"relative/dir\"]");
        let err = parse("x", "/etc/corral/profiles/x.toml", &bad).unwrap_err();
        assert!(err.contains("/etc/corral/profiles/x.toml"), "{err}");
        assert!(err.contains("key `writable`"), "{err}");
        assert!(err.contains("line "), "{err}");
        assert!(err.contains("relative/dir"), "{err}");

        let unknown = include_str!("../../sandbox-profiles/read-only.toml")
            .replace("allow = true", "allow = true\nallow_everything = true");
        let err = parse("x", "x.toml", &unknown).unwrap_err();
        assert!(
            err.contains("x.toml") && err.contains("allow_everything") && err.contains("line"),
            "{err}"
        );
    }

    #[test]
    fn a_directory_adds_and_replaces_profiles() {
        let dir = tempfile::tempdir().unwrap();
        let custom = include_str!("../../sandbox-profiles/workspace-write.toml")
            .replace("\"{tmpdir}\"]", "\"{tmpdir}\", \"/var/cache/ci\"]")
            .replace("allow = true", "allow = false");
        std::fs::write(dir.path().join("ci.toml"), custom).unwrap();
        std::fs::write(dir.path().join("notes.txt"), "ignored").unwrap();
        let set = ProfileSet::load(Some(dir.path())).unwrap();
        let ci = set.get("ci").unwrap();
        assert_eq!(
            ci.writable.last(),
            Some(&WritableSource::Path("/var/cache/ci".into()))
        );
        assert!(!ci.network_allowed);
        assert!(set.get("read-only").is_some());
    }
}
