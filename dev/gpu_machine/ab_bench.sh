#!/usr/bin/env bash
# Same-run A/B of two checkouts on the GPU machine: the same inception-bench command on each, alternated ROUNDS times
# (default 2), so that a slow stretch of a shared GPU hits both. From the repo root (with .whl/ carried):
#
#   bash dev/gpu_machine/ab_bench.sh OLD_CHECKOUT [inception-bench arguments...]
#   e.g. bash dev/gpu_machine/ab_bench.sh .snapold --backends cuda --precision fp16 --batch-sizes 1,128 --iters 20
#
# OLD_CHECKOUT is another copy of the repo (e.g. `git archive <commit> | tar -x -C .snapold`; .snapold is git-ignored,
# so name it in the run's carry). Each checkout is installed in turn (editable, no dependencies), so that its console
# scripts and metadata are its own; each finds its kernels from its own files (native_build.source_dir). Logs go to $OUT
# (default ./ab_out) as ab_<old|new>_<round>.log; the median rows are printed last. CLOCKS=1: each run's SM clock and
# board power too, sampled while it runs (dev/gpu_machine/gpu_clocks.py; ab_<label>_clocks.csv), a line under its
# rows: a faster tree that also kept a higher clock may owe the difference to power, not to its code.
set -u -o pipefail
OLD=${1:?usage: bash dev/gpu_machine/ab_bench.sh OLD_CHECKOUT [inception-bench arguments...]}
shift
OUT=${OUT:-$PWD/ab_out}
ROUNDS=${ROUNDS:-2}
mkdir -p "$OUT"
GPU_ENV=${GPU_ENV:-$PWD/.whl/gpu-env.sh}
# shellcheck disable=SC1090
[ -f "$GPU_ENV" ] && source "$GPU_ENV" >"$OUT/ab_env.log" 2>&1
export PATH="$PATH:/usr/local/cuda/bin"
NEW=$PWD
OLD=$(cd "$OLD" && pwd)

bench() {  # checkout label
  (cd "$1" && python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >>"$OUT/ab_env.log" 2>&1) ||
    { echo "ab_bench: could not install $1 (see $OUT/ab_env.log)" >&2; return 1; }
  # Which cuda_src this checkout compiles: its own, or the A/B compares one set of kernels under two Pythons.
  (cd "$1" && python3 -c "from inception_engine import cuda_build; print('kernels from', cuda_build.source_dir())" &&
    $SAMPLE "$OUT/ab_$2_clocks.csv" -- \
    python3 -c "import sys; sys.argv[0] = 'inception-bench'; from inception_engine.cli import bench_main; \
bench_main()" "${@:3}") >"$OUT/ab_$2.log" 2>&1
}
# CLOCKS=1: each run under gpu_clocks.py's sampler; otherwise plainly (run_plain drops the LOG -- before the command)
run_plain() { shift 2; "$@"; }
if [ "${CLOCKS:-0}" = 1 ]; then SAMPLE="python3 $NEW/dev/gpu_machine/gpu_clocks.py run"; else SAMPLE=run_plain; fi

for r in $(seq 1 "$ROUNDS"); do
  bench "$OLD" "old_$r" "$@"
  bench "$NEW" "new_$r" "$@"
done
for f in "$OUT"/ab_old_*.log "$OUT"/ab_new_*.log; do
  echo "== $(basename "$f" .log)"
  grep -E '^(backend|cuda|cudnn|torch)' "$f" | cut -c1-112
  clocks=${f%.log}_clocks.csv
  [ "${CLOCKS:-0}" = 1 ] && [ -f "$clocks" ] && python3 "$NEW/dev/gpu_machine/gpu_clocks.py" summary "$clocks" clocks
done
