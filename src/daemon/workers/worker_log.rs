//! A worker's own stderr (its start-up failures and warnings, never a command's output, which
//! has its own pipes) becomes the daemon's log lines, so every line the daemon writes follows
//! `--log-format` — one JSON object per line with `json`. The worker runs as the caller, so its
//! lines are bounded in length and rate: one worker cannot flood the daemon's log.

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::time::Instant;

/// The longest worker line kept; the rest of the line is dropped.
const MAX_LINE_BYTES: usize = 4096;
/// Lines a worker may log at once, and then per second.
const BURST_LINES: u32 = 50;
const LINES_PER_SECOND: u32 = 10;

/// Logs each line `stderr` carries as a warning of worker `pid`, until it closes.
pub(in crate::daemon) fn relay(stderr: impl AsyncRead + Unpin + Send + 'static, pid: Option<u32>) {
    tokio::spawn(async move {
        let mut lines = BufReader::new(stderr);
        let mut limit = RateLimit::new(Instant::now());
        let mut line = Vec::new();
        loop {
            line.clear();
            match read_bounded_line(&mut lines, &mut line).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let text = String::from_utf8_lossy(&line);
            let text = text.trim_end();
            match limit.admit(Instant::now()) {
                Admit::Log { dropped: 0 } => {
                    tracing::warn!(worker = pid, "{text}");
                }
                Admit::Log { dropped } => {
                    tracing::warn!(
                        worker = pid,
                        dropped,
                        "{text} (after {dropped} lines dropped: the worker logged too fast)"
                    );
                }
                Admit::Drop => {}
            }
        }
        let dropped = limit.dropped;
        if dropped > 0 {
            tracing::warn!(
                worker = pid,
                dropped,
                "the worker logged too fast: {dropped} lines dropped"
            );
        }
    });
}

/// Reads one line into `line` (without its newline past [`MAX_LINE_BYTES`]); 0 at the end.
async fn read_bounded_line<R: AsyncBufReadExt + Unpin>(
    reader: &mut R,
    line: &mut Vec<u8>,
) -> std::io::Result<usize> {
    let mut total = 0;
    loop {
        let buf = reader.fill_buf().await?;
        if buf.is_empty() {
            return Ok(total);
        }
        let (chunk, found) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..=i], true),
            None => (buf, false),
        };
        let n = chunk.len();
        let room = MAX_LINE_BYTES.saturating_sub(line.len());
        line.extend_from_slice(&chunk[..n.min(room)]);
        reader.consume(n);
        total += n;
        if found {
            return Ok(total);
        }
    }
}

enum Admit {
    /// Log the line; `dropped` lines were dropped since the last one logged.
    Log {
        dropped: u64,
    },
    Drop,
}

/// A token bucket: [`BURST_LINES`] at once, refilled at [`LINES_PER_SECOND`].
struct RateLimit {
    tokens: f64,
    at: Instant,
    dropped: u64,
}

impl RateLimit {
    fn new(now: Instant) -> Self {
        RateLimit {
            tokens: f64::from(BURST_LINES),
            at: now,
            dropped: 0,
        }
    }

    fn admit(&mut self, now: Instant) -> Admit {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = now;
        self.tokens =
            (self.tokens + elapsed * f64::from(LINES_PER_SECOND)).min(f64::from(BURST_LINES));
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Admit::Log {
                dropped: std::mem::take(&mut self.dropped),
            }
        } else {
            self.dropped += 1;
            Admit::Drop
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Duration;

    #[test]
    fn a_burst_is_let_through_then_the_rate_holds() {
        let t0 = Instant::now();
        let mut limit = RateLimit::new(t0);
        let logged = (0..200)
            .filter(|_| matches!(limit.admit(t0), Admit::Log { .. }))
            .count();
        assert_eq!(logged, BURST_LINES as usize);
        assert_eq!(limit.dropped, 150);
        // One second later, ten more; the first says how many were dropped before it.
        let t1 = t0 + Duration::from_secs(1);
        match limit.admit(t1) {
            Admit::Log { dropped } => assert_eq!(dropped, 150),
            Admit::Drop => panic!("the bucket refilled"),
        }
        let more = (0..100)
            .filter(|_| matches!(limit.admit(t1), Admit::Log { .. }))
            .count();
        assert_eq!(more, LINES_PER_SECOND as usize - 1);
    }

    #[tokio::test]
    async fn long_lines_are_cut_and_the_next_line_is_whole() {
        let mut input = vec![b'x'; MAX_LINE_BYTES * 3];
        input.extend_from_slice(b"\nsecond\n");
        let mut reader = BufReader::with_capacity(1000, &input[..]);
        let mut line = Vec::new();
        let n = read_bounded_line(&mut reader, &mut line).await.unwrap();
        assert_eq!(n, MAX_LINE_BYTES * 3 + 1);
        assert_eq!(line.len(), MAX_LINE_BYTES);
        line.clear();
        read_bounded_line(&mut reader, &mut line).await.unwrap();
        assert_eq!(line, b"second\n");
        line.clear();
        assert_eq!(read_bounded_line(&mut reader, &mut line).await.unwrap(), 0);
    }
}
