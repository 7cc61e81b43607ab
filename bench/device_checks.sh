#!/usr/bin/env bash
# What session 2 left unverified on CUDA, in one device call (about 8-9 minutes on the H200):
#   run(command="bash bench/device_checks.sh", timeout_s=600)
# Results land in $OUT (the device tool's output folder), or ./device_out when OUT is unset.
set -u
export PYTHONPATH=.
out="${OUT:-device_out}"
mkdir -p "$out"
# 1. the gpu tier, now with CUDA graphs, batched MLA-conversion and Performer decode, the reduce-kernel change
timeout 330 python3 -m pytest -p no:cacheprovider -m gpu tests/gpu tests/kernels -q -o addopts="" -rf \
    --junitxml="$out/gpu.xml" 2>&1 | tail -15
# 2. engine decode, eager vs CUDA graphs (compare decode_forward_gpu_ms_median with the eager rows)
for graphs in "" "--cuda-graphs"; do
    timeout 110 python3 bench/bench_kv_quant_engine.py --layers 4 --batch 64 --context 4096 --caches bf16,int8 \
        --new-tokens 128 $graphs --json "$out/engine${graphs:+_graphs}.json" 2>&1 | grep "^|" | tail -3
done
