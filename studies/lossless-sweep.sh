#!/bin/bash
# fp32 (lossless) sweep for dart_pld: node budget x lookup branch length (5 + 5 prompts, 128 tokens, greedy).
# Arguments: "BUDGET LOOKUP" pairs (default: the table in docs/tree-sweep.md).
[ $# -gt 0 ] || set -- "4 5" "8 5" "12 5" "16 5" "24 5" "16 10"
for cfg in "$@"; do
  read -r budget lookup <<< "$cfg"
  python -m dart_core bench --workloads mtbench,humaneval --limit 5 --max-new-tokens 128 --temperature 0 \
    --methods hf_generate,dart_pld --dtype fp32 --node-budget "$budget" --lookup-tokens "$lookup" --no-progress \
    --out "runs/lossless-b$budget-l$lookup.json" 2>/dev/null | grep "^all" | sed "s/^/budget $budget lookup $lookup: /"
done
