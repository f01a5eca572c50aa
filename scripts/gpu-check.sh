#!/usr/bin/env bash
# The GPU check and measurement, at most 8 minutes on one GPU:
# 1. lossless decoding on the device in fp32, bf16 and fp16 with tiny models (our head and one in the DART authors'
#    format, Llama and Qwen3 targets), on transformers' forward and on the lean one with its steps as CUDA graphs;
#    a few training steps of a head in the authors' format, data-parallel over every GPU here (torchrun), whose head
#    must decode losslessly; DART against plain decoding on 4 prompts with the default model where it is here, and
#    the shipped head trained on for 45 s there (its anchor tokens per second);
# 2. the speed table (scripts/gpu_speed.py): hf_generate, vanilla, dart, dart_pld on every forward, fp32 and bf16,
#    node budgets auto, 16 and 128, DART with and without its pruning record, with each phase's milliseconds a step;
#    one table, one JSON in $OUT/gpu-speed.
#
#   scripts/gpu-check.sh                         # on a GPU
#   scripts/gpu-check.sh cuda full --model DIR   # the speed table on another model (arguments after the second go
#                                                # to scripts/gpu_speed.py: --model, --draft, --ngram, --prompts,
#                                                # --prompt-file where the data sets' packages are not installed, ...)
#   scripts/gpu-check.sh cpu quick               # the check's code paths on a CPU, in seconds (the suite runs this)
#
# Needs torch, transformers, safetensors and numpy: the project's venv, or PYTHON=... for another interpreter; wheels
# placed in .whl/ are installed first into /tmp/site (for a bare machine).
set -uo pipefail
cd "$(dirname "$0")/.."
device="${1:-cuda}"
mode="${2:-full}"
shift $(( $# < 2 ? $# : 2 ))
python="${PYTHON:-python3}"
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
if [ "$mode" = quick ]; then
  exec timeout 240 "$python" -m scripts.gpu_check --device "$device" --quick
fi
status=0
timeout 270 "$python" -m scripts.gpu_check --device "$device" --prompts 4 --train-seconds 45 || status=$?
timeout 210 "$python" -m scripts.gpu_speed --device "$device" --seconds 140 --out "${OUT:-runs}/gpu-speed" "$@" \
  || status=$?
exit "$status"
