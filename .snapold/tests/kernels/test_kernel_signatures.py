"""The C side of every kernel against the kernel registry (backends/cuda/kernels.py): each entry the registry holds is
declared in the file its spec names, with the parameters of its signature (name for name, type for type: pointer
P, int i, long long q, float f) and the block of its spec (its ``__launch_bounds__``, or the file's ``Launch: block
N`` where it has none); it uses dynamic shared memory (an ``extern __shared__`` array) exactly where its spec gives
it some, and no more than the emulator's copy of that array holds; no file declares an entry point the registry
lacks, and the registry's files and compile units are the ones cuda_build builds.

The sources are read after the preprocessor (helpers.c_source: g++ -E with the CPU emulator's headers, which leaves
every tile in, as the macros that stamp them out write them); nothing is compiled, so this runs in seconds.
"""

from __future__ import annotations

import re
import shutil

import pytest

from helpers.c_source import ENTRY, Source, c_params, dynamic_shared_arrays, evaluate, preprocess
from inception_engine import cuda_build
from inception_engine.backends.cuda import kernels
from inception_engine.backends.cuda.tiles import MAX_SHARED_BYTES

pytestmark = pytest.mark.skipif(shutil.which("g++") is None,
                                reason="g++ is not installed (it preprocesses the sources)")

HEADER_BLOCK = re.compile(r"^//\s+Launch:\s+block (\d+)\b", re.M)


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Source]:
    """cuda_src file -> its text after the preprocessor, its entry points and what they reach."""
    tmp = tmp_path_factory.mktemp("c_source")
    return {source: preprocess(source, tmp) for source in cuda_build.SOURCES}


def test_the_parser_reads_types_names_bounds_and_constants():
    text = ('extern "C" void __launch_bounds__((128 / 8) * (64 / 4), 2) k(const NhwcF16::T *__restrict x, '
            'unsigned* __restrict c, int n, long long t, float s) {}\nextern "C" void j() {}')
    found = {m["name"]: (c_params(m["params"]), m["bounds"]) for m in ENTRY.finditer(text)}
    assert found == {"k": ((("x", "P"), ("c", "P"), ("n", "i"), ("t", "q"), ("s", "f")), "(128 / 8) * (64 / 4), 2"),
                     "j": ((), None)}
    consts = {"A": ["128"], "B": ["A + 256"], "C": ["1", "2"]}
    assert evaluate("(B - 3 * 4) / 5", consts) == (128 + 256 - 12) // 5
    with pytest.raises(AssertionError, match="more than one"):
        evaluate("C + 1", consts)


def test_the_call_graph_follows_calls_and_only_calls():
    src = Source('template <int N> __device__ void leaf(int x) { use(ring[x]); }\n'
                 'struct L { __device__ void load() const { leaf<4>(1); } };\n'
                 'extern "C" void a(int n) { L{}.load(); }\n'
                 'extern "C" void b(int n) { if (n) { other(n); } auto f = [&](int i) { return i; }; }\n')
    assert src.reaches("a", {"ring"}) == {"ring"} and src.reaches("b", {"ring"}) == set()
    assert set(src.entries) == {"a", "b"}


def test_every_kernel_is_declared_with_its_signature(sources):
    wrong = []
    for kernel in kernels.all_kernel_names():
        spec = kernels.spec(kernel)
        got = sources[spec.source].entries.get(kernel)
        if got is None or got.params != spec.signature.params:
            wrong.append(f"{kernel} ({spec.source}): C {got and got.params}, registry {spec.signature.params}")
    assert not wrong, "\n".join(wrong)


def test_every_kernel_is_launched_with_the_block_its_source_declares(sources):
    wrong, headers = [], 0
    for kernel in kernels.all_kernel_names():
        spec = kernels.spec(kernel)
        source = sources[spec.source]
        bounds = source.entries[kernel].bounds
        if bounds is None:  # no __launch_bounds__: the file's header says the block
            blocks = HEADER_BLOCK.findall((cuda_build.source_dir() / spec.source).read_text())
            assert len(blocks) == 1, f"{kernel}: no __launch_bounds__ and no one 'Launch: block N' in {spec.source}"
            threads, headers = int(blocks[0]), headers + 1
        else:
            threads = source.constant(bounds[0])
        if threads != spec.threads:
            wrong.append(f"{kernel} ({spec.source}): C block {threads}, registry {spec.threads}")
    assert not wrong, "\n".join(wrong)
    assert headers <= 1  # gpu_sleep's; every other kernel states its block in __launch_bounds__


def test_dynamic_shared_memory_is_given_where_the_kernel_uses_it(sources):
    arrays = dynamic_shared_arrays()
    assert set(arrays) == {"wgmma_ring", "conv_input_smem"}, arrays
    wrong, users = [], 0
    for kernel in kernels.all_kernel_names():
        spec = kernels.spec(kernel)
        source = sources[spec.source]
        used = source.reaches(kernel, set(arrays))
        users += bool(used)
        if bool(used) != (spec.max_shared > 0):
            wrong.append(f"{kernel}: reaches {sorted(used) or 'no dynamic shared memory'}, registry gives "
                         f"{spec.max_shared} bytes at most")
        for array in used:  # the emulator's copy of the array (a static one) must hold what a launch may take
            held = re.search(rf"static\s+unsigned\s+char\s+{array}\s*\[([^\]]+)\]", source.text)
            assert held, f"{kernel}: no emulator array {array} in {spec.source}"
            if spec.max_shared > min(source.constant(held.group(1)), MAX_SHARED_BYTES):
                wrong.append(f"{kernel}: up to {spec.max_shared} bytes, {array} holds {held.group(1)}")
    assert not wrong, "\n".join(wrong)
    assert users >= 40  # the wgmma, warp-specialized, halo and input-mma kernels


def test_no_source_declares_a_kernel_the_registry_lacks(sources):
    names = set(kernels.all_kernel_names())
    extra = {source: sorted(set(s.entries) - names) for source, s in sources.items() if set(s.entries) - names}
    assert not extra, extra
    assert sum(len(s.entries) for s in sources.values()) == len(names)


def test_the_registry_is_what_cuda_build_builds():
    specs = [kernels.spec(k) for k in kernels.all_kernel_names()]
    assert {s.source for s in specs} == set(cuda_build.SOURCES)
    assert {s.unit for s in specs} == set(cuda_build.UNITS)
    assert all(s.name == k for s, k in zip(specs, kernels.all_kernel_names()))


def test_a_name_given_twice_must_be_one_entry():
    a = kernels.spec("pool2d")
    assert kernels.registry([a, a]) == {"pool2d": a}
    with pytest.raises(ValueError, match="two registry entries named pool2d"):
        kernels.registry([a, kernels.KernelSpec("pool2d", a.source, a.signature, a.threads * 2)])
    with pytest.raises(KeyError, match="not an entry point"):
        kernels.spec("conv_9x9_128x128")
