"""Fixtures of the kernel tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.emulator import build_emu_lib



@pytest.fixture(scope="module")
def backend_emu_lib(tmp_path_factory) -> Path:
    """Every kernel the backend launches, compiled for the CPU emulator (helpers.emulator): the library that
    helpers.emulator.run_emulated loads in place of the GPU."""
    return build_emu_lib(tmp_path_factory.mktemp("emu"))
