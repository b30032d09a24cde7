#!/usr/bin/env bash
# Issue 48's soak (10 minutes at 80 % of saturation) is longer than one device command (600 s): it runs in two
# calls on the same warm machine, a process started by one call surviving into the next.
#
#   call 1:  source .whl/gpu-env.sh && bash dev/gpu_machine/soak_detached.sh start [SECONDS]
#            the serve kit and nvImageCodec, the synthetic weights, the kernels built, then dev/bench_serve.py --soak
#            SECONDS (default 600) started detached; it returns START_HOLD seconds (default 150) into the open loop
#   call 2:  source .whl/gpu-env.sh && bash dev/gpu_machine/soak_detached.sh collect
#            at once (the machine is released after ~30 s idle): waits for the soak up to 590 s, prints its report
#            and copies the log to $OUT
#
# Nothing else may run beside it. Each sample line carries the server's answered and failed requests so far, so a
# soak cut short still shows whether any failed. The probe before the open loop (a warm-up and a closed loop of
# --seconds each) adds ~10 s: call 1 waits for it and holds on 150 s more, so that call 2's 590 s cover the rest of
# the soak's SECONDS, its verdict and the server's exit (twice a 600-s soak outran a collect that began at once).
set -u
OUT=${OUT:-/tmp/out}
LOG=/tmp/soak_detached.log
case "${1:-}" in
  start)
    SECONDS_SOAK=${2:-600}
    mkdir -p "$OUT"
    source dev/gpu_machine/serve_kit.sh install >/tmp/soak_kit.log 2>&1 || { echo "serve kit failed"; exit 1; }
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/nvimg .whl/nvimg/*.whl \
      >>/tmp/soak_kit.log 2>&1 && export PYTHONPATH="/tmp/nvimg:$PYTHONPATH"
    python3 -m inception_engine.cuda_build >>/tmp/soak_kit.log 2>&1
    W=$(python3 -c "import sys; sys.path.insert(0, 'dev'); from bench_e2e import synthetic_weights_file; \
print(synthetic_weights_file('/tmp'))")
    setsid nohup python3 dev/bench_serve.py --weights "$W" --peer none --images 2048 --workdir /tmp/soak_bs \
      --soak "$SECONDS_SOAK" --http-workers 4 --soak-concurrency 64 --sample-every 10 >"$LOG" 2>&1 </dev/null &
    for _ in $(seq 1 120); do  # until the open loop's first sample (or the soak ended early)
      grep -q "^soak .*host RSS" "$LOG" 2>/dev/null && break
      pgrep -f "bench_serve.py.*--soak" >/dev/null || break
      sleep 1
    done
    # then this call holds on for START_HOLD seconds of the soak (default 150), so that the collecting call's 590 s
    # cover the rest with room: the soak's drain, verdict and the server's exit take ~10 s past its SECONDS
    for _ in $(seq 1 "${START_HOLD:-150}"); do
      pgrep -f "bench_serve.py.*--soak" >/dev/null || break
      sleep 1
    done
    grep -v "^soak .*host RSS" "$LOG"
    grep "^soak .*host RSS" "$LOG" | tail -n 2
    ;;
  collect)
    mkdir -p "$OUT"
    T0=$SECONDS
    while pgrep -f "bench_serve.py.*--soak" >/dev/null && [ $((SECONDS - T0)) -lt 590 ]; do sleep 2; done
    if pgrep -f "bench_serve.py.*--soak" >/dev/null; then
      echo "soak_detached: still running after $((SECONDS - T0)) s; its last samples:"
    fi
    cp "$LOG" "$OUT/soak.log" 2>/dev/null
    grep -v "^soak .*host RSS" "$LOG"
    grep "^soak .*host RSS" "$LOG" | tail -n 3
    ;;
  *)
    echo "usage: bash dev/gpu_machine/soak_detached.sh start [SECONDS] | collect" >&2
    exit 2
    ;;
esac
