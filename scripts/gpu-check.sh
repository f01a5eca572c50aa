#!/usr/bin/env bash
# The GPU check, at most 8 minutes on one GPU: lossless decoding on the device in fp32, bf16 and fp16 with tiny
# models (our head and one in the DART authors' format, Llama and Qwen3 targets), then DART against plain decoding
# on 10 prompts with the default model where its files are on the machine; and a few training steps of a head in the
# authors' format on a tiny Qwen3, data-parallel over every GPU here (torchrun), whose head must decode losslessly.
# Prints one line per check.
#
#   scripts/gpu-check.sh            # on a GPU
#   scripts/gpu-check.sh cpu quick  # the same code paths on a CPU, in seconds (the test suite runs this)
#
# Needs torch, transformers, safetensors, numpy and scipy: the project's venv, or PYTHON=... for another
# interpreter; wheels placed in .whl/ are installed first into /tmp/site (for a bare machine).
set -euo pipefail
cd "$(dirname "$0")/.."
device="${1:-cuda}"
quick="${2:-}"
python="${PYTHON:-python3}"
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
exec timeout 480 "$python" -m scripts.gpu_check --device "$device" ${quick:+--quick}
