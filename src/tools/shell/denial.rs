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

/// Raw bytes that can start a keyword (their first letters, both cases). The scan only stops
/// at these, so a chunk without them costs one table lookup per byte.
static STARTS: [bool; 256] = {
    let mut t = [false; 256];
    let mut k = 0;
    while k < DENIAL_KEYWORDS.len() {
        let c = DENIAL_KEYWORDS[k].as_bytes()[0];
        t[c as usize] = true;
        t[c.to_ascii_uppercase() as usize] = true;
        k += 1;
    }
    t
};

/// Finds [`DENIAL_KEYWORDS`] in a stream fed in chunks, in place: no copy of a chunk is made,
/// and the scan ends at the first keyword.
#[derive(Debug, Default)]
pub struct KeywordScanner {
    /// The last raw bytes seen (up to `CARRY`), for keywords split across chunks.
    carry: [u8; CARRY],
    carry_len: usize,
    found: bool,
}

impl KeywordScanner {
    /// Scans the next chunk of the stream.
    pub fn scan(&mut self, data: &[u8]) {
        if self.found || data.is_empty() {
            return;
        }
        // A keyword that starts in the carried bytes ends within the first CARRY bytes of
        // `data` (it spans at most 25 raw bytes), so the seam is searched in a small joint copy.
        if self.carry_len > 0 {
            let mut joint = [0u8; 2 * CARRY];
            let head = data.len().min(CARRY);
            joint[..self.carry_len].copy_from_slice(&self.carry[..self.carry_len]);
            joint[self.carry_len..self.carry_len + head].copy_from_slice(&data[..head]);
            if contains_keyword(&joint[..self.carry_len + head]) {
                self.found = true;
                return;
            }
        }
        if contains_keyword(data) {
            self.found = true;
            return;
        }
        if data.len() >= CARRY {
            self.carry.copy_from_slice(&data[data.len() - CARRY..]);
            self.carry_len = CARRY;
        } else {
            let keep = (CARRY - data.len()).min(self.carry_len);
            self.carry
                .copy_within(self.carry_len - keep..self.carry_len, 0);
            self.carry[keep..keep + data.len()].copy_from_slice(data);
            self.carry_len = keep + data.len();
        }
    }

    /// Whether a keyword has been seen so far.
    pub fn found(&self) -> bool {
        self.found
    }
}

/// Whether `hay`, ASCII-lowercased with each Kelvin sign read as `k`, contains a keyword.
/// Bytes other than ASCII letters and the Kelvin sign can never be part of an ASCII keyword.
fn contains_keyword(hay: &[u8]) -> bool {
    // Most blocks of bulk output (digits, binary, repeated bytes) hold no byte that can start
    // a keyword; a branch-free test over a whole block, which the compiler vectorises, skips
    // them at a fraction of the per-byte cost. A keyword may run past its block's end.
    const BLOCK: usize = 64;
    let mut start = 0;
    while start < hay.len() {
        let end = (start + BLOCK).min(hay.len());
        if may_start_any(&hay[start..end]) {
            for at in start..end {
                if STARTS[hay[at] as usize]
                    && DENIAL_KEYWORDS
                        .iter()
                        .any(|k| keyword_at(&hay[at..], k.as_bytes()))
                {
                    return true;
                }
            }
        }
        start = end;
    }
    false
}

/// The first letters of the keywords; `STARTS` holds them in both cases.
const FIRST_LETTERS: [u8; DENIAL_KEYWORDS.len()] = {
    let mut out = [0u8; DENIAL_KEYWORDS.len()];
    let mut k = 0;
    while k < DENIAL_KEYWORDS.len() {
        out[k] = DENIAL_KEYWORDS[k].as_bytes()[0];
        k += 1;
    }
    out
};

/// Whether `block` holds a byte in `STARTS`: for an ASCII letter `b | 0x20` is its lowercase,
/// and no other byte maps onto a lowercase letter.
fn may_start_any(block: &[u8]) -> bool {
    block.iter().fold(0u8, |acc, &b| {
        let l = b | 0x20;
        acc | FIRST_LETTERS.iter().fold(0u8, |m, &c| m | u8::from(l == c))
    }) != 0
}

/// Whether `hay` starts with `keyword` (lowercase ASCII), case-insensitively, a Kelvin sign
/// matching `k`.
fn keyword_at(hay: &[u8], keyword: &[u8]) -> bool {
    let mut j = 0;
    for &c in keyword {
        match hay.get(j) {
            Some(&b) if b.to_ascii_lowercase() == c => j += 1,
            _ if c == b'k' && hay[j..].starts_with(&KELVIN) => j += KELVIN.len(),
            _ => return false,
        }
    }
    true
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

    /// The scanner before the in-place scan: ASCII-lowercase a copy with each Kelvin sign
    /// as `k`, then search it. Applied to the whole stream, it is the reference.
    fn reference(raw: &[u8]) -> bool {
        let mut lowered = Vec::with_capacity(raw.len());
        let mut i = 0;
        while i < raw.len() {
            if raw[i..].starts_with(&KELVIN) {
                lowered.push(b'k');
                i += KELVIN.len();
            } else {
                lowered.push(raw[i].to_ascii_lowercase());
                i += 1;
            }
        }
        DENIAL_KEYWORDS.iter().any(|k| {
            let k = k.as_bytes();
            lowered.windows(k.len()).any(|w| w == k)
        })
    }

    /// Deterministic xorshift, so the property test needs no extra crate.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n as u64) as usize
        }
    }

    #[test]
    fn in_place_scan_equals_the_reference_for_any_chunking() {
        // Keywords whole, mangled (one letter off, cut short) and with a Kelvin sign, among
        // multibyte and invalid UTF-8, so hits and near misses straddle chunk borders.
        let pieces: [&[u8]; 17] = [
            b"x",
            b"0123456789abcdeghijkmnqtuvwxyz0123456789ABCDEGHIJKMNQTUVWXYZ0123",
            b" ",
            b"\n",
            "é".as_bytes(),
            "😀".as_bytes(),
            b"\xe2\x84",
            b"\xff",
            b"Permission Denied",
            b"permission denie",
            b"SECCOM",
            b"sandbo",
            b"LANDLOC",
            "landloc\u{212A}".as_bytes(),
            b"read-only file systen",
            b"operation not permitte",
            b"FAILED TO WRITE FIL",
        ];
        let mut rng = Rng(0x2545_F491_4F6C_DD1D);
        let (mut hits, mut misses) = (0, 0);
        for _ in 0..3000 {
            let mut data = Vec::new();
            for _ in 0..rng.below(24) {
                data.extend_from_slice(pieces[rng.below(pieces.len())]);
            }
            let want = reference(&data);
            if want {
                hits += 1;
            } else {
                misses += 1;
            }
            for _ in 0..4 {
                let mut s = KeywordScanner::default();
                let mut rest = data.as_slice();
                while !rest.is_empty() {
                    // Chunks below and above the 64-byte prefilter block.
                    let n = (1 + rng.below(160)).min(rest.len());
                    s.scan(&rest[..n]);
                    rest = &rest[n..];
                }
                assert_eq!(s.found(), want, "{:?}", String::from_utf8_lossy(&data));
            }
        }
        // Both outcomes must actually occur, or the comparison proves nothing.
        assert!(hits > 300 && misses > 300, "hits {hits}, misses {misses}");
    }

    #[test]
    fn keyword_longer_than_the_carry_seam_is_found_in_tiny_chunks() {
        let text = b"..................operation NOT permitted";
        let mut s = KeywordScanner::default();
        for b in text {
            s.scan(std::slice::from_ref(b));
        }
        assert!(s.found());
    }

    #[test]
    fn block_prefilter_agrees_with_the_start_table() {
        for b in 0..=255u8 {
            assert_eq!(may_start_any(&[b]), STARTS[b as usize], "byte {b:#x}");
        }
        assert!(!may_start_any(&[b'a'; 64]));
        assert!(may_start_any(b"aaaaaaaaaaaaaaaaaaaaS"));
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
