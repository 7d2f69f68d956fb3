//! The "likely denied by the sandbox" heuristic (spec/sandbox.md §5.1, Codex's
//! `is_likely_sandbox_denied`), and the incremental keyword scan it needs.
//!
//! Codex searches the lowercased output text for a few keywords. corral keeps only windows of
//! long output, so the scan runs over every byte as it arrives instead of over the final text.
//! Scanning raw bytes is equivalent to scanning the lowercased lossy decoding because every
//! keyword is ASCII: an invalid UTF-8 subsequence never contains an ASCII byte, and the only
//! non-ASCII character whose lowercase is ASCII is the Kelvin sign (U+212A → `k`), which the
//! scanner maps explicitly.

/// Substrings of the lowercased output that mark a denial (§5.1 step 2).
pub const DENIAL_KEYWORDS: [&str; 7] = [
    "operation not permitted",
    "permission denied",
    "read-only file system",
    "seccomp",
    "sandbox",
    "landlock",
    "failed to write file",
];

/// Raw bytes carried from one chunk to the next so that a keyword split across chunks is found:
/// the longest keyword is 23 bytes, and a Kelvin sign in it adds 2 raw bytes.
const CARRY: usize = 32;

/// The Kelvin sign U+212A, whose lowercase is ASCII `k`.
const KELVIN: [u8; 3] = [0xE2, 0x84, 0xAA];

/// Finds [`DENIAL_KEYWORDS`] in a stream fed in chunks.
#[derive(Debug, Default)]
pub struct KeywordScanner {
    carry: Vec<u8>,
    found: bool,
}

impl KeywordScanner {
    /// Scans the next chunk of the stream.
    pub fn scan(&mut self, data: &[u8]) {
        if self.found || data.is_empty() {
            return;
        }
        let mut raw = std::mem::take(&mut self.carry);
        raw.extend_from_slice(data);
        let lowered = lowercase_ascii_projection(&raw);
        self.found = DENIAL_KEYWORDS
            .iter()
            .any(|k| contains(&lowered, k.as_bytes()));
        let keep = raw.len().min(CARRY);
        raw.drain(..raw.len() - keep);
        self.carry = raw;
    }

    /// Whether a keyword has been seen so far.
    pub fn found(&self) -> bool {
        self.found
    }
}

/// ASCII-lowercases `raw` and replaces each Kelvin sign with `k`; other bytes are kept as they
/// are (they can never be part of an ASCII keyword).
fn lowercase_ascii_projection(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i..].starts_with(&KELVIN) {
            out.push(b'k');
            i += KELVIN.len();
        } else {
            out.push(raw[i].to_ascii_lowercase());
            i += 1;
        }
    }
    out
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    let first = needle[0];
    haystack.len() >= needle.len()
        && haystack
            .windows(needle.len())
            .any(|w| w[0] == first && w == needle)
}

/// Codex's heuristic (§5.1 steps 1-5): was a failed command likely stopped by the sandbox?
///
/// `sandboxed` is false under danger-full-access (nothing to deny); `keyword` is whether stdout,
/// stderr or the combined stream contained a denial keyword. A timeout is never a denial.
pub fn is_likely_sandbox_denied(
    sandboxed: bool,
    exit_code: i32,
    timed_out: bool,
    keyword: bool,
) -> bool {
    if !sandboxed || timed_out || exit_code == 0 {
        return false;
    }
    if keyword {
        return true;
    }
    if matches!(exit_code, 2 | 126 | 127) {
        return false;
    }
    exit_code == 128 + libc::SIGSYS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan_split(text: &[u8], at: usize) -> bool {
        let mut s = KeywordScanner::default();
        s.scan(&text[..at]);
        s.scan(&text[at..]);
        s.found()
    }

    #[test]
    fn keywords_found_across_chunk_boundaries() {
        let text = "cp: cannot create 'x': Read-Only File System\n".as_bytes();
        for at in 0..=text.len() {
            assert!(scan_split(text, at), "split at {at}");
        }
        assert!(!scan_split(b"all good here", 4));
    }

    #[test]
    fn kelvin_sign_lowercases_to_k() {
        let text = "LANDLOC\u{212A} said no".as_bytes();
        assert!("LANDLOC\u{212A}".to_lowercase().contains("landlock"));
        for at in 0..=text.len() {
            assert!(scan_split(text, at), "split at {at}");
        }
    }

    #[test]
    fn heuristic_steps() {
        assert!(!is_likely_sandbox_denied(false, 1, false, true));
        assert!(!is_likely_sandbox_denied(true, 0, false, true));
        assert!(!is_likely_sandbox_denied(true, 124, true, true));
        assert!(is_likely_sandbox_denied(true, 1, false, true));
        assert!(is_likely_sandbox_denied(true, 127, false, true));
        assert!(!is_likely_sandbox_denied(true, 127, false, false));
        assert!(!is_likely_sandbox_denied(true, 2, false, false));
        assert!(is_likely_sandbox_denied(true, 159, false, false));
        assert!(!is_likely_sandbox_denied(true, 1, false, false));
    }
}
