"""Whether a CUDA GPU is usable here, and if not why: the gpu mark's skip reason (conftest.py)."""

from __future__ import annotations

import functools


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
