"""Console-script entry of inception-convert-weights. It imports the command module itself, so that Ctrl-C while
those imports run (click, NumPy, the engine: about a second on a cold start) ends as Ctrl-C does inside the
command, with one line on stderr and exit code 130, not a KeyboardInterrupt traceback."""

from __future__ import annotations

import sys


def convert_main() -> None:
    """Convert torchvision's Inception-V3 ONNX export into the engine's weight file (or write a synthetic model)."""
    try:
        from .cli import convert_main as main
    except KeyboardInterrupt:
        sys.stderr.write("interrupted; nothing was written\n")
        raise SystemExit(130) from None
    main()
