//! Fuzz target: the Invoke entry point (`corral::fuzzing::invoke`, i.e. calls::invoke) of every model tool, with the
//! arguments the model would send.
//!
//! Input: byte 0 picks the tool (and, rarely, the freeform payload flag); the rest up to the
//! first NUL is the call's `arguments`; what follows the NUL is the content of the fixture
//! file `f` (and `d/a.txt`) in the call's fresh working directory, so read_file's indentation
//! walk, grep_files' search, apply_patch's matching and view_image's decoders see fuzzed data
//! too. One target rather than ten: every tool shares the dispatch and the argument decoding, so
//! one corpus lets a finding for one tool's JSON seed the others; each tool still gets a tenth of
//! the runs and its own properties below.
//!
//! No command ever runs: the context's runner records the request and refuses it. Calls whose
//! paths could leave the working directory (absolute, `..`) are not run (only parsed): the
//! containment rules have their own tests, and a fuzzer running as root must not write or walk
//! the host.
#![no_main]

use corral::fuzzing::{InvokeOutcome, intercepts_apply_patch, invoke};
use corral::tools::apply_patch::invocation::{Invocation, classify_argv, classify_script};
use corral::tools::apply_patch::{ApplyPatchArgs, Hunk, PatchContext, parse_patch};
use corral::tools::grep_files::GrepFilesArgs;
use corral::tools::list_dir::ListDirArgs;
use corral::tools::read_file::{MAX_LINE_LENGTH, ReadFileArgs};
use corral::tools::shell::{ExecOutcome, ExecRequest, OutputChunk, ShellArgs, ShellCommandArgs};
use corral::tools::unified_exec::{
    ExecCommandArgs, ProcessGuard, WriteStdinArgs, clamp_exec_yield, clamp_write_yield,
};
use corral::tools::update_plan::{self, UpdatePlanArgs};
use corral::tools::view_image::ViewImageArgs;
use corral::tools::{CommandRunner, ErrorKind, ToolContext, ToolError};
use libfuzzer_sys::fuzz_target;
use serde::de::DeserializeOwned;
use std::path::{Component, Path};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

const TOOLS: [&str; 10] = [
    "read_file",
    "list_dir",
    "grep_files",
    "apply_patch",
    "shell",
    "shell_command",
    "exec_command",
    "write_stdin",
    "update_plan",
    "view_image",
];

/// The policy's timeout ceiling in the fuzzed context (ms).
const CEILING_MS: u64 = 600_000;
const REFUSED: &str = "fuzzing: no command runs";
const SHELL: &str = "/bin/bash";

/// Records what a tool asked to run and runs nothing.
#[derive(Default)]
struct NoCommands {
    runs: Mutex<Vec<ExecRequest>>,
    guards: AtomicBool,
}

impl CommandRunner for NoCommands {
    fn run(
        &self,
        req: &ExecRequest,
        _: &mut dyn FnMut(OutputChunk),
        _: &AtomicBool,
    ) -> Result<ExecOutcome, ToolError> {
        self.runs.lock().unwrap().push(req.clone());
        Err(ToolError::new(ErrorKind::Internal, REFUSED))
    }

    // exec_command asks for its guard before it spawns: refusing it here is what keeps the
    // unified-exec path from starting a process.
    fn guard_process(&self) -> Result<Option<Box<dyn ProcessGuard>>, ToolError> {
        self.guards.store(true, Ordering::SeqCst);
        Err(ToolError::new(ErrorKind::Internal, REFUSED))
    }
}

fn context(dir: &Path, runner: Arc<NoCommands>) -> ToolContext {
    ToolContext {
        session_id: "fuzz".into(),
        cwd: dir.to_path_buf(),
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        network_disabled: true,
        shell: SHELL.into(),
        cancel: Default::default(),
        runner,
        timeout_ceiling_ms: CEILING_MS,
        patch: PatchContext {
            cwd: dir.to_path_buf(),
            writable_roots: vec![dir.to_path_buf()],
            read_only: false,
            protected_names: vec![".git".into(), ".codex".into(), ".agents".into()],
            protected_paths: Vec::new(),
        },
        new_process_id: None,
        background_terminal_max_timeout_ms: 300_000,
    }
}

/// A path that stays inside the working directory: relative, plain names only. (The directory
/// holds no symlink, and no tool creates one.)
fn inside(path: &str) -> bool {
    Path::new(path)
        .components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
}

fn patch_stays_inside(patch: &str) -> bool {
    match parse_patch(patch) {
        // Refused at the parse: nothing is written.
        Err(_) => true,
        Ok(p) => p.hunks.iter().all(|h| {
            inside(h.path())
                && match h {
                    Hunk::Update { move_to, .. } => move_to.as_deref().is_none_or(inside),
                    _ => true,
                }
        }),
    }
}

/// Whether a command tool's apply_patch interception, if any, stays inside.
fn interception_stays_inside(form: &Invocation, workdir: Option<&str>) -> bool {
    match form {
        Invocation::Patch { patch, workdir: cd } => {
            workdir.is_none_or(inside)
                && cd.as_deref().is_none_or(inside)
                && patch_stays_inside(patch)
        }
        _ => true,
    }
}

fn parse_error_text<A: DeserializeOwned>(arguments: &str) -> Option<String> {
    serde_json::from_str::<A>(arguments)
        .err()
        .map(|e| format!("failed to parse function arguments: {e}"))
}

/// No apply_patch staging file may survive a call, whatever its outcome.
fn assert_no_staging(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        assert!(
            !(name.starts_with(".corral-patch-") && name.ends_with(".tmp")),
            "a patch staging file was left behind: {}",
            e.path().display()
        );
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            assert_no_staging(&e.path());
        }
    }
}

fn failed_with(out: &InvokeOutcome, text: &str) {
    assert!(!out.success, "{out:?}");
    assert_eq!(out.output, text);
    assert!(out.content_items.is_empty());
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let name = TOOLS[usize::from(selector & 0x0f) % TOOLS.len()];
    // Rare on purpose: a freeform payload is refused up front by all but apply_patch.
    let freeform = selector >= 0xf0;
    let (arguments, fixture) = match rest.iter().position(|&b| b == 0) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    // Invoke's arguments are a proto string: always UTF-8.
    let Ok(arguments) = std::str::from_utf8(arguments) else {
        return;
    };

    let dir = tempfile::Builder::new()
        .prefix("corral-fuzz-")
        .tempdir_in(if Path::new("/dev/shm").is_dir() {
            "/dev/shm"
        } else {
            "/tmp"
        })
        .expect("temp dir");
    let root = dir.path();
    std::fs::write(root.join("f"), fixture).unwrap();
    std::fs::create_dir_all(root.join("d/e")).unwrap();
    std::fs::write(root.join("d/a.txt"), fixture).unwrap();
    std::fs::write(root.join("d/b.rs"), b"fn main() {\n    x();\n}\n").unwrap();

    let runner = Arc::new(NoCommands::default());
    let ctx = context(root, runner.clone());
    let call = || invoke(&ctx, name, arguments, freeform);

    if freeform && name != "apply_patch" {
        // Every function tool refuses a freeform payload before reading it.
        let out = call();
        let expected = match name {
            "shell" | "shell_command" => out.output.clone(),
            _ => format!("{name} handler received unsupported payload"),
        };
        failed_with(&out, &expected);
        assert!(runner.runs.lock().unwrap().is_empty());
        return;
    }

    match name {
        "read_file" => {
            let Ok(args) = serde_json::from_str::<ReadFileArgs>(arguments) else {
                let text = parse_error_text::<ReadFileArgs>(arguments).unwrap();
                return failed_with(&call(), &text);
            };
            if !inside(&args.file_path) {
                return;
            }
            let out = call();
            if !out.success {
                return;
            }
            let offset = args.offset.unwrap_or(1);
            let limit = args.limit.unwrap_or(2000);
            assert!(offset > 0 && limit > 0, "accepted offset 0 or limit 0");
            let slice = args
                .mode
                .is_none_or(|m| m == corral::tools::read_file::ReadMode::Slice);
            let mut previous = 0usize;
            let mut count = 0usize;
            for (i, line) in out.output.split('\n').enumerate() {
                if out.output.is_empty() {
                    break;
                }
                let body = line.strip_prefix('L').expect("an `L{n}: ` line");
                let (number, text) = body.split_once(": ").expect("an `L{n}: ` line");
                let number: usize = number.parse().expect("a line number");
                assert!(
                    text.len() <= MAX_LINE_LENGTH,
                    "line {number} is longer than shown lines may be"
                );
                if slice {
                    assert_eq!(
                        number,
                        offset + i,
                        "slice lines are consecutive from offset"
                    );
                } else {
                    assert!(number > previous, "indentation lines in order, once each");
                }
                previous = number;
                count += 1;
            }
            assert!(count <= limit, "{count} lines for limit {limit}");
        }
        "list_dir" => {
            let Ok(args) = serde_json::from_str::<ListDirArgs>(arguments) else {
                let text = parse_error_text::<ListDirArgs>(arguments).unwrap();
                return failed_with(&call(), &text);
            };
            if !inside(&args.dir_path) {
                return;
            }
            let out = call();
            if !out.success {
                return;
            }
            let mut lines = out.output.lines();
            let head = lines.next().unwrap();
            assert!(head.starts_with("Absolute path: "), "{head}");
            let mut shown = 0;
            let mut trailer = None;
            for l in lines {
                if let Some(n) = l
                    .strip_prefix("More than ")
                    .and_then(|r| r.strip_suffix(" entries found"))
                {
                    trailer = Some(n.parse::<usize>().unwrap());
                } else {
                    assert!(trailer.is_none(), "an entry after the trailer");
                    shown += 1;
                }
            }
            assert!(shown <= args.limit.unwrap_or(25));
            if let Some(n) = trailer {
                assert_eq!(n, shown);
            }
        }
        "grep_files" => {
            let Ok(args) = serde_json::from_str::<GrepFilesArgs>(arguments) else {
                let text = parse_error_text::<GrepFilesArgs>(arguments).unwrap();
                return failed_with(&call(), &text);
            };
            if !args.path.as_deref().is_none_or(inside) {
                return;
            }
            let out = call();
            if out.success {
                let n = out.output.lines().count();
                assert!(n <= args.limit.unwrap_or(100).min(2000), "{n} matches");
                for l in out.output.lines() {
                    assert!(
                        Path::new(l).starts_with(root),
                        "match outside the search: {l}"
                    );
                }
            } else {
                assert!(out.content_items.is_empty());
            }
        }
        "apply_patch" => {
            let patch = if freeform {
                arguments.to_string()
            } else {
                match serde_json::from_str::<ApplyPatchArgs>(arguments) {
                    Ok(a) => a.input,
                    Err(e) => {
                        let text = format!("failed to parse function arguments: {e}");
                        return failed_with(&call(), &text);
                    }
                }
            };
            if !patch_stays_inside(&patch) {
                return;
            }
            let out = call();
            if out.success {
                assert!(parse_patch(&patch).is_ok_and(|p| !p.hunks.is_empty()));
                assert!(
                    out.output
                        .contains("Success. Updated the following files:\n"),
                    "{}",
                    out.output
                );
            }
            assert_no_staging(root);
        }
        "shell" => {
            let Ok(args) = ShellArgs::parse(arguments) else {
                let text = parse_error_text::<ShellArgs>(arguments).unwrap();
                return failed_with(&call(), &text);
            };
            let form = classify_argv(&args.command);
            assert_eq!(
                intercepts_apply_patch(name, arguments),
                form != Invocation::NotPatch
            );
            assert_eq!(
                intercepts_apply_patch("container.exec", arguments),
                form != Invocation::NotPatch
            );
            if !interception_stays_inside(&form, args.workdir.as_deref()) {
                return;
            }
            let out = call();
            let runs = runner.runs.lock().unwrap();
            if form != Invocation::NotPatch || args.command.is_empty() {
                // An intercepted patch is applied, never run as a command.
                assert!(runs.is_empty(), "an apply_patch call reached the runner");
                if args.command.is_empty() {
                    failed_with(&out, "command must not be empty");
                }
            } else {
                let [req] = &runs[..] else {
                    panic!("{} runs", runs.len())
                };
                assert_eq!(req.argv, args.command);
                assert!(req.timeout.as_millis() <= u128::from(CEILING_MS));
                failed_with(&out, REFUSED);
            }
            assert_no_staging(root);
        }
        "shell_command" => {
            let Ok(args) = ShellCommandArgs::parse(arguments) else {
                let text = parse_error_text::<ShellCommandArgs>(arguments).unwrap();
                return failed_with(&call(), &text);
            };
            let form = classify_script(&args.command);
            assert_eq!(
                intercepts_apply_patch(name, arguments),
                form != Invocation::NotPatch
            );
            if !interception_stays_inside(&form, args.workdir.as_deref()) {
                return;
            }
            let out = call();
            let runs = runner.runs.lock().unwrap();
            if form != Invocation::NotPatch {
                assert!(runs.is_empty(), "an apply_patch call reached the runner");
            } else {
                let [req] = &runs[..] else {
                    panic!("{} runs", runs.len())
                };
                let flag = if args.login.unwrap_or(true) {
                    "-lc"
                } else {
                    "-c"
                };
                assert_eq!(req.argv, [SHELL, flag, args.command.as_str()]);
                assert!(req.timeout.as_millis() <= u128::from(CEILING_MS));
                failed_with(&out, REFUSED);
            }
            assert_no_staging(root);
        }
        "exec_command" => {
            let Ok(args) = ExecCommandArgs::parse(arguments) else {
                let text = parse_error_text::<ExecCommandArgs>(arguments).unwrap();
                return failed_with(&call(), &text);
            };
            let y = clamp_exec_yield(args.yield_time_ms);
            assert!((250..=30_000).contains(&y));
            let form = classify_script(&args.cmd);
            assert_eq!(
                intercepts_apply_patch(name, arguments),
                form != Invocation::NotPatch
            );
            if !interception_stays_inside(&form, args.workdir.as_deref()) {
                return;
            }
            let argv = args.argv(SHELL, true).unwrap();
            assert_eq!(argv.len(), 3);
            assert_eq!(argv[2], args.cmd);
            let out = call();
            // The guard is asked for (and refused) exactly when a process would start.
            assert_eq!(
                runner.guards.load(Ordering::SeqCst),
                form == Invocation::NotPatch
            );
            assert!(runner.runs.lock().unwrap().is_empty());
            if form == Invocation::NotPatch {
                assert!(!out.success);
            }
            assert_no_staging(root);
        }
        "write_stdin" => {
            let Ok(args) = WriteStdinArgs::parse(arguments) else {
                let text = parse_error_text::<WriteStdinArgs>(arguments).unwrap();
                return failed_with(&call(), &text);
            };
            for empty in [true, false] {
                let y = clamp_write_yield(args.yield_time_ms, empty, 300_000);
                assert!(y >= 250 && y <= if empty { 300_000 } else { 30_000 });
            }
            // No process was ever started in this session.
            let out = call();
            assert!(!out.success, "{out:?}");
        }
        "update_plan" => {
            let out = call();
            match update_plan::parse(arguments) {
                Ok(UpdatePlanArgs { .. }) => {
                    assert_eq!(
                        (out.output.as_str(), out.success),
                        (update_plan::PLAN_UPDATED, true)
                    )
                }
                Err(e) => failed_with(&out, &e.message),
            }
        }
        "view_image" => {
            let Ok(args) = serde_json::from_str::<ViewImageArgs>(arguments) else {
                let text = parse_error_text::<ViewImageArgs>(arguments).unwrap();
                return failed_with(&call(), &text);
            };
            if !inside(&args.path) {
                return;
            }
            let out = call();
            if out.success {
                let [corral::fuzzing::ContentItem::InputImage { image_url, detail }] =
                    &out.content_items[..]
                else {
                    panic!("one image item: {out:?}");
                };
                assert!(
                    image_url.starts_with("data:image/"),
                    "{}",
                    &image_url[..image_url.len().min(40)]
                );
                assert_eq!(detail.as_deref(), args.detail.as_deref());
            } else {
                assert!(out.content_items.is_empty());
            }
        }
        _ => unreachable!(),
    }
});
