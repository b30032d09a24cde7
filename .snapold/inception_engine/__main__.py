"""``python -m inception_engine``: the package's version and its commands, each with its first line of help (exit 0).

The commands are the console scripts the installed distribution declares (pyproject's [project.scripts]), so the
list stays true as commands are added; each one's own --help says the rest."""

from __future__ import annotations

import sys
from importlib import metadata

DISTRIBUTION = "inception-engine"


def commands() -> list[tuple[str, str]]:
    """(name, what it does) of each console command the installed distribution declares, by name: the first
    paragraph of its entry function's docstring (cli.py's *_main say what their command does)."""
    out = []
    for ep in metadata.distribution(DISTRIBUTION).entry_points:
        if ep.group != "console_scripts":
            continue
        try:
            doc = ep.load().__doc__ or ""
        except Exception:  # a command that cannot be imported here (a missing optional dependency) is still listed
            doc = ""
        out.append((ep.name, " ".join(doc.strip().split("\n\n")[0].split())))
    return sorted(out)


def main() -> int:
    try:
        version = metadata.version(DISTRIBUTION)
        listed = commands()
    except metadata.PackageNotFoundError:
        print(f"{DISTRIBUTION} is not installed (pip install -e . in the repository) and has no commands yet")
        return 0
    print(f"{DISTRIBUTION} {version}: Inception-V3 image classification without PyTorch. Commands (each takes "
          f"--help and --version):")
    width = max((len(name) for name, _ in listed), default=0)
    for name, line in listed:
        print(f"  {name:<{width}}  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
