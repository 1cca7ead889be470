"""Server: a llama-server's requests (``mtpscope probe``, or an imported server log): acceptance and tokens/s
per request over time (refreshing while a probe runs), by category, the per-position counters, the
not-drafting alarm; a selected request is replayed with mtpscope's recorder and compared."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from mtpscope.app import formats, loaders, server_charts, server_jobs
from mtpscope.app import selection as sel
from mtpscope.app.guard import guard
from mtpscope.errors import MtpscopeError
from mtpscope.traces.store.layout import MANIFEST

#: Where the probe's prompts come from.
PROMPT_SOURCES = ("the demo's categorised prompts", "an uploaded file", "a file path")

st.title("Server")
st.caption("Probe a llama-server (this machine's by default; another host only with `MTPSCOPE_ALLOW_URLS=1` and "
           "the host in `MTPSCOPE_URL_HOSTS`) or open a probe trace. docs/SERVER.md says how to reach a server on "
           "another machine.")

mode = st.radio("source", ["open a probe trace", "probe a server"], horizontal=True, key=sel.SERVER_MODE)
if mode == "probe a server":
    defaults = server_jobs.probe_defaults()   # mtpscope probe's defaults (n_predict, repeat): one home
    with st.form(sel.SERVER_PROBE_FORM):
        c1, c2 = st.columns([2, 1])
        url = c1.text_input("server URL", value="http://127.0.0.1:8080", key=sel.SERVER_URL)
        header = c2.text_input("header (e.g. an API key; never written)", value="", type="password",
                               key=sel.SERVER_HEADER, help="'Authorization: Bearer KEY'")
        source = st.radio("prompts", PROMPT_SOURCES, horizontal=True, key=sel.SERVER_PROMPT_SOURCE)
        c3, c4 = st.columns([1, 1])
        upload = c3.file_uploader("prompts file to upload (one JSON line per prompt, as `mtpscope record "
                                  "--prompts`)", type=["jsonl", "json", "txt"], key=sel.SERVER_PROMPTS_UPLOAD)
        prompts = c4.text_input("prompts file path (under an allowed folder)", key=sel.SERVER_PROMPTS,
                                help="As `mtpscope record --prompts`.")
        c5, c6, c7 = st.columns([4, 1, 1])
        out = c5.text_input("trace folder to write", value="", key=sel.SERVER_OUT,
                            placeholder=f"{server_jobs.probes_dir()}/<host>-<port> (the cache folder)")
        n_predict = c6.number_input("n_predict", min_value=1, max_value=65536, value=defaults.n_predict,
                                    key=sel.SERVER_N_PREDICT)
        repeat = c7.number_input("repeat", min_value=1, max_value=100, value=defaults.repeat,
                                 key=sel.SERVER_REPEAT)
        go = st.form_submit_button("start probe")
    if go:
        with guard("starting the probe"):
            if source == PROMPT_SOURCES[0]:
                pfile = str(server_jobs.demo_prompts_file())
            elif source == PROMPT_SOURCES[1]:
                if upload is None:
                    raise MtpscopeError("no prompts file uploaded", key="prompts",
                                        expected="a .jsonl file in the upload box")
                pfile = str(server_jobs.store_prompts(upload.getvalue(), upload.name))
            else:
                pfile = prompts.strip()
            started = server_jobs.probe_start(url, pfile, out.strip() or server_jobs.default_probe_out(url),
                                              n_predict=int(n_predict), repeat=int(repeat), header=header)
            st.session_state[sel.SERVER_TRACE] = started.out
    job = server_jobs.probe_job()
    path = job.out if job else None
else:
    job = None
    if sel.SERVER_TRACE not in st.session_state:
        running = server_jobs.probe_job()
        st.session_state[sel.SERVER_TRACE] = (running.out if running else "") or ""
    path = st.text_input("probe trace (or an imported server log)", key=sel.SERVER_TRACE).strip() or None

if not path:
    st.info("Start llama-server with MTP (`mtpscope server run --target T.gguf --assistant A.gguf`), then "
            "`mtpscope probe URL --prompts P.jsonl --out DIR` and open DIR here, or probe it from this page.")
    st.stop()


running_at_start = bool(job and not job.done)


@st.fragment(run_every=1.0 if running_at_start else None)
def _requests_view(path: str) -> None:
    job = server_jobs.probe_job()
    if job and job.out == path:
        if not job.done:
            st.caption(f"probing {job.url} … (this view refreshes every second)")
        elif running_at_start:   # it finished since the page ran: the whole page again, the table and replay here
            st.rerun()
        elif job.error:
            st.error(job.error, icon=":material/error:")
    if not (Path(path) / MANIFEST).exists():
        return
    with guard("reading the requests"):
        tr, v = loaders.server_view(path)
        tot, table = v.totals, v.table
        if v.alarm:
            st.error(v.alarm, icon=":material/warning:")
        for w in list(tr.warnings)[:5]:
            st.warning(w)
        c = st.columns(5)
        c[0].metric("requests", formats.number(tot.n_requests))
        c[1].metric("drafted", formats.number(tot.n_drafted))
        c[2].metric("acceptance rate", formats.percent(tot.acceptance_rate))
        c[3].metric("mean acceptance length", formats.number(tot.mean_acceptance_length, 3))
        c[4].metric("tokens/s", formats.number(tot.tokens_per_s_pooled, 1),
                    help="All generated tokens over all generation time; the mean of the requests' own rates: "
                         f"{formats.number(tot.tokens_per_s_mean, 1)}.")
        st.plotly_chart(server_charts.requests_over_time(table), key=sel.SERVER_TIME, width="stretch")
        a, b = st.columns(2)
        a.plotly_chart(server_charts.category_figure(v.by_category), key=sel.SERVER_CAT, width="stretch")
        b.plotly_chart(server_charts.position_figure(v.per_position), key=sel.SERVER_POS, width="stretch")


_requests_view(path)

if job is not None and not job.done:
    st.stop()

with guard("the requests table"):
    if not (Path(path) / MANIFEST).exists():
        st.stop()
    tr, v = loaders.server_view(path)
    table = v.table
    shown = table[["request", "prompt", "category", "n_prompt_tokens", "n_output_tokens", "n_drafted", "n_accepted",
                   "acceptance_rate", "mean_acceptance_length", "tokens_per_s", "wall_ms"]].copy()
    shown["acceptance_rate"] = shown["acceptance_rate"].map(formats.percent)   # 34.8 %, as every page shows it
    st.subheader("Requests")
    ev = st.dataframe(shown, hide_index=True, width="stretch", on_select="rerun", selection_mode="single-row",
                      key=sel.SERVER_TABLE, placeholder=formats.MISSING)
    picked = list(getattr(getattr(ev, "selection", None), "rows", None) or [])
    if tr.manifest.get("source") != "server-probe":
        st.caption("Replaying needs a probe trace (it holds each prompt's token ids).")
        st.stop()
    numbers = [int(r) for r in table["request"]]
    labels = dict(zip(numbers, table["prompt"].astype(str), strict=True))
    if picked and st.session_state.get(sel.SERVER_PICKED) != picked[0]:   # a click on a row selects its request
        st.session_state[sel.SERVER_PICKED] = picked[0]
        st.session_state[sel.SERVER_REQUEST] = numbers[picked[0]]
    if st.session_state.get(sel.SERVER_REQUEST) not in numbers:
        st.session_state[sel.SERVER_REQUEST] = numbers[0]
    req = st.selectbox("request to replay (or click its row)", numbers, key=sel.SERVER_REQUEST,
                       format_func=lambda r: f"request {r} (prompt {labels[r]})")
    props = (tr.manifest.get("server") or {}).get("props") or {}
    c1, c2 = st.columns(2)
    assistant = c1.text_input("assistant GGUF the server runs (-md)", value=sel.get(sel.DRAFTER) or "",
                              key=sel.SERVER_ASSISTANT)
    target = c2.text_input("target GGUF", value=props.get("model_path") or sel.get(sel.TARGET) or "",
                           key=sel.SERVER_TARGET)
    if st.button(f"replay request {req}", key=sel.SERVER_REPLAY):
        with st.spinner("recording with mtpscope…"):
            st.session_state[sel.SERVER_REPLAYED] = server_jobs.replay_request(path, req, assistant, target or None)
    res = st.session_state.get(sel.SERVER_REPLAYED)
    if res is not None and res.probe and Path(res.probe) == Path(path):
        st.dataframe(formats.cells({"request": r.request_a, "prompt": r.prompt, "drafted (server)": r.drafted_a,
                                    "drafted (mtpscope)": r.drafted_b, "accepted (server)": r.accepted_a,
                                    "accepted (mtpscope)": r.accepted_b, "same output": r.same_output}
                                   for r in res.requests), hide_index=True, width="stretch")
        fd = res.first_difference
        if fd is None:
            st.success("same output, same drafted, same accepted")
        else:
            server = None if fd.server is None else fd.server.to_dict()
            recording = None if fd.recording is None else fd.recording.to_dict()
            st.warning(f"request {fd.request} differs: server {server}, mtpscope {recording}")
            diff = [s.to_dict() for s in res.settings if s.same is not True]
            st.dataframe(formats.cells(diff), hide_index=True, width="stretch")
        rec_pid = None if fd is None else fd.recording_prompt_id
        if st.button("open the recording in the Step view", key=sel.SERVER_STEP):
            server_jobs.open_step(res.recording, rec_pid if rec_pid is not None else 0, 0)
