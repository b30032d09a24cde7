"""The input side's named choices, NumPy-free so that the command line lists them without loading the input side:
whose preprocessing (fid_resize.py computes the FID tools' resizes, images.py torchvision's) and what the decode
workers run in (workers.py)."""

from __future__ import annotations

RESIZE_MODES = ("torchvision", "pytorch-fid", "clean-fid")
WORKER_KINDS = ("auto", "thread", "process")
