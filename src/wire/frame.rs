//! Framing on the worker socketpair: a 4-byte big-endian length, then one protobuf message.
//! Blocking helpers for the worker, async ones for the daemon.

use prost::Message;
use std::io::{self, Read, Write};

/// Largest frame accepted: bounded so a confused or hostile peer cannot make us allocate freely.
pub const MAX_FRAME_BYTES: usize = 64 * 1024 * 1024;

fn too_large(len: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("frame of {len} bytes exceeds the {MAX_FRAME_BYTES}-byte limit"),
    )
}

/// Keeps freed frame-sized buffers for reuse instead of handing them back to the kernel.
///
/// Streams of file data allocate and free one buffer per frame (hundreds of KiB) on every hop.
/// glibc's defaults return such a buffer to the kernel on free (`brk` trim, `madvise` in thread
/// arenas) and fault fresh zeroed pages in for the next: measured, that was most of a 1 GiB
/// upload's CPU. Allocations below 4 MiB now come from the heap, and up to 8 MiB of free heap
/// stays mapped per arena. Called once, early, by the daemon and by each worker.
pub fn tune_allocator() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets malloc's parameters; called before any other thread runs.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 8 << 20);
    }
}

/// Encodes one frame (straight after its length: a large frame is copied once, not twice).
pub fn encode<M: Message>(msg: &M) -> Vec<u8> {
    let len = msg.encoded_len();
    let mut out = Vec::with_capacity(4 + len);
    out.extend_from_slice(&(len as u32).to_be_bytes());
    // Cannot fail: the buffer grows as needed.
    let _ = msg.encode(&mut out);
    out
}

/// Encodes one frame whose body is raw bytes (the worker's JSON spec).
pub fn encode_bytes(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// Reads one frame's raw body; `Ok(None)` on a clean end of stream.
pub fn read_bytes_blocking(r: &mut impl Read) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(too_large(len));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Ok(Some(body))
}

/// Reads one frame; `Ok(None)` on a clean end of stream.
pub fn read_blocking<M: Message + Default>(r: &mut impl Read) -> io::Result<Option<M>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(too_large(len));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    M::decode(body.as_slice())
        .map(Some)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Writes one frame.
pub fn write_blocking<M: Message>(w: &mut impl Write, msg: &M) -> io::Result<()> {
    w.write_all(&encode(msg))?;
    w.flush()
}

/// A reuse buffer larger than this is let go after its frame, so one huge reply does not pin
/// its size for the life of the process.
const KEEP_BUFFER_BYTES: usize = 1024 * 1024;

/// Writes one frame, encoded into `buf` (kept by the caller between frames: no allocation per
/// frame, and the frame leaves in one `write`).
pub fn write_reusing<M: Message>(w: &mut impl Write, buf: &mut Vec<u8>, msg: &M) -> io::Result<()> {
    let len = msg.encoded_len();
    buf.clear();
    buf.reserve(4 + len);
    buf.extend_from_slice(&(len as u32).to_be_bytes());
    // Cannot fail: the buffer grows as needed.
    let _ = msg.encode(buf);
    let result = w.write_all(buf).and_then(|()| w.flush());
    if buf.capacity() > KEEP_BUFFER_BYTES {
        *buf = Vec::new();
    }
    result
}

/// Reads one frame asynchronously; `Ok(None)` on a clean end of stream.
pub async fn read_async<M: Message + Default>(
    r: &mut (impl tokio::io::AsyncRead + Unpin),
) -> io::Result<Option<M>> {
    use tokio::io::AsyncReadExt;
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(too_large(len));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    M::decode(body.as_slice())
        .map(Some)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{WorkerRequest, worker_request::Call};

    #[test]
    fn frames_round_trip_and_oversize_is_refused() {
        let msg = WorkerRequest {
            id: 7,
            context: None,
            call: Some(Call::Cancel(3)),
            stream: false,
        };
        let mut buf = Vec::new();
        write_blocking(&mut buf, &msg).unwrap();
        write_blocking(&mut buf, &msg).unwrap();
        let mut r = buf.as_slice();
        assert_eq!(
            read_blocking::<WorkerRequest>(&mut r).unwrap(),
            Some(msg.clone())
        );
        assert_eq!(read_blocking::<WorkerRequest>(&mut r).unwrap(), Some(msg));
        assert_eq!(read_blocking::<WorkerRequest>(&mut r).unwrap(), None);
        let huge = ((MAX_FRAME_BYTES + 1) as u32).to_be_bytes();
        assert!(read_blocking::<WorkerRequest>(&mut huge.as_slice()).is_err());
    }

    #[test]
    fn a_reused_buffer_writes_the_same_frames_and_is_let_go_when_large() {
        let small = WorkerRequest {
            id: 1,
            context: None,
            call: Some(Call::Cancel(9)),
            stream: true,
        };
        let large = WorkerRequest {
            id: 2,
            context: None,
            call: Some(Call::ReadFile(crate::api::ReadFileRequest {
                file_path: "x".repeat(KEEP_BUFFER_BYTES + 1),
                ..Default::default()
            })),
            stream: false,
        };
        let (mut out, mut buf) = (Vec::new(), Vec::new());
        write_reusing(&mut out, &mut buf, &small).unwrap();
        assert!(buf.capacity() > 0, "a small frame's buffer is kept");
        write_reusing(&mut out, &mut buf, &large).unwrap();
        assert_eq!(buf.capacity(), 0, "a buffer over the limit is let go");
        write_reusing(&mut out, &mut buf, &small).unwrap();
        let mut r = out.as_slice();
        for expected in [&small, &large, &small] {
            assert_eq!(
                read_blocking::<WorkerRequest>(&mut r).unwrap().as_ref(),
                Some(expected)
            );
        }
        assert_eq!(read_blocking::<WorkerRequest>(&mut r).unwrap(), None);
    }
}
