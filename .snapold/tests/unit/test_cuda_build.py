"""cuda_build without nvcc or a GPU: the compile units, the kernel -> unit map, and the GPU's target as nvidia-smi
reports it (a stand-in nvidia-smi on PATH)."""

from __future__ import annotations

import os
import stat

import pytest

from inception_engine import cuda_build
from inception_engine.backends.cuda import kernels, tiles


def test_each_nhwc_family_is_one_unit_per_element_type_and_names_match_the_tiles():
    assert set(cuda_build.NHWC_ELEMENT_SUFFIXES) == set(tiles.NHWC_ELEMS)
    assert all(cuda_build.NHWC_ELEMENT_SUFFIXES[p] == e.suffix for p, e in tiles.NHWC_ELEMS.items())
    for source, elements in cuda_build.PER_ELEMENT.items():
        assert source in cuda_build.SOURCES and source not in cuda_build.UNITS
        for e in elements:
            assert cuda_build.UNITS[f"{source.removesuffix('.cu')}_{e}"] == (source, (f"-DIE_NHWC_{e.upper()}",))
    assert cuda_build.UNITS["pool_nhwc.cu"] == ("pool_nhwc.cu", ())


def test_every_nhwc_conv_kernel_is_in_its_family_and_element_types_unit():
    names = [k for k in kernels.all_kernel_names() if k.startswith("conv_nhwc")]
    units = {k: kernels.unit_of(k) for k in names}
    assert set(units.values()) == {u for u, (s, _) in cuda_build.UNITS.items() if s in cuda_build.PER_ELEMENT}
    assert units["conv_nhwc_tf32_ws_tma_pp_128x192"] == "conv_nhwc_ws_tf32"
    assert units["conv_nhwc_halo_256x64"] == "conv_nhwc_halo_fp16"
    assert units["conv_nhwc_f32_wgmma_128x64"] == "conv_nhwc_wgmma_fp32"
    assert units["conv_nhwc_f32_splitk_reduce"] == "conv_nhwc_mma_fp32"
    assert units["conv_nhwc_tf32_maxpool3_128x64"] == "conv_nhwc_mma_tf32"
    assert kernels.unit_of("pool2d_nhwc_tf32") == "pool_nhwc.cu"


def fake_nvidia_smi(tmp_path, monkeypatch, script: str) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + script + "\n")
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_gpu_target_reads_the_compute_capability_of_the_first_visible_gpu(tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path, monkeypatch, 'echo "$1" > "$(dirname "$0")/asked"; echo 9.0; echo 8.6')
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert cuda_build.gpu_target() == "sm_90"
    assert (tmp_path / "asked").read_text().strip() == "--id=0"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-1234,0")
    assert cuda_build.gpu_target() == "sm_90"
    assert (tmp_path / "asked").read_text().strip() == "--id=GPU-1234"


@pytest.mark.parametrize("script, visible, message", [
    ("echo 'No devices were found'; exit 6", None, "nvidia-smi gave no compute capability for GPU 0"),
    ("echo '[N/A]'", None, r"GPU 0 \(\[N/A\]\)"),
    ("echo 9.0", "-1", "hides every GPU"),
])
def test_gpu_target_without_a_usable_gpu_is_one_clear_line(tmp_path, monkeypatch, script, visible, message):
    fake_nvidia_smi(tmp_path, monkeypatch, script)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    with pytest.raises(cuda_build.BackendUnavailable, match=message) as e:
        cuda_build.gpu_target()
    assert "\n" not in str(e.value)


def test_main_without_nvidia_smi_says_so_and_exits_2(monkeypatch, capsys):
    monkeypatch.setattr(cuda_build.shutil, "which", lambda name: None)
    assert cuda_build.main() == 2
    err = capsys.readouterr().err
    assert err.startswith("error: nvidia-smi is not on PATH") and err.count("\n") == 1


def test_the_sources_are_those_of_the_checkout_whose_module_asks(tmp_path):
    """native_build.source_dir finds cuda_src/ from its module's own file: a copy of the package in another checkout
    (an old tree on PYTHONPATH beside the installed one, for an A/B) gets that checkout's sources, not the installed
    checkout's; an installed package's own folder comes first."""
    import importlib.util
    import shutil
    from pathlib import Path

    from inception_engine import native_build

    assert (cuda_build.source_dir() / cuda_build.PROBE).is_file()
    package = tmp_path / "old" / "inception_engine"
    package.mkdir(parents=True)
    shutil.copy(native_build.__file__, package / "native_build.py")
    (tmp_path / "old" / "cuda_src").mkdir()
    (tmp_path / "old" / "cuda_src" / cuda_build.PROBE).write_text("// the old tree's\n")
    spec = importlib.util.spec_from_file_location("old_native_build", package / "native_build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.source_dir("cuda_src", cuda_build.PROBE) == (tmp_path / "old" / "cuda_src").resolve()
    (package / "cuda_src").mkdir()  # as an install lays it out
    (package / "cuda_src" / cuda_build.PROBE).write_text("")
    assert module.source_dir("cuda_src", cuda_build.PROBE) == (package / "cuda_src").resolve()
    assert Path(cuda_build.source_dir()) != (tmp_path / "old" / "cuda_src").resolve()
