//! The spare's rename: a worker the daemon started ahead as `__spare_` shows `__worker` once it
//! got its spec, where operators and tests look. Its own room for its one `unsafe` write into
//! the process's argument block.

use crate::wire::spec::SPARE_ARG;

/// A spare worker that got its spec is a worker like any other and says so where operators and
/// tests look (`/proc/PID/cmdline`, `ps`, `pgrep -f __worker`): its `__spare_` argument is
/// rewritten to `__worker` in place, in the argument block the kernel shows. Best effort.
pub(super) fn rename_spare() {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return;
    };
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return;
    };
    // Fields 48 and 49 (arg_start, arg_end); the text after the name starts at field 3.
    let f: Vec<&str> = rest.split_ascii_whitespace().collect();
    let field = |n: usize| f.get(n - 3).and_then(|v| v.parse::<usize>().ok());
    let (Some(start), Some(end)) = (field(48), field(49)) else {
        return;
    };
    if start == 0 || end <= start || end - start > 1 << 20 {
        return;
    }
    // SAFETY: [arg_start, arg_end) is this process's argument block on its initial stack:
    // mapped and writable for the life of the process. Nothing holds a Rust reference into it
    // (std reads argv through raw pointers), and the bytes written keep its length and NULs.
    let block = unsafe { std::slice::from_raw_parts_mut(start as *mut u8, end - start) };
    let spare = SPARE_ARG.as_bytes();
    if let Some(pos) = block
        .windows(spare.len() + 1)
        .position(|w| w[0] == 0 && &w[1..] == spare)
        && block.get(pos + 1 + spare.len()) == Some(&0)
    {
        block[pos + 1..pos + 1 + spare.len()].copy_from_slice(b"__worker");
    }
}
