#!/usr/bin/env bash
# The draft head's training run on a remote GPU machine, one command (scripts/gpu_train.py says what it does; the plan,
# with what each call carries, is in docs/training-any-target.md). On the device:
#
#   scripts/gpu-train.sh --model .gpu/gguf --data .gpu/data --init-from assets/smollm2-dart-head --out "$OUT"
#
# Wheels placed in .whl/ (gguf, for the default model's GGUF) are installed first into /tmp/site; the converted
# model and calibrations go to /tmp/dart-cache. The whole run is held to 570 s, inside the call's 10 minutes.
set -euo pipefail
export GPU_TRAIN_STARTED="$(date +%s.%N)"   # --seconds counts from here: the wheels and Python's start are spent too
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 DART_CACHE_DIR="${DART_CACHE_DIR:-/tmp/dart-cache}"
exec timeout 570 "$python" -m scripts.gpu_train "$@"
