"""Test harness: a real `corral serve` on a temporary Unix socket, and the shared transcript.

The daemon binary is $CORRAL_BIN, else target/debug/corral of this repository (build it with
`cargo build`; clients/run-client-tests.sh does). Its state (socket directory, log) lives in a
private directory under :func:`state_base`, never under /tmp: /tmp is a writable root of
workspace-write sessions by default, and the daemon refuses a session whose writable root contains
its own state. Nor in the repository, which may itself be a clone under /tmp.
"""

from __future__ import annotations

import atexit
import copy
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from corral_client import Client, CorralError

REPO = Path(__file__).resolve().parents[3]
TRANSCRIPT = REPO / "clients" / "fixtures" / "transcript.json"
EXAMPLES = REPO / "examples" / "python"
PLACEHOLDER = "@WORKSPACE@"


def corral_bin() -> Path:
    path = Path(os.environ.get("CORRAL_BIN") or REPO / "target" / "debug" / "corral")
    if not path.is_file():
        pytest.exit(f"corral binary not found at {path}: run `cargo build` (or set CORRAL_BIN)", returncode=2)
    return path


def _under_tmp(path: str) -> bool:
    tmp = os.path.realpath(tempfile.gettempdir())
    return any(path == t or path.startswith(t + "/") for t in ("/tmp", tmp))


def state_base() -> Path:
    """Where the test daemons keep their state and the tests make directories outside every
    writable root: $XDG_RUNTIME_DIR when it is set (and not under /tmp), else /var/tmp."""
    for candidate in (os.environ.get("XDG_RUNTIME_DIR"), "/var/tmp"):
        if not candidate:
            continue
        real = os.path.realpath(candidate)
        if os.path.isdir(real) and not _under_tmp(real):
            return Path(real)
    raise RuntimeError("no directory for the test daemons outside /tmp: set XDG_RUNTIME_DIR or create /var/tmp")


_PRIVATE_DIRS: set[Path] = set()


def private_dir(prefix: str = "corral-pytest-") -> Path:
    """A fresh private (0700) directory under :func:`state_base`; removed at exit if not before."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir=state_base()))
    _PRIVATE_DIRS.add(d)
    return d


def remove_private_dir(d: Path) -> None:
    shutil.rmtree(d, ignore_errors=True)
    _PRIVATE_DIRS.discard(d)


@atexit.register
def _remove_private_dirs() -> None:
    for d in list(_PRIVATE_DIRS):
        remove_private_dir(d)


class Daemon:
    """A running `corral serve`; SIGTERMed and reaped by stop()."""

    def __init__(
        self, listen: str | None = None, extra: tuple[str, ...] = (), client_kwargs: dict[str, Any] | None = None
    ):
        # client_kwargs: how to reach it when ready (TLS, a token).
        self.client_kwargs = dict(client_kwargs or {})
        self.dir = private_dir("corral-pytest-daemon-")
        self.socket = self.dir / "corral.sock"
        self.listen = listen or f"unix:{self.socket}"
        self.target = self.listen if listen else str(self.socket)
        self.log = self.dir / "daemon.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [str(corral_bin()), "serve", "--listen", self.listen, *extra],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = self.log_text()
                self.stop()
                raise RuntimeError(f"corral serve exited with {self.proc.returncode}:\n{log}")
            if not self.listen.startswith("unix:") or self.socket.exists():
                try:
                    with Client(self.target, timeout=2, **self.client_kwargs) as c:
                        if c.health() == "SERVING":
                            return
                except CorralError:
                    pass
            time.sleep(0.05)
        log = self.log_text()
        self.stop()
        raise RuntimeError(f"corral serve did not start:\n{log}")

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        remove_private_dir(self.dir)


def free_tcp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def daemon():
    d = Daemon()
    yield d
    d.stop()


@pytest.fixture(scope="session")
def client(daemon):
    with Client(daemon.target, timeout=60) as c:
        yield c


def session_env(home: Path) -> dict[str, str]:
    """PATH from the test's environment and HOME in the workspace (no personal rc files)."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home)}


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return Path(os.path.realpath(ws))


# -- the transcript -------------------------------------------------------------------------


def load_transcript() -> dict[str, Any]:
    with open(TRANSCRIPT, encoding="utf-8") as f:
        return json.load(f)


def substitute(value: Any, workspace: Path) -> Any:
    """Replaces @WORKSPACE@ everywhere in a JSON value."""
    if isinstance(value, str):
        return value.replace(PLACEHOLDER, str(workspace))
    if isinstance(value, list):
        return [substitute(v, workspace) for v in value]
    if isinstance(value, dict):
        return {k: substitute(v, workspace) for k, v in value.items()}
    return value


def unsubstitute(text: str, workspace: Path) -> str:
    return text.replace(str(workspace), PLACEHOLDER)


_DURATION = re.compile(r'"duration_seconds":[0-9.eE+-]+')
_WALL = re.compile(r"Wall time: [0-9.]+ seconds")


def normalize(text: str) -> str:
    """The only run-dependent numbers in model text: the shell tools' wall time."""
    return _WALL.sub("Wall time: 0 seconds", _DURATION.sub('"duration_seconds":0.0', text))


def normalize_item(item: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(item)
    for key in ("output", "content"):
        if isinstance(out.get(key), str):
            out[key] = normalize(out[key])
    return out


def populate(workspace: Path, files: dict[str, str]) -> None:
    for rel, content in files.items():
        path = workspace / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")


def open_transcript_session(client: Client, workspace: Path, settings: dict[str, Any]):
    """Opens the session the transcript asks for (OpenSessionRequest fields, snake_case)."""
    s = substitute(settings, workspace)
    return client.open_session(
        workspace,
        s.get("mode", "workspace-write"),
        writable_roots=s.get("writable_roots", ()),
        network_access=s.get("network_access", False),
        env=s.get("env") or session_env(workspace),
        exclude_tmpdir_env_var=s.get("exclude_tmpdir_env_var", False),
        exclude_slash_tmp=s.get("exclude_slash_tmp", False),
        shell_tool=s.get("shell_tool"),
        apply_patch_tool=s.get("apply_patch_tool"),
    )


def is_unsupported(output: str, item: dict[str, Any]) -> bool:
    """The daemon does not serve this item's tool yet (the transcript's `requires`)."""
    need = item.get("requires")
    return bool(need) and output == f"unsupported call: {need}"
