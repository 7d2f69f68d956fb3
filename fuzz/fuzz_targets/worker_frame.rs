//! Fuzz target: the worker socketpair's frame decoder (`corral::fuzzing::frame`, the worker socketpair's) on arbitrary
//! bytes. The worker decodes `WorkerRequest`s (blocking), the daemon decodes `WorkerReply`s
//! (async) from a worker that runs model-chosen commands, so both directions are hostile input.
//!
//! Byte 0 picks the reader (blocking/async) and the message (request/reply/raw body); the rest is
//! the byte stream, read frame by frame until it ends or fails. Properties:
//! - no single allocation is larger than the frame limit, and a frame costs at most the limit
//!   plus a bounded multiple of the bytes it really carried (a length header alone never
//!   makes the reader hold more than the limit);
//! - a decoded frame re-encodes to a frame that decodes to the same message, with the length
//!   prefix equal to the body's size;
//! - a declared length above the limit is refused.
#![no_main]

use corral::fuzzing::frame::{self, MAX_FRAME_BYTES};
use corral::fuzzing::{WorkerReply, WorkerRequest};
use libfuzzer_sys::fuzz_target;
use prost::Message;
use std::alloc::{GlobalAlloc, Layout, System};
use std::fmt::Debug;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts live heap bytes, their peak and the largest single request.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static LARGEST: AtomicUsize = AtomicUsize::new(0);

fn grew(size: usize) {
    let live = LIVE.fetch_add(size, Ordering::Relaxed) + size;
    PEAK.fetch_max(live, Ordering::Relaxed);
    LARGEST.fetch_max(size, Ordering::Relaxed);
}

// SAFETY: forwards to the system allocator; the counters are only bookkeeping.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        grew(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Heap bytes a decoded message may take per byte of its encoding: prost turns a 2-byte empty
/// submessage into a whole struct (a few strings wide) inside a Vec that may be up to twice its
/// length. Measured worst so far is far below this; the bound is what the property checks.
const AMPLIFICATION: usize = 128;

static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime")
});

fn declared_len(stream: &[u8]) -> Option<usize> {
    stream
        .get(..4)
        .map(|b| u32::from_be_bytes(b.try_into().unwrap()) as usize)
}

/// Reads frames of `M` until the stream ends or fails, checking each one.
fn frames<M: Message + Default + PartialEq + Debug>(mut stream: &[u8], asynchronous: bool) {
    loop {
        let before = stream.len();
        let declared = declared_len(stream);
        let base = LIVE.load(Ordering::Relaxed);
        PEAK.store(base, Ordering::Relaxed);
        LARGEST.store(0, Ordering::Relaxed);
        let read = if asynchronous {
            RUNTIME.block_on(frame::read_async::<M>(&mut stream))
        } else {
            frame::read_blocking::<M>(&mut stream)
        };
        let largest = LARGEST.load(Ordering::Relaxed);
        let held = PEAK.load(Ordering::Relaxed).saturating_sub(base);
        let consumed = before - stream.len();
        assert!(
            largest <= MAX_FRAME_BYTES,
            "one allocation of {largest} bytes"
        );
        assert!(
            held <= MAX_FRAME_BYTES + AMPLIFICATION * consumed + 4096,
            "{held} bytes held for a frame of {consumed} bytes"
        );
        match read {
            Ok(None) => {
                assert!(before < 4, "a whole header read as the end of the stream");
                return;
            }
            Err(_) => {
                if let Some(len) = declared
                    && len > MAX_FRAME_BYTES
                {
                    // Refused on the header alone.
                    assert_eq!(consumed, 4);
                }
                return;
            }
            Ok(Some(msg)) => {
                let len = declared.unwrap();
                assert!(len <= MAX_FRAME_BYTES);
                assert_eq!(consumed, 4 + len);
                let encoded = frame::encode(&msg);
                assert_eq!(declared_len(&encoded), Some(encoded.len() - 4));
                assert_eq!(encoded.len() - 4, msg.encoded_len());
                let again = frame::read_blocking::<M>(&mut encoded.as_slice())
                    .expect("a re-encoded frame decodes")
                    .expect("a re-encoded frame is a frame");
                // A NaN duration (ApplyPatchResponse) is not equal to itself; compare what
                // the bytes say instead.
                if again != msg {
                    assert_eq!(frame::encode(&again), encoded, "{msg:?}");
                }
            }
        }
    }
}

/// The worker's first frame: raw bytes (its JSON spec).
fn raw(mut stream: &[u8]) {
    loop {
        let before = stream.len();
        let declared = declared_len(stream);
        match frame::read_bytes_blocking(&mut stream) {
            Ok(Some(body)) => {
                assert_eq!(Some(body.len()), declared);
                assert_eq!(before - stream.len(), 4 + body.len());
                assert_eq!(frame::encode_bytes(&body)[4..], body[..]);
            }
            Ok(None) => return assert!(before < 4),
            Err(_) => return,
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, stream)) = data.split_first() else {
        return;
    };
    match selector % 5 {
        0 => frames::<WorkerRequest>(stream, false),
        1 => frames::<WorkerReply>(stream, false),
        2 => frames::<WorkerRequest>(stream, true),
        3 => frames::<WorkerReply>(stream, true),
        _ => raw(stream),
    }
});
