"""clients/run-client-tests.sh runs every suite even when one fails, then fails naming them: here
with stand-ins for node, npm and the venvs' python, the Node suites failing."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from conftest import REPO

SCRIPT = REPO / "clients" / "run-client-tests.sh"


def _stub(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


def test_a_failing_suite_does_not_hide_the_others(tmp_path):
    bin_dir, target, log = tmp_path / "bin", tmp_path / "target", tmp_path / "calls.log"
    _stub(bin_dir / "node", "exit 1")
    _stub(bin_dir / "npm", f'echo "npm $*" >> {log}; exit 1')
    python = f'echo "$0 $*" >> {log}; [ "$1" = - ] && cat >/dev/null; exit 0'
    for venv in ("pyvenv", "pyvenv-lower"):
        _stub(target / venv / "bin" / "python", python)
        _stub(target / venv / "bin" / "pip", python)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "CORRAL_BIN": "/bin/true",
        "CARGO_TARGET_DIR": str(target),
    }
    r = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "run-client-tests: FAILED: 2 of 4 suites: node; node (lower bounds)" in r.stderr, r.stderr
    calls = log.read_text()
    # The Python suites ran after the Node ones had failed: pytest in both venvs.
    assert calls.count("-m pytest") == 2, calls
    assert f"{target}/pyvenv-lower/bin/python -m pytest" in calls, calls


def test_all_green_says_so(tmp_path):
    bin_dir, target = tmp_path / "bin", tmp_path / "target"
    _stub(bin_dir / "node", 'echo "a@1"')
    _stub(bin_dir / "npm", "exit 0")
    python = '[ "$1" = - ] && cat >/dev/null; exit 0'
    for venv in ("pyvenv", "pyvenv-lower"):
        _stub(target / venv / "bin" / "python", python)
        _stub(target / venv / "bin" / "pip", python)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "CORRAL_BIN": "/bin/true",
           "CARGO_TARGET_DIR": str(target)}  # fmt: skip
    r = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.rstrip().endswith("run-client-tests: all 4 suites passed (node node (lower bounds) python python (lower bounds))")
    assert os.path.isdir(target)
