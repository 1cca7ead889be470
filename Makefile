# mtpscope — two commands on a fresh machine:
#   make run    set-up, demo data, then the Streamlit app on the demo (127.0.0.1:8501;
#               MTPSCOPE_ROOTS=/data/models make run ADDRESS=0.0.0.0 serves it to the network)
#   make test   set-up, demo data, the linters (make lint: ruff, mypy), then the whole test suite
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
MLX_STAMP := $(VENV)/.mtpscope-mlx-installed
PORT   ?= 8501
# 127.0.0.1: this machine only. Another address (make run ADDRESS=0.0.0.0) needs MTPSCOPE_ROOTS set.
ADDRESS ?= 127.0.0.1
EXTRAS ?= test,runtime,sweep

.PHONY: setup venv demo server run lint test test-fast test-avx2 browser bench clean-demo

setup: $(STAMP) demo

# setuptools >= 77 reads the SPDX `license` of pyproject.toml; Python 3.11's venv brings 65, which only build
# isolation (pip install -e) hides: the packaging test builds a wheel without it
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip 'setuptools>=77'
	CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(PY) -m pip install -q -e '.[$(EXTRAS)]'
	@touch $(STAMP)

venv: $(STAMP)

# torch (CPU) + transformers 5.24 for the Hugging Face parity tests only; `make run` does not need them.
# pip takes torch 2.13.0's CPU wheel where the machine provides it (find-links); elsewhere point pip at
# PyTorch's CPU wheels (PIP_EXTRA_INDEX_URL) or the parity tests skip, saying why.
$(PARITY_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[parity]' || echo "warning: torch/transformers not installed; HF parity tests will skip"
	@touch $(PARITY_STAMP)

# mlx (CPU backend on Linux) + mlx-vlm for `record --runtime mlx` and its tests (docs/RUNTIMES.md); `make run`
# does not need them. Where the wheels do not install (mlx's Linux wheels need glibc >= 2.35, x86-64 or arm64)
# one line says so and the MLX tests skip, saying why.
$(MLX_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[mlx]' || echo "warning: mlx / mlx-vlm not installed; the MLX runtime tests will skip"
	@touch $(MLX_STAMP)

# (the build prints the demo folder on stdout, for scripts; said here with what it is)
demo: $(STAMP)
	@root=$$($(PY) -m mtpscope.cli demo build) && echo "demo models and traces: $$root"

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

# ruff (rules: pyproject.toml's [tool.ruff]) and mypy (tests/typecheck.py: strict on inspector/ and traces/;
# which folders' errors fail it: [tool.mtpscope.typecheck] enforce). The tools are pinned in the test extra.
# ruff's violations fail the run in RUFF_ENFORCE (the whole tree) and are only counted in RUFF_REPORT (a
# folder being cleaned up; none now).
RUFF_ENFORCE ?= .
RUFF_REPORT  ?=
lint: $(STAMP)
	$(PY) -m ruff check $(RUFF_ENFORCE)
	@if [ -n "$(strip $(RUFF_REPORT))" ]; then echo "ruff, reported only: $(RUFF_REPORT)"; \
		$(PY) -m ruff check --exit-zero --statistics $(RUFF_REPORT); fi
	$(PY) -m tests.typecheck

test: setup server $(PARITY_STAMP) $(MLX_STAMP) browser lint
	$(PY) -m pytest -q

# The llama.cpp-dependent tests (marker `llama`) against a second llama-cpp-python built for AVX2 without
# AVX-512 / AMX (docs/FIDELITY.md, "Every x86 CPU"): what most AMD and older Intel machines run. Its wheel is
# built once into the cache folder (pip's wheel cache keys by version, not by CMAKE_ARGS, so it is built
# without it), its venv is $(AVX2_VENV), and its demo, traces and llama-server live in their own cache folder
# so that everything those tests read was made by the AVX2 build. Not part of `make test` (it rebuilds
# llama.cpp and the demo once: about 15 minutes on 2 cores, then about 10).
AVX2_VENV  ?= .venv-avx2
AVX2_PY    := $(AVX2_VENV)/bin/python
AVX2_CACHE ?= $(or $(MTPSCOPE_CACHE),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/mtpscope)/avx2
AVX2_WHEEL_DIR := $(AVX2_CACHE)/wheels
AVX2_CMAKE := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
	-DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF \
	-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DGGML_AVX_VNNI=OFF
AVX2_STAMP := $(AVX2_VENV)/.mtpscope-installed

$(AVX2_STAMP): pyproject.toml
	@mkdir -p "$(AVX2_WHEEL_DIR)"
	@ls "$(AVX2_WHEEL_DIR)"/llama_cpp_python-0.3.36-*.whl >/dev/null 2>&1 || { \
		echo "building llama-cpp-python 0.3.36 for AVX2 without AVX-512 / AMX (once, into $(AVX2_WHEEL_DIR))"; \
		CMAKE_ARGS="$(AVX2_CMAKE)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(PYTHON) -m pip wheel -q --no-deps \
			--no-cache-dir --no-binary llama-cpp-python -w "$(AVX2_WHEEL_DIR)" llama-cpp-python==0.3.36; }
	@test -x $(AVX2_PY) || $(PYTHON) -m venv $(AVX2_VENV)
	$(AVX2_PY) -m pip install -q --upgrade pip
	$(AVX2_PY) -m pip install -q --no-index --find-links "$(AVX2_WHEEL_DIR)" --force-reinstall --no-deps \
		llama-cpp-python==0.3.36
	$(AVX2_PY) -m pip install -q -e '.[$(EXTRAS)]'
	$(AVX2_PY) -m pip install -q -e '.[parity]' || echo "warning: torch/transformers not installed; HF parity tests will skip"
	@touch $(AVX2_STAMP)

test-avx2: $(AVX2_STAMP)
	@$(AVX2_PY) -c "import llama_cpp, sys; s = llama_cpp.llama_print_system_info().decode(); print('llama.cpp:', s); \
		sys.exit(0 if 'AVX2 = 1' in s and 'AVX512 = 1' not in s and 'AMX_INT8 = 1' not in s else \
		'error: $(AVX2_VENV) is not an AVX2-only build of llama.cpp')"
	MTPSCOPE_CACHE="$(AVX2_CACHE)" $(AVX2_PY) -m mtpscope.cli demo build
	@MTPSCOPE_CACHE="$(AVX2_CACHE)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(AVX2_PY) -m mtpscope.cli server build \
		--if-possible || echo "warning: llama-server build failed; the server tests will skip"
	MTPSCOPE_CACHE="$(AVX2_CACHE)" $(AVX2_PY) -m pytest -q -m "llama and not browser"

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not browser"

bench: setup
	for b in benchmarks/bench_*.py; do m=$$(basename $$b .py); echo "== $$m"; $(PY) -m benchmarks.$$m || exit 1; done

clean-demo:
	$(PY) -m mtpscope.cli demo clean
