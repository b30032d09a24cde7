"""User-facing errors. The CLI prints ``str(error)`` as one line and exits with ``exit_code``; no traceback."""


class EngineError(Exception):
    """Something the user can fix (bad file, missing weights, unavailable backend). The message says what."""

    exit_code = 2


class ConversionError(EngineError):
    """The ONNX file is not an Inception-V3 export this converter understands."""


class WeightsError(EngineError):
    """A weight file is missing, corrupt or of another format version."""


class BackendUnavailable(EngineError):
    """The requested backend cannot run here (no GPU, no pycuda, no cuDNN, no PyTorch ...)."""
