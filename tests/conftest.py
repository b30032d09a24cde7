"""Shared fixtures. GPU tests (marked ``gpu``) skip with the reason when no GPU is usable."""

from __future__ import annotations

import functools

import pytest


@functools.cache
def gpu_unavailable_reason() -> str | None:
    try:
        import pycuda.driver as drv  # noqa: F401
    except ImportError:
        return "pycuda is not installed (pip install '.[gpu]')"
    try:
        drv.init()
        if drv.Device.count() == 0:
            return "no CUDA device"
    except Exception as e:  # the driver's own error says why (no driver, no device)
        return f"CUDA driver unusable: {e}"
    return None


def pytest_collection_modifyitems(config, items):
    reason = None
    for item in items:
        if "gpu" in item.keywords:
            reason = reason or gpu_unavailable_reason()
            if reason:
                item.add_marker(pytest.mark.skip(reason=f"no GPU: {reason}"))
