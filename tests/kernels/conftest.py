"""Fixtures of the kernel tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.emulator import build_emu_lib


@pytest.fixture(scope="session")
def backend_emu_lib(build_cache_dir) -> Path:
    """Every kernel the backend launches, compiled for the CPU emulator (helpers.emulator): the library that
    helpers.emulator.run_emulated loads in place of the GPU."""
    return build_emu_lib(build_cache_dir)
