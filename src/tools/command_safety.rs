//! `is_known_safe_command`: whether an argv only reads, so the `untrusted` approval policy may run
//! it without asking (spec/tools.md §9, Codex's `command_safety/is_safe_command.rs`).
//!
//! A pure function of the argv: no filesystem, no environment. It is a convenience for approvals,
//! not a security boundary — a "safe" command still runs in the session's sandbox. Where this module
//! has to choose, it answers "not safe": a wrong "not safe" costs the user one question, a wrong
//! "safe" runs a command nobody approved.
//!
//! `bash -lc SCRIPT` is judged by splitting SCRIPT into plain commands. Codex does that with a
//! tree-sitter grammar; here a small scanner accepts only the same plain subset — bare words,
//! single-quoted strings, double-quoted strings without `$`, backquote or backslash, joined by
//! `&&`, `||`, `;` and `|` — and anything it does not recognise makes the script unsafe.

/// Whether `argv` is known to be safe to run without asking the user.
pub fn is_known_safe_command(argv: &[String]) -> bool {
    // Codex treats zsh exactly like bash.
    let argv: Vec<&str> = argv
        .iter()
        .map(|arg| if arg == "zsh" { "bash" } else { arg.as_str() })
        .collect();
    if is_safe_to_exec(&argv) {
        return true;
    }
    match shell_script(&argv).and_then(plain_commands) {
        Some(commands) => {
            !commands.is_empty()
                && commands.iter().all(|command| {
                    let words: Vec<&str> = command.iter().map(String::as_str).collect();
                    is_safe_to_exec(&words)
                })
        }
        None => false,
    }
}

/// Programs that only read, whatever their arguments.
const ALWAYS_SAFE: &[&str] = &[
    "cat", "cd", "cut", "echo", "expr", "false", "grep", "head", "id", "ls", "nl", "paste", "pwd",
    "rev", "seq", "stat", "tail", "tr", "true", "uname", "uniq", "wc", "which", "whoami",
    // Linux only in Codex; corral runs only on Linux.
    "numfmt", "tac",
];

/// `find` options that run commands, delete, or write files.
const FIND_UNSAFE_OPTIONS: &[&str] = &[
    "-exec", "-execdir", "-ok", "-okdir", "-delete", "-fls", "-fprint", "-fprint0", "-fprintf",
];

/// ripgrep options that run another program (`--pre`, `--hostname-bin` take it as a value).
const RG_UNSAFE_FLAGS: &[&str] = &["--search-zip", "-z"];
const RG_UNSAFE_OPTIONS_WITH_VALUE: &[&str] = &["--pre", "--hostname-bin"];

/// One argv, judged by its program's own rules.
fn is_safe_to_exec(argv: &[&str]) -> bool {
    let Some(program) = argv.first() else {
        return false;
    };
    // Judged by the file name, as Codex does (`/bin/ls` is `ls`).
    let name = program.rsplit('/').next().unwrap_or(program);
    let args = &argv[1..];
    match name {
        name if ALWAYS_SAFE.contains(&name) => true,
        "base64" => !args
            .iter()
            .any(|arg| *arg == "--output" || arg.starts_with("--output=") || arg.starts_with("-o")),
        "find" => !args.iter().any(|arg| FIND_UNSAFE_OPTIONS.contains(arg)),
        "rg" => !args.iter().any(|arg| {
            RG_UNSAFE_FLAGS.contains(arg)
                || RG_UNSAFE_OPTIONS_WITH_VALUE.iter().any(|option| {
                    *arg == *option
                        || arg
                            .strip_prefix(option)
                            .is_some_and(|rest| rest.starts_with('='))
                })
        }),
        // A repository's configuration can make even `git status` run helpers (fsmonitor,
        // pagers, diff drivers): git is never known safe (Codex since late 2026).
        "git" => false,
        "sed" => argv.len() <= 4 && args.first() == Some(&"-n") && is_sed_print_range(args.get(1)),
        _ => false,
    }
}

/// `N` or `M,N` followed by `p`: sed's "print these lines" and nothing else.
fn is_sed_print_range(arg: Option<&&str>) -> bool {
    let Some(range) = arg.and_then(|arg| arg.strip_suffix('p')) else {
        return false;
    };
    let number = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    match range.split_once(',') {
        Some((first, last)) => number(first) && number(last),
        None => number(range),
    }
}

/// The script of `[bash|sh, -lc|-c, SCRIPT]` (exactly three elements; zsh is already bash).
fn shell_script<'a>(argv: &[&'a str]) -> Option<&'a str> {
    let [shell, flag, script] = argv else {
        return None;
    };
    let shell_name = shell.rsplit('/').next().unwrap_or(shell);
    (matches!(shell_name, "bash" | "sh") && matches!(*flag, "-lc" | "-c")).then_some(*script)
}

/// Splits a script into plain commands joined by `&&`, `||`, `;` or `|`; `None` when it contains
/// anything else (expansions, redirections, subshells, globs, comments, escapes, newlines) or an
/// empty command position.
fn plain_commands(script: &str) -> Option<Vec<Vec<String>>> {
    let mut commands = Vec::new();
    let mut words: Vec<String> = Vec::new();
    let mut chars = script.chars().peekable();
    loop {
        match chars.peek().copied() {
            None => break,
            Some(' ' | '\t') => {
                chars.next();
            }
            Some(operator @ ('&' | '|' | ';')) => {
                chars.next();
                let doubled = chars.peek() == Some(&operator);
                match (operator, doubled) {
                    ('&', true) | ('|', true) => {
                        chars.next();
                    }
                    ('|', false) | (';', false) => {}
                    // A lone `&` (background) or `;;`.
                    _ => return None,
                }
                if words.is_empty() {
                    return None;
                }
                commands.push(std::mem::take(&mut words));
            }
            Some(_) => words.push(plain_word(&mut chars)?),
        }
    }
    if words.is_empty() {
        // A trailing operator (`ls &&`) leaves an empty command; an empty script has none at all.
        return None;
    }
    commands.push(words);
    Some(commands)
}

/// One word: bare characters and quoted strings with no space between them (`-g'*.rs'`).
fn plain_word(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) -> Option<String> {
    let mut word = String::new();
    let mut quoted = false;
    while let Some(&c) = chars.peek() {
        match c {
            ' ' | '\t' | '&' | '|' | ';' => break,
            '\'' => {
                chars.next();
                quoted = true;
                loop {
                    match chars.next()? {
                        '\'' => break,
                        c => word.push(c),
                    }
                }
            }
            '"' => {
                chars.next();
                quoted = true;
                loop {
                    match chars.next()? {
                        '"' => break,
                        '$' | '`' | '\\' => return None,
                        c => word.push(c),
                    }
                }
            }
            c if is_plain_word_char(c) => {
                chars.next();
                word.push(c);
            }
            _ => return None,
        }
    }
    (quoted || !word.is_empty()).then_some(word)
}

/// Characters a bare word may hold without the shell giving them meaning. Everything else —
/// `$`, backquote, `\`, `*`, `?`, `[`, `{`, `~`, `#`, `<`, `>`, `(`, `!`, newline… — is unsafe.
fn is_plain_word_char(c: char) -> bool {
    c.is_alphanumeric()
        || matches!(
            c,
            '-' | '_' | '.' | '/' | ',' | ':' | '=' | '+' | '@' | '%' | '^'
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(args: &[&str]) -> Vec<String> {
        args.iter().map(|arg| arg.to_string()).collect()
    }

    fn safe(args: &[&str]) -> bool {
        is_known_safe_command(&argv(args))
    }

    // Every case spec/tools.md §9 lists, in its order.
    #[test]
    fn the_specs_safe_cases() {
        for case in [
            &["ls"][..],
            &["base64"],
            &["sed", "-n", "1,5p", "file.txt"],
            &["nl", "-nrz", "Cargo.toml"],
            &["find", ".", "-name", "file.txt"],
            &["rg", "Cargo.toml", "-n"],
            &["zsh", "-lc", "ls"],
            &["bash", "-lc", "ls && pwd"],
            &["bash", "-lc", "echo 'hi' ; ls"],
            &["bash", "-lc", "ls | wc -l"],
            &["bash", "-lc", "grep -R \"Cargo.toml\" -n || true"],
            &["bash", "-lc", "sed -n '1,5p' file.txt"],
            &["numfmt", "1000"],
        ] {
            assert!(safe(case), "{case:?} must be known safe");
        }
    }

    #[test]
    fn the_specs_unsafe_cases() {
        for case in [
            &["foo"][..],
            &["git", "fetch"],
            &["git", "status"],
            &["cargo", "check"],
            &["sed", "-n", "xp", "file.txt"],
            &["find", ".", "-delete", "-name", "f"],
            &["find", ".", "-exec", "rm", "{}", ";"],
            &["base64", "-o", "out.bin"],
            &["base64", "-ob64.txt"],
            &["rg", "--pre", "pwned", "files"],
            &["rg", "--hostname-bin=pwned", "files"],
            &["rg", "-z", "files"],
            &["bash", "-lc", "git status"],
            &["bash", "-lc", "git", "status"],
            &["bash", "-lc", "'git status'"],
            &["bash", "-lc", "ls && rm -rf /"],
            &["bash", "-lc", "(ls)"],
            &["bash", "-lc", "ls > out.txt"],
        ] {
            assert!(!safe(case), "{case:?} must not be known safe");
        }
    }

    #[test]
    fn every_always_safe_program_is_safe_with_any_arguments() {
        for program in ALWAYS_SAFE {
            assert!(safe(&[program, "--anything", "x"]), "{program}");
            assert!(
                safe(&[&format!("/usr/bin/{program}")]),
                "/usr/bin/{program}"
            );
        }
    }

    #[test]
    fn every_unsafe_option_of_find_base64_and_rg_is_caught() {
        for option in FIND_UNSAFE_OPTIONS {
            assert!(!safe(&["find", ".", option, "x"]), "find {option}");
        }
        for args in [
            &["base64", "--output", "x"][..],
            &["base64", "--output=x"],
            &["base64", "-o"],
        ] {
            assert!(!safe(args), "{args:?}");
        }
        for args in [
            &["rg", "--search-zip", "x"][..],
            &["rg", "--pre=cat", "x"],
            &["rg", "--hostname-bin", "h"],
        ] {
            assert!(!safe(args), "{args:?}");
        }
        // A value that merely starts like an unsafe option is not that option.
        assert!(safe(&["rg", "--pretty", "x"]));
        assert!(safe(&["base64", "-d", "x"]));
    }

    #[test]
    fn git_is_never_safe_whatever_the_subcommand() {
        for sub in ["status", "log", "diff", "show", "branch"] {
            assert!(!safe(&["git", sub]), "git {sub}");
            assert!(
                !safe(&["bash", "-lc", &format!("git {sub}")]),
                "bash -lc git {sub}"
            );
        }
    }

    #[test]
    fn sed_only_prints_a_line_range() {
        assert!(safe(&["sed", "-n", "10p"]));
        assert!(safe(&["sed", "-n", "3,9p", "f"]));
        for args in [
            &["sed", "-n", "1,5p", "a", "b"][..],
            &["sed", "-n", "1,2,3p", "f"],
            &["sed", "-n", ",5p", "f"],
            &["sed", "-n", "5", "f"],
            &["sed", "-i", "1p", "f"],
            &["sed", "-n", "1p;w /tmp/x", "f"],
            &["sed", "-n"],
        ] {
            assert!(!safe(args), "{args:?}");
        }
    }

    #[test]
    fn shell_scripts_only_of_plain_safe_commands() {
        assert!(safe(&["sh", "-c", "ls;pwd"]));
        assert!(safe(&["/bin/bash", "-c", "echo \"a b\"|wc -c"]));
        assert!(safe(&["bash", "-lc", "rg -n foo -g'x.rs'"]));
        assert!(safe(&["bash", "-lc", "echo ''"]));
        for script in [
            "",
            "ls &&",
            "&& ls",
            "ls ;; pwd",
            "ls | | wc",
            "ls & pwd",
            "ls |& wc",
            "echo $HOME",
            "echo \"$HOME\"",
            "echo \"hi ${USER}\"",
            "echo $(pwd)",
            "echo `pwd`",
            "echo \\$HOME",
            "ls *.rs",
            "ls ?",
            "ls {a,b}",
            "ls ~",
            "cat < /etc/passwd",
            "FOO=bar ls",
            "ls\nrm -rf x",
            "ls # comment",
            "! ls",
            "echo 'unterminated",
            "echo \"unterminated",
            "ls || (pwd && echo hi)",
        ] {
            assert!(!safe(&["bash", "-lc", script]), "bash -lc {script:?}");
        }
        // Only bash, sh and zsh (as bash) with -c or -lc, in exactly three elements.
        assert!(!safe(&["fish", "-c", "ls"]));
        assert!(!safe(&["bash", "-x", "ls"]));
        assert!(!safe(&["bash", "-lc"]));
    }

    #[test]
    fn the_scanner_returns_the_words_of_each_command() {
        assert_eq!(
            plain_commands("echo \"/usr\"'/'local/bin && rg -n 'a b' | wc -l"),
            Some(vec![
                argv(&["echo", "/usr/local/bin"]),
                argv(&["rg", "-n", "a b"]),
                argv(&["wc", "-l"]),
            ])
        );
        assert_eq!(
            plain_commands("echo '' x"),
            Some(vec![argv(&["echo", "", "x"])])
        );
    }

    #[test]
    fn an_empty_argv_is_not_safe() {
        assert!(!safe(&[]));
    }
}
