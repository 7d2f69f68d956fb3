//! The CLI's side of approval policies (spec/sandbox.md §5.2): when a call comes back as an
//! approval request, ask the user on the terminal — yes, no, or always for this session — and
//! answer with DecideApproval until the call has its result. Without a terminal the request is
//! denied, unless `--approvals` decided in advance.

use super::connect::Connection as Channel;
use crate::api::{self, bridge_client::BridgeClient};
use clap::ValueEnum;
use std::io::{BufRead, IsTerminal, Write};

/// `--approval-policy`: the session's approval policy.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum PolicyArg {
    Untrusted,
    OnFailure,
    OnRequest,
    Never,
}

impl PolicyArg {
    pub fn api(self) -> api::ApprovalPolicy {
        match self {
            PolicyArg::Untrusted => api::ApprovalPolicy::Untrusted,
            PolicyArg::OnFailure => api::ApprovalPolicy::OnFailure,
            PolicyArg::OnRequest => api::ApprovalPolicy::OnRequest,
            PolicyArg::Never => api::ApprovalPolicy::Never,
        }
    }
}

/// `--approvals`: how approval requests are answered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum Answer {
    /// Ask on the terminal; without one, deny.
    #[default]
    Ask,
    /// Approve every request, once each.
    Approve,
    /// Approve every request for the rest of the session.
    ApproveForSession,
    /// Deny every request.
    Deny,
}

/// Answers `resp`'s approval requests until the call has its result; returns that result. A
/// request that expired before the answer arrived gives the model's rejection text, as the
/// daemon's request says.
pub async fn settle(
    channel: &Channel,
    session_id: &str,
    mut resp: api::InvokeResponse,
    answer: Answer,
) -> Result<api::InvokeResponse, String> {
    let mut bridge =
        BridgeClient::new(channel.clone()).max_decoding_message_size(super::MAX_MESSAGE_BYTES);
    while let Some(request) = resp.approval.take() {
        let decision = decide(&request, answer).await?;
        let decided = bridge
            .decide_approval(api::DecideApprovalRequest {
                session_id: session_id.to_string(),
                approval_id: request.approval_id.clone(),
                decision: decision as i32,
            })
            .await;
        resp = match decided {
            Ok(r) => match r.into_inner().result {
                Some(api::decide_approval_response::Result::Invoke(r)) => r,
                other => return Err(format!("the daemon answered the decision with {other:?}")),
            },
            Err(s) if s.code() == tonic::Code::DeadlineExceeded => {
                eprintln!("corral: {}", s.message());
                api::InvokeResponse {
                    call_id: request.call_id,
                    output: request.rejected_output,
                    success: false,
                    ..Default::default()
                }
            }
            Err(s) => return Err(super::cli::status_text(s)),
        };
    }
    Ok(resp)
}

/// The decision for one request: `answer`'s, or the user's on the terminal.
async fn decide(
    request: &api::ApprovalRequest,
    answer: Answer,
) -> Result<api::ApprovalDecision, String> {
    let fixed = match answer {
        Answer::Approve => Some(api::ApprovalDecision::Approved),
        Answer::ApproveForSession => Some(api::ApprovalDecision::ApprovedForSession),
        Answer::Deny => Some(api::ApprovalDecision::Denied),
        Answer::Ask => None,
    };
    if let Some(d) = fixed {
        return Ok(d);
    }
    let shown = describe(request);
    if !std::io::stdin().is_terminal() || !std::io::stderr().is_terminal() {
        eprintln!(
            "corral: {shown}\ncorral: denied: there is no terminal to ask on (pass --approvals \
             approve, approve-for-session or deny to answer without asking)"
        );
        return Ok(api::ApprovalDecision::Denied);
    }
    // The terminal read blocks; it must not hold up the runtime.
    tokio::task::spawn_blocking(move || ask_on_terminal(&shown))
        .await
        .map_err(|e| format!("asking for approval failed: {e}"))?
}

/// The most of one field (a command, a reason) a prompt shows; the rest is cut with a note.
const SHOWN_CHARS: usize = 2000;

/// Whether `c` must not reach the terminal as itself: control characters (escape sequences
/// start with one, CR rewrites the line), and the invisible or direction-changing characters
/// that make text read differently from what runs (spec/sandbox.md H22).
fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00AD}'
                | '\u{061C}'
                | '\u{180E}'
                | '\u{200B}'..='\u{200F}'
                | '\u{2028}'..='\u{202E}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{2069}'
                | '\u{FEFF}'
        )
}

/// `c` as bash's `$'…'` writes it: `\n`, `\x1b`, `\u202e`.
fn escaped(c: char) -> String {
    match c {
        '\n' => "\\n".into(),
        '\r' => "\\r".into(),
        '\t' => "\\t".into(),
        c if (c as u32) < 0x80 => format!("\\x{:02x}", c as u32),
        c => format!("\\u{:04x}", c as u32),
    }
}

/// Model text for a prompt: hidden characters escaped, one line, at most [`SHOWN_CHARS`].
pub(super) fn visible(text: &str) -> String {
    let mut out = String::new();
    for (i, c) in text.chars().enumerate() {
        if i == SHOWN_CHARS {
            let rest = text.chars().count() - i;
            out.push_str(&format!("… [{rest} more characters not shown]"));
            break;
        }
        if hidden(c) {
            out.push_str(&escaped(c));
        } else {
            out.push(c);
        }
    }
    out
}

/// What the user is asked about. Every field is the model's (or the command's) text and is
/// shown with nothing hidden: what the user approves is what runs.
fn describe(request: &api::ApprovalRequest) -> String {
    let what = match api::ApprovalKind::try_from(request.kind) {
        Ok(api::ApprovalKind::RetryUnsandboxed) => "run again WITHOUT the sandbox",
        Ok(api::ApprovalKind::Escalate) => "run WITHOUT the sandbox",
        _ => "run in the sandbox",
    };
    let mut text = format!(
        "approve this command to {what}?\n  $ {}\n  in {}",
        visible_words(&shell_words(&request.command)),
        visible(&request.cwd)
    );
    if !request.reason.is_empty() {
        text.push_str(&format!("\n  reason: {}", visible(&request.reason)));
    }
    if !request.justification.is_empty() {
        text.push_str(&format!(
            "\n  justification: {}",
            visible(&request.justification)
        ));
    }
    text
}

/// The shell words cut to [`SHOWN_CHARS`] with a note, as [`visible`] cuts text.
pub(super) fn visible_words(words: &str) -> String {
    match words.char_indices().nth(SHOWN_CHARS) {
        Some((at, _)) => format!(
            "{}… [{} more characters not shown]",
            &words[..at],
            words.chars().count() - SHOWN_CHARS
        ),
        None => words.to_string(),
    }
}

/// The argv as a shell would read it: single-quoted where needed, and `$'…'` with escapes
/// where a word holds a hidden character (an escape sequence, CR, a direction override).
pub(super) fn shell_words(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            let plain = !a.is_empty()
                && a.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b));
            if plain {
                a.clone()
            } else if a.chars().any(hidden) {
                let mut word = String::from("$'");
                for c in a.chars() {
                    match c {
                        '\\' => word.push_str("\\\\"),
                        '\'' => word.push_str("\\'"),
                        c if hidden(c) => word.push_str(&escaped(c)),
                        c => word.push(c),
                    }
                }
                word.push('\'');
                word
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn ask_on_terminal(shown: &str) -> Result<api::ApprovalDecision, String> {
    let stdin = std::io::stdin();
    loop {
        eprint!("corral: {shown}\n[y]es, [n]o, [a]lways for this session: ");
        let _ = std::io::stderr().flush();
        let mut line = String::new();
        let read = stdin
            .lock()
            .read_line(&mut line)
            .map_err(|e| format!("reading the answer: {e}"))?;
        if read == 0 {
            // End of input: nobody is there to approve.
            eprintln!();
            return Ok(api::ApprovalDecision::Denied);
        }
        if let Some(d) = parse_answer(&line) {
            return Ok(d);
        }
        eprintln!("corral: answer y, n or a");
    }
}

/// `y`/`yes`, `n`/`no`, `a`/`always` (any case); anything else is asked again.
fn parse_answer(line: &str) -> Option<api::ApprovalDecision> {
    match line.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => Some(api::ApprovalDecision::Approved),
        "n" | "no" => Some(api::ApprovalDecision::Denied),
        "a" | "always" => Some(api::ApprovalDecision::ApprovedForSession),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_and_display() {
        assert_eq!(parse_answer("Y\n"), Some(api::ApprovalDecision::Approved));
        assert_eq!(parse_answer(" no "), Some(api::ApprovalDecision::Denied));
        assert_eq!(
            parse_answer("always"),
            Some(api::ApprovalDecision::ApprovedForSession)
        );
        assert_eq!(parse_answer("maybe"), None);
        assert_eq!(parse_answer(""), None);
        assert_eq!(
            shell_words(&["rm".into(), "a b".into(), "it's".into(), "".into()]),
            r"rm 'a b' 'it'\''s' ''"
        );
        let shown = describe(&api::ApprovalRequest {
            command: vec!["touch".into(), "/x".into()],
            cwd: "/w".into(),
            reason: "command failed; retry without sandbox?".into(),
            kind: api::ApprovalKind::RetryUnsandboxed as i32,
            ..Default::default()
        });
        assert_eq!(
            shown,
            "approve this command to run again WITHOUT the sandbox?\n  $ touch /x\n  in /w\n  \
             reason: command failed; retry without sandbox?"
        );
    }

    /// H22: the red team's spoof (`\r\x1b[2K  $ ls -la` hiding the real command) and its
    /// variants show every hidden character escaped, on one line per field, cut when long.
    #[test]
    fn hidden_characters_are_shown_escaped() {
        let spoof = "touch /tmp/pwned\r\x1b[2K  $ ls -la";
        assert_eq!(
            shell_words(&["bash".into(), "-c".into(), spoof.into()]),
            r"bash -c $'touch /tmp/pwned\r\x1b[2K  $ ls -la'"
        );
        // Bidirectional overrides and zero-width characters, quotes and backslashes.
        assert_eq!(
            shell_words(&["echo".into(), "a\u{202e}b\u{200b}'\\".into()]),
            r"echo $'a\u202eb\u200b\'\\'"
        );
        let shown = describe(&api::ApprovalRequest {
            command: vec!["rm".into(), "-rf".into(), "x".into()],
            cwd: "/w\n  in /elsewhere".into(),
            reason: "fine\r\x1b[1A\x1b[2Kreason: harmless".into(),
            justification: "\u{2066}ok\u{2069}\n".into(),
            ..Default::default()
        });
        assert_eq!(shown.lines().count(), 5, "{shown}");
        assert!(
            !shown
                .chars()
                .any(|c| c == '\r' || c == '\x1b' || c == '\u{2066}')
        );
        assert!(shown.contains(r"in /w\n  in /elsewhere"), "{shown}");
        assert!(
            shown.contains(r"reason: fine\r\x1b[1A\x1b[2Kreason: harmless"),
            "{shown}"
        );
        assert!(
            shown.contains(r"justification: \u2066ok\u2069\n"),
            "{shown}"
        );
        // Long text is cut, saying so.
        let long = describe(&api::ApprovalRequest {
            command: vec!["echo".into(), "y".repeat(5000)],
            reason: "z".repeat(5000),
            ..Default::default()
        });
        assert!(long.contains("more characters not shown"), "{long}");
        assert!(long.len() < 4600, "{}", long.len());
    }
}
