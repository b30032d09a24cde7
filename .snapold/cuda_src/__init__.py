"""The CUDA C sources of the engine's kernels, shipped as package data; inception_engine.cuda_build compiles them."""
