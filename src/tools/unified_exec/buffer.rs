//! A process's output, kept as a head window and a tail window of sequence-numbered chunks
//! (spec/tools.md §7.1: `UNIFIED_EXEC_OUTPUT_MAX_BYTES`, head+tail, with the dropped count).
//!
//! Every chunk gets the next sequence number when it arrives, and a chunk keeps its number when
//! it is cut down to fit a window, so a reader that remembers the last number it saw can resume
//! from there ([`HeadTail::after`]) and learn how much it missed.

use std::collections::VecDeque;

/// One piece of output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// Arrival order, from 0.
    pub seq: u64,
    pub data: Vec<u8>,
}

/// Head+tail retention of a byte stream.
#[derive(Debug)]
pub struct HeadTail {
    head_cap: usize,
    tail_cap: usize,
    head: Vec<Chunk>,
    head_bytes: usize,
    tail: VecDeque<Chunk>,
    tail_bytes: usize,
    next_seq: u64,
    /// Bytes dropped from between the windows since the buffer was created or last drained.
    dropped: u64,
}

impl HeadTail {
    /// A buffer keeping at most `max_bytes`: half at the head, the rest at the tail.
    pub fn new(max_bytes: usize) -> Self {
        let head_cap = max_bytes / 2;
        Self {
            head_cap,
            tail_cap: max_bytes - head_cap,
            head: Vec::new(),
            head_bytes: 0,
            tail: VecDeque::new(),
            tail_bytes: 0,
            next_seq: 0,
            dropped: 0,
        }
    }

    /// Appends a chunk; returns its sequence number.
    pub fn push(&mut self, data: &[u8]) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        if data.is_empty() {
            return seq;
        }
        let room = self.head_cap - self.head_bytes;
        let (to_head, rest) = data.split_at(room.min(data.len()));
        if !to_head.is_empty() {
            self.head.push(Chunk {
                seq,
                data: to_head.to_vec(),
            });
            self.head_bytes += to_head.len();
        }
        if !rest.is_empty() {
            self.tail.push_back(Chunk {
                seq,
                data: rest.to_vec(),
            });
            self.tail_bytes += rest.len();
            self.trim_tail();
        }
        seq
    }

    fn trim_tail(&mut self) {
        while self.tail_bytes > self.tail_cap {
            let excess = self.tail_bytes - self.tail_cap;
            let Some(front) = self.tail.front_mut() else {
                break;
            };
            if front.data.len() <= excess {
                self.tail_bytes -= front.data.len();
                self.dropped += front.data.len() as u64;
                self.tail.pop_front();
            } else {
                front.data.drain(..excess);
                self.tail_bytes -= excess;
                self.dropped += excess as u64;
            }
        }
    }

    /// Bytes currently held.
    pub fn len(&self) -> usize {
        self.head_bytes + self.tail_bytes
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes dropped from between the windows.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The sequence number the next chunk will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Takes everything held (head chunks, then tail chunks) and starts empty windows; sequence
    /// numbers continue.
    pub fn drain(&mut self) -> Vec<Chunk> {
        let mut out = std::mem::take(&mut self.head);
        out.extend(std::mem::take(&mut self.tail));
        self.head_bytes = 0;
        self.tail_bytes = 0;
        self.dropped = 0;
        out
    }

    /// The held chunks with a sequence number of at least `seq`, in order (a resuming reader).
    pub fn after(&self, seq: u64) -> Vec<Chunk> {
        self.head
            .iter()
            .chain(self.tail.iter())
            .filter(|c| c.seq >= seq)
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(chunks: &[Chunk]) -> Vec<u8> {
        chunks.iter().flat_map(|c| c.data.clone()).collect()
    }

    #[test]
    fn keeps_everything_that_fits() {
        let mut b = HeadTail::new(16);
        assert_eq!(b.push(b"abc"), 0);
        assert_eq!(b.push(b"def"), 1);
        assert_eq!(b.len(), 6);
        assert_eq!(bytes(&b.drain()), b"abcdef");
        assert!(b.is_empty());
        assert_eq!(b.push(b"g"), 2);
        assert_eq!(b.next_seq(), 3);
    }

    #[test]
    fn drops_the_middle_and_counts_it() {
        let mut b = HeadTail::new(8);
        b.push(b"0123");
        b.push(b"4567");
        b.push(b"89ab");
        b.push(b"cd");
        // head: 0123; tail: last 4 bytes "abcd"
        assert_eq!(b.len(), 8);
        assert_eq!(b.dropped(), 6);
        let all = b.drain();
        assert_eq!(bytes(&all), b"0123abcd");
        // A cut chunk keeps its sequence number.
        assert_eq!(all.iter().map(|c| c.seq).collect::<Vec<_>>(), vec![0, 2, 3]);
        assert_eq!(b.dropped(), 0);
    }

    #[test]
    fn a_chunk_can_span_both_windows() {
        let mut b = HeadTail::new(6);
        b.push(b"abcdefgh");
        let all = b.drain();
        assert_eq!(bytes(&all), b"abcfgh");
        assert_eq!(all.iter().map(|c| c.seq).collect::<Vec<_>>(), vec![0, 0]);
    }

    #[test]
    fn resumes_from_a_cursor() {
        let mut b = HeadTail::new(1024);
        for s in ["a", "b", "c", "d"] {
            b.push(s.as_bytes());
        }
        assert_eq!(bytes(&b.after(2)), b"cd");
        assert_eq!(bytes(&b.after(0)), b"abcd");
        assert!(b.after(9).is_empty());
    }
}
