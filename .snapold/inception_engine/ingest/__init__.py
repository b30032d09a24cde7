"""The input side: from the names a user gives to decoded uint8 crops (size x size x 3), on the host or the GPU.

    inputs.py       what the commands' arguments name: files, directories (--recursive), globs
    files.py        an input (a path or an in-memory image), its name in the results; files read whole
    images.py       CPU decode: Pillow, EXIF orientation, RGB, torchvision's Resize and CenterCrop (Preprocess);
                    the normalisation a host runner applies
    pil_resize.py   Pillow's bilinear resize in NumPy, bit for bit: the crop of very long images, and the GPU
                    resize's coefficients
    ring.py         HostRing: the host memory decoded images wait in (shared with decode processes)
    workers.py      DecodePool: thread or process decode workers writing into the ring's slots
    jpeg_header.py  which files the GPU decoder takes, from their headers
    jpeg_batch.py   cuda_src/jpeg_batch.c from Python: a call's files read and decoded by nvImageCodec's C API
    nvimgcodec.py   nvImageCodec's Python API, as each release shapes it
    gpu_resize.py   resize_pil.cu's passes: Pillow's resize and centre crop of decoded device images
    gpu_fid_resize.py  resize_fid.cu's: pytorch-fid's and clean-fid's resizes into the network's float32 input
    jpeg_decode.py  GpuJpegDecoder: --decode gpu, files to crops in device memory

The rule of the package's imports, checked by tests/unit/test_layering.py:
- the backends never import it: a backend takes host or device tensors, whatever made them;
- it never imports the pipeline (pipeline.py, cuda_runner.py, output.py) or anything above it: the pipeline joins
  this side to a backend, not the other way round;
- of the backends it imports only the CUDA kernel layer, ``backends.cuda.device`` (pycuda's driver) and
  ``backends.cuda.kernels`` (the kernel registry and launches), which the GPU decoder's resize runs on; the caller
  hands it the backend's loaded ``Kernels`` and keeps its context current.
Nothing is imported here: ``inception_engine.ingest.inputs`` does not load the GPU decoder's modules.
"""
