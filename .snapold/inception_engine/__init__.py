"""inception-engine: Inception-V3 inference on NVIDIA GPUs with its own CUDA kernels, plus cuDNN and NumPy paths."""

__version__ = "0.1.0"
