//! A process's output, kept as a head window and a tail window of sequence-numbered chunks
//! (spec/tools.md §7.1: `UNIFIED_EXEC_OUTPUT_MAX_BYTES`, head+tail, with the dropped count).
//!
//! Every chunk gets the next sequence number when it arrives, and a chunk keeps its number when
//! it is cut down to fit a window, so a reader that remembers the last number it saw can resume
//! from there ([`HeadTail::read_after`]). Each piece also carries its byte offset in the whole
//! stream and where its chunk began, so the reader learns exactly whether (and, from the
//! offsets, how much) output between its cursor and what it gets was dropped.

use std::collections::VecDeque;

/// One piece of output: a whole chunk, or what a window kept of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// Arrival order, from 0; only non-empty chunks are numbered.
    pub seq: u64,
    /// Offset of `data[0]` in the whole stream.
    pub offset: u64,
    /// Offset in the whole stream where this chunk began (`offset` minus what was cut off).
    pub start: u64,
    pub data: Vec<u8>,
}

/// What a resuming reader gets ([`HeadTail::read_after`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    /// Pieces after the cursor, in order; a chunk split between the windows comes as two
    /// pieces with one sequence number, and is never split between two reads.
    pub chunks: Vec<Chunk>,
    /// Output after the cursor is missing before or between these pieces (dropped from
    /// between the windows).
    pub gap: bool,
    /// More retained output follows (the read stopped at its byte limit).
    pub more: bool,
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
    /// Bytes pushed in all.
    total: u64,
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
            total: 0,
            dropped: 0,
        }
    }

    /// Appends a chunk; returns its sequence number (an empty chunk gets none: the next one
    /// gets the number it would have had).
    pub fn push(&mut self, data: &[u8]) -> u64 {
        let seq = self.next_seq;
        if data.is_empty() {
            return seq;
        }
        self.next_seq += 1;
        let start = self.total;
        self.total += data.len() as u64;
        let room = self.head_cap - self.head_bytes;
        let (to_head, rest) = data.split_at(room.min(data.len()));
        if !to_head.is_empty() {
            self.head.push(Chunk {
                seq,
                offset: start,
                start,
                data: to_head.to_vec(),
            });
            self.head_bytes += to_head.len();
        }
        if !rest.is_empty() {
            self.tail.push_back(Chunk {
                seq,
                offset: start + to_head.len() as u64,
                start,
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
                front.offset += excess as u64;
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

    /// Bytes pushed in all (the stream's length so far).
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The pieces after the cursor `after` (the last sequence number the reader got; `None`:
    /// from the beginning), at most `max_bytes` of them — but always the first chunk whole, and
    /// never half a chunk.
    pub fn read_after(&self, after: Option<u64>, max_bytes: usize) -> Read {
        // A cursor at u64::MAX has nothing after it (and must not overflow).
        let Some(first_seq) = after.map_or(Some(0), |s| s.checked_add(1)) else {
            return Read {
                chunks: Vec::new(),
                gap: false,
                more: false,
            };
        };
        let pieces = self
            .head
            .iter()
            .chain(self.tail.iter())
            .filter(|c| c.seq >= first_seq);
        let mut chunks: Vec<Chunk> = Vec::new();
        let mut bytes = 0usize;
        let mut more = false;
        for c in pieces {
            let same_chunk = chunks.last().is_some_and(|l| l.seq == c.seq);
            if !same_chunk && !chunks.is_empty() && bytes + c.data.len() > max_bytes {
                more = true;
                break;
            }
            bytes += c.data.len();
            chunks.push(c.clone());
        }
        // The reader has everything up to the end of chunk `after`; each piece must begin
        // where the previous one ended.
        let mut gap = match chunks.first() {
            Some(c) => c.seq != first_seq || c.offset != c.start,
            // Nothing retained after the cursor, though more was written: all of it dropped.
            None => first_seq < self.next_seq,
        };
        gap |= chunks
            .windows(2)
            .any(|w| w[1].offset != w[0].offset + w[0].data.len() as u64);
        Read { chunks, gap, more }
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
        let r = b.read_after(Some(1), 1 << 20);
        assert_eq!(
            (bytes(&r.chunks), r.gap, r.more),
            (b"cd".to_vec(), false, false)
        );
        assert_eq!(bytes(&b.read_after(None, 1 << 20).chunks), b"abcd");
        assert_eq!(r.chunks[0].offset, 2);
        let none = b.read_after(Some(3), 1 << 20);
        assert!(none.chunks.is_empty() && !none.gap);
        let none = b.read_after(Some(u64::MAX), 1 << 20);
        assert!(none.chunks.is_empty() && !none.gap);
        // Empty chunks take no number.
        assert_eq!(b.push(b""), 4);
        assert_eq!(b.push(b"e"), 4);
    }

    #[test]
    fn a_read_stops_at_its_limit_between_chunks() {
        let mut b = HeadTail::new(1024);
        for s in ["aaaa", "bbbb", "cccc"] {
            b.push(s.as_bytes());
        }
        let r = b.read_after(None, 6);
        assert_eq!(
            (bytes(&r.chunks), r.more, r.gap),
            (b"aaaa".to_vec(), true, false)
        );
        // The first chunk comes whole even when it alone is over the limit.
        let r = b.read_after(None, 1);
        assert_eq!(bytes(&r.chunks), b"aaaa");
        let r = b.read_after(Some(0), 8);
        assert_eq!((bytes(&r.chunks), r.more), (b"bbbbcccc".to_vec(), false));
    }

    #[test]
    fn a_reader_behind_the_dropped_middle_learns_of_the_gap_and_where_it_resumes() {
        let mut b = HeadTail::new(8);
        for s in ["0123", "4567", "89ab", "cd"] {
            b.push(s.as_bytes());
        }
        // Head keeps 0123 (seq 0); the tail "abcd": part of seq 2 (offset 10) and seq 3.
        let r = b.read_after(Some(0), 1 << 20);
        assert!(r.gap);
        assert_eq!(r.chunks[0].seq, 2);
        assert_eq!(r.chunks[0].offset, 10);
        assert_eq!(bytes(&r.chunks), b"abcd");
        // From the start: the head, then a gap before the tail.
        let r = b.read_after(None, 1 << 20);
        assert!(r.gap);
        assert_eq!(bytes(&r.chunks), b"0123abcd");
        // A reader that already had seq 2 misses nothing.
        let r = b.read_after(Some(2), 1 << 20);
        assert!(!r.gap);
        assert_eq!(bytes(&r.chunks), b"cd");
    }

    #[test]
    fn a_chunk_split_between_the_windows_is_read_whole() {
        let mut b = HeadTail::new(6);
        b.push(b"abcdefgh");
        let r = b.read_after(None, 1);
        assert_eq!(r.chunks.len(), 2);
        assert!(r.gap && !r.more);
        assert_eq!(
            r.chunks
                .iter()
                .map(|c| (c.seq, c.offset))
                .collect::<Vec<_>>(),
            vec![(0, 0), (0, 5)]
        );
    }
}
