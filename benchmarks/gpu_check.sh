#!/usr/bin/env bash
# GPU check of the recorder (issue 11, section 7), prepared for a CUDA machine; prints, asserts nothing.
#
#   1. a virtual environment with llama-cpp-python 0.3.36 built with GGML_CUDA=on (from PyPI, or from a
#      local sdist / wheelhouse on a machine without network: LLAMA_SDIST=path/to/llama_cpp_python-0.3.36.tar.gz,
#      WHEELHOUSE=folder of the other wheels), and mtpscope installed from this checkout;
#   2. the demo (full 262144-token tokenizer: it must already be in $MTPSCOPE_CACHE/vocab on a machine
#      without network) recorded twice with the noisy upstream drafter: --n-gpu-layers -1 and 0 (CPU);
#   3. the two traces compared step by step while both runs fed the same tokens: argmax agreement of the
#      drafts and the relative error of h_next (|gpu - cpu| / |cpu|), plus the replay baseline's h_next
#      error on the GPU trace (BASELINE_GPU: exact GELU);
#   4. benchmarks/bench_record.py with --n-gpu-layers -1: the tracing overhead on the GPU.
#
# Usage: bash benchmarks/gpu_check.sh            (environment: PY, VENV, MTPSCOPE_CACHE, LLAMA_SDIST,
#                                                 WHEELHOUSE, THREADS, REPEATS, MAX_TOKENS)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PY:-python3}"
VENV="${VENV:-$ROOT/.venv-cuda}"
THREADS="${THREADS:-4}"
REPEATS="${REPEATS:-5}"
MAX_TOKENS="${MAX_TOKENS:-96}"
export MTPSCOPE_CACHE="${MTPSCOPE_CACHE:-$HOME/.cache/mtpscope}"
OUT="${OUT:-$ROOT/.gpu-check}"
mkdir -p "$OUT"

echo "== gpu_check: $(date -u +%FT%TZ) on $(hostname)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || \
  echo "warning: nvidia-smi not found"
command -v nvcc >/dev/null && nvcc --version | tail -1 || echo "warning: nvcc not found (the CUDA build needs it)"

# ---------------------------------------------------------------------------------------- 1. environment
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip)
FIND=()
if [ -n "${WHEELHOUSE:-}" ]; then FIND=(--no-index --find-links "$WHEELHOUSE"); fi
"${PIP[@]}" install -q "${FIND[@]}" --upgrade pip scikit-build-core cmake ninja || true
"${PIP[@]}" install -q "${FIND[@]}" -e "$ROOT"
if ! "$VENV/bin/python" - <<'EOF' 2>/dev/null
from mtpscope.traces.run.llama import binding
import sys
sys.exit(0 if binding.gpu_name() else 1)
EOF
then
  echo "== building llama-cpp-python 0.3.36 with GGML_CUDA=on (several minutes)"
  SRC="${LLAMA_SDIST:-llama-cpp-python==0.3.36}"
  CMAKE_ARGS="-DGGML_CUDA=on" FORCE_CMAKE=1 "${PIP[@]}" install "${FIND[@]}" --force-reinstall --no-cache-dir \
    --no-binary llama-cpp-python "$SRC"
fi
"$VENV/bin/python" - <<'EOF'
from mtpscope.traces.run.llama import binding
print("llama.cpp sees GPU:", binding.gpu_name())
print("runtime:", binding.runtime_info(-1))
EOF

# ---------------------------------------------------------------------------------------- 2. two recordings
"$VENV/bin/python" -m mtpscope.cli demo build -q --no-traces
DEMO="$("$VENV/bin/python" -m mtpscope.cli demo path)"
PROMPTS="$OUT/prompts.txt"
printf '%s\n' "The quick brown fox jumps over the lazy dog" "Every sailor sings about distant islands" > "$PROMPTS"
for NGL in -1 0; do
  "$VENV/bin/python" -m mtpscope.cli record --target "$DEMO/target.gguf" --assistant "$DEMO/drafter-upstream-noisy.gguf" \
    --prompts "$PROMPTS" --max-tokens "$MAX_TOKENS" --hidden f32 --n-gpu-layers "$NGL" --threads "$THREADS" \
    --no-progress --overwrite --out "$OUT/trace-ngl$NGL"
done

# ---------------------------------------------------------------------------------------- 3. GPU vs CPU
"$VENV/bin/python" - "$OUT/trace-ngl-1" "$OUT/trace-ngl0" <<'EOF'
import sys
import numpy as np
from mtpscope import traces
from mtpscope.traces.run.replay import replay

gpu, cpu = traces.open(sys.argv[1]), traces.open(sys.argv[2])
print("devices:", gpu.manifest["runtime"]["device"], "vs", cpu.manifest["runtime"]["device"])
hg, hc = gpu.hidden("h_next"), cpu.hidden("h_next")
sg, sc = gpu.steps.reset_index(drop=True), cpu.steps.reset_index(drop=True)
key = ["prompt_id", "round", "k"]
m = sg.reset_index().merge(sc.reset_index(), on=key, suffixes=("_g", "_c"))
n_cmp = n_same = 0
rel = []
for pid, grp in m.groupby("prompt_id", sort=True):
    for row in grp.sort_values(["round", "k"]).itertuples():
        n_cmp += 1
        rel.append(float(np.linalg.norm(hg[row.index_g] - hc[row.index_c]) / np.linalg.norm(hc[row.index_c])))
        if row.token_g != row.token_c:   # from here on the two runs feed different tokens
            break
        n_same += 1
rel = np.array(rel)
print(f"steps compared while the runs agree: {n_cmp}; argmax agreement {n_same}/{n_cmp} = {n_same / max(n_cmp, 1):.4f}")
if rel.size:
    print(f"h_next relative error GPU vs CPU: median {np.median(rel):.3g}, max {rel.max():.3g}")
res = replay(sys.argv[1])
print("replay of the GPU trace:", res.baseline, f"baseline agreement {res.summary()['variants']['baseline']['agreement']:.4f}",
      f"h_next rel err max {res.summary()['baseline_h_next_rel_err_max']}")
EOF

# ---------------------------------------------------------------------------------------- 4. overhead
(cd "$ROOT" && "$VENV/bin/python" -m benchmarks.bench_record --n-gpu-layers -1 --threads "$THREADS" --repeats "$REPEATS" \
  --max-tokens "$MAX_TOKENS")
echo "== gpu_check done"
