#!/usr/bin/env bash
# Experiment: 32-slot tiles, 4 stages, k-split logits, softmax in registers (working tree) against the committed kernel (.exp/old).
set -u
ROOT=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=/tmp/ext
cp -r .exp/old /tmp/old
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
for d in $ROOT /tmp/old; do
  (cd "$d" && PYTHONPATH=$d:/tmp/site timeout 300 python3 tools/bench_attention_variants.py --iterations 2 --case attention_20_t8_sparse --variant default > /tmp/build_$(basename $d).log 2>&1; echo "build $d rc=$?"; tail -3 /tmp/build_$(basename $d).log) &
done
wait
(PYTHONPATH=$ROOT:/tmp/site timeout 150 python3 -m pytest -q -m gpu -x tests/test_triton_attention.py) > "$OUT/tests_new.log" 2>&1; echo "tests rc=$?"; tail -15 "$OUT/tests_new.log" | grep -E "passed|failed|Error|assert" | head
bench() {  # bench DIR NAME ARGS...
  local d=$1 name=$2; shift 2
  (cd "$d" && PYTHONPATH=$d:/tmp/site timeout 240 python3 tools/bench_attention_variants.py --iterations 20 --out "$OUT/$name.json" "$@") > "$OUT/$name.log" 2>&1
  echo "== $name rc=$?"; grep -E "^mean|^T=8 full|FAIL|rror" "$OUT/$name.log" | head -12; grep -E "^attention_(00|02|06|12|15|18|19|20)" "$OUT/$name.log" | tail -8
}
bench $ROOT new --variant default --variant cuda_s16 --variant cuda_s16_lag500 --variant cuda_s16_lag1000 --variant cuda_s16_lag2000 --variant cuda_s32 --variant cluster_s16_lag500 --variant cluster_s16_lag1000
bench /tmp/old committed --variant default
for plan in cuda:16:0 cuda:16:1000 cuda:16:2000; do
  (cd $ROOT && PYTHONPATH=$ROOT:/tmp/site timeout 60 python3 tools/profile_kernels.py phases --iterations 20 --plan $plan) > /tmp/ph.log 2>&1; echo "phases $plan"; grep -E "t8_full|t1_full|t8_sparse" /tmp/ph.log
done
(cd /tmp/old && PYTHONPATH=/tmp/old:/tmp/site timeout 60 python3 tools/profile_kernels.py phases --iterations 20) > /tmp/ph.log 2>&1; echo "phases committed"; grep -E "t8_full|t1_full|t8_sparse" /tmp/ph.log
