#!/usr/bin/env bash
# The runs behind baselines/h200.json, and the update that writes it.
#
#   benchmarks/baseline_h200.sh [DIR] [GROUP...]      GROUP: indexer insert decode step (default: all four)
#
# Runs the reference and triton (FlashMLA beside them on the decode workloads) on every shipped GPU
# workload of the groups, at each workload's own protocol, one results file per workload in DIR
# (default: the repository's results/baseline_h200), then `dsa-bench baseline update` over the
# complete files there (each workload's entry replaced, the others kept). A workload whose results
# file is complete is not run again and an interrupted one is resumed, so the runs can be spread
# over several sittings: run the same command again. The baseline is the H200's: another GPU is refused unless FORCE=1.
# DSA_BENCH names the command (default dsa-bench; e.g. "python -m dsa_bench" without the script),
# BASELINE the file (default: the repository's baselines/h200.json).
set -euo pipefail
DIR=${1:+$(realpath -m "$1")}
BASELINE=${BASELINE:+$(realpath -m "$BASELINE")}
[ $# -gt 0 ] && shift
cd "$(dirname "$0")/.."
DIR=${DIR:-$PWD/results/baseline_h200}
BASELINE=${BASELINE:-$PWD/baselines/h200.json}

# plan GROUP: sets `workloads` and `solutions` for the group; fails for an unknown one
plan() {
    case "$1" in
    indexer) workloads="indexer_h64 indexer_long indexer_scaled indexer_topk512_long indexer_topk1024_long sparse_attention_h16" ;;
    insert) workloads="kv_insert_v32_small kv_insert_v4_small kv_insert_v41_small kv_insert_v32_large kv_insert_v4_large kv_insert_v41_large" ;;
    decode) workloads="mla_decode_v32_h128 mla_decode_v4_h128 mla_decode_v32_h64 mla_decode_v4_h64 mla_decode_v32_tp8 mla_decode_v4_tp8
                       mla_decode_v32_tp4 mla_decode_v4_tp4 mla_decode_v4_topk512 mla_decode_v4_topk1024" ;;
    step) workloads="decode_step_v32_h128 decode_step_v4_h128 decode_step_v32_tp8 decode_step_v4_tp8 decode_step_v4_topk512
                     decode_step_v4_topk1024" ;;
    *) return 1 ;;
    esac
    solutions=(-s reference -s triton)
    if [ "$1" = decode ]; then solutions=(-s reference -s flashmla -s triton); fi
}

GROUPS_WANTED=${*:-indexer insert decode step}
read -r -a DSA <<<"${DSA_BENCH:-dsa-bench}"
for group in $GROUPS_WANTED; do
    plan "$group" || { echo "baseline_h200.sh: unknown group '$group' (expected indexer, insert, decode or step)" >&2; exit 2; }
done

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
if [[ "$gpu" != *H200* && "${FORCE:-0}" != 1 ]]; then
    echo "baseline_h200.sh: this GPU is '${gpu:-none}', not an H200; baselines/h200.json takes H200 runs only (FORCE=1 overrides)" >&2
    exit 2
fi
mkdir -p "$DIR"

complete() {  # true when $1 is a results file of a finished run
    python3 -c 'import json, sys; sys.exit(0 if json.load(open(sys.argv[1])).get("complete") else 1)' "$1" 2>/dev/null
}

for group in $GROUPS_WANTED; do
    plan "$group"
    for workload in $workloads; do
        file="$DIR/$workload.json"
        if [ -f "$file" ] && complete "$file"; then
            echo "== $workload: complete in $file"
        elif [ -f "$file" ]; then
            echo "== $workload: resuming $file"
            "${DSA[@]}" run --resume "$file" -q
        else
            echo "== $workload"
            "${DSA[@]}" run -w "$workload" "${solutions[@]}" --save "$file" -q
        fi
    done
done

finished=()
for file in "$DIR"/*.json; do
    [ -f "$file" ] && complete "$file" && finished+=("$file")
done
if [ ${#finished[@]} -eq 0 ]; then
    echo "baseline_h200.sh: no complete results in $DIR" >&2
    exit 1
fi
"${DSA[@]}" baseline update "${finished[@]}" --baseline "$BASELINE"
