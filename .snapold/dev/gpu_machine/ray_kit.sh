#!/bin/bash
# Ray Data for the GPU (device) machine, which reaches no package registry: ray[data] (ray, pyarrow, pandas and their
# pure-Python deps; never numpy: the machine's is used) for CPython 3.12 manylinux x86-64, pruned and stripped, packed
# as .raykit/raykit.tar.xz (git-ignored, ~39 MiB; carry it). For dev/bench_ray.py and tests/e2e/test_ray.py there:
#
#   bash dev/gpu_machine/ray_kit.sh build        # on a development machine with python3.12, pip and PyPI: (re)builds .raykit/
#   source .whl/gpu-env.sh && source dev/gpu_machine/ray_kit.sh install && python3 dev/bench_ray.py DIR
#                                        # on the device: unpacks into /tmp/raysite, appends /tmp/raysite/site to
#                                        # PYTHONPATH and prints one line of versions
#
# The kit plus .whl/ whole (31 MiB, 26 of them nvImageCodec, which only --decode gpu needs) exceed the 64 MiB a device
# call carries: for Ray runs carry .raykit, .whl/gpu-env.sh and the small .whl/*.whl one by one, not the nvimgcodec
# and nvjpeg wheels.
#
# Ray's binaries (raylet, gcs_server, _raylet.so) stay inside the ray package, where Ray looks for them. Pruned: numpy,
# console scripts, Java jars, the dashboard's web client (start Ray with include_dashboard=False), rllib/serve/llm,
# tests, headers, C/Cython sources, stubs, pyarrow's Arrow Flight; every ELF file is stripped. The deps a machine may
# already have (packaging, protobuf, requests, ...) are packed under fallback/ and installed only where the machine
# lacks them or has one older than MINVERS below, so the kit never shadows the machine's packages.

RAY_VERSION=2.60.0
PYARROW_VERSION=25.0.1  # pyarrow 26 needs numpy >= 2 (apache/arrow#48473); 25 runs on 1.26 and 2.x
PANDAS_VERSION=2.3.3     # pandas 3 needs numpy >= 2; 2.3 runs on 1.26 and 2.x

_rk_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
_rk_kit="$_rk_root/.raykit"

_rk_build() {
  set -euo pipefail
  local py="${PYTHON312:-}"
  if [ -z "$py" ]; then
    py="$(command -v python3.12 2>/dev/null || true)"
    "$py" -V >/dev/null 2>&1 || py="$(ls -d /root/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | tail -1)"
  fi
  "$py" -V >/dev/null 2>&1 || { echo "ray_kit: python3.12 not found (set PYTHON312)" >&2; return 1; }
  command -v strip >/dev/null && command -v xz >/dev/null || { echo "ray_kit: build needs strip and xz" >&2; return 1; }
  work="$(mktemp -d /tmp/raykit-build.XXXXXX)"
  trap 'rm -rf "$work"' EXIT
  local t="$work/site"
  echo "ray_kit: pip install into $t with $("$py" -V)"
  "$py" -m pip install -q --target "$t" --no-compile --python-version 3.12 --implementation cp --abi cp312 \
    --only-binary=:all: --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 \
    "ray[data]==$RAY_VERSION" "pyarrow==$PYARROW_VERSION" "pandas==$PANDAS_VERSION"
  echo "ray_kit: installed $(du -sm "$t" | cut -f1) MiB"

  # never numpy: the machine's own is used; no console scripts (their shebangs name this machine's python)
  rm -rf "$t"/numpy "$t"/numpy.libs "$t"/numpy-*.dist-info "$t"/bin
  # what the machine may already have goes under fallback/<dist>/ (installed only where missing or too old)
  "$py" - "$t" "$work/kit" <<'PY'
import os, shutil, sys
t, kit = sys.argv[1:3]
os.makedirs(os.path.join(kit, "fallback"))
owner = {}
for d in sorted(os.listdir(t)):
    if not d.endswith(".dist-info"):
        continue
    dist = d.split("-", 1)[0]
    tops = {d}
    for line in open(os.path.join(t, d, "RECORD")):
        top = line.split(",", 1)[0].split("/", 1)[0]
        if top and top != ".." and not top.endswith(".dist-info"):
            tops.add(top)
    for top in tops:
        if top in owner:
            sys.exit(f"ray_kit: {top} belongs to {owner[top]} and {dist}")
        owner[top] = dist
    if dist not in ("ray", "pyarrow", "pandas"):
        os.makedirs(os.path.join(kit, "fallback", dist))
        for top in tops:
            if os.path.exists(os.path.join(t, top)):
                shutil.move(os.path.join(t, top), os.path.join(kit, "fallback", dist, top))
left = sorted(set(os.listdir(t)) - {k for k, v in owner.items() if v in ("ray", "pyarrow", "pandas")})
if left:
    sys.exit(f"ray_kit: no dist owns {left}")
shutil.move(t, os.path.join(kit, "site"))
PY
  cd "$work/kit"
  # ray: Java, the dashboard's web client, libraries Ray Data does not use, Cython/C sources, stubs
  rm -rf site/ray/jars site/ray/dashboard/client site/ray/rllib site/ray/serve site/ray/llm site/ray/data/llm.py \
    site/ray/cpp site/ray/includes site/ray/_raylet.pxd site/ray/_raylet.pyi site/ray/setup-dev.py
  # pyarrow: headers, sources, tests and Arrow Flight (only Ray Data's disk-based shuffle imports pyarrow.flight).
  # Every extension module under pyarrow.fs stays, S3 (the AWS SDK) included: Ray Data tests isinstance(fs,
  # pa.fs.S3FileSystem) and probes pa.fs.AzureFileSystem, which raise ImportError where pyarrow lacks them.
  rm -rf site/pyarrow/include site/pyarrow/src site/pyarrow/tests site/pyarrow/_pyarrow_cpp_tests.* \
    site/pyarrow/libarrow_flight.so* site/pyarrow/libarrow_python_flight.so* site/pyarrow/_flight.* \
    site/pyarrow/flight.py
  # wheels carry no symlinks: keep only the SONAME copies (what the extension modules load)
  rm -f site/pyarrow/libarrow_python*.so site/pyarrow/libarrow_python*.so.*.*.*
  rm -rf site/pandas/tests site/pandas/conftest.py
  find . -depth \( -name __pycache__ -o -name tests -o -name test -o -name testing_data \) -type d \
    -exec rm -rf {} +
  find . \( -name '*.pyi' -o -name '*.pxd' -o -name '*.pxi' -o -name '*.pyx' -o -name '*.h' -o -name '*.hpp' \
    -o -name '*.c' -o -name '*.cc' -o -name '*.cpp' -o -name '*.a' -o -name '*.js.map' -o -name RECORD \
    -o -name 'py.typed' \) -type f -delete
  echo "ray_kit: pruned $(du -sm . | cut -f1) MiB"
  # strip every ELF file (shared objects and Ray's executables)
  local f
  while IFS= read -r -d '' f; do
    if [ "$(head -c4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ]; then strip --strip-unneeded "$f" 2>/dev/null || true; fi
  done < <(find . -type f \( -name '*.so' -o -name '*.so.*' -o -perm -u+x \) -print0)
  echo "ray_kit: stripped $(du -sm . | cut -f1) MiB"

  (cd site && ls -d ray-*.dist-info pyarrow-*.dist-info pandas-*.dist-info) | sed 's/\.dist-info$//' > VERSIONS
  (cd fallback && ls -d */*.dist-info) | sed 's|.*/||; s/\.dist-info$//' >> VERSIONS
  echo "ray_kit: packing $(du -sm . | cut -f1) MiB ($(find . -type f | wc -l) files)"
  mkdir -p "$_rk_kit"
  rm -f "$_rk_kit"/raykit.tar.xz*
  # the x86 branch filter helps the machine code; one LZMA2 stream, single-threaded, for the best ratio
  tar --owner=0 --group=0 --numeric-owner --sort=name -cf - VERSIONS site fallback \
    | xz -T1 --x86 --lzma2=preset=9e,dict=192MiB > "$_rk_kit/raykit.tar.xz"
  cp VERSIONS "$_rk_kit/VERSIONS"
  echo "ray_kit: built $_rk_kit/raykit.tar.xz: $(du -m "$_rk_kit/raykit.tar.xz" | cut -f1) MiB" \
    "($(stat -c%s "$_rk_kit/raykit.tar.xz") bytes)"
}

_rk_install() {
  local dest=/tmp/raysite
  [ -f "$_rk_kit/raykit.tar.xz" ] || { echo "ray_kit: $_rk_kit/raykit.tar.xz missing: build it with 'bash dev/gpu_machine/ray_kit.sh build' and carry .raykit" >&2; return 1; }
  rm -rf "$dest" && mkdir -p "$dest" || return 1
  python3 - "$_rk_kit/raykit.tar.xz" "$dest" <<'PY' || { echo "ray_kit: install failed" >&2; return 1; }
import importlib.metadata as md, os, re, shutil, sys, tarfile
kit, dest = sys.argv[1:3]
with tarfile.open(kit, "r:xz") as tf:
    tf.extractall(dest, filter="tar")
# minimum versions Ray 2.60 / pandas 2.3 / jsonschema / requests need; a dist not listed needs any version
MINVERS = {"packaging": "24.2", "msgpack": "1.0.0", "protobuf": "3.20.3", "click": "7.0", "python_dateutil": "2.8.2",
           "pytz": "2020.1", "tzdata": "2022.7", "attrs": "22.2.0", "referencing": "0.28.4", "rpds_py": "0.7.1",
           "urllib3": "1.21.1", "idna": "2.5", "charset_normalizer": "2.0", "certifi": "2017.4.17",
           "typing_extensions": "4.4.0", "fsspec": "2023.1.0", "jsonschema": "4.0"}
def vt(v):
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:3])
fb = os.path.join(dest, "fallback")
added = []
for dist in sorted(os.listdir(fb)):
    try:
        have = md.version(dist)
    except md.PackageNotFoundError:
        have = None
    if have is not None and vt(have) >= vt(MINVERS.get(dist, "0")):
        continue
    for entry in os.listdir(os.path.join(fb, dist)):
        shutil.move(os.path.join(fb, dist, entry), os.path.join(dest, "site", entry))
    added.append(dist)
shutil.rmtree(fb)
print("ray_kit: bundled deps used:", " ".join(added) or "none")
PY
  export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$dest/site"
  python3 -c "import ray, ray.data, pyarrow, pandas, numpy; print(f'ray_kit: ray {ray.__version__} | pyarrow {pyarrow.__version__} | pandas {pandas.__version__} | numpy {numpy.__version__} ({numpy.__file__.rsplit(\"/numpy/\", 1)[0]})')" \
    || { echo "ray_kit: import of ray.data failed after install" >&2; return 1; }
}

case "${1:-}" in
  build) (_rk_build); _rk_rc=$? ;;
  install)
    if [ "${BASH_SOURCE[0]}" = "$0" ]; then
      echo "ray_kit: 'install' must be sourced to set PYTHONPATH: source dev/gpu_machine/ray_kit.sh install" >&2; _rk_rc=2
    else _rk_install; _rk_rc=$?; fi ;;
  *) echo "usage: bash dev/gpu_machine/ray_kit.sh build | source dev/gpu_machine/ray_kit.sh install" >&2; _rk_rc=2 ;;
esac
unset -f _rk_build _rk_install
unset _rk_root _rk_kit RAY_VERSION PYARROW_VERSION PANDAS_VERSION
return $_rk_rc 2>/dev/null || exit $_rk_rc
