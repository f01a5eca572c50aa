#!/bin/bash
# bf16 fast-mode sweep for dart_pld: node budget x lookup branch length (5 + 5 prompts, 128 tokens, greedy)
for cfg in "8 5" "8 10" "16 5" "16 10" "32 10"; do
  set -- $cfg
  python -m dart_core bench --workloads mtbench,humaneval --limit 5 --max-new-tokens 128 --temperature 0 \
    --methods hf_generate,dart_pld --dtype bf16 --node-budget $1 --lookup-tokens $2 --no-progress \
    --out runs/fast-b$1-l$2.json 2>/dev/null | grep "^all" | sed "s/^/budget $1 lookup $2: /"
done
