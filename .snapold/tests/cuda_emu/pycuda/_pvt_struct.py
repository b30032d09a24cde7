"""pycuda._pvt_struct for the emulator: ``pack`` keeps the arguments as they are, for Function._launch_kernel."""


def pack(fmt: str, *args: object) -> tuple:
    if len(args) != len(fmt):
        raise ValueError(f"{len(args)} arguments for format {fmt!r}")
    return args
