"""Export pytorch-fid's FID Inception (the network FID is computed with) to ONNX, for ``inception-convert-weights``.

Run it where PyTorch and pytorch-fid are installed (the engine itself needs neither):

    pip install torch torchvision pytorch-fid onnx onnxruntime
    python scripts/export_pytorch_fid_onnx.py                      # -> pt_inception_fid.onnx
    inception-convert-weights pt_inception_fid.onnx -o fid_inception.npz
    inception-fid real/ generated/ --weights fid_inception.npz

The module is pytorch-fid's own ``pytorch_fid.inception.fid_inception_v3()``: torchvision's Inception3 with 1008
classes and pytorch-fid's FIDInceptionA/C/E_1/E_2 blocks (average pools that exclude padding, a max pool in the
last block's pool branch), its weights pytorch-fid's port of TF's 2015 graph, ``pt_inception-2015-12-05-6726825d.pth``
(downloaded by pytorch-fid into torch's hub cache at the first call; ``--state-dict FILE`` takes a copy already
downloaded instead). Exported in eval mode with a dynamic batch: input ``image`` (N, 3, 299, 299) already scaled to
[-1, 1] (pytorch-fid's ``normalize_input``: 2x - 1, which the converter records as mean = std = 0.5), output
``logits`` (N, 1008); the pool features are the classifier's input. pytorch-fid's resize to 299x299 is not part of
the export: ``inception-fid --resize pytorch-fid`` (the default for this network) does it as pytorch-fid does.
``--no-pretrained`` exports the same modules with random weights, to test the export path without a download.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from onnx_check import check_export, export  # scripts/, beside this file
from typing import Any

# pytorch_fid.inception.fid_inception_v3's blocks, in order: (attribute, block class, arguments)
FID_BLOCKS = (("Mixed_5b", "FIDInceptionA", (192, 32)), ("Mixed_5c", "FIDInceptionA", (256, 64)),
              ("Mixed_5d", "FIDInceptionA", (288, 64)), ("Mixed_6b", "FIDInceptionC", (768, 128)),
              ("Mixed_6c", "FIDInceptionC", (768, 160)), ("Mixed_6d", "FIDInceptionC", (768, 160)),
              ("Mixed_6e", "FIDInceptionC", (768, 192)), ("Mixed_7b", "FIDInceptionE_1", (1280,)),
              ("Mixed_7c", "FIDInceptionE_2", (2048,)))


def fid_module(pretrained: bool, state_dict: str | None) -> Any:
    """pytorch-fid's FID Inception in eval mode: its own fid_inception_v3() (weights downloaded by pytorch-fid), or
    the same modules with random weights, or with the weights of a local copy of the .pth file."""
    import torch
    import torchvision
    from pytorch_fid import inception as pf

    if pretrained and state_dict is None:
        return pf.fid_inception_v3().eval()
    model = torchvision.models.inception_v3(weights=None, aux_logits=False, num_classes=1008, init_weights=True)
    for name, block, blockargs in FID_BLOCKS:
        setattr(model, name, getattr(pf, block)(*blockargs))
    if state_dict is not None:
        model.load_state_dict(torch.load(state_dict, map_location="cpu", weights_only=True))
    return model.eval()


def random_fid_module(seed: int = 0) -> Any:
    """The same modules with random weights of realistic scale, for checks where the real weights cannot be had
    (tests/e2e/test_pytorch_fid_agreement.py, dev/bench_fid.py): He-initialised convolutions, random BatchNorm
    statistics and affine terms, a fc of unit-variance outputs, so that activations stay O(1) through the network
    as with the real weights (torchvision's own initialisation shrinks them layer by layer). Seeded: the same
    ``seed`` gives the same weights on any machine with the same torch."""
    import torch

    torch.manual_seed(seed)
    model = fid_module(pretrained=False, state_dict=None)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.Conv2d):
                torch.nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
            elif isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.6, 1.4)
                m.bias.uniform_(-0.1, 0.3)
            elif isinstance(m, torch.nn.Linear):
                torch.nn.init.normal_(m.weight, std=2048 ** -0.5)
    return model.eval()


def pytorch_fid_on_this_scipy() -> None:
    """pytorch-fid 0.3.0 computes its FID with ``scipy.linalg.sqrtm(A, disp=False)``, a keyword SciPy 1.18 removed
    (TypeError there). Where SciPy lacks it, pytorch-fid's module reference is given a sqrtm that takes it and returns
    what the old one did with disp=False: (the root, its relative Frobenius residual). The root is SciPy's own."""
    import inspect

    import numpy as np
    from pytorch_fid import fid_score
    from scipy import linalg

    sqrtm = linalg.sqrtm
    if "disp" in inspect.signature(sqrtm).parameters:
        return

    def sqrtm_with_disp(a: Any, disp: bool = True, blocksize: int = 64) -> Any:
        root = sqrtm(a)
        if disp:
            return root
        return root, float(np.linalg.norm(root @ root - a, "fro") / np.linalg.norm(a, "fro"))

    fid_score.linalg = type("linalg", (), {"sqrtm": staticmethod(sqrtm_with_disp)})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", default="pt_inception_fid.onnx", help="ONNX file to write (default: %(default)s)")
    ap.add_argument("--exporter", choices=["torchscript", "dynamo"], default="torchscript",
                    help="torch.onnx.export(dynamo=False) or (dynamo=True) (default: %(default)s)")
    ap.add_argument("--opset", type=int, default=None, help="ONNX opset (default: 17 for torchscript, 18 for dynamo)")
    ap.add_argument("--state-dict", metavar="FILE.pth",
                    help="pt_inception-2015-12-05-6726825d.pth downloaded already (else pytorch-fid downloads it)")
    ap.add_argument("--no-pretrained", action="store_true",
                    help="random weights, no download (checks the export path only)")
    args = ap.parse_args()  # --help works without torch: it is imported only from here on

    try:
        import torch
        import pytorch_fid
    except ImportError as e:
        raise SystemExit(f"error: this script needs PyTorch and pytorch-fid ({e.name} is not installed): "
                         f"pip install torch torchvision pytorch-fid onnx") from None

    model = fid_module(not args.no_pretrained, args.state_dict)
    x = torch.rand(2, 3, 299, 299) * 2 - 1  # pytorch-fid's network input: [-1, 1]
    out = Path(args.output)
    expected = export(model, x, out, args.exporter, args.opset)
    weights = "random" if args.no_pretrained else args.state_dict or "pytorch-fid's pt_inception-2015-12-05"
    print(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB, {args.exporter} exporter, torch {torch.__version__}, "
          f"pytorch-fid {getattr(pytorch_fid, '__version__', '?')}, {weights} weights)")
    check_export(out, x, expected, f"inception-convert-weights {out} -o fid_inception.npz")

if __name__ == "__main__":
    main()
