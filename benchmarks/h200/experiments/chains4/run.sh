#!/usr/bin/env bash
# Experiment: four q_nope accumulator chains per warp (working tree) against the committed kernel (.exp/old).
# Needs .exp/old = `git archive 5a9becf | tar -x -C .exp/old` (the committed kernel) and chains4.patch
# applied to the working tree; run from the repository root on the device with .whl and .exp carried.
set -u
ROOT=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=/tmp/ext
cp -r .exp/old /tmp/old
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
for d in $ROOT /tmp/old; do
  (cd "$d" && PYTHONPATH=$d:/tmp/site timeout 300 python3 tools/bench_attention_variants.py --iterations 2 --case attention_20_t8_sparse --variant default > /tmp/build_$(basename $d).log 2>&1; echo "build $d rc=$?") &
done
wait
(PYTHONPATH=$ROOT:/tmp/site timeout 150 python3 -m pytest -q -m gpu -x tests/test_triton_attention.py) > "$OUT/tests_chains4.log" 2>&1; echo "tests rc=$?"; tail -1 "$OUT/tests_chains4.log"
bench() {  # bench DIR NAME ARGS...
  local d=$1 name=$2; shift 2
  (cd "$d" && PYTHONPATH=$d:/tmp/site timeout 200 python3 tools/bench_attention_variants.py --iterations 20 --out "$OUT/$name.json" "$@") > "$OUT/$name.log" 2>&1
  echo "== $name rc=$?"; grep -E "^mean|^T=8 full|FAIL|rror" "$OUT/$name.log" | head -12
}
bench $ROOT chains4 --variant default --variant cuda_s16 --variant cuda_s32
bench /tmp/old committed --variant default --variant cuda_s16 --variant cuda_s32
bench $ROOT chains4_again --variant default
bench /tmp/old committed_again --variant default
(cd $ROOT && PYTHONPATH=$ROOT:/tmp/site timeout 60 python3 tools/profile_kernels.py phases --iterations 20) > "$OUT/phases_chains4.log" 2>&1; tail -4 "$OUT/phases_chains4.log"
(cd /tmp/old && PYTHONPATH=/tmp/old:/tmp/site timeout 60 python3 tools/profile_kernels.py phases --iterations 20) > "$OUT/phases_committed.log" 2>&1; tail -4 "$OUT/phases_committed.log"
