VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip

.PHONY: install demo test test-all lint docs wheel-check ci bench-sync gpu-check clean

$(VENV)/.installed: pyproject.toml requirements.txt
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -r requirements.txt
	$(PIP) install -q -c requirements.txt -e '.[dev]'
	touch $@

install: $(VENV)/.installed

# The main job: time to train on the emulated S2 cluster (8 workers, two racks behind a 200 Mbit/s
# uplink; needs root and iproute2): BSP (DDP), DDP with the fp16 hook (the simplest alternative)
# and --sync auto, 2 seeds each, to mnist's declared target (0.91 at hidden=2048, which the solo
# control without averaging never reaches), each run stopping there, with the banded plot.
# Elsewhere it says why in one line and trains on loopback instead (no bottleneck to relieve).
DEMO_RUN := --workload mnist --workload-option hidden=2048 --seeds 2 --methods bsp,fp16,auto \
	--stop-at-target --quiet
DEMO_S2 := --cluster s2-inter-rack $(DEMO_RUN)
DEMO_LOOPBACK := --workers 4 $(DEMO_RUN)
demo: install
	@if why=$$($(PY) -c "from dssync.lab.cluster import require_root_and_tools as r; r()" 2>&1); then \
		$(VENV)/bin/dssync compare $(DEMO_S2) --out reports/demo; \
	else \
		echo "demo: on loopback, no bottleneck to relieve: $$(echo "$$why" | tail -1)"; \
		$(VENV)/bin/dssync compare $(DEMO_LOOPBACK) --out reports/demo; \
	fi

# The quick suite (a few minutes on 2 cores): everything but the tests marked slow.
test: install
	$(PY) -m pytest -q -m "not slow"

# Everything, the slow end-to-end runs included (what CI runs after the lint).
test-all: install
	$(PY) -m pytest -q --durations=30

# What CI runs (.ci/run): lint, every test, the docs, and the wheel in a venv with torch alone.
ci: lint test-all docs wheel-check

# The documentation site (docs/, mkdocs.yml) into build/site; a broken link or anchor fails it.
# docs/reference.md is plain markdown written by tools/api_reference.py (tests check it is current).
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir build/site

# Build the wheel and sdist, install the wheel into a fresh venv that has only the pinned CPU
# torch (and numpy), and run examples/quickstart.py there under torchrun on 2 ranks.
wheel-check: install
	timeout 900 tools/wheel_check.sh

lint: install
	$(VENV)/bin/ruff check src tests examples tools
	$(VENV)/bin/ruff format --check src tests examples tools

bench-sync: install
	$(VENV)/bin/dssync bench-sync

# On a CUDA machine: nccl training, gloo over CUDA tensors and the README example, one line each.
# Runs from the source tree on the machine's own python3 (no install); says so and passes without CUDA.
# Where python3 has no torch (a CPU machine with only the venv), the venv's interpreter is used.
GPU_PYTHON ?= $(shell python3 -c 'import torch' 2>/dev/null && echo python3 || echo $(PY))
gpu-check:
	PYTHONPATH=src $(GPU_PYTHON) tools/gpu_check.py

clean:
	rm -rf $(VENV) build dist site src/*.egg-info
