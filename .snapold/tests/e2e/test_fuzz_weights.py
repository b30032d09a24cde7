"""Hostile weight files: seeded mutations of a valid file (bytes, zip members, npy headers, manifest fields) must
each be refused with one WeightsError line, or load exactly the original arrays; nothing is decompressed beyond
what the architecture needs, and nothing is left on disk. Most cases use a four-array stand-in architecture
(arch.weight_shapes patched) so that hundreds of files cost milliseconds; a few use the real one."""

from __future__ import annotations

import io
import json
import time
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from inception_engine import arch, cli, weights
from inception_engine.errors import EngineError, WeightsError
from inception_engine.model_files import load_weights
from inception_engine.weights import FORMAT_VERSION, MANIFEST_KEY, sha256_array

from helpers.random_weights import random_arrays

SHAPES = {"a.weight": (4, 3, 3, 3), "a.bias": (4,), "b.weight": (4, 3, 3, 3), "fc.bias": (10,)}


@pytest.fixture
def tiny_arch(monkeypatch, tmp_path):
    """The stand-in architecture, and a user cache of the test's own (an ONNX detour must not write elsewhere)."""
    monkeypatch.setattr(arch, "weight_shapes", lambda: dict(SHAPES))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def tiny_arrays(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}


def manifest_for(arrays: dict[str, np.ndarray]) -> dict:
    return {"format": FORMAT_VERSION, "source_name": "test", "count_include_pad": True,
            "input": {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "size": 299, "resize": 342},
            "layers": {k: list(v.shape) for k, v in arrays.items()},
            "sha256": {k: sha256_array(k, v) for k, v in arrays.items()}}


def npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asanyarray(a), allow_pickle=True)
    return buf.getvalue()


def write_zip(path: Path, members: list[tuple[str, bytes]], deflated: tuple[str, ...] = ()) -> Path:
    """The members in order, stored as they are but for those named in ``deflated``."""
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members:
            z.writestr(name, data, zipfile.ZIP_DEFLATED if name in deflated else zipfile.ZIP_STORED)
    return path


def members_of(arrays: dict[str, np.ndarray], manifest) -> list[tuple[str, bytes]]:
    return [(k + ".npy", npy(v)) for k, v in arrays.items()] + [(MANIFEST_KEY + ".npy",
                                                                   npy(np.array(json.dumps(manifest))))]


def refused(path: Path, *words: str) -> str:
    with pytest.raises(WeightsError) as e:
        load_weights(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg and "pickle" not in msg, msg
    for w in words:
        assert w in msg, msg
    return msg


def test_the_valid_tiny_file_loads(tiny_arch, tmp_path):
    arrays = tiny_arrays()
    w = load_weights(write_zip(tmp_path / "w.npz", members_of(arrays, manifest_for(arrays))))
    assert sorted(w.arrays) == sorted(SHAPES)
    for k, v in arrays.items():
        np.testing.assert_array_equal(w.arrays[k], v)
        assert w.arrays[k].dtype == np.float32 and w.arrays[k].flags.writeable


def test_byte_mutations_are_refused_or_load_the_original(tiny_arch, tmp_path):
    """300 seeded mutations of the file's bytes (flips, truncations, inserted and overwritten runs), through
    load_weights: a zip whose CRCs, names and headers survive loads exactly the original arrays; every other is
    one EngineError line (a file that no longer starts as a zip goes the ONNX way and is refused there)."""
    arrays = tiny_arrays()
    good = write_zip(tmp_path / "good.npz", members_of(arrays, manifest_for(arrays))).read_bytes()
    rng = np.random.default_rng(1234)
    outcomes = {"refused": 0, "loaded": 0}
    path = tmp_path / "mutant.npz"
    for case in range(300):
        data = bytearray(good)
        kind = case % 4
        if kind == 0:
            for _ in range(int(rng.integers(1, 5))):
                data[int(rng.integers(len(data)))] ^= 1 << int(rng.integers(8))
        elif kind == 1:
            del data[int(rng.integers(len(data))):]
        elif kind == 2:
            at = int(rng.integers(len(data)))
            data[at:at] = rng.bytes(int(rng.integers(1, 64)))
        else:
            at = int(rng.integers(len(data)))
            data[at:at + 16] = rng.bytes(16)
        path.write_bytes(bytes(data))
        try:
            w = load_weights(path)
        except EngineError as e:
            assert "\n" not in str(e) and "pickle" not in str(e), (case, str(e))
            outcomes["refused"] += 1
            continue
        outcomes["loaded"] += 1
        for k, v in arrays.items():  # accepted: nothing may differ
            np.testing.assert_array_equal(w.arrays[k], v, err_msg=f"case {case}")
    assert outcomes["refused"] >= 250, outcomes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.npz", "mutant.npz"]  # no cache entry, no part file


BAD_MANIFEST_FIELDS = [
    ("format", [1, "2", 2.0, None, True]),
    ("sha256", [[], "abc", None, {"a.weight": 5}]),
    ("layers", [{"a.weight": [4, 3, 3]}, [], "x"]),
    ("input", [[], "abc", 5]),
    ("input.mean", ["abc", [0.5], [0.5, 0.5], [0.1, 0.2, 0.3, 0.4], [0.5, "x", 0.5], [float("nan"), 0, 0],
                    [1e400, 0, 0], [10 ** 400, 0, 0], [1e6, 0, 0], [True, 0, 0], None]),
    ("input.std", [[0, 0, 0], [0.2, -0.2, 0.2], [1e-9, 1, 1], [float("inf"), 1, 1], [0.2], "std", {}]),
    ("input.size", [0, -1, 100000, "299", 299.5, None]),
    ("input.resize", [100000, 0, -342, 298, 342.0, "342", [342], None]),
    ("count_include_pad", ["yes", 1, None]),
    ("softmax_in_model", [0, "false"]),
]


def set_field(manifest: dict, dotted: str, value) -> dict:
    m = json.loads(json.dumps(manifest))
    *parents, last = dotted.split(".")
    d = m
    for p in parents:
        d = d[p]
    d[last] = value
    return m


def test_manifest_field_mutations_are_refused(tiny_arch, tmp_path):
    """Every bad value of every field the engine reads (57 cases), and whole manifests of the wrong JSON type."""
    arrays = tiny_arrays()
    good = manifest_for(arrays)
    cases = [(f"{field}={value!r}", set_field(good, field, value))
             for field, values in BAD_MANIFEST_FIELDS for value in values]
    cases += [(f"manifest {m!r}", m) for m in ([1, 2], 42, "text", None, [])]
    assert len(cases) == 57
    for i, (what, manifest) in enumerate(cases):
        path = write_zip(tmp_path / f"m{i}.npz", members_of(arrays, manifest))
        with pytest.raises(WeightsError) as e:
            load_weights(path)
        assert "\n" not in str(e.value) and str(path) in str(e.value), (what, str(e.value))
        path.unlink()


def test_manifest_text_that_is_not_json_or_too_deep(tiny_arch, tmp_path):
    arrays = tiny_arrays()
    for i, text in enumerate(["{", "[" * 100000 + "]" * 100000, "1" * 5000, "\udc80"]):
        members = [(k + ".npy", npy(v)) for k, v in arrays.items()] + [(MANIFEST_KEY + ".npy", npy(np.array(text)))]
        refused(write_zip(tmp_path / f"t{i}.npz", members))


def test_swapped_arrays_with_their_checksums_are_found(tiny_arch, tmp_path):
    arrays = tiny_arrays()
    m = manifest_for(arrays)
    swapped = dict(arrays, **{"a.weight": arrays["b.weight"], "b.weight": arrays["a.weight"]})
    m["sha256"]["a.weight"], m["sha256"]["b.weight"] = m["sha256"]["b.weight"], m["sha256"]["a.weight"]
    path = write_zip(tmp_path / "w.npz", members_of(swapped, m))
    # both fail; the arrays are checked on several threads, and the first in the architecture's order is said
    for _ in range(5):
        assert "array a.weight fails its checksum" in refused(path)


def test_no_zip_file_is_read_by_two_threads(tiny_arch, tmp_path, monkeypatch):
    """The arrays are read on several threads, and a ZipFile's members share its one file position: each thread
    opens its own (Python 3.12's zipfile read another thread's bytes there: "no npy header", "Overlapped entries")."""
    import threading

    readers: dict[zipfile.ZipFile, set[int]] = {}  # by the object itself: held, so no id is reused
    real_open = zipfile.ZipFile.open

    def recording_open(self, *args, **kwargs):
        readers.setdefault(self, set()).add(threading.get_ident())
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(zipfile.ZipFile, "open", recording_open)
    monkeypatch.setattr(weights, "READ_THREADS", 4)
    arrays = tiny_arrays()
    path = write_zip(tmp_path / "w.npz", members_of(arrays, manifest_for(arrays)))
    for _ in range(3):
        w = load_weights(path)
        assert all(np.array_equal(w.arrays[k], arrays[k]) for k in SHAPES)
    assert len(readers) > 3 and all(len(threads) == 1 for threads in readers.values()), readers


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_weights_with_matching_checksums_are_refused(tiny_arch, tmp_path, value):
    arrays = tiny_arrays()
    arrays["a.bias"][2] = value
    refused(write_zip(tmp_path / "w.npz", members_of(arrays, manifest_for(arrays))), "a.bias", "NaN or Inf")


def test_member_mutations_are_refused(tiny_arch, tmp_path):
    """Members of the wrong dtype, order, shape, header or name; duplicates, extras, omissions; pickled data."""
    arrays = tiny_arrays()
    m = manifest_for(arrays)
    base = members_of(arrays, m)
    raw = npy(arrays["a.bias"])
    flipped_header = bytearray(raw)
    flipped_header[20] ^= 0x20  # inside "{'descr': ..."
    cases = {
        "float64": [("a.bias.npy", npy(arrays["a.bias"].astype(np.float64)))],
        "big-endian": [("a.bias.npy", npy(arrays["a.bias"].astype(">f4")))],
        "fortran": [("a.weight.npy", npy(np.asfortranarray(arrays["a.weight"])))],
        "shape": [("a.bias.npy", npy(arrays["a.bias"].reshape(2, 2)))],
        "no header": [("a.bias.npy", arrays["a.bias"].tobytes())],
        "flipped header": [("a.bias.npy", bytes(flipped_header))],
        "short data": [("a.bias.npy", raw[:-4])],
        "long data": [("a.bias.npy", raw + b"\0\0\0\0")],
        "pickled": [("a.bias.npy", npy(np.array([{"x": 1}], dtype=object)))],
        "manifest not text": [(MANIFEST_KEY + ".npy", npy(np.zeros(3)))],
    }
    for i, (what, replace) in enumerate(cases.items()):
        names = dict(replace)
        members = [(n, names.get(n, d)) for n, d in base]
        msg = refused(write_zip(tmp_path / f"c{i}.npz", members))
        assert "a.bias" in msg or "a.weight" in msg or MANIFEST_KEY in msg, (what, msg)
    refused(write_zip(tmp_path / "extra.npz", [*base, ("evil.npy", raw)]), "unexpected member evil.npy")
    refused(write_zip(tmp_path / "missing.npz", base[1:]), "lack 1 arrays", "a.weight")
    refused(write_zip(tmp_path / "nomanifest.npz", base[:-1]), "not an Inception-V3 weight file or ONNX export")
    with pytest.warns(UserWarning, match="Duplicate name"):
        dup = write_zip(tmp_path / "dup.npz", [*base, base[1]])
    refused(dup, "two members")


def test_a_bomb_is_refused_before_it_is_decompressed(tiny_arch, tmp_path):
    """A deflated member declaring 64 MiB where the array takes 48 bytes: refused from the zip's directory, with
    next to nothing allocated."""
    arrays = tiny_arrays()
    bomb = npy(np.zeros(16 << 20, np.float32))
    members = [("a.weight.npy", bomb)] + members_of(arrays, manifest_for(arrays))[1:]
    path = write_zip(tmp_path / "bomb.npz", members, deflated=("a.weight.npy",))
    assert path.stat().st_size < 1 << 20
    tracemalloc.start()
    try:
        t0 = time.perf_counter()
        refused(path, "a.weight", "declares")
        seconds = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert seconds < 1.0 and peak < 4 << 20, (seconds, peak)


def test_old_format_is_refused_with_what_to_do(tiny_arch, tmp_path):
    arrays = tiny_arrays()
    m = manifest_for(arrays)
    m["format"] = 1
    refused(write_zip(tmp_path / "w.npz", members_of(arrays, m)), "format 1", "inception-convert-weights")


# --- the real architecture, whole files ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def real_file(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    arrays = random_arrays(11)
    path = weights.save_weights(tmp_path_factory.mktemp("real") / "w.npz", arrays, {"source_name": "t"})
    return path, arrays


def test_real_file_swapped_same_shape_arrays_are_found(real_file, tmp_path):
    """Two same-shaped arrays of the real architecture swapped together with their checksums."""
    path, arrays = real_file
    with zipfile.ZipFile(path) as z:
        members = [(i.filename, z.read(i)) for i in z.infolist()]
    a, b = "Mixed_7b.branch3x3_2a.weight", "Mixed_7b.branch3x3dbl_3a.weight"
    assert arrays[a].shape == arrays[b].shape
    manifest = json.loads(str(np.load(io.BytesIO(dict(members)[MANIFEST_KEY + ".npy"]))))
    manifest["sha256"][a], manifest["sha256"][b] = manifest["sha256"][b], manifest["sha256"][a]
    d = dict(members)
    d[a + ".npy"], d[b + ".npy"] = d[b + ".npy"], d[a + ".npy"]
    d[MANIFEST_KEY + ".npy"] = npy(np.array(json.dumps(manifest)))
    refused(write_zip(tmp_path / "swapped.npz", list(d.items())), "fails its checksum")


def test_real_file_bomb_in_place_of_the_first_array(real_file, tmp_path):
    """A compressed 32 MiB of zeros named as the first conv's weight (3.5 KB): refused in well under a second."""
    path, _ = real_file
    with zipfile.ZipFile(path) as z:
        members = [(i.filename, z.read(i)) for i in z.infolist()]
    first = next(iter(arch.weight_shapes())) + ".npy"
    d = dict(members)
    d[first] = npy(np.zeros(8 << 20, np.float32))
    bomb = write_zip(tmp_path / "bomb.npz", list(d.items()), deflated=(first,))
    t0 = time.perf_counter()
    refused(bomb, first[:-4], "declares")
    assert time.perf_counter() - t0 < 1.0


# --- through the command line -----------------------------------------------------------------------------------

def run(args: list[str]):
    try:
        r = CliRunner(mix_stderr=False)
    except TypeError:
        r = CliRunner()
    return r.invoke(cli.run_cmd, args)


def one_line_error(r) -> str:
    err = r.stderr.strip()
    assert r.exit_code == 2 and err.startswith("error: ") and "\n" not in err and "Traceback" not in r.output, \
        (r.exit_code, r.output)
    return err


def test_cli_bad_weight_files_are_one_line_exit_2(tiny_arch, tmp_path):
    arrays = tiny_arrays()
    image = tmp_path / "x.jpg"
    image.write_bytes(b"never read: the weights fail first")
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    pickled = tmp_path / "objects.npy"
    np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    listed = write_zip(tmp_path / "list.npz", members_of(arrays, [1, 2, 3]))
    nan_std = write_zip(tmp_path / "std.npz", members_of(arrays, set_field(manifest_for(arrays), "input.std",
                                                                           [0, 0, 0])))
    for path, words in ((text, "not an Inception-V3 weight file or ONNX export"),
                        (pickled, "not an Inception-V3 weight file or ONNX export"),
                        (listed, "JSON list"), (nan_std, "input.std"), (tmp_path, "no such weight file")):
        err = one_line_error(run([str(image), "--weights", str(path), "--backend", "cpu"]))
        assert words in err and "pickle" not in err, err
