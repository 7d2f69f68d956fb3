"""The test daemons' state (socket, log) is never where a workspace-write session may write: not
under /tmp (a writable root by default) and not in the checkout, which may itself be a clone under
/tmp. The daemon refuses a session whose writable root contains its state, so with the state in
the checkout every workspace-write test failed in a clone under /tmp."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from conftest import REPO, Daemon, state_base
from corral_client import Client


def _inside(path: Path, root: str | Path) -> bool:
    root = os.path.realpath(root)
    return str(path) == root or str(path).startswith(root.rstrip("/") + "/")


def test_daemon_state_is_outside_tmp_and_the_checkout_private_and_cleaned_up(workspace):
    d = Daemon()
    state = Path(os.path.realpath(d.dir))
    try:
        assert not _inside(state, "/tmp"), state
        assert not _inside(state, REPO), f"{state} is in the checkout {REPO}"
        assert stat.S_IMODE(state.stat().st_mode) == 0o700
        # A workspace-write session in a workspace under /tmp, /tmp writable (nothing excluded):
        # accepted, and its commands write both places.
        with Client(d.target, timeout=60) as client:
            with client.open_session(workspace, "workspace-write") as s:
                assert os.path.realpath("/tmp") in s.writable_roots, s.writable_roots
                marker = f"/tmp/corral-pytest-state-{os.getpid()}"
                r = s.shell(["sh", "-c", f"echo ok > out.txt && echo ok > {marker} && rm {marker}"])
                assert r.exit_code == 0, r.text
        assert (workspace / "out.txt").read_text() == "ok\n"
    finally:
        d.stop()
    assert not state.exists(), f"{state} left behind"


def test_the_base_is_never_under_tmp_whatever_xdg_runtime_dir_says(monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/tmp")
    assert not _inside(state_base(), "/tmp"), state_base()
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert not _inside(state_base(), "/tmp"), state_base()
