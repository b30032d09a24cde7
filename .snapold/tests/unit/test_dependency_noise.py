"""nvImageCodec's own messages stay off the user's terminal (issue 50): its logger is switched off unless the user
asked for it, and what its extensions print while loading is sorted: about codecs a JPEG run never uses, dropped;
about nvJPEG, one line of ours; anything else, written out as it was. No GPU: the module is stood in for."""

from __future__ import annotations

import os
import sys
import types

from inception_engine.ingest import nvimgcodec

NVJPEG2K = ("Failed to load nvjpeg2k library! Please install nvJPEG2000 (see https://docs.nvidia.com/cuda/nvjpeg2000/"
            "userguide.html#installing-nvjpeg2000).\nNote: If using nvImageCodec's Python distribution, it is enough "
            "to install the nvJPEG2000 wheel: e.g. `python3 -m pip install nvidia-nvjpeg2k-cu13`\n")
NVTIFF = ("Failed to load nvtiff library! Please install nvTIFF (see https://docs.nvidia.com/cuda/nvtiff/userguide.html"
          "#installing-nvtiff).\nNote: If using nvImageCodec's Python distribution, it is enough to install the nvTIFF "
          "wheel: e.g. `python3 -m pip install nvidia-nvtiff-cu13`\n")


def test_noise_about_unused_codecs_is_dropped_and_the_rest_kept():
    assert nvimgcodec.sort_output(NVJPEG2K + NVTIFF) == ("", None)
    kept, note = nvimgcodec.sort_output(NVJPEG2K + "note: converted x.onnx\n")
    assert kept == "note: converted x.onnx\n" and note is None
    kept, note = nvimgcodec.sort_output("Failed to load nvjpeg library! Please install nvJPEG\n" + NVTIFF)
    assert kept == "" and note is not None and "\n" not in note
    assert note.startswith("note: nvImageCodec could not load all of nvJPEG")
    assert "Failed to load nvjpeg library" in note


def test_what_the_library_prints_while_it_loads_is_sorted(capfd):
    with nvimgcodec.quiet_stderr():
        os.write(2, NVJPEG2K.encode())  # as its C++ prints, past Python's sys.stderr
        os.write(2, b"another thread's line\n")
        print("Python's stderr too", file=sys.stderr)
    err = capfd.readouterr().err  # (pytest's capture holds sys.stderr apart: the two lines' order is its own)
    assert sorted(err.splitlines()) == ["Python's stderr too", "another thread's line"]


def test_its_logger_is_off_unless_the_user_asked(monkeypatch):
    seen = []

    class Decoder:
        def __init__(self, **kwargs):
            os.write(2, NVTIFF.encode())  # its extensions load as a decoder is made
            seen.append(os.environ.get(nvimgcodec.VERBOSITY_ENV))

    fake = types.ModuleType("nvidia.nvimgcodec")
    fake.Decoder = Decoder
    package = types.ModuleType("nvidia")
    package.nvimgcodec = fake
    monkeypatch.setitem(sys.modules, "nvidia", package)
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", fake)
    monkeypatch.delenv(nvimgcodec.VERBOSITY_ENV, raising=False)
    assert nvimgcodec.load_nvimgcodec() is fake and os.environ[nvimgcodec.VERBOSITY_ENV] == "0"
    monkeypatch.setenv(nvimgcodec.VERBOSITY_ENV, "3")  # the user's choice stands
    nvimgcodec.load_nvimgcodec()
    assert os.environ[nvimgcodec.VERBOSITY_ENV] == "3"
    api = nvimgcodec.CodecApi(fake, "0.9.0", "SRGB", None)
    api.decoder(None, nvimgcodec.DECODER_OPTIONS)
    assert seen == ["3"]


def test_a_decoder_made_prints_nothing_of_unused_codecs(monkeypatch, capfd):
    class Decoder:
        def __init__(self, **kwargs):
            os.write(2, (NVJPEG2K + NVTIFF).encode())

    api = nvimgcodec.CodecApi(types.SimpleNamespace(Decoder=Decoder), "0.9.0", "SRGB", None)
    api.decoder(None, nvimgcodec.DECODER_OPTIONS)
    assert capfd.readouterr().err == ""
