#!/usr/bin/env bash
# Issue 29 on the H200 (fused MoE, graphs for deepseek_v2 / minimax), one stage per device call (600 s each):
#   first:   the fused MoE kernel tests on CUDA and the MoE graph GPU tests, then DeepSeek-V2-Lite shapes:
#            decode step at batch 64 / 1k context and batch 1 against the bytes bound (bench_moe_decode.py),
#            the 256-request offline workload, then MiniMax's decode step
#   second:  (after the align / RoPE kernels) the kernel tests again, DeepSeek's decode figures, then where a
#            batch-256 decode step spends its GPU time (bench/profile_decode_kernels.py)
#   final:   every figure of the closing note: DeepSeek and MiniMax decode steps and offline workloads
# Results in $OUT (logs and JSON rows).
set -u
export PYTHONPATH=".:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
out="${OUT:-device_out}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$out/machine.txt"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, \
'transformers', transformers.__version__)" | tee -a "$out/machine.txt"
decode() {  # shape, seconds
    timeout "$2" python3 bench/bench_moe_decode.py --shape "$1" --batches 64,1 --context 1024 --steps 20 \
        --json "$out/decode_$1.json" 2>&1 | grep -v "^{" | tee "$out/decode_$1.log" | tail -6
}
offline() {  # shape, seconds
    timeout "$2" python3 -m kvpilot.cli bench offline --shape "$1" --no-progress 2>&1 \
        | tee "$out/offline_$1.log" | grep -E "tok/s|Error|error" | tail -4
}
case "${1:-first}" in
first)
    timeout 100 python3 -m pytest -p no:cacheprovider -q -o addopts="" -rf --junitxml="$out/tests.xml" \
        tests/kernels/test_fused_moe.py tests/gpu/test_moe_graphs_gpu.py -m "kernels or gpu" -s 2>&1 \
        | grep -E "rel err|replays|passed|failed|FAILED|Error" | tail -20
    decode deepseek-v2-lite 130
    offline deepseek-v2-lite $((540 - SECONDS))
    decode minimax-text-01-8l $((585 - SECONDS))
    ;;
second)
    timeout 90 python3 -m pytest -p no:cacheprovider -q -o addopts="" -rf --junitxml="$out/tests2.xml" \
        tests/kernels/test_fused_moe.py tests/kernels/test_mla_rope.py tests/gpu/test_moe_graphs_gpu.py \
        -m "kernels or gpu" 2>&1 | grep -E "passed|failed|FAILED|Error" | tail -12
    decode deepseek-v2-lite 80
    timeout $((200 - SECONDS)) python3 bench/profile_decode_kernels.py --shape deepseek-v2-lite --batch 256 \
        --context 1024 --steps 10 --top 30 2>&1 | grep -v Warn | tee "$out/profile_256.log" | tail -34
    ;;
final)
    decode deepseek-v2-lite 60
    offline deepseek-v2-lite 100
    decode minimax-text-01-8l 70
    offline minimax-text-01-8l $((385 - SECONDS))
    ;;
esac
