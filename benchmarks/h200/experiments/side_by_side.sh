#!/usr/bin/env bash
# A patched attention kernel (the working tree) against the committed one (.exp/old, an archive of
# the base commit), on one device call from the repository root with .whl and .exp carried:
#   bash benchmarks/h200/experiments/side_by_side.sh NAME [VARIANT ARGS...]
# builds both, runs the attention GPU tests on the patched tree ($OUT/tests_NAME.log), times the
# variants (default: the policy) of both twice, alternating ($OUT/NAME*.log, $OUT/committed*.log),
# and prints both kernels' phase stamps for T = 1 with 106 valid slots and T = 8 full.
set -u
NAME=$1
shift
VARIANTS=("$@")
[ ${#VARIANTS[@]} -gt 0 ] || VARIANTS=(--variant default)
ROOT=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=/tmp/ext
cp -r .exp/old /tmp/old
for d in $ROOT /tmp/old; do
  (cd "$d" && PYTHONPATH=$d:/tmp/site timeout 300 python3 tools/bench_attention_variants.py --iterations 2 --case attention_20_t8_sparse --variant default > /tmp/build_$(basename $d).log 2>&1; echo "build $d rc=$?") &
done
wait
(PYTHONPATH=$ROOT:/tmp/site timeout 150 python3 -m pytest -q -m gpu -x tests/test_triton_attention.py) > "$OUT/tests_$NAME.log" 2>&1; echo "tests rc=$?"; tail -3 "$OUT/tests_$NAME.log" | grep -E "passed|failed"
bench() {  # bench DIR NAME ARGS...
  local d=$1 name=$2; shift 2
  (cd "$d" && PYTHONPATH=$d:/tmp/site timeout 200 python3 tools/bench_attention_variants.py --iterations 20 --out "$OUT/$name.json" "$@") > "$OUT/$name.log" 2>&1
  echo "== $name rc=$?"; grep -E "^mean|^T=8 full|FAIL|rror" "$OUT/$name.log" | head -6
}
bench $ROOT "$NAME" "${VARIANTS[@]}"
bench /tmp/old committed "${VARIANTS[@]}"
bench $ROOT "${NAME}_again" --variant default
bench /tmp/old committed_again --variant default
for d in $ROOT /tmp/old; do
  (cd $d && PYTHONPATH=$d:/tmp/site timeout 60 python3 tools/profile_kernels.py phases --iterations 30 --case attention_02_t1_sparse --case attention_18_t8_full) > /tmp/ph.log 2>&1; echo "phases $d"; grep -v "^CUDA" /tmp/ph.log | cut -c1-330
done
