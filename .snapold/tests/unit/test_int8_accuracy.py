"""dev/int8_accuracy.py's comparison, small: our 8-bit reference is at least as close to fp32 as onnxruntime's
quantize_static of the same model with the same calibration images (issue 49's bar), on a few held-out images."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")

SCRIPT = Path(__file__).resolve().parents[2] / "dev" / "int8_accuracy.py"


def test_int8_reference_is_as_close_to_fp32_as_onnxruntime():
    spec = importlib.util.spec_from_file_location("int8_accuracy", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    fp32, ort_fp32, ours, ort = module.compare(calibration=8, held_out=8)
    assert fp32.cos_fp32 == 1.0 and ort_fp32.cos_fp32 > 0.99999  # the two fp32 networks are the same network
    assert ours.cos_fp32 > 0.99 and ours.cos_fp32 >= ort.cos_fp32 - 1e-3
    assert ours.rel_l2_f64 <= 1.1 * ort.rel_l2_f64
