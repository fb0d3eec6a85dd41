#!/usr/bin/env bash
# Experiment: the 16-warp k-split tile math against 8 warps (same new code) and the committed kernel.
# Needs .exp/old = `git archive efa9849 | tar -x -C .exp/old` (the committed kernel) and the patch
# applied to the working tree; run from the repository root on the device with .whl and .exp carried.
set -u
ROOT=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=/tmp/ext
mkdir -p /tmp/v
cp -r .exp/old /tmp/v/old
mkdir -p /tmp/v/w8 && tar --exclude=.exp --exclude=.whl --exclude=.git -cf - . | tar -xf - -C /tmp/v/w8
sed -i 's/constexpr int kWarpsPerProgram = 16;/constexpr int kWarpsPerProgram = 8;/' /tmp/v/w8/solutions/triton/attention_sm90.h
sed -i 's/^STAGES, WARPS = 2, 16$/STAGES, WARPS = 2, 8/' /tmp/v/w8/solutions/triton/attention_ext.py
grep -n "kWarpsPerProgram =" /tmp/v/w8/solutions/triton/attention_sm90.h
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
bench() {  # bench DIR NAME ARGS...
  local d=$1 name=$2; shift 2
  (cd "$d" && PYTHONPATH=$d:/tmp/site timeout 200 python3 tools/bench_attention_variants.py --iterations 20 --out "$OUT/$name.json" "$@") > "$OUT/$name.log" 2>&1
  echo "== $name rc=$?"; grep -E "^mean|^T=8 full|FAIL|Error|error" "$OUT/$name.log" | head -20
}
# builds in parallel (a one-case run each)
for d in $ROOT /tmp/v/old /tmp/v/w8; do
  (cd "$d" && PYTHONPATH=$d:/tmp/site timeout 300 python3 tools/bench_attention_variants.py --iterations 2 --case attention_20_t8_sparse --variant default > /tmp/v/build_$(basename $d).log 2>&1; echo "build $d rc=$?") &
done
wait
tail -3 /tmp/v/build_*.log
(PYTHONPATH=$ROOT:/tmp/site timeout 150 python3 -m pytest -q -m gpu -x tests/test_triton_attention.py) > "$OUT/tests_w16.log" 2>&1; echo "tests w16 rc=$?"; tail -3 "$OUT/tests_w16.log"
bench $ROOT w16 --variant default --variant cuda_s16 --variant cuda_s32 --variant cluster_s16
bench /tmp/v/w8 w8 --variant default --variant cuda_s16
bench /tmp/v/old old --variant default --variant cuda_s16
bench $ROOT w16_again --variant default
(cd $ROOT && PYTHONPATH=$ROOT:/tmp/site timeout 60 python3 tools/profile_kernels.py phases --iterations 20) > "$OUT/phases_w16.log" 2>&1; cat "$OUT/phases_w16.log" | tail -6
(cd /tmp/v/w8 && PYTHONPATH=/tmp/v/w8:/tmp/site timeout 60 python3 tools/profile_kernels.py phases --iterations 20) > "$OUT/phases_w8.log" 2>&1; cat "$OUT/phases_w8.log" | tail -6
(PYTHONPATH=/tmp/v/w8:/tmp/site cd /tmp/v/w8 && PYTHONPATH=/tmp/v/w8:/tmp/site timeout 150 python3 -m pytest -q -m gpu -x tests/test_triton_attention.py -k cuda) > "$OUT/tests_w8.log" 2>&1; echo "tests w8 rc=$?"; tail -3 "$OUT/tests_w8.log"
