"""What both export scripts do last: run the exported file in onnxruntime on the batch PyTorch just ran and refuse
it where the logits differ (a broken export must never reach the converter)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def check_export(out: Path, x: Any, expected: Any, next_step: str) -> None:
    """The file ``out`` against PyTorch's ``expected`` logits for the batch ``x`` (torch tensors), then the next
    command to run; SystemExit where they differ by more than 1e-3."""
    try:
        import onnxruntime as ort
    except ImportError:
        print("onnxruntime not installed: skipped the check of the exported file against PyTorch")
        return
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    err = float(abs(got - expected).max())
    print(f"onnxruntime vs PyTorch on a random batch of 2: max |difference| of logits {err:.2e}")
    if err > 1e-3:
        raise SystemExit("error: the exported model does not reproduce PyTorch's logits; do not convert it")
    print(f"next: {next_step}")
