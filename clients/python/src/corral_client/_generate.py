"""Generates the gRPC stubs in ``corral_client/_proto`` from corral's ``.proto`` files.

It runs automatically when the package is built (``pip install ./clients/python`` calls it from
``setup.py``), and by hand for a development checkout::

    python -m corral_client._generate [PROTO_DIR]

PROTO_DIR is the directory that holds ``corral/v1/corral.proto``: the argument, else ``$CORRAL_PROTO_DIR``,
else the ``proto/`` directory of the corral repository this file sits in. Needs ``grpcio-tools``.

This module imports nothing but the standard library and ``grpc_tools``, so the build hook can load
it by path before the package is installed.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT_DIR = HERE / "_proto"
PACKAGE = ("corral", "v1")
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
# The public API only (worker.proto beside it is the daemon's internal worker protocol).
PUBLIC_PROTOS = ("corral/v1/corral.proto",)


def find_proto_dir(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """The directory holding ``corral/v1/corral.proto``, or None when there is none to be found."""
    candidates: list[Path] = []
    if explicit:
        candidates.append(Path(explicit))
    if os.environ.get("CORRAL_PROTO_DIR"):
        candidates.append(Path(os.environ["CORRAL_PROTO_DIR"]))
    # clients/python/src/corral_client/_generate.py -> the repository root is four levels up.
    for parent in HERE.parents:
        candidates.append(parent / "proto")
    for dir_ in candidates:
        if all(dir_.joinpath(p).is_file() for p in PUBLIC_PROTOS):
            return dir_.resolve()
    return None


def generated_files(out_dir: Path = OUT_DIR) -> list[Path]:
    return sorted(p for p in out_dir.iterdir() if p.name.endswith(GENERATED_SUFFIXES))


def generate(proto_dir: str | os.PathLike[str] | None = None, out_dir: Path = OUT_DIR) -> list[Path]:
    """Runs protoc (from grpcio-tools) and writes the stubs into ``out_dir``; returns their paths."""
    root = find_proto_dir(proto_dir)
    if root is None:
        raise FileNotFoundError(
            "corral's proto files were not found: pass the directory holding corral/v1/corral.proto, "
            "or set CORRAL_PROTO_DIR"
        )
    try:
        from grpc_tools import protoc
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise RuntimeError("generating corral's stubs needs grpcio-tools: pip install grpcio-tools") from e

    protos = list(PUBLIC_PROTOS)
    well_known = Path(protoc.__file__).resolve().parent / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "grpc_tools.protoc",
            f"-I{root}",
            f"-I{well_known}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *protos,
        ]
        status = protoc.main(args)
        if status != 0:
            raise RuntimeError(f"protoc failed with status {status}: {' '.join(args)}")
        src = Path(tmp).joinpath(*PACKAGE)
        out_dir.mkdir(parents=True, exist_ok=True)
        for old in generated_files(out_dir):
            old.unlink()
        written = []
        # protoc writes absolute imports (`from corral.v1 import corral_pb2`); the stubs live inside
        # corral_client._proto, so make them relative.
        absolute = re.compile(r"^from corral\.v1 import ", re.M)
        for f in sorted(src.iterdir()):
            if not f.name.endswith(GENERATED_SUFFIXES):
                continue
            text = absolute.sub("from . import ", f.read_text(encoding="utf-8"))
            dest = out_dir / f.name
            dest.write_text(text, encoding="utf-8")
            written.append(dest)
    init = out_dir / "__init__.py"
    if not init.exists():
        init.write_text('"""Stubs generated from corral\'s proto files."""\n', encoding="utf-8")
    return written


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) > 1 or (argv and argv[0] in ("-h", "--help")):
        print(__doc__)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    for path in generate(argv[0] if argv else None):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
