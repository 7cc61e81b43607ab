#!/usr/bin/env bash
# Issue 30 on the H200, one device call per stage (600 s a command):
#   run(command="bash bench/device_issue30.sh speed", carry=[".whl"])  # bounds, gpu tests, offline, decode steps,
#                                                                     # serving burst (engine thread in the server)
#   run(command="BUDGET=195 bash bench/device_issue30.sh int8")  # per-step breakdown of the offline workload,
#                                                                     # int8 then bf16 KV; batch-1 step; bounds
#   run(command="bash bench/device_issue30.sh contract", carry=[".whl"])  # GPU tests of every strategy, offline, b1
#   run(command="BUDGET=330 bash bench/device_issue30.sh fresh")  # int8 vs bf16 offline breakdown after the
#                                                                     # fresh-prefill path; its GPU test; bounds
#   run(command="bash bench/device_issue30.sh serve", carry=[".whl"])  # serving burst, engine core in its own
#                                                                     # process and in a thread; Poisson 2 req/s
#   run(command="BUDGET=400 bash bench/device_issue30.sh sweep")      # cuBLAS vs Triton GEMM at the decode shapes;
#                                                                     # one prefill step's kernels, bf16 and int8
#   run(command="BUDGET=480 bash bench/device_issue30.sh verify")     # kernel + GPU tests, GEMV at M=1, offline
#                                                                     # breakdown int8 and bf16, batch-1 step
#   (stages fused and strategies: session 15's first measurement and its strategies' GPU tests)
#   run(command="BUDGET=570 bash bench/device_issue30.sh final")      # session 17: defaults, GPU tests, offline
#                                                                     # bf16 + int8, batch 1 and 256, bounds
#   run(command="BUDGET=150 bash bench/device_issue30.sh b1_repeat") # session 18: batch 1 fused / unfused, twice
#   run(command="BUDGET=450 bash bench/device_issue30.sh auto")      # session 18: final on an H200, else nothing
#   run(command="BUDGET=300 bash bench/device_issue30.sh gemv_epilogue")  # session 18 (prepared): the two-level
#                                                                     # epilogue: kernel/GPU tests, batch 1, sweep
#   run(command="BUDGET=560 bash bench/device_issue30.sh gemv")       # the fused GEMV + add + RMSNorm: its kernel and
#                                                                     # GPU tests, the sweep against cuBLAS + norm,
#                                                                     # batch 1 and 4 with --fused-gemv-rows
# Everything is logged to $OUT/issue30.log; each step's JSON record also to $OUT/records.jsonl.
set -u
start=$SECONDS
if [[ ${1:-speed} != int8 && ${1:-speed} != fresh && ${1:-speed} != sweep && ${1:-speed} != fused && ${1:-speed} != verify && ${1:-speed} != gemv && ${1:-speed} != gemv_quick && ${1:-speed} != final && ${1:-speed} != b1_repeat && ${1:-speed} != auto && ${1:-speed} != gemv_epilogue ]]; then  # int8 and fresh run no server: no wheels to carry
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
fi
export PYTHONPATH=/tmp/site:. PYTHON=python3 PYTHONUNBUFFERED=1
out=${OUT:-device_out}
mkdir -p "$out"
log=$out/issue30.log
left() { echo $(( ${BUDGET:-585} - (SECONDS - start) )); }
step() {  # step NAME TIMEOUT CMD...: run CMD under a timeout if there is time left, log it, keep its last line
  local name=$1 limit=$2; shift 2
  (( $(left) < 20 )) && { echo "== $name: skipped (no time left)" | tee -a "$log"; return; }
  (( limit > $(left) )) && limit=$(left)
  echo "== $name ($(date +%T), ${limit}s): $*" | tee -a "$log"
  local text=/tmp/$name.txt
  [[ -n ${STEP_FILES:-} ]] && text=$out/$name.txt  # written under $OUT as it runs: a step cut by the limit comes back
  timeout "$limit" "$@" > "$text" 2>&1
  echo "== $name rc=$? after $((SECONDS - start))s" >> "$text"
  grep -v -E "it/s\]|s/it\]|^\s*$" "$text" | tail -40 | tee -a "$log"
  local record; record=$(grep '^{' "$text" | tail -1)
  [[ -n $record ]] && echo "{\"step\": \"$name\", \"record\": $record}" >> "$out/records.jsonl"
  [[ $name == offline ]] && echo "$record" > /tmp/offline.json
  return 0
}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee -a "$log"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$log"
W="--num-requests 256 --input-len 100:1024 --output-len 100:1024 --seed 0"
E=${SERVE_FLAGS:---max-num-seqs 256 --max-num-batched-tokens 16384 --cuda-graphs}  # as bench/device_serving.sh
serve_dir() { mkdir -p "/tmp/serve-$1" && cp /tmp/offline.json "/tmp/serve-$1/offline.json"; echo "/tmp/serve-$1"; }
case "${1:-speed}" in
gemv)  # sessions 16-17 (prepared without a device): the fused GEMV + add + RMSNorm (fused_gemv_rows), the folded
  # decode reduce; one call, most important first (device starts are scarce): correctness, then batch 1 each way
  export STEP_FILES=1 TRITON_CACHE_DIR=/tmp/triton-cache
  step bounds 25 python3 bench/speed_bounds.py
  step kernel_tests 80 python3 -m pytest -p no:cacheprovider -q -o addopts="" -rf tests/kernels/test_gemv_norm.py \
    tests/kernels/test_rmsnorm.py tests/kernels/test_rotary_silu_mul.py
  step gpu_tests 120 python3 -m pytest -p no:cacheprovider -m gpu -q -o addopts="" -rf tests/gpu/test_ticket_kernels_gpu.py \
    tests/gpu/test_cuda_graphs_gpu.py
  step decode_b1 40 python3 bench/profile_decode_kernels.py --batch 1 --context 512 --max-num-seqs 8 --top 16
  step decode_b1_fused 40 python3 bench/profile_decode_kernels.py --batch 1 --context 512 --max-num-seqs 8 --top 16 \
    --fused-gemv-rows 1
  step decode_b1_fused_fold 40 python3 bench/profile_decode_kernels.py --batch 1 --context 512 --max-num-seqs 8 \
    --top 16 --fused-gemv-rows 1 --fold-reduce
  step decode_b1_fused_o 40 python3 bench/profile_decode_kernels.py --batch 1 --context 512 --max-num-seqs 8 --top 16 \
    --fused-gemv-rows 1 --fused-gemv-projections o_proj
  step decode_fold 45 python3 bench/bench_decode_attention.py --fold --json "$out/decode_fold.json"
  step decode_b4_fused 40 python3 bench/profile_decode_kernels.py --batch 4 --context 512 --max-num-seqs 8 --top 8 \
    --fused-gemv-rows 4
  step gemv_norm_sweep 120 python3 bench/gemv_norm_sweep.py --json "$out/gemv_norm_sweep.json"
  ;;
gemv_quick)  # the gemv stage cut to its verdict when little device time is left: the fused kernel's tests on
  # CUDA, batch 1 unfused (the baseline) against fused and o_proj only, the folded reduce
  export STEP_FILES=1 TRITON_CACHE_DIR=/tmp/triton-cache
  step kernel_tests 60 python3 -m pytest -p no:cacheprovider -q -o addopts="" -rf tests/kernels/test_gemv_norm.py
  step decode_b1 40 python3 bench/profile_decode_kernels.py --batch 1 --context 512 --max-num-seqs 8 --top 16
  step decode_b1_fused 40 python3 bench/profile_decode_kernels.py --batch 1 --context 512 --max-num-seqs 8 --top 16 \
    --fused-gemv-rows 1
  step decode_b1_fused_o 40 python3 bench/profile_decode_kernels.py --batch 1 --context 512 --max-num-seqs 8 --top 16 \
    --fused-gemv-rows 1 --fused-gemv-projections o_proj
  step decode_fold 45 python3 bench/bench_decode_attention.py --fold --json "$out/decode_fold.json"
  ;;
final)  # session 17, second call: the defaults after the gemv stage chose them; every figure against its bound
  export TRITON_CACHE_DIR=/tmp/triton-cache  # no step files: at most 8 files come back (the log keeps each step's tail)
  # (session 18: the default fused_gemv_rows 1 with gemv_config from the gemv stage's sweep; the unfused
  # batch-1 step and the sweep at M = 1 in the same call decide whether it stays)
  step bounds 30 python3 bench/speed_bounds.py
  step kernel_tests 70 python3 -m pytest -p no:cacheprovider -q -o addopts="" -rf tests/kernels/test_gemv_norm.py \
    tests/kernels/test_sliding_window.py  # session 19: the window's kernels, compiled (CPU: interpreter only)
  step decode_b1 45 python3 bench/profile_decode_kernels.py --batch 1 --context 512 --max-num-seqs 8 --top 12 \
    --steps 200  # 200 steps: 20 let one host stall double the unfused figure (session 18's second call)
  step decode_b1_unfused 45 python3 bench/profile_decode_kernels.py --batch 1 --context 512 --max-num-seqs 8 \
    --top 12 --steps 200 --fused-gemv-rows 0
  step gpu_tests 170 python3 -m pytest -p no:cacheprovider -m gpu -q -o addopts="" -rf \
    tests/gpu/test_engine_gpu.py tests/gpu/test_cuda_graphs_gpu.py tests/gpu/test_kv_quant_graphs_gpu.py \
    tests/gpu/test_async_scheduling_gpu.py tests/gpu/test_ticket_kernels_gpu.py
  step offline 110 python3 -m kvpilot.cli bench offline --shape llama-3-8b --no-progress
  step offline_int8 100 python3 -m kvpilot.cli bench offline --shape llama-3-8b --kv-cache-dtype int8 --no-progress
  step decode_b256 50 python3 bench/profile_decode_kernels.py --batch 256 --context 700 --top 12
  step gemv_norm_sweep 60 python3 bench/gemv_norm_sweep.py --m 1 --json "$out/gemv_norm_sweep.json"
  ;;
gemv_epilogue)  # session 18, prepared without a device: the fused GEMV's two-level epilogue (GemvConfig.split_epilogue)
  export TRITON_CACHE_DIR=/tmp/triton-cache
  step kernel_tests 60 python3 -m pytest -p no:cacheprovider -q -o addopts="" -rf tests/kernels/test_gemv_norm.py
  step gpu_tests 60 python3 -m pytest -p no:cacheprovider -m gpu -q -o addopts="" -rf tests/gpu/test_ticket_kernels_gpu.py
  for run in 1 2; do
    step "decode_b1_$run" 45 python3 bench/profile_decode_kernels.py --batch 1 --context 512 --max-num-seqs 8 \
      --top 4 --steps 200
    step "decode_b1_split_$run" 45 python3 bench/profile_decode_kernels.py --batch 1 --context 512 \
      --max-num-seqs 8 --top 4 --steps 200 --gemv-split-epilogue
  done
  step gemv_norm_sweep 90 python3 bench/gemv_norm_sweep.py --m 1 --json "$out/gemv_norm_sweep.json"
  ;;
auto)  # session 18: the final stage on an H200 (the issue's card), else batch 1 fused / unfused repeated
  if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash "$0" final; fi
  [[ -n ${AUTO_H100:-} ]] && exec bash "$0" "$AUTO_H100"  # e.g. AUTO_H100=b1_repeat; else nothing on another card
  echo "== not an H200: nothing run (AUTO_H100=STAGE runs a stage there)"
  ;;
b1_repeat)  # session 18: batch 1 fused (the default) against unfused, alternated, 200 steps each
  export TRITON_CACHE_DIR=/tmp/triton-cache
  for run in 1 2; do
    step "decode_b1_$run" 45 python3 bench/profile_decode_kernels.py --batch 1 --context 512 --max-num-seqs 8 \
      --top 4 --steps 200
    step "decode_b1_unfused_$run" 45 python3 bench/profile_decode_kernels.py --batch 1 --context 512 \
      --max-num-seqs 8 --top 4 --steps 200 --fused-gemv-rows 0
  done
  ;;
strategies)  # session 15, third call: the GPU tests of the strategies over the changed Llama layers
  export STEP_FILES=1 TRITON_CACHE_DIR=/tmp/triton-cache
  step gpu_tests 400 python3 -m pytest -p no:cacheprovider -m gpu -q -o addopts="" -rf --continue-on-collection-errors \
    tests/gpu/test_eviction_gpu.py tests/gpu/test_kv_quant_engine_gpu.py tests/gpu/test_strategy_kernels_gpu.py \
    tests/gpu/test_calibrated_conversions_gpu.py tests/gpu/test_linear_gpu.py tests/gpu/test_structured_gpu.py \
    tests/gpu/test_moe_graphs_gpu.py tests/gpu/test_engine_gpu.py
  ;;
verify)  # session 15, second call: validation's ids copied from pinned memory, rotary over head groups, GEMV at M = 1
  export STEP_FILES=1 TRITON_CACHE_DIR=/tmp/triton-cache
  step kernel_tests 50 python3 -m pytest -p no:cacheprovider -q -o addopts="" -rf tests/kernels/test_rotary_silu_mul.py
  step gpu_tests 120 python3 -m pytest -p no:cacheprovider -m gpu -q -o addopts="" -rf \
    tests/gpu/test_kv_quant_graphs_gpu.py tests/gpu/test_cuda_graphs_gpu.py tests/gpu/test_async_scheduling_gpu.py
  step gemv_sweep 60 python3 bench/gemm_sweep.py --m 1 --json "$out/gemv_sweep.json"
  step breakdown_int8 100 python3 bench/offline_breakdown.py --shape llama-3-8b --kv-cache-dtype int8
  step breakdown_bf16 90 python3 bench/offline_breakdown.py --shape llama-3-8b
  step decode_b1 45 python3 bench/profile_decode_kernels.py --batch 1 --context 512 --max-num-seqs 8 --top 14
  ;;
fused)  # session 15: residual carried into the next norm, K/V stored by the rotary kernel, validation read a step later
  export STEP_FILES=1 TRITON_CACHE_DIR=/tmp/triton-cache
  step kernel_tests 60 python3 -m pytest -p no:cacheprovider -q -o addopts="" -rf tests/kernels/test_rotary_silu_mul.py
  step gpu_tests 130 python3 -m pytest -p no:cacheprovider -m gpu -q -o addopts="" -rf \
    tests/gpu/test_cuda_graphs_gpu.py tests/gpu/test_kv_quant_graphs_gpu.py tests/gpu/test_async_scheduling_gpu.py \
    tests/gpu/test_engine_gpu.py
  step breakdown_bf16 90 python3 bench/offline_breakdown.py --shape llama-3-8b
  step breakdown_int8 100 python3 bench/offline_breakdown.py --shape llama-3-8b --kv-cache-dtype int8
  step decode_b1 45 python3 bench/profile_decode_kernels.py --batch 1 --context 512 --max-num-seqs 8 --top 12
  step decode_b256 50 python3 bench/profile_decode_kernels.py --batch 256 --context 700 --top 12
  step decode_b128 45 python3 bench/profile_decode_kernels.py --batch 128 --context 1000 --top 12
  step bounds 30 python3 bench/speed_bounds.py
  ;;
sweep)  # session 15: cuBLAS vs the Triton GEMM at the decode shapes; one prefill step's kernels, bf16 then int8
  export STEP_FILES=1
  step gemm_sweep 260 python3 bench/gemm_sweep.py --m 16,32,64,96,128,160,192,256 --json "$out/gemm_sweep.json"
  step prefill_bf16 70 python3 bench/profile_prefill_kernels.py
  step prefill_int8 70 python3 bench/profile_prefill_kernels.py --kv-cache-dtype int8
  ;;
speed)
  step bounds 60 python3 bench/speed_bounds.py
  step gpu_tests 150 python3 -m pytest -p no:cacheprovider -m gpu -q -o addopts="" -rf -x \
    tests/gpu/test_async_scheduling_gpu.py tests/gpu/test_engine_gpu.py tests/gpu/test_cuda_graphs_gpu.py
  step offline 130 python3 -m kvpilot.cli bench offline --shape llama-3-8b --no-progress
  step decode_b1 80 python3 bench/profile_decode_kernels.py --batch 1 --context 512 --max-num-seqs 8 --top 8
  step decode_b256 80 python3 bench/profile_decode_kernels.py --batch 256 --context 700 --top 8
  step offline_int8 100 python3 -m kvpilot.cli bench offline --shape llama-3-8b --kv-cache-dtype int8 --no-progress
  step serve_burst 150 env OFFLINE=0 bench/serve_vs_offline.sh shape:llama-3-8b "$(serve_dir thread)" "$W" "$E" inf
  cp /tmp/serve-thread/report.json "$out/serve_burst_report.json" 2>/dev/null
  step offline_sync 100 python3 -m kvpilot.cli bench offline --shape llama-3-8b --async-scheduling off --no-progress
  ;;
measure)  # one call: the GPU tests of the replayed sample/validation steps, then offline bf16 and int8, decode steps
  export STEP_FILES=1 TRITON_CACHE_DIR=/tmp/triton-cache
  step bounds 40 python3 bench/speed_bounds.py
  step gpu_tests 170 python3 -m pytest -p no:cacheprovider -m gpu -q -o addopts="" -rf \
    tests/gpu/test_cuda_graphs_gpu.py tests/gpu/test_kv_quant_graphs_gpu.py tests/gpu/test_eviction_gpu.py \
    tests/gpu/test_strategy_kernels_gpu.py
  step offline 110 python3 -m kvpilot.cli bench offline --shape llama-3-8b --no-progress
  step offline_int8 100 python3 -m kvpilot.cli bench offline --shape llama-3-8b --kv-cache-dtype int8 --no-progress
  step decode_b1 50 python3 bench/profile_decode_kernels.py --batch 1 --context 512 --max-num-seqs 8 --top 8
  step decode_b256 60 python3 bench/profile_decode_kernels.py --batch 256 --context 700 --top 8
  ;;
contract)  # after the strategy-contract refactor (issue 32): every GPU test of the strategies and engine, offline, b1
  export STEP_FILES=1 TRITON_CACHE_DIR=/tmp/triton-cache
  step gpu_tests 330 python3 -m pytest -p no:cacheprovider -m gpu -q -o addopts="" -rf \
    tests/gpu/test_cuda_graphs_gpu.py tests/gpu/test_kv_quant_graphs_gpu.py tests/gpu/test_eviction_gpu.py \
    tests/gpu/test_strategy_kernels_gpu.py tests/gpu/test_engine_gpu.py tests/gpu/test_mla_engine_gpu.py \
    tests/gpu/test_moe_graphs_gpu.py tests/gpu/test_linear_gpu.py tests/gpu/test_kv_quant_engine_gpu.py \
    tests/gpu/test_calibrated_conversions_gpu.py tests/gpu/test_async_scheduling_gpu.py
  step offline 110 python3 -m kvpilot.cli bench offline --shape llama-3-8b --no-progress
  step decode_b1 50 python3 bench/profile_decode_kernels.py --batch 1 --context 512 --max-num-seqs 8 --top 30
  step bounds 30 python3 bench/speed_bounds.py
  ;;
int8)  # where int8 KV's offline time goes, against bf16 in the same call (bench/offline_breakdown.py)
  export STEP_FILES=1 TRITON_CACHE_DIR=/tmp/triton-cache
  step breakdown_int8 120 python3 bench/offline_breakdown.py --shape llama-3-8b --kv-cache-dtype int8
  step breakdown_bf16 80 python3 bench/offline_breakdown.py --shape llama-3-8b
  step decode_b1 45 python3 bench/profile_decode_kernels.py --batch 1 --context 512 --max-num-seqs 8 --top 8
  step bounds 30 python3 bench/speed_bounds.py
  ;;
fresh)  # session 14: the 8-bit cache's prefill over the step's own K/V, the prefill grid by the longest chunk
  export STEP_FILES=1 TRITON_CACHE_DIR=/tmp/triton-cache
  step bounds 30 python3 bench/speed_bounds.py
  step gpu_tests 75 python3 -m pytest -p no:cacheprovider -m gpu -q -o addopts="" -rf \
    tests/gpu/test_kv_quant_engine_gpu.py
  step breakdown_int8 110 python3 bench/offline_breakdown.py --shape llama-3-8b --kv-cache-dtype int8
  step breakdown_bf16 90 python3 bench/offline_breakdown.py --shape llama-3-8b
  ;;
serve)  # the offline figure of the speed stage's run (.whl/offline_run1.json) is the reference
  cp .whl/offline_run1.json /tmp/offline.json
  step serve_core 130 env OFFLINE=0 bench/serve_vs_offline.sh shape:llama-3-8b "$(serve_dir core)" "$W" \
    "$E --engine-core process" inf
  cp /tmp/serve-core/report.json "$out/serve_core_report.json" 2>/dev/null
  step serve_poisson 130 env OFFLINE=0 bench/serve_vs_offline.sh shape:llama-3-8b "$(serve_dir poisson)" \
    "--num-requests 60 --input-len 100:1024 --output-len 100:1024 --seed 1" "$E --engine-core process" 2
  cp /tmp/serve-poisson/report.json "$out/serve_poisson_report.json" 2>/dev/null
  step serve_thread 130 env OFFLINE=0 bench/serve_vs_offline.sh shape:llama-3-8b "$(serve_dir thread)" "$W" "$E" inf
  cp /tmp/serve-thread/report.json "$out/serve_thread_report.json" 2>/dev/null
  ;;
poisson)  # Poisson 2 req/s alone, engine core in its own process
  cp .whl/offline_run1.json /tmp/offline.json
  step serve_poisson 130 env OFFLINE=0 bench/serve_vs_offline.sh shape:llama-3-8b "$(serve_dir poisson)" \
    "--num-requests 60 --input-len 100:1024 --output-len 100:1024 --seed 1" "$E --engine-core process" 2
  cp /tmp/serve-poisson/report.json "$out/serve_poisson_report.json" 2>/dev/null
  ;;
esac
echo "== done after $((SECONDS - start))s" | tee -a "$log"
