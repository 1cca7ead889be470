"""Centroids: cluster sizes, a centroid browser (tokens as text), token search, and trace coverage."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from mtpscope.app import charts, formats, loaders, safety, views
from mtpscope.app import selection as sel
from mtpscope.app.guard import guard

st.title("Centroids")
drafter = sel.get(sel.DRAFTER)
tpath = sel.get(sel.TRACE)
# The centroid head can come from the selected drafter, from the file a trace names as its centroid
# source (a trace recorded with an upstream drafter scores a fork file's head next to it), or the demo.
candidates: list[str] = []
if drafter:
    candidates.append(drafter)
tr = None   # the selected trace, read once: an unreadable one says why here, once
if tpath:
    with guard("trace store"):
        tr = loaders.trace(tpath)
        src = views.model_path(tr.manifest, "centroids")
        if src and safety.is_allowed(src, sel.roots()):
            candidates.append(src)
demo_fork = str(sel.demo_paths().drafter_fork)
if sel.demo_paths().drafter_fork.exists() and safety.is_allowed(demo_fork, sel.roots()):
    candidates.append(demo_fork)
candidates = list(dict.fromkeys(candidates))
if not candidates:
    st.info("Choose a fork-dialect drafter (with a centroid head) on the Files page.")
    sel.demo_missing_hint()
    st.stop()
if drafter:
    with guard("GGUF reader"):
        loaders.gguf(drafter)  # an unreadable / not allowed drafter: its one-line error here
with_head = [c for c in candidates if loaders.has_centroid_head(c)]
if st.session_state.get(sel.CENT_SOURCE) not in candidates:
    st.session_state[sel.CENT_SOURCE] = (with_head or candidates)[0]
path = st.selectbox("centroid head from", candidates, key=sel.CENT_SOURCE, format_func=sel.short)
if drafter and path != drafter:
    st.caption(f"The selected drafter `{sel.short(drafter)}` "
               + ("has no centroid head; " if drafter not in with_head else "")
               + f"showing the head of `{sel.short(path)}`.")

with guard("centroid head"):
    head = loaders.centroid_head(path)
    dec = loaders.decoder(path, drafter, sel.get(sel.TARGET))
    sizes = head.cluster_sizes()
    c = st.columns(5)
    c[0].metric("centroids", f"{head.n_centroids:,}")
    c[1].metric("tokens (n_vocab)", f"{head.n_vocab:,}")
    c[2].metric("tokens per centroid (vsc)", head.vsc)
    c[3].metric("top-k", head.top_k if head.top_k is not None else "?")
    c[4].metric("centroids not of size vsc", int((sizes != head.vsc).sum()))
    st.caption(f"`{head.centroids_name}` · `{head.ordering_name}`"
               + (" · :material/warning: centroid matrix stored transposed" if head.transposed else ""))
    st.plotly_chart(charts.cluster_size_figure(sizes), key=sel.CENT_SIZES, width="stretch")
    st.caption("How many tokens each centroid holds; in a well-formed head every centroid holds vsc tokens.")

    st.subheader("Browse a centroid")
    b1, b2 = st.columns([1, 2])
    with b1:
        cid = int(st.number_input("centroid", 0, head.n_centroids - 1, 0, key=sel.CENT_ID))
        ids = head.tokens_of(cid)
        st.caption(f"{len(ids)} tokens")
    with b2:
        st.dataframe(pd.DataFrame({"token id": ids, "text": [dec.label(int(i)) for i in ids]}),
                     hide_index=True, width="stretch", height=280)

    st.subheader("Find a token's centroid")
    q = st.text_input("token text or #id", key=sel.CENT_QUERY, placeholder="e.g.  fox  or #1234")
    if q:
        if q.strip().lstrip("#").isdigit():
            hits = [int(q.strip().lstrip("#"))]
        else:
            hits = dec.find(q, limit=20)
        past = [h for h in hits if not 0 <= h < head.n_vocab]
        hits = [h for h in hits if 0 <= h < head.n_vocab]
        for h in past:
            st.warning(f"no such token: #{h} — the head's vocabulary has {head.n_vocab:,} tokens "
                       f"(ids 0–{head.n_vocab - 1:,})", icon=":material/search_off:")
        if not hits and not past:
            st.info(f"no token whose text contains “{q}” (vocabulary: {dec.source})")
        elif hits:
            homes = [head.centroid_of(h) for h in hits]  # -1: listed in no centroid's ordering row
            st.dataframe(pd.DataFrame({"token id": hits, "text": [dec.label(h) for h in hits],
                                       "centroid": [str(c) if c >= 0 else "none (in no centroid's row)"
                                                    for c in homes]}),
                         hide_index=True, width="stretch")

    st.subheader("Coverage on the selected trace")
    if not tpath:
        st.caption("Choose a trace on the Files page to see which centroids were chosen and where the target's "
                   "token lived.")
    elif tr is not None:
        with guard("trace store"):
            if not loaders.has_centroid_columns(tpath):
                lost = [w for w in tr.warnings if "unreadable steps part" in w]
                if tr.manifest.get("centroids") is not None and lost:     # (recorded with a head: its steps are lost)
                    st.warning(f"No step of this trace could be read: {lost[0]}" +
                               (f" (and {len(lost) - 1} more parts)" if len(lost) > 1 else ""))
                else:
                    st.info("This trace has no centroid columns (recorded without a centroid head).")
            else:
                from mtpscope.traces.analysis.explain_report import drafting_head

                rep = loaders.report(tpath)
                head_kind = drafting_head(tr.manifest)
                cc = rep.centroid_coverage
                if cc:
                    st.metric("steps whose target token was reachable", formats.percent(cc.coverage or 0),
                              help="share of the draft steps the target checked (accepted, or a round's first "
                                   "rejection: the steps the table below lists) where the target's token was among "
                                   "the candidates of the centroids the sparse head chose (as `mtpscope report`)")
                cov = loaders.coverage(tpath, path)
                st.plotly_chart(charts.coverage_heatmap(cov), key=sel.CENT_COVERAGE, width="stretch")
                st.caption("Each cell is one centroid: how often, when the target's token lived in it, the head "
                           "chose it (green = always, red = never, grey = the target's token never lived there).")
                st.plotly_chart(charts.chosen_vs_home_figure(cov), key=sel.CENT_CHOSEN_VS_HOME, width="stretch")
                st.caption("For the centroids the target's tokens lived in most: how often each was chosen, and how "
                           "often the target's token was reachable through it.")
                un = loaders.unreachable_steps(tpath)
                title = ("Steps the centroid head would have missed" if head_kind == "dense"
                         else "Steps where the target's token was unreachable")
                st.markdown(f"**{title}** ({len(un)}{'+' if len(un) >= 500 else ''})")
                if head_kind == "dense":
                    st.caption("This run drafted with the dense head, so the centroid head is a what-if: these are "
                               "the checked steps where the target's token was in none of the centroids the sparse "
                               "head would have chosen — whatever the dense head did there (the last column).")
                if len(un):
                    plabels = views.prompt_labels(sorted({int(p) for p in un["prompt_id"]}),
                                                  views.manifest_prompts(tr.manifest), width=30)
                    un = un.assign(prompt_id=[plabels[int(p)] for p in un["prompt_id"]]).rename(
                        columns={"prompt_id": "prompt"})
                    un = un.assign(drafted=[dec.label(int(t)) for t in un["token"]],
                                   target=[dec.label(None if pd.isna(t) else int(t)) for t in un["target_token"]])
                    if "accepted" in un.columns:
                        word = "dense head's draft" if head_kind == "dense" else "draft"
                        un[word] = ["accepted" if bool(a) else "rejected" for a in un["accepted"].fillna(False)]
                        un = un.drop(columns=["accepted"])
                    st.dataframe(un, hide_index=True, width="stretch", height=300)
