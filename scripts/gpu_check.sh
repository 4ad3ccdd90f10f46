#!/usr/bin/env bash
# The prepared GPU check: CUDA tests, then the component profile at LlamaGen-XL text-to-image and LlamaGen-B
# class-to-image shapes (random weights, bf16, CUDA graphs), with rounds for batches of 1 to 64 images at the
# first. Prints a Markdown summary; writes JSON to OUT_DIR.
# On a machine without a GPU it runs the CPU parts and says that the CUDA parts were skipped.
#   usage: scripts/gpu_check.sh OUT_DIR        (PYTHON=... picks the interpreter; default python3)
set -euo pipefail
out="${1:?usage: scripts/gpu_check.sh OUT_DIR}"
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1
PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python3}" scripts/gpu_check.py "$out"
