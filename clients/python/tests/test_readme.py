"""The README's processes example runs as written against a real daemon."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_processes_example_works(daemon, workspace):
    section = README.read_text(encoding="utf-8").split("## Processes", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    env = {**os.environ, "CORRAL_SOCKET": str(daemon.socket)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=workspace, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == "hello corral\n0 13\n"


def test_the_asyncio_example_works(daemon, workspace):
    (workspace / "README.md").write_text("# demo\nline two\nline three\nline four\n")
    section = README.read_text(encoding="utf-8").split("## asyncio", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    env = {**os.environ, "CORRAL_SOCKET": str(daemon.socket)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=workspace, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == "L1: # demo\nL2: line two\nL3: line three\none\ntwo\n"
