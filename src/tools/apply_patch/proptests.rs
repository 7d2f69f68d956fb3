//! Property tests: random edits turned into a patch apply to exactly the edited content (with LF
//! and CRLF files); random input never panics the parser, the matcher or the whole tool; and a
//! failed patch never changes the tree.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use proptest::prelude::*;

use super::parser::Hunk;
use super::update::compute_update;
use super::*;

/// One edit: at `gap` untouched lines after the previous edit (at least one, except for the
/// first), remove `remove` lines and insert `insert`; keep up to `context` lines before it.
#[derive(Debug, Clone)]
struct Edit {
    gap: usize,
    remove: usize,
    insert: Vec<String>,
    context: usize,
}

fn edit_strategy() -> impl Strategy<Value = Edit> {
    (
        0usize..4,
        0usize..4,
        prop::collection::vec("[ -~é✅\u{2013}\t]{0,12}", 0..4),
        0usize..4,
    )
        .prop_map(|(gap, remove, insert, context)| Edit {
            gap,
            remove,
            insert,
            context,
        })
}

/// Builds (patch body for `*** Update File: f`, expected lines) from unique original lines and
/// edits. Returns `None` when the edits do not fit the file.
fn build(original: &[String], edits: &[Edit]) -> Option<(String, Vec<String>)> {
    let mut body = String::new();
    let mut expected = Vec::new();
    let mut pos = 0; // next original line not yet copied to `expected`
    let mut consumed = 0; // end of the last chunk's old lines
    for (i, edit) in edits.iter().enumerate() {
        let gap = if i == 0 { edit.gap } else { edit.gap.max(1) };
        let start = pos + gap;
        let end = start + edit.remove;
        if end > original.len() {
            return None;
        }
        expected.extend_from_slice(&original[pos..start]);
        let ctx_start = start.saturating_sub(edit.context).max(consumed);
        let mut old_before: Vec<&String> = original[ctx_start..start].iter().collect();
        let mut after = None;
        if old_before.is_empty() && edit.remove == 0 {
            if start > consumed {
                old_before.push(&original[start - 1]);
            } else if start < original.len() {
                after = Some(&original[start]);
            } else if !original.is_empty() {
                return None; // nothing to anchor a mid-file insertion on
            }
        }
        if old_before.is_empty() && edit.remove == 0 && after.is_none() && edit.insert.is_empty() {
            return None; // an `@@` with no lines is a parse error
        }
        body.push_str("@@\n");
        for l in &old_before {
            body.push_str(&format!(" {l}\n"));
        }
        for l in &original[start..end] {
            body.push_str(&format!("-{l}\n"));
        }
        for l in &edit.insert {
            body.push_str(&format!("+{l}\n"));
        }
        expected.extend(edit.insert.iter().cloned());
        pos = end;
        consumed = end;
        if let Some(l) = after {
            body.push_str(&format!(" {l}\n"));
            expected.push(l.clone());
            pos += 1;
            consumed += 1;
        }
        if old_before.is_empty() && edit.remove == 0 && after.is_none() && pos < original.len() {
            return None; // a pure addition only appends at the end
        }
    }
    expected.extend_from_slice(&original[pos..]);
    Some((body, expected))
}

fn original_strategy() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec("[a-z ]{0,6}", 0..12).prop_map(|words| {
        words
            .into_iter()
            .enumerate()
            .map(|(i, w)| format!("{i}:{w}x"))
            .collect()
    })
}

fn join(lines: &[String], term: &str, final_term: bool) -> String {
    let mut s = String::new();
    for (i, l) in lines.iter().enumerate() {
        s.push_str(l);
        if i + 1 < lines.len() || final_term {
            s.push_str(term);
        }
    }
    s
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_edits_apply_exactly(
        original in original_strategy(),
        edits in prop::collection::vec(edit_strategy(), 1..4),
        crlf in any::<bool>(),
        final_newline in any::<bool>(),
    ) {
        let Some((body, expected)) = build(&original, &edits) else {
            return Ok(());
        };
        prop_assume!(!body.is_empty());
        let term = if crlf { "\r\n" } else { "\n" };
        let content = join(&original, term, final_newline);
        let patch = parse_patch(&format!("*** Begin Patch\n*** Update File: f\n{body}*** End Patch"))
            .map_err(|e| TestCaseError::fail(format!("{e}\n{body}")))?;
        let Hunk::Update { chunks, .. } = &patch.hunks[0] else { unreachable!() };
        let got = compute_update(&content, chunks, "/f")
            .map_err(|e| TestCaseError::fail(format!("{e}\n{body}")))?;
        // The preferred terminator is that of the first terminated line, `\n` without one.
        let has_terminated = original.len() >= 2 || (original.len() == 1 && final_newline);
        let preferred = if has_terminated { term } else { "\n" };
        prop_assert_eq!(got, join(&expected, preferred, true), "patch:\n{}", body);
    }

    #[test]
    fn parser_never_panics_on_garbage(input in ".{0,400}") {
        let _ = parse_patch(&input);
        let _ = parse_patch(&format!("*** Begin Patch\n{input}\n*** End Patch"));
    }

    #[test]
    fn matcher_never_panics(
        lines in prop::collection::vec("[ a\u{2013}-]{0,3}", 0..8),
        pattern in prop::collection::vec("[ a\u{2013}-]{0,3}", 0..4),
        start in 0usize..10,
        eof in any::<bool>(),
    ) {
        if let Some(i) = seek_sequence(&lines, &pattern, start, eof) {
            prop_assert!(i >= start);
            prop_assert!(pattern.is_empty() || i + pattern.len() <= lines.len());
            if eof && !pattern.is_empty() {
                prop_assert_eq!(i + pattern.len(), lines.len());
            }
        }
    }
}

const TOKENS: &[&str] = &[
    "*** Begin Patch",
    "*** End Patch",
    "*** Add File: a",
    "*** Add File: d/n",
    "*** Update File: a",
    "*** Update File: b",
    "*** Delete File: a",
    "*** Delete File: d",
    "*** Move to: b",
    "*** Move to: d/m",
    "@@",
    "@@ one",
    "@@ ",
    "+one",
    "+",
    "-one",
    "-two",
    " one",
    " two",
    "",
    "*** End of File",
    "<<EOF",
    "EOF",
    "junk",
];

fn snapshot(root: &Path) -> BTreeMap<String, Option<Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            if p.is_dir() {
                out.insert(rel, None);
                stack.push(p);
            } else {
                out.insert(rel, Some(fs::read(&p).unwrap()));
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Patch-shaped noise through the whole tool: never a panic, and a failure leaves the tree
    /// exactly as it was.
    #[test]
    fn tool_is_all_or_nothing(picks in prop::collection::vec(0usize..TOKENS.len(), 0..14), framed in any::<bool>()) {
        let dir = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(dir.path()).unwrap();
        fs::write(root.join("a"), "one\ntwo\n").unwrap();
        fs::write(root.join("b"), "two\r\none\r\n").unwrap();
        fs::create_dir(root.join("d")).unwrap();
        let body: Vec<&str> = picks.iter().map(|&i| TOKENS[i]).collect();
        let input = if framed {
            format!("*** Begin Patch\n{}\n*** End Patch", body.join("\n"))
        } else {
            body.join("\n")
        };
        let ctx = PatchContext {
            cwd: root.clone(),
            writable_roots: vec![root.clone()],
            read_only: false,
            protected_names: vec![".git".into()],
            protected_paths: vec![],
        };
        let before = snapshot(&root);
        match apply_patch(&input, &ctx) {
            Ok(out) => {
                let text = out.model_text();
                prop_assert!(text.starts_with("Exit code: 0\nWall time: "), "{}", text);
                prop_assert!(text.contains("\nOutput:\nSuccess. Updated the following files:\n"), "{}", text);
            }
            Err(_) => prop_assert_eq!(snapshot(&root), before),
        }
    }
}
