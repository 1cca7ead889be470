"""Every upstream loadability verdict against what llama-cpp-python 0.3.36 really does with the same file.

Each mutant of tests/builders.py (MUTANTS) is written once, then one child process loads them one by
one with the low-level ``llama_cpp.llama_model_load_from_file`` (vocab_only False; NULL on failure) and
reports OK / FAIL per file together with llama.cpp's log lines. A load that aborts the process (a
GGML_ASSERT) is recorded as CRASH and the child restarts after that file. The test then compares:

* ``upstream_verdict(f).loads`` with the real outcome (OK = loads; FAIL / CRASH = refuses), and
* for refusals, that llama.cpp's own error message contains the key phrase of our first reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.builders import MUTANTS, build
from tests.runtime_probe import run_loads

pytestmark = pytest.mark.llama

# phrase of llama.cpp's log line that each kind of first reason corresponds to
_PHRASES = (
    ("unknown model architecture", "unknown model architecture"),
    ("_M_range_check", "_M_range_check"),
    ("not found (a required tensor", "not found"),
    ("has no tensors", "not found"),
    ("has wrong type", "has wrong type"),
    ("has wrong array length", "has wrong array length"),
    ("wrong shape", "wrong shape"),
    ("wrong number of tensors", "wrong number of tensors"),
    ("embedding_length_out", "embedding_length_out"),
    ("n_embd_head_k == n_embd_head_v", "n_embd_head_k"),
    ("key not found in model", "key not found in model"),
    ("cannot find tokenizer merges", "cannot find tokenizer merges"),
)


@pytest.fixture(scope="module")
def real_loads(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str, str]]:
    pytest.importorskip("llama_cpp")
    d = tmp_path_factory.mktemp("loadability")
    paths = {name: build(d, name) for name in MUTANTS}
    from mtpscope.cache import vocab_path
    paths["real_vocab_file"] = vocab_path()          # the real tokenizer GGUF: arch gemma4, no tensors
    res = run_loads([str(p) for p in paths.values()])
    return {name: (p, *res[str(p)]) for name, p in paths.items()}


@pytest.mark.parametrize("name", [*sorted(MUTANTS), "real_vocab_file"])
def test_upstream_verdict_matches_llama_cpp(real_loads: dict[str, tuple[Path, str, str]], name: str) -> None:
    from mtpscope.inspector.gguf import open_gguf
    from mtpscope.inspector.loadability import upstream_verdict

    path, outcome, log = real_loads[name]
    with open_gguf(path) as f:
        v = upstream_verdict(f)
    really_loads = outcome == "OK"
    assert v.loads is really_loads, (name, outcome, v.reasons, log[-1500:])
    # the mutant table's own expectation (hand-written) agrees as well
    assert MUTANTS.get(name, ("", None, False))[2] is really_loads, (name, outcome)
    if not really_loads:
        first = v.reasons[0]
        phrase = next((ph for key, ph in _PHRASES if key in first), None)
        assert phrase is not None, f"no llama.cpp phrase known for reason {first!r}"
        assert phrase in log, (name, first, log[-1500:])
        if "wrong number of tensors" in first:   # the counts too: "expected N, got M"
            counts = first.split("wrong number of tensors; ")[1].split(" (")[0]
            assert counts in log, (name, counts, log[-800:])
