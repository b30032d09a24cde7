"""nvImageCodec's Python module as the GPU decoder uses it: found (``load_nvimgcodec``, with libnvjpeg loaded ahead
from its wheel), and its API in the shape the installed release has it (``CodecApi``).

Its API changed between releases: ``CodecApi`` finds what the installed one offers by looking at it, not at its
version number. Where it is missing, or lacks what the decoder needs, ``load_nvimgcodec`` and ``CodecApi.of`` raise
BackendUnavailable with one line.

nvImageCodec's own messages stay off the user's terminal. Its logger (the Python module's debug messenger) is
switched off through PYNVIMGCODEC_VERBOSITY=0 unless the user set that variable; what its extensions print
themselves with fprintf while they load (no log level reaches those: "Failed to load nvjpeg2k library! ...", the
same of nvTIFF, which a JPEG run never uses) is caught around the calls that load them (``quiet_stderr``): lines
about codecs the run does not use are dropped, one about nvJPEG, which it does use, becomes one line of ours, and
anything else (another thread's output meanwhile) is written out as it was.
"""

from __future__ import annotations

import ctypes
import os
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BackendUnavailable, first_line

# nvImageCodec's default (":fancy_upsampling=0") replicates chroma samples; libjpeg, hence Pillow, interpolates them.
DECODER_OPTIONS = ":fancy_upsampling=1"
MISSING = "--decode gpu needs nvidia-nvimgcodec-cu13 (pip install -e '.[gpu-decode]')"
SUPPORTED = "0.6.1 to 0.9.0"  # the releases run on the GPU machine; pyproject's gpu-decode extra admits these
VERBOSITY_ENV = "PYNVIMGCODEC_VERBOSITY"  # its Python module's log level, read at import; 0: no logger at all
# What nvImageCodec's extensions print about codecs a run of JPEGs never asks for (JPEG 2000, TIFF and the nvCOMP
# that nvTIFF uses), and the pip hint its messages end with.
UNUSED_CODEC_WORDS = ("nvjpeg2k", "nvjpeg2000", "nvtiff", "nvcomp", "nvimagecodec's python distribution")
NEEDED_CODEC_WORD = "nvjpeg"  # the codec --decode gpu runs on
_quiet = threading.Lock()  # one redirection of the process's stderr at a time


def load_nvimgcodec() -> Any:
    """The nvidia.nvimgcodec module, or BackendUnavailable in one line."""
    preload_nvjpeg()
    os.environ.setdefault(VERBOSITY_ENV, "0")  # its logger off, unless the user asked for it
    try:  # imported on use: an optional dependency (the gpu-decode extra), needed only off jpeg_batch.c's path
        with quiet_stderr():
            from nvidia import nvimgcodec
    except Exception as e:  # ImportError, or a broken install failing inside its own import (OSError, ...)
        raise BackendUnavailable(f"{MISSING}: {first_line(e)}") from None
    return nvimgcodec


@dataclass(frozen=True)
class CodecApi:
    """The parts of an installed nvImageCodec that GpuJpegDecoder uses, in the shape that release has them.

    Three shapes are handled, told apart by what the module holds (a release not seen here works where it keeps
    one of them):
    - 0.6: ``ColorSpec.RGB``; ``Decoder`` takes ``backends`` (a list of ``Backend``) or ``backend_kinds``.
    - 0.7, 0.8: ``ColorSpec.SRGB`` replaces ``RGB``; ``Decoder`` takes only ``backends``; ``decode``'s ``params``
      and ``cuda_stream`` are keyword-only (always passed so here).
    - 0.9: as 0.7, and ``DecodeParams`` takes a ``sample_format`` whose default (``I_AUTO_COMPONENTS``) gives a
      greyscale JPEG one channel: ``I_RGB`` asks for the three that the resize reads.
    Backends are always given as ``Backend`` objects (or not at all), the one form every shape takes."""

    module: Any
    version: str
    rgb: Any  # the ColorSpec member for RGB output
    interleaved_rgb: Any | None  # SampleFormat.I_RGB where DecodeParams takes a sample format, else None

    @classmethod
    def of(cls, module: Any) -> CodecApi:
        version = str(getattr(module, "__version__", "unknown"))
        missing = [name for name in ("Decoder", "DecodeParams", "CodeStream", "Backend", "BackendKind", "ColorSpec")
                   if not hasattr(module, name)]
        color_spec = getattr(module, "ColorSpec", None)
        rgb = getattr(color_spec, "SRGB", None) or getattr(color_spec, "RGB", None)
        if missing or rgb is None:
            what = ", ".join(missing) or "ColorSpec.SRGB or ColorSpec.RGB"
            raise BackendUnavailable(f"nvImageCodec {version} lacks {what}, which --decode gpu needs; install a "
                                     f"release this engine was run with ({SUPPORTED})")
        sample_format = getattr(module, "SampleFormat", None)
        interleaved = getattr(sample_format, "I_RGB", None) if sample_format is not None else None
        if interleaved is not None:
            try:
                module.DecodeParams(sample_format=interleaved)
            except TypeError:  # 0.7 and 0.8 have SampleFormat but DecodeParams takes none
                interleaved = None
        return cls(module, version, rgb, interleaved)

    def decode_params(self) -> Any:
        """Orientation as stored (the resize reads it upright: upright_views), 8-bit RGB."""
        kwargs: dict[str, Any] = {"apply_exif_orientation": False, "color_spec": self.rgb, "allow_any_depth": False}
        if self.interleaved_rgb is not None:
            kwargs["sample_format"] = self.interleaved_rgb
        return self.module.DecodeParams(**kwargs)

    def decoder(self, backends: Sequence[str] | None, options: str, threads: int = 0) -> Any:
        """threads: its host threads (0: one per CPU, nvImageCodec's default)."""
        kwargs: dict[str, Any] = {"options": options, "max_num_cpu_threads": threads}
        if backends is not None:
            kwargs["backends"] = [self.module.Backend(getattr(self.module.BackendKind, b)) for b in backends]
        with quiet_stderr():  # its extensions load here
            return self.module.Decoder(**kwargs)


def sort_output(text: str) -> tuple[str, str | None]:
    """What was written to stderr while nvImageCodec loaded: (what to write out as it was, our note or None). Lines
    about codecs the run does not use are dropped; those about nvJPEG make one note; the rest is kept."""
    kept, needed = [], []
    for line in text.splitlines(keepends=True):
        low = line.lower()
        if any(word in low for word in UNUSED_CODEC_WORDS):
            continue
        (needed if NEEDED_CODEC_WORD in low else kept).append(line)
    note = None
    if needed:
        said = " ".join(needed[0].split()).rstrip(".!")[:200]
        note = (f"note: nvImageCodec could not load all of nvJPEG, which --decode gpu decodes with ({said}); "
                f"`pip install -e '.[gpu-decode]'` installs it")
    return "".join(kept), note


@contextmanager
def quiet_stderr() -> Iterator[None]:
    """The process's standard error (file descriptor 2, where nvImageCodec's C++ prints) caught for the block, then
    sorted (sort_output): what is not nvImageCodec's noise is written out, after the block."""
    with _quiet, tempfile.TemporaryFile() as caught:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            kept, note = sort_output(caught.read().decode(errors="replace"))
            out = kept + (note + "\n" if note else "")
            if out:
                os.write(2, out.encode(errors="replace"))


def preload_nvjpeg() -> None:
    """Load libnvjpeg.so.13 from the nvidia-nvjpeg wheel, if installed, before nvImageCodec looks for it.

    nvImageCodec 0.6's nvJPEG extension dlopens "libnvjpeg.so.13" with a search path of its own directory's
    neighbours and /usr/local/cuda/lib64, which misses the wheel's nvidia/cu13/lib; a library already loaded under
    that name is what dlopen returns. Without the wheel nothing happens here (the CUDA toolkit's copy may serve)."""
    for entry in sys.path:
        lib = Path(entry or ".") / "nvidia" / "cu13" / "lib" / "libnvjpeg.so.13"
        if lib.is_file():
            ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
            return
