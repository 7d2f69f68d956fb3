//! Recognising an apply_patch sent through a shell tool (spec/tools.md §5.9).
//!
//! Only the exact forms the spec lists are recognised: `["apply_patch", PATCH]`, a shell `-c`
//! wrapper whose script is `apply_patch <<'X'` … `X`, optionally preceded by `cd <one path> &&`.
//! Anything with other operators or extra commands is an ordinary command. Applying the patch is
//! the caller's job (through [`super::apply_patch`], with `cwd` joined with the `cd` directory).

use super::parse_patch;

/// The text for a bare patch sent as a command.
pub const IMPLICIT_INVOCATION_ERROR: &str = "apply_patch verification failed: patch detected without explicit call to apply_patch. Rerun as [\"apply_patch\", \"<patch>\"]";
/// The text when a recognised heredoc form holds no usable patch.
pub const INVALID_INPUT_ERROR: &str = "apply_patch handler received invalid patch input";

/// The text when a command is not an apply_patch invocation at all.
pub const NON_PATCH_INPUT_ERROR: &str = "apply_patch handler received non-apply_patch input";

/// The warning recorded in the typed result when a patch arrives through a shell tool (§5.9).
pub fn interception_warning(tool: &str) -> String {
    format!(
        "apply_patch was requested via {tool}. Use the apply_patch tool instead of exec_command."
    )
}

/// How a command relates to apply_patch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invocation {
    /// An apply_patch call: the patch text and the `cd` directory, if any (as spelled).
    Patch {
        patch: String,
        workdir: Option<String>,
    },
    /// The command is a bare patch: answer with [`IMPLICIT_INVOCATION_ERROR`].
    BarePatch,
    /// An ordinary command.
    NotPatch,
}

fn is_command_name(s: &str) -> bool {
    s == "apply_patch" || s == "applypatch"
}

/// Classifies a `shell`/`exec` argv.
pub fn classify_argv(argv: &[String]) -> Invocation {
    let args: Vec<&str> = argv.iter().map(String::as_str).collect();
    match args.as_slice() {
        [cmd, patch] if is_command_name(cmd) => Invocation::Patch {
            patch: (*patch).to_string(),
            workdir: None,
        },
        [body] if parse_patch(body).is_ok() => Invocation::BarePatch,
        ["bash" | "zsh" | "sh", "-c" | "-lc", script]
        | ["pwsh" | "powershell", "-Command", script]
        | ["pwsh" | "powershell", "-NoProfile", "-Command", script]
        | ["cmd", "/c", script] => classify_script(script),
        _ => Invocation::NotPatch,
    }
}

/// Classifies a shell script (the `shell_command`/`exec_command` string, or a `-c` argument).
pub fn classify_script(script: &str) -> Invocation {
    if parse_patch(script).is_ok() {
        return Invocation::BarePatch;
    }
    parse_heredoc_script(script).unwrap_or(Invocation::NotPatch)
}

/// Parses a single shell word: plain (`[A-Za-z0-9_./@%+=:,-]`), `'…'` or `"…"` without
/// expansions. Returns the word and the rest of the input.
fn shell_word(s: &str) -> Option<(String, &str)> {
    let s = s.trim_start_matches([' ', '\t']);
    let plain = |c: char| c.is_ascii_alphanumeric() || "_./@%+=:,-".contains(c);
    if let Some(rest) = s.strip_prefix('\'') {
        let end = rest.find('\'')?;
        return Some((rest[..end].to_string(), &rest[end + 1..]));
    }
    if let Some(rest) = s.strip_prefix('"') {
        let end = rest.find('"')?;
        let word = &rest[..end];
        if word.contains(['$', '`', '\\']) {
            return None;
        }
        return Some((word.to_string(), &rest[end + 1..]));
    }
    let end = s.find(|c: char| !plain(c)).unwrap_or(s.len());
    if end == 0 {
        return None;
    }
    Some((s[..end].to_string(), &s[end..]))
}

fn parse_heredoc_script(script: &str) -> Option<Invocation> {
    let script = script.trim();
    let (head, body) = script.split_once('\n')?;
    let mut rest = head.trim_end();
    let mut workdir = None;
    let (first, after) = shell_word(rest)?;
    rest = after;
    let command = if first == "cd" {
        let (dir, after) = shell_word(rest)?;
        let after = after.trim_start_matches([' ', '\t']).strip_prefix("&&")?;
        workdir = Some(dir);
        let (cmd, after) = shell_word(after)?;
        rest = after;
        cmd
    } else {
        first
    };
    if !is_command_name(&command) {
        return None;
    }
    let redirect = rest.trim_start_matches([' ', '\t']).strip_prefix("<<")?;
    let (delimiter, after) = shell_word(redirect)?;
    if !after.trim().is_empty() {
        return None;
    }
    let lines: Vec<&str> = body.lines().collect();
    let end = lines.iter().position(|l| *l == delimiter)?;
    if lines[end + 1..].iter().any(|l| !l.trim().is_empty()) {
        return None;
    }
    let mut patch = lines[..end].join("\n");
    patch.push('\n');
    Some(Invocation::Patch { patch, workdir })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATCH: &str = "*** Begin Patch\n*** Add File: a\n+x\n*** End Patch";

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    fn patch(workdir: Option<&str>) -> Invocation {
        Invocation::Patch {
            patch: format!("{PATCH}\n"),
            workdir: workdir.map(str::to_string),
        }
    }

    #[test]
    fn warning_text() {
        assert_eq!(
            interception_warning("shell"),
            "apply_patch was requested via shell. Use the apply_patch tool instead of exec_command."
        );
    }

    #[test]
    fn direct_argv() {
        for name in ["apply_patch", "applypatch"] {
            assert_eq!(
                classify_argv(&argv(&[name, PATCH])),
                Invocation::Patch {
                    patch: PATCH.into(),
                    workdir: None
                }
            );
        }
        assert_eq!(classify_argv(&argv(&[PATCH])), Invocation::BarePatch);
        assert_eq!(classify_argv(&argv(&["ls", "-l"])), Invocation::NotPatch);
    }

    #[test]
    fn heredoc_forms() {
        for open in ["<<'EOF'", "<<EOF", "<<\"EOF\"", "<< 'X'"] {
            let delim = if open.contains('X') { "X" } else { "EOF" };
            let script = format!("apply_patch {open}\n{PATCH}\n{delim}\n");
            for wrapper in [
                argv(&["bash", "-lc", &script]),
                argv(&["sh", "-c", &script]),
                argv(&["pwsh", "-NoProfile", "-Command", &script]),
                argv(&["cmd", "/c", &script]),
            ] {
                assert_eq!(classify_argv(&wrapper), patch(None), "{open}");
            }
        }
        let script = format!("cd 'my dir' && apply_patch <<'EOF'\n{PATCH}\nEOF");
        assert_eq!(classify_script(&script), patch(Some("my dir")));
    }

    #[test]
    fn rejected_forms() {
        for head in [
            "apply_patch <<'EOF'; ls",
            "cd a b && apply_patch <<'EOF'",
            "cd a; apply_patch <<'EOF'",
            "cd a || apply_patch <<'EOF'",
            "apply_patch foo <<'EOF'",
            "cat <<'EOF' | apply_patch",
            "cd $HOME && apply_patch <<'EOF'",
        ] {
            let script = format!("{head}\n{PATCH}\nEOF\n");
            assert_eq!(classify_script(&script), Invocation::NotPatch, "{head}");
        }
        // Commands after the heredoc.
        let script = format!("apply_patch <<'EOF'\n{PATCH}\nEOF\nls\n");
        assert_eq!(classify_script(&script), Invocation::NotPatch);
        assert_eq!(classify_script(PATCH), Invocation::BarePatch);
    }
}
