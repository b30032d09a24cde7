"""What both export scripts share: the export itself (either torch.onnx exporter, a dynamic batch) and the check
that follows it: the exported file run in onnxruntime on the batch PyTorch just ran, refused where the logits differ
(a broken export must never reach the converter)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def export(model: Any, x: Any, out: Path, exporter: str, opset: int | None) -> Any:
    """PyTorch's logits for ``x`` (NumPy), and ``model`` written to ``out`` by the torchscript or dynamo exporter,
    its input named "image", its output "logits", the batch dimension dynamic."""
    import torch

    out.parent.mkdir(parents=True, exist_ok=True)
    common: dict[str, Any] = dict(input_names=["image"], output_names=["logits"])
    with torch.no_grad():
        expected = model(x).numpy()
        if exporter == "torchscript":
            torch.onnx.export(model, (x,), str(out), dynamo=False, opset_version=opset or 17,
                              dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}}, **common)
        else:
            batch = torch.export.Dim("batch", min=1, max=4096)
            torch.onnx.export(model, (x,), str(out), dynamo=True, opset_version=opset or 18,
                              dynamic_shapes=({0: batch},), external_data=False, **common)
    return expected


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
