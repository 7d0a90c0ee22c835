#!/usr/bin/env bash
# The prepared GPU check, for a lent GPU machine: one command that ends inside BUDGET_S
# (default 575 s; the device tool stops a command at 600 s):
#
#   0. preflight (20 s): the driver, torch on CUDA, NVML, the exporter's imports, the drill
#      tests' collection and the Prometheus binaries; anything missing stops the run at once,
#      so a broken start costs seconds of a lease, not minutes;
#   1. the GPU drills named in GPU_DRILLS (default "h2d-stall memory-pressure healthy-gpu
#      hbm-saturation"), each in its own pytest run, in that order, each only when the time left
#      holds its worst case (NEED_S below); a drill not started is said so in run.log and
#      results.md. During the drills in RECORD_DURING (default "h2d-stall healthy-gpu")
#      `inference-bottleneck-exporter record` writes an NVML trace of the engine (RECORD_S,
#      default 40 s), and during the first of them bench/gpu/nvml_timing.py times every NVML call
#      the sidecar makes (the links and power state of issue 36 included, with what they answer)
#      and probes the driver's per-process sampling;
#   2. results.md: a table of what came out.
#
# The GPU machine has no Prometheus: carry the binaries (about 15 MiB compressed):
#   echo /.gpu-tools/ >> .git/info/exclude; mkdir -p .gpu-tools
#   tar -cJf .gpu-tools/prom.tar.xz -C /usr/bin prometheus prometheus-alertmanager
# and its files from /usr/share (tar -cJf .gpu-tools/share.tar.xz -C /usr/share/prometheus .),
# and Python packages its image lacks or has too old as wheels in .whl (README of the device
# tool): prometheus-client 0.26, pytest-asyncio, bcrypt. Name .gpu-tools and .whl in carry.
#
# Everything lands in $OUT (at most 8 files): run.log (environment first), nvml-trace-<drill>.jsonl
# for each drill in RECORD_DURING, nvml-timing.json, drills.json, drills.tar.gz (each drill's
# result.json, gpu-signals.json, sidecar-metrics.txt, post-mortem, logs, record summaries) and
# results.md. Commit the trace and the tables under docs/ when they look right.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-$ROOT/bench/gpu/out}
PY=${PY:-python3}
BUDGET_S=${BUDGET_S:-575}
RECORD_S=${RECORD_S:-40}
GPU_DRILLS=${GPU_DRILLS:-h2d-stall memory-pressure healthy-gpu hbm-saturation}
RECORD_DURING=${RECORD_DURING:-h2d-stall healthy-gpu}
END=$((SECONDS + BUDGET_S))
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/gpu-check.XXXXXX)
export PYTHONUNBUFFERED=1
# The image's own pytest plugins are not the project's (pyproject's dev extra): keep them out.
export PYTEST_ADDOPTS="-p no:xdist -p no:pytest_cov -p no:benchmark -p no:pytest_mock -p no:hypothesispytest"
log() { echo "[$(date +%T) +${SECONDS}s] $*" | tee -a "$OUT/run.log"; }
left() { echo $((END - SECONDS)); }
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
  PIDS=()
}
trap cleanup EXIT

# The worst case of each drill in seconds, start to teardown: its deadline, the stack's start
# (engine on CUDA, Prometheus, Alertmanager, sidecar), diagnose and the report.
declare -A NEED_S=([healthy-gpu]=100 [h2d-stall]=235 [memory-pressure]=235 [hbm-saturation]=330)

# --- 0. preflight ---------------------------------------------------------------------------
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$WORK/site" .whl/*.whl >>"$OUT/run.log" 2>&1 || { log "wheels did not install"; exit 1; }
  export PYTHONPATH=$WORK/site
fi
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
if [ -f .gpu-tools/prom.tar.xz ]; then
  mkdir -p "$WORK/bin" && tar -xJf .gpu-tools/prom.tar.xz -C "$WORK/bin" && export PATH=$WORK/bin:$PATH
fi
# Debian's Alertmanager reads its default template from /usr/share (a machine of its own, as root).
if [ -f .gpu-tools/share.tar.xz ] && [ ! -e /usr/share/prometheus/alertmanager/default.tmpl ]; then
  mkdir -p /usr/share/prometheus && tar -xJf .gpu-tools/share.tar.xz -C /usr/share/prometheus
fi
{
  echo "## environment"
  nvidia-smi -L
  nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.max,clocks.max.sm,clocks.max.mem --format=csv
  uname -r; nproc
  $PY - <<'EOF'
import sys, torch, tokenizers, pynvml, prometheus_client, aiohttp
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "available", torch.cuda.is_available(), "tokenizers", tokenizers.__version__,
      "aiohttp", aiohttp.__version__)
print("nvidia-ml-py", getattr(pynvml, "__version__", "?"))
EOF
  prometheus --version 2>&1 | head -1
  prometheus-alertmanager --version 2>&1 | head -1
} >>"$OUT/run.log" 2>&1
preflight() {
  $PY -c "import torch; assert torch.cuda.is_available(), 'torch sees no GPU'" || return 1
  $PY -c "import exporter.cli, exporter.lab.stack, exporter.recorder, exporter.diagnose.postmortem" || return 1
  $PY -c "
from exporter.backends.nvml_library import PynvmlApi
api = PynvmlApi(); api.init(); print('NVML devices', api.device_count(), api.driver_version())" || return 1
  command -v prometheus >/dev/null || { echo "prometheus not on PATH"; return 1; }
  [ -e /usr/share/prometheus/alertmanager/default.tmpl ] || { echo "no Alertmanager template"; return 1; }
  $PY -m pytest --collect-only -q -p no:cacheprovider tests/drills/test_drills.py -k gpu_drill || return 1
}
if ! preflight >>"$OUT/run.log" 2>&1; then
  log "preflight failed: see run.log"
  exit 1
fi
log "preflight passed; $(left)s left"

reap() {  # what a drill stopped by `timeout` left behind would hold the GPU for the next one
  pkill -f 'exporter\.lab\.refengine' 2>/dev/null
  pkill -f 'exporter\.cli (load|--web)' 2>/dev/null
  pkill -x prometheus 2>/dev/null
  pkill -f prometheus-alertmanager 2>/dev/null
  sleep 1
}

drill() {  # drill NAME: one GPU drill in its own pytest run; false when it failed or was skipped
  local name=$1 need=${NEED_S[$1]:-330}
  if [ "$(left)" -lt "$need" ]; then
    log "$name: not started ($(left)s left, its worst case is ${need}s)"
    echo "$name" >>"$WORK/not-started"
    return 1
  fi
  log "$name: started"
  DRILL_RESULTS=$WORK/drill-$name.json timeout "$(( $(left) - 10 ))" $PY -m pytest -q \
    -p no:cacheprovider --basetemp "$WORK/pt-$name" tests/drills/test_drills.py \
    -k "gpu_drill and $name" >"$WORK/pytest-$name.log" 2>&1
  local rc=$?
  reap
  tail -40 "$WORK/pytest-$name.log" >>"$OUT/run.log"
  log "$name: pytest exit code $rc"
  return $rc
}

# --- 1. the drills; the NVML trace and the call timing beside the first ones ---------------------
RECORDED=""
TIMED=""
drill_recorded() {  # drill_recorded NAME: the drill, with an NVML trace of its engine meanwhile
  local name=$1
  drill "$name" &
  local pid=$!
  PIDS+=($pid)
  # Wait until the engine computes (the drill's load starts once its stack is up).
  for _ in $(seq 90); do
    ls "$WORK/pt-$name"/*/load.json >/dev/null 2>&1 && break
    kill -0 $pid 2>/dev/null || break
    sleep 1
  done
  if kill -0 $pid 2>/dev/null; then
    sleep 15
    log "$name: recording the NVML trace for ${RECORD_S}s"
    $PY -m exporter.cli record --duration "${RECORD_S}s" --gpu.poll-interval 1s \
      --process.match '-m exporter\.lab\.refengine(?:\s|$)' \
      --out "$OUT/nvml-trace-$name.jsonl" >"$WORK/record-$name.txt" 2>&1 &
    local record=$!
    if [ -z "$TIMED" ]; then
      TIMED=1
      $PY bench/gpu/nvml_timing.py --calls 200 --probe-seconds 30 \
        --out "$OUT/nvml-timing.json" >>"$OUT/run.log" 2>&1 || log "NVML timing failed (see run.log)"
    fi
    wait $record
    log "$name: record exit code $?: $(tail -1 "$WORK/record-$name.txt")"
  fi
  wait $pid
  PIDS=()
}

log "1. GPU drills: $GPU_DRILLS, recording during: $RECORD_DURING ($(left)s left)"
for name in $GPU_DRILLS; do
  if [[ " $RECORD_DURING " == *" $name "* ]]; then
    drill_recorded "$name"
  else
    drill "$name"
  fi
done

# --- 2. results -----------------------------------------------------------------------------
$PY - "$WORK" "$OUT" <<'EOF'
import json, sys
from pathlib import Path
work, out = Path(sys.argv[1]), Path(sys.argv[2])
results = {}
for dump in sorted(work.glob("drill-*.json")):
    try:
        results.update(json.loads(dump.read_text()))
    except (OSError, ValueError) as err:
        print("unreadable", dump, err)
for workdir in sorted(work.glob("pt-*/drill-*")):
    signals = workdir / "gpu-signals.json"
    for name, result in results.items():
        if result.get("workdir") == str(workdir) and signals.exists():
            result["gpu_signals"] = json.loads(signals.read_text())
skipped = work / "not-started"
if skipped.exists():
    results["not_started"] = skipped.read_text().split()
(out / "drills.json").write_text(json.dumps(results, indent=2))
EOF
(cd "$WORK" && find . -path './pt-*/drill-*' \( -name result.json -o -name gpu-signals.json \
    -o -name sidecar-metrics.txt -o -name postmortem.html -o -name load.json \
    -o -name '*.log' -o -name 'site-config.yaml' \) -size -4M -print0 \
  | tar -czf "$OUT/drills.tar.gz" --null -T - pytest-*.log record-*.txt 2>/dev/null)
$PY bench/gpu/summarise.py --out "$OUT" >"$OUT/results.md" 2>>"$OUT/run.log"
log "done: $(ls "$OUT" | tr '\n' ' ')"
