#!/usr/bin/env bash
# Compile the bytecode of the package and of the kits' site folders, as `pip install` leaves it on a user's machine.
# The device machine runs Python with PYTHONDONTWRITEBYTECODE set (sys.flags.dont_write_bytecode = 1), the project
# is an editable install and the kits install with --no-compile, so there every process would compile our modules,
# pycuda's and the kits' from source, every time: `import inception_engine.cli` 50 ms against 25 ms compiled, and
# `inception-run --server`'s first result 0.28 s against 0.14 s (fourteenth session, dev/performance-log.md).
# Start-up timings run after this, as a user's would after an install. From the repo root:
#
#   bash dev/gpu_machine/compile_bytecode.sh [DIR...]   # default: inception_engine and the kits' /tmp folders
set -u
dirs=("$@")
[ ${#dirs[@]} -gt 0 ] || dirs=(inception_engine /tmp/site /tmp/servesite /tmp/fidsite /tmp/nvimg)
present=()
for d in "${dirs[@]}"; do [ -d "$d" ] && present+=("$d"); done
python3 -m compileall -q -j 0 "${present[@]}" >/dev/null || echo "compile_bytecode: compileall failed" >&2
