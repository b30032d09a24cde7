"""The kernels are compiled at install where a GPU and nvcc are present, so that a first run loads cubins instead of
waiting for nvcc (``inception_engine.cuda_build --at-install``: into the user's kernel cache, one line, never
failing the install). Everything else about the package is in pyproject.toml."""

import os
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPyAndKernels(build_py):
    def run(self) -> None:
        super().run()
        # cuda_build needs only the standard library, so it runs from the source tree in pip's build environment
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        try:
            subprocess.run([sys.executable, "-m", "inception_engine.cuda_build", "--at-install"], cwd=ROOT, env=env,
                           timeout=600, check=False)
        except (OSError, subprocess.SubprocessError) as e:
            print(f"inception-engine: kernels not built at install ({e}); they compile at the first run",
                  file=sys.stderr)


setup(cmdclass={"build_py": BuildPyAndKernels})
