"""nvImageCodec stood in for by Pillow, decoding into device memory (pycuda), for GpuJpegDecoder's host side."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from PIL import Image

from inception_engine.backends.cuda.device import driver
from inception_engine.ingest import nvimgcodec


class FakeImage:
    """What nvImageCodec returns: a device array, rows padded to a multiple of 64 bytes like a pitched allocation."""

    def __init__(self, a: np.ndarray):
        h, w, _ = a.shape
        self.pitch = -(-w * 3 // 64) * 64
        rows = np.zeros((h, self.pitch), np.uint8)
        rows[:, :w * 3] = a.reshape(h, -1)
        self.alloc = driver().mem_alloc(rows.nbytes)
        driver().memcpy_htod(int(self.alloc), rows)
        self.__cuda_array_interface__ = {"shape": (h, w, 3), "typestr": "|u1", "data": (int(self.alloc), False),
                                         "strides": (self.pitch, 3, 1), "version": 3}


class FakeCodec:
    """nvidia.nvimgcodec's surface as gpu_decode uses it. Decodes with Pillow, no EXIF rotation (the decoder asks
    for none), greyscale as RGB. Like nvImageCodec on a batch holding an unparsable stream, raises for the batch."""

    class BackendKind:
        GPU_ONLY = "GPU_ONLY"

    class Backend:
        def __init__(self, backend_kind: Any):
            self.backend_kind = backend_kind

    class ColorSpec:
        RGB = "RGB"

    class DecodeParams:
        def __init__(self, **kwargs: Any):
            assert kwargs["apply_exif_orientation"] is False
            self.kwargs = kwargs

    class CodeStream:
        def __init__(self, data: bytes):
            self.data = data

    class Decoder:
        calls: list[int] = []

        def __init__(self, backends: Any = None, options: str = "", max_num_cpu_threads: int = 0):
            assert options == nvimgcodec.DECODER_OPTIONS

        @staticmethod
        def one(cs: Any) -> FakeImage | None:
            try:
                with Image.open(io.BytesIO(cs.data)) as img:
                    img.load()
                    return FakeImage(np.asarray(img.convert("RGB")))
            except OSError:
                return None

        def decode(self, src: Any, params: Any = None, cuda_stream: int = 0) -> Any:
            assert isinstance(cuda_stream, int)
            if not isinstance(src, list):
                return self.one(src)
            FakeCodec.Decoder.calls.append(len(src))
            if any(cs.data.startswith(b"\xff\xd8\xff\xfe") for cs in src):  # the test's "unparsable" JPEG
                raise RuntimeError("nvImageCodec: cannot parse code stream")
            return [self.one(cs) for cs in src]
