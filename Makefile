# Everything a fresh machine needs goes through these targets; see README.md.
# Python packages go into a project virtualenv (.venv/), never into the system Python: a stock
# Debian or Ubuntu refuses system-wide pip installs (PEP 668, "externally managed").
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
TRACE := exporter/data/replay-2gpu-synthetic.jsonl
LISTEN ?= 127.0.0.1:10960

# The one place that knows how to install Debian packages (as root, or through sudo).
APT_INSTALL = $(SUDO) apt-get update -qq && \
  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends
# $(call need,COMMANDS,PACKAGES): install PACKAGES unless every one of COMMANDS is on PATH.
need = missing=; for c in $(1); do command -v $$c >/dev/null 2>&1 || missing=1; done; \
  if [ -n "$$missing" ]; then $(APT_INSTALL) $(2) >/dev/null; fi

.PHONY: venv install install-dev tools thirdparty run test test-lowest lint docs bench soak demo drills drills-slow

# Debian's python3 makes virtualenvs only with python3-venv installed; install it when missing.
$(PY):
	@$(PYTHON) -m venv $(VENV) 2>/dev/null || { rm -rf $(VENV) && \
	  $(APT_INSTALL) python3-venv >/dev/null && $(PYTHON) -m venv $(VENV); }

venv: $(PY)

install: $(PY)
	$(PY) -m pip install -q -e .

# torch is pinned exactly (the `reference` extra, also here): a range pulls a newer, multi-GB build.
install-dev: $(PY)
	$(PY) -m pip install -q -e '.[dev,reference,node]' 'torch==2.13.0'

# promtool (Prometheus) and Alertmanager for the tests that use the real tools.
tools:
	@$(call need,promtool prometheus prometheus-alertmanager,prometheus prometheus-alertmanager)
	@# curl and openssl s_client: real TLS clients for tests/server/test_websec.py.
	@$(call need,curl openssl,curl openssl)
	@# victoria-metrics (VictoriaMetrics, vmalert, vmagent): the pack on a second engine and
	@# the multi-cluster paths (tests/signatures/test_vmalert.py, test_multicluster.py).
	@$(call need,victoria-metrics vmalert vmagent,victoria-metrics)
	@# buildah, podman (run with runc) and debootstrap: tests/image builds and runs the image.
	@$(call need,buildah podman runc debootstrap,buildah podman runc debootstrap)
	@# chromium: the browser tests (tests/test_browser.py) load the report and the landing
	@# page through Playwright; tmux: the demo's screen in a real terminal (tests/lab).
	@$(call need,chromium tmux,chromium tmux)

# Third-party engines for the drills and `make demo ENGINE=...`: llama.cpp's llama-server built
# from the llama-cpp-python source distribution (CMake, g++, Ninja; 34 minutes measured on 2
# CPUs shared with other jobs, load average 10-15; once per machine and version) and PyTriton
# (1.5 minutes) in a virtualenv of Debian's python3, whose
# libpython3.11 its Triton stub links; both in ~/.cache/inference-bottleneck-exporter
# (python -m exporter.lab.thirdparty).
thirdparty: $(PY)
	@$(call need,cmake g++ ninja,cmake g++ ninja-build)
	@/usr/bin/python3 -c 'import ensurepip' 2>/dev/null && \
	  [ -e /usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0 ] || \
	  $(APT_INSTALL) python3 python3-venv libpython3.11 >/dev/null
	$(PY) -m exporter.lab.thirdparty build

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

# The whole pipeline on this machine, live: the reference engine under load, the sidecar, the
# node agent, Prometheus (fast-node rules) and Alertmanager paging a local PagerDuty stand-in.
# Ctrl-C stops it.
# `make demo INJECT=frontend-gil` injects a bottleneck (several: INJECT=softirq,tokenizer-slow);
# `make demo LAYOUT=sidecar` puts NVML in the sidecar instead of the chart's default node layout
# (a node agent, a stand-in kubelet), LAYOUT=dcgm a stand-in dcgm-exporter; DEMO_ARGS passes
# more flags, e.g.
# DEMO_ARGS="--duration 3m --plain".
# `make demo ENGINE=llamacpp` (or triton) runs a third-party engine instead (make thirdparty).
demo: $(PY)
	$(PY) -m pip install -q -e '.[reference,node]' 'torch==2.13.0'
	@{ $(call need,prometheus prometheus-alertmanager,prometheus prometheus-alertmanager); } || \
	  echo "Prometheus and Alertmanager could not be installed: the demo runs without them."
	$(if $(filter-out reference,$(ENGINE)),@$(MAKE) --no-print-directory thirdparty)
	$(PY) -m exporter.cli demo $(if $(ENGINE),--engine $(ENGINE)) \
	  $(if $(INJECT),--inject $(INJECT)) $(if $(LAYOUT),--layout $(LAYOUT)) $(DEMO_ARGS)

# The end-to-end bottleneck drills alone (about 30 minutes on 2 CPUs). Every run writes its
# report to build/drills/drills.md (ignored); this target also copies it to docs/drills.md, on
# purpose. The report keeps the other speed's section from docs/drills.md.
drills: install-dev tools thirdparty
	@status=0; $(PY) -m pytest -q tests/drills || status=$$?; \
	  if [ -f build/drills/drills.md ]; then cp build/drills/drills.md docs/drills.md; fi; \
	  exit $$status

# The same matrix (CPU and disaggregated drills; the third-party engines cannot be slowed)
# with the reference engine's model worker DRILL_SLOWDOWN times slower, sized to what it then
# serves, the thresholds unchanged (about 30 minutes on 2 CPUs: not part of `make test`).
DRILL_SLOWDOWN ?= 8
drills-slow: install-dev tools
	@status=0; DRILL_SLOWDOWN=$(DRILL_SLOWDOWN) $(PY) -m pytest -q tests/drills || status=$$?; \
	  if [ -f build/drills/drills.md ]; then cp build/drills/drills.md docs/drills.md; fi; \
	  exit $$status

lint: install-dev
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy --strict exporter
	$(VENV)/bin/lint-imports
	$(PY) build-tools/docgen.py --check
	$(PY) build-tools/protos.py --check
	$(PY) -m exporter.signatures --check

# Two pytest runs: everything but the drills on $(TEST_WORKERS) workers side by side
# (pytest-xdist; a test file stays on one worker, so a module's fixtures are built once), then
# the drills alone, serial: they measure CPU and must not share the machine. Both always run;
# either failing fails the target.
TEST_WORKERS ?= 2
test: install-dev tools thirdparty lint
	@status=0; \
	  $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --ignore=tests/drills || status=$$?; \
	  $(PY) -m pytest -q tests/drills || status=$$?; \
	  exit $$status

# The exposition tests once more, against the lowest version of each core dependency that
# pyproject.toml allows (.ci/constraints-lowest.txt), in a throwaway virtualenv.
test-lowest: $(PY)
	$(PY) .ci/lowest.py

docs:
	$(PY) build-tools/docgen.py

# Regenerate dashboards/*.json from the code in dashboards/ (CI fails when they differ).
.PHONY: dashboards
dashboards: install-dev
	$(PY) -m dashboards

# Soak: 10k scrapes with the engine flapping and a GPU lost and recovered; RSS growth < 2 MiB.
soak: install-dev
	$(PY) bench/soak.py --scrapes 10000

# The overhead suite, a few minutes: the exporter side by side with Debian's
# node_exporter; JSON in bench/results/, tables regenerated in docs/performance.md.
bench: install
	@$(call need,prometheus-node-exporter,prometheus-node-exporter)
	$(PY) bench/run_all.py
	$(PY) bench/engine_poll.py

# The container image, built offline from a local debootstrap base (docs/deployment.md).
.PHONY: image chart
image: tools
	$(SUDO) build-tools/build-image.sh

# The Helm chart's copies of alert_rules/ and dashboards/*.json, and its README values table
# (tests/helm fails when they are stale). `make chart SITE=site.yaml` instead writes a copy of
# the chart to $(CHART_OUT) whose rules and dashboards are generated from that site config.
CHART_OUT ?= build/chart
chart:
	$(PY) build-tools/chart.py $(if $(SITE),--config $(SITE) --out $(CHART_OUT))
