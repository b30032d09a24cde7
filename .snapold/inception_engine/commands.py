"""What every console command shares: one-line usage errors (exit 2), one-line EngineErrors (exit 2), --version and
-h/--help. cli.py, serve/command.py and fid_command.py build their commands from these."""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import click

from .errors import EngineError, OptionError

CONTEXT = {"help_option_names": ["-h", "--help"]}
DISTRIBUTION = "inception-engine"


def version_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--version on a command: the installed package's version (importlib.metadata, through click). A decorator made
    afresh for each command: click's remembers the first program name it printed."""
    return click.version_option(package_name=DISTRIBUTION, message="%(prog)s %(version)s")(fn)


class OneLineUsage(click.UsageError):
    """A usage error as one line, ``error: no such option --precison (did you mean --precision?)``, exit code 2,
    instead of click's usage block."""

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.message}", err=True)


def usage_line(e: click.UsageError) -> str:
    if isinstance(e, click.NoSuchOption):
        import difflib  # on use: only a mistyped option asks

        guess = difflib.get_close_matches(e.option_name, e.possibilities or [], n=1)
        return f"no such option {e.option_name}" + (f" (did you mean {guess[0]}?)" if guess else "")
    text = " ".join(e.format_message().split()).rstrip(".")
    return text[:1].lower() + text[1:]


class Command(click.Command):
    """click.Command whose usage errors are one line (OneLineUsage); --help is click's."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as e:
            prog = ctx.command_path or self.name
            raise OneLineUsage(f"{usage_line(e)}; {prog} --help lists the options", ctx) from None


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


class UserError(click.ClickException):
    """An EngineError on its way out: one line on stderr, exit code 2."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.message}", err=True)


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except EngineError as e:  # an OptionError names the command's flag rather than the Python keyword
            message = e.as_flag() if isinstance(e, OptionError) else str(e)
            raise UserError(" ".join(message.split())) from None  # one line, whatever the message held

    return wrapper


def stderr_is_tty() -> bool:
    return sys.stderr.isatty()


def process_start() -> float:
    """When this process started, on ``time.perf_counter``'s clock: the kernel's start time of the process (Linux
    /proc, in clock ticks: 10 ms) against the boot clock, so that a command's summary counts its wall time as the
    user's ``time`` does, interpreter and imports included. Elsewhere: now."""
    now = time.perf_counter()
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # after the command name, which may hold spaces
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of proc(5): starttime
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError, AttributeError):
        return now
    return now - age if 0 <= age < 86400 * 365 else now


# A command that starts within this many seconds of its process (interpreter, imports: ~0.1-2 s) is the process's
# own, and counts from the process's start; later, it was called inside a longer-lived one (a test, a notebook).
OWN_PROCESS_S = 10.0


def command_start() -> float:
    """Where a command's summary counts from, on ``time.perf_counter``'s clock: the process's start (process_start)
    for a command that is its process's own, else now."""
    now = time.perf_counter()
    started = process_start()
    return started if now - started < OWN_PROCESS_S else now
