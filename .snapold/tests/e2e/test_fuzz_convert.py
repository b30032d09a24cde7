"""Hostile ONNX files and output paths for the converter: seeded mutations of the synthetic exports (attributes,
external-data records, parameters) must each be refused with one ConversionError line naming the file, never a
traceback and never a wrong weight file; the command refuses bad output paths in one line with exit code 2, Ctrl-C
gives 130, and no part file is left behind."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import helper, numpy_helper

from inception_engine import arch, cli, model_files, onnx_convert, onnx_read, weights
from inception_engine.errors import ConversionError, EngineError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ts_model(synthetic_onnx) -> onnx.ModelProto:
    return onnx.load(str(synthetic_onnx("torchscript")))


@pytest.fixture(scope="module")
def dynamo_folder(synthetic_onnx, tmp_path_factory) -> Path:
    """The dynamo export and its .data file copied into a folder of this module's own (not hard-linked: onnx
    refuses to read external data with several links)."""
    src = synthetic_onnx("dynamo")
    folder = tmp_path_factory.mktemp("dynamo")
    for f in (src, src.with_name(src.name + ".data")):
        shutil.copy(f, folder / f.name)
    return folder / src.name


@pytest.fixture(scope="module")
def dynamo_arrays(dynamo_folder) -> dict[str, np.ndarray]:
    """The unedited dynamo export's conversion, to compare accepted files with."""
    return onnx_convert.convert_model(onnx_read.load_onnx(dynamo_folder), dynamo_folder)[0]


@pytest.fixture(scope="module")
def dynamo_model(dynamo_folder) -> onnx.ModelProto:
    return onnx.load(str(dynamo_folder), load_external_data=False)


def copy(model: onnx.ModelProto) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    return m


def refused(model: onnx.ModelProto, source: Path, *words: str) -> str:
    with pytest.raises(ConversionError) as e:
        onnx_convert.convert_model(model, source)
    msg = str(e.value)
    assert "\n" not in msg and str(source) in msg, msg
    for w in words:
        assert w in msg, msg
    return msg


def set_attr(node: onnx.NodeProto, attr: onnx.AttributeProto) -> None:
    for a in list(node.attribute):
        if a.name == attr.name:
            node.attribute.remove(a)
    node.attribute.append(attr)


# --- attributes -------------------------------------------------------------------------------------------------

def misspell(name: str, rng: np.random.Generator) -> str:
    i = int(rng.integers(len(name)))
    return [name[:i] + name[i + 1:], name[:i] + name[i] * 2 + name[i:], name + "s"][int(rng.integers(3))]


def attribute_mutations(model: onnx.ModelProto, rng: np.random.Generator, n: int):
    """(what, mutated model, words the refusal must hold): misspelt, unknown, retyped, repeated and missing
    attributes on the nodes the converter reads."""
    readers = [i for i, node in enumerate(model.graph.node)
               if node.op_type in ("Conv", "MaxPool", "AveragePool", "Gemm", "Concat", "Flatten", "Constant")]
    for case in range(n):
        m = copy(model)
        i = int(rng.choice(readers))
        node = m.graph.node[i]
        kind = case % 5
        names = [a.name for a in node.attribute]
        if kind == 0 and names:
            a = node.attribute[int(rng.integers(len(names)))]
            old = a.name
            a.name = misspell(old, rng)
            while a.name in names:
                a.name += "x"
            yield f"node {i}: {old} -> {a.name}", m, ("unknown attribute", a.name)
        elif kind == 1:
            node.attribute.append(helper.make_attribute("dilationss", [2, 2]))
            yield f"node {i}: extra attribute", m, ("unknown attribute 'dilationss'",)
        elif kind == 2 and names:
            a = node.attribute[int(rng.integers(len(names)))]
            if a.type in (onnx.AttributeProto.INT, onnx.AttributeProto.INTS):
                set_attr(node, helper.make_attribute(a.name, "abc"))
            else:
                set_attr(node, helper.make_attribute(a.name, [1.5, 2.5]))
            yield f"node {i}: {a.name} retyped", m, (f"attribute '{a.name}' has attribute type",)
        elif kind == 3 and names:
            node.attribute.append(onnx.AttributeProto.FromString(node.attribute[0].SerializeToString()))
            yield f"node {i}: repeated {names[0]}", m, ("given twice",)
        else:
            required = {"MaxPool": "kernel_shape", "AveragePool": "kernel_shape", "Concat": "axis"}
            op = node.op_type if node.op_type in required else "Concat"
            j = next(k for k, nd in enumerate(m.graph.node) if nd.op_type == op)
            target = m.graph.node[j]
            for a in list(target.attribute):
                if a.name == required[op]:
                    target.attribute.remove(a)
            yield f"node {j}: no {required[op]}", m, (f"required attribute '{required[op]}' is missing",)


def test_attribute_mutations_are_refused(ts_model, tmp_path):
    """20 seeded attribute mutations of the torchscript export: each one onnxruntime refuses, refused here."""
    rng = np.random.default_rng(2024)
    cases = list(attribute_mutations(ts_model, rng, 20))
    assert len(cases) == 20
    for what, m, words in cases:
        try:
            refused(m, tmp_path / "edited.onnx", *words)
        except (AssertionError, pytest.fail.Exception) as e:
            raise AssertionError(f"{what}: {e}") from None


def test_other_structural_damage_is_one_line(ts_model, tmp_path):
    """Inputs missing from a node, an output no node computes, an unknown operator, a value computed twice, two
    initializers of one name, Dropout with a training flag of several values, bad opsets."""
    source = tmp_path / "edited.onnx"
    m = copy(ts_model)
    relu = next(n for n in m.graph.node if n.op_type == "Relu")
    del relu.input[:]
    refused(m, source, "0 inputs")
    m = copy(ts_model)
    m.graph.output[0].name = "nowhere"
    refused(m, source, "'nowhere'")
    m = copy(ts_model)
    next(n for n in m.graph.node if n.op_type == "Relu").op_type = "Relu6"
    refused(m, source, "Relu6 is not an operator of ONNX opset 17")
    m = copy(ts_model)
    convs = [n for n in m.graph.node if n.op_type == "Conv"]
    convs[3].output[0] = convs[2].output[0]
    refused(m, source, f"output '{convs[2].output[0]}' is computed a second time")
    m = copy(ts_model)
    m.graph.initializer[5].name = m.graph.initializer[4].name
    refused(m, source, f"two initializers are named '{m.graph.initializer[4].name}'")
    m = copy(ts_model)
    gemm = next(n for n in m.graph.node if n.op_type == "Gemm")
    m.graph.initializer.append(numpy_helper.from_array(np.array([True, False]), "training"))
    m.graph.node.insert(list(m.graph.node).index(gemm), helper.make_node("Dropout", [gemm.input[0], "", "training"],
                                                                         ["dropped"]))
    gemm.input[0] = "dropped"
    refused(m, source, "Dropout in training mode")
    for versions in ([], [0], [17, 18], [10 ** 6]):
        m = copy(ts_model)
        del m.opset_import[:]
        m.opset_import.extend(helper.make_opsetid("", v) for v in versions)
        refused(m, source, "opset")


@pytest.fixture(scope="module")
def ts_arrays(ts_model, tmp_path_factory) -> dict[str, np.ndarray]:
    return onnx_convert.convert_model(copy(ts_model), tmp_path_factory.mktemp("ts") / "model.onnx")[0]


def test_random_structural_mutations_are_refused_or_change_nothing(ts_model, ts_arrays, tmp_path):
    """12 seeded edits of the graph (an input rewired to another value, a node deleted, an operator renamed, an
    initializer's dims or type changed, an output renamed): each is one ConversionError line, or the arrays are
    exactly the unedited file's (an edit that changes nothing the network computes)."""
    rng = np.random.default_rng(77)
    values = [v for n in ts_model.graph.node for v in n.output] + [t.name for t in ts_model.graph.initializer]
    source = tmp_path / "edited.onnx"
    outcomes = []
    for case in range(12):
        m = copy(ts_model)
        g = m.graph
        node = g.node[int(rng.integers(len(g.node)))]
        kind = case % 6
        if kind == 0 and node.input:
            node.input[int(rng.integers(len(node.input)))] = values[int(rng.integers(len(values)))]
        elif kind == 1:
            g.node.remove(node)
        elif kind == 2:
            node.op_type = str(rng.choice(["Relu", "Conv", "Concat", "Add", "MaxPool", "Identity", "Gemm"]))
        elif kind == 3:
            t = g.initializer[int(rng.integers(len(g.initializer)))]
            t.dims[:] = [int(d) for d in rng.integers(0, 5, int(rng.integers(0, 5)))]
        elif kind == 4:
            g.initializer[int(rng.integers(len(g.initializer)))].data_type = int(rng.choice([0, 6, 7, 10, 11, 40]))
        else:
            node.output[0] = values[int(rng.integers(len(values)))]
        try:
            arrays, _ = onnx_convert.convert_model(m, source)
        except ConversionError as e:
            assert "\n" not in str(e) and str(source) in str(e), (case, str(e))
            outcomes.append("refused")
            continue
        for k, a in ts_arrays.items():
            np.testing.assert_array_equal(arrays[k], a, err_msg=f"case {case}")
        outcomes.append("same")
    assert outcomes.count("refused") >= 8, outcomes


def test_constant_subgraphs_and_probes_cannot_fill_memory(ts_model, tmp_path):
    """Folding refuses a constant that would hold more than MAX_VALUES values (an Expand to 2^40, a Concat
    doubling chain, a broadcast Add of two long vectors); a fixed batch of 100000 is not probed with images."""
    source = tmp_path / "edited.onnx"
    cases = {
        "expand": [helper.make_node("Expand", ["one", "huge"], ["bomb"])],
        "concat": [helper.make_node("Concat", [f"c{i}", f"c{i}"], [f"c{i + 1}"], axis=0) for i in range(40)],
        "add": [helper.make_node("Unsqueeze", ["long", "axis1"], ["column"]),
                helper.make_node("Add", ["long", "column"], ["square"])],
    }
    for what, nodes in cases.items():
        m = copy(ts_model)
        m.graph.initializer.extend([numpy_helper.from_array(np.ones(1, np.float32), "one"),
                                    numpy_helper.from_array(np.array([1 << 40], np.int64), "huge"),
                                    numpy_helper.from_array(np.ones(1 << 20, np.float32), "c0"),
                                    numpy_helper.from_array(np.ones(1 << 16, np.float32), "long"),
                                    numpy_helper.from_array(np.array([1], np.int64), "axis1")])
        for node in reversed(nodes):
            m.graph.node.insert(0, node)
        try:
            refused(m, source, "cannot evaluate constant expression", "more than 33554432")
        except (AssertionError, pytest.fail.Exception) as e:
            raise AssertionError(f"{what}: {e}") from None
    m = copy(ts_model)
    g = m.graph
    g.input[0].type.tensor_type.shape.dim[0].dim_value = 100000
    g.initializer.append(numpy_helper.from_array(np.full((1, 3, 1, 1), 2, np.float32), "scale"))
    first = next(n for n in g.node if n.op_type == "Conv")
    g.node.insert(0, helper.make_node("Mul", [g.input[0].name, "scale"], ["scaled"]))
    first.input[0] = "scaled"
    refused(m, source, "a fixed batch of 100000", "dynamic batch")


# --- parameters ---------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dynamo_inline(synthetic_onnx) -> onnx.ModelProto:
    """The dynamo export with its external data read in (BatchNormalization nodes to edit)."""
    return onnx.load(str(synthetic_onnx("dynamo")))


def bn_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == "BatchNormalization"]


def replace_init(model: onnx.ModelProto, name: str, a: np.ndarray) -> None:
    t = next(t for t in model.graph.initializer if t.name == name)
    t.CopyFrom(numpy_helper.from_array(a, name))


def test_batchnorm_variance_mutations_are_refused(dynamo_inline, tmp_path):
    """Seeded: a negative variance on a random channel of a random BatchNormalization (4 cases), variance 0 with
    epsilon 0, and a NaN epsilon: each would write NaN or Inf into the weight file."""
    rng = np.random.default_rng(7)
    source = tmp_path / "edited.onnx"
    for _ in range(4):
        m = copy(dynamo_inline)
        bn = bn_nodes(m)[int(rng.integers(len(bn_nodes(m))))]
        var = numpy_helper.to_array(next(t for t in m.graph.initializer if t.name == bn.input[4])).copy()
        c = int(rng.integers(len(var)))
        var[c] = -float(rng.uniform(0.01, 10))
        replace_init(m, bn.input[4], var)
        refused(m, source, "BatchNormalization variance + epsilon", f"on channel {c}", "must be positive")
    m = copy(dynamo_inline)
    bn = bn_nodes(m)[5]
    var = numpy_helper.to_array(next(t for t in m.graph.initializer if t.name == bn.input[4])).copy()
    var[3] = 0
    replace_init(m, bn.input[4], var)
    set_attr(bn, helper.make_attribute("epsilon", 0.0))
    refused(m, source, "variance + epsilon is 0 on channel 3")
    m = copy(dynamo_inline)
    set_attr(bn_nodes(m)[0], helper.make_attribute("epsilon", float("nan")))
    refused(m, source, "must be positive")


def test_parameters_of_another_type_or_beyond_float32_are_refused(ts_model, dynamo_inline, tmp_path):
    """A conv weight stored as float64 (onnxruntime refuses Conv with mixed types), and a BatchNormalization
    scale of 3e38 whose fold leaves float32's range."""
    source = tmp_path / "edited.onnx"
    m = copy(ts_model)
    conv = [n for n in m.graph.node if n.op_type == "Conv"][40]
    w = numpy_helper.to_array(next(t for t in m.graph.initializer if t.name == conv.input[1])).astype(np.float64)
    replace_init(m, conv.input[1], w)
    refused(m, source, "weight is float64 but the graph input is float32")
    m = copy(dynamo_inline)
    bn = bn_nodes(m)[30]
    gamma = numpy_helper.to_array(next(t for t in m.graph.initializer if t.name == bn.input[1])).copy()
    gamma[2] = 3e38
    replace_init(m, bn.input[1], gamma)
    refused(m, source, "holds values up to", "beyond float32's range")


# --- external data ------------------------------------------------------------------------------------------------

def external(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    return [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]


def set_entry(t: onnx.TensorProto, key: str, value: str | None) -> None:
    for e in list(t.external_data):
        if e.key == key:
            t.external_data.remove(e)
    if value is not None:
        t.external_data.add(key=key, value=value)


def test_external_data_record_mutations_are_refused(dynamo_model, dynamo_folder, tmp_path):
    """Seeded edits of a random external tensor's record (20 cases): offsets and lengths that are negative, not
    numbers, past the end or of another size; a data type changed (DOUBLE reads twice the length); unknown or
    repeated keys; locations outside the folder; a tensor of 2 GiB."""
    rng = np.random.default_rng(99)
    data_name = dynamo_folder.name + ".data"
    size = (dynamo_folder.parent / data_name).stat().st_size
    edits = [
        ("offset", "-4", "not a whole number"), ("offset", "abc", "not a whole number"),
        ("offset", "1e3", "not a whole number"), ("offset", " 5", "not a whole number"),
        ("offset", "\u0663", "not a whole number"), ("offset", str(size), "too short"),
        ("offset", str(10 ** 30), "too short"), ("length", "-1", "not a whole number"),
        ("length", "x", "not a whole number"), ("length", "+1", "length"), ("location", "../" + data_name, "outside"),
        ("location", "/etc/passwd", "outside"), ("location", "", "outside"), ("location", ".", "not a regular file"),
        ("location", "missing.data", "is missing"),
    ]
    cases = 0
    for key, value, words in edits:
        m = copy(dynamo_model)
        t = external(m)[int(rng.integers(len(external(m))))]
        if key == "length" and value == "+1":
            length = int(next(e.value for e in t.external_data if e.key == "length"))
            value = str(length + 4)
        set_entry(t, key, value)
        refused(m, dynamo_folder, words)
        cases += 1
    m = copy(dynamo_model)
    t = max(external(m), key=lambda t: int(np.prod(t.dims)))
    t.data_type = onnx.TensorProto.DOUBLE
    refused(m, dynamo_folder, "length", "DOUBLE", "take")
    m = copy(dynamo_model)
    external(m)[3].external_data.add(key="basepath", value="/")
    refused(m, dynamo_folder, "unknown external-data key 'basepath'")
    m = copy(dynamo_model)
    external(m)[3].external_data.add(key="offset", value="0")
    refused(m, dynamo_folder, "repeats external-data key 'offset'")
    m = copy(dynamo_model)
    external(m)[3].data_type = onnx.TensorProto.STRING
    refused(m, dynamo_folder, "not a numeric tensor")
    m = copy(dynamo_model)
    t = external(m)[3]
    t.dims[:] = [1 << 29]
    set_entry(t, "length", str(4 << 29))
    refused(m, dynamo_folder, "add up to more than 1024 MiB")
    cases += 5
    assert cases == 20


def test_external_data_through_links_and_special_files(dynamo_folder, dynamo_arrays, tmp_path):
    """A symlink in the model's folder to data outside it is refused (real path checked); a FIFO is refused
    without being opened; a symlink to a file inside the folder is fine."""
    folder = tmp_path / "model"
    folder.mkdir()
    model = folder / dynamo_folder.name
    shutil.copy(dynamo_folder, model)
    data = dynamo_folder.with_name(dynamo_folder.name + ".data")
    link = folder / data.name
    link.symlink_to(data)
    msg = refused(onnx_read.load_onnx(model), model, "is a link to", "outside the model's folder")
    assert str(data.resolve()) in msg
    link.unlink()
    os.mkfifo(link)
    refused(onnx_read.load_onnx(model), model, "not a regular file")
    link.unlink()
    shutil.copy(data, folder / "real.data")
    link.symlink_to("real.data")
    arrays, _ = onnx_convert.convert_model(onnx_read.load_onnx(model), model)
    for k, a in dynamo_arrays.items():
        np.testing.assert_array_equal(arrays[k], a)


# --- the command: output paths, interruption, part files --------------------------------------------------------

def invoke(args: list[str], env: dict[str, str] | None = None):
    try:
        r = CliRunner(mix_stderr=False)
    except TypeError:
        r = CliRunner()
    return r.invoke(cli.convert_cmd, args, env=env)


def one_line_error(r, code: int = 2) -> str:
    err = r.stderr.strip()
    assert r.exit_code == code and "\n" not in err and "Traceback" not in r.output, (r.exit_code, r.output)
    return err


def no_part_files(*folders: Path) -> None:
    for folder in folders:
        assert not [p for p in folder.rglob("*.part")], list(folder.rglob("*"))


def test_bad_output_paths_are_one_line(synthetic_onnx, tmp_path):
    """-o naming a directory, a path under a file, a FIFO, a device: refused before converting, nothing written."""
    model = str(synthetic_onnx())
    (tmp_path / "afile").write_text("x")
    os.mkfifo(tmp_path / "fifo")
    cases = [(tmp_path, "is a directory"), (tmp_path / "afile" / "w.npz", "is a file, not a folder"),
             (tmp_path / "afile" / "sub" / "w.npz", "is a file, not a folder"), (tmp_path / "fifo", "a FIFO")]
    if os.path.exists("/dev/full"):
        cases.append((Path("/dev/full"), "a character device"))
    for out, words in cases:
        for force in ([], ["--force"]):
            err = one_line_error(invoke([model, "-o", str(out), *force]))
            assert err.startswith("error: ") and words in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "fifo"]
    assert (tmp_path / "afile").read_text() == "x"


def test_default_output_is_the_user_cache_and_needs_force_to_overwrite(export_like_onnx, tmp_path, monkeypatch):
    """No -o: the user cache ($XDG_CACHE_HOME), which inception-run searches from any folder; a second conversion
    is refused until --force, the file unchanged meanwhile. (A PyTorch export's stand-in: a synthetic model is
    never written there.)"""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("INCEPTION_WEIGHTS", raising=False)
    monkeypatch.chdir(tmp_path)
    model = str(export_like_onnx)
    r = invoke([model])
    assert r.exit_code == 0, r.output
    out = tmp_path / "cache" / "inception-engine" / "inception_v3.npz"
    assert f"wrote {out}" in r.stdout and "inception-run finds it there" in r.stdout
    assert weights.find_weights(None) == out
    before = out.stat().st_mtime_ns
    err = one_line_error(invoke([model]))
    assert str(out) in err and "--force" in err and out.stat().st_mtime_ns == before
    monkeypatch.setenv("INCEPTION_WEIGHTS", str(tmp_path / "elsewhere.npz"))
    r = invoke([model, "--force"])
    assert r.exit_code == 0, r.output
    assert f"inception-run reads $INCEPTION_WEIGHTS ({tmp_path / 'elsewhere.npz'}) instead" in r.stdout
    assert model_files.load_weights(out).manifest["source_name"] == Path(model).name
    assert model_files.load_weights(out).manifest["provenance"]["kind"] == "torchvision"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]
    no_part_files(tmp_path)


def test_ctrl_c_during_conversion_is_130_and_writes_nothing(synthetic_onnx, tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(onnx_convert, "convert_model", interrupted)
    r = invoke([str(synthetic_onnx()), "-o", str(tmp_path / "w.npz")])
    err = one_line_error(r, 130)
    assert err.startswith("interrupted") and list(tmp_path.iterdir()) == []


def test_ctrl_c_during_start_up_is_130_and_one_line(tmp_path):
    """The console script's entry imports the command module itself: Ctrl-C during that import (here raised by an
    import hook) is one line and exit 130."""
    code = ("import sys\n"
            "class Interrupt:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'inception_engine.cli':\n"
            "            raise KeyboardInterrupt\n"
            "sys.meta_path.insert(0, Interrupt())\n"
            "from inception_engine.entry import convert_main\n"
            "convert_main()\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                       check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 130 and p.stderr.strip() == "interrupted; nothing was written", p.stderr


def test_part_files_of_dead_writers_are_removed(tmp_path):
    """The rule of weights.atomic_write: a part file of a process of this host that is gone, or one untouched for a
    day, is removed by the next write of that name; a live writer's is kept."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = weights._host()
    name = "inception_v3.npz"
    stale = tmp_path / f".{name}.{host}.{dead.pid}.0a1b2c3d.part"
    old = tmp_path / f".{name}.tmpab12cd.part"
    live = tmp_path / f".{name}.{host}.{os.getppid()}.0a1b2c3d.part"
    other = tmp_path / f".other.npz.{host}.{dead.pid}.0a1b2c3d.part"
    impossible = tmp_path / f".{name}.{host}.{10 ** 30}.0a1b2c3d.part"
    for p in (stale, old, live, other, impossible):
        p.write_bytes(b"partial")
    os.utime(old, (1, 1))
    weights.atomic_write(tmp_path / name, lambda f: f.write(b"data"))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name, live.name, other.name])
    assert (tmp_path / name).read_bytes() == b"data"


def test_killed_converter_leaves_a_part_file_the_next_run_removes(synthetic_onnx, tmp_path):
    """SIGKILL while the weight file is written leaves its part file; the next conversion to that path removes
    it (the writer's pid is gone) and writes the file."""
    out = tmp_path / "w.npz"
    code = ("import os, signal, sys\n"
            "from inception_engine import weights\n"
            "def killed(f):\n"
            "    f.write(b'half a file')\n"
            "    f.flush()\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n"
            "weights.atomic_write(sys.argv[1], killed)\n")
    p = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, timeout=60, check=False,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == -9
    assert len(list(tmp_path.glob(".w.npz.*.part"))) == 1 and not out.exists()
    r = invoke([str(synthetic_onnx()), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.npz"]


def test_onnx_file_as_weights_is_converted_once_and_cached(dynamo_folder, dynamo_arrays, tmp_path, monkeypatch):
    """--weights / $INCEPTION_WEIGHTS / Engine(path) given the .onnx: converted on first use into the user cache
    under its content hash (said once on stderr), reused after; the arrays are the converter's."""
    from inception_engine.engine import Engine

    cache = tmp_path / "cache" / "inception-engine"
    monkeypatch.setattr(weights, "user_cache_dir", lambda: cache)  # the weights' cache only, not the C kernels'
    image = tmp_path / "x.png"
    from PIL import Image

    Image.fromarray(np.random.default_rng(0).integers(0, 256, (320, 300, 3), dtype=np.uint8)).save(image)
    try:
        runner = CliRunner(mix_stderr=False)
    except TypeError:
        runner = CliRunner()
    args = [str(image), "--weights", str(dynamo_folder), "--backend", "cpu", "--top-k", "1", "--json"]
    first = runner.invoke(cli.run_cmd, args)
    assert first.exit_code == 0, first.output
    cached = list((cache / "converted").iterdir())
    assert len(cached) == 1 and cached[0].suffix == ".npz"
    assert f"converted {dynamo_folder}" in first.stderr and str(cached[0]) in first.stderr
    second = runner.invoke(cli.run_cmd, args)
    assert second.exit_code == 0 and "converted" not in second.stderr, second.output
    assert second.stdout == first.stdout
    monkeypatch.setenv("INCEPTION_WEIGHTS", str(dynamo_folder))
    with Engine(None, backend="cpu") as engine:
        assert engine.weights.path == cached[0]
        for k, a in dynamo_arrays.items():
            np.testing.assert_array_equal(engine.weights.arrays[k], a)
    no_part_files(tmp_path)


def test_an_onnx_file_the_converter_refuses_is_one_line_through_weights(ts_model, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    m = copy(ts_model)
    conv = next(n for n in m.graph.node if n.op_type == "Conv")
    conv.attribute.append(helper.make_attribute("dilationss", [1, 1]))
    path = tmp_path / "edited.onnx"
    path.write_bytes(m.SerializeToString())
    with pytest.raises(EngineError) as e:
        model_files.load_weights(path)
    assert "unknown attribute 'dilationss'" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "cache").exists()


def test_an_onnx_file_as_weights_with_an_unwritable_cache_runs_from_memory(synthetic_onnx, tmp_path, monkeypatch,
                                                                           capsys):
    """The user cache cannot be written (a file where its folder should be): the converted arrays are used for
    this run, and a line says so."""
    (tmp_path / "blocker").write_text("x")
    monkeypatch.setattr(weights, "user_cache_dir", lambda: tmp_path / "blocker" / "inception-engine")
    model = synthetic_onnx()
    w = model_files.load_weights(model)
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"note: converted {model} for this run only") and "is a file" in err and "\n" not in err
    assert w.path == model and sorted(w.arrays) == sorted(arch.weight_shapes())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocker"]
