"""Programmatic dependent launch without a GPU: the driver structs pdl.py hands to cuLaunchKernelEx, and which of a
forward's launches cuda_backend marks programmatic. Whether the GPU honours them is test_cuda_backend.py's part
(the GPU-marked forwards run with PDL on by default, and with it off)."""

from __future__ import annotations

import ctypes

import pytest

from inception_engine import pdl
from inception_engine.backends import cuda_backend as cb
from inception_engine.plan import build_plan


class FakeDriverApi:
    """Stands in for libcuda: cuLaunchKernelEx copies out what it was given."""

    def __init__(self):
        self.calls: list[dict] = []

    def cuLaunchKernelEx(self, config_p, func, params, extra):  # noqa: N802 (the driver's name)
        cfg = ctypes.cast(config_p, ctypes.POINTER(pdl.LaunchConfig)).contents
        attrs = [(cfg.attrs[i].id, ctypes.cast(ctypes.addressof(cfg.attrs[i].value), ctypes.POINTER(ctypes.c_int))[0])
                 for i in range(cfg.num_attrs)]
        self.calls.append({"grid": (cfg.grid_x, cfg.grid_y, cfg.grid_z), "block": (cfg.block_x, cfg.block_y,
                                                                                      cfg.block_z),
                           "shared": cfg.shared_bytes, "stream": cfg.stream, "attrs": attrs, "func": func,
                           "params": params, "extra": extra})
        return 0


def test_struct_layout_matches_cuda_h():
    # cuda.h: CUlaunchAttribute is {int id; char pad[4]; 64-byte union}, CUlaunchConfig 7 uints then pointers.
    assert ctypes.sizeof(pdl.LaunchAttribute) == 72 and pdl.LaunchAttribute.value.offset == 8
    assert [pdl.LaunchConfig.stream.offset, pdl.LaunchConfig.attrs.offset, pdl.LaunchConfig.num_attrs.offset] == \
        [32, 40, 48]


def test_driver_launch_packs_arguments_and_the_attribute(monkeypatch):
    fake = FakeDriverApi()
    monkeypatch.setattr(pdl, "driver_api", lambda: fake)
    args = (0x7F00_1234_5678, -3, 2**31 - 1, 2**40 + 5)
    launch = pdl.DriverLaunch(ctypes.c_void_p(0xABC), (7, 2, 3), (256, 1, 1), "PiiP", args)
    launch(0x5150, programmatic=True)
    launch(0x6160, programmatic=False)
    first, second = fake.calls
    assert first["grid"] == (7, 2, 3) and first["block"] == (256, 1, 1) and first["shared"] == 0
    assert first["stream"] == 0x5150 and second["stream"] == 0x6160
    assert first["attrs"] == [(pdl.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, 1)]
    assert second["attrs"] == []
    params = ctypes.cast(first["params"], ctypes.POINTER(ctypes.c_void_p))
    sizes = (8, 4, 4, 8)
    got = [int.from_bytes(ctypes.string_at(params[i], n), "little", signed=True) for i, n in enumerate(sizes)]
    assert got == list(args)


def test_driver_launch_rejects_a_wrong_argument_count():
    with pytest.raises(ValueError, match="3 arguments"):
        pdl.DriverLaunch(ctypes.c_void_p(1), (1, 1, 1), (32, 1, 1), "PP", (1, 2, 3))


class Recorder(pdl.DriverLaunch):
    def __init__(self, log: list, op: str):  # no driver: records its calls
        self.log, self.op = log, op

    def __call__(self, stream_handle: int, programmatic: bool) -> None:
        self.log.append(("launch", stream_handle, self.op, programmatic))


class FakeStream:
    def __init__(self, log: list, flags: int = 0):
        self.log, self.handle = log, id(self)

    def wait_for_event(self, event) -> None:
        self.log.append(("wait", self.handle, event))


class FakeEvent:
    def __init__(self, log: list, flags: int = 0):
        self.log = log

    def record(self, stream) -> None:
        self.log.append(("record", stream.handle, self))


class FakeDrv:
    class event_flags:  # noqa: N801 (pycuda's name)
        DISABLE_TIMING = 2

    def __init__(self, log: list):
        self.Stream = lambda flags=0: FakeStream(log, flags)
        self.Event = lambda flags=0: FakeEvent(log, flags)


def backend_stub(concurrent: bool, pdl_on: bool, batch: int = 1) -> tuple[cb.CudaBackend, list]:
    """A CudaBackend with fake streams and recording launches: only the launch ordering code runs."""
    log: list = []
    plan = build_plan(batch, concurrent=True)
    b = cb.CudaBackend.__new__(cb.CudaBackend)
    b.plan, b.concurrent, b.pdl = plan, concurrent, pdl_on
    b._stream = FakeStream(log)
    b._stages, b._tail, b._streams = [], [], []
    ops = [op.name for op in plan.ops]
    b._launches = [cb.Launch(cb.LaunchSpec(name, "k", (1, 1, 1), (32, 1, 1), ()), Recorder(log, name))
                   for name in ops for _ in range(2)]  # two launches per op, like a split-K conv
    if concurrent:
        b._setup_streams(FakeDrv(log))
    return b, log


def replay(log: list) -> list[tuple[bool, bool]]:
    """(marked programmatic, previous action on its stream was a launch) for every launch in the log."""
    last: dict[int, str] = {}
    out = []
    for entry in log:
        kind, stream = entry[0], entry[1]
        if kind == "launch":
            out.append((entry[3], last.get(stream) == "launch"))
        if kind in ("launch", "wait"):
            last[stream] = kind
    return out


@pytest.mark.parametrize("concurrent", [False, True])
def test_a_launch_is_programmatic_exactly_when_it_follows_a_kernel_on_its_stream(concurrent):
    b, log = backend_stub(concurrent, pdl_on=True)
    b._launch_all()
    flags = replay(log)
    assert len(flags) == len(b._launches)
    assert all(marked == after_kernel for marked, after_kernel in flags)
    marked = sum(m for m, _ in flags)
    if not concurrent:
        assert marked == len(flags) - 1
    else:  # the chains of each branch overlap their launches; fork/join and cross-stream edges stay full
        streams_started = sum(1 for m, _ in flags if not m)
        assert 0 < streams_started < marked


def test_no_launch_is_programmatic_with_pdl_off():
    b, log = backend_stub(True, pdl_on=False)
    b._launch_all()
    assert not any(marked for marked, _ in replay(log))


def test_pdl_unavailable_says_why():
    class Emulated:
        EMULATED = True

    assert "sm_90" in cb.pdl_unavailable(Emulated(), (8, 6))
    assert "emulator" in cb.pdl_unavailable(Emulated(), (9, 0))


def test_launch_through_pycuda_ignores_the_flag():
    calls = []

    class Prepared:
        def prepared_async_call(self, grid, block, stream, *args):
            calls.append((grid, block, stream, args))

    launch = cb.Launch(cb.LaunchSpec("op", "k", (2, 1, 1), (256, 1, 1), (5, 6)), Prepared())
    launch("stream", programmatic=True)
    assert calls == [((2, 1, 1), (256, 1, 1), "stream", (5, 6))]
