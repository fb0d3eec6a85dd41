#!/usr/bin/env bash
# Everything one GPU session runs, in stages. Logs and results go to $WORK (default /tmp/gpu-work)
# and, after every step, into one archive $OUT/gpu-session.tgz (OUT defaults to ./gpu-out), so a
# session cut short still returns what it finished.
#
#   bash tools/gpu_session.sh setup harness      # harness checks: GPU tests of the harness, timers, reference timing
#   bash tools/gpu_session.sh setup kernels      # GPU tests of everything, smoke runs, the attention benchmark
#   bash tools/gpu_session.sh setup bench        # the indexer benchmarks and a second attention run
#   bash tools/gpu_session.sh setup explore      # tuning: attention variants, gather locality, indexer stages, ncu
#   bash tools/gpu_session.sh setup stalls       # cache states and ncu stall reasons of both solutions' kernels
#   bash tools/gpu_session.sh setup tune         # GPU kernel tests, attention variants, indexer stages
#   bash tools/gpu_session.sh setup dev          # a new kernel's tests first, then stage benchmarks and all kernel tests
#   bash tools/gpu_session.sh setup cluster      # the cluster combine: tests, variants, phases
#   bash tools/gpu_session.sh setup lag          # the gather lag: tests, variants over lags, phases
#   bash tools/gpu_session.sh setup gather       # the gather floor of the attention (tools/gather_floor.py)
#   bash tools/gpu_session.sh setup gpu_tests    # every GPU test of the suite
#   bash tools/gpu_session.sh setup flush        # what the L2 flush's method charges a timed call (clean / dirty / warm)
#   bash tools/gpu_session.sh setup final        # an attention change's records: GPU tests, both workloads, variants, phases
#   bash tools/gpu_session.sh setup final_attention  # the same after a change to the attention kernel alone
#   bash tools/gpu_session.sh setup final1       # the recorded runs: every GPU test, attention workload, top-k costs, pipelines
#   bash tools/gpu_session.sh setup final2       # the recorded indexer workload run (reference + triton)
#
# `setup` installs wheels carried in .whl/ (cupti-python and pyelftools, which the GPU image
# lacks) into /tmp/site without touching the image's packages.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
WORK=${WORK:-/tmp/gpu-work}
ATTENTION_VARIANTS=${ATTENTION_VARIANTS:-}
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# One extension cache for the harness's workers and the tests, so the CUDA top-k builds once.
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/.cache/dsa-bench/torch_extensions}

step() {  # step NAME SECONDS COMMAND...: run with a time limit, log to $WORK/NAME.log, archive
    local name=$1 limit=$2; shift 2
    echo "=== $name: $*"
    local start=$SECONDS
    timeout "$limit" "$@" >"$WORK/$name.log" 2>&1
    local rc=$?
    echo "=== $name: exit $rc after $((SECONDS - start)) s"
    tail -n "${TAIL:-25}" "$WORK/$name.log"
    tar czf "$OUT/gpu-session.tgz" -C "$WORK" .
    return 0
}

attention_records() {  # attention_records [EXTRA VARIANT ARGS]: both workloads' recorded runs, attention variants and phases
    step attention_run 100 python3 -m dsa_bench run -w sparse_attention_h16 --save "$WORK/sparse_attention_h16.json"
    step attention_variants 60 python3 tools/bench_attention_variants.py --iterations 20 --out "$WORK/attention_variants.json" \
        --variant default --variant cuda_s16 --variant cuda_s32 --variant cluster_s8 --variant cluster_s16 "$@"
    step attention_phases 30 python3 tools/profile_kernels.py phases --iterations 20
    step indexer_run 200 python3 -m dsa_bench run -w indexer_h64 --warmup 2 --iterations 8 --trials 2 --save "$WORK/indexer_h64.json"
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
        step gpu_tests_harness 300 python3 -m pytest -q -m gpu tests/test_adversarial.py
        step timers 120 python3 tools/measure_harness.py timers --out "$WORK/timers.json"
        step indexer_reference 900 python3 -m dsa_bench run -w indexer_h64 -s reference --save "$WORK/indexer_h64_reference.json"
        step attention_reference 300 python3 -m dsa_bench run -w sparse_attention_h16 -s reference --save "$WORK/sparse_attention_h16_reference.json"
        ;;
    kernels)
        step gpu_tests 270 python3 -m pytest -q -m gpu -x
        step indexer_smoke 90 python3 -m dsa_bench run -w indexer_smoke --save "$WORK/indexer_smoke.json"
        step attention_run1 150 python3 -m dsa_bench run -w sparse_attention_h16 --save "$WORK/sparse_attention_h16.json"
        step attention_variants 90 python3 tools/bench_attention_variants.py --iterations 20 --out "$WORK/attention_variants.json"
        ;;
    bench)
        step gpu_tests_adversarial 80 python3 -m pytest -q -m gpu tests/test_adversarial.py
        step indexer_run 250 python3 -m dsa_bench run -w indexer_h64 --warmup 4 --iterations 20 --trials 2 --save "$WORK/indexer_h64.json"
        step attention_run2 60 python3 -m dsa_bench run -w sparse_attention_h16 --save "$WORK/sparse_attention_h16_run2.json"
        step gpu_tests_kernels 120 python3 -m pytest -q -m gpu tests/test_triton_indexer.py tests/test_triton_attention.py
        step indexer_pipelines 40 python3 tools/bench_indexer.py --warmup 2 --iterations 10 --trials 1 --no-variants --out "$WORK/indexer_pipelines.json"
        ;;
    explore)
        step attention_variants 200 python3 tools/bench_attention_variants.py --iterations 20 --out "$WORK/attention_variants.json"
        step locality 50 python3 tools/profile_kernels.py locality
        step indexer_variants 130 python3 tools/bench_indexer.py --warmup 2 --iterations 10 --trials 1 --out "$WORK/indexer_variants.json" \
            --case 'indexer_069*' --case 'indexer_080*' --case 'indexer_086*' --case 'indexer_100*' --case 'indexer_110*' --case 'indexer_120*' --case 'indexer_127*'
        step ncu 170 ncu --nvtx --nvtx-include "profile/" --clock-control none --cache-control all \
            --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
            --section Occupancy --section LaunchStats python3 tools/profile_kernels.py ncu
        ;;
    stalls)
        step cache_states 90 python3 tools/profile_kernels.py cache --iterations 20 \
            --case attention_02_t1_sparse --case attention_00_t1_full --case attention_20_t8_sparse --case attention_18_t8_full \
            --case indexer_000_b1_p1 --case indexer_069_b1_p33 --case indexer_127_b31_p91
        step ncu_stalls 150 ncu --nvtx --nvtx-include "profile/" --clock-control none --cache-control all \
            --section WarpStateStats --section SourceCounters --section InstructionStats --print-details all \
            python3 tools/profile_kernels.py ncu --case attention_02_t1_sparse --case attention_18_t8_full --case indexer_069_b1_p33
        ;;
    tune)  # ATTENTION_VARIANTS="--variant default --variant ..." narrows the attention variants
        step gpu_tests_kernels 200 python3 -m pytest -q -m gpu tests/test_triton_indexer.py tests/test_triton_attention.py
        step attention_variants 150 python3 tools/bench_attention_variants.py --iterations 20 --out "$WORK/attention_variants.json" $ATTENTION_VARIANTS
        step indexer_variants 100 python3 tools/bench_indexer.py --warmup 2 --iterations 10 --trials 1 --out "$WORK/indexer_variants.json" \
            --case 'indexer_069*' --case 'indexer_080*' --case 'indexer_086*' --case 'indexer_100*' --case 'indexer_110*' --case 'indexer_120*' --case 'indexer_127*'
        ;;
    dev)  # a new kernel's first GPU run: its tests first, then the stage benchmarks, then the rest
        step attention_cuda_tests 130 python3 -m pytest -q -m gpu -x tests/test_triton_attention.py -k cuda
        step attention_variants 130 python3 tools/bench_attention_variants.py --iterations 20 --out "$WORK/attention_variants.json" \
            --variant default --variant cuda_two_launch --variant cuda_s16 --variant cuda_s32 --variant cuda_s64 --variant triton
        step topk_costs 40 python3 tools/profile_kernels.py topk --iterations 20
        step indexer_variants 90 python3 tools/bench_indexer.py --warmup 2 --iterations 10 --trials 1 --no-reference --out "$WORK/indexer_variants.json" \
            --case 'indexer_069*' --case 'indexer_086*' --case 'indexer_110*' --case 'indexer_127*'
        step gpu_tests_kernels 150 python3 -m pytest -q -m gpu tests/test_triton_indexer.py tests/test_triton_attention.py
        ;;
    cluster)  # the cluster combine: its tests, the variants (with a gather only once landed), phase stamps
        step attention_cuda_tests 150 python3 -m pytest -q -m gpu -x tests/test_triton_attention.py -k "cuda or cluster"
        step attention_variants 100 python3 tools/bench_attention_variants.py --iterations 20 --out "$WORK/attention_variants.json" \
            --variant default --variant cuda_s16 --variant cuda_s32 --variant cuda_s16_landed --variant cluster_s8 --variant cluster_s16
        step attention_phases_cluster16 40 python3 tools/profile_kernels.py phases --iterations 20 --plan cuda_cluster:16:0
        step attention_phases_barrier16 40 python3 tools/profile_kernels.py phases --iterations 20 --plan cuda:16:0
        step attention_phases_barrier32 40 python3 tools/profile_kernels.py phases --iterations 20 --plan cuda:32:0
        ;;
    lag)  # the gather lag: the attention GPU tests, variants over lags (each checked), phases
        step attention_cuda_tests 200 python3 -m pytest -q -m gpu -x tests/test_triton_attention.py
        step attention_variants 300 python3 tools/bench_attention_variants.py --iterations 20 --out "$WORK/attention_variants.json" \
            --variant default --variant cuda_s16 --variant cuda_s32 --variant cuda_s16_lag1000 --variant cuda_s16_lag2000 \
            --variant cuda_s16_lag3000 --variant cluster_s16 --variant cluster_s16_lag1000 --variant cluster_s16_lag2000 \
            --variant cluster_s16_lag3000 --variant cluster_s8
        step attention_phases 30 python3 tools/profile_kernels.py phases --iterations 20
        ;;
    gather)  # the gather floor: gather-only kernels against the solution, ids reordered
        step gather_floor 200 python3 tools/gather_floor.py --iterations 30 --case attention_18_t8_full --case attention_00_t1_full \
            --out "$WORK/gather_floor.json"
        ;;
    flush)  # the same calls after a clean and a dirty L2 flush and warm (tools/measure_harness.py l2-flush)
        step l2_flush 200 python3 tools/measure_harness.py l2-flush --iterations 30 --out "$WORK/l2_flush.json"
        ;;
    gpu_tests)  # every GPU test of the suite
        step gpu_tests 400 python3 -m pytest -q -m gpu
        ;;
    final)  # the recorded runs of an attention change (the indexer's kernels unchanged): every GPU
            # test, both workloads (the solution's hash changed), the attention variants and phases
        step gpu_tests 240 python3 -m pytest -q -m gpu
        attention_records --variant triton
        ;;
    final_attention)  # records of a change to the attention kernel alone, after its GPU tests
        step gpu_tests_attention 130 python3 -m pytest -q -m gpu -x tests/test_triton_attention.py
        attention_records
        ;;
    final1)  # the recorded runs of this revision, part 1 (part 2: the indexer workload run)
        step gpu_tests 200 python3 -m pytest -q -m gpu
        step attention_run 100 python3 -m dsa_bench run -w sparse_attention_h16 --save "$WORK/sparse_attention_h16.json"
        step topk_costs 40 python3 tools/profile_kernels.py topk --iterations 20
        step indexer_pipelines 100 python3 tools/bench_indexer.py --warmup 1 --iterations 5 --trials 1 --no-variants --no-reference --out "$WORK/indexer_pipelines.json"
        step attention_variants 50 python3 tools/bench_attention_variants.py --iterations 20 --out "$WORK/attention_variants.json" \
            --variant default --variant cuda_s8 --variant cuda_s16 --variant cuda_s32 --variant cuda_s64 --variant triton
        step attention_phases 30 python3 tools/profile_kernels.py phases --iterations 20
        ;;
    final2)
        step indexer_run 540 python3 -m dsa_bench run -w indexer_h64 --warmup 2 --iterations 8 --trials 2 --save "$WORK/indexer_h64.json"
        ;;
    *)
        echo "unknown stage $stage"; exit 2 ;;
    esac
done
