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

/// What the user is asked about.
fn describe(request: &api::ApprovalRequest) -> String {
    let what = match api::ApprovalKind::try_from(request.kind) {
        Ok(api::ApprovalKind::RetryUnsandboxed) => "run again WITHOUT the sandbox",
        Ok(api::ApprovalKind::Escalate) => "run WITHOUT the sandbox",
        _ => "run in the sandbox",
    };
    let mut text = format!(
        "approve this command to {what}?\n  $ {}\n  in {}",
        shell_words(&request.command),
        request.cwd
    );
    if !request.reason.is_empty() {
        text.push_str(&format!("\n  reason: {}", request.reason));
    }
    if !request.justification.is_empty() {
        text.push_str(&format!("\n  justification: {}", request.justification));
    }
    text
}

/// The argv as a shell would read it (single-quoted where needed).
fn shell_words(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            let plain = !a.is_empty()
                && a.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b));
            if plain {
                a.clone()
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
}
