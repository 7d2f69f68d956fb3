//! The Files service in the worker: its messages ↔ `tools::transfer`. Writes (WriteBytes,
//! Upload, MakeDirectory, Remove, Copy) run under the protected-name guard like apply_patch; an upload's pieces arrive after
//! its call, through the call's inbox, and are credited back as they are written, so the daemon
//! never has more than a window of them in flight.

use crate::api;
use crate::tools::transfer::fsx::Node;
use crate::tools::transfer::{self, Entry, Item, Kind, Receiver, Summary, destination, ops, small};
use crate::tools::{ErrorKind, ToolContext, ToolError};
use crate::wire::files_call::Op;
use crate::wire::files_reply::Op as Answer;
use crate::wire::{FilesCall, FilesReply, UploadPiece, worker_reply::Result as Reply};
use crate::worker::commands::SandboxedRunner;
use crate::worker::dispatch::Emit;
use prost::Message;
use std::sync::atomic::Ordering;

/// Upload piece bytes the daemon may have sent and the worker not yet written (and credited).
/// Large enough to keep a local upload at disk speed, small enough that a slow disk holds
/// little in memory.
pub const UPLOAD_WINDOW_BYTES: u64 = 4 * 1024 * 1024;

/// What the call's inbox holds next.
pub enum Next {
    Piece(UploadPiece),
    /// Nothing yet (only when not waiting).
    Empty,
    /// The call was cancelled.
    Cancelled,
}

/// The call's inbox: `true` waits for the next piece.
pub type Pieces<'a> = dyn FnMut(bool) -> Next + 'a;

/// Runs one Files call.
pub fn call(
    ctx: &ToolContext,
    runner: &SandboxedRunner,
    call: FilesCall,
    emit: &mut Emit<'_>,
    pieces: &mut Pieces<'_>,
) -> Result<Reply, ToolError> {
    let op = call
        .op
        .ok_or_else(|| ToolError::invalid("the files call names no operation"))?;
    let answer = match op {
        Op::ReadBytes(r) => {
            let read = small::read_bytes(&ctx.cwd, &r.path)?;
            Answer::ReadBytes(api::ReadBytesResponse {
                path: read.path.to_string_lossy().into_owned(),
                data: read.data,
                mode: read.mode,
            })
        }
        Op::WriteBytes(r) => {
            let req = small::WriteBytes {
                path: &r.path,
                data: &r.data,
                mode: r.mode,
                create_parents: r.create_parents,
                no_overwrite: r.no_overwrite,
            };
            let path = guarded(runner, || small::write_bytes(&ctx.patch, &req))
                .map_err(changed_nothing)?;
            Answer::WriteBytes(api::WriteBytesResponse {
                path: path.to_string_lossy().into_owned(),
                size: r.data.len() as u64,
            })
        }
        Op::Upload(start) => {
            let summary =
                guarded(runner, || upload(ctx, &start, emit, pieces)).map_err(changed_nothing)?;
            Answer::Upload(api::UploadResponse {
                summary: Some(summary_of(summary)),
            })
        }
        Op::Download(r) => Answer::Download(download(ctx, &r.path, emit)?),
        Op::Stat(r) => {
            let s = ops::stat(&ctx.cwd, &r.path, r.follow_symlinks)?;
            Answer::Stat(api::StatResponse {
                path: s.path.to_string_lossy().into_owned(),
                kind: api_kind(s.node) as i32,
                size: s.size,
                mode: s.mode,
                modified_ms: s.modified_ms,
                created_ms: s.created_ms,
            })
        }
        Op::ListDirectory(r) => {
            let (path, entries) = ops::list_directory(&ctx.cwd, &r.path)?;
            Answer::ListDirectory(api::ListDirectoryResponse {
                path: path.to_string_lossy().into_owned(),
                entries: entries
                    .into_iter()
                    .map(|(name, node)| api::DirectoryEntry {
                        name: name.to_string_lossy().into_owned(),
                        kind: api_kind(node) as i32,
                    })
                    .collect(),
            })
        }
        Op::MakeDirectory(r) => {
            let path = guarded(runner, || {
                ops::make_directory(&ctx.patch, &r.path, r.recursive)
            })?;
            Answer::MakeDirectory(api::MakeDirectoryResponse {
                path: path.to_string_lossy().into_owned(),
            })
        }
        Op::Remove(r) => {
            let path = guarded(runner, || {
                ops::remove(&ctx.patch, &r.path, r.recursive, r.force)
            })?;
            Answer::Remove(api::RemoveResponse {
                path: path.to_string_lossy().into_owned(),
            })
        }
        Op::Copy(r) => {
            let path = guarded(runner, || {
                ops::copy(
                    &ctx.patch,
                    &r.source_path,
                    &r.destination_path,
                    r.recursive,
                    &ctx.cancel,
                )
            })
            .map_err(changed_nothing)?;
            Answer::Copy(api::CopyResponse {
                path: path.to_string_lossy().into_owned(),
            })
        }
        Op::RemoveUploadStagings(start) => {
            // Where the parent is gone there is nothing to remove; it is never created.
            let removed =
                match destination::for_write(&ctx.patch, &start.path, &start.source_name, false) {
                    Ok(dest) => guarded(runner, || Ok(transfer::remove_stale_stagings(&dest)))?,
                    Err(e) if e.kind == ErrorKind::NotFound => 0,
                    Err(e) => return Err(e),
                };
            Answer::RemovedStagings(removed as u64)
        }
    };
    Ok(Reply::Files(FilesReply { op: Some(answer) }))
}

/// A write under the protected-name guard (spec/sandbox.md §3.3): a protected name that came
/// into being meanwhile is taken away and the call fails saying so.
fn guarded<T>(
    runner: &SandboxedRunner,
    write: impl FnOnce() -> Result<T, ToolError>,
) -> Result<T, ToolError> {
    let guard = runner.guard_call()?;
    let result = write();
    match runner.guard_finish(guard) {
        Some(lines) => Err(ToolError::new(
            ErrorKind::PermissionDenied,
            format!("write rejected: {lines}"),
        )),
        None => result,
    }
}

/// A write that failed on the way (a full disk, an I/O error) says that it changed nothing: it
/// was staged, and the staging is gone.
fn changed_nothing(mut e: ToolError) -> ToolError {
    if matches!(e.kind, ErrorKind::ResourceExhausted | ErrorKind::Internal)
        && !e.message.contains("nothing was")
    {
        e.message.push_str("; nothing was changed");
    }
    e
}

fn cancelled() -> ToolError {
    ToolError::new(
        ErrorKind::Cancelled,
        "the upload was cancelled; nothing was changed",
    )
}

/// Receives an upload: checks the destination, says so with the first credit (the whole
/// window), then writes each piece as it comes and credits it back.
fn upload(
    ctx: &ToolContext,
    start: &api::UploadStart,
    emit: &mut Emit<'_>,
    pieces: &mut Pieces<'_>,
) -> Result<Summary, ToolError> {
    let dest = destination::for_write(
        &ctx.patch,
        &start.path,
        &start.source_name,
        start.create_parents,
    )?;
    let mut receiver = Receiver::new(dest, start.overwrite)?;
    emit(Reply::UploadCredit(UPLOAD_WINDOW_BYTES), None);
    let mut uncredited = 0u64;
    loop {
        let piece = match pieces(false) {
            Next::Piece(p) => p,
            Next::Cancelled => return Err(cancelled()),
            Next::Empty => {
                // About to wait: hand back what was written, or the daemon may be waiting too.
                if uncredited > 0 {
                    emit(Reply::UploadCredit(uncredited), None);
                    uncredited = 0;
                }
                match pieces(true) {
                    Next::Piece(p) => p,
                    Next::Cancelled => return Err(cancelled()),
                    Next::Empty => continue,
                }
            }
        };
        if piece.end {
            return receiver.finish();
        }
        let Some(request) = piece.item else {
            return Err(ToolError::invalid("an upload piece without an item"));
        };
        uncredited += request.encoded_len() as u64;
        match request.item {
            Some(api::upload_request::Item::Entry(e)) => receiver.entry(entry_of(e)?)?,
            Some(api::upload_request::Item::Data(d)) => receiver.data(&d)?,
            Some(api::upload_request::Item::Start(_)) => {
                return Err(ToolError::invalid(
                    "UploadStart comes once, as the first message",
                ));
            }
            // The daemon checks the finish and sends it as the `end` piece, never as an item.
            Some(api::upload_request::Item::Finish(_)) | None => {
                return Err(ToolError::invalid(
                    "an upload message without an entry or data",
                ));
            }
        }
        if uncredited >= UPLOAD_WINDOW_BYTES / 4 {
            emit(Reply::UploadCredit(uncredited), None);
            uncredited = 0;
        }
    }
}

/// Sends a download: entries and data as intermediate frames (each held to the call's
/// flow-control window by `emit`), the summary as the answer.
fn download(
    ctx: &ToolContext,
    path: &str,
    emit: &mut Emit<'_>,
) -> Result<api::DownloadResponse, ToolError> {
    use api::download_response::Item as Out;
    if path.is_empty() {
        return Err(ToolError::invalid("path is required"));
    }
    let full = ctx.cwd.join(path);
    let mut sink = |item: Item| {
        let out = match item {
            Item::Entry(e) => Out::Entry(api_entry(e)),
            Item::Data(d) => Out::Data(d),
        };
        emit(
            Reply::Files(FilesReply {
                op: Some(Answer::Download(api::DownloadResponse { item: Some(out) })),
            }),
            None,
        );
        // A cancelled call's emitter drops the frame: stop reading.
        if ctx.cancel.load(Ordering::SeqCst) {
            Err(ToolError::new(
                ErrorKind::Cancelled,
                "the download was cancelled",
            ))
        } else {
            Ok(())
        }
    };
    let summary = transfer::send::send(&full, transfer::SEND_CHUNK, &mut sink)?;
    Ok(api::DownloadResponse {
        item: Some(Out::Summary(summary_of(summary))),
    })
}

/// A wire entry as the tool's.
pub fn entry_of(e: api::TransferEntry) -> Result<Entry, ToolError> {
    let kind = match api::EntryKind::try_from(e.kind) {
        Ok(api::EntryKind::File) => Kind::File,
        Ok(api::EntryKind::Directory) => Kind::Directory,
        Ok(api::EntryKind::Symlink) => Kind::Symlink,
        _ => {
            return Err(ToolError::invalid(format!(
                "entry `{}`: kind must be FILE, DIRECTORY or SYMLINK (got {})",
                e.path, e.kind
            )));
        }
    };
    Ok(Entry {
        path: e.path,
        kind,
        mode: e.mode,
        size: e.size,
        link_target: e.link_target,
    })
}

/// A node's kind on the wire (FIFOs, sockets and devices are OTHER).
fn api_kind(node: Node) -> api::EntryKind {
    match node {
        Node::File => api::EntryKind::File,
        Node::Directory => api::EntryKind::Directory,
        Node::Symlink => api::EntryKind::Symlink,
        Node::Other(_) => api::EntryKind::Other,
    }
}

/// The tool's entry on the wire.
pub fn api_entry(e: Entry) -> api::TransferEntry {
    api::TransferEntry {
        path: e.path,
        kind: match e.kind {
            Kind::File => api::EntryKind::File,
            Kind::Directory => api::EntryKind::Directory,
            Kind::Symlink => api::EntryKind::Symlink,
        } as i32,
        mode: e.mode,
        size: e.size,
        link_target: e.link_target,
    }
}

pub fn summary_of(s: Summary) -> api::TransferSummary {
    api::TransferSummary {
        path: s.path.to_string_lossy().into_owned(),
        files: s.files,
        directories: s.directories,
        symlinks: s.symlinks,
        bytes: s.bytes,
        skipped: s.skipped,
    }
}
