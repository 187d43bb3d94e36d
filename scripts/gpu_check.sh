#!/usr/bin/env bash
# The GPU check in one command (BENCHMARKS.md, "GPU"): minigrpo's CUDA tests, its GRPO step beside TRL's, the decode
# loop beside HF generate, and each recipe's memory, predicted beside measured (minigrpo/lab/gpu_check.py).
#
#   scripts/gpu_check.sh --json "$OUT/gpu_check.json"      # on a CUDA machine, from the repository's root
#   scripts/gpu_check.sh --dry-run                         # anywhere: the same code on the CPU at toy sizes
#
# Packages the GPU machine lacks (TRL with datasets, bitsandbytes) are read from .gpu-site/ when it is there:
# scripts/gpu_site.sh makes it, and the device tool carries it (carry: [".gpu-site"]). Nothing is fetched.
set -euo pipefail
cd "$(dirname "$0")/.."
site=""
if [ -d .gpu-site ]; then
  site="$PWD/.gpu-site"
fi
export PYTHONPATH="$PWD${site:+:$site}${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TQDM_DISABLE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
PYTHON="${PYTHON:-python3}"
exec "$PYTHON" -m minigrpo.lab.gpu_check "$@"
