//! The model text of a shell command: the structured JSON format of `shell`/`container.exec`
//! (spec/tools.md §6.3) and the freeform text of `shell_command` (§6.4).
//!
//! Both are computed from the captured windows and totals (capture.rs), with the truncation
//! budget capped at the window size so the text is exactly what the algorithms would give on the
//! complete output (§6.2).

use std::time::Duration;

use serde::Serialize;

use super::capture::MAX_TRUNCATION_BUDGET;
use super::exec::ExecOutcome;
use super::truncate::{
    TextView, TruncationPolicy, count_lines, formatted_truncate_view, truncate_view,
};

/// Wall time as Codex reports it: f32 seconds rounded to one decimal. serde_json prints an f32
/// as its shortest round-trip form (`0.0`, `1.2`, `10.0`); `{}` Display drops a zero fraction
/// (`0`, `1.3`).
pub fn duration_seconds(duration: Duration) -> f32 {
    (duration.as_secs_f32() * 10.0).round() / 10.0
}

/// `command timed out after {elapsed_ms} milliseconds\n` (§6.2).
pub fn timeout_prefix(duration: Duration) -> String {
    format!(
        "command timed out after {} milliseconds\n",
        duration.as_millis()
    )
}

/// The key order of this struct is the key order of the JSON (§6.3).
#[derive(Serialize)]
struct StructuredOutput<'a> {
    output: &'a str,
    metadata: Metadata,
}

#[derive(Serialize)]
struct Metadata {
    exit_code: i32,
    duration_seconds: f32,
}

/// `{"output":…,"metadata":{"exit_code":…,"duration_seconds":…}}` with `formatted` as the
/// output, already truncated (serde_json compact form and escaping).
pub fn structured_json(formatted: &str, exit_code: i32, duration: Duration) -> String {
    let value = StructuredOutput {
        output: formatted,
        metadata: Metadata {
            exit_code,
            duration_seconds: duration_seconds(duration),
        },
    };
    serde_json::to_string(&value).expect("serialising strings and numbers cannot fail")
}

/// The structured format (§6.3) of a content text.
pub fn format_structured(
    content: TextView<'_>,
    exit_code: i32,
    duration: Duration,
    policy: TruncationPolicy,
) -> String {
    let formatted = formatted_truncate_view(content, policy);
    structured_json(&formatted, exit_code, duration)
}

/// The freeform format (§6.4) of a content text: header lines, then the truncated body with no
/// warning header; `Total output lines` only when truncation changed the line count.
pub fn format_freeform(
    content: TextView<'_>,
    exit_code: i32,
    duration: Duration,
    policy: TruncationPolicy,
) -> String {
    let body = truncate_view(content, policy);
    let mut out = format!(
        "Exit code: {exit_code}\nWall time: {} seconds\n",
        duration_seconds(duration)
    );
    if count_lines(&body) != content.lines() {
        out.push_str(&format!("Total output lines: {}\n", content.lines()));
    }
    out.push_str("Output:\n");
    out.push_str(&body);
    out
}

/// Model text of `shell` / `container.exec` (§6.3).
pub fn shell_output_text(outcome: &ExecOutcome, policy: TruncationPolicy) -> String {
    with_content(outcome, |view| {
        format_structured(view, outcome.exit_code, outcome.duration, capped(policy))
    })
}

/// Model text of `shell_command` (§6.4).
pub fn shell_command_output_text(outcome: &ExecOutcome, policy: TruncationPolicy) -> String {
    with_content(outcome, |view| {
        format_freeform(view, outcome.exit_code, outcome.duration, capped(policy))
    })
}

fn capped(policy: TruncationPolicy) -> TruncationPolicy {
    policy.capped(MAX_TRUNCATION_BUDGET)
}

/// Calls `f` with the content of an outcome: the arrival-order text, prefixed with the timeout
/// line if the command timed out.
fn with_content<R>(outcome: &ExecOutcome, f: impl FnOnce(TextView<'_>) -> R) -> R {
    let combined = &outcome.combined;
    let (head, tail) = combined.text_windows().unwrap_or(("", ""));
    let (mut len, mut chars, mut lines) = (
        combined.text_len as usize,
        combined.total_chars as usize,
        combined.total_lines as usize,
    );
    let mut prefixed = String::new();
    let head = if outcome.timed_out {
        let prefix = timeout_prefix(outcome.duration);
        len += prefix.len();
        chars += prefix.chars().count();
        // The prefix ends in `\n`, so it adds exactly one line to whatever follows.
        lines += 1;
        prefixed.push_str(&prefix);
        prefixed.push_str(head);
        prefixed.as_str()
    } else {
        head
    };
    f(TextView::windowed(head, tail, len, chars, lines))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::shell::capture::{CaptureBuffer, CaptureLimits, Captured};

    fn outcome(output: &[u8], exit_code: i32, millis: u64, timed_out: bool) -> ExecOutcome {
        let mut combined = CaptureBuffer::new(CaptureLimits::WITH_TEXT);
        combined.push(output);
        ExecOutcome {
            exit_code,
            signal: None,
            timed_out,
            cancelled: false,
            duration: Duration::from_millis(millis),
            stdout: Captured::default(),
            stderr: Captured::default(),
            combined: combined.finish(),
            killed_processes: 0,
            leftover_processes: Vec::new(),
        }
    }

    const P: TruncationPolicy = TruncationPolicy::Bytes(10_000);

    #[test]
    fn durations() {
        let secs = |ms| duration_seconds(Duration::from_millis(ms));
        assert_eq!(
            structured_json("", 0, Duration::from_millis(12)),
            r#"{"output":"","metadata":{"exit_code":0,"duration_seconds":0.0}}"#
        );
        assert!(
            structured_json("", 0, Duration::from_millis(1234))
                .ends_with(r#""duration_seconds":1.2}}"#)
        );
        assert!(
            structured_json("", 0, Duration::from_millis(9_960))
                .ends_with(r#""duration_seconds":10.0}}"#)
        );
        assert_eq!(format!("{}", secs(30)), "0");
        assert_eq!(format!("{}", secs(1_304)), "1.3");
        assert_eq!(format!("{}", secs(2_000)), "2");
        assert_eq!(format!("{}", secs(49)), "0");
        assert_eq!(format!("{}", secs(50)), "0.1");
    }

    #[test]
    fn json_escaping() {
        let s = structured_json(
            "a\"b\\c\n\r\t\u{8}\u{c}\u{1b}\u{1}/…é\u{7f}",
            -1,
            Duration::ZERO,
        );
        assert_eq!(
            s,
            "{\"output\":\"a\\\"b\\\\c\\n\\r\\t\\b\\f\\u001b\\u0001/…é\u{7f}\",\"metadata\":{\"exit_code\":-1,\"duration_seconds\":0.0}}"
        );
    }

    #[test]
    fn structured_acceptance_texts() {
        assert_eq!(
            shell_output_text(&outcome(b"hi\n", 0, 10, false), P),
            r#"{"output":"hi\n","metadata":{"exit_code":0,"duration_seconds":0.0}}"#
        );
        assert_eq!(
            shell_output_text(&outcome(b"oops\n", 3, 10, false), P),
            r#"{"output":"oops\n","metadata":{"exit_code":3,"duration_seconds":0.0}}"#
        );
    }

    #[test]
    fn freeform_acceptance_texts() {
        assert_eq!(
            shell_command_output_text(&outcome(b"hi\n", 0, 10, false), P),
            "Exit code: 0\nWall time: 0 seconds\nOutput:\nhi\n"
        );
        assert_eq!(
            shell_command_output_text(&outcome(b"", 7, 10, false), P),
            "Exit code: 7\nWall time: 0 seconds\nOutput:\n"
        );
        assert!(
            shell_command_output_text(&outcome(b"", 0, 1_310, false), P)
                .contains("\nWall time: 1.3 seconds\n")
        );
    }

    #[test]
    fn seq_3000_both_formats() {
        let text: String = (1..=3000).map(|i| format!("{i}\n")).collect();
        let o = outcome(text.as_bytes(), 0, 20, false);
        let s = shell_output_text(&o, P);
        assert!(s.starts_with(r#"{"output":"Total output lines: 3000\n\n1\n2\n"#));
        assert!(s.contains("1221\\n12\u{2026}3893 chars truncated\u{2026}2001\\n2002\\n"));
        let f = shell_command_output_text(&o, P);
        assert!(f.starts_with(
            "Exit code: 0\nWall time: 0 seconds\nTotal output lines: 3000\nOutput:\n1\n2\n"
        ));
        assert!(f.ends_with("2999\n3000\n"));
        // Tokens(10 000) = 40 000 bytes: no truncation, no extra line.
        let f = shell_command_output_text(&o, TruncationPolicy::Tokens(10_000));
        assert_eq!(
            f,
            format!("Exit code: 0\nWall time: 0 seconds\nOutput:\n{text}")
        );
    }

    #[test]
    fn twenty_thousand_x_freeform_has_no_line_header() {
        let o = outcome("x".repeat(20_000).as_bytes(), 0, 20, false);
        let f = shell_command_output_text(&o, P);
        assert_eq!(
            f,
            format!(
                "Exit code: 0\nWall time: 0 seconds\nOutput:\n{}\u{2026}10000 chars truncated\u{2026}{}",
                "x".repeat(5000),
                "x".repeat(5000)
            )
        );
    }

    #[test]
    fn timeout_prefix_is_part_of_the_content() {
        let o = outcome(b"partial\n", 124, 203, true);
        assert_eq!(
            shell_output_text(&o, P),
            r#"{"output":"command timed out after 203 milliseconds\npartial\n","metadata":{"exit_code":124,"duration_seconds":0.2}}"#
        );
        assert_eq!(
            shell_command_output_text(&o, P),
            "Exit code: 124\nWall time: 0.2 seconds\nOutput:\ncommand timed out after 203 milliseconds\npartial\n"
        );
        // With truncation the prefix counts towards length, tokens and lines.
        let big: String = (1..=3000).map(|i| format!("{i}\n")).collect();
        let o = outcome(big.as_bytes(), 124, 10_001, true);
        let s = shell_output_text(&o, P);
        let prefix = "command timed out after 10001 milliseconds\n";
        let full = format!("{prefix}{big}");
        let expected = crate::tools::shell::truncate::formatted_truncate_text(&full, P);
        assert_eq!(
            s,
            structured_json(&expected, 124, Duration::from_millis(10_001))
        );
        assert!(s.contains("Total output lines: 3001"));
    }

    #[test]
    fn huge_budgets_are_capped_to_the_windows() {
        let o = outcome("z".repeat(3_000_000).as_bytes(), 0, 20, false);
        let s = shell_command_output_text(&o, TruncationPolicy::Bytes(usize::MAX));
        assert!(s.contains("\u{2026}1951424 chars truncated\u{2026}"));
        let s = shell_command_output_text(&o, TruncationPolicy::Tokens(usize::MAX));
        assert!(s.contains("\u{2026}487856 tokens truncated\u{2026}"));
    }
}
