#!/bin/bash
# The FID tools for the GPU (device) machine, which reaches no package registry: pytorch-fid (dev/bench_fid.py's
# yardstick, tests/e2e/test_pytorch_fid_agreement.py) and clean-fid (its resize, cleanfid/resize.py). Both are pure
# Python; everything they import (torch, torchvision, numpy, scipy, pillow, tqdm, requests) is the machine's, so the
# kit is their two wheels alone (--no-deps, ~50 KB) in .whl/fid (git-ignored):
#
#   bash dev/gpu_machine/fid_kit.sh download     # here, with pip and PyPI
#   source .whl/gpu-env.sh && source dev/gpu_machine/fid_kit.sh install   # on the GPU machine (carry .whl): installs
#                                                # into /tmp/fidsite, puts it on PYTHONPATH, prints the versions
#   python3 dev/bench_fid.py --images 50000 --out /tmp/bench-fid
#
# Neither tool's network weights travel: pytorch-fid downloads pt_inception-2015-12-05 at its first use, which the
# machine cannot; bench_fid.py and the e2e test give it random weights instead (see their docstrings).

_fk_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
_fk_dir="$_fk_root/.whl/fid"
_fk_site=/tmp/fidsite
_fk_pkgs=("pytorch-fid==0.3.0" "clean-fid==0.1.35")

_fk_download() {
  set -euo pipefail
  mkdir -p "$_fk_dir"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    -d "$_fk_dir" "${_fk_pkgs[@]}"
  echo "fid_kit: $(ls "$_fk_dir" | tr '\n' ' ')($(du -sk "$_fk_dir" | cut -f1) KiB in $_fk_dir)"
}

_fk_install() {
  [ -d "$_fk_dir" ] || { echo "fid_kit: no $_fk_dir (carry .whl)" >&2; return 1; }
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$_fk_site" "$_fk_dir"/*.whl || return 1
  export PYTHONPATH="$_fk_site${PYTHONPATH:+:$PYTHONPATH}"
  bash "$_fk_root/dev/gpu_machine/compile_bytecode.sh"  # as an install leaves it: the job's fixed cost depends on it
  python3 -c "import torch, torchvision, scipy, pytorch_fid, cleanfid; \
print('fid_kit: pytorch-fid', pytorch_fid.__version__, '| clean-fid | torch', torch.__version__, \
'| torchvision', torchvision.__version__, '| scipy', scipy.__version__, '| cuda', torch.cuda.is_available())"
}

case "${1:-}" in
  download) _fk_download ;;
  install) _fk_install ;;
  *) echo "usage: bash $0 download | source $0 install" >&2 ;;
esac
