# mtpscope — two commands on a fresh machine:
#   make run    set-up, demo data, then the Streamlit app on the demo (127.0.0.1:8501;
#               MTPSCOPE_ROOTS=/data/models make run ADDRESS=0.0.0.0 serves it to the network)
#   make test   set-up, demo data, then the whole test suite
# Both are idempotent: the venv is rebuilt only when pyproject.toml changes, the demo only when
# its inputs change (see `mtpscope demo build`), llama-server only when its sources or
# llama-cpp-python's libraries change (`mtpscope server build`, a few minutes once: it compiles the
# server and links llama-cpp-python's own ggml / llama), and pip's wheel cache keeps
# llama-cpp-python's 6-minute source build to the first time.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.mtpscope-installed
PARITY_STAMP := $(VENV)/.mtpscope-parity-installed
PORT   ?= 8501
# 127.0.0.1: this machine only. Another address (make run ADDRESS=0.0.0.0) needs MTPSCOPE_ROOTS set.
ADDRESS ?= 127.0.0.1
EXTRAS ?= test,runtime,sweep

.PHONY: setup venv demo server run test test-fast browser bench clean-demo

setup: $(STAMP) demo

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(PY) -m pip install -q -e '.[$(EXTRAS)]'
	@touch $(STAMP)

venv: $(STAMP)

# torch (CPU) + transformers 5.24 for the Hugging Face parity tests only; `make run` does not need them.
# pip takes torch 2.13.0's CPU wheel where the machine provides it (find-links); elsewhere point pip at
# PyTorch's CPU wheels (PIP_EXTRA_INDEX_URL) or the parity tests skip, saying why.
$(PARITY_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[parity]' || echo "warning: torch/transformers not installed; HF parity tests will skip"
	@touch $(PARITY_STAMP)

demo: $(STAMP)
	$(PY) -m mtpscope.cli demo build

# llama-server from the llama.cpp llama-cpp-python vendors (docs/SERVER.md); without cmake or a compiler one
# line says so and the server tests skip.
server: $(STAMP)
	@CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(PY) -m mtpscope.cli server build --if-possible \
		|| echo "warning: llama-server build failed (see its build.log); the server tests will skip"

run: setup
	$(VENV)/bin/mtpscope app --port $(PORT) --address "$(ADDRESS)"

# Debian's Chromium for the real-browser tests: installed when missing and possible (root + apt).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
			|| echo "warning: could not install chromium; browser tests will skip"; \
		else echo "note: chromium missing and not installable here; browser tests will skip"; fi; }

test: setup server $(PARITY_STAMP) browser
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not browser"

bench: setup
	for b in benchmarks/bench_*.py; do m=$$(basename $$b .py); echo "== $$m"; $(PY) -m benchmarks.$$m || exit 1; done

clean-demo:
	$(PY) -m mtpscope.cli demo clean
