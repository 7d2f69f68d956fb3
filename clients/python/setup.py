"""Build hook: generate the gRPC stubs from corral's proto files before setuptools builds.

Every build (``pip install ./clients/python``, a wheel, an sdist) first runs
``src/corral_client/_generate.py`` with the build environment's grpcio-tools, so the stubs always
match ``proto/``. Where there is no proto directory to be found (building from an sdist, which
already carries the generated modules) the existing stubs are used. Everything else, the
dependency ranges included, is static in pyproject.toml.
"""

import importlib.util
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
GEN = HERE / "src" / "corral_client" / "_generate.py"


def _generate():
    spec = importlib.util.spec_from_file_location("_corral_generate", GEN)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    if gen.find_proto_dir() is not None:
        gen.generate()
    missing = set(gen.GENERATED) - {p.name for p in gen.generated_files()}
    if missing:
        raise SystemExit(
            f"corral-client: no proto files and no generated stubs ({', '.join(sorted(missing))}). Build "
            "from the corral repository (clients/python) or set CORRAL_PROTO_DIR to the directory "
            "holding corral/v1/corral.proto."
        )


class BuildPy(build_py):
    """build_py that starts from an empty package directory: setuptools reuses build/lib between
    in-tree builds, and a module removed from the source (or a stub no longer generated) must not
    linger in the wheel."""

    def run(self):
        shutil.rmtree(Path(self.build_lib) / "corral_client", ignore_errors=True)
        super().run()


_generate()
setup(cmdclass={"build_py": BuildPy})
