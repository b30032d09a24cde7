#!/usr/bin/env bash
# The GPU machine's whole check of the CUDA backend, in one command from the repo root (with .whl/ carried):
#
#   bash dev/gpu_machine/gpu_check.sh
#
# 1. pytest -m gpu on the CUDA kernel, backend, tf32, fp16, Winograd and NHWC tests (every layer shape, edge cases with
#    NaN-poisoned outputs, the whole network vs float64 in every precision, graph and eager)
# 2. compute-sanitizer memcheck on one fp32 NCHW forward with every eligible conv by Winograd (299x299, batch 2)
# 3. inception-bench fp32: cuda (tuned: on sm_90a NHWC with 3xTF32 tiles) vs cuda-nchw (the FFMA and Winograd
#    kernels, each conv's measured fastest) vs cuda-untuned (the cost model's tiles) vs cudnn vs torch vs torch-graph
#    at batch 1, 8, 32, 128 with per-layer times; then tf32, fp16
# 4. compute-sanitizer racecheck on one NCHW forward at 75x75 with Winograd on (racecheck is slow; the kernels are
#    the same), then racecheck and memcheck of a tf32 and an fp32 NHWC forward (wgmma ring, fused 1x1 groups, fp32's
#    low tiles)
# 5. real torchvision exports converted and compared (tests/device/test_real_exports.py; torch + torchvision), every
#    other gpu-marked test of the repo (cuDNN, torch, CLI)
# 6. memcheck of an eager serial, an eager concurrent and an fp16 NHWC forward, the tf32 and fp16 self-tests through the
#    concurrent graph, and dev/bench_kernels.py (forward ms of every mode, per-op TFLOP/s), as the budget allows
#
# 7. (group e2e) the streaming pipeline on the GPU (tests/kernels/test_pipeline_io.py) and dev/bench_e2e.py: a
#    folder of 4,096 generated JPEGs through inception-run's pipeline per precision and decode worker kind, the
#    decode workers alone, the PyTorch DataLoader script, cold start
#
# 8. (group compile) inception-bench: ours, torch-graph and torch.compile(mode="reduce-overhead") at batch 1 and 128,
#    fp16 and tf32 (and fp32 at batch 1), with torch.compile's compile time
# 9. (group ray) the offline Ray Data kit (dev/gpu_machine/ray_kit.sh), tests/e2e/test_ray.py and dev/bench_ray.py: Ray's
#    overhead on one GPU against Engine.predict_iter on 4,096 generated JPEGs (RAY_IMAGES=N for another number)
# 10. (group floor) dev/gemm_floor.py: every conv of the forward as a plain GEMM in cuBLAS, beside ours, fp16
#    and tf32 at batch 128 (issue 23's measured floor)
# 11. (group autotune) torch.compile(mode="max-autotune") beside ours and reduce-overhead, fp16, batch 128. Its
#    autotuning (~44 GEMMs and convs, ~11 s each on an H100) outlasts one device command, so its results persist in
#    Inductor's cache, TORCHINDUCTOR_CACHE_DIR (default .inductor_cache, git-ignored: carry it), and each call resumes
#    where the last one stopped. The cache's autotuning results come back as $OUT/inductor_autotune_cache.tar.xz:
#    unpack it at the repo root (`tar -xJf FILE`) before the next call.
#    Two calls did it in session 5 (dev/performance-log.md).
# 12. (group multigpu) dev/bench_multi_gpu.py on a machine of several GPUs: 16,384 generated JPEGs through
#    inception-run --gpus N and inception-run --ray local --gpus N, 1..N GPUs, fp16 and fp32, CPU and GPU decode, with
#    the decode, forward and PCIe ceilings (MULTIGPU_ARGS for other options). Carry .raykit and .whl with the slim
#    nvImageCodec wheel (dev/gpu_machine/slim_nvimgcodec_wheel.py): the whole one would put the call over 64 MiB.
#
# 13. (group folder) dev/bench_folder.py: the folder job's figures (first answers, decoders alone, decode modes,
#    precisions and batches, first long run against a repeated one, --gpus 1..N, the PyTorch script)
#
# 14. (group int8) a calibrated synthetic weight file, the int8 GPU tests (every op element for element), inception-tune
#    int8, and inception-bench int8 beside fp16 and torch.compile fp16; at batch 1, dev/split_k_ab.py and the
#    critical path kernel by kernel (ncu, dev/profile_forward.py --critical-path)
# 15. (group fid) issue 52 with the FID kit (dev/gpu_machine/fid_kit.sh: pytorch-fid, clean-fid): resize_fid.cu
#    against the CPU path (tests/kernels/test_resize_fid.py), pytorch-fid's FID against inception-fid's on the same
#    random weights (tests/e2e/test_pytorch_fid_agreement.py, cpu and cuda), then dev/bench_fid.py (FID_ARGS; default
#    --images 50000: generated 256x256 PNGs against statistics, inception-fid vs pytorch-fid's command), where
#    FID_AB_OLD names another checkout the host-decoded job against it (dev/fid_job_ab.py, FID_AB_FILES), then
#    dev/fid_gap.py --float64 (FID_GAP_ARGS; default 20,000 JPEGs against 5,000): each tool's FID against float64
# 17. (group fp32) issue 52's fp32 tiles (3xFP16, A split in registers): the FID network's fp32 selftest, every fp32
#    tile's GPU tests, the fp32 forward against another checkout's (FP32_AB_OLD, e.g. a `git archive main` in
#    .snapold: dev/gpu_machine/ab_bench.sh, two rounds), then inception-tune fp32 (the table comes back as
#    $OUT/tuning_fp32.json) and the tuned forward beside the other checkout again
# 16. (group serve) issue 48: tests/device/test_serve_gpu.py, dev/bench_serve.py (SERVE_ARGS) beside inception-run
#    and the LitServe peer, and a soak of SOAK_SECONDS where set
#
#   bash dev/gpu_machine/gpu_check.sh [GROUP...]     groups: kernels (1, 2, 4, 5, 6), bench (3), e2e (7), compile (8),
#                                            ray (9), floor (10), autotune (11), multigpu (12), folder (13),
#                                            int8 (14), fid (15), serve (16), fp32 (17); default: all but compile,
#                                            ray, floor, autotune, multigpu, folder, int8, fid, serve and fp32
#
# Full logs go to $OUT (default ./gpu_check_out), eight files at most; a summary table is printed last.
# Each step has a time limit, cut further to what is left of a total budget (GPU_CHECK_BUDGET, 540 s), so the
# summary always prints inside the device's 10-minute command limit; steps run most important first. The limits of
# the steps before inception-bench add up to 395 s: run with GPU_CHECK_BUDGET=590 for its full 150 s.
set -u -o pipefail

BUDGET=${GPU_CHECK_BUDGET:-540}
SELECTED=" ${*:-all} "
want() { [[ ("$SELECTED" == *" all "* && ! " compile ray floor autotune multigpu folder int8 fid serve fp32 " == *" $1 "*) || "$SELECTED" == *" $1 "* ]]; }
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
SUMMARY=()

# shellcheck disable=SC1091
# The lent GPU machine has no package registry: the kit in .whl/ installs pycuda there. Elsewhere pycuda comes
# from `pip install -e '.[test,gpu]'` and there is nothing to source.
GPU_ENV=${GPU_ENV:-.whl/gpu-env.sh}
if [ -f "$GPU_ENV" ]; then
  if ! source "$GPU_ENV" >"$OUT/env_pytest.log" 2>&1; then
    cat "$OUT/env_pytest.log"
    echo "gpu_check: $GPU_ENV failed" >&2
    exit 1
  fi
elif ! python3 -c "import pycuda.driver" >"$OUT/env_pytest.log" 2>&1; then
  echo "gpu_check: pycuda is not importable and there is no $GPU_ENV; pip install -e '.[test,gpu]' first" >&2
  exit 1
fi
export PATH="$PATH:/usr/local/cuda/bin"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv >>"$OUT/env_pytest.log" 2>&1
bash dev/gpu_machine/compile_bytecode.sh  # as an install leaves it (the kits add theirs when they install)

# step NAME LOG LIMIT_S COMMAND...: run with a time limit, append to LOG, remember status, time and last line.
# --decode gpu's nvImageCodec from the kit's .whl/nvimg/ where it has it, onto PYTHONPATH; its pip output to log $1.
nvimg_kit() {
  if ls .whl/nvimg/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/nvimg .whl/nvimg/*.whl \
      >>"$OUT/$1" 2>&1 && export PYTHONPATH="/tmp/nvimg:$PYTHONPATH"
  fi
}

step() {
  local name=$1 log=$2 limit=$3
  shift 3
  local left=$((BUDGET - SECONDS - 10))
  [ "$limit" -gt "$left" ] && limit=$left
  if [ "$limit" -lt 15 ]; then
    SUMMARY+=("$(printf '%-22s %-14s' "$name" "SKIPPED(budget)")")
    return
  fi
  local t0=$SECONDS
  echo "### $name: $*" >>"$OUT/$log"
  timeout "$limit" "$@" >>"$OUT/$log" 2>&1
  local rc=$?
  local status=ok
  [ $rc -eq 124 ] && status="TIMEOUT(${limit}s)"
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && status="FAIL(rc=$rc)"
  SUMMARY+=("$(printf '%-22s %-14s %5ss  %s' "$name" "$status" $((SECONDS - t0)) "$(grep -v '^\s*$' "$OUT/$log" | tail -1 | cut -c1-110)")")
}

SELFTEST=(python3 -m inception_engine.backends.cuda --selftest)
SANITIZER=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)

# Compile the kernels once (cached in ~/.cache/inception-engine/kernels for every later step).
step "build kernels" env_pytest.log 60 python3 -m inception_engine.cuda_build

if want e2e; then
  step "pytest pipeline" env_pytest.log 120 python3 -m pytest -m gpu -q -rfEs -s tests/kernels/test_pipeline_io.py \
    tests/kernels/test_resize_pil.py tests/device/test_gpu_decode.py
  step "bench e2e" e2e.log 420 python3 dev/bench_e2e.py --json "$OUT/e2e.json" ${E2E_ARGS:-}
  step "profile gpu decode" e2e.log 60 python3 dev/profile_gpu_decode.py \
    "${XDG_CACHE_HOME:-$HOME/.cache}/inception-engine/e2e-jpegs-4096"
  # The runner's loop variant by variant (files in memory, no forward, a thread beside it, the hardware engines).
  step "decode gpu variants" e2e.log 90 python3 dev/profile_gpu_decode.py --variants \
    "${XDG_CACHE_HOME:-$HOME/.cache}/inception-engine/e2e-jpegs-4096"
fi

want kernels && step "pytest cuda" env_pytest.log 330 python3 -m pytest -m gpu -q -rfEs --durations=10 \
  tests/kernels/test_cuda_kernels.py tests/device/test_cuda_forward.py tests/kernels/test_cuda_tf32.py \
  tests/kernels/test_cuda_fp16.py tests/kernels/test_cuda_winograd.py tests/kernels/test_conv_nhwc.py

want kernels && step "memcheck winograd" memcheck.log 75 "$SANITIZER" --tool memcheck --error-exitcode 3 \
  "${SELFTEST[@]}" --batch 2 --graph off --input-size 299 --winograd on --layout nchw

HAVE_CLI=0
python3 -c "import inception_engine.cli" 2>/dev/null && HAVE_CLI=1
# bench NAME LIMIT_S ARGS...: inception-bench through its entry point, logged to inception_bench.log.
bench() {
  local name=$1 limit=$2
  shift 2
  if [ $HAVE_CLI -eq 0 ]; then
    SUMMARY+=("$(printf '%-22s %-14s' "$name" "skipped") (inception_engine.cli not present)")
    return
  fi
  step "$name" inception_bench.log "$limit" python3 -c \
    "import sys; sys.argv[0] = 'inception-bench'; from inception_engine.cli import bench_main; bench_main()" "$@"
}

if want bench; then
bench "inception-bench" 150 --backends cuda,cuda-nchw,cuda-untuned,cudnn,torch,torch-graph \
  --batch-sizes 1,8,32,128 --iters 20 --per-layer --json "$OUT/inception_bench.json"

bench "inception-bench tf32" 90 --backends cuda,cuda-untuned,cudnn,torch-graph --precision tf32 \
  --batch-sizes 1,8,32,128 --iters 20

bench "inception-bench fp16" 90 --backends cuda,cuda-nchw,cuda-untuned,torch-graph --precision fp16 --batch-sizes 1,8,32,128 \
  --iters 20
fi

# torch.compile's reduce-overhead mode beside ours and PyTorch's CUDA graph (issue 23's peer), its compile time in a
# column of its own: ~20 s of compiling per batch size, plus ~12 s of importing the compiler once.
# COMPILE_PRECISIONS picks (default fp16 tf32 fp32; fp32 at batch 1 only, issue 23's target there).
if want compile; then
  for p in ${COMPILE_PRECISIONS:-fp16 tf32 fp32}; do
    sizes=1,128
    [ "$p" = fp32 ] && sizes=1
    bench "bench compile $p" 170 --backends cuda,torch-graph,torch-compile --precision "$p" --batch-sizes $sizes \
      --iters 50 --no-reference --json "$OUT/bench_compile_$p.json"
  done
fi

# max-autotune, resumable across calls through Inductor's on-disk cache (the header's group 11).
if want autotune; then
  export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$PWD/.inductor_cache}
  mkdir -p "$TORCHINDUCTOR_CACHE_DIR"
  bench "bench max-autotune" 570 --backends torch-compile-max,cuda,torch-compile --precision fp16 --batch-sizes 128 \
    --iters 50 --no-reference --json "$OUT/bench_autotune.json"
  grep -c "AUTOTUNE benchmarking takes" "$OUT/inception_bench.log" | sed 's/^/ops autotuned in this call: /'
  [ -d "$TORCHINDUCTOR_CACHE_DIR/cache" ] && tar -cJf "$OUT/inductor_autotune_cache.tar.xz" \
    -C "$(dirname "$TORCHINDUCTOR_CACHE_DIR")" "$(basename "$TORCHINDUCTOR_CACHE_DIR")/cache"
fi

# int8 (issue 49): a calibrated synthetic weight file (dev/make_calibrated_weights.py), the int8 kernel and forward
# tests (every op element for element on the GPU's own inputs), the int8 tuning, and inception-bench int8 beside fp16
# and torch.compile fp16 in the same call.
if want int8; then
  W8="${XDG_CACHE_HOME:-$HOME/.cache}/inception-engine/calibrated-synthetic.npz"
  [ -f "$W8" ] || step "int8 weights" int8.log 120 python3 dev/make_calibrated_weights.py "$W8" --images 64
  step "pytest int8" int8.log 240 python3 -m pytest -m gpu -q -rfEs -x tests/device/test_int8_forward.py \
    $(ls tests/kernels/test_*int8*.py tests/kernels/test_*i8*.py 2>/dev/null)
  step "tune int8" int8.log 150 python3 -c \
    "import sys; sys.argv[0] = 'inception-tune'; from inception_engine.cli import tune_main; tune_main()" \
    --precisions int8 --batch-sizes 1,128 --weights "$W8"
  bench "bench int8" 120 --backends cuda --precision int8 --batch-sizes 1,8,128 --iters 50 --weights "$W8" \
    --json "$OUT/bench_int8.json"
  bench "bench fp16 (int8's peer)" 170 --backends cuda,torch-compile --precision fp16 --batch-sizes 1,128 \
    --iters 50 --no-reference --weights "$W8" --json "$OUT/bench_int8_fp16.json"
  # batch 1: the tuned split-K against one slice in the graph, and the critical path kernel by kernel
  step "split-K A/B int8 b1" int8.log 90 python3 dev/split_k_ab.py --precision int8 --weights "$W8" --batch 1
  step "ncu int8 b1" int8.log 120 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    --log-file "$OUT/ncu_int8_b1.log" python3 dev/profile_forward.py --precision int8 --weights "$W8" --batch 1 --tuned
  step "critical path int8 b1" int8.log 60 python3 dev/profile_forward.py --precision int8 --weights "$W8" \
    --batch 1 --tuned --critical-path "$OUT/ncu_int8_b1.log"
fi

# Issue 52's fp32 tiles: correct first, then against the other checkout, then tuned here (the ws tile enters by tuning).
if want fp32; then
  step "selftest fid fp32" fp32.log 60 "${SELFTEST[@]}" --network fid --batch 4 --precision fp32
  step "pytest fp32" fp32.log 150 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider tests/kernels/test_conv_nhwc.py \
    -k "fp32 or weights"
  AB=(--backends cuda --precision fp32 --batch-sizes 1,64,128 --iters 20 --no-reference)
  [ -n "${FP32_AB_OLD:-}" ] && step "A/B fp32" fp32.log 150 env OUT="$OUT/ab_fp32" ROUNDS=2 \
    bash dev/gpu_machine/ab_bench.sh "$FP32_AB_OLD" "${AB[@]}"
  step "tune fp32" fp32.log 150 python3 -c \
    "import sys; sys.argv[0] = 'inception-tune'; from inception_engine.cli import tune_main; tune_main()" \
    --precisions fp32 --table "$OUT/tuning_fp32.json"
  [ -n "${FP32_AB_OLD:-}" ] && step "A/B fp32 tuned" fp32.log 100 env OUT="$OUT/ab_fp32_tuned" ROUNDS=1 \
    bash dev/gpu_machine/ab_bench.sh "$FP32_AB_OLD" "${AB[@]}"
fi

# Issue 23's floor: each conv of the forward as the plain GEMM cuBLAS runs (dev/gemm_floor.py), beside ours.
if want floor; then
  for p in fp16 tf32; do
    step "gemm floor $p" floor.log 120 python3 dev/gemm_floor.py --precision $p --batch 128 \
      --json "$OUT/gemm_floor_$p.json"
  done
fi

# Ray's overhead on one GPU (dev/bench_ray.py) and the Ray tests, with the offline kit of dev/gpu_machine/ray_kit.sh
# (carry .raykit and .whl's small wheels: with nvImageCodec's the call would exceed 64 MiB).
if want ray; then
  if source dev/gpu_machine/ray_kit.sh install >>"$OUT/ray.log" 2>&1; then
    step "ray jpegs+weights" ray.log 90 python3 -c "
import sys; sys.path.insert(0, 'dev')
import bench_e2e
bench_e2e.synthetic_weights_file('/tmp')
print('jpegs in', bench_e2e.jpeg_folder(${RAY_IMAGES:-4096}))"
    step "pytest ray" ray.log 90 python3 -m pytest -q -rfEs tests/e2e/test_ray.py tests/e2e/test_multi_gpu.py
    step "bench ray" ray.log 300 python3 dev/bench_ray.py "${XDG_CACHE_HOME:-$HOME/.cache}/inception-engine/e2e-jpegs-${RAY_IMAGES:-4096}" \
      --weights /tmp/synthetic.npz
  else
    SUMMARY+=("$(printf '%-22s %-14s' "ray" "SKIPPED") $(tail -1 "$OUT/ray.log")")
  fi
fi

# The folder job as a user runs it (dev/bench_folder.py): first answers after the install, the decoders alone, each
# decode mode, precision and batch (with and without the decoding thread), a first long run against a repeated one,
# --gpus 1..N on the machine's GPUs, the PyTorch script. nvImageCodec comes from .whl/nvimg/ where the kit has it
# (pip download nvidia-nvimgcodec-cu13 nvidia-nvjpeg there, slimmed by dev/gpu_machine/slim_nvimgcodec_wheel.py).
if want folder; then
  nvimg_kit folder.log
  step "pytest folder job" folder.log 120 python3 -m pytest -m gpu -q -rfEs tests/kernels/test_pipeline_io.py \
    tests/device/test_gpu_decode.py tests/device/test_cuda_tuning_tables.py
  gpus=$(nvidia-smi -L | wc -l)
  step "bench folder" folder.log 420 python3 dev/bench_folder.py --first --ab python-api,two-chains --batches 64,32,128 \
    --first-long fp16,tf32,fp32 --gpus "$(seq -s, 1 "$gpus")" --json "$OUT/folder.json" ${FOLDER_ARGS:-}
fi

# Images/s on 1..N GPUs of this machine (issue 21): inception-run --gpus N and Ray Data, with the ceilings.
if want multigpu; then
  source dev/gpu_machine/ray_kit.sh install >>"$OUT/multigpu.log" 2>&1 || echo "multigpu: no Ray kit, Ray rows fail" >>"$OUT/multigpu.log"
  gpus=$(nvidia-smi -L | wc -l)
  step "bench multi-gpu" multigpu.log 560 python3 dev/bench_multi_gpu.py --gpus "$(seq -s, 1 "$gpus")" \
    --json "$OUT/multigpu.json" ${MULTIGPU_ARGS:-}
fi

# Issue 52: the FID tools from the kit (.whl/fid), the GPU resize, the agreement test and the benchmark.
if want fid; then
  if source dev/gpu_machine/fid_kit.sh install >>"$OUT/fid.log" 2>&1; then
    nvimg_kit fid.log
    step "pytest fid" fid.log 240 python3 -m pytest -q -rfEs -s tests/kernels/test_resize_fid.py \
      tests/e2e/test_pytorch_fid_agreement.py
    step "bench fid" fid.log 540 python3 dev/bench_fid.py --out "$OUT/bench_fid" ${FID_ARGS:---images 50000}
    # the host-decoded job against another checkout (FID_AB_OLD, e.g. a git archive in .snapold), on bench_fid's
    # files: FID_AB_FILES names them as dev/fid_job_ab.py takes them (the default: those of --images 20000
    # --ref-images 5000 --format jpeg)
    W=/tmp/bench-fid-work
    # shellcheck disable=SC2086
    [ -n "${FID_AB_OLD:-}" ] && step "A/B fid job" fid.log 300 python3 dev/fid_job_ab.py "$FID_AB_OLD" \
      ${FID_AB_FILES:-$W/gen-jpeg-20000 $W/ref-jpeg-5000-seed0.npz --weights $W/fid-random-0.npz}
    # where our FID and pytorch-fid's part, with pytorch-fid's modules in float64 as the referee (bench_fid's images
    # and weights in its default --work, made by the step above where the sizes agree)
    # shellcheck disable=SC2086
    step "fid gap" fid.log 300 python3 dev/fid_gap.py --float64 ${FID_GAP_ARGS:---images 20000 --ref-images 5000}
  else
    SUMMARY+=("$(printf '%-22s %-14s' "fid" "SKIPPED") $(tail -1 "$OUT/fid.log")")
  fi
fi

# Issue 48: the server's GPU tests, dev/bench_serve.py's sweep (SERVE_ARGS; default: single images and 64-image
# requests at concurrency 1 and 128, the HTTP floor, inception-run and inception-run --server on 16,384 files beside
# it, the LitServe peer), then, where SOAK_SECONDS is set, a soak of that length at 80 % of saturation (one
# command's 600 s hold a soak of ~500 s at most: the 10-minute one runs in two calls, soak_detached.sh).
if want serve; then
  if source dev/gpu_machine/serve_kit.sh install >>"$OUT/serve.log" 2>&1; then
    nvimg_kit serve.log
    SERVE_W=$(python3 -c "import sys; sys.path.insert(0, 'dev'); from bench_e2e import synthetic_weights_file; \
print(synthetic_weights_file('/tmp'))" 2>>"$OUT/serve.log")
    step "pytest serve" serve.log 90 python3 -m pytest -q -m gpu -rfEs -p no:cacheprovider tests/device/test_serve_gpu.py
    # shellcheck disable=SC2086
    step "bench serve" serve.log 300 python3 dev/bench_serve.py --weights "$SERVE_W" --json "$OUT/serve.json" \
      ${SERVE_ARGS:---sizes 1,64 --concurrency 1,128 --seconds 4 --images 2048 --run-images 16384}
    if [ -n "${SOAK_SECONDS:-}" ]; then
      step "soak serve" soak.log $((SOAK_SECONDS + 60)) python3 dev/bench_serve.py --weights "$SERVE_W" --peer none \
        --images 2048 --soak "$SOAK_SECONDS" --http-workers 4 --soak-concurrency 64 --sample-every 10 \
        --json "$OUT/soak.json"
    fi
  else
    SUMMARY+=("$(printf '%-22s %-14s' "serve" "SKIPPED") $(tail -1 "$OUT/serve.log")")
  fi
fi

if want kernels; then

step "racecheck forward" racecheck.log 60 "$SANITIZER" --tool racecheck --racecheck-report hazard \
  --error-exitcode 3 "${SELFTEST[@]}" --batch 1 --graph off --input-size 75 --winograd on --layout nchw
# The NHWC path's wgmma ring (dynamic shared memory, each stage's wgmma overlapping the next barrier) and fused 1x1
# groups, tf32: a few seconds each at these sizes.
step "racecheck tf32 nhwc" racecheck.log 40 "$SANITIZER" --tool racecheck --racecheck-report hazard \
  --error-exitcode 3 "${SELFTEST[@]}" --batch 1 --graph off --concurrent on --input-size 75 --precision tf32 \
  --layout nhwc
step "memcheck tf32 nhwc" memcheck.log 45 "$SANITIZER" --tool memcheck --error-exitcode 3 \
  "${SELFTEST[@]}" --batch 2 --graph off --concurrent on --input-size 299 --precision tf32 --layout nhwc
step "racecheck fp32 nhwc" racecheck.log 40 "$SANITIZER" --tool racecheck --racecheck-report hazard \
  --error-exitcode 3 "${SELFTEST[@]}" --batch 1 --graph off --concurrent on --input-size 75 --precision fp32 \
  --layout nhwc
step "memcheck fp32 nhwc" memcheck.log 45 "$SANITIZER" --tool memcheck --error-exitcode 3 \
  "${SELFTEST[@]}" --batch 2 --graph off --concurrent on --input-size 299 --precision fp32 --layout nhwc

step "real exports" env_pytest.log 120 python3 -m pytest -q -rs -p no:cacheprovider tests/device/test_real_exports.py

step "pytest -m gpu (rest)" env_pytest.log 100 python3 -m pytest -m gpu -q -rfEs --durations=5 tests \
  --ignore=tests/kernels/test_cuda_kernels.py --ignore=tests/device/test_cuda_forward.py \
  --ignore=tests/kernels/test_cuda_tf32.py --ignore=tests/kernels/test_cuda_fp16.py \
  --ignore=tests/kernels/test_cuda_winograd.py --ignore=tests/kernels/test_conv_nhwc.py

step "memcheck forward" memcheck.log 75 "$SANITIZER" --tool memcheck --error-exitcode 3 \
  "${SELFTEST[@]}" --batch 1 --graph off --input-size 299 --layout nchw

step "memcheck concurrent" memcheck.log 45 "$SANITIZER" --tool memcheck --error-exitcode 3 \
  "${SELFTEST[@]}" --batch 2 --graph off --concurrent on --input-size 299 --layout nchw

step "memcheck fp16 nhwc" memcheck.log 45 "$SANITIZER" --tool memcheck --error-exitcode 3 \
  "${SELFTEST[@]}" --batch 2 --graph off --concurrent on --input-size 299 --precision fp16 --layout nhwc

step "selftest tf32 b8" memcheck.log 30 "${SELFTEST[@]}" --batch 8 --graph on --concurrent on --precision tf32

step "selftest fp16 b8" memcheck.log 30 "${SELFTEST[@]}" --batch 8 --graph on --concurrent on --precision fp16

step "bench_kernels" bench_kernels.log 120 python3 dev/bench_kernels.py --batch-sizes 1,8,32,128 --iters 20 \
  --per-op 1,128 --json "$OUT/bench_kernels.json"
fi

{
  echo
  echo "== gpu_check summary ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)) =="
  awk '/^### /{p=0} p; /^summary$/{p=1}' "$OUT/bench_kernels.log" 2>/dev/null
  grep -E "^### |^(cuda|cudnn|torch)[-a-z]* +[0-9]+ " "$OUT/inception_bench.log" 2>/dev/null | cut -c1-175
  awk '/^[0-9]+ images in /{p=1} p' "$OUT/e2e.log" 2>/dev/null
  grep -E "^[0-9]+ images, batch|^Engine.predict_iter|^Ray Data \(|^Ray floor" "$OUT/ray.log" 2>/dev/null
  grep -E "^(NVIDIA|convs, one|other ops|compute floor)" "$OUT/floor.log" 2>/dev/null
  awk '/^[0-9]+ JPEGs, batch/{p=1} p' "$OUT/multigpu.log" 2>/dev/null
  awk '/^[0-9]+ (png|jpeg|both) images /{p=1} p' "$OUT/fid.log" 2>/dev/null
  # inception-run and inception-run --server beside the server, and --server's phases (its first result): in the
  # printed summary, since a device call brings back only a few of $OUT's files
  grep -E " files: wall |^client phases" "$OUT/serve.log" 2>/dev/null | cut -c1-400
  grep -E "^[0-9]+ (passed|failed|errors?)|^(FAILED|ERROR) " "$OUT/env_pytest.log" | tail -12
  for line in "${SUMMARY[@]}"; do echo "$line"; done
} | tee "$OUT/summary.txt"
