# explainq: `make run` serves the API with workers and demo models; `make test` runs the test suite.
# Both create .venv on first use. torch is installed first from TORCH_SPEC (the CPU build by default) so pip
# never resolves a multi-GB CUDA build; to use a GPU, install your CUDA torch build into .venv first.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: venv run test test-slow lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml clients/python/pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	$(BIN)/python -m pip install --quiet --no-deps "kronfluence==1.0.1"  # pyproject.toml's "influence" extra says why
	$(BIN)/python -m pip install --quiet -e clients/python
	touch $@

venv: $(VENV)/.installed

run: venv
	$(BIN)/explainq up --host $(HOST) --port $(PORT)

# the suite in TEST_WORKERS processes, a test module to each (every module starts its own Redis and workers on
# free ports); TEST_WORKERS=0 runs it in this process
TEST_WORKERS ?= 2
test: venv
	$(BIN)/python -m pytest -q -m "not slow" $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)

# fault injection and long end-to-end runs (Redis outages, killed workers, training through the service); CI runs them
test-slow: venv
	$(BIN)/python -m pytest -q -m slow

lint: venv
	$(BIN)/ruff check .

bench: venv
	$(BIN)/python benchmarks/api_load.py

clean:
	rm -rf $(VENV) var .pytest_cache
