"""``mtpscope diagnose``'s parts without llama.cpp: the cause of every verify code, the published configurations,
merging and ranking, the n_draft decay, the replay variants' rule, the links, the HTML report, the CLI's argument
errors.

Expected values come from the inputs by hand (the published config.json files read as JSON, counts written out),
never from diagnose's own output."""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mtpscope.app.diagnose_report import document, figures, finding_lines, html_report, link_url
from mtpscope.app.links import view_url
from mtpscope.errors import MtpscopeError, TraceError
from mtpscope.inspector.config_model import model_from_config
from mtpscope.inspector.findings import CODES
from mtpscope.traces.diagnose import behaviour, files, published, rank, variants
from mtpscope.traces.diagnose.config import DiagnoseConfig
from mtpscope.traces.diagnose.records import (
    CAUSES,
    Diagnosis,
    DiagnosisSummary,
    Evidence,
    Finding,
    Fix,
    ReferenceSummary,
    StepRun,
    VariantsSummary,
    ViewRef,
)
from mtpscope.traces.diagnose.run import DIAGNOSIS_FILE, read_diagnosis

CONFIGS = Path(__file__).resolve().parent.parent / "sample_configs"


# ------------------------------------------------------------------------------------------ causes

def test_every_verify_code_lands_on_a_documented_cause() -> None:
    for code in CODES:
        assert files.cause_of(code) in CAUSES, code
    want = {"E_PAIR_ROPE": "rope", "E_ROPE_FREQS_VALUES": "rope", "E_PAIR_KV_DONOR": "pair_mismatch",
            "E_PAIR_HEAD_DIM": "pair_mismatch", "E_PAIR_KV_HEADS": "pair_mismatch", "E_SHARED_KV_LAYOUT": "pair_mismatch",
            "E_TENSOR_SHAPE": "file_layout", "E_DTYPE_VECTOR": "file_layout", "E_CLUSTER_SIZE": "file_layout",
            "E_KEY_VALUE": "metadata", "E_HEAD_DIM_KV": "metadata", "H_CONFIG_MISMATCH": "metadata"}
    assert {c: files.cause_of(c) for c in want} == want
    # codes added later land by family; a finding on a RoPE key is a RoPE finding whatever its code
    assert files.cause_of("E_PAIR_SOMETHING_NEW") == "pair_mismatch"
    assert files.cause_of("W_KEY_SOMETHING_NEW") == "metadata"
    assert files.cause_of("E_SOMETHING_NEW") == "file_layout"
    assert files.cause_of("H_CONFIG_MISMATCH", "gemma4-assistant.rope.freq_base_swa") == "rope"


def test_the_cause_list_is_documented() -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "DIAGNOSE.md").read_text()
    for name in CAUSES:
        assert f"| `{name}` |" in doc, name


# --------------------------------------------------------------------------------- published configs

def _published_swa_theta() -> set[float]:
    out = set()
    for d in CONFIGS.glob("*-assistant"):
        tc = json.loads((d / "config.json").read_text())["text_config"]
        out.add(float(tc["rope_parameters"]["sliding_attention"]["rope_theta"]))
    return out


def test_a_published_variant_has_no_finding_and_is_matched() -> None:
    m = model_from_config(CONFIGS / "gemma-4-E2B-it-assistant")
    found, s = published.published_findings(m, assistant="a.gguf")
    assert found == []
    assert s["variant"] == "gemma-4-E2B-it-assistant" and s["matched"] is True


def test_rope_base_unlike_every_published_drafter() -> None:
    m = model_from_config(CONFIGS / "gemma-4-E4B-it-assistant")
    kv = dict(m.kv)
    kv["gemma4-assistant.rope.freq_base_swa"] = 1e6
    found, _ = published.published_findings(replace(m, kv=kv), assistant="a.gguf")
    (f,) = found
    assert (f.cause, f.severity, f.subject) == ("rope", "error", "gemma4-assistant.rope.freq_base_swa")
    assert _published_swa_theta() == {10000.0}
    assert f.expected == 10000.0 and f.actual == 1e6
    assert f.fix.key == "gemma4-assistant.rope.freq_base_swa" and f.fix.value == 10000.0


def test_geometry_counts_only_for_a_published_geometry() -> None:
    m = model_from_config(CONFIGS / "gemma-4-E2B-it-assistant")
    kv = dict(m.kv)
    kv["gemma4-assistant.attention.sliding_window"] = 1024
    found, s = published.published_findings(replace(m, kv=kv), assistant="a.gguf")
    (f,) = found
    assert (f.cause, f.severity, f.expected, f.actual) == ("metadata", "warning", 512, 1024)
    # the same window on a custom geometry (other widths): listed, not a finding
    kv["gemma4-assistant.embedding_length"] = 64
    kv["gemma4-assistant.embedding_length_out"] = 128
    found, s = published.published_findings(replace(m, kv=kv), assistant="a.gguf")
    assert found == [] and s["matched"] is False and "attention.sliding_window" in s["custom"]


@pytest.mark.parametrize(("eps", "severity"), [(5e-7, "info"), (5e-6, "info"), (1e-2, "warning")])
def test_an_epsilon_is_a_note_near_the_published_one(eps: float, severity: str) -> None:
    m = model_from_config(CONFIGS / "gemma-4-E2B-it-assistant")
    kv = dict(m.kv)
    kv["gemma4-assistant.attention.layer_norm_rms_epsilon"] = eps
    (f,), _ = published.published_findings(replace(m, kv=kv), assistant="a.gguf")
    assert (f.cause, f.severity, f.expected) == ("metadata", severity, 1e-6)


def test_rotated_share_of_a_head() -> None:
    m = model_from_config(CONFIGS / "gemma-4-31B-it-assistant")
    kv = dict(m.kv)
    kv["gemma4-assistant.rope.dimension_count"] = 128          # a quarter of the 512-wide full head
    (f,), _ = published.published_findings(replace(m, kv=kv), assistant="a.gguf")
    assert (f.cause, f.subject, f.expected) == ("rope", "gemma4-assistant.rope.dimension_count", 512)


# ------------------------------------------------------------------------------------- merge and rank

def _f(cause: str, severity: str, subject: str, step: str, confidence: str = "medium") -> Finding:
    return Finding(cause, severity, confidence, f"{cause} {subject}", (Evidence(step, f"{step} says {subject}"),),
                   Fix("metadata", "set it", key=subject, value=1), ViewRef.of("validate", drafter="d.gguf"),
                   subject=subject)


def test_merge_joins_steps_and_rank_orders_severity_then_cause() -> None:
    fs = [_f("n_draft", "warning", "n_draft", "explain", "high"),
          _f("acceptance_limit", "info", "acceptance", "explain"),
          _f("convention", "error", "hidden=prenorm", "replay"),
          _f("rope", "error", "k", "verify"), _f("rope", "error", "k", "published")]
    out = rank.rank(fs)
    assert [f.cause for f in out] == ["rope", "convention", "n_draft", "acceptance_limit"]
    assert out[0].confidence == "high" and [e.step for e in out[0].evidence] == ["verify", "published"]


def test_diagnosis_exit_code_and_json() -> None:
    info = _f("acceptance_limit", "info", "acceptance", "explain")
    d = Diagnosis("t.gguf", "a.gguf", None, (info,), limits=("x",), steps=(StepRun("verify", "ran", 0.1),))
    assert d.exit_code == 0 and d.headline == "x"
    doc = d.to_dict()
    assert doc["findings"][0]["rank"] == 1 and doc["findings"][0]["link"] == {"page": "validate",
                                                                             "params": {"drafter": "d.gguf"}}
    d2 = replace(d, findings=(_f("rope", "error", "k", "verify"), info))
    assert d2.exit_code == 1 and d2.to_dict()["defect"] is True
    json.dumps(d2.to_dict())


# ------------------------------------------------------------------------------------------- n_draft

def test_depth_gain_by_hand() -> None:
    # prompt 0: rounds of 3 drafts accepting 3, 1, 0; prompt 1: 3 accepting 3, and a capped round of 1 draft
    r = pd.DataFrame({"prompt_id": [0, 0, 0, 1, 1], "n_draft": [3, 3, 3, 3, 1], "n_accepted": [3, 1, 0, 3, 1]})
    assert behaviour.depth_gain(r, 3, n_boot=0) == (2 / 4, None)
    assert behaviour.depth_gain(r, 1, n_boot=0) == (4 / 5, None)
    g, iv = behaviour.depth_gain(r, 2, n_boot=500)
    assert g == 2 / 4 and iv[0] <= g <= iv[1]
    assert behaviour.depth_gain(r, 4) is None


# -------------------------------------------------------------------------------- replay variants' rule

def _replay(rise_per_prompt: list[int], n_prompts: int = 6):
    """A replay of ``n_prompts`` prompts x 2 rounds of 3 drafts: the baseline accepts 1 per round, the variant
    ``v`` 1 + rise_per_prompt[p] per round."""
    from mtpscope.inspector.reference import StepOptions
    from mtpscope.traces.run.replay import ReplayResult

    rows, steps = [], []
    for p in range(n_prompts):
        for r in range(2):
            rows.append({"prompt_id": p, "round": r, "pos": 10 * r, "n_draft": 3, "n_accepted": 1,
                         "n_accepted[baseline]": 1, "n_accepted[v]": 1 + rise_per_prompt[p]})
            for k in range(1, 4):
                steps.append({"prompt_id": p, "round": r, "k": k, "pos": 10 * r, "recorded": k, "truth": k,
                              "draft[baseline]": k, "accepted[baseline]": k <= 1, "draft[v]": k,
                              "accepted[v]": k <= 1 + rise_per_prompt[p]})
    return ReplayResult("t", {"baseline": StepOptions(), "v": StepOptions(position="p-1")}, pd.DataFrame(steps),
                        pd.DataFrame(rows), StepOptions(), variant_traces={"v": "/x/traces/v"})


def test_a_variant_that_recovers_clearly_is_a_convention_finding() -> None:
    found, nums = variants.variant_findings(_replay([1, 1, 2, 1, 2, 1]), trace="/x/t")
    (f,) = found
    # baseline 12 / 36 accepted, variant (12 + 2 * (1+1+2+1+2+1)) / 36 = 28 / 36
    assert f.cause == "convention" and f.subject == "v" and f.severity == "error"
    assert f.actual == pytest.approx(12 / 36) and f.expected == pytest.approx(28 / 36)
    assert nums["variants"]["v"]["recovers"] is True and nums["baseline_agreement"] == 1.0
    assert f.link == ViewRef.of("compare", trace="/x/t", trace_b="/x/traces/v")


def test_a_variant_within_noise_is_no_finding() -> None:
    found, nums = variants.variant_findings(_replay([0, 0, 0, 0, 0, 1]), trace="/x/t")
    assert found == [] and nums["variants"]["v"]["recovers"] is False


def test_sample_takes_each_category_in_turn_shortest_first() -> None:
    man = {"prompts": [{"prompt_id": i, "category": c, "n_prompt_tokens": n}
                       for i, (c, n) in enumerate([("a", 50), ("a", 10), ("b", 30), ("b", 40), ("c", 5), ("a", 20)])]}
    assert variants.sample_prompts(man, range(6), 4) == [1, 2, 4, 5]


def test_convention_variants_follow_the_reference_options() -> None:
    from mtpscope.traces.run.replay import BASELINE_CPU

    assert variants.convention_variants(BASELINE_CPU, centroids=False) == ["hidden=prenorm", "position=p-1",
                                                                             "gelu=tanh"]
    assert "head=centroid" in variants.convention_variants(BASELINE_CPU, centroids=True)


# ---------------------------------------------------------------------------------- links and report

def test_view_url_and_link_url() -> None:
    assert view_url("step", trace="/data/t f32", prompt=34, round=20) == "/step?trace=%2Fdata%2Ft+f32&prompt=34&round=20"
    assert link_url(ViewRef.of("explain", trace="/t", prompt="all"), "http://h:1/") == \
        "http://h:1/explain?trace=%2Ft&prompt=all"
    assert link_url(None) is None


def _diagnosis() -> Diagnosis:
    per_pos = [{"k": 1, "n_rounds": 10, "n_accepted": 5, "acceptance": 0.5, "conditional": 0.5, "per_verify_round": 0.5},
               {"k": 2, "n_rounds": 9, "n_accepted": 3, "acceptance": 3 / 9, "conditional": 0.6,
                "per_verify_round": 0.3}]
    summary = {"acceptance_rate": 8 / 19, "mean_acceptance_length": 1.8, "n_draft": 2, "per_position": per_pos,
               "by_category": {"code": {"n_prompts": 2, "n_drafted": 10, "n_accepted": 4, "acceptance_rate": 0.4}},
               "causes": {"near_tie": 3, "far_miss": 2},
               "what_if": [{"n_draft": n, "acceptance_rate": 0.5 / n, "mean_acceptance_length": 1.5, "tokens_per_s": 10.0,
                            "speedup": 1.0, "recorded": n == 2, "extrapolated": n > 2} for n in (1, 2, 3)]}
    var = {"variants": {"baseline": {"acceptance_rate": 0.1}, "hidden=prenorm": {
        "acceptance_rate": 0.4, "delta": 0.3, "ci_low": 0.2, "ci_high": 0.4, "recovers": True}}}
    return Diagnosis("t.gguf", "a.gguf", "/tr", (_f("convention", "error", "hidden=prenorm", "replay"),),
                     limits=("hard <tokens>",), summary=DiagnosisSummary.from_dict(summary),
                     variants=VariantsSummary.from_dict(var))


def test_figures_of_a_diagnosis() -> None:
    names = [n for n, _ in figures(_diagnosis())]
    assert names == ["per_position", "by_category", "causes", "variants", "what_if"]
    fig = dict(figures(_diagnosis()))["variants"]
    assert fig.layout.meta == {"recovers": ["hidden=prenorm"]}


def test_html_report_is_one_file_that_fetches_nothing() -> None:
    page = html_report(_diagnosis(), base="http://127.0.0.1:8501")
    assert page.count("<!DOCTYPE html>") == 1
    assert not re.search(r"<script[^>]+src=", page) and not re.search(r"<link[^>]+href=", page)
    assert "@import" not in page and "url(http" not in page
    # outside the scripts (plotly.js, the figures' data) the only links are the findings' links into the app
    html_only = re.sub(r"<script.*?</script>", "", page, flags=re.S)
    assert re.findall(r'(?:href|src)="([^"]+)"', html_only) == ["http://127.0.0.1:8501/validate?drafter=d.gguf"]
    assert "hard &lt;tokens&gt;" in page                     # escaped
    assert page.count('class="figure"') == 5
    assert len(page.encode()) < 5_000_000
    doc = re.search(r'<script type="application/json" id="diagnosis">(.*?)</script>', page, re.S).group(1)
    assert json.loads(doc)["findings"][0]["cause"] == "convention"


def test_finding_lines_read_the_records() -> None:
    lines = finding_lines(_diagnosis().findings, base="http://h:1")
    assert lines == ["1. ERROR convention (confidence medium): convention hidden=prenorm",
                     "     [replay] replay says hidden=prenorm", "     fix: set it",
                     "     view: http://h:1/validate?drafter=d.gguf"]


# ------------------------------------------------------------------------ diagnosis.json read back

def _full() -> Diagnosis:
    """A diagnosis with every part filled: numpy numbers and a NaN in the numbers, a finding without fix or link,
    steps with unrounded times, notes, a reference and the published comparison."""
    bare = Finding("n_draft", "info", "high", "advice: n_draft 2", (Evidence("advice", "x", {"iv": (0.1, 0.2)}),),
                   subject="n_draft", expected=np.int64(2), actual=3)
    d = _diagnosis()
    return replace(d, findings=(*d.findings, bare), steps=(StepRun("verify", "ran", 0.12345),
                                                           StepRun("replay", "skipped", 0, "replay off")),
                   notes=("replay: skipped (replay off)",), published={"variant": "v", "matched": True},
                   reference=ReferenceSummary("gguf", "/r.gguf", {"agreement": np.float32(0.5), "ci_low": float("nan")}),
                   out="/o")


def _write(folder: Path, doc: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / DIAGNOSIS_FILE).write_text(json.dumps(doc, indent=1, default=str) + "\n", encoding="utf-8")
    return folder


def test_a_saved_diagnosis_reads_back_as_the_same_records(tmp_path: Path) -> None:
    d = _full()
    back = read_diagnosis(_write(tmp_path, d.to_dict()))
    assert isinstance(back, Diagnosis) and back.to_dict() == d.to_dict()
    assert Diagnosis.from_dict(d.to_dict()).to_dict() == d.to_dict()
    assert back.findings[0] == d.findings[0] and back.findings[0].link == ViewRef.of("validate", drafter="d.gguf")
    assert back.findings[1].fix is None and back.findings[1].link is None and back.findings[1].expected == 2
    assert back.steps == (StepRun("verify", "ran", 0.123), StepRun("replay", "skipped", 0.0, "replay off"))
    assert back.reference == ReferenceSummary("gguf", "/r.gguf", {"agreement": 0.5, "ci_low": None})
    assert back.reference.to_dict() == {"kind": "gguf", "path": "/r.gguf", "agreement": 0.5, "ci_low": None}
    assert back.summary == d.summary and back.variants == d.variants
    assert back.variants is not None and back.variants.variants["hidden=prenorm"].recovers is True
    assert "recovers" not in back.variants.variants["baseline"].to_dict()
    assert (back.exit_code, back.headline, back.explanation) == (1, "convention hidden=prenorm", None)
    # the --json document (each link with its URL) reads back too, the URL left out
    assert Diagnosis.from_dict(document(d, "http://h:1")).to_dict() == d.to_dict()


def _bad_docs() -> list[tuple[str, object, str | None]]:
    """(what, document, the key its error names: None for the document itself)."""
    def edit(change) -> dict:
        doc = _full().to_dict()
        change(doc)
        return doc

    return [
        ("not an object", [1, 2], None),
        ("another schema", edit(lambda d: d.update(schema=2)), "schema"),
        ("no steps (an older file)", edit(lambda d: d.pop("steps")), "steps"),
        ("an unknown severity", edit(lambda d: d["findings"][0].update(severity="fatal")), "findings[0].severity"),
        ("an unknown cause", edit(lambda d: d["findings"][1].update(cause="gremlins")), "findings[1].cause"),
        ("an evidence step of the wrong type", edit(lambda d: d["findings"][0]["evidence"][0].update(step=3)),
         "findings[0].evidence[0].step"),
        ("a link parameter that is a flag", edit(lambda d: d["findings"][0]["link"]["params"].update(prompt=True)),
         "findings[0].link.params.prompt"),
        ("no fix key", edit(lambda d: d["findings"][0].pop("fix")), "findings[0].fix"),
        ("an unknown fix kind", edit(lambda d: d["findings"][0]["fix"].update(kind="pray")), "findings[0].fix.kind"),
        ("ranks out of order", edit(lambda d: d["findings"][0].update(rank=2)), "findings[0].rank"),
        ("a step's time as text", edit(lambda d: d["steps"][0].update(seconds="0.1")), "steps[0].seconds"),
        ("a headline its findings do not say", edit(lambda d: d.update(headline="all good")), "headline"),
        ("an exit code its findings do not say", edit(lambda d: d.update(exit_code=0)), "exit_code"),
        ("a note that is no string", edit(lambda d: d["notes"].append(1)), "notes[1]"),
        ("a summary number as text", edit(lambda d: d["summary"].update(n_draft="2")), "summary.n_draft"),
        ("an unknown summary key", edit(lambda d: d["summary"].update(speed=1)), "summary.speed"),
        ("a summary key missing", edit(lambda d: d["summary"].pop("causes")), "summary.causes"),
        ("a per-position row without its k", edit(lambda d: d["summary"]["per_position"][0].pop("k")),
         "summary.per_position"),
        ("a variant's verdict as text",
         edit(lambda d: d["variants"]["variants"]["hidden=prenorm"].update(recovers="yes")),
         "variants.variants.hidden=prenorm.recovers"),
        ("an unknown replay key", edit(lambda d: d["variants"].update(speed=1)), "variants.speed"),
        ("a reference path that is a number", edit(lambda d: d["reference"].update(path=3)), "reference.path"),
    ]


@pytest.mark.parametrize(("what", "doc", "key"), _bad_docs(), ids=[w for w, _, _ in _bad_docs()])
def test_a_bad_or_old_diagnosis_file_is_one_error_naming_the_file_and_key(tmp_path: Path, what: str, doc: object,
                                                                         key: str | None) -> None:
    folder = _write(tmp_path, doc)
    with pytest.raises(MtpscopeError) as e:
        read_diagnosis(folder)
    assert e.value.path == str(folder / DIAGNOSIS_FILE) and e.value.key == key, what
    line = str(e.value)
    named = f"{folder / DIAGNOSIS_FILE}: " + ("" if key is None else f"{key!r}: ")
    assert "\n" not in line and line.startswith(named + "not a diagnosis document"), line


def test_a_missing_or_unreadable_diagnosis_file(tmp_path: Path) -> None:
    with pytest.raises(MtpscopeError, match="no diagnosis in this folder"):
        read_diagnosis(tmp_path)
    (tmp_path / DIAGNOSIS_FILE).write_text("{not json", encoding="utf-8")
    with pytest.raises(MtpscopeError, match="unreadable diagnosis") as e:
        read_diagnosis(tmp_path)
    assert e.value.path == str(tmp_path / DIAGNOSIS_FILE)


def test_a_real_diagnosis_reads_back_byte_identical(demo_dir, tmp_path: Path) -> None:
    """diagnose's own diagnosis.json (a demo trace, no replay) rebuilt into records writes the same bytes."""
    from mtpscope.traces.diagnose.run import diagnose

    src = Path(demo_dir.traces_noisy)
    if not (src / "manifest.json").exists():
        pytest.skip("demo traces need llama-cpp-python")
    d = diagnose(DiagnoseConfig(replay=False), trace=src, out=tmp_path)
    saved = (tmp_path / DIAGNOSIS_FILE).read_text(encoding="utf-8")
    back = read_diagnosis(tmp_path)
    assert json.dumps(back.to_dict(), indent=1, default=str) + "\n" == saved
    assert Diagnosis.from_dict(d.to_dict()).to_dict() == d.to_dict() == json.loads(saved)
    def typed(x: Diagnosis) -> list:
        return [(f.cause, f.severity, f.confidence, f.title, f.link, f.fix and f.fix.text,
                 [(e.step, e.text) for e in f.evidence]) for f in x.findings]

    assert typed(back) == typed(d) and back.steps == d.steps and back.summary == d.summary
    assert [n for n, _ in figures(back)] == [n for n, _ in figures(d)]


def test_a_drafter_that_did_not_record_the_trace_is_said_first(demo_dir, tmp_path: Path) -> None:
    """``diagnose --assistant OTHER --trace T --no-replay`` printed T's acceptance beside OTHER's findings with no
    word that T was recorded with another file. Now ``model_mismatch`` says so (header sha256 against the manifest's,
    computed here with hashlib), on the line under the trace's in the text, and reads back from diagnosis.json; the
    recorded file itself gives none; a diagnosis.json from before the key reads as none."""
    import hashlib

    from mtpscope.cli.diagnose import format_text
    from mtpscope.inspector.gguf import open_gguf
    from mtpscope.traces.diagnose.run import diagnose

    src = Path(demo_dir.traces_noisy)
    if not (src / "manifest.json").exists():
        pytest.skip("demo traces need llama-cpp-python")
    other = Path(demo_dir.drafter_upstream)
    with open_gguf(other) as f:
        head = f.data_offset
    want = hashlib.sha256(other.read_bytes()[:head]).hexdigest()
    recorded = json.loads((src / "manifest.json").read_text())["models"]["assistant"]["header_sha256"]
    assert want != recorded
    d = diagnose(DiagnoseConfig(replay=False), trace=src, assistant=other, out=tmp_path / "a")
    assert len(d.model_mismatch) == 1
    line = d.model_mismatch[0]
    assert line.startswith(f"the assistant {other} is not the file the trace was recorded with") and want[:12] in line
    assert format_text(d, base="http://x").splitlines()[3] == f"warning: {line}"
    assert read_diagnosis(tmp_path / "a").model_mismatch == d.model_mismatch
    same = diagnose(DiagnoseConfig(replay=False), trace=src, out=tmp_path / "b")
    assert same.model_mismatch == ()
    doc = same.to_dict()
    doc.pop("model_mismatch")
    assert Diagnosis.from_dict(doc).model_mismatch == ()


# ------------------------------------------------------------------------------------- DiagnoseConfig

def test_diagnose_config_defaults_are_the_cli_s() -> None:
    from mtpscope.traces.run.record_config import RecordConfig

    c = DiagnoseConfig()
    assert (c.n_draft, c.max_tokens, c.centroids, c.replay, c.replay_prompts, c.rounds_per_prompt) == \
        (3, 64, None, True, 8, 6)
    assert c.recording == RecordConfig(n_draft=3, max_tokens=64, baseline=True)
    c = DiagnoseConfig(n_draft=5, max_tokens=24, centroids=Path("/c.gguf"))
    assert c.recording == RecordConfig(n_draft=5, max_tokens=24, baseline=True, centroids="/c.gguf")
    assert c.centroids == "/c.gguf" and replace(c, n_draft=2).recording.n_draft == 2


@pytest.mark.parametrize(("kw", "key"), [({"n_draft": 0}, "n_draft"), ({"n_draft": "3"}, "n_draft"),
                                         ({"max_tokens": 0}, "max_tokens"), ({"replay_prompts": 0}, "replay_prompts"),
                                         ({"rounds_per_prompt": "4"}, "rounds_per_prompt"),
                                         ({"rounds_per_prompt": True}, "rounds_per_prompt"),
                                         ({"replay": "yes"}, "replay"), ({"centroids": 3}, "centroids")])
def test_diagnose_config_refuses_a_bad_field_naming_it(kw: dict, key: str) -> None:
    with pytest.raises(TraceError) as e:
        DiagnoseConfig(**kw)
    assert e.value.key == key


def test_cli_refuses_both_prompts_and_trace(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from mtpscope.cli.main import app

    r = CliRunner().invoke(app, ["diagnose", "--trace", str(tmp_path), "--prompts", str(tmp_path / "p.jsonl")])
    assert r.exit_code == 2
    r = CliRunner().invoke(app, ["diagnose", "--trace", str(tmp_path / "missing"), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "not a trace directory" in r.output


def test_no_numbers_sneak_into_json_as_numpy() -> None:
    d = replace(Diagnosis("t", "a", None, ()), summary=DiagnosisSummary(
        acceptance_rate=np.float64(1.5), n_prompts=np.int32(2), mean_acceptance_length=float("nan")))
    s = d.to_dict()["summary"]
    assert (s["acceptance_rate"], s["n_prompts"], s["mean_acceptance_length"]) == (1.5, 2, None)
    assert type(s["acceptance_rate"]) is float and type(s["n_prompts"]) is int
    assert list(s) == [f.name for f in fields(DiagnosisSummary)]
    assert Diagnosis("t", "a", None, ()).to_dict()["summary"] == {}      # no trace: the empty summary


def test_a_trace_with_a_missing_or_unreadable_part_is_refused_naming_it(demo_dir, tmp_path: Path) -> None:
    """A damaged trace is bad input (one line naming the part, exit 2), never a healthy diagnosis of the rows
    that are left; the trace is left as it was."""
    import shutil

    from typer.testing import CliRunner

    from mtpscope.cli.main import app

    src = Path(demo_dir.traces_noisy)
    if not (src / "manifest.json").exists():
        pytest.skip("demo traces need llama-cpp-python")
    parts = json.loads((src / "manifest.json").read_text())["parts"]
    for table, damage in (("rounds", "delete"), ("steps", "truncate")):
        tr = tmp_path / f"{table}-{damage}"
        shutil.copytree(src, tr)
        part = tr / table / parts[table][0]
        if damage == "delete":
            part.unlink()
        else:
            part.write_bytes(part.read_bytes()[:200])
        before = sorted((p.relative_to(tr), p.stat().st_size) for p in tr.rglob("*") if p.is_file())
        r = CliRunner().invoke(app, ["diagnose", "--trace", str(tr), "--no-replay", "-q",
                                     "--out", str(tmp_path / f"out-{table}")])   # not ./mtpscope-diagnose
        lines = [ln for ln in r.output.splitlines() if ln.strip() and not ln.startswith("[")]
        assert r.exit_code == 2, r.output
        assert len(lines) == 1 and str(part) in lines[0] and "cannot be read" in lines[0], r.output
        assert sorted((p.relative_to(tr), p.stat().st_size) for p in tr.rglob("*") if p.is_file()) == before


def test_a_reference_assistant_that_is_no_gguf_is_refused_before_any_step(demo_dir, tmp_path: Path) -> None:
    """``--reference-assistant`` naming a file that is no GGUF: one line naming it, exit 2, before verify runs (was:
    every step ran, the reference step 'failed' in a note and the diagnosis exited 0 with 'no defect')."""
    from typer.testing import CliRunner

    from mtpscope.cli.main import app

    src = Path(demo_dir.traces_noisy)
    if not (src / "manifest.json").exists():
        pytest.skip("demo traces need llama-cpp-python")
    bad = tmp_path / "ref.gguf"
    bad.write_text('{"text": "hi"}\n')
    r = CliRunner().invoke(app, ["diagnose", "--trace", str(src), "--reference-assistant", str(bad),
                                 "--out", str(tmp_path / "out")])
    lines = [ln for ln in r.output.splitlines() if ln.strip() and not ln.startswith("[out]")]
    assert r.exit_code == 2, r.output
    assert len(lines) == 1 and lines[0].startswith(f"mtpscope: {bad}: at offset 0: not a GGUF file"), r.output
    assert not (tmp_path / "out" / DIAGNOSIS_FILE).exists()


def test_a_reference_that_is_no_checkpoint_folder_is_refused_before_any_step(tmp_path: Path) -> None:
    """``--reference`` naming a folder that does not exist: its one line, exit 2, before verify runs (was: verify's
    progress line said 'failed' with the same words, then the error line)."""
    from typer.testing import CliRunner

    from mtpscope.cli.main import app
    from tests.builders import build

    target, drafter = build(tmp_path, "valid_target"), build(tmp_path, "valid_upstream")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('"hi"\n')
    missing = tmp_path / "no_such_checkpoint"
    r = CliRunner().invoke(app, ["diagnose", "--target", str(target), "--assistant", str(drafter), "--prompts",
                                 str(prompts), "--reference", str(missing), "--out", str(tmp_path / "out")])
    lines = [ln for ln in r.output.splitlines() if ln.strip() and not ln.startswith("[out]")]
    assert r.exit_code == 2, r.output
    assert lines == [f"mtpscope: {missing}: no such folder (expected a Hugging Face checkpoint folder, got missing)"]
    assert not (tmp_path / "out" / DIAGNOSIS_FILE).exists()


def test_the_cli_says_where_its_results_go(demo_dir, tmp_path: Path) -> None:
    """The output folder is said before anything is written (the default one is in the current directory)."""
    from typer.testing import CliRunner

    from mtpscope.cli.main import app

    src = Path(demo_dir.traces_noisy)
    if not (src / "manifest.json").exists():
        pytest.skip("demo traces need llama-cpp-python")
    out = tmp_path / "o"
    r = CliRunner().invoke(app, ["diagnose", "--trace", str(src), "--no-replay", "--out", str(out)])
    assert r.exit_code in (0, 1), r.output
    assert f"[out] diagnosis.json goes to {out}\n" in r.output and "--out chooses another" not in r.output
    assert (out / "diagnosis.json").is_file() and "replaces" not in r.output
    # run again: it says that it replaces the diagnosis already there, and when that one was written
    os.utime(out / "diagnosis.json", (0, 86400 * 365))
    made = time.strftime("%Y-%m-%d %H:%M", time.localtime(86400 * 365))
    r = CliRunner().invoke(app, ["diagnose", "--trace", str(src), "--no-replay", "--out", str(out)])
    assert r.exit_code in (0, 1), r.output
    assert f"[out] replaces the diagnosis already there (written {made})\n" in r.output


def test_past_the_decay_needs_as_many_rounds_as_the_advice() -> None:
    """A default diagnose of 3 short prompts (10 rounds of 3 drafts, none with all 3 accepted) found 'n_draft 3 is
    past the decay' with high confidence (its interval over 3 prompts [0, 0]) and exited 1, while its own advice said
    "too few rounds to tell": below advice.MIN_FIRST_DRAFTS (30) rounds drafting n_draft there is no such warning,
    only the advice's note; with 40 such rounds the warning stands."""
    from types import SimpleNamespace

    from mtpscope.traces.analysis.advice import MIN_FIRST_DRAFTS

    rec = SimpleNamespace(choice=None, headline="too few rounds to tell", reason="", speedup=None, interval=None,
                          tie=False)
    x = SimpleNamespace(what_if=SimpleNamespace(rows=[]),
                        advice=SimpleNamespace(recommendation=rec, break_even=None, by_category=None))

    def rounds(n: int) -> pd.DataFrame:
        return pd.DataFrame({"prompt_id": [i % 3 for i in range(n)], "n_draft": [3] * n,
                             "n_accepted": [i % 3 for i in range(n)]})       # 0, 1 or 2 accepted: never all 3

    assert MIN_FIRST_DRAFTS == 30
    (few,) = behaviour.n_draft_findings(x, rounds(10), trace="/x/t", n_draft=3)
    assert few.severity == "info" and "too few rounds to tell" in few.title
    (many,) = behaviour.n_draft_findings(x, rounds(40), trace="/x/t", n_draft=3)
    assert many.severity == "warning" and many.title.startswith("n_draft 3 is past the decay")


def test_limit_sentences_name_only_the_classes_below_the_overall_rate(demo_dir) -> None:
    """The 'what limits acceptance' lines name at most two token classes, and only those whose acceptance is below
    the trace's overall rate (a fresh user saw json at 0.88 listed as one of 'the hardest' beside code at 0.26); the
    rates are recomputed here from the trace's own steps."""
    import re

    from mtpscope.demo.spec import TrainedPaths
    from mtpscope.traces.analysis.explain_report import explain_trace
    from mtpscope.traces.analysis.metrics import report
    from mtpscope.traces.analysis.vocab import trace_vocab
    from mtpscope.traces.diagnose.behaviour import limit_sentences
    from mtpscope.traces.store.reader import open_trace

    tr = open_trace(TrainedPaths.under(Path(demo_dir.root)).traces_f32)
    rep = report(tr)
    x = explain_trace(tr, vocab=trace_vocab(tr.manifest))
    lines = [ln for ln in limit_sentences(x, rep) if "token classes" in ln]
    assert len(lines) == 1, limit_sentences(x, rep)
    assert lines[0].startswith(f"token classes below the overall acceptance {rep.acceptance_rate:.2f}: ")
    named = re.findall(r"(\w+) (\d\.\d\d) of (\d+) drafts", lines[0])
    assert 1 <= len(named) <= 2
    rates = {k: v.acceptance_rate for k, v in x.by_class.items() if v.acceptance_rate is not None}
    assert any(r >= rep.acceptance_rate for r in rates.values())     # an easy class exists, and is not named
    for cls, rate, n in named:
        assert float(rate) < rep.acceptance_rate and abs(rates[cls] - float(rate)) < 0.005
        assert int(n) == x.by_class[cls].n_drafted


def test_limit_sentences_say_what_the_numbers_show(demo_dir) -> None:
    """A fresh user saw "no defect: acceptance falls with the draft position: k=1 1.00, k=2 1.00, k=3 1.00" on the
    demo's clean trace, whose every draft is accepted: such a trace gets one sentence saying so (the counts summed
    here from its rounds), and on a trace with misses the position sentence's verb agrees with the first and last
    values it prints."""
    import re

    from mtpscope.demo.spec import TrainedPaths
    from mtpscope.traces.analysis.explain_report import explain_trace
    from mtpscope.traces.analysis.metrics import report
    from mtpscope.traces.analysis.vocab import trace_vocab
    from mtpscope.traces.diagnose.behaviour import limit_sentences
    from mtpscope.traces.store.reader import open_trace

    if not Path(demo_dir.traces_clean).is_dir():
        pytest.skip("the demo's clean trace needs llama-cpp-python")
    tr = open_trace(demo_dir.traces_clean)
    r = tr.columns("rounds", ["n_draft", "n_accepted"])
    nd, na = int(r["n_draft"].sum()), int(r["n_accepted"].sum())
    assert nd > 0 and na == nd                         # the clean pair: every draft accepted
    assert limit_sentences(explain_trace(tr, vocab=trace_vocab(tr.manifest)), report(tr)) == [
        f"every draft was accepted ({na} of {nd}): nothing limited acceptance in this trace"]

    tr = open_trace(TrainedPaths.under(Path(demo_dir.root)).traces_f32)
    (line,) = [s for s in limit_sentences(explain_trace(tr, vocab=trace_vocab(tr.manifest)), report(tr))
               if "with the draft position" in s]
    verb = re.match(r"acceptance (falls|rises|holds level) with the draft position: ", line)
    vals = [float(v) for v in re.findall(r"k=\d+ (\d\.\d\d)", line)]
    assert verb and len(vals) >= 2
    assert verb.group(1) == ("falls" if vals[-1] < vals[0] else "rises" if vals[-1] > vals[0] else "holds level")
