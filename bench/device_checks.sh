#!/usr/bin/env bash
# Device calls of a session, one stage per call (the device tool allows 600 s a command):
#   run(command="bash bench/device_checks.sh kernels", timeout_s=600)  # 8-bit decode table + sweeps, kernel gpu tests
#   run(command="bash bench/device_checks.sh tier", timeout_s=600)     # the whole gpu tier
#   run(command="bash bench/device_checks.sh engine", timeout_s=600)   # engine decode eager vs CUDA graphs
#   run(command="bash bench/device_checks.sh long", timeout_s=600)     # decode table at long context, split sweep,
#                                                                     # engine decode at 32 x 16384 with graphs
# Results land in $OUT (the device tool's output folder), or ./device_out when OUT is unset.
set -u
export PYTHONPATH=.
out="${OUT:-device_out}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
case "${1:-all}" in
kernels | all)
    timeout 300 python3 bench/bench_kv_quant.py --sweep --sweep-ctx 8192,1024 --json "$out/kv_quant.json" 2>&1 \
        | grep -v "^ *$" | tail -90
    timeout 150 python3 -m pytest -p no:cacheprovider -m gpu -q -o addopts="" -rf \
        tests/gpu/test_strategy_kernels_gpu.py tests/gpu/test_kv_quant_engine_gpu.py tests/gpu/test_cuda_graphs_gpu.py \
        2>&1 | tail -8
    ;;&
tier | all)
    timeout 400 python3 -m pytest -p no:cacheprovider -m gpu tests/gpu tests/kernels -q -o addopts="" -rf \
        --junitxml="$out/gpu.xml" 2>&1 | tail -15
    ;;&
long)
    timeout 280 python3 bench/bench_kv_quant.py --shapes 64x8192,16x32768,8x32768,1x32768 --sweep --sweep-set splits \
        --sweep-shapes 1x32768,8x32768,16x32768 --json "$out/kv_quant_long.json" 2>&1 | grep -v "^ *$" | tail -80
    timeout 280 python3 bench/bench_kv_quant_engine.py --layers 4 --batch 32 --context 16384 \
        --caches "${CACHES:-bf16,int8,fp8}" --new-tokens 128 --cuda-graphs --json "$out/engine_long_graphs.json" \
        2>&1 | grep "^|" | tail -4
    ;;
engine | all)
    for graphs in "" "--cuda-graphs"; do
        timeout 140 python3 bench/bench_kv_quant_engine.py --layers 4 --batch 64 --context 4096 \
            --caches "${CACHES:-bf16,int8,fp8}" --new-tokens 128 $graphs --json "$out/engine${graphs:+_graphs}.json" \
            2>&1 | grep "^|" | tail -4
    done
    ;;
esac
