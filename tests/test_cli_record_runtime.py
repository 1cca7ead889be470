"""`mtpscope record --runtime` refusals through the real typer app: one line, exit 2, before any runtime loads
(these run without mlx or torch; the runtimes themselves: tests/test_mlx_runtime.py, tests/test_hf_runtime.py)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from mtpscope.cli.main import app

runner = CliRunner()


def _hf(d: Path) -> Path:
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "gemma4_text"}))
    return d


def test_unknown_runtime_is_one_line(tmp_path: Path) -> None:
    t, a = _hf(tmp_path / "t"), _hf(tmp_path / "a")
    res = runner.invoke(app, ["record", "--runtime", "vllm", "--target", str(t), "--assistant", str(a),
                              "--prompt", "x", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2
    assert "--runtime must be llama, mlx or hf (got 'vllm')" in res.output and "Traceback" not in res.output


def test_mlx_runtime_wants_checkpoint_folders(tmp_path: Path) -> None:
    a = _hf(tmp_path / "a")
    gguf = tmp_path / "t.gguf"
    gguf.write_bytes(b"GGUF")
    res = runner.invoke(app, ["record", "--runtime", "mlx", "--target", str(gguf), "--assistant", str(a),
                              "--prompt", "x", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2
    assert f"--target: not a Hugging Face checkpoint folder (no config.json): {gguf}" in res.output


def test_mlx_runtime_wants_token_prompts_and_greedy(tmp_path: Path) -> None:
    t, a = _hf(tmp_path / "t"), _hf(tmp_path / "a")
    base = ["record", "--runtime", "mlx", "--target", str(t), "--assistant", str(a), "--out", str(tmp_path / "o")]
    res = runner.invoke(app, [*base, "--prompt", "hello"])
    assert res.exit_code == 2 and "takes token prompts" in res.output
    assert len(res.output.strip().splitlines()) == 1
    res = runner.invoke(app, [*base, "--prompt", "hello", "--temp", "0.7"])
    assert res.exit_code == 2 and "greedy decoding only" in res.output
    assert not (tmp_path / "o").exists()


def test_hf_runtime_refusals_are_one_line(tmp_path: Path) -> None:
    """``--runtime hf``: a missing folder, a GGUF file instead of a folder, a text prompt (no token ids), a
    prompts file line without ``tokens``: one line each, exit 2, nothing written (checked before any model loads)."""
    t, a = _hf(tmp_path / "t"), _hf(tmp_path / "a")
    out = tmp_path / "o"
    base = ["record", "--runtime", "hf", "--assistant", str(a), "--out", str(out)]
    res = runner.invoke(app, [*base, "--target", str(tmp_path / "missing"), "--prompt", "x"])
    assert res.exit_code == 2
    assert res.output.strip() == f"mtpscope: --target: not a Hugging Face checkpoint folder (no config.json): " \
                                 f"{tmp_path / 'missing'}"
    res = runner.invoke(app, [*base, "--target", str(t), "--prompt", "hello"])
    assert res.exit_code == 2 and "the HF runtime takes token prompts" in res.output
    assert len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output
    pf = tmp_path / "p.jsonl"
    pf.write_text(json.dumps({"tokens": [2, 10, 11]}) + "\n" + json.dumps({"prompt": "no ids"}) + "\n")
    res = runner.invoke(app, [*base, "--target", str(t), "--prompts", str(pf)])
    assert res.exit_code == 2 and "takes token prompts" in res.output and "p.jsonl" in res.output
    assert len(res.output.strip().splitlines()) == 1
    assert not out.exists()


def test_progress_bar_ends_at_the_tokens_generated() -> None:
    """The bar's total is the budget (max_tokens x prompts) while it runs; at the end it reads the tokens generated,
    the number the summary line prints, so a prompt that stopped at EOG does not leave "10/10" beside "generated 4"."""
    from types import SimpleNamespace

    from mtpscope.cli.record import _ProgressBar

    bar = _ProgressBar(10, None)
    try:
        bar.on_round(0, SimpleNamespace(emitted=[5, 6, 7], drafted=[5, 6, 9], n_accepted=2))
        task = bar.bar.tasks[0]
        assert (task.total, task.completed) == (10, 4)        # the prefill's token and the 3 emitted
        bar.finish(4)
        task = bar.bar.tasks[0]
        assert (task.total, task.completed) == (4, 4)
    finally:
        bar.stop()
