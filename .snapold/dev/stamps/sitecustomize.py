"""Start-up stamps (dev/startup_stamps.py): imported by every Python process that has this folder on its PYTHONPATH,
the spawned workers of inception-run --gpus included. With IE_STAMPS=DIR set, a process records when it started, the
start and end of each function of STAMPED (wrapped as its module is imported) and when its exit began, and writes
them to DIR/<pid>.json at exit. Without IE_STAMPS it does nothing."""

from __future__ import annotations

import os

# module -> the functions (or Class.method) stamped there: the steps of an engine's start, a run, and its end
STAMPED = {
    "inception_engine.engine": ["Engine._start", "Engine.runner", "Engine.close"],
    "inception_engine.ingest.jpeg_decode": ["open_native", "warm_up"],
    "inception_engine.backends.cuda.backend": ["CudaBackend.__init__", "tune_configs"],
    "inception_engine.backends.cuda.device": ["Gpu.__init__"],
    "inception_engine.backends.cuda.params": ["pack_params"],
    "inception_engine.cuda_graph": ["CudaGraph.__init__"],
    "inception_engine.cli": ["expand_inputs", "write_results"],
    "inception_engine.multi_gpu": ["start_on_gpus", "GpuRun.classify", "GpuRun.facts", "GpuRun.close"],
    "inception_engine.output": ["ResultFile.close"],
    "inception_engine.model_files": ["load_weights"],
    "inception_engine.backends.cuda.kernels": ["Kernels.__init__"],
    "inception_engine.cuda_runner": ["CudaRunner.__init__", "CudaRunner.attach", "CudaRunner.submit",
                                     "CudaRunner.close"],
    "inception_engine.ingest.workers": ["DecodePool.__init__", "DecodePool.close", "_attach_ring",
                                        "_decode_chunk_in_worker"],
    "inception_engine.fid_command": ["list_folder", "score_folder", "scores"],
    "inception_engine.fid": ["load_stats", "RunningStats.result", "trace_sqrt_product"],
    "numpy.linalg": ["cholesky", "eigh", "eigvalsh"],  # the distance's parts (fid.py calls them through np.linalg)
}

if os.environ.get("IE_STAMPS"):
    import atexit
    import functools
    import importlib.abc
    import importlib.util
    import json
    import sys
    import threading
    import time

    START = time.time()
    EVENTS: list[tuple[str, float, float, str]] = []  # (step, start, end, thread)

    def stamped(owner: object, name: str, step: str) -> None:
        f = getattr(owner, name, None)
        if f is None:
            return

        @functools.wraps(f)
        def wrapper(*args: object, **kwargs: object) -> object:
            t = time.time()
            try:
                return f(*args, **kwargs)
            finally:
                EVENTS.append((step, t, time.time(), threading.current_thread().name))

        setattr(owner, name, wrapper)

    class StampingFinder(importlib.abc.MetaPathFinder):
        """Finds the modules of STAMPED as the import system would, then wraps their steps once they have run."""

        def find_spec(self, fullname: str, path: object, target: object = None) -> object:
            if fullname not in STAMPED:
                return None
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(fullname)
            finally:
                sys.meta_path.insert(0, self)
            if spec is None or spec.loader is None:
                return spec
            run = spec.loader.exec_module

            def exec_module(module: object) -> None:
                run(module)
                for step in STAMPED[fullname]:
                    *outer, name = step.split(".")
                    owner = module
                    for part in outer:
                        owner = getattr(owner, part, None)
                    if owner is not None:
                        stamped(owner, name, step)

            spec.loader.exec_module = exec_module  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, StampingFinder())

    def write() -> None:
        EVENTS.append(("exit", time.time(), time.time(), "MainThread"))
        folder = os.environ["IE_STAMPS"]
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{os.getpid()}.json"), "w") as f:
            json.dump({"pid": os.getpid(), "parent": os.getppid(), "start": START,
                       "gpu": os.environ.get("CUDA_VISIBLE_DEVICES"), "events": EVENTS}, f)

    atexit.register(write)

    # a --decode gpu worker leaves by os._exit once its results are handed over, which runs no atexit function
    leave = os._exit

    def stamped_exit(code: int) -> None:
        write()
        leave(code)

    os._exit = stamped_exit
