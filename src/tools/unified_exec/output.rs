//! The model text of `exec_command` and `write_stdin` (spec/tools.md §7.3; Codex's
//! `ExecCommandToolOutput::response_text`).

use std::time::Duration;

use super::DEFAULT_MAX_OUTPUT_TOKENS;
use crate::tools::shell::capture::{Captured, MAX_TRUNCATION_BUDGET};
use crate::tools::shell::truncate::{
    TruncationPolicy, approx_token_count, formatted_truncate_view,
};

/// One call's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    /// 6 lowercase hex characters; the line is left out when empty.
    pub chunk_id: String,
    /// How long the call waited for output.
    pub wall_time: Duration,
    /// Set when the process has exited.
    pub exit_code: Option<i32>,
    /// Set when the process is still running.
    pub session_id: Option<i32>,
    /// The output that arrived during the call (lossy UTF-8 text windows and exact totals).
    pub captured: Captured,
    pub max_output_tokens: Option<usize>,
}

impl ExecOutput {
    /// `Chunk ID`, `Wall time` (4 decimals), the exit or running line, `Original token count`,
    /// `Output:` and the body, joined with `\n`.
    pub fn model_text(&self) -> String {
        let mut lines = Vec::new();
        if !self.chunk_id.is_empty() {
            lines.push(format!("Chunk ID: {}", self.chunk_id));
        }
        lines.push(format!(
            "Wall time: {:.4} seconds",
            self.wall_time.as_secs_f64()
        ));
        if let Some(code) = self.exit_code {
            lines.push(format!("Process exited with code {code}"));
        }
        if let Some(id) = self.session_id {
            lines.push(format!("Process running with session ID {id}"));
        }
        lines.push(format!(
            "Original token count: {}",
            approx_token_count(self.captured.text_len as usize)
        ));
        lines.push("Output:".to_string());
        lines.push(self.body());
        lines.join("\n")
    }

    /// `formatted_truncate_text(output, Tokens(max_output_tokens))` (§6.5), the budget capped
    /// at what the capture windows serve exactly.
    fn body(&self) -> String {
        let tokens = self.max_output_tokens.unwrap_or(DEFAULT_MAX_OUTPUT_TOKENS);
        let policy = TruncationPolicy::Tokens(tokens).capped(MAX_TRUNCATION_BUDGET);
        match self.captured.text_view() {
            Some(view) => formatted_truncate_view(view, policy),
            None => String::new(),
        }
    }
}

/// A random chunk id: 6 lowercase hex characters.
pub fn chunk_id() -> String {
    let mut b = [0u8; 3];
    if getrandom::fill(&mut b).is_err() {
        let n = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        b.copy_from_slice(&n.to_le_bytes()[..3]);
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::shell::capture::{CaptureBuffer, CaptureLimits};

    fn captured(s: &[u8]) -> Captured {
        let mut b = CaptureBuffer::new(CaptureLimits::WITH_TEXT);
        b.push(s);
        b.finish()
    }

    fn out(text: &[u8]) -> ExecOutput {
        ExecOutput {
            chunk_id: "0a1b2c".into(),
            wall_time: Duration::from_millis(51),
            exit_code: Some(0),
            session_id: None,
            captured: captured(text),
            max_output_tokens: None,
        }
    }

    #[test]
    fn exited_process_text() {
        assert_eq!(
            out(b"hi\n").model_text(),
            "Chunk ID: 0a1b2c\nWall time: 0.0510 seconds\nProcess exited with code 0\nOriginal token count: 1\nOutput:\nhi\n"
        );
    }

    #[test]
    fn running_process_text_and_empty_output() {
        let mut o = out(b"");
        o.exit_code = None;
        o.session_id = Some(4242);
        o.wall_time = Duration::from_secs(30);
        assert_eq!(
            o.model_text(),
            "Chunk ID: 0a1b2c\nWall time: 30.0000 seconds\nProcess running with session ID 4242\nOriginal token count: 0\nOutput:\n"
        );
        o.chunk_id.clear();
        assert!(o.model_text().starts_with("Wall time: 30.0000 seconds\n"));
    }

    #[test]
    fn token_count_is_of_the_lossy_text_and_body_is_truncated_by_tokens() {
        // One invalid byte becomes U+FFFD (3 bytes): 1 + 3 = 4 bytes, one token.
        assert!(
            out(b"a\xff")
                .model_text()
                .contains("Original token count: 1\n")
        );
        let mut o = out(&[b'x'; 100]);
        o.max_output_tokens = Some(10);
        let text = o.model_text();
        assert!(text.contains("Original token count: 25\n"), "{text}");
        assert!(
            text.contains(&format!(
                "{}…15 tokens truncated…{}",
                "x".repeat(20),
                "x".repeat(20)
            )),
            "{text}"
        );
    }

    #[test]
    fn chunk_ids_are_six_hex_chars() {
        for _ in 0..50 {
            let id = chunk_id();
            assert_eq!(id.len(), 6);
            assert!(
                id.bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
            );
        }
    }
}
