//! Test-only fault injection for the commit (spec/tools.md §5.12 test 24).
//!
//! A per-thread hook consulted before each disk operation of the commit and of the rollback, so
//! tests can make a write fail midway even when running as root (where permission bits are
//! ignored and `chmod` cannot provoke the failure).

use std::cell::RefCell;
use std::io;
use std::path::Path;

pub use super::apply::Point;

type Hook = Box<dyn FnMut(Point, &Path) -> Option<io::Error>>;

thread_local! {
    static HOOK: RefCell<Option<Hook>> = RefCell::new(None);
}

/// Installs `hook` for the current thread until [`clear`]; returning `Some(err)` fails the
/// operation at that point with `err`.
pub fn set(hook: impl FnMut(Point, &Path) -> Option<io::Error> + 'static) {
    HOOK.with(|h| *h.borrow_mut() = Some(Box::new(hook)));
}

/// Removes the current thread's hook.
pub fn clear() {
    HOOK.with(|h| *h.borrow_mut() = None);
}

pub(super) fn check(point: Point, path: &Path) -> io::Result<()> {
    HOOK.with(
        |h| match h.borrow_mut().as_mut().and_then(|f| f(point, path)) {
            Some(e) => Err(e),
            None => Ok(()),
        },
    )
}
