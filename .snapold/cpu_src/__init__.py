"""The C sources of the float32 CPU kernels, shipped as package data; inception_engine.backends.cpu_kernels compiles
them with the system C compiler at first use."""
