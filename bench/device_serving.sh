#!/usr/bin/env bash
# Issue 18 on the GPU (run from the repository root on the device machine):
#   1. the 256-request burst through the offline LLM API and over HTTP (`kvpilot serve`), same
#      engine settings, random Llama-3-8B-shaped weights;
#   2. Poisson 2 requests/s over HTTP: client TTFT/TPOT (bench serve) vs the engine's own (stats feed).
# Results: $OUT/burst/report.json and $OUT/poisson/report.json (also printed).
set -euo pipefail
out=${OUT:-/tmp/serving-device}
engine="--max-num-seqs 256 --max-num-batched-tokens 16384 --cuda-graphs"
bench/serve_vs_offline.sh shape:llama-3-8b "$out/burst" \
  "--num-requests 256 --input-len 100:1024 --output-len 100:1024 --seed 0" "$engine" inf
mkdir -p "$out/poisson" && cp "$out/burst/offline.json" "$out/poisson/"
OFFLINE=0 bench/serve_vs_offline.sh shape:llama-3-8b "$out/poisson" \
  "--num-requests 120 --input-len 100:1024 --output-len 100:1024 --seed 1" "$engine" 2
