//! Fuzz target: the apply_patch parser (spec/tools.md §5.2) must never panic, and whatever it
//! accepts must also be accepted inside a heredoc wrapper (§5.2 heredoc leniency), with the same
//! hunks.
#![no_main]

use corral::tools::apply_patch::parse_patch;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(input) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(patch) = parse_patch(input) else {
        return;
    };
    let wrapped = format!("<<'EOF'\n{}\nEOF", input.trim());
    let rewrapped = parse_patch(&wrapped).expect("a valid patch must stay valid in a heredoc");
    assert_eq!(patch, rewrapped);
});
