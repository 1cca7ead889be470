"""The server's warm-up (mtpscope.app.warmup): it fills the caches for the view a fresh session opens, so that the
first visit after a server start finds its values computed (issue 36: first load <= 2 s, the first visit included).

- ``selection.default_selection()`` is what a fresh session selects (the start page's run in AppTest), and with a
  link's trace it is what ``init_selection`` keeps and adds;
- after the warm-up's steps, the start page and the Files page render without computing anything again: the
  computations behind their loaders (the explanation's what-if, the report, verify, every GGUF read) are made to
  fail, and neither page shows a failure;
- the loaders read a GGUF like the first one they kept (its token list compared, not walked), and on its own once
  that one is closed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mtpscope.app import selection
from mtpscope.cli.serve import main_script

pytestmark = [pytest.mark.slow]

MAIN = str(main_script())


def _trained(demo_dir):
    from mtpscope.demo.spec import TrainedPaths

    tp = TrainedPaths.under(demo_dir.root)
    if not all((d / "manifest.json").exists() for d in (tp.traces_f32, tp.traces_buggy)):
        pytest.skip("the trained demo traces were not recorded")
    return tp


def _slots(at) -> dict[str, str | None]:
    return {k: at.session_state[selection.slot_key(k)] for k in selection.SLOTS}


def test_default_selection_is_what_a_fresh_session_selects(demo_dir) -> None:
    from streamlit.testing.v1 import AppTest

    tp = _trained(demo_dir)
    at = AppTest.from_file(MAIN, default_timeout=120)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    fresh = selection.default_selection()
    assert _slots(at) == fresh
    assert Path(fresh[selection.TRACE]).resolve() == tp.traces_f32.resolve()      # demo.json's default view
    assert Path(fresh[selection.TRACE_B]).resolve() == tp.traces_buggy.resolve()
    # a link's trace A (the buggy one): kept, its recorded models added, trace B never the same trace
    at = AppTest.from_file(MAIN, default_timeout=120)
    at.session_state[selection.slot_key(selection.TRACE)] = str(tp.traces_buggy)
    at.run()
    linked = selection.default_selection({selection.TRACE: str(tp.traces_buggy)})
    assert _slots(at) == linked
    assert linked[selection.TRACE] == str(tp.traces_buggy)
    assert not linked[selection.TRACE_B] or not selection.same_path(linked[selection.TRACE_B], tp.traces_buggy)


def test_after_the_warm_up_the_first_pages_compute_nothing(demo_dir, monkeypatch) -> None:
    from streamlit.testing.v1 import AppTest

    from mtpscope.app import warmup

    _trained(demo_dir)
    steps = warmup.steps()
    names = [what.split(" ")[0] for what, _ in steps]
    assert names.index("explanation") < names.index("role")   # the start page's advice before the Files page
    for _what, call in steps:
        call()

    def again(*a, **k):
        raise AssertionError("computed again after the warm-up")

    for target in ("mtpscope.traces.sweep.advice.explain_with_baseline", "mtpscope.traces.analysis.metrics.report",
                   "mtpscope.app.loaders.open_gguf", "mtpscope.app.loaders.verify",
                   "mtpscope.app.loaders.build_inventory"):
        monkeypatch.setattr(target, again)
    at = AppTest.from_file(MAIN, default_timeout=120)
    at.run()   # the start page
    shown = [e.value for e in at.error] + [e.value for e in at.exception]
    assert not any("computed again" in s for s in shown), shown
    assert [t.value for t in at.title] == ["Start"]
    assert any(m.value.startswith("Advice for trace A:") for m in at.markdown), [m.value for m in at.markdown]
    at.switch_page("screens/files.py").run()
    shown = [e.value for e in at.error] + [e.value for e in at.exception] + [w.value for w in at.warning]
    assert not any("computed again" in s for s in shown), shown
    assert [t.value for t in at.title] == ["Files"]
    assert any(m.label == "dialect" for m in at.metric), [m.label for m in at.metric]
    # the Tensors page's layer grid checks the drafter on its own (the Files page pairs it with the target); the
    # trace pages read the same report and explanation
    for script, title in (("tensors", "Tensors"), ("explain", "Explain"), ("acceptance", "Acceptance")):
        at.switch_page(f"screens/{script}.py").run()
        shown = [e.value for e in at.error] + [e.value for e in at.exception] + [w.value for w in at.warning]
        assert not any("computed again" in s for s in shown), (script, shown)
        assert [t.value for t in at.title] == [title]


def test_the_loaders_read_a_gguf_like_the_kept_one_and_without_it_once_it_is_closed(demo_dir, monkeypatch) -> None:
    """The loaders keep the first GGUF with a token list and read later files like it (their token list compared,
    not walked: ``open_gguf``'s ``like``, checked against gguf-py in tests/test_gguf_like.py); the header read is
    the file's own (the same tensors and tokens as the file read on its own). Once the kept file's map is closed,
    files are read on their own."""
    from mtpscope.app import loaders
    from mtpscope.inspector import gguf as G

    tp = _trained(demo_dir)
    ref = G.open_gguf(tp.drafter_buggy)
    n_tok, n_tensors = len(ref.get("tokenizer.ggml.tokens")), len(ref.tensors)
    assert n_tok > 1000 and n_tensors > 0
    monkeypatch.setattr(loaders, "_LIKE", [])
    kept = G.open_gguf(tp.target)
    assert loaders._keep_like(kept) and len(loaders._LIKE) == 1 and loaders._LIKE[0] is kept
    walks = []
    real_walk = G._Parser.walk_strings
    monkeypatch.setattr(G._Parser, "walk_strings", lambda self, *a: walks.append(a) or real_walk(self, *a))
    f = loaders._sharing(G.open_gguf, str(tp.drafter_buggy))
    assert not walks   # the token list compared with the kept file's, not walked
    assert f.tensors == ref.tensors and len(f.get("tokenizer.ggml.tokens")) == n_tok
    assert [f.get("tokenizer.ggml.tokens")[i] for i in (0, n_tok // 2, n_tok - 1)] == \
        [ref.get("tokenizer.ggml.tokens")[i] for i in (0, n_tok // 2, n_tok - 1)]
    kept.close()
    f = loaders._sharing(G.open_gguf, str(tp.drafter_buggy))
    assert walks and loaders._LIKE == []   # read on its own
    assert len(f.tensors) == n_tensors and len(f.get("tokenizer.ggml.tokens")) == n_tok


def test_the_warm_up_does_streamlits_first_run_work(monkeypatch) -> None:
    """What Streamlit does on a process's first page run (its first element's check of how it was started, an
    ``inspect.stack()`` of the page run's deep stack) is done by the warm-up, once: a page's first element finds it
    done."""
    from streamlit import delta_generator

    from mtpscope.app import warmup

    monkeypatch.setattr(delta_generator, "_use_warning_has_been_displayed", False)
    calls = []
    real = delta_generator.env_util.is_repl
    monkeypatch.setattr(delta_generator.env_util, "is_repl", lambda: calls.append(1) or real())
    assert warmup.prepare_streamlit() == []
    assert delta_generator._use_warning_has_been_displayed and calls == [1]
    delta_generator._maybe_print_use_warning()   # a page's first element: nothing left to check
    assert calls == [1]
