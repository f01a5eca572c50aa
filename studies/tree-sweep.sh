#!/usr/bin/env bash
# The CPU tree-size sweep behind DART's default node budget: tokens/s and tau of DART for each node budget, both
# dtypes, greedy, on the first prompts of MT-bench and HumanEval. Usage: bash studies/tree-sweep.sh [DRAFT] [LIMIT]
set -euo pipefail
draft=${1:-default}; limit=${2:-3}; out=runs/sweep; mkdir -p $out
python -m dart_core bench --workloads mtbench,humaneval --limit "$limit" --max-new-tokens 64 --temperature 0 \
  --methods hf_generate,pld --dtype fp32,bf16 --draft "$draft" --out $out/baselines.json --no-progress >/dev/null
for nb in 2 4 8 16 32 60; do
  python -m dart_core bench --workloads mtbench,humaneval --limit "$limit" --max-new-tokens 64 --temperature 0 \
    --methods dart --dtype fp32,bf16 --draft "$draft" --node-budget $nb --out $out/nb$nb.json --no-progress >/dev/null
done
python - "$out" <<'PY'
import json, sys, glob, os
out = sys.argv[1]
base = json.load(open(f"{out}/baselines.json"))
hf = {r["dtype"]: r["tokens_per_s"] for r in base["results"] if r["workload"] == "all" and r["method"] == "hf_generate"}
print("| method | node budget | dtype | tok/s | vs fp32 generate | tau |")
print("|---|---|---|---|---|---|")
rows = [(r["method"], "-", r) for r in base["results"] if r["workload"] == "all"]
for path in sorted(glob.glob(f"{out}/nb*.json"), key=lambda p: int(os.path.basename(p)[2:-5])):
    nb = os.path.basename(path)[2:-5]
    rows += [("dart", nb, r) for r in json.load(open(path))["results"] if r["workload"] == "all"]
for method, nb, r in rows:
    print(f"| {method} | {nb} | {r['dtype']} | {r['tokens_per_s']:.1f} | {r['tokens_per_s'] / hf['fp32']:.2f}x | {r['tau']:.2f} |")
PY
