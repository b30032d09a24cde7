"""The host ring: ``slots`` decoded images (images.Preprocess.decoded_shape) that decode workers write and a runner
copies out (image number ``seq`` goes to slot ``seq % slots``)."""

from __future__ import annotations

import mmap
import os
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .images import Preprocess


class HostRing:
    """``slots`` decoded images: anonymous memory for thread workers; for process workers an
    anonymous shared file (Linux memfd) that each worker maps through a descriptor handed over at its start. It has
    no name: nothing is left in /dev/shm whatever ends the run (SIGKILL included), and a small /dev/shm (a
    container's 64 MB) does not bound it."""

    def __init__(self, slots: int, pre: Preprocess, shared: bool):
        """Slots of images decoded as ``pre`` decodes them (its decoded_shape and pixel_dtype)."""
        shape, dtype = (slots, *pre.decoded_shape), pre.pixel_dtype
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        self.fd: int | None = None
        self._map: mmap.mmap | None = None
        if shared:
            self.fd = os.memfd_create("inception-ring", os.MFD_CLOEXEC)
            os.ftruncate(self.fd, nbytes)
            self._map = mmap.mmap(self.fd, nbytes)
        self.array = (np.ndarray(shape, dtype, buffer=self._map) if self._map is not None else
                      np.empty(shape, dtype))
        self.slots = slots

    @classmethod
    def wrapping(cls, pixels: np.ndarray) -> HostRing:
        """A ring over images decoded already (N, *Preprocess.decoded_shape): slot i is image i."""
        ring = cls.__new__(cls)
        ring.fd, ring._map, ring.array, ring.slots = None, None, pixels, len(pixels)
        return ring

    def close(self) -> None:
        self.array = None  # type: ignore[assignment]  # the mapping cannot close while an array views it
        if self._map is not None:
            self._map.close()
            self._map = None
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class RingDescriptor:
    """A ring's file descriptor on its way into a worker process: pickled while the process is being started, it
    travels as a descriptor passed to the new process (multiprocessing's DupFd), not as a number."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self) -> tuple:
        from multiprocessing import reduction  # imported on use: only runs with process workers pickle a ring

        return _detach_descriptor, (reduction.DupFd(self.fd),)


def _detach_descriptor(dup: Any) -> int:
    return dup.detach()
