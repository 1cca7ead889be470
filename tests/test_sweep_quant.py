"""``mtpscope sweep --assistant-quant``: the demo pair's drafter quantized by llama.cpp to two types, each
swept as its own assistant on a real local Ray (one worker, small max-tokens), then read back.

- the quantized drafters land in the cache under the drafter's content hash, named by type;
- ``report --json``'s ``quantization`` rows (acceptance rate, mean acceptance length, tokens/s per
  type x category) equal what each task's trace says when counted here with pandas (not DuckDB);
- the text report and the app's Sweep page show the same numbers.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp")
pytest.importorskip("ray")

pytestmark = [pytest.mark.slow, pytest.mark.llama]

TYPES = ("f32", "q4_k_m")
PROMPTS = [("The quick brown fox", "prose"), ("def fibonacci(n):", "code")]


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    code = "import sys; from mtpscope.cli.main import main; sys.argv = ['mtpscope', *sys.argv[1:]]; main()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture(scope="module")
def swept(demo_dir, tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("sweep_quant")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t, "category": c}) + "\n" for t, c in PROMPTS))
    cache = root / "cache"
    env = {**os.environ, "MTPSCOPE_CACHE": str(cache)}
    out = root / "sw"
    r = _cli("sweep", "--target", str(demo_dir.target), "--assistant", str(demo_dir.drafter_upstream_noisy),
             "--assistant-quant", ",".join(TYPES), "--prompts", str(prompts), "--n-draft", "2", "--max-tokens", "8",
             "--out", str(out), "--ray", "local", "--workers", "1", "--threads-per-worker", "2", "--no-progress",
             env=env)
    assert r.returncode == 0, r.stderr
    for t in TYPES:
        assert f"quantizing {demo_dir.drafter_upstream_noisy.name} to {t} with llama.cpp" in r.stderr
    return out, cache


def _independent(task_dirs: list[Path], categories: dict[tuple[int, int], str]) -> dict[str, dict[str, float]]:
    """acceptance rate, mean acceptance length, tokens/s per category (and ``all``) from the traces' rounds."""
    import pandas as pd

    from mtpscope.traces.store.reader import open_trace

    frames = []
    for d in task_dirs:
        shard = int(d.name.split("=")[1])
        r = open_trace(d).rounds
        r["category"] = [categories[(shard, int(p))] for p in r["prompt_id"]]
        frames.append(r)
    rounds = pd.concat(frames)
    out = {}
    for cat, g in [("all", rounds), *rounds.groupby("category")]:
        nd = g["n_draft"].sum()
        out[cat] = {"acceptance_rate": g["n_accepted"].sum() / nd,
                    "mean_acceptance_length": 1 + g["n_accepted"].sum() / (g["n_draft"] > 0).sum(),
                    "tokens_per_s": sum(len(e) for e in g["emitted"]) / ((g["t_draft_ms"] + g["t_verify_ms"]).sum() / 1e3)}
    return out


def test_quant_sweep_report_and_page(swept, demo_dir, monkeypatch: pytest.MonkeyPatch) -> None:
    out, cache = swept
    state = json.loads((out / "sweep.json").read_text())
    digest = hashlib.sha256(demo_dir.drafter_upstream_noisy.read_bytes()).hexdigest()
    spec = state["spec"]
    assert [a["name"] for a in spec["assistants"]] == list(TYPES)
    assert [a["path"] for a in spec["assistants"]] == [str(cache / "quant" / digest / f"{t}.gguf") for t in TYPES]
    assert [(q["qtype"], q["source_sha256"]) for q in spec["assistant_quant"]] == [(t, digest) for t in TYPES]

    from typer.testing import CliRunner

    from mtpscope.cli.main import app

    r = CliRunner().invoke(app, ["report", str(out), "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["quantization"]
    assert [(x["category"], x["qtype"]) for x in rows] == [(c, t) for c in ("all", "prose", "code") for t in TYPES]
    categories = {(p["shard"], p["prompt_id"]): p["category"] for p in state["prompts"]}
    for t in TYPES:
        want = _independent(sorted((out / f"assistant={t}" / "n_draft=2").glob("shard=*")), categories)
        for x in (x for x in rows if x["qtype"] == t):
            for k in ("acceptance_rate", "mean_acceptance_length", "tokens_per_s"):
                assert x[k] == pytest.approx(want[x["category"]][k], rel=1e-12), (t, x["category"], k)
            assert x["n_bytes"] == (cache / "quant" / digest / f"{t}.gguf").stat().st_size
            assert x["source"] == demo_dir.drafter_upstream_noisy.name and x["speedup"] is None

    text = CliRunner().invoke(app, ["report", str(out)]).stdout
    section = text[text.index("drafter quantizations"):].splitlines()
    q4 = next(x for x in rows if x["qtype"] == "q4_k_m" and x["category"] == "code")
    assert any(ln.split()[:2] == ["q4_k_m", "2"] and f"{q4['acceptance_rate']:.4f}" in ln for ln in section[3:])

    from streamlit.testing.v1 import AppTest

    from mtpscope.app import selection

    monkeypatch.setenv("MTPSCOPE_ROOTS", str(out.parent))
    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app" / "main.py"), default_timeout=120)
    at.session_state[selection.SEL_SWEEP] = str(out)
    at.run()
    at.switch_page("screens/sweep.py").run()
    assert not at.exception, [e.value for e in at.exception]
    table = next(d.value for d in at.dataframe if "size MiB" in d.value.columns)
    assert list(table.index) == list(TYPES) and list(table.columns) == ["size MiB", "all", "prose", "code"]
    for x in rows:
        assert table.loc[x["qtype"], x["category"]] == f"{x['acceptance_rate']:.1%}"
    at.radio(key=selection.SWEEP_QUANT_VALUE).set_value("tokens/s").run()
    table = next(d.value for d in at.dataframe if "size MiB" in d.value.columns)
    assert table.loc["q4_k_m", "code"] == f"{q4['tokens_per_s']:.1f}"
