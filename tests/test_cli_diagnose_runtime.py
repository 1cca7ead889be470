"""`mtpscope diagnose --runtime` refusals through the real typer app: one line, exit 2, before anything records or
loads a runtime (these run without mlx; the MLX diagnosis itself: tests/test_mlx_runtime.py)."""

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


def _one_line(res, text: str) -> None:
    assert res.exit_code == 2, res.output
    assert text in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1, res.output


def test_unknown_runtime(tmp_path: Path) -> None:
    res = runner.invoke(app, ["diagnose", "--runtime", "vllm", "--out", str(tmp_path / "o")])
    _one_line(res, "--runtime must be llama or mlx or hf (got 'vllm')")


def test_another_runtime_wants_checkpoint_folders_and_a_llama_trace(tmp_path: Path) -> None:
    t, a = _hf(tmp_path / "t"), _hf(tmp_path / "a")
    gguf = tmp_path / "t.gguf"
    gguf.write_bytes(b"GGUF")
    out = tmp_path / "o"
    res = runner.invoke(app, ["diagnose", "--runtime", "mlx", "--target", str(gguf), "--assistant", str(a),
                              "--out", str(out)])
    _one_line(res, f"--target: not a Hugging Face checkpoint folder (no config.json): {gguf}")
    res = runner.invoke(app, ["diagnose", "--runtime", "mlx", "--target", str(t), "--assistant", str(a),
                              "--out", str(out)])
    _one_line(res, "--runtime mlx needs --target and --assistant (HF checkpoint folders) and --against")
    res = runner.invoke(app, ["diagnose", "--runtime", "mlx", "--target", str(t), "--assistant", str(a),
                              "--against", str(tmp_path), "--trace", str(tmp_path), "--out", str(out)])
    _one_line(res, "--runtime mlx records the pair itself")
    assert not out.exists()


def test_against_goes_with_another_runtime(tmp_path: Path) -> None:
    res = runner.invoke(app, ["diagnose", "--against", str(tmp_path), "--out", str(tmp_path / "o")])
    _one_line(res, "--against goes with --runtime mlx or hf")


def test_against_must_be_a_llama_trace(tmp_path: Path) -> None:
    t, a = _hf(tmp_path / "t"), _hf(tmp_path / "a")
    tr = tmp_path / "tr"
    tr.mkdir()
    from mtpscope.traces.store.schema import SCHEMA_VERSION

    (tr / "manifest.json").write_text(json.dumps({"schema_version": SCHEMA_VERSION, "source": "record",
                                                  "runtime": {"name": "mlx"}, "params": {}, "prompts": [], "complete": True,
                                                  "counts": {}}))
    res = runner.invoke(app, ["diagnose", "--runtime", "mlx", "--target", str(t), "--assistant", str(a),
                              "--against", str(tr), "--out", str(tmp_path / "o"), "-q"])
    _one_line(res, "not a llama.cpp recording")


def test_the_runtime_run_must_line_up_with_the_llama_trace() -> None:
    import pytest

    from mtpscope.errors import MtpscopeError
    from mtpscope.traces.diagnose.runtimes import check_same_run
    from mtpscope.traces.run.prompts import PromptSpec

    man = {"params": {"n_draft": 3, "max_tokens": 64}}
    ours = [PromptSpec(tokens=(2, 5, 7)), PromptSpec(tokens=(2, 9)), PromptSpec(tokens=(2, 4))]
    check_same_run(man, ours[:2], ours, n_draft=3, max_tokens=64, against="L")      # its first prompts: fine
    with pytest.raises(MtpscopeError) as e:
        check_same_run(man, ours, ours, n_draft=3, max_tokens=32, against="L")
    assert (e.value.key, e.value.expected, e.value.actual) == ("params.max_tokens", 64, 32)
    with pytest.raises(MtpscopeError) as e:
        check_same_run(man, ours, ours, n_draft=4, max_tokens=64, against="L")
    assert e.value.key == "params.n_draft"
    with pytest.raises(MtpscopeError) as e:       # the second prompt first: compare would pair it with prompt 0
        check_same_run(man, [ours[1]], ours, n_draft=3, max_tokens=64, against="L")
    assert e.value.key == "prompts[0].tokens"
    with pytest.raises(MtpscopeError) as e:
        check_same_run(man, [*ours, ours[0]], ours, n_draft=3, max_tokens=64, against="L")
    assert e.value.key == "prompts"
