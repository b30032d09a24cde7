"""The kernels that are no layer of the forward: timing.cu's gpu_sleep (CudaBackend.time_layers holds the GPU with
it), pipeline_io.cu's ends of the streaming pipeline (cuda_runner.py: normalise uint8 batches, softmax and top-k) and
resize_pil.cu's Pillow-exact resize (ingest/gpu_resize.py, a job table a launch), resize_fid.cu's pytorch-fid and
clean-fid resizes (ingest/gpu_fid_resize.py). Their launches are their users'."""

from __future__ import annotations

from collections.abc import Iterator

from ..tiles import THREADS
from .spec import KernelSpec, Signature, registry

SOURCES = ("timing.cu", "pipeline_io.cu", "resize_pil.cu", "resize_fid.cu")
TOPK_THREADS = 1024  # pipeline_io.cu's TOPK_N: softmax_topk_rows' block, a thread for each class it sorts


def entries() -> Iterator[KernelSpec]:
    yield KernelSpec("gpu_sleep", "timing.cu", Signature.of("q: ns"), 1)
    yield KernelSpec("normalize_u8_nchw", "pipeline_io.cu", Signature.of("P: x y mean_std", "i: hw y_bstride"),
                     THREADS)
    yield KernelSpec("softmax_topk_rows", "pipeline_io.cu", Signature.of("P: z prob index", "i: cols z_bstride k"),
                     TOPK_THREADS)
    for name in ("resize_pil_h", "resize_pil_v"):
        yield KernelSpec(name, "resize_pil.cu", Signature.of("P: jobs"), THREADS)
    yield KernelSpec("resize_fid_bilinear", "resize_fid.cu", Signature.of("P: jobs y mean_std", "i: size y_bstride"),
                     THREADS)
    yield KernelSpec("resize_clean_first", "resize_fid.cu", Signature.of("P: jobs"), THREADS)
    yield KernelSpec("resize_clean_second", "resize_fid.cu", Signature.of("P: jobs y mean_std", "i: y_bstride"),
                     THREADS)


KERNELS = registry(entries())
