"""Build hook: generate the gRPC stubs from corral's proto files before setuptools builds.

Every build (``pip install ./clients/python``, a wheel, an sdist) first runs
``src/corral_client/_generate.py`` with the build environment's grpcio-tools, so the stubs always
match ``proto/``. Where there is no proto directory to be found (building from an sdist, which
already carries the generated modules) the existing stubs are used. The runtime dependencies get
minimum versions from the generated code: its gencode checks that the installed grpcio and
protobuf are at least the versions that generated it.
"""

import importlib.util
import re
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
GEN = HERE / "src" / "corral_client" / "_generate.py"


def _generator():
    spec = importlib.util.spec_from_file_location("_corral_generate", GEN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _stubs():
    gen = _generator()
    if gen.find_proto_dir() is not None:
        gen.generate()
    stubs = {p.name: p for p in gen.generated_files()}
    if "corral_pb2.py" not in stubs or "corral_pb2_grpc.py" not in stubs:
        raise SystemExit(
            "corral-client: no proto files and no generated stubs. Build from the corral repository "
            "(clients/python) or set CORRAL_PROTO_DIR to the directory holding corral/v1/corral.proto."
        )
    return stubs


def _dependencies(stubs):
    pb2 = stubs["corral_pb2.py"].read_text(encoding="utf-8")
    grpc = stubs["corral_pb2_grpc.py"].read_text(encoding="utf-8")
    protobuf = re.search(r"^# Protobuf Python Version: ([0-9][0-9.]*)", pb2, re.M)
    grpcio = re.search(r"^GRPC_GENERATED_VERSION = '([0-9][0-9.]*)'", grpc, re.M)
    return [
        f"grpcio>={grpcio.group(1) if grpcio else '1.66'}",
        f"protobuf>={protobuf.group(1) if protobuf else '5.26.1'}",
        "grpcio-status>=1.66",
    ]


class BuildPy(build_py):
    """build_py that starts from an empty package directory: setuptools reuses build/lib between
    in-tree builds, and a module removed from the source (or a stub no longer generated) must not
    linger in the wheel."""

    def run(self):
        shutil.rmtree(Path(self.build_lib) / "corral_client", ignore_errors=True)
        super().run()


setup(install_requires=_dependencies(_stubs()), cmdclass={"build_py": BuildPy})
