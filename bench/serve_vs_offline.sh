#!/usr/bin/env bash
# Issue 18: the same workload through the offline LLM API and through `kvpilot serve` (HTTP, SSE).
# Usage (from the repository root):
#   bench/serve_vs_offline.sh MODEL_DIR OUT_DIR "WORKLOAD FLAGS" "ENGINE FLAGS" [RATES]
# MODEL_DIR: a model directory, or shape:NAME (random weights of kvpilot.bench.shapes NAME).
# RATES: comma-separated request rates for `bench serve` (default inf: the whole burst at once).
# Writes OUT_DIR/offline.json, OUT_DIR/serve.json (last lines of the bench output) and the server
# log + its final stats feed (engine-side TTFT/TPOT histograms) as OUT_DIR/serve.log, stats.json.
set -euo pipefail
model=$1 out=$2 workload=$3 engine=$4 rates=${5:-inf}
py=${PYTHON:-python}
mkdir -p "$out"
load=()
if [[ $model == shape:* ]]; then
  dir=$(mktemp -d)
  "$py" -c "import sys; from kvpilot.bench.shapes import write_shape; write_shape(sys.argv[1], sys.argv[2])" \
    "${model#shape:}" "$dir"
  model=$dir load=(--load-format dummy)
fi
if [[ ${OFFLINE:-1} == 1 ]]; then  # OFFLINE=0: reuse OUT_DIR/offline.json from an earlier run
  TIMEFORMAT='{"wall_s": %R, "user_s": %U, "sys_s": %S}'
  # shellcheck disable=SC2086
  { time "$py" -m kvpilot.cli bench offline --model "$model" "${load[@]}" $workload $engine --no-progress \
      > "$out/offline.txt"; } 2> "$out/offline_cpu.json"
  tail -1 "$out/offline.txt" > "$out/offline.json"
fi
port=${PORT:-18000} stats_port=${STATS_PORT:-18001}
# shellcheck disable=SC2086
"$py" -m kvpilot.cli serve --model "$model" "${load[@]}" $engine --served-model-name bench \
  --port "$port" --stats-port "$stats_port" --max-queue 4096 --log-level warning > "$out/serve.log" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 1800); do
  curl -sf "http://127.0.0.1:$port/ready" > /dev/null && break
  kill -0 $server 2>/dev/null || { tail -30 "$out/serve.log"; exit 1; }
  sleep 1
done
vocab=$("$py" -c "import json,sys; print(json.load(open(sys.argv[1]+'/config.json'))['vocab_size'])" "$model")
# Warm-up: a few requests so that the first timed one does not pay for lazy initialisation.
"$py" -m kvpilot.cli bench serve --base-url "http://127.0.0.1:$port" --served-model bench --num-requests 4 \
  --input-len 16:32 --output-len 16:32 --vocab-size "$vocab" --no-progress > /dev/null
curl -sf "http://127.0.0.1:$stats_port/stats" > "$out/stats_before.json"
# CPU time of every thread of the server (utime + stime ticks): the main thread runs the asyncio
# loop (HTTP, JSON, SSE, detokenisation), the others the engine (and tokenisation helpers).
threads() { for t in /proc/$server/task/*; do echo "${t##*/} $(cut -d')' -f2- "$t/stat" | awk '{print $12+$13}')"; done; }
threads > "$out/threads_before.txt"
# shellcheck disable=SC2086
"$py" -m kvpilot.cli bench serve --base-url "http://127.0.0.1:$port" --served-model bench \
  --request-rate "$rates" --vocab-size "$vocab" $workload --no-progress \
  | tee "$out/serve.txt" | tail -1 > "$out/serve.json"
curl -sf "http://127.0.0.1:$stats_port/stats" > "$out/stats.json"
threads > "$out/threads.txt"
echo "$server" > "$out/server.pid"
"$py" bench/serve_vs_offline_report.py "$out"
