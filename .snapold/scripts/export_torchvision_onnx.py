"""Export torchvision's pretrained Inception-V3 to ONNX, for ``inception-convert-weights``.

Run it on a machine with internet access and PyTorch + torchvision (the engine itself needs neither):

    pip install torch torchvision onnx          # plus onnxscript for --exporter dynamo
    python scripts/export_torchvision_onnx.py                       # -> inception_v3.onnx (TorchScript exporter)
    python scripts/export_torchvision_onnx.py --exporter dynamo     # torch.export-based exporter (torch >= 2.6)
    inception-convert-weights inception_v3.onnx                     # -> ~/.cache/inception-engine/inception_v3.npz

The model is ``torchvision.models.inception_v3(weights="IMAGENET1K_V1")`` in eval mode (so no auxiliary head, and
BatchNorm uses its running statistics), exported with a dynamic batch dimension, input ``image`` (N, 3, 299, 299)
normalised with the ImageNet mean/std, output ``logits`` (N, 1000). Those weights come with ``transform_input=True``
(torchvision re-normalises inside the model); the export keeps that step and the converter folds it away.
``--no-pretrained`` exports randomly initialised weights instead, to test the export path without a download.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from onnx_check import check_export, export  # scripts/, beside this file


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", default="inception_v3.onnx", help="ONNX file to write (default: %(default)s)")
    ap.add_argument("--exporter", choices=["torchscript", "dynamo"], default="torchscript",
                    help="torch.onnx.export(dynamo=False) or (dynamo=True) (default: %(default)s)")
    ap.add_argument("--opset", type=int, default=None,
                    help="ONNX opset (default: 17 for torchscript, 18 for dynamo)")
    ap.add_argument("--no-pretrained", action="store_true",
                    help="random weights, no download (checks the export path only)")
    args = ap.parse_args()

    try:
        import torch
        import torchvision
    except ImportError as e:
        raise SystemExit(f"error: this script needs PyTorch and torchvision ({e.name} is not installed): "
                         f"pip install torch torchvision onnx") from None

    weights = None if args.no_pretrained else "IMAGENET1K_V1"
    # init_weights only matters without pretrained weights; it silences torchvision's warning about the default.
    model = torchvision.models.inception_v3(weights=weights, init_weights=weights is None).eval()
    x = torch.randn(2, 3, 299, 299)
    out = Path(args.output)
    expected = export(model, x, out, args.exporter, args.opset)
    print(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB, {args.exporter} exporter, "
          f"torch {torch.__version__}, torchvision {torchvision.__version__}, "
          f"{'random' if weights is None else weights} weights)")

    check_export(out, x, expected, f"inception-convert-weights {out}")

if __name__ == "__main__":
    main()
