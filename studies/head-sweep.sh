#!/bin/bash
# Short from-scratch training runs that compare mask slots K and the per-row loss decay on equal data:
# 160 optimizer steps each (320 sequences), same seed, same held-out 32 sequences, 12,288-token draft vocabulary.
# Needs runs/data/responses.jsonl (python -m dart_core train-data generate --out runs/data/responses.jsonl).
# A proxy for long runs: it ranks settings early in training, it does not predict the final head.
set -e
mkdir -p runs/head-sweep
for cfg in "5 0.8" "3 0.8" "5 1.0" "5 0.6"; do
  set -- $cfg
  out=runs/head-sweep/k$1-d$2
  [ -f $out/seconds ] && continue   # finished earlier (an interrupted run resumes)
  start=$(date +%s)
  python -m dart_core train --responses runs/data/responses.jsonl --sharegpt 20000 --heldout 32 --out $out \
    --steps 160 --eval-every 80 --draft-vocab 12288 --lr 1e-3 --n-mask $1 --row-decay $2 --resume >> $out.log 2>&1
  echo $(( $(date +%s) - start )) > $out/seconds
done
python - <<'PY'
import glob, torch
print("| K | row decay | row top-1 (rows 0-3) | chain tau, first 4 rows | chain tau, all rows | top-3 bound | minutes |")
print("|---|---|---|---|---|---|---|")
for d in sorted(glob.glob("runs/head-sweep/k*-d*/")):
    m = torch.load(d + "ckpt.pt", weights_only=False)["history"][-1]
    hist, n = m["chain_lengths"], sum(m["chain_lengths"])
    tau4 = 1 + sum(min(k, 4) * c for k, c in enumerate(hist)) / n
    k, decay = d.rstrip("/").split("/")[-1][1:].split("-d")
    top1 = " ".join(f"{x:.3f}" for x in m["row_top1"][:4])
    print(f"| {k} | {decay} | {top1} | {tau4:.3f} | {m['chain_tau']:.3f} | {m['top3_tau_bound']:.3f} |"
          f" {int(open(d + 'seconds').read()) / 60:.1f} |")
PY
