"""Compare: two traces aligned by prompt and output position (or two prompts of one trace), and replay
results."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from mtpscope.app import charts, formats, links, loaders, model_views, round_views, url_state, views
from mtpscope.app import selection as sel
from mtpscope.app.guard import guard
from mtpscope.errors import EmptyTraceError, TraceMismatchError
from mtpscope.traces.analysis import metrics, wording
from mtpscope.traces.analysis.align import pairing_caveat
from mtpscope.traces.analysis.runtime_diff import CAUSES

st.title("Compare")
view = url_state.requested("compare")
#: The two modes and their link values.
MODES = {"traces": "two traces", "prompts": "two prompts of one trace"}
if view is not None and view.mode is not None:
    st.session_state[sel.CMP_MODE] = MODES[view.mode]
mode = st.radio("compare", list(MODES.values()), horizontal=True, key=sel.CMP_MODE)
a_path = sel.get(sel.TRACE)


def _use_as_b(path: str) -> None:
    sel.set_(sel.TRACE_B, path)
    st.session_state[sel.CMP_MODE] = MODES["traces"]


def _aligned(a: str, b: str, names: tuple[str, str], labels_a: dict[int, str]) -> None:
    """The aligned diff of A and B (``mtpscope compare A B``)."""
    st.subheader("Aligned by prompt and output position")
    diff = loaders.comparison(a, b)
    pairing = diff.pairing
    st.caption(f"Prompts paired by {pairing.by}: {wording.plural(len(pairing.pairs), 'pair')}"
               + (f"; unpaired in A: {len(pairing.unpaired_a)}, in B: {len(pairing.unpaired_b)}"
                  if pairing.unpaired_a or pairing.unpaired_b else "") + ".")
    caveat = pairing_caveat(pairing)
    if caveat:
        st.warning(f"{caveat[:1].upper()}{caveat[1:]}; read the deltas below with that in mind.", icon=":material/warning:")
    if diff.not_comparable is not None:
        r = diff.delta.get("all")
        own = (f" Each run's own acceptance rate: {names[0]} {formats.percent(r.rate_a)}, "
               f"{names[1]} {formats.percent(r.rate_b)}." if r is not None and r.rate_a is not None
               and r.rate_b is not None else "")
        st.warning(f"Not comparable position by position: {diff.not_comparable}. No output position, acceptance "
                   f"delta or first differing round is compared.{own}")
    elif diff.outputs_identical is None:
        st.info("The runs' outputs are unknown (a trace without emitted tokens, such as an import): no output "
                "position is compared.")
    elif diff.outputs_identical:
        st.success("The two runs generated the same text for every paired prompt: each output position is "
                   "compared.")
    else:
        st.warning("The two runs' outputs differ: each prompt is compared up to the first differing token only "
                   "(later positions are different text).")
    c = st.columns(3)
    for i, (x, (one, other)) in enumerate(((diff.a_only, names), (diff.b_only, names[::-1]))):
        c[i].metric(f"accepted in {one}, rejected in {other}", f"{x.n:,}",
                    help=(f"{x.n_eog_confirmed} of them {other}'s end-of-generation drafts the target chose too: not "
                          "accepted as llama.cpp counts, not a miss of the drafter") if x.n_eog_confirmed else None)
    dall = diff.delta.get("all")
    c[2].metric(f"acceptance-rate delta ({names[1]} − {names[0]}) over the paired prompts",
                formats.points(None if dall is None else dall.delta),
                help=views.paired_delta_help(dall, names, n_pairs=len(pairing.pairs)))
    c1, c2 = st.columns(2)
    with c1:
        st.plotly_chart(charts.only_counts_figure(diff.a_only, diff.b_only, "by_class", names), key=sel.CMP_ONLY_CLASS,
                        width="stretch")
        st.caption("Output positions one run drafted right and the other did not, by the token's class.")
    with c2:
        st.plotly_chart(charts.only_counts_figure(diff.a_only, diff.b_only, "by_position", names), key=sel.CMP_ONLY_POSITION,
                        width="stretch")
        st.caption("The same positions by the draft position k of the run that rejected them.")
    st.plotly_chart(charts.delta_ci_figure(diff.delta, names), key=sel.CMP_DELTA, width="stretch")
    st.caption("How much the acceptance rate moved from A to B, overall and per prompt category, with a 95 % "
               "interval from resampling the prompts.")
    rows = [{"prompt": labels_a.get(int(p.prompt_id_a), str(p.prompt_id_a)), "prompt in B": p.prompt_id_b,
             "positions compared": p.n_compared,
             "same output": {True: "yes", False: "no", None: "unknown"}[p.identical_output],
             "outputs differ from": p.diverged_at, "first position judged differently": p.first_difference}
            for p in diff.prompts]
    if rows:
        st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch", key=sel.CMP_PROMPTS,
                     column_config={"prompt": st.column_config.TextColumn("prompt", width="large")})
        st.caption("Per prompt: how many output positions were compared and the first one where one run "
                   "accepted a draft and the other did not.")
    rt = diff.runtimes
    if rt is not None and (rt.differs or rt.n_rounds_differing):
        st.markdown(f"**Round by round** (conventions that differ: {', '.join(rt.differs) or 'none'}; drafts differ in "
                    f"{rt.n_rounds_differing:,} of {rt.n_rounds_compared:,} rounds at a common position)")
        rrows = [{"prompt": labels_a.get(int(d.prompt_id_a), str(d.prompt_id_a)), "first difference": d.what,
                  "round A / B": f"{d.round_a}/{d.round_b}" if d.round_a is not None else "", "position": d.pos,
                  "draft step": d.step, "drafts A": str(list(d.drafted_a)), "drafts B": str(list(d.drafted_b)),
                  "cause": CAUSES.get(d.cause or "", "no known convention") if d.what != "none" else "",
                  "confirmed": {True: "yes", False: "no", None: ""}[d.confirmed],
                  "replayed": "; ".join(f"{r.key} {r.value} ({r.held}): {r.token} = "
                                        + (f"{r.reproduces.upper()}'s" if r.reproduces else "neither's")
                                        for r in d.replayed) or (d.replay_note or "")} for d in rt.prompts]
        st.dataframe(pd.DataFrame(rrows), hide_index=True, width="stretch", key=sel.CMP_RUNTIMES)
        st.caption("Per prompt: the first round where both runs drafted from the same token at the same position "
                   "and drafted differently, and the runtime convention that explains it (docs/RUNTIMES.md). "
                   "“confirmed”: that draft step was replayed with the reference drafter under A's and under B's "
                   "value of the convention (another held fixed: the head, the draft position or the KV visibility), "
                   "and each reproduced its own run's draft; for an end of generation, the shorter output's last "
                   "token is not one the other runtime stops at.")


def _traces() -> None:
    """Two traces (or two prompts of one) side by side; returns early when a choice is missing."""
    if not a_path:
        st.info("Choose a trace on the Files page (and a second one under “Second trace”).")
        sel.demo_missing_hint()
        return
    tr_a = loaders.trace(a_path)
    labels_a = views.prompt_labels(sorted(int(p) for p in tr_a.rounds["prompt_id"].unique()),
                                   views.manifest_prompts(tr_a.manifest))
    pids = sorted(labels_a)
    if pids:
        url_state.take_prompt_round(view, round_views.prompt_round_spans(tr_a.rounds), sel.page_prompt(pids, False))
    if mode == MODES["traces"]:
        b_path = sel.get(sel.TRACE_B)
        url_state.publish(links.View("compare", trace=a_path, trace_b=b_path, mode="traces"))
        if not b_path:
            st.info("Choose a second trace on the Files page (“Second trace”).")
            return
        if sel.same_path(a_path, b_path):
            st.warning(f"Trace A and trace B are the same folder (`{sel.short(a_path)}`): choose another trace B "
                       "on the Files page (“Second trace”) to compare two runs.", icon=":material/warning:")
            return
        tr_b = loaders.trace(b_path)
        names = ("A", "B")
        st.caption(f"A = `{sel.short(a_path)}` · B = `{sel.short(b_path)}`")
        diff_rows = loaders.run_differences(a_path, b_path)
        if diff_rows:
            st.markdown("**What differs between the two runs** (parameters; the models' metadata and tensor "
                        "tables)")
            rows = model_views.explained_differences(diff_rows, {"A": loaders.recorded_validation(tr_a),
                                                                 "B": loaders.recorded_validation(tr_b)})
            for r in rows:
                if r.verify:
                    st.warning(f"Likely cause: `{r.row.name}` ({r.row.a} in A, {r.row.b} in B) — {r.verify}",
                               icon=":material/troubleshoot:")
            st.dataframe(pd.DataFrame([r.to_dict() for r in rows]), hide_index=True, width="stretch", row_height=views.WRAPPED_ROW_PX,
                         column_config={"what": st.column_config.TextColumn("what", width=110),
                                        "name": st.column_config.TextColumn("name", width=230),
                                        "A": st.column_config.TextColumn("A", width=150),
                                        "B": st.column_config.TextColumn("B", width=150),
                                        "verify": st.column_config.TextColumn(
                                            "verify says", width=280,
                                            help="the finding of `mtpscope verify DRAFTER --target TARGET` (on the "
                                                 "run's recorded models) that names this key or tensor: a "
                                                 "difference verify explains")})
            st.caption("Rows verify explains come first; the rest are differences verify has nothing against.")
        else:
            st.caption("Same recording parameters and the same model files.")
        ra, rb = tr_a.rounds, tr_b.rounds
        rep_a, rep_b = loaders.report(a_path), loaders.report(b_path)
        pa_, pb_ = views.per_position(rep_a), views.per_position(rep_b)
        rate_a, rate_b = views.acceptance_rate(rep_a), views.acceptance_rate(rep_b)
        len_a, len_b = views.mean_acceptance_length(rep_a), views.mean_acceptance_length(rep_b)
        prompts_a = views.manifest_prompts(tr_a.manifest)
        prompts_b = views.manifest_prompts(tr_b.manifest)
    else:
        if len(pids) < 2:
            st.info("This trace has a single prompt.")
            return
        if view is not None and view.prompt_b is not None:
            st.session_state[sel.CMP_PROMPT_B] = view.prompt_b
        elif st.session_state.get(sel.CMP_PROMPT_B) not in pids:
            st.session_state[sel.CMP_PROMPT_B] = pids[1]
        c1, c2 = st.columns(2)
        pa_id = int(sel.prompt_picker(c1, sel.CMP_PROMPT_A, pids, labels_a, label="prompt A"))
        pb_id = c2.selectbox("prompt B", pids, key=sel.CMP_PROMPT_B, format_func=labels_a.__getitem__)
        url_state.publish(links.View("compare", trace=a_path, mode="prompts", prompt=pa_id, prompt_b=pb_id))
        names = (f"prompt {pa_id}", f"prompt {pb_id}")
        if pa_id == pb_id:
            st.warning("Prompt A and prompt B are the same prompt.", icon=":material/warning:")
        ra = tr_a.rounds[tr_a.rounds["prompt_id"] == pa_id]
        rb = tr_a.rounds[tr_a.rounds["prompt_id"] == pb_id]
        pa_, pb_ = metrics.per_position_acceptance(ra), metrics.per_position_acceptance(rb)
        rate_a, rate_b = metrics.acceptance_rate(ra), metrics.acceptance_rate(rb)
        len_a, len_b = metrics.mean_acceptance_length(ra), metrics.mean_acceptance_length(rb)
        prompts_a = prompts_b = views.manifest_prompts(tr_a.manifest)

    c = st.columns(4)
    c[0].metric(f"acceptance rate · {names[0]}", formats.percent(rate_a))
    c[1].metric(f"acceptance rate · {names[1]}", formats.percent(rate_b), delta=formats.points(rate_b - rate_a))
    c[2].metric(f"mean acceptance length · {names[0]}", formats.number(len_a, 3))
    c[3].metric(f"mean acceptance length · {names[1]}", formats.number(len_b, 3),
                delta=views.signed_or_none(len_b - len_a, 3))

    st.plotly_chart(charts.per_position_figure(pa_, pb_, names=names), key=sel.CMP_PER_POSITION, width="stretch")
    st.caption("How often the k-th draft was accepted in each run.")
    oa, ob = views.ordered_rounds(ra), views.ordered_rounds(rb)
    w = metrics.DEFAULT_ROLLING_WINDOW
    st.plotly_chart(charts.rolling_figure(views.rolling_acceptance(oa, w), other=views.rolling_acceptance(ob, w),
                                          names=names, window=w), key=sel.CMP_ROLLING, width="stretch")
    st.caption(f"Each run's acceptance rate over its last {wording.plural(w, 'round')}, rounds in prompt order.")

    if mode == MODES["traces"] and b_path:  # b_path: set (the traces branch above returned without it)
        try:
            loaders.comparison(a_path, b_path)
        except (TraceMismatchError, EmptyTraceError) as e:  # traces that cannot be aligned (no common prompt, no rounds)
            st.info(f"No aligned comparison of these two traces: {e.one_line()}")
        else:
            _aligned(a_path, b_path, names, labels_a)
            st.subheader("Per-prompt deltas")
            diff = loaders.comparison(a_path, b_path)
            deltas = views.prompt_deltas(views.per_prompt_table(ra, prompts_a),
                                         views.per_prompt_table(rb, prompts_b), pairs=diff.pairing.pairs)
            deltas.insert(1, "prompt", [labels_a.get(int(p), str(p)) for p in deltas["prompt_id"]])
            st.plotly_chart(charts.prompt_delta_figure(deltas, names, labels=labels_a), key=sel.CMP_DELTAS,
                            width="stretch")
            st.caption("Each paired prompt's acceptance-rate change from A to B, biggest drop first.")
            st.dataframe(views.as_percent_columns(deltas.head(500).drop(columns=["prompt_id"]), views.DELTA_RATE_COLUMNS),
                         hide_index=True, width="stretch",
                         column_config={"prompt": st.column_config.TextColumn("prompt", width="large"),
                                        **{c: st.column_config.NumberColumn(c, format=f)
                                           for c, f in views.DELTA_RATE_COLUMNS.items()}})


with guard("trace store"):
    _traces()

st.subheader("Replay results")
rpath = sel.get(sel.REPLAY)
if not rpath:
    st.caption("Choose a replay output folder (`mtpscope replay TRACE --out DIR`) on the Files page to see "
               "how each variant would have drafted the same rounds.")
else:
    with guard("replay"):
        summary, rsteps = loaders.replay(rpath)
        dec = loaders.decoder(sel.get(sel.DRAFTER), sel.get(sel.TARGET))
        rec = summary.recorded
        variants = summary.variants
        rows = [{"variant": "recorded", "options": "-", "acceptance_rate": rec.acceptance_rate,
                 "mean_acceptance_length": rec.mean_acceptance_length, "agreement": None}]
        rows += [{"variant": n, **v.to_dict()} for n, v in variants.items()]
        table = pd.DataFrame(rows)
        st.caption(f"replay of `{sel.short(summary.trace)}`: {wording.plural(summary.n_rounds, 'round')}, "
                   f"{wording.plural(summary.n_steps, 'step')}")
        for m in summary.model_mismatch:       # before any figure: they all describe another model
            st.warning(m)
        st.plotly_chart(charts.summary_bars([float(r or 0) for r in table["acceptance_rate"]], list(table["variant"]),
                                            "Acceptance rate: recorded vs replayed variants"),
                        key=sel.CMP_REPLAY, width="stretch")
        st.caption("The acceptance rate the recording had, and the one each replayed variant would have had.")
        st.dataframe(table, hide_index=True, width="stretch",
                     column_config={"agreement": st.column_config.NumberColumn(
                         "agreement", format="%.4f",
                         help="share of the recorded draft steps where the variant drafts the same token as the "
                              "recording")})
        from mtpscope.traces.run.replay import indistinguishable

        pairs = summary.indistinguishable
        if pairs is None and len(rsteps):  # summaries written before the key existed
            pairs = tuple(indistinguishable(rsteps, list(variants)))
        for a, b in pairs or ():
            st.caption(f"This trace cannot tell {b} from {a}: both draft the same token at every replayed step.")
        for note in summary.notes:
            st.caption(note)
        dcols = [c for c in rsteps.columns if c.startswith("draft[")]
        if len(rsteps) and dcols and "recorded" in rsteps.columns:
            same = (rsteps[dcols].eq(rsteps["recorded"], axis=0)).all(axis=1)
            dis = rsteps.loc[~same, [c for c in ("prompt_id", "round", "k", "recorded", "truth") if c in rsteps.columns]
                             + dcols].head(200)
            st.markdown(f"**Steps where a variant drafts differently** ({int((~same).sum())})")
            for c in ["recorded", "truth", *dcols]:
                if c in dis.columns:
                    dis[c] = [dec.label(None if pd.isna(v) or int(v) < 0 else int(v)) for v in dis[c]]
            st.dataframe(dis, hide_index=True, width="stretch")
        vt = summary.variant_traces
        if vt:
            st.markdown("**Variant traces**: compare one with this trace as trace B")
            cols = st.columns(min(4, len(vt)))
            for i, (name, vp) in enumerate(vt.items()):
                found = sel.resolve_near(vp, rpath)
                cols[i % len(cols)].button(f"trace B = {name}", key=sel.cmp_variant_key(i), disabled=found is None,
                                           on_click=_use_as_b, args=(str(found),))
