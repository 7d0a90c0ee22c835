#!/usr/bin/env bash
# The prepared GPU check, for a lent GPU machine (under 10 minutes, one command):
#
#   1. the reference engine on CUDA (the `medium` model), the sidecar on real NVML, 60 s of
#      load; `inference-bottleneck-exporter record` writes the NVML trace meanwhile and prints
#      NVML call counts and times; the sidecar's /metrics is kept;
#   2. NVML call timing: every call the sidecar makes, 200 times each, on every GPU;
#   3. the GPU-only drills named in GPU_DRILLS (default "h2d-stall memory-pressure", about
#      4 minutes each; "hbm-saturation" takes about 5 and needs Prometheus, so it goes in a
#      second run: GPU_DRILLS=hbm-saturation SKIP_RECORD=1): with prometheus and
#      alertmanager on PATH (or carried as .gpu-tools/prom.tar.xz) the full harness
#      (tests/drills); otherwise `diagnose --target` on the live sidecar after 90 s of load,
#      which must rank the injected cause first;
#   4. results.md: a table of what came out.
#
# The GPU machine has no Prometheus: to run the full drill harness there, carry the binaries
# (about 20 MiB compressed): echo /.gpu-tools/ >> .git/info/exclude; mkdir -p .gpu-tools;
# tar -cJf .gpu-tools/prom.tar.xz -C /usr/bin prometheus prometheus-alertmanager
# and name .gpu-tools in the device tool's carry.
#
# Everything lands in $OUT (at most 8 files: env.txt, run.log, nvml-trace.jsonl, record.txt,
# nvml-timing.json, sidecar-metrics.txt, drills.json, results.md). Commit the trace and the
# table under docs/ when they look right. No network is needed; torch, aiohttp,
# prometheus-client, nvidia-ml-py, psutil, pyyaml and tokenizers must be importable.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-$ROOT/bench/gpu/out}
PY=${PY:-python3}
GPU_DRILLS=${GPU_DRILLS:-h2d-stall memory-pressure}
mkdir -p "$OUT"
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
WORK=$(mktemp -d /tmp/gpu-check.XXXXXX)
PIDS=()
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/run.log"; }
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
  sleep 2
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null; done
}
trap cleanup EXIT

# --- 0. environment -----------------------------------------------------------------------
{
  nvidia-smi -L
  nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.max --format=csv
  $PY - <<'EOF'
import sys, torch, tokenizers
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "available", torch.cuda.is_available(), "tokenizers", tokenizers.__version__)
EOF
} >"$OUT/env.txt" 2>&1
log "environment: $(head -1 "$OUT/env.txt")"
if [ -f .gpu-tools/prom.tar.xz ]; then
  mkdir -p "$WORK/bin" && tar -xJf .gpu-tools/prom.tar.xz -C "$WORK/bin" && export PATH=$WORK/bin:$PATH
fi

wait_for() {  # wait_for FILE PATTERN SECONDS
  local deadline=$((SECONDS + $3))
  while [ $SECONDS -lt $deadline ]; do
    grep -q "$2" "$1" 2>/dev/null && return 0
    sleep 1
  done
  return 1
}

start_engine() {  # start_engine NAME [engine flags...]: sets ENGINE_URL
  local name=$1; shift
  $PY -m exporter.lab.refengine --port 0 --device cuda "$@" >"$WORK/$name-engine.log" 2>&1 &
  PIDS+=($!)
  if ! wait_for "$WORK/$name-engine.log" "listening on" 300; then
    log "engine $name did not start:"; tail -20 "$WORK/$name-engine.log" | tee -a "$OUT/run.log"
    return 1
  fi
  ENGINE_URL=$(grep -o 'listening on http://[^ ]*' "$WORK/$name-engine.log" | head -1 | cut -d' ' -f3)
  log "engine $name: $(grep -o 'model .* to start' "$WORK/$name-engine.log" | head -1)"
}

start_sidecar() {  # start_sidecar NAME: sets SIDECAR_URL
  local name=$1
  $PY -m exporter.cli --web.listen-address 127.0.0.1:0 --engine.url "$ENGINE_URL/metrics" \
    --engine.poll-interval 1s --gpu.poll-interval 1s --tokenizer.probe-interval 2s \
    --process.match '-m exporter\.reference(\s|$)' >"$WORK/$name-sidecar.log" 2>&1 &
  PIDS+=($!)
  wait_for "$WORK/$name-sidecar.log" "listening on" 60 || { log "sidecar $name did not start"; return 1; }
  SIDECAR_URL=http://$(grep -o 'listening on [0-9.:]*' "$WORK/$name-sidecar.log" | head -1 | cut -d' ' -f3)
}

load() {  # load SECONDS [flags]
  local seconds=$1; shift
  $PY -m exporter.cli load --url "$ENGINE_URL" --rate 4 --prompt-tokens 512 --output-tokens 256 \
    --duration "${seconds}s" --drain 5s --progress off --output json "$@"
}

# --- 1. healthy run on NVML, with a recorded trace ------------------------------------------
if [ -n "${SKIP_RECORD:-}" ]; then
  log "1. and 2. skipped (SKIP_RECORD)"
else
log "1. reference engine on CUDA, sidecar on NVML, 60 s of load, NVML trace recorded"
if start_engine healthy && start_sidecar healthy; then
  $PY -m exporter.cli record --duration 60s --out "$OUT/nvml-trace.jsonl" >"$OUT/record.txt" 2>&1 &
  RECORD=$!
  load 60 >"$WORK/healthy-load.json" 2>>"$OUT/run.log"
  wait $RECORD
  curl -s "$SIDECAR_URL/metrics" >"$OUT/sidecar-metrics.txt"
  log "load: $($PY -c "import json,sys;d=json.load(open(sys.argv[1]));print(d['completed'],'requests,',d['output_tokens_per_s'],'tokens/s, TTFT p50',round(1000*d['ttft_s'].get('p50',0)),'ms, ITL p50',round(1000*d['itl_s'].get('p50',0),1),'ms')" "$WORK/healthy-load.json" 2>&1)"
  command -v promtool >/dev/null && promtool check metrics <"$OUT/sidecar-metrics.txt" >>"$OUT/run.log" 2>&1
fi
cleanup; PIDS=()

# --- 2. NVML call timing --------------------------------------------------------------------
log "2. NVML call timing"
$PY bench/gpu/nvml_timing.py --calls 200 --out "$OUT/nvml-timing.json" >>"$OUT/run.log" 2>&1 \
  || log "NVML timing failed (see run.log)"
fi

# --- 3. GPU-only drills ---------------------------------------------------------------------
if command -v prometheus >/dev/null && { command -v alertmanager >/dev/null || command -v prometheus-alertmanager >/dev/null; }; then
  selection=$(for d in $GPU_DRILLS; do printf '%s' "${sep:-}gpu_drill and $d"; sep=" or "; done)
  budget=$((240 * $(echo "$GPU_DRILLS" | wc -w) + 60))
  log "3. GPU drills with Prometheus and Alertmanager: $GPU_DRILLS (at most ${budget}s)"
  DRILL_RESULTS=$OUT/drills.json timeout "$budget" $PY -m pytest -q -p no:cacheprovider \
    tests/drills/test_drills.py -k "$selection" >>"$OUT/run.log" 2>&1
  log "drills exit code $?"
else
  log "3. GPU drills without Prometheus: diagnose --target after 90 s of load"
  echo "{" >"$OUT/drills.json"
  first=1
  for scenario in $GPU_DRILLS; do
    if [ "$scenario" = hbm-saturation ]; then
      log "hbm-saturation: compares decode speed with minutes earlier, needs Prometheus: skipped"
      continue
    fi
    if start_engine "$scenario" --inject "$scenario" && start_sidecar "$scenario"; then
      load 150 >"$WORK/$scenario-load.json" 2>>"$OUT/run.log" &
      LOADPID=$!
      PIDS+=($LOADPID)
      sleep 90
      $PY -m exporter.cli diagnose --target "$SIDECAR_URL" --duration 45s --interval 5s \
        --output json >"$WORK/$scenario-diagnose.json" 2>>"$OUT/run.log"
      top=$($PY -c "import json,sys;f=json.load(open(sys.argv[1]))['findings'];print(f[0]['alert'] if f else 'nothing', f[0]['status'] if f else '')" "$WORK/$scenario-diagnose.json" 2>&1)
      log "$scenario: diagnose ranks first: $top"
      [ $first = 1 ] || echo "," >>"$OUT/drills.json"
      first=0
      printf '"%s": ' "$scenario" >>"$OUT/drills.json"
      cat "$WORK/$scenario-diagnose.json" >>"$OUT/drills.json"
    fi
    cleanup; PIDS=()
  done
  echo "}" >>"$OUT/drills.json"
fi

# --- 4. results table -----------------------------------------------------------------------
$PY bench/gpu/summarise.py --out "$OUT" >"$OUT/results.md" 2>>"$OUT/run.log"
log "done: $(ls "$OUT" | tr '\n' ' ')"
