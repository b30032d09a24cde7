"""GpuJpegDecoder against stand-ins for each nvImageCodec API shape it handles (no GPU: the decoder's constructor
makes the library's objects and nothing else). Each stand-in keeps the real release's signatures strictly, so a
call the release would refuse raises here too (0.7 onwards have no ``backend_kinds``; 0.6 to 0.8 have no
``sample_format``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from inception_engine.ingest import jpeg_decode, nvimgcodec
from inception_engine.errors import BackendUnavailable
from inception_engine.ingest.images import Preprocess

PRE = Preprocess()


class Made:
    decoders: list[dict[str, Any]] = []
    params: list[dict[str, Any]] = []


def stand_in(version: str, *, srgb: bool, sample_format: bool, backend_kinds: bool) -> SimpleNamespace:
    """A module shaped as nvImageCodec ``version`` is: the names and keyword arguments that release accepts."""

    class Backend:
        def __init__(self, backend_kind: str, load_hint: float = 1.0):
            self.backend_kind = backend_kind

    def decoder(device_id: int = -1, max_num_cpu_threads: int = 0, backends: list[Backend] | None = None,
                options: str = ":fancy_upsampling=0", **kwargs: Any) -> object:
        if kwargs and not (backend_kinds and set(kwargs) == {"backend_kinds"}):
            raise TypeError(f"__init__(): incompatible constructor arguments: {sorted(kwargs)}")
        assert backends is None or all(isinstance(b, Backend) for b in backends)
        Made.decoders.append({"backends": backends, "options": options, "max_num_cpu_threads": max_num_cpu_threads,
                              **kwargs})
        return object()

    def decode_params(apply_exif_orientation: bool = True, color_spec: str = "SRGB", allow_any_depth: bool = False,
                      **kwargs: Any) -> object:
        if kwargs and not (sample_format and set(kwargs) == {"sample_format"}):
            raise TypeError(f"__init__(): incompatible constructor arguments: {sorted(kwargs)}")
        Made.params.append({"apply_exif_orientation": apply_exif_orientation, "color_spec": color_spec,
                            "allow_any_depth": allow_any_depth, **kwargs})
        return object()

    colors = {"UNCHANGED": "UNCHANGED", **({"SRGB": "SRGB", "SYCC": "SYCC"} if srgb else {"RGB": "RGB", "YCC": "YCC"})}
    module = SimpleNamespace(__version__=version, Decoder=decoder, DecodeParams=decode_params, CodeStream=bytes,
                             Backend=Backend, BackendKind=SimpleNamespace(GPU_ONLY="GPU_ONLY", HW_GPU_ONLY="HW"),
                             ColorSpec=SimpleNamespace(**colors))
    if version >= "0.7":  # SampleFormat appeared in 0.7; DecodeParams takes it from 0.9
        module.SampleFormat = SimpleNamespace(I_RGB="I_RGB", P_RGB="P_RGB",
                                              **({"I_AUTO_COMPONENTS": "AUTO"} if sample_format else {}))
    return module


SHAPES = {
    "0.6.1": dict(srgb=False, sample_format=False, backend_kinds=True),
    "0.7.0": dict(srgb=True, sample_format=False, backend_kinds=False),
    "0.8.0": dict(srgb=True, sample_format=False, backend_kinds=False),
    "0.9.0": dict(srgb=True, sample_format=True, backend_kinds=False),
}


@pytest.fixture(autouse=True)
def fresh_records():
    Made.decoders, Made.params = [], []


@pytest.mark.parametrize("version", sorted(SHAPES))
@pytest.mark.parametrize("backends", [None, ("GPU_ONLY",)])
def test_each_api_shape_gets_an_rgb_decoder(monkeypatch, version, backends):
    module = stand_in(version, **SHAPES[version])
    monkeypatch.setattr(jpeg_decode, "load_nvimgcodec", lambda: module)
    monkeypatch.setattr(jpeg_decode, "NATIVE", False)  # through the stand-in, not jpeg_batch.c
    jpeg_decode.GpuJpegDecoder(None, PRE, max_batch=4, backends=backends)  # type: ignore[arg-type]
    (made,) = Made.decoders
    assert made["options"] == nvimgcodec.DECODER_OPTIONS and made["max_num_cpu_threads"] == 0
    if backends is None:
        assert made["backends"] is None
    else:
        assert [b.backend_kind for b in made["backends"]] == ["GPU_ONLY"]
    params = Made.params[-1]
    assert params["apply_exif_orientation"] is False and params["allow_any_depth"] is False
    assert params["color_spec"] == ("SRGB" if SHAPES[version]["srgb"] else "RGB")
    # three interleaved channels where the release would otherwise give a greyscale JPEG one
    assert params.get("sample_format") == ("I_RGB" if SHAPES[version]["sample_format"] else None)


def no_rgb(module: SimpleNamespace) -> None:
    module.ColorSpec = SimpleNamespace(UNCHANGED="UNCHANGED")


def no_backend(module: SimpleNamespace) -> None:
    del module.Backend


@pytest.mark.parametrize("break_it, message", [
    (no_rgb, r"^nvImageCodec 0\.9\.0 lacks ColorSpec\.SRGB or ColorSpec\.RGB"),
    (no_backend, r"lacks Backend, which --decode gpu needs"),
])
def test_a_module_missing_what_the_decoder_needs_is_one_line(monkeypatch, break_it, message):
    module = stand_in("0.9.0", **SHAPES["0.9.0"])
    break_it(module)
    monkeypatch.setattr(jpeg_decode, "load_nvimgcodec", lambda: module)
    monkeypatch.setattr(jpeg_decode, "NATIVE", False)  # through the stand-in, not jpeg_batch.c
    with pytest.raises(BackendUnavailable, match=message) as e:
        jpeg_decode.GpuJpegDecoder(None, PRE, max_batch=4)  # type: ignore[arg-type]
    assert "\n" not in str(e.value)


def test_a_decoder_that_cannot_be_made_is_one_line(monkeypatch):
    module = stand_in("0.9.0", **SHAPES["0.9.0"])

    def refuses(**kwargs: Any) -> object:
        raise RuntimeError("nvImageCodec: no CUDA device\nsecond line of detail")

    module.Decoder = refuses
    monkeypatch.setattr(jpeg_decode, "load_nvimgcodec", lambda: module)
    monkeypatch.setattr(jpeg_decode, "NATIVE", False)  # through the stand-in, not jpeg_batch.c
    with pytest.raises(BackendUnavailable) as e:
        jpeg_decode.GpuJpegDecoder(None, PRE, max_batch=4)  # type: ignore[arg-type]
    assert str(e.value).startswith("nvImageCodec 0.9.0 could not make a JPEG decoder (RuntimeError: nvImageCodec: "
                                   "no CUDA device); use --decode cpu")
    assert "\n" not in str(e.value)

