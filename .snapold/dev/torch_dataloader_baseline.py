"""The yardstick of issue 19: what a PyTorch user writes to classify a folder (Dataset + DataLoader + torchvision).

    python dev/torch_dataloader_baseline.py DIR WEIGHTS.npz [--fp16] [--batch-size 128] [--workers 16]

Loads the engine's weight file into torchvision's inception_v3 (each conv's folded BatchNorm as an identity BN with
the bias), then the plain loop: decode + Resize(342) + CenterCrop(299) + ToTensor + Normalize in DataLoader worker
processes with pinned memory, forward, softmax, top 5. PyTorch's defaults stay (cuDNN picks TF32 for fp32 convs,
as any such script gets; --no-tf32 turns that off). --fp16: half precision and channels_last, the usual speed-up.
Prints one JSON line:
images/s over the whole folder (first batch included, as a user waits for it) and the top-1 class per image.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from inception_engine.model_files import load_weights  # noqa: E402

if TYPE_CHECKING:
    import torch

# torch and torchvision are imported where used: --help answers without them.


class Folder:
    """A map-style dataset (what DataLoader indexes): each file's tensor after torchvision's transforms."""

    def __init__(self, paths: list[Path]):
        from torchvision import transforms

        self.paths = paths
        self.tf = transforms.Compose([transforms.Resize(342), transforms.CenterCrop(299), transforms.ToTensor(),
                                      transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.tf(Image.open(self.paths[i]).convert("RGB"))


def torchvision_model(weights_path: str) -> torch.nn.Module:
    """torchvision's Inception-V3 holding the engine's (BatchNorm-folded) weights."""
    import torch
    import torchvision

    w = load_weights(weights_path)
    model = torchvision.models.inception_v3(weights=None, aux_logits=False, init_weights=False)
    state = {}
    for name, module in model.named_modules():
        if isinstance(module, torchvision.models.inception.BasicConv2d):
            state[f"{name}.conv.weight"] = torch.from_numpy(w.arrays[f"{name}.weight"])
            bn = module.bn
            state[f"{name}.bn.weight"] = torch.ones_like(bn.weight)
            state[f"{name}.bn.bias"] = torch.from_numpy(w.arrays[f"{name}.bias"])
            state[f"{name}.bn.running_mean"] = torch.zeros_like(bn.running_mean)
            state[f"{name}.bn.running_var"] = torch.full_like(bn.running_var, 1.0 - bn.eps)  # sqrt(var + eps) = 1
            state[f"{name}.bn.num_batches_tracked"] = bn.num_batches_tracked
    state["fc.weight"] = torch.from_numpy(w.arrays["fc.weight"])
    state["fc.bias"] = torch.from_numpy(w.arrays["fc.bias"])
    model.load_state_dict(state)
    return model.eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("weights")
    ap.add_argument("--fp16", action="store_true")
    ap.add_argument("--no-tf32", action="store_true", help="true float32 convolutions (PyTorch's default is TF32)")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--workers", type=int, default=16)
    args = ap.parse_args()
    import torch

    paths = sorted(p for p in Path(args.dir).iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    if args.no_tf32:
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    model = torchvision_model(args.weights).cuda()
    if args.fp16:
        model = model.half().to(memory_format=torch.channels_last)
    loader = torch.utils.data.DataLoader(Folder(paths), batch_size=args.batch_size, num_workers=args.workers,
                                         pin_memory=True)
    top1: list[int] = []
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    with torch.inference_mode():
        for x in loader:
            x = x.cuda(non_blocking=True)
            if args.fp16:
                x = x.half().to(memory_format=torch.channels_last)
            top1 += model(x).float().softmax(1).topk(5).indices[:, 0].tolist()
    seconds = time.perf_counter() - t0
    print(json.dumps({"images": len(paths), "seconds": seconds, "images_per_s": len(paths) / seconds,
                      "gpu_peak_mib": torch.cuda.max_memory_allocated() / 2**20, "top1": top1,
                      "host_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "worker_peak_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
                      "paths": [str(p) for p in paths]}))


if __name__ == "__main__":
    main()
