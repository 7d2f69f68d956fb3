//! `corral cp SRC DST`: copies a file or a directory tree into a session (`corral cp ./dir
//! :dest`, Upload) or out of one (`corral cp :build/out ./out`, Download). Exactly one side is
//! remote, written `:PATH` (absolute, or relative to the session's cwd).
//!
//! cp's rules: a destination that is an existing directory receives the copy inside it, under
//! the source's name; directories are copied recursively; symlinks are copied as symlinks. An
//! existing destination is replaced atomically (a whole tree at once) unless `--no-clobber`.
//! Both sides are atomic: the daemon stages an upload beside its destination, and this command
//! stages a download the same way (the same code, `tools::transfer`), so an interrupted copy
//! leaves the destination as it was.
//!
//! Local files are read and written on a thread of their own, joined to the gRPC stream by a
//! small bounded channel: the stream never waits behind the disk for long, and memory stays a
//! few chunks whatever the size.

use crate::api::{self, files_client::FilesClient, upload_request::Item as Up};
use crate::client::Connection;
use crate::client::cli::{Common, ModeArg, SessionOpts, close, open, status_text};
use crate::tools::ToolError;
use crate::tools::transfer::{self, Destination, Item, Receiver, Summary};
use crate::worker::files::{api_entry, entry_of};
use clap::Args;
use serde_json::json;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;
use tokio::sync::mpsc;

/// Chunks (or entries) in flight between the local disk thread and the gRPC stream.
const PIPE_DEPTH: usize = 8;

#[derive(Debug, Clone, Args)]
pub struct CpArgs {
    /// What to copy: a local path, or `:PATH` in the session.
    pub src: String,
    /// Where to: a local path, or `:PATH` in the session. An existing directory receives the copy
    /// inside it.
    pub dst: String,
    /// Refuse to replace an existing destination (default: replace it, atomically).
    #[arg(short = 'n', long)]
    pub no_clobber: bool,
    /// Use this open session instead of opening a temporary one.
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,
    /// Working directory of the temporary session (default: the current directory).
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<PathBuf>,
    /// Mode of the temporary session (default: workspace-write to upload, read-only to
    /// download).
    #[arg(long, value_enum)]
    pub mode: Option<ModeArg>,
    /// Create the destination's missing parent directories.
    #[arg(short = 'p', long = "parents")]
    pub parents: bool,
    /// Leave /tmp out of the temporary session's writable roots (needed when the daemon keeps
    /// its own state there).
    #[arg(long)]
    pub exclude_slash_tmp: bool,
}

/// Which way a copy goes.
enum Direction {
    Upload { local: PathBuf, remote: String },
    Download { remote: String, local: PathBuf },
}

fn direction(args: &CpArgs) -> Result<Direction, String> {
    match (args.src.strip_prefix(':'), args.dst.strip_prefix(':')) {
        (None, Some(remote)) => Ok(Direction::Upload {
            local: PathBuf::from(&args.src),
            remote: remote_path(remote),
        }),
        (Some(remote), None) => Ok(Direction::Download {
            remote: remote_path(remote),
            local: PathBuf::from(&args.dst),
        }),
        _ => Err(
            "exactly one of SRC and DST must be remote, written `:PATH` (e.g. `corral cp ./dir \
             :dest` or `corral cp :out.bin ./out.bin`; a local name starting with `:` is `./:name`)"
                .into(),
        ),
    }
}

/// `:` alone is the session's cwd.
fn remote_path(p: &str) -> String {
    if p.is_empty() { ".".into() } else { p.into() }
}

/// Runs `corral cp`; the exit status.
pub async fn run(common: &Common, channel: Connection, args: CpArgs) -> Result<i32, String> {
    let dir = direction(&args)?;
    let upload = matches!(dir, Direction::Upload { .. });
    let opts = SessionOpts {
        session: args.session.clone(),
        cwd: args.cwd.clone(),
        mode: args.mode.unwrap_or(if upload {
            ModeArg::WorkspaceWrite
        } else {
            ModeArg::ReadOnly
        }),
        // A transfer runs no command: no approval can arise.
        approval_policy: None,
        exclude_slash_tmp: args.exclude_slash_tmp,
        exclude_tmpdir_env_var: false,
    };
    let (id, temporary) = open(&channel, &opts).await?;
    let started = Instant::now();
    let files = FilesClient::new(channel.clone())
        .max_decoding_message_size(crate::client::MAX_MESSAGE_BYTES);
    let progress = Progress::start();
    let copy = Copy {
        overwrite: !args.no_clobber,
        parents: args.parents,
        moved: progress.counter(),
    };
    let result = match &dir {
        Direction::Upload { local, remote } => upload_tree(files, &id, local, remote, &copy).await,
        Direction::Download { remote, local } => {
            let session_cwd = temporary.then(|| session_cwd(&opts)).transpose()?;
            download_tree(files, &id, remote, local, &copy, session_cwd).await
        }
    };
    progress.stop().await;
    close(&channel, &id, temporary).await;
    let summary = result?;
    let seconds = started.elapsed().as_secs_f64();
    let (from, to) = (&args.src, &args.dst);
    if common.json {
        println!(
            "{}",
            json!({
                "direction": if upload { "upload" } else { "download" },
                "source": from, "destination": to, "path": summary.path,
                "files": summary.files, "directories": summary.directories,
                "symlinks": summary.symlinks, "bytes": summary.bytes,
                "skipped": summary.skipped, "seconds": seconds,
            })
        );
    } else {
        for skipped in &summary.skipped {
            eprintln!("skipped {skipped} (not a file, directory or symlink, or not UTF-8)");
        }
        println!(
            "{} {from} -> {to} ({}): {} in {seconds:.2} s{}",
            if upload { "uploaded" } else { "downloaded" },
            summary.path,
            counts(&summary),
            if summary.skipped.is_empty() {
                String::new()
            } else {
                format!(", {} skipped", summary.skipped.len())
            }
        );
    }
    Ok(0)
}

/// `3 files, 2 directories, 1 symlink, 5.0 MB`.
fn counts(s: &api::TransferSummary) -> String {
    let n = |count: u64, one: &str, many: &str| {
        format!("{count} {}", if count == 1 { one } else { many })
    };
    format!(
        "{}, {}, {}, {:.1} MB",
        n(s.files, "file", "files"),
        n(s.directories, "directory", "directories"),
        n(s.symlinks, "symlink", "symlinks"),
        s.bytes as f64 / 1e6
    )
}

/// The temporary session's cwd (what a relative remote path is relative to).
fn session_cwd(opts: &SessionOpts) -> Result<PathBuf, String> {
    match &opts.cwd {
        Some(dir) => std::path::absolute(dir).map_err(|e| format!("--cwd {}: {e}", dir.display())),
        None => std::env::current_dir().map_err(|e| format!("current directory: {e}")),
    }
}

/// The last name of `path` after `.` and `..` are applied lexically.
fn last_name(path: &Path) -> Option<String> {
    let mut parts: Vec<String> = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => parts.push(n.to_string_lossy().into_owned()),
            Component::ParentDir => {
                parts.pop();
            }
            _ => {}
        }
    }
    parts.pop()
}

fn tool_text(e: ToolError) -> String {
    e.message
}

/// How a copy goes: replace or not, create parents or not, and the byte count the progress
/// line reads.
struct Copy {
    overwrite: bool,
    parents: bool,
    moved: Arc<AtomicU64>,
}

/// The progress line of a transfer, for a person watching: on stderr, only when it is a
/// terminal, only once the copy has taken a moment, rewritten in place and erased at the end.
struct Progress {
    moved: Arc<AtomicU64>,
    printer: Option<(
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    )>,
}

/// A copy shorter than this shows no progress line.
const PROGRESS_AFTER: std::time::Duration = std::time::Duration::from_millis(500);

impl Progress {
    fn start() -> Progress {
        let moved = Arc::new(AtomicU64::new(0));
        if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            return Progress {
                moved,
                printer: None,
            };
        }
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let counter = moved.clone();
        let printer = tokio::spawn(async move {
            let started = Instant::now();
            let mut tick = tokio::time::interval_at(
                tokio::time::Instant::now() + PROGRESS_AFTER,
                std::time::Duration::from_millis(250),
            );
            let mut shown = false;
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    _ = tick.tick() => {
                        let bytes = counter.load(Ordering::Relaxed) as f64;
                        let rate = bytes / started.elapsed().as_secs_f64().max(0.001);
                        eprint!("\r\x1b[Kcopying: {:.1} MB, {:.1} MB/s", bytes / 1e6, rate / 1e6);
                        shown = true;
                    }
                }
            }
            if shown {
                eprint!("\r\x1b[K");
            }
        });
        Progress {
            moved,
            printer: Some((stop, printer)),
        }
    }

    fn counter(&self) -> Arc<AtomicU64> {
        self.moved.clone()
    }

    async fn stop(self) {
        if let Some((stop, printer)) = self.printer {
            let _ = stop.send(());
            let _ = printer.await;
        }
    }
}

/// Uploads `local`: a walker thread reads it into upload messages, the stream carries them.
async fn upload_tree(
    mut files: FilesClient<Connection>,
    session: &str,
    local: &Path,
    remote: &str,
    copy: &Copy,
) -> Result<api::TransferSummary, String> {
    std::fs::symlink_metadata(local).map_err(|e| format!("{}: {e}", local.display()))?;
    let name = last_name(&std::path::absolute(local).map_err(|e| e.to_string())?)
        .ok_or_else(|| format!("{}: name a file or directory to copy", local.display()))?;
    let start = api::UploadRequest {
        item: Some(Up::Start(api::UploadStart {
            session_id: session.into(),
            path: remote.into(),
            source_name: name,
            overwrite: copy.overwrite,
            create_parents: copy.parents,
        })),
    };
    let (tx, rx) = mpsc::channel::<api::UploadRequest>(PIPE_DEPTH);
    // The stream ends only when the walk finished cleanly: a walk that failed must cancel the
    // call (so nothing changes), never end it (which could commit a partial tree).
    let complete = Arc::new(AtomicBool::new(false));
    let walker = {
        let (local, complete) = (local.to_path_buf(), complete.clone());
        let moved = copy.moved.clone();
        std::thread::spawn(move || {
            let mut sent = api::UploadFinish::default();
            let mut sink = |item: Item| {
                let item = match item {
                    Item::Entry(e) => {
                        sent.entries += 1;
                        Up::Entry(api_entry(e))
                    }
                    Item::Data(d) => {
                        sent.bytes += d.len() as u64;
                        moved.fetch_add(d.len() as u64, Ordering::Relaxed);
                        Up::Data(d)
                    }
                };
                tx.blocking_send(api::UploadRequest { item: Some(item) })
                    .map_err(|_| ToolError::invalid("the upload ended"))
            };
            // 256 KiB chunks, like a download's: every hop holds one buffer per chunk in flight,
            // and smaller buffers keep that (and the allocator's churn) small.
            let result = transfer::send::send(&local, transfer::SEND_CHUNK, &mut sink);
            if result.is_ok() {
                // Only a walk that finished sends the finish: the daemon commits nothing else.
                let finish = api::UploadRequest {
                    item: Some(Up::Finish(sent)),
                };
                tx.blocking_send(finish)
                    .map_err(|_| ToolError::invalid("the upload ended"))?;
                complete.store(true, Ordering::SeqCst);
            }
            result
        })
    };
    let body = futures_util::stream::unfold((Some(start), rx), move |(first, mut rx)| {
        let complete = complete.clone();
        async move {
            if let Some(start) = first {
                return Some((start, (None, rx)));
            }
            match rx.recv().await {
                Some(msg) => Some((msg, (None, rx))),
                None if complete.load(Ordering::SeqCst) => None,
                // The walk failed: hold the stream open; the caller cancels the call.
                None => std::future::pending().await,
            }
        }
    });
    let (walked_tx, walked_rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = walked_tx.send(walker.join());
    });
    let call = files.upload(body);
    tokio::pin!(call);
    tokio::select! {
        answer = &mut call => {
            let answer = answer.map_err(status_text)?.into_inner();
            answer.summary.ok_or_else(|| "the daemon sent no summary".to_string())
        }
        walked = walked_rx => match walked {
            Ok(Ok(Err(e))) => Err(format!("{} (the upload was cancelled; nothing was changed)", tool_text(e))),
            Ok(Err(_)) | Err(_) => Err("the local reader failed; the upload was cancelled".into()),
            // The walk is done; the answer follows.
            Ok(Ok(Ok(local_summary))) => {
                let answer = call.await.map_err(status_text)?.into_inner();
                let mut summary = answer.summary.ok_or_else(|| "the daemon sent no summary".to_string())?;
                summary.skipped = local_summary.skipped;
                Ok(summary)
            }
        },
    }
}

/// Downloads `remote` to `local` (or inside it, when it is a directory): the stream's items go
/// to a writer thread that receives them exactly as the daemon receives an upload.
async fn download_tree(
    mut files: FilesClient<Connection>,
    session: &str,
    remote: &str,
    local: &Path,
    copy: &Copy,
    session_cwd: Option<PathBuf>,
) -> Result<api::TransferSummary, String> {
    if copy.parents
        && let Some(parent) = local.parent().filter(|p| !p.as_os_str().is_empty())
    {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    let target = if std::fs::metadata(local).is_ok_and(|m| m.is_dir()) {
        let remote_abs = match &session_cwd {
            Some(cwd) => cwd.join(remote),
            None => PathBuf::from(remote),
        };
        let name = last_name(&remote_abs).ok_or_else(|| {
            format!(
                "cannot tell the name of `:{remote}` to copy it into {}; name the destination \
                 itself (e.g. {}/NAME)",
                local.display(),
                local.display()
            )
        })?;
        local.join(name)
    } else {
        local.to_path_buf()
    };
    let mut stream = files
        .download(api::DownloadRequest {
            session_id: session.into(),
            path: remote.into(),
        })
        .await
        .map_err(status_text)?
        .into_inner();
    // `None` tells the writer the stream failed: it must not commit what it has.
    let (tx, mut rx) = mpsc::channel::<Option<Item>>(PIPE_DEPTH);
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let overwrite = copy.overwrite;
    std::thread::spawn(move || {
        let result = (|| -> Result<Summary, ToolError> {
            // A copy interrupted before (Ctrl-C, a killed CLI) may have left its staging: one
            // listing of the destination's directory per copy is cheap.
            crate::tools::transfer::fsx::set_leftovers_possible(true);
            let mut receiver = Receiver::new(Destination::local(&target)?, overwrite)?;
            while let Some(item) = rx.blocking_recv() {
                match item {
                    Some(Item::Entry(e)) => receiver.entry(e)?,
                    Some(Item::Data(d)) => receiver.data(&d)?,
                    // Dropping the receiver removes its staging.
                    None => {
                        return Err(ToolError::new(
                            crate::tools::ErrorKind::Cancelled,
                            "the download stopped",
                        ));
                    }
                }
            }
            receiver.finish()
        })();
        let _ = done_tx.send(result);
    });
    let mut remote_summary = None;
    let mut failed = None;
    loop {
        let item = match stream.message().await {
            Ok(Some(msg)) => match msg.item {
                Some(api::download_response::Item::Entry(e)) => match entry_of(e) {
                    Ok(e) => Item::Entry(e),
                    Err(e) => {
                        failed = Some(tool_text(e));
                        break;
                    }
                },
                Some(api::download_response::Item::Data(d)) => {
                    copy.moved.fetch_add(d.len() as u64, Ordering::Relaxed);
                    Item::Data(d)
                }
                Some(api::download_response::Item::Summary(s)) => {
                    remote_summary = Some(s);
                    break;
                }
                None => continue,
            },
            Ok(None) => {
                failed = Some("the download ended without its summary".into());
                break;
            }
            Err(s) => {
                failed = Some(status_text(s));
                break;
            }
        };
        if tx.send(Some(item)).await.is_err() {
            // The writer stopped: its error says why.
            break;
        }
    }
    drop(stream);
    if failed.is_some() {
        let _ = tx.send(None).await;
    }
    drop(tx);
    let written = done_rx
        .await
        .map_err(|_| "the local writer failed".to_string())?;
    let (written, remote_summary) = match (failed, written, remote_summary) {
        (Some(why), _, _) => return Err(format!("{why}; nothing was written")),
        (None, Err(e), _) => return Err(tool_text(e)),
        (None, Ok(w), Some(s)) => (w, s),
        (None, Ok(_), None) => return Err("the download ended without its summary".into()),
    };
    let mut summary = remote_summary;
    summary.path = written.path.to_string_lossy().into_owned();
    Ok(summary)
}
