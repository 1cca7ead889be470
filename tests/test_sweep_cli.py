"""``mtpscope sweep`` refusals (one line, exit 2, before Ray starts) and the sweep reader without Ray:
Ray is an optional extra, everything but running a sweep works without it. No Ray is started here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

NO_RAY = "import sys; sys.modules['ray'] = None; "   # `import ray` now raises ImportError


def _cli(*args: str, no_ray: bool = False) -> subprocess.CompletedProcess:
    code = (NO_RAY if no_ray else "") + "import sys; from mtpscope.cli.main import main; sys.argv = ['mtpscope', *sys.argv[1:]]; main()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("p") / "prompts.jsonl"
    p.write_text('{"prompt": "a b c", "category": "x"}\n{"prompt": "d e f", "category": "y"}\n')
    return p


def _one_line(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    return lines[0]


@pytest.mark.slow
def test_sweep_refusals_are_one_line(demo_dir, prompts: Path, tmp_path: Path) -> None:
    base = ["sweep", "--target", str(demo_dir.target), "--prompts", str(prompts), "--out", str(tmp_path / "o")]
    assert "--target, --assistant and --prompts" in _one_line(_cli("sweep", "--out", str(tmp_path / "o")))
    line = _one_line(_cli(*base, "--assistant", str(demo_dir.drafter_upstream), "--n-draft", "1,x"))
    assert "--n-draft" in line and "1,x" in line
    line = _one_line(_cli(*base, "--assistant", str(demo_dir.drafter_upstream), "--shards", "3"))
    assert "--shards" in line and "expected 1..2, got 3" in line
    line = _one_line(_cli(*base, "--assistant", f"baseline={demo_dir.drafter_upstream}"))
    assert "reserved" in line
    # a pair llama.cpp cannot run is refused by the pre-flight, before Ray is imported
    line = _one_line(_cli(*base, "--assistant", str(demo_dir.drafter_fork), no_ray=True))
    assert "gemma4_assistant" in line and str(demo_dir.drafter_fork) in line
    line = _one_line(_cli("sweep", "--resume", "--out", str(tmp_path / "none")))
    assert "sweep.json" in line
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_without_ray_sweep_says_so_and_reading_works(demo_dir, prompts: Path, tmp_path: Path) -> None:
    line = _one_line(_cli("sweep", "--target", str(demo_dir.target), "--assistant", str(demo_dir.drafter_upstream),
                          "--prompts", str(prompts), "--out", str(tmp_path / "o"), no_ray=True))
    assert "Ray is not installed" in line and "mtpscope[sweep]" in line
    from mtpscope.traces.synthetic import write_synthetic_sweep

    d = write_synthetic_sweep(tmp_path / "syn", n_rounds=400, assistants=("a",), n_drafts=(2,), n_shards=1,
                              n_prompts=2, categories=("x",))
    code = (NO_RAY + "import json; from mtpscope.traces import open_sweep; "
            f"rep = open_sweep({str(d)!r}).report(); print(json.dumps(dict(rep.best)))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"all": 2, "x": 2}
    r = _cli("report", str(d), no_ray=True)
    assert r.returncode == 0 and "Recommendation:" in r.stdout and "Break-even:" in r.stdout, r.stderr


def test_resume_of_a_finished_sweep_needs_nothing(tmp_path: Path) -> None:
    """Nothing to run: no Ray, no models (the synthetic sweep's model paths do not exist)."""
    from mtpscope.traces.synthetic import write_synthetic_sweep

    d = write_synthetic_sweep(tmp_path / "syn", n_rounds=300, assistants=("a",), n_drafts=(2,), n_shards=1,
                              n_prompts=2, categories=("x",))
    r = _cli("sweep", "--resume", "--out", str(d), no_ray=True)
    assert r.returncode == 0, r.stderr
    assert "nothing to run" in r.stdout
    assert json.loads((d / "sweep.json").read_text())["resumed"][0]["command"][:2] == ["mtpscope", "sweep"]
