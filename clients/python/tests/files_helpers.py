"""Shared by the files tests: one call shape for the sync and the async client, local trees to
send, and a comparison of two trees (kinds, permission bits, contents, link targets)."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path
from typing import Any

from corral_client import Client
from corral_client.aio import AsyncClient


class Api:
    """``session.files.<verb>(...)`` on a session attached by id, through either client: the
    async one runs each call in its own event loop and client."""

    def __init__(self, kind: str, target: str, session_id: str):
        self.kind, self.target, self.session_id = kind, target, session_id

    def __call__(self, verb: str, *args: Any, **kwargs: Any) -> Any:
        if self.kind == "sync":
            with Client(self.target, timeout=60) as c:
                return getattr(c.session(self.session_id).files, verb)(*args, **kwargs)

        async def go():
            async with AsyncClient(self.target, timeout=60) as c:
                return await getattr(c.session(self.session_id).files, verb)(*args, **kwargs)

        return asyncio.run(asyncio.wait_for(go(), 120))


def make_tree(root: Path, big: int = 0) -> Path:
    """A directory with what a transfer must keep: permission bits, an empty file, nested
    directories (one read-only), a symlink and a dangling one; ``big`` bytes in big.bin."""
    root.mkdir()
    (root / "a.txt").write_text("hello\n")
    os.chmod(root / "a.txt", 0o640)
    (root / "bin").mkdir()
    (root / "bin" / "run.sh").write_text("#!/bin/sh\necho run\n")
    os.chmod(root / "bin" / "run.sh", 0o755)
    (root / "empty").write_bytes(b"")
    os.chmod(root / "empty", 0o600)
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "sub" / "deeper" / "f.bin").write_bytes(bytes(range(256)) * 3)
    (root / "ro").mkdir()
    (root / "ro" / "x").write_text("x")
    os.chmod(root / "ro" / "x", 0o444)
    os.chmod(root / "ro", 0o555)
    os.symlink("a.txt", root / "link")
    os.symlink("nowhere/x", root / "dangling")
    if big:
        (root / "big.bin").write_bytes(os.urandom(big))
    os.chmod(root, 0o750)
    return root


def snapshot(root: Path) -> dict[str, tuple]:
    """Every node under ``root`` (itself as ""): (kind, permission bits, content or target)."""
    out: dict[str, tuple] = {}

    def visit(rel: str, path: Path) -> None:
        st = os.lstat(path)
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISLNK(st.st_mode):
            out[rel] = ("link", os.readlink(path))
        elif stat.S_ISDIR(st.st_mode):
            out[rel] = ("dir", mode)
            for name in sorted(os.listdir(path)):
                visit(f"{rel}/{name}" if rel else name, path / name)
        elif stat.S_ISREG(st.st_mode):
            out[rel] = ("file", mode, path.read_bytes())
        else:
            out[rel] = ("other",)

    visit("", root)
    return out


def make_writable(root: Path) -> None:
    """So pytest can remove a tree with read-only directories."""
    for dirpath, dirnames, _ in os.walk(root):
        for d in dirnames:
            p = os.path.join(dirpath, d)
            if not os.path.islink(p):
                os.chmod(p, 0o755)
