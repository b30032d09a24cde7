"""Our 8-bit reference beside onnxruntime's quantize_static, on the same model and the same calibration images
(issue 49's accuracy comparison; the CPU version: the synthetic model, image-like inputs at a small size).

Both are calibrated on the same images with the same method (the 99.99th percentile of |x|, symmetric int8; ours is
calibrate.py's, onnxruntime's its CalibrationMethod.Percentile), both quantize weights per output channel, and both
are judged on held-out images by the cosine of their logits to our fp32 logits, top-1 agreement with fp32, and
cosine and relative L2 distance to the float64 network's logits. Random-weight networks are chaotic, so the cosine
and L2 say more than top-1. onnxruntime runs its QDQ model on the CPU (its int8 kernels where it has them).

    PYTHONPATH=$PWD python dev/int8_accuracy.py --calibration 32 --held-out 64 --size 75
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from inception_engine.backends.int8_reference import float_walk, forward_int8
from inception_engine.calibrate import PERCENTILE, calibration_record
from inception_engine.model_files import load_weights
from inception_engine.onnx_convert import convert
from inception_engine.synthetic import image_like_batch, synthetic_onnx_model

BATCH = 8


@dataclass
class Row:
    name: str
    cos_fp32: float  # mean over images
    top1_fp32: float  # fraction of images whose top-1 is fp32's
    cos_f64: float
    rel_l2_f64: float  # ||logits - float64|| / ||float64||, over the whole set


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def row(name: str, got: np.ndarray, fp32: np.ndarray, f64: np.ndarray) -> Row:
    return Row(name, float(cosine(got, fp32).mean()), float((got.argmax(1) == fp32.argmax(1)).mean()),
               float(cosine(got, f64).mean()), float(np.linalg.norm(got - f64) / np.linalg.norm(f64)))


def sized_model(size: int, seed: int) -> onnx.ModelProto:
    """The synthetic model with its input declared size x size (the network takes any size from 75)."""
    model = synthetic_onnx_model(seed=seed)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_value = dims[3].dim_value = size
    return model


def batched(x: np.ndarray) -> list[np.ndarray]:
    return [x[i:i + BATCH] for i in range(0, len(x), BATCH)]


def ort_int8(model_path: Path, calib: np.ndarray, out: Path) -> Path:
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                          quantize_static)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter(batched(calib))

        def get_next(self) -> dict[str, np.ndarray] | None:
            x = next(self.batches, None)
            return None if x is None else {"input": x}

    quantize_static(str(model_path), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    calibrate_method=CalibrationMethod.Percentile,
                    extra_options={"ActivationSymmetric": True, "WeightSymmetric": True,
                                   "CalibPercentile": PERCENTILE})
    return out


def ort_run(path: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    return np.concatenate([sess.run(None, {"input": b})[0] for b in batched(x)])


def compare(calibration: int, held_out: int, size: int = 75, seed: int = 0) -> list[Row]:
    """The rows of the side-by-side table: fp32 of both runtimes, then both 8-bit networks."""
    calib = image_like_batch(calibration, seed=seed + 1, size=size)
    x = image_like_batch(held_out, seed=seed + 2, size=size)
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = Path(tmp) / "model.onnx"
        onnx.save(synthetic_onnx_model(seed=seed), str(onnx_path))
        weights = load_weights(convert(onnx_path, Path(tmp) / "w.npz"))  # the converter takes the 299 export
        onnx.save(sized_model(size, seed), str(onnx_path))
        weights.manifest["provenance"]["calibration"] = calibration_record(
            weights, batched(calib), calibration, "synthetic image_like_batch")
        ort_fp32 = ort_run(onnx_path, x)
        ort_q = ort_run(ort_int8(onnx_path, calib, Path(tmp) / "model.int8.onnx"), x)
    fp32 = np.concatenate([float_walk(weights, b, lambda n, t: None) for b in batched(x)])
    f64 = np.concatenate([float_walk(weights, b, lambda n, t: None, np.float64) for b in batched(x)])
    ours = np.concatenate([forward_int8(weights, b) for b in batched(x)])
    return [row("ours fp32", fp32, fp32, f64), row("onnxruntime fp32", ort_fp32, fp32, f64),
            row("ours int8", ours, fp32, f64), row("onnxruntime int8 (quantize_static QDQ)", ort_q, fp32, f64)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calibration", type=int, default=32, help="calibration images (the same for both)")
    p.add_argument("--held-out", type=int, default=64, help="held-out images the logits are compared on")
    p.add_argument("--size", type=int, default=75, help="input size (299 on a machine with time)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.calibration % BATCH:  # onnxruntime's percentile calibrator stacks its batches: they must be one shape
        p.error(f"--calibration must be a multiple of {BATCH} (onnxruntime's calibrator takes equal batches)")
    logging.getLogger().setLevel(logging.ERROR)  # quantize_static's notes on biases it leaves in float (shared ones)
    rows = compare(a.calibration, a.held_out, a.size, a.seed)
    print(f"synthetic model, {a.size}x{a.size}, {a.calibration} calibration / {a.held_out} held-out images, "
          f"percentile {PERCENTILE}")
    print(f"{'':42} {'cos fp32':>9} {'top1=fp32':>9} {'cos f64':>9} {'relL2 f64':>10}")
    for r in rows:
        print(f"{r.name:42} {r.cos_fp32:9.6f} {r.top1_fp32:9.3f} {r.cos_f64:9.6f} {r.rel_l2_f64:10.2e}")


if __name__ == "__main__":
    main()
