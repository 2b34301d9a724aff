# Targets with a `## ` comment are listed by `make help`.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV ?= .venv
PY := $(VENV)/bin/python
HARNESS := $(VENV)/bin/harness
# The torch build. Here the CPU wheel on disk; on a GPU cluster for example
#   make setup TORCH_SPEC='torch==2.13.0' TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX_URL ?=
# JIT-built DeepSpeed ops are cached here so each is compiled once per machine, with the venv's ninja
# (a different ninja on PATH would trigger a rebuild).
export TORCH_EXTENSIONS_DIR ?= $(HOME)/.cache/harness/torch_extensions
export PATH := $(abspath $(VENV))/bin:$(PATH)
# DeepSpeed's async_io op (NVMe offload; needs Debian's libaio-dev), built or loaded from the cache.
BUILD_OPS = $(PY) -c "from deepspeed.ops.op_builder import AsyncIOBuilder as B; b = B(); \
	b.load(verbose=False) if b.is_compatible(verbose=False) else print('ops: libaio missing, async_io not built')"

# Processes the unit tests spread over (pytest-xdist): the cores, at most 4 (each imports torch).
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n < 4 ? n : 4 )))

# The local Slurm cluster uses cgroups where the kernel allows (real OUT_OF_MEMORY states).
export SLURM_LOCAL_CGROUP ?= auto

R ?= cpu_zero2
S ?= cpu_grid
ARGS ?=

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

# A pip configuration may name local index folders that hold only some packages (`pip config list`: here
# /root/.config/pip/pip.conf's extra-index-url file:///opt/pypi-more/simple); pip then warns "Location ... is
# ignored: it is neither a file nor a directory" once per package it looks up, ~100 lines. Only those lines are
# dropped (the machine's configuration is left as it is); pip's exit status and its other messages pass through.
PIP_IGNORED_LOCATION := is ignored: it is neither a file nor a directory
QUIET_PIP = set -o pipefail; $(PY) -m pip $(1) 2>&1 | { grep -v --line-buffered '$(PIP_IGNORED_LOCATION)' || true; }

$(VENV)/.installed: pyproject.toml constraints.txt
	@echo "[setup 1/3] virtualenv $(VENV)"
	python3 -m venv $(VENV)
	@echo "[setup 2/3] $(TORCH_SPEC)$(if $(TORCH_INDEX_URL), from $(TORCH_INDEX_URL)) (the largest download: minutes on a fresh machine)"
	$(call QUIET_PIP,install -q $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL)) '$(TORCH_SPEC)')
	@echo "[setup 3/3] the harness and its dependencies (pinned by constraints.txt)"
	$(call QUIET_PIP,install -q -c constraints.txt -e '.[test]')
	touch $@
	@echo "[setup] $(VENV) ready"

setup: $(VENV)/.installed ## make .venv and install the harness (TORCH_SPEC / TORCH_INDEX_URL choose torch)

recipe: setup ## run one preset end to end: make recipe R=<name> [ARGS='layout.zero_stage=3 ...']
	$(HARNESS) run recipes=$(R) $(ARGS)

plan: setup ## predict memory / FLOPs / validity without launching: make plan R=<name> [ARGS=...]
	$(HARNESS) plan recipes=$(R) $(ARGS)

sweep: setup ## run a grid preset: make sweep S=<sweep preset> [launcher=slurm_local] [ARGS=...]
	$(HARNESS) sweep sweep=$(S) $(if $(launcher),launcher=$(launcher)) $(if $(cluster),cluster=$(cluster)) $(ARGS)

sweep-status: setup ## progress of a sweep: make sweep-status D=<sweep dir>
	$(HARNESS) sweep status $(D)

sweep-resume: setup ## resubmit what did not complete: make sweep-resume D=<sweep dir>
	$(HARNESS) sweep resume $(D)

report: setup ## the newest sweep (or D='<dir> [<dir>...]') -> summary.csv/.parquet, report.html, wandb_report.json
	$(HARNESS) report $(D)

doctor: setup ## environment facts, PASS / WARN per line (versions, CUDA / NCCL, GPUs, DeepSpeed ops, Slurm, W&B)
	$(HARNESS) doctor

sync: setup ## upload the offline W&B runs below a sweep: make sync D=<sweep dir> [ARGS=--dry-run]
	$(HARNESS) sync $(D) $(ARGS)

test: setup ## run every test (unit, integration on CPU, local Slurm)
	@mkdir -p $(TORCH_EXTENSIONS_DIR)
	@# libaio-dev first (apt-get, as tests/slurm install Slurm): the NVMe tests fail, not skip, without it.
	tools/install_libaio.sh || echo "libaio-dev not installed: the NVMe offload tests will fail and say why"
	@# The op compiles once per machine, before the suite (111 s on 2 quiet cores; a 3 s load afterwards).
	@# Built beside the suite, which keeps every core busy, it took over 25 minutes and the NVMe tests timed out.
	@# A build waits without a word on the lock file a killed build left: stopped (SIGINT, which releases its own
	@# lock) after 20 minutes, the suite goes on.
	MAX_JOBS=$$(nproc) timeout -s INT 1200 $(BUILD_OPS) || echo "async_io op not built (failed, or waited \
	20 minutes on a lock a killed build left: $(TORCH_EXTENSIONS_DIR)/*/lock): the NVMe offload tests will fail and say why"
	@# The unit tests on TEST_WORKERS processes (pytest-xdist), then the Slurm tests beside the others: the
	@# multi-process runs on TEST_WORKERS processes, the faults one at a time (tools/run_tests.sh says why).
	@# All three parts always run.
	PY=$(PY) TEST_WORKERS=$(TEST_WORKERS) tools/run_tests.sh

ops: setup ## build the JIT DeepSpeed ops (async_io for NVMe offload) into TORCH_EXTENSIONS_DIR, once per machine
	tools/install_libaio.sh
	MAX_JOBS=$${MAX_JOBS:-2} $(BUILD_OPS)

test-unit: setup ## fast pure tests only
	$(PY) -m pytest -q -n $(TEST_WORKERS) tests/unit

bench: setup ## overhead and planning benchmarks
	$(PY) tests/bench/bench_plan.py
	$(PY) tests/bench/bench_recommend.py
	$(PY) tests/bench/bench_recommend_quality.py
	$(PY) tests/bench/bench_time_model.py
	$(PY) tests/bench/bench_published.py
	$(PY) tools/a100_cross_check.py
	$(PY) tools/gemm_public_check.py
	$(PY) tests/bench/bench_overhead.py
	$(PY) tests/bench/bench_verdicts.py --times 3
	$(PY) tests/unit/report/bench_build_report.py 100

gpu-wheels: setup ## fetch into gpu-wheels/ the wheels gpu-check installs offline on a GPU machine (run here, with the registries)
	PY=$(PY) tools/gpu_wheels.sh

gpu-check: PY := python3
gpu-check: ## on one GPU, < 8 min: each engine's CUDA branch checked, shapes measured beside the time model (PY=python3; ARGS='--cpu')
	PY=$(PY) tools/gpu_check.sh $(ARGS)

.PHONY: gpu-wheels gpu-check

slurm-up: ## start a local two-node Slurm cluster
	bash slurm/local/up.sh

slurm-down: ## stop the local Slurm cluster
	bash slurm/local/down.sh

clean: ## remove the virtualenv
	rm -rf $(VENV)

.PHONY: help setup recipe plan sweep sweep-status sweep-resume report doctor sync test test-unit ops bench slurm-up slurm-down clean
