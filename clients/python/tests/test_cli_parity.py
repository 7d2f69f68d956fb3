"""Cross-language: the Rust CLI (`corral invoke … --json`) and this client give the same outputs.

The transcript's calls run twice, each in a fresh copy of its workspace: once through
`corral invoke NAME ARGS --socket S --session ID --json`, once through Session.invoke. Outputs are
compared with the workspace path put back as @WORKSPACE@ and the shell wall time normalised.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from conftest import (
    corral_bin,
    load_transcript,
    normalize,
    open_transcript_session,
    populate,
    substitute,
    unsubstitute,
)

TRANSCRIPT = load_transcript()


def _fresh(tmp_path: Path, name: str) -> Path:
    ws = tmp_path / name
    ws.mkdir()
    ws = Path(os.path.realpath(ws))
    populate(ws, substitute(TRANSCRIPT["files"], ws))
    return ws


def _cli_invoke(daemon, session_id: str, call: dict) -> dict:
    freeform = call["type"] == "custom_tool_call"
    args = [
        str(corral_bin()),
        "invoke",
        call["name"],
        call["input"] if freeform else call["arguments"],
        "--socket",
        daemon.target,
        "--session",
        session_id,
        "--call-id",
        call["call_id"],
        "--json",
    ]
    if freeform:
        args.append("--freeform")
    run = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    # Exit 0 on success, 1 when the tool reports failure; 2 is a CLI/RPC error.
    assert run.returncode in (0, 1), f"{args}: exit {run.returncode}: {run.stderr}"
    return json.loads(run.stdout)


def test_cli_and_python_agree(daemon, client, tmp_path):
    ws_cli = _fresh(tmp_path, "cli")
    ws_py = _fresh(tmp_path, "py")
    with (
        open_transcript_session(client, ws_cli, TRANSCRIPT["session"]) as s_cli,
        open_transcript_session(client, ws_py, TRANSCRIPT["session"]) as s_py,
    ):
        compared = 0
        for item in TRANSCRIPT["items"]:
            call_cli = substitute(item["input"], ws_cli)
            call_py = substitute(item["input"], ws_py)
            via_cli = _cli_invoke(daemon, s_cli.id, call_cli)
            freeform = call_py["type"] == "custom_tool_call"
            via_py = s_py.invoke(
                call_py["name"],
                call_py["input"] if freeform else call_py["arguments"],
                call_id=call_py["call_id"],
                freeform=freeform,
            )
            assert via_cli["call_id"] == via_py.call_id == call_py["call_id"]
            assert via_cli["success"] == via_py.success, call_py["call_id"]
            assert normalize(unsubstitute(via_cli["output"], ws_cli)) == normalize(
                unsubstitute(via_py.output, ws_py)
            ), call_py["call_id"]
            compared += 1
        assert compared == len(TRANSCRIPT["items"])
    # Both workspaces end up the same.
    for rel in sorted(p.relative_to(ws_py) for p in ws_py.rglob("*") if p.is_file()):
        assert (ws_cli / rel).read_bytes() == (ws_py / rel).read_bytes(), rel
