//! The prompt context (spec/tools.md §11): the two user messages the newest Codex puts before a
//! conversation's first turn — the project docs (AGENTS.md files) and the environment context —
//! byte for byte as Codex builds them. Matched against openai/codex `codex-rs/core/src/`:
//! `environment_context.rs` (0728f6de) and its tests (`environment_context_tests.rs`, 001f15e9),
//! `contextual_user_message.rs` (07247fbf), `project_doc.rs` (0bd53e45) and
//! `instructions/user_instructions.rs` (0b2b8c90); the shell's name as `shell.rs` gives it.
//!
//! Spec deviation (the newest Codex wins): spec §11 expects approval policy, sandbox mode,
//! network access and writable roots in the environment context. The newest Codex carries none
//! of them; it carries cwd, shell, current_date, timezone, a network block only when domain
//! allow/deny lists are configured (a NETWORK_MODE_PROXY session's rules) and subagents (none
//! here).
//!
//! Where corral chooses differently from Codex, on purpose:
//! - A project doc that cannot be read (EACCES inside the sandbox, a dangling link, a FIFO or
//!   device behind a link, an I/O error) is skipped and the others are still used. Codex treats
//!   anything but NotFound as an error and then sends no project docs at all.
//! - Every read is bounded: only regular files are opened (non-blocking, checked again after
//!   open), and at most the remaining budget (+1 byte, to tell truncation) is read.
//! - The shell's name is Codex's name for the shell type (bash, zsh, sh, powershell, cmd);
//!   a shell Codex does not know (e.g. fish) is named by its file name, because corral runs
//!   that shell (Codex would fall back to bash and name that).

use std::ffi::OsStr;
use std::fs;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Codex's default `project_doc_max_bytes`.
pub const DEFAULT_PROJECT_DOC_MAX_BYTES: u64 = 32 * 1024;
/// The largest budget a session may ask for (keeps one answer far below the response limit).
pub const MAX_PROJECT_DOC_MAX_BYTES: u64 = 1024 * 1024;
/// Preferred local override, looked for first in each directory.
pub const LOCAL_PROJECT_DOC_FILENAME: &str = "AGENTS.override.md";
pub const DEFAULT_PROJECT_DOC_FILENAME: &str = "AGENTS.md";
/// Codex's time zone when the host's cannot be named.
pub const FALLBACK_TIMEZONE: &str = "Etc/UTC";

/// Codex's `NetworkContext`: configured domain lists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetworkContext {
    pub allowed_domains: Vec<String>,
    pub denied_domains: Vec<String>,
}

/// Codex's `EnvironmentContext`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvironmentContext {
    pub cwd: Option<String>,
    pub shell: String,
    pub current_date: Option<String>,
    pub timezone: Option<String>,
    pub network: Option<NetworkContext>,
    pub subagents: Option<String>,
}

impl EnvironmentContext {
    /// The message text: one element per line, two spaces in, wrapped in the fragment's tags
    /// (values are not escaped — Codex does not escape them).
    pub fn serialize_to_xml(&self) -> String {
        let mut lines = Vec::new();
        if let Some(cwd) = &self.cwd {
            lines.push(format!("  <cwd>{cwd}</cwd>"));
        }
        lines.push(format!("  <shell>{}</shell>", self.shell));
        if let Some(date) = &self.current_date {
            lines.push(format!("  <current_date>{date}</current_date>"));
        }
        if let Some(tz) = &self.timezone {
            lines.push(format!("  <timezone>{tz}</timezone>"));
        }
        if let Some(network) = &self.network {
            lines.push("  <network enabled=\"true\">".to_string());
            for d in &network.allowed_domains {
                lines.push(format!("    <allowed>{d}</allowed>"));
            }
            for d in &network.denied_domains {
                lines.push(format!("    <denied>{d}</denied>"));
            }
            lines.push("  </network>".to_string());
        }
        if let Some(subagents) = &self.subagents {
            lines.push("  <subagents>".to_string());
            lines.extend(subagents.lines().map(|l| format!("    {l}")));
            lines.push("  </subagents>".to_string());
        }
        format!(
            "<environment_context>\n{}\n</environment_context>",
            lines.join("\n")
        )
    }
}

/// The AGENTS.md message text (Codex's `UserInstructions` for `directory`).
pub fn user_instructions_text(directory: &str, contents: &str) -> String {
    format!(
        "# AGENTS.md instructions for {directory}\n\n<INSTRUCTIONS>\n{contents}\n</INSTRUCTIONS>"
    )
}

/// Codex's name for a shell (`Shell::name` of `detect_shell_type`); an unknown shell keeps its
/// file name.
pub fn shell_name(shell: &Path) -> String {
    fn known(name: &OsStr) -> Option<&'static str> {
        match name.to_str()? {
            "zsh" => Some("zsh"),
            "bash" => Some("bash"),
            "sh" => Some("sh"),
            "cmd" => Some("cmd"),
            "pwsh" | "powershell" => Some("powershell"),
            _ => None,
        }
    }
    if let Some(name) = known(shell.as_os_str()).or_else(|| shell.file_stem().and_then(known)) {
        return name.to_string();
    }
    shell
        .file_name()
        .unwrap_or(shell.as_os_str())
        .to_string_lossy()
        .into_owned()
}

/// One project doc that contributed to the instructions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectDoc {
    pub path: PathBuf,
    pub bytes_used: u64,
    pub truncated: bool,
}

/// The project docs read for a cwd: the files used and their contents joined by a blank line
/// (`None` when nothing was found, or the budget is 0).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProjectDocs {
    pub docs: Vec<ProjectDoc>,
    pub text: Option<String>,
}

/// The project doc candidates, repository root first, as Codex's `discover_project_doc_paths`
/// finds them: walk up from the canonical cwd to the first directory holding `.git` (a
/// directory, a file, or a link to either; `/` itself is never the root); every directory from
/// that root down to the cwd, or only the cwd (as given) without a root; in each, the first of
/// AGENTS.override.md and AGENTS.md that is a regular file or a symlink.
pub fn discover_project_doc_paths(cwd: &Path) -> Vec<PathBuf> {
    let dir = fs::canonicalize(cwd).unwrap_or_else(|_| cwd.to_path_buf());
    let mut chain = vec![dir.clone()];
    let mut found_root = false;
    let mut cursor = dir;
    while let Some(parent) = cursor.parent().map(Path::to_path_buf) {
        if has_git_marker(&cursor) {
            found_root = true;
            break;
        }
        chain.push(parent.clone());
        cursor = parent;
    }
    let dirs = if found_root {
        // The root is the chain's last element.
        chain.reverse();
        chain
    } else {
        vec![cwd.to_path_buf()]
    };
    dirs.iter().filter_map(|d| doc_in(d)).collect()
}

/// `.git` is there. Codex follows links (a dangling `.git` link marks nothing, like a missing
/// one); an entry it cannot look into (EACCES, a link loop) is still there, so it marks the
/// root (Codex would give up on project docs altogether).
fn has_git_marker(dir: &Path) -> bool {
    match fs::metadata(dir.join(".git")) {
        Ok(_) => true,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(_) => fs::symlink_metadata(dir.join(".git")).is_ok(),
    }
}

/// The directory's project doc: the first candidate that is a regular file or a symlink (a
/// directory or FIFO of that name is passed over, as in Codex; what a link points to is
/// checked when it is read).
fn doc_in(dir: &Path) -> Option<PathBuf> {
    [LOCAL_PROJECT_DOC_FILENAME, DEFAULT_PROJECT_DOC_FILENAME]
        .iter()
        .map(|name| dir.join(name))
        .find(|p| {
            fs::symlink_metadata(p).is_ok_and(|md| md.file_type().is_file() || md.is_symlink())
        })
}

/// Reads at most `limit` bytes of `path` if it is (and, once open, still is) a regular file;
/// returns the bytes and whether the file had more. `None`: skipped (not a regular file,
/// unreadable, an I/O error).
fn read_bounded(path: &Path, limit: u64) -> Option<(Vec<u8>, bool)> {
    // Checked before opening so a device (a link to /dev/zero, a tape) is never opened.
    if !fs::metadata(path).ok()?.is_file() {
        return None;
    }
    // Non-blocking: a FIFO swapped in after the check cannot hang the open.
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut data = Vec::new();
    file.take(limit.saturating_add(1))
        .read_to_end(&mut data)
        .ok()?;
    let truncated = data.len() as u64 > limit;
    data.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    Some((data, truncated))
}

/// Codex's `read_project_docs`: each discovered file read up to the remaining budget, lossy
/// UTF-8; whitespace-only files are left out and cost nothing; parts joined by a blank line.
pub fn read_project_docs(cwd: &Path, max_bytes: u64) -> ProjectDocs {
    let mut out = ProjectDocs::default();
    if max_bytes == 0 {
        return out;
    }
    let mut remaining = max_bytes;
    let mut parts: Vec<String> = Vec::new();
    for path in discover_project_doc_paths(cwd) {
        if remaining == 0 {
            break;
        }
        let Some((data, truncated)) = read_bounded(&path, remaining) else {
            continue;
        };
        let text = String::from_utf8_lossy(&data).into_owned();
        if text.trim().is_empty() {
            continue;
        }
        remaining = remaining.saturating_sub(data.len() as u64);
        out.docs.push(ProjectDoc {
            path,
            bytes_used: data.len() as u64,
            truncated,
        });
        parts.push(text);
    }
    if !parts.is_empty() {
        out.text = Some(parts.join("\n\n"));
    }
    out
}

/// Everything GetPromptContext answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptContext {
    pub cwd: String,
    pub shell: String,
    pub current_date: String,
    pub timezone: String,
    pub environment_context: String,
    pub project_docs: Vec<ProjectDoc>,
    /// The AGENTS.md message; `None` when there are no project docs (Codex sends none).
    pub user_instructions: Option<String>,
}

impl PromptContext {
    /// The message texts in Codex's order: AGENTS.md first, then the environment context.
    fn messages(&self) -> impl Iterator<Item = &str> {
        self.user_instructions
            .as_deref()
            .into_iter()
            .chain(std::iter::once(self.environment_context.as_str()))
    }

    /// Responses API input items (Codex's `ResponseItem::Message` as serialized).
    pub fn responses_input_json(&self) -> String {
        let items: Vec<serde_json::Value> = self
            .messages()
            .map(|text| {
                serde_json::json!({
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": text}],
                })
            })
            .collect();
        serde_json::Value::Array(items).to_string()
    }

    /// Chat Completions messages (a user message's text items become its `content` string).
    pub fn chat_messages_json(&self) -> String {
        let items: Vec<serde_json::Value> = self
            .messages()
            .map(|text| serde_json::json!({"role": "user", "content": text}))
            .collect();
        serde_json::Value::Array(items).to_string()
    }
}

/// Builds the prompt context of a session: `cwd` as it was opened, the session's `shell`, the
/// host's date and time zone (the daemon's to know), and the project docs under `max_bytes`.
pub fn prompt_context(
    cwd: &Path,
    shell: &Path,
    current_date: &str,
    timezone: &str,
    max_bytes: u64,
    network: Option<NetworkContext>,
) -> PromptContext {
    let cwd_text = cwd.to_string_lossy().into_owned();
    let shell = shell_name(shell);
    let environment_context = EnvironmentContext {
        cwd: Some(cwd_text.clone()),
        shell: shell.clone(),
        current_date: Some(current_date.to_string()),
        timezone: Some(timezone.to_string()),
        network,
        subagents: None,
    }
    .serialize_to_xml();
    let docs = read_project_docs(cwd, max_bytes);
    PromptContext {
        user_instructions: docs
            .text
            .as_deref()
            .map(|t| user_instructions_text(&cwd_text, t)),
        cwd: cwd_text,
        shell,
        current_date: current_date.to_string(),
        timezone: timezone.to_string(),
        environment_context,
        project_docs: docs.docs,
    }
}

/// Today's date and the time zone's name on this host, as Codex's `local_time_context` gives
/// them: the local date with the zone's IANA name, or — when the zone cannot be named — the
/// UTC date with `Etc/UTC`. The name comes from `TZ` when set (a zone name, `:name`, or a path
/// under a `zoneinfo` directory; glibc dates by it too), else from the `/etc/localtime` link,
/// else `/etc/timezone`. A `TZ` that names no zone (a POSIX rule, empty) falls back to UTC, so
/// the date and the name always agree. (Codex names the zone from /etc/localtime only and dates
/// by `TZ`; corral takes both from `TZ` when it is set, so they cannot disagree.)
pub fn host_time_context() -> (String, String) {
    let zoneinfo = std::env::var_os("TZDIR")
        .filter(|d| !d.is_empty())
        .map_or_else(|| PathBuf::from("/usr/share/zoneinfo"), PathBuf::from);
    let tz = std::env::var_os("TZ");
    let name = timezone_name(
        tz.as_deref(),
        &zoneinfo,
        fs::read_link("/etc/localtime").ok(),
        fs::read_to_string("/etc/timezone").ok(),
    );
    // SAFETY: time(NULL) only returns the clock.
    let now = unsafe { libc::time(std::ptr::null_mut()) };
    match name {
        Some(name) => match local_date(now) {
            Some(date) => (date, name),
            None => (utc_date(now), FALLBACK_TIMEZONE.to_string()),
        },
        None => (utc_date(now), FALLBACK_TIMEZONE.to_string()),
    }
}

/// The IANA name of the zone (see [`host_time_context`]); `None` when it cannot be named.
pub fn timezone_name(
    tz: Option<&OsStr>,
    zoneinfo: &Path,
    localtime_link: Option<PathBuf>,
    etc_timezone: Option<String>,
) -> Option<String> {
    if let Some(tz) = tz {
        let tz = tz.to_str()?;
        let tz = tz.strip_prefix(':').unwrap_or(tz);
        if tz.starts_with('/') {
            return zone_from_path(tz).filter(|_| Path::new(tz).is_file());
        }
        return (is_zone_name(tz) && zoneinfo.join(tz).is_file()).then(|| tz.to_string());
    }
    if let Some(name) = localtime_link
        .as_deref()
        .and_then(Path::to_str)
        .and_then(zone_from_path)
    {
        return Some(name);
    }
    let name = etc_timezone?;
    let name = name.trim();
    is_zone_name(name).then(|| name.to_string())
}

/// `…/zoneinfo/Europe/Berlin` → `Europe/Berlin` (also under `posix/` or `right/`).
fn zone_from_path(path: &str) -> Option<String> {
    let (_, name) = path.split_once("zoneinfo/")?;
    let name = name
        .strip_prefix("posix/")
        .or_else(|| name.strip_prefix("right/"))
        .unwrap_or(name);
    is_zone_name(name).then(|| name.to_string())
}

/// A relative zone name: `Area/Location`-like, no empty, `.` or `..` component.
fn is_zone_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_+-./".contains(&b))
        && name
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
}

/// YYYY-MM-DD in the process's local time zone (glibc's TZ / /etc/localtime).
// libc deprecates `time_t` on musl only because it will widen to 64 bits there; it is the
// type localtime_r/gmtime_r take on every target.
#[allow(deprecated)]
fn local_date(t: libc::time_t) -> Option<String> {
    // SAFETY: localtime_r writes only the tm it is given.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    if unsafe { libc::localtime_r(&t, &mut tm) }.is_null() {
        return None;
    }
    Some(format_tm(&tm))
}

/// YYYY-MM-DD in UTC.
// libc deprecates `time_t` on musl only because it will widen to 64 bits there; it is the
// type localtime_r/gmtime_r take on every target.
#[allow(deprecated)]
pub fn utc_date(t: libc::time_t) -> String {
    // SAFETY: gmtime_r writes only the tm it is given; it cannot fail for a time(2) value.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    unsafe { libc::gmtime_r(&t, &mut tm) };
    format_tm(&tm)
}

fn format_tm(tm: &libc::tm) -> String {
    format!(
        "{:04}-{:02}-{:02}",
        i64::from(tm.tm_year) + 1900,
        tm.tm_mon + 1,
        tm.tm_mday
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use tempfile::TempDir;

    fn fake_env(cwd: Option<&str>) -> EnvironmentContext {
        EnvironmentContext {
            cwd: cwd.map(str::to_string),
            shell: "bash".into(),
            current_date: Some("2026-02-26".into()),
            timezone: Some("America/Los_Angeles".into()),
            network: None,
            subagents: None,
        }
    }

    // Codex's environment_context_tests.rs, every serialization case.

    #[test]
    fn serialize_workspace_write_environment_context() {
        assert_eq!(
            fake_env(Some("/repo")).serialize_to_xml(),
            "<environment_context>\n  <cwd>/repo</cwd>\n  <shell>bash</shell>\n  \
             <current_date>2026-02-26</current_date>\n  <timezone>America/Los_Angeles</timezone>\n\
             </environment_context>"
        );
    }

    #[test]
    fn serialize_environment_context_with_network() {
        let mut ctx = fake_env(Some("/repo"));
        ctx.network = Some(NetworkContext {
            allowed_domains: vec!["api.example.com".into(), "*.openai.com".into()],
            denied_domains: vec!["blocked.example.com".into()],
        });
        assert_eq!(
            ctx.serialize_to_xml(),
            r#"<environment_context>
  <cwd>/repo</cwd>
  <shell>bash</shell>
  <current_date>2026-02-26</current_date>
  <timezone>America/Los_Angeles</timezone>
  <network enabled="true">
    <allowed>api.example.com</allowed>
    <allowed>*.openai.com</allowed>
    <denied>blocked.example.com</denied>
  </network>
</environment_context>"#
        );
    }

    /// Codex's read-only, external-sandbox (with and without restricted network) and
    /// full-access cases all serialize the same: no cwd, nothing about the sandbox.
    #[test]
    fn serialize_environment_context_without_cwd() {
        assert_eq!(
            fake_env(None).serialize_to_xml(),
            r#"<environment_context>
  <shell>bash</shell>
  <current_date>2026-02-26</current_date>
  <timezone>America/Los_Angeles</timezone>
</environment_context>"#
        );
    }

    #[test]
    fn serialize_environment_context_with_subagents() {
        let mut ctx = fake_env(Some("/repo"));
        ctx.subagents = Some("- agent-1: atlas\n- agent-2".into());
        assert_eq!(
            ctx.serialize_to_xml(),
            r#"<environment_context>
  <cwd>/repo</cwd>
  <shell>bash</shell>
  <current_date>2026-02-26</current_date>
  <timezone>America/Los_Angeles</timezone>
  <subagents>
    - agent-1: atlas
    - agent-2
  </subagents>
</environment_context>"#
        );
    }

    #[test]
    fn optional_date_and_zone_are_left_out() {
        let mut ctx = fake_env(Some("/repo"));
        ctx.current_date = None;
        ctx.timezone = None;
        ctx.network = Some(NetworkContext::default());
        assert_eq!(
            ctx.serialize_to_xml(),
            "<environment_context>\n  <cwd>/repo</cwd>\n  <shell>bash</shell>\n  \
             <network enabled=\"true\">\n  </network>\n</environment_context>"
        );
    }

    /// Codex's user_instructions.rs test.
    #[test]
    fn user_instructions_format() {
        assert_eq!(
            user_instructions_text("test_directory", "test_text"),
            "# AGENTS.md instructions for test_directory\n\n<INSTRUCTIONS>\ntest_text\n</INSTRUCTIONS>"
        );
    }

    /// Codex's detect_shell_type cases (those that apply on Linux), plus an unknown shell.
    #[test]
    fn shell_names() {
        for (path, name) in [
            ("zsh", "zsh"),
            ("bash", "bash"),
            ("pwsh", "powershell"),
            ("powershell", "powershell"),
            ("/bin/zsh", "zsh"),
            ("/bin/bash", "bash"),
            ("powershell.exe", "powershell"),
            ("pwsh.exe", "powershell"),
            ("/usr/local/bin/pwsh", "powershell"),
            ("/bin/sh", "sh"),
            ("sh", "sh"),
            ("cmd", "cmd"),
            ("cmd.exe", "cmd"),
            ("/usr/bin/fish", "fish"),
        ] {
            assert_eq!(shell_name(Path::new(path)), name, "{path}");
        }
    }

    fn write(path: &Path, text: &str) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    fn docs(cwd: &Path, max: u64) -> Option<String> {
        read_project_docs(cwd, max).text
    }

    #[test]
    fn no_doc_file_returns_none() {
        let tmp = TempDir::new().unwrap();
        assert_eq!(read_project_docs(tmp.path(), 4096), ProjectDocs::default());
    }

    #[test]
    fn doc_smaller_than_limit_is_returned() {
        let tmp = TempDir::new().unwrap();
        write(&tmp.path().join("AGENTS.md"), "hello world");
        let out = read_project_docs(tmp.path(), 4096);
        assert_eq!(out.text.as_deref(), Some("hello world"));
        assert_eq!(
            out.docs,
            vec![ProjectDoc {
                path: tmp.path().join("AGENTS.md"),
                bytes_used: 11,
                truncated: false
            }]
        );
    }

    #[test]
    fn doc_larger_than_limit_is_truncated() {
        let tmp = TempDir::new().unwrap();
        let huge = "A".repeat(2048);
        write(&tmp.path().join("AGENTS.md"), &huge);
        let out = read_project_docs(tmp.path(), 1024);
        assert_eq!(out.text.as_deref(), Some(&huge[..1024]));
        assert_eq!(
            (out.docs[0].bytes_used, out.docs[0].truncated),
            (1024, true)
        );
    }

    #[test]
    fn exact_fit_is_not_truncated() {
        let tmp = TempDir::new().unwrap();
        write(&tmp.path().join("AGENTS.md"), "12345");
        let out = read_project_docs(tmp.path(), 5);
        assert_eq!(out.text.as_deref(), Some("12345"));
        assert!(!out.docs[0].truncated);
    }

    #[test]
    fn finds_doc_in_repo_root_with_git_file() {
        let repo = TempDir::new().unwrap();
        // `.git` may be a file (worktrees, submodules).
        write(
            &repo.path().join(".git"),
            "gitdir: /path/to/actual/git/dir\n",
        );
        write(&repo.path().join("AGENTS.md"), "root level doc");
        let nested = repo.path().join("workspace/crate_a");
        fs::create_dir_all(&nested).unwrap();
        assert_eq!(docs(&nested, 4096).as_deref(), Some("root level doc"));
    }

    #[test]
    fn concatenates_root_and_cwd_docs() {
        let repo = TempDir::new().unwrap();
        fs::create_dir(repo.path().join(".git")).unwrap();
        write(&repo.path().join("AGENTS.md"), "root doc");
        let nested = repo.path().join("workspace/crate_a");
        write(&nested.join("AGENTS.md"), "crate doc");
        // A directory in between without a doc contributes nothing.
        assert_eq!(
            docs(&nested, 4096).as_deref(),
            Some("root doc\n\ncrate doc")
        );
        let root = fs::canonicalize(repo.path()).unwrap();
        assert_eq!(
            discover_project_doc_paths(&nested),
            vec![
                root.join("AGENTS.md"),
                root.join("workspace/crate_a/AGENTS.md")
            ]
        );
    }

    #[test]
    fn docs_above_the_git_root_are_not_read() {
        let outer = TempDir::new().unwrap();
        write(&outer.path().join("AGENTS.md"), "outside the repo");
        let repo = outer.path().join("repo");
        fs::create_dir_all(repo.join(".git")).unwrap();
        write(&repo.join("AGENTS.md"), "repo doc");
        assert_eq!(docs(&repo, 4096).as_deref(), Some("repo doc"));
    }

    #[test]
    fn without_git_root_only_cwd_is_searched() {
        let outer = crate::tools::tempdir_outside_any_repository();
        write(&outer.path().join("AGENTS.md"), "parent doc");
        let cwd = outer.path().join("sub");
        fs::create_dir(&cwd).unwrap();
        assert_eq!(docs(&cwd, 4096), None);
        write(&cwd.join("AGENTS.md"), "cwd doc");
        assert_eq!(docs(&cwd, 4096).as_deref(), Some("cwd doc"));
    }

    #[test]
    fn zero_byte_limit_disables_docs() {
        let tmp = TempDir::new().unwrap();
        write(&tmp.path().join("AGENTS.md"), "something");
        assert_eq!(read_project_docs(tmp.path(), 0), ProjectDocs::default());
    }

    #[test]
    fn override_file_wins() {
        let tmp = TempDir::new().unwrap();
        write(&tmp.path().join(DEFAULT_PROJECT_DOC_FILENAME), "versioned");
        write(&tmp.path().join(LOCAL_PROJECT_DOC_FILENAME), "local");
        assert_eq!(docs(tmp.path(), 4096).as_deref(), Some("local"));
        let found = discover_project_doc_paths(tmp.path());
        assert_eq!(found, vec![tmp.path().join(LOCAL_PROJECT_DOC_FILENAME)]);
    }

    #[test]
    fn override_that_is_a_directory_is_passed_over() {
        let tmp = TempDir::new().unwrap();
        fs::create_dir(tmp.path().join(LOCAL_PROJECT_DOC_FILENAME)).unwrap();
        write(&tmp.path().join(DEFAULT_PROJECT_DOC_FILENAME), "versioned");
        assert_eq!(docs(tmp.path(), 4096).as_deref(), Some("versioned"));
    }

    #[test]
    fn budget_is_shared_across_files_in_order() {
        let repo = TempDir::new().unwrap();
        fs::create_dir(repo.path().join(".git")).unwrap();
        write(&repo.path().join("AGENTS.md"), "0123456789");
        let a = repo.path().join("a");
        write(&a.join("AGENTS.md"), "abcdefghij");
        let b = a.join("b");
        write(&b.join("AGENTS.md"), "never read");
        let out = read_project_docs(&b, 15);
        assert_eq!(out.text.as_deref(), Some("0123456789\n\nabcde"));
        let used: Vec<(u64, bool)> = out
            .docs
            .iter()
            .map(|d| (d.bytes_used, d.truncated))
            .collect();
        assert_eq!(used, vec![(10, false), (5, true)]);
    }

    #[test]
    fn whitespace_only_docs_are_skipped_and_cost_nothing() {
        let repo = TempDir::new().unwrap();
        fs::create_dir(repo.path().join(".git")).unwrap();
        write(&repo.path().join("AGENTS.md"), " \n\t\n  \n");
        let sub = repo.path().join("sub");
        write(&sub.join("AGENTS.md"), "12345");
        let out = read_project_docs(&sub, 5);
        assert_eq!(out.text.as_deref(), Some("12345"));
        assert_eq!(out.docs.len(), 1);
        assert!(!out.docs[0].truncated);
    }

    #[test]
    fn invalid_utf8_is_lossy_and_a_cut_character_becomes_a_replacement() {
        let tmp = TempDir::new().unwrap();
        fs::write(tmp.path().join("AGENTS.md"), b"a\xffb\xc3\xa9").unwrap();
        assert_eq!(docs(tmp.path(), 64).as_deref(), Some("a\u{fffd}bé"));
        // Cut in the middle of `é` (2 bytes): Codex reads 4 bytes and converts them lossily.
        let out = read_project_docs(tmp.path(), 4);
        assert_eq!(out.text.as_deref(), Some("a\u{fffd}b\u{fffd}"));
        assert_eq!(out.docs[0].bytes_used, 4);
    }

    #[test]
    fn symlinked_doc_is_read_and_dangling_one_skipped() {
        let repo = TempDir::new().unwrap();
        fs::create_dir(repo.path().join(".git")).unwrap();
        write(&repo.path().join("real.md"), "through a link");
        symlink(repo.path().join("real.md"), repo.path().join("AGENTS.md")).unwrap();
        let sub = repo.path().join("sub");
        fs::create_dir(&sub).unwrap();
        symlink(sub.join("missing.md"), sub.join("AGENTS.md")).unwrap();
        assert_eq!(docs(&sub, 4096).as_deref(), Some("through a link"));
    }

    #[test]
    fn fifo_and_device_docs_are_skipped_without_blocking() {
        let repo = TempDir::new().unwrap();
        fs::create_dir(repo.path().join(".git")).unwrap();
        // A FIFO named AGENTS.override.md is passed over for AGENTS.md (as in Codex).
        nix::unistd::mkfifo(
            &repo.path().join(LOCAL_PROJECT_DOC_FILENAME),
            nix::sys::stat::Mode::from_bits_truncate(0o644),
        )
        .unwrap();
        write(&repo.path().join("AGENTS.md"), "root doc");
        // A link to a FIFO and a link to /dev/zero are chosen by discovery, then skipped.
        let a = repo.path().join("a");
        fs::create_dir(&a).unwrap();
        nix::unistd::mkfifo(
            &a.join("pipe"),
            nix::sys::stat::Mode::from_bits_truncate(0o644),
        )
        .unwrap();
        symlink(a.join("pipe"), a.join("AGENTS.md")).unwrap();
        let b = a.join("b");
        fs::create_dir(&b).unwrap();
        symlink("/dev/zero", b.join("AGENTS.md")).unwrap();
        let started = std::time::Instant::now();
        let out = read_project_docs(&b, 4096);
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        assert_eq!(out.text.as_deref(), Some("root doc"));
        assert_eq!(out.docs.len(), 1);
    }

    #[test]
    fn git_root_through_a_dangling_link_is_not_a_root() {
        let outer = crate::tools::tempdir_outside_any_repository();
        let repo = outer.path().join("repo");
        fs::create_dir(&repo).unwrap();
        symlink(outer.path().join("nowhere"), repo.join(".git")).unwrap();
        write(&repo.join("AGENTS.md"), "repo doc");
        let sub = repo.join("sub");
        write(&sub.join("AGENTS.md"), "sub doc");
        // No root: only the cwd is searched.
        assert_eq!(docs(&sub, 4096).as_deref(), Some("sub doc"));
    }

    #[test]
    fn prompt_context_builds_both_messages_in_codex_order() {
        let repo = TempDir::new().unwrap();
        fs::create_dir(repo.path().join(".git")).unwrap();
        write(&repo.path().join("AGENTS.md"), "Use \"tabs\".\n");
        let ctx = prompt_context(
            repo.path(),
            Path::new("/bin/bash"),
            "2026-02-26",
            "Europe/Berlin",
            DEFAULT_PROJECT_DOC_MAX_BYTES,
            None,
        );
        let cwd = repo.path().to_str().unwrap();
        let env = format!(
            "<environment_context>\n  <cwd>{cwd}</cwd>\n  <shell>bash</shell>\n  \
             <current_date>2026-02-26</current_date>\n  <timezone>Europe/Berlin</timezone>\n\
             </environment_context>"
        );
        let ui = format!(
            "# AGENTS.md instructions for {cwd}\n\n<INSTRUCTIONS>\nUse \"tabs\".\n\n</INSTRUCTIONS>"
        );
        assert_eq!(ctx.environment_context, env);
        assert_eq!(ctx.user_instructions.as_deref(), Some(ui.as_str()));
        let message = |t: &str| {
            format!(
                r#"{{"type":"message","role":"user","content":[{{"type":"input_text","text":{}}}]}}"#,
                serde_json::to_string(t).unwrap()
            )
        };
        assert_eq!(
            ctx.responses_input_json(),
            format!("[{},{}]", message(&ui), message(&env))
        );
        let chat = |t: &str| {
            format!(
                r#"{{"role":"user","content":{}}}"#,
                serde_json::to_string(t).unwrap()
            )
        };
        assert_eq!(
            ctx.chat_messages_json(),
            format!("[{},{}]", chat(&ui), chat(&env))
        );
    }

    #[test]
    fn prompt_context_without_docs_has_only_the_environment_message() {
        let tmp = TempDir::new().unwrap();
        let ctx = prompt_context(
            tmp.path(),
            Path::new("/bin/zsh"),
            "2026-01-01",
            "Etc/UTC",
            4096,
            None,
        );
        assert_eq!(ctx.user_instructions, None);
        assert!(ctx.project_docs.is_empty());
        assert!(ctx.environment_context.contains("  <shell>zsh</shell>\n"));
        let items: serde_json::Value = serde_json::from_str(&ctx.responses_input_json()).unwrap();
        assert_eq!(items.as_array().unwrap().len(), 1);
        assert_eq!(items[0]["content"][0]["text"], ctx.environment_context);
        let chat: serde_json::Value = serde_json::from_str(&ctx.chat_messages_json()).unwrap();
        assert_eq!(
            chat,
            serde_json::json!([{"role": "user", "content": ctx.environment_context}])
        );
    }

    #[test]
    fn timezone_names() {
        let zi = TempDir::new().unwrap();
        write(&zi.path().join("Europe/Berlin"), "TZif");
        write(&zi.path().join("UTC"), "TZif");
        let name = |tz: Option<&str>, link: Option<&str>, etc: Option<&str>| {
            timezone_name(
                tz.map(OsStr::new),
                zi.path(),
                link.map(PathBuf::from),
                etc.map(str::to_string),
            )
        };
        let berlin = Some("Europe/Berlin".to_string());
        // TZ decides when set.
        assert_eq!(
            name(Some("Europe/Berlin"), Some("/x/zoneinfo/Asia/Tokyo"), None),
            berlin
        );
        assert_eq!(name(Some(":Europe/Berlin"), None, None), berlin);
        assert_eq!(name(Some("UTC"), None, None), Some("UTC".into()));
        // Not a zone file here, a POSIX rule, empty, or escaping the zoneinfo directory: UTC.
        assert_eq!(
            name(Some("Mars/Olympus"), Some("/x/zoneinfo/Asia/Tokyo"), None),
            None
        );
        assert_eq!(name(Some("CET-1CEST"), None, None), None);
        assert_eq!(name(Some(""), Some("/x/zoneinfo/Asia/Tokyo"), None), None);
        assert_eq!(name(Some("../zi/Europe/Berlin"), None, None), None);
        // An absolute TZ path under a zoneinfo directory, when it exists.
        let abs = zi.path().join("zoneinfo/Europe/Berlin");
        write(&abs, "TZif");
        assert_eq!(name(Some(abs.to_str().unwrap()), None, None), berlin);
        assert_eq!(
            name(Some("/nonexistent/zoneinfo/Europe/Berlin"), None, None),
            None
        );
        // No TZ: the /etc/localtime link, then /etc/timezone.
        assert_eq!(
            name(None, Some("/usr/share/zoneinfo/Europe/Berlin"), None),
            berlin
        );
        assert_eq!(
            name(
                None,
                Some("../usr/share/zoneinfo/posix/Europe/Berlin"),
                None
            ),
            berlin
        );
        assert_eq!(name(None, Some("/etc/some-file"), None), None);
        assert_eq!(
            name(None, Some("/etc/some-file"), Some("Asia/Tokyo\n")),
            Some("Asia/Tokyo".into())
        );
        assert_eq!(
            name(None, None, Some("Asia/Tokyo\n")),
            Some("Asia/Tokyo".into())
        );
        assert_eq!(name(None, None, Some("\n")), None);
        assert_eq!(name(None, None, None), None);
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc_date(0), "1970-01-01");
        // 2026-02-26T00:00:00Z and one second before it.
        assert_eq!(utc_date(1_772_064_000), "2026-02-26");
        assert_eq!(utc_date(1_772_063_999), "2026-02-25");
    }

    #[test]
    fn host_time_context_is_a_date_and_a_name() {
        let (date, zone) = host_time_context();
        let b = date.as_bytes();
        assert!(b.len() == 10 && b[4] == b'-' && b[7] == b'-', "{date}");
        assert!(is_zone_name(&zone), "{zone}");
    }
}
