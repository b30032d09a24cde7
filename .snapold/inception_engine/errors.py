"""User-facing errors. The CLI prints ``str(error)`` as one line and exits with ``exit_code``; no traceback."""

from __future__ import annotations


class EngineError(Exception):
    """Something the user can fix (bad file, missing weights, unavailable backend). The message says what."""

    exit_code = 2


class ConversionError(EngineError):
    """The ONNX file is not an Inception-V3 export this converter understands."""


class WeightsError(EngineError):
    """A weight file is missing, corrupt or of another format version."""


class BackendUnavailable(EngineError):
    """The requested backend cannot run here (no GPU, no pycuda, no cuDNN, no PyTorch ...)."""


class OptionError(EngineError):
    """An argument that cannot be honoured, e.g. a precision the backend lacks. ``str()`` names the Python keyword
    (``precision='fp16': ...``); ``as_flag()`` names the command's option instead (``--precision fp16: ...``), so
    that each interface words the error in its own terms."""

    def __init__(self, option: str, value: object, reason: str):
        self.option, self.value, self.reason = option, value, reason
        super().__init__(f"{option}={value!r}: {reason}")

    def as_flag(self) -> str:
        return f"--{self.option.replace('_', '-')} {self.value}: {self.reason}"


def first_line(e: BaseException) -> str:
    """An exception's message cut to its first line (its type's name where it has none): what a one-line error
    quotes of a library's exception."""
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
