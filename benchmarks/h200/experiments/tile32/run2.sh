#!/usr/bin/env bash
# Experiment: new softmax (one block barrier per tile, P in registers) with 32-slot tiles / 4 stages
# (working tree) and with 64-slot tiles / 2 stages (/tmp/v64), against the committed kernel (.exp/old).
set -u
ROOT=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=/tmp/ext
cp -r .exp/old /tmp/old
mkdir -p /tmp/v64 && tar --exclude=.exp --exclude=.whl --exclude=.git -cf - . | tar -xf - -C /tmp/v64
sed -i 's/kGatherTileSlots = 32;/kGatherTileSlots = 64;/; s/kGatherStages = 4; /kGatherStages = 2; /' /tmp/v64/solutions/triton/attention_sm90.h
sed -i 's/^TILE_SLOTS = 32 /TILE_SLOTS = 64 /; s/^STAGES = 4$/STAGES = 2/' /tmp/v64/solutions/triton/attention_ext.py
grep -n "^TILE_SLOTS\|^STAGES" /tmp/v64/solutions/triton/attention_ext.py
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
for d in $ROOT /tmp/v64 /tmp/old; do
  (cd "$d" && PYTHONPATH=$d:/tmp/site timeout 300 python3 tools/bench_attention_variants.py --iterations 2 --case attention_20_t8_sparse --variant default > /tmp/build_$(basename $d).log 2>&1; echo "build $d rc=$?"; tail -2 /tmp/build_$(basename $d).log) &
done
wait
for d in $ROOT /tmp/v64; do
  (cd $d && PYTHONPATH=$d:/tmp/site timeout 150 python3 -m pytest -q -m gpu -x tests/test_triton_attention.py) > /tmp/tests.log 2>&1; echo "tests $d rc=$?"; tail -15 /tmp/tests.log | grep -E "passed|failed|Error|assert" | head -5
done
bench() {  # bench DIR NAME ARGS...
  local d=$1 name=$2; shift 2
  (cd "$d" && PYTHONPATH=$d:/tmp/site timeout 240 python3 tools/bench_attention_variants.py --iterations 20 --out "$OUT/$name.json" "$@") > "$OUT/$name.log" 2>&1
  echo "== $name rc=$?"; grep -E "^case|^mean|^T=8 full|FAIL|rror" "$OUT/$name.log" | head -12; grep -E "^attention_(00|02|06|12|15|18|19|20)" "$OUT/$name.log" | tail -8
}
bench $ROOT new32 --variant default --variant cuda_s16_lag500 --variant cuda_s16_lag1000 --variant cuda_s32_lag500 --variant cuda_s64 --variant cluster_s16 --variant cluster_s16_lag500
bench /tmp/v64 new64 --variant default --variant cuda_s16_lag1000 --variant cuda_s16_lag3000 --variant cluster_s16_lag2000
bench /tmp/old committed --variant default
for d in $ROOT:cuda:16:1000 /tmp/v64:cuda:16:2000 /tmp/v64:cuda:32:0; do
  dir=${d%%:*}; plan=${d#*:}
  (cd $dir && PYTHONPATH=$dir:/tmp/site timeout 60 python3 tools/profile_kernels.py phases --iterations 20 --plan $plan) > /tmp/ph.log 2>&1; echo "phases $dir $plan"; grep -E "t8_full|t1_full|t8_sparse" /tmp/ph.log
done
