"""Measure the two ceilings of the GPU this runs on (inception-bench's roofline, bench.PEAK_TFLOPS): an fp32 SGEMM with
TF32 off, and a large device-to-device copy (bytes read + written); and the tensor cores' GEMM peaks of the fast modes,
the same SGEMM with TF32 on and an fp16 GEMM (inception-bench's compute floor for --precision tf32 / fp16). Needs
PyTorch with CUDA. Prints one line each."""

import argparse


def _time_ms(fn, reps: int = 10, warmup: int = 3) -> float:
    import torch

    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()
    import torch  # imported here: --help answers without PyTorch

    torch.backends.cuda.matmul.allow_tf32 = False
    n = 8192
    a, b = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")
    ms = _time_ms(lambda: a @ b)
    print(f"{torch.cuda.get_device_name()}: fp32 SGEMM {n}^3 (TF32 off): {2 * n**3 / ms / 1e9:.1f} TFLOP/s")
    torch.backends.cuda.matmul.allow_tf32 = True
    ms = _time_ms(lambda: a @ b)
    print(f"{torch.cuda.get_device_name()}: fp32 GEMM {n}^3 with TF32: {2 * n**3 / ms / 1e9:.1f} TFLOP/s")
    a16, b16 = a.half(), b.half()
    ms = _time_ms(lambda: a16 @ b16)
    print(f"{torch.cuda.get_device_name()}: fp16 GEMM {n}^3: {2 * n**3 / ms / 1e9:.1f} TFLOP/s")
    x = torch.randn(2**29, device="cuda")  # 2 GiB
    y = torch.empty_like(x)
    ms = _time_ms(lambda: y.copy_(x))
    print(f"{torch.cuda.get_device_name()}: device-to-device copy 2 GiB: {2 * x.numel() * 4 / ms / 1e6:.0f} GB/s "
          f"(read + write)")


if __name__ == "__main__":
    main()
