//! What the host's git will run for a repository, found in its protected config (spec/sandbox.md
//! H20): `.git` is read-only in the sandbox, but its config may point git at files in the
//! worktree — `core.hooksPath` (husky, lefthook, pre-commit), a `core.fsmonitor` hook, the
//! targets of `include.path` / `includeIf.*.path`. Those that lie under a writable root are
//! protected like `.git` itself: read-only when they exist, guarded while they do not.
//!
//! The config is read as the caller (this runs in the resolver and the worker), only from the
//! repository's own git directories (which the sandbox cannot change), never following a
//! symlink for the config file itself.

use super::roots::{PolicyError, Resolved, inside_any, inspect, read_small_file, resolve_checked};
use std::io;
use std::path::{Path, PathBuf};

/// How deep `include.path` chains are followed (git's own limit is 10).
const MAX_INCLUDE_DEPTH: usize = 10;

/// The largest config file read (a repository's config with many branches and remotes is tens
/// of KiB; a larger file fails the session closed).
pub(super) const MAX_CONFIG_BYTES: usize = 1 << 20;

/// One `key = value` of a config file: lower-case section and key, the subsection as written.
#[derive(Debug, PartialEq, Eq)]
struct Entry {
    section: String,
    key: String,
    value: Option<String>,
}

/// The paths under a writable root that git will execute (or read more config from) for the
/// repository whose worktree top is `worktree` and whose git directories are `gitdirs` (the
/// gitdir, and a linked worktree's common directory): existing ones (canonical) to make
/// read-only, and the first missing component of absent ones to guard.
pub fn executed_paths(
    worktree: &Path,
    gitdirs: &[PathBuf],
    roots: &[PathBuf],
) -> Result<(Vec<PathBuf>, Vec<PathBuf>), PolicyError> {
    let mut found = Found::default();
    for gitdir in gitdirs {
        for name in ["config", "config.worktree"] {
            read_config(&gitdir.join(name), worktree, roots, 0, &mut found)?;
        }
    }
    // The caller's global and the system config apply to every repository: a relative
    // `core.hooksPath` there points into each worktree. One this user may not read, git run as
    // this user may not read either.
    // Such a file is often a link (dotfiles): resolved first, and protected itself when it
    // lies under a writable root (or guarded there while missing: a sandbox that could write
    // `~/.gitconfig` could set `core.hooksPath` for every repository).
    for file in global_configs() {
        let Some(real) = found.add(Path::new("/"), &file, roots)? else {
            continue;
        };
        match read_config(&real, worktree, roots, 0, &mut found) {
            Err(PolicyError::Inspect { cause, .. }) if cause.contains("Permission denied") => {}
            other => other?,
        }
    }
    Ok((found.exists, found.missing))
}

/// The config files git reads for every repository of this user (this runs as the caller):
/// the system file, `$XDG_CONFIG_HOME/git/config` (default `~/.config/git/config`) and
/// `~/.gitconfig`.
fn global_configs() -> Vec<PathBuf> {
    let mut files = vec![PathBuf::from("/etc/gitconfig")];
    if let Ok(Some(user)) = nix::unistd::User::from_uid(nix::unistd::geteuid()) {
        let xdg = std::env::var_os("XDG_CONFIG_HOME")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .unwrap_or_else(|| user.dir.join(".config"));
        files.push(xdg.join("git/config"));
        files.push(user.dir.join(".gitconfig"));
    }
    files
}

#[derive(Default)]
struct Found {
    exists: Vec<PathBuf>,
    missing: Vec<PathBuf>,
}

impl Found {
    /// Records `path` (relative to `base`) if it lies under a writable root; returns the
    /// canonical path when it exists.
    fn add(
        &mut self,
        base: &Path,
        path: &Path,
        roots: &[PathBuf],
    ) -> Result<Option<PathBuf>, PolicyError> {
        match resolve_checked(base, path, roots)? {
            Resolved::Exists(p) => {
                if inside_any(&p, roots) {
                    self.exists.push(p.clone());
                }
                Ok(Some(p))
            }
            Resolved::Missing(first) => {
                if inside_any(&first, roots) {
                    self.missing.push(first);
                }
                Ok(None)
            }
        }
    }
}

fn read_config(
    file: &Path,
    worktree: &Path,
    roots: &[PathBuf],
    depth: usize,
    found: &mut Found,
) -> Result<(), PolicyError> {
    let text = match read_small_file(file, MAX_CONFIG_BYTES) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(inspect(file, e)),
    };
    let dir = file.parent().unwrap_or(Path::new("/"));
    for entry in entries(&text) {
        let Some(value) = entry.value.as_deref() else {
            continue;
        };
        match (entry.section.as_str(), entry.key.as_str()) {
            // Relative hook paths are taken from the worktree's top, where hooks run.
            ("core", "hookspath") => {
                found.add(worktree, &expand_home(value), roots)?;
            }
            // The hook program, and any later word that is a path (`sh tools/fsmon.sh`).
            ("core", "fsmonitor") if !is_boolean(value) => {
                for (i, word) in value.split_whitespace().enumerate() {
                    if i == 0 || word.contains('/') {
                        found.add(worktree, &expand_home(word), roots)?;
                    }
                }
            }
            // Relative includes are relative to the including file. Every conditional include
            // counts: whether its condition holds depends on how git is run later.
            ("include" | "includeif", "path") => {
                let target = found.add(dir, &expand_home(value), roots)?;
                if let Some(target) = target
                    && depth < MAX_INCLUDE_DEPTH
                {
                    read_config(&target, worktree, roots, depth + 1, found)?;
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// git's boolean spellings: `core.fsmonitor = true` is the built-in monitor, not a hook.
fn is_boolean(value: &str) -> bool {
    matches!(
        value.to_ascii_lowercase().as_str(),
        "true" | "false" | "yes" | "no" | "on" | "off" | "1" | "0" | ""
    )
}

/// `~/x` is in the caller's home (this runs as the caller).
fn expand_home(value: &str) -> PathBuf {
    if let Some(rest) = value.strip_prefix("~/")
        && let Ok(Some(user)) = nix::unistd::User::from_uid(nix::unistd::geteuid())
    {
        return user.dir.join(rest);
    }
    PathBuf::from(value)
}

/// The entries of a git config file: `[section]`, `[section "sub"]`, `[section.sub]` headers,
/// `key = value` (or a bare `key`: true), `#`/`;` comments, double quotes, backslash escapes and
/// continuation lines. Malformed lines are skipped, as git would refuse the file anyway.
fn entries(text: &str) -> Vec<Entry> {
    let mut out = Vec::new();
    let mut section = String::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let line = line.trim_start();
        if line.starts_with('[') {
            let Some(end) = line.find(']') else { continue };
            let header = &line[1..end];
            let name = header.split(['"', ' ', '\t', '.']).next().unwrap_or("");
            section = name.trim().to_ascii_lowercase();
            // A key may follow the header on the same line.
            let rest = line[end + 1..].trim_start();
            if !rest.is_empty()
                && !rest.starts_with(['#', ';'])
                && let Some(e) = key_value(&section, rest, &mut lines)
            {
                out.push(e);
            }
            continue;
        }
        if line.is_empty() || line.starts_with(['#', ';']) {
            continue;
        }
        if let Some(e) = key_value(&section, line, &mut lines) {
            out.push(e);
        }
    }
    out
}

fn key_value<'a>(
    section: &str,
    line: &str,
    more: &mut impl Iterator<Item = &'a str>,
) -> Option<Entry> {
    let (key, raw) = match line.find('=') {
        Some(at) => (&line[..at], Some(&line[at + 1..])),
        None => (line.split(['#', ';']).next().unwrap_or(""), None),
    };
    let key = key.trim();
    if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        return None;
    }
    let value = raw.map(|raw| {
        let mut value = String::new();
        let mut raw = raw.to_string();
        loop {
            match parse_value(&raw, &mut value) {
                Continuation::Done => break,
                Continuation::NextLine => match more.next() {
                    Some(next) => raw = next.to_string(),
                    None => break,
                },
            }
        }
        value
    });
    Some(Entry {
        section: section.to_string(),
        key: key.to_ascii_lowercase(),
        value,
    })
}

enum Continuation {
    Done,
    NextLine,
}

/// Appends the value on `raw` to `value`: quotes removed, escapes applied, a comment outside
/// quotes ends it, surrounding unquoted whitespace trimmed.
fn parse_value(raw: &str, value: &mut String) -> Continuation {
    let mut quoted = false;
    let mut pending_space = String::new();
    let mut chars = raw.chars();
    let mut started = !value.is_empty();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                None => return Continuation::NextLine,
                Some(e) => {
                    value.push_str(&std::mem::take(&mut pending_space));
                    value.push(match e {
                        'n' => '\n',
                        't' => '\t',
                        'b' => '\u{8}',
                        other => other,
                    });
                    started = true;
                }
            },
            '"' => quoted = !quoted,
            '#' | ';' if !quoted => break,
            c if c.is_whitespace() && !quoted => {
                if started {
                    pending_space.push(c);
                }
            }
            c => {
                value.push_str(&std::mem::take(&mut pending_space));
                value.push(c);
                started = true;
            }
        }
    }
    Continuation::Done
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value_of(text: &str, section: &str, key: &str) -> Option<String> {
        entries(text)
            .into_iter()
            .find(|e| e.section == section && e.key == key)
            .and_then(|e| e.value)
    }

    #[test]
    fn config_files_parse_as_git_reads_them() {
        let text = "[core]\n\trepositoryformatversion = 0\n\tHooksPath = \".husky\" # hooks\n\
                    [includeIf \"gitdir:/x/\"]\n\tpath = ../shared.inc\n\
                    [core] fsmonitor = ./fsmon.sh --fast ; note\n\
                    [alias]\n\tst = \"status \\\n  -s\"\n";
        assert_eq!(
            value_of(text, "core", "hookspath").as_deref(),
            Some(".husky")
        );
        assert_eq!(
            value_of(text, "includeif", "path").as_deref(),
            Some("../shared.inc")
        );
        assert_eq!(
            value_of(text, "core", "fsmonitor").as_deref(),
            Some("./fsmon.sh --fast")
        );
        assert_eq!(
            value_of(text, "alias", "st").as_deref(),
            Some("status   -s")
        );
        assert!(is_boolean("TRUE") && is_boolean("off") && !is_boolean(".git/fsmon"));
    }

    #[test]
    fn hooks_fsmonitor_and_includes_under_a_root_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let git = root.join(".git");
        std::fs::create_dir_all(&git).unwrap();
        std::fs::create_dir(root.join(".husky")).unwrap();
        std::fs::write(
            root.join("extra.inc"),
            "[core]\n\tfsmonitor = tools/monitor\n",
        )
        .unwrap();
        // A real repository's config easily passes 4 KiB (many branches and remotes).
        let branches: String = (0..200)
            .map(|i| {
                format!("[branch \"feature-{i}\"]\n\tremote = origin\n\tmerge = refs/heads/f{i}\n")
            })
            .collect();
        std::fs::write(
            git.join("config"),
            format!(
                "{branches}[core]\n\thooksPath = .husky\n[include]\n\tpath = ../extra.inc\n\
                 [includeIf \"onbranch:main\"]\n\tpath = /etc/outside.inc\n"
            ),
        )
        .unwrap();
        assert!(std::fs::metadata(git.join("config")).unwrap().len() > 10_000);
        let roots = vec![root.clone()];
        let (exists, missing) = executed_paths(&root, &[git], &roots).unwrap();
        assert_eq!(exists, vec![root.join(".husky"), root.join("extra.inc")]);
        // The included file's fsmonitor hook does not exist yet: its first missing part.
        assert_eq!(missing, vec![root.join("tools")]);
    }

    #[test]
    fn a_hooks_path_through_a_symlink_into_a_root_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let git = root.join(".git");
        std::fs::create_dir_all(&git).unwrap();
        std::fs::create_dir(root.join("real")).unwrap();
        std::os::unix::fs::symlink("real", root.join("hooks-link")).unwrap();
        std::fs::write(git.join("config"), "[core]\nhooksPath = hooks-link\n").unwrap();
        let err = executed_paths(&root, &[git], std::slice::from_ref(&root)).unwrap_err();
        assert!(matches!(err, PolicyError::WritableSymlink { .. }), "{err}");
    }
}
