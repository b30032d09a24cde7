#!/bin/bash
# inception-serve's HTTP packages for the GPU (device) machine, which reaches no package registry (Python 3.12):
# starlette, uvicorn (+ httptools, uvloop), prometheus-client for the server; tritonclient[http] (+ aiohttp) for
# dev/bench_serve.py's load and the tests; litserve (+ fastapi, pydantic, pyzmq) for the peer server; py-spy (its
# binary in a py3 wheel; on PATH after install) for bench_serve.py --profile. cp312
# manylinux wheels into .whl/serve (git-ignored, ~25 MB; numpy is left out: the machine's is used; torch and
# torchvision are the machine's):
#
#   bash dev/gpu_machine/serve_kit.sh download       # here, with pip and PyPI
#   source dev/gpu_machine/serve_kit.sh install      # on the GPU machine (carry .whl/serve): installs into
#                                                    # /tmp/servesite and puts it on PYTHONPATH
#   python3 dev/bench_serve.py --json /tmp/serve.json

_sk_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
_sk_dir="$_sk_root/.whl/serve"
_sk_site=/tmp/servesite
_sk_pkgs=("starlette>=0.37" "uvicorn>=0.30" "httptools>=0.6" "uvloop>=0.19" "prometheus-client>=0.20"
          "tritonclient[http]>=2.40" "litserve>=0.2.10" "py-spy>=0.3.14")

_sk_download() {
  set -euo pipefail
  mkdir -p "$_sk_dir"
  python3 -m pip download -q --python-version 3.12 --implementation cp --abi cp312 --only-binary=:all: \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    -d "$_sk_dir" "${_sk_pkgs[@]}"
  rm -f "$_sk_dir"/numpy-*.whl  # the machine's numpy
  echo "serve_kit: $(ls "$_sk_dir" | wc -l) wheels, $(du -sm "$_sk_dir" | cut -f1) MiB in $_sk_dir"
}

_sk_install() {
  [ -d "$_sk_dir" ] || { echo "serve_kit: no $_sk_dir (carry .whl/serve)" >&2; return 1; }
  # --no-deps: the kit holds every dependency but numpy (and torch's), which the machine has
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$_sk_site" "$_sk_dir"/*.whl || return 1
  export PYTHONPATH="$_sk_site${PYTHONPATH:+:$PYTHONPATH}"
  export PATH="$_sk_site/bin:$PATH"  # py-spy
  bash "$_sk_root/dev/gpu_machine/compile_bytecode.sh"  # as an install leaves it: start-up timings depend on it
  python3 -c "import starlette, uvicorn, prometheus_client, tritonclient, litserve as l, sys; \
print('serve_kit: starlette', starlette.__version__, 'uvicorn', uvicorn.__version__, 'litserve', l.__version__)" \
    && echo "serve_kit: $(py-spy --version)"
}

case "${1:-}" in
  download) _sk_download ;;
  install) _sk_install ;;
  *) echo "usage: bash $0 download | source $0 install" >&2 ;;
esac
