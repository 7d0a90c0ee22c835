# Everything a fresh machine needs goes through these targets; see README.md.
PY ?= python3
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
TRACE := exporter/data/replay-2gpu-synthetic.jsonl
LISTEN ?= 127.0.0.1:10960

.PHONY: install install-dev tools run test lint docs bench

install:
	$(PY) -m pip install -q -e .

install-dev:
	$(PY) -m pip install -q -e '.[dev]'

# promtool (Prometheus) and Alertmanager for the tests that use the real tools.
tools:
	@command -v promtool >/dev/null 2>&1 || { \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends \
	    prometheus prometheus-alertmanager >/dev/null; }

# The main job: real NVML when this machine has an NVIDIA driver, else the bundled trace.
run: install
	@if [ -e /dev/nvidiactl ]; then \
	  echo "NVIDIA driver found: reading NVML. Open http://$(LISTEN)/ and /metrics"; \
	  exec $(PY) -m exporter.cli --web.listen-address $(LISTEN); \
	else \
	  echo "No NVIDIA driver: replaying $(TRACE) (synthetic, 2 GPUs) with the real /proc."; \
	  echo "Open http://$(LISTEN)/ and http://$(LISTEN)/metrics; Ctrl-C stops."; \
	  exec $(PY) -m exporter.cli --web.listen-address $(LISTEN) --gpu.replay-file $(TRACE); \
	fi

lint:
	ruff check .
	ruff format --check .
	mypy --strict exporter
	$(PY) -m exporter.docgen --check
	$(PY) -m exporter.signatures --check

test: install-dev tools lint
	$(PY) -m pytest -q

docs:
	$(PY) -m exporter.docgen

bench: install
	$(PY) bench/bench_scrape.py --gpus 8
