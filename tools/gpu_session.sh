#!/usr/bin/env bash
# Everything one GPU session runs, in stages, writing logs and results under $OUT (default ./gpu-out).
#
#   bash tools/gpu_session.sh setup harness      # harness checks: GPU tests of the harness, timers, reference timing
#   bash tools/gpu_session.sh setup kernels      # GPU tests of the shipped kernels and smoke runs
#   bash tools/gpu_session.sh setup bench        # the recorded benchmarks
#
# `setup` installs wheels carried in .whl/ (cupti-python and pyelftools, which the GPU image
# lacks) into /tmp/site without touching the image's packages.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

step() {  # step NAME COMMAND...: run, log to $OUT/NAME.log, report the exit code
    local name=$1; shift
    echo "=== $name: $*"
    local start=$SECONDS
    "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "=== $name: exit $rc after $((SECONDS - start)) s"
    tail -n "${TAIL:-25}" "$OUT/$name.log"
    return 0
}

for stage in "$@"; do
    case $stage in
    setup)
        if ls .whl/*.whl >/dev/null 2>&1; then
            python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
            export PYTHONPATH="$PYTHONPATH:/tmp/site"
        fi
        nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv
        python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
        python3 -c "from cupti import cupti; print('cupti ok', cupti.get_timestamp())"
        ;;
    harness)
        step gpu_tests_harness python3 -m pytest -q -m gpu tests/test_adversarial.py
        step timers python3 tools/measure_harness.py timers --out "$OUT/timers.json"
        step indexer_reference python3 -m dsa_bench run -w indexer_h64 -s reference --save "$OUT/indexer_h64_reference.json"
        step attention_reference python3 -m dsa_bench run -w sparse_attention_h16 -s reference --save "$OUT/sparse_attention_h16_reference.json"
        ;;
    kernels)
        step gpu_tests python3 -m pytest -q -m gpu
        step indexer_smoke python3 -m dsa_bench run -w indexer_smoke --save "$OUT/indexer_smoke.json"
        step attention_smoke python3 -m dsa_bench run -w sparse_attention_smoke --save "$OUT/sparse_attention_smoke.json"
        ;;
    bench)
        step indexer_run1 python3 -m dsa_bench run -w indexer_h64 --save "$OUT/indexer_h64.json"
        step attention_run1 python3 -m dsa_bench run -w sparse_attention_h16 --save "$OUT/sparse_attention_h16.json"
        step indexer_pipelines python3 tools/bench_indexer.py --out "$OUT/indexer_pipelines.json"
        ;;
    *)
        echo "unknown stage $stage"; exit 2 ;;
    esac
done
