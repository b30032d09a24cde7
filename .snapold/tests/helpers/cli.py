"""Running the click commands in-process."""

from __future__ import annotations

from click.testing import CliRunner

from inception_engine.backends import cpu_kernels


def runner() -> CliRunner:
    try:
        return CliRunner(mix_stderr=False)  # click < 8.2 mixes stderr into stdout unless told
    except TypeError:
        return CliRunner()  # click >= 8.2 keeps result.stderr apart always


def one_line_error(result) -> str:
    """The error output of a failed command: exactly one line, 'error: ...', and no traceback."""
    err = result.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert "Traceback" not in result.output
    return err


def cpu_notes() -> tuple[str, ...]:
    """The notes an engine on the CPU backend takes on this machine: that it runs its NumPy code where the C kernels
    are unavailable (no AVX-512F, no C compiler), else none."""
    note = cpu_kernels.numpy_code_note()
    return () if note is None else (note,)


def cpu_notes_stderr() -> str:
    """cpu_notes as a run prints them on stderr."""
    return "".join(f"note: {n}\n" for n in cpu_notes())
