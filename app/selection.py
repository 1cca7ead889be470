"""What the user has selected, across pages: every Streamlit session key by name, the selection slots, and
how the selection is shown (sidebar, short paths) and changed (a trace selects its models, a click opens a
round).

Session keys. Every key the app keeps in ``st.session_state`` is a constant here; pages never spell one.
Selection slots (:data:`SLOTS`: drafter, target, trace, trace B, checkpoint, replay folder) live under
``sel.<slot>`` (:func:`slot_key`), non-widget keys that survive page switches; the demo is preselected
when its files exist (:func:`init_selection`). Widget keys start with ``w.``; the keys of charts and tables
(their selection events) and the small state a page keeps (``acc.handled``: the last click acted on) carry
the page's prefix. A key built from a value (one per tensor, per prompt, per slot) is a function here.

Paths: every selected path is checked by the loaders (:mod:`mtpscope.app.loaders`) through
:func:`mtpscope.app.safety.check_path` against :func:`roots`.

One prompt and one round across pages: :data:`SEL_PROMPT` (a ``prompt_id``, or :data:`ALL` = every
prompt) and :data:`SEL_ROUND` are shared by Acceptance, Text, Step, Explain and Compare; each page's prompt
box shows and sets them (:func:`prompt_picker`), and a page that shows one prompt at a time shows the
selected round's prompt while the selection is "all prompts". They are per trace: choosing another trace
clears them.

Imports: streamlit, ``safety``, ``links``, mtpscope.demo.spec, mtpscope.cache.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, overload

import streamlit as st

from mtpscope.app import links, safety
from mtpscope.demo.spec import RECORD_CONFIG, DemoPaths
from mtpscope.errors import MtpscopeError

# ------------------------------------------------------------------------------------- selection slots

#: Selection slots: the selected file or folder of each (a path string, or None).
DRAFTER, TARGET, TRACE, TRACE_B, CHECKPOINT, REPLAY = "drafter", "target", "trace", "trace_b", "checkpoint", "replay"
SLOTS = (DRAFTER, TARGET, TRACE, TRACE_B, CHECKPOINT, REPLAY)
#: How the sidebar names the slots it shows.
SLOT_LABELS = {DRAFTER: "drafter", TARGET: "target", TRACE: "trace", TRACE_B: "trace B"}


def slot_key(slot: str) -> str:
    """The session key of selection slot ``slot`` (``sel.trace``)."""
    return f"sel.{slot}"


#: Set once per session when the defaults (the demo) were filled in.
SEL_INIT = "sel._init"
#: The selected round: (prompt_id, round), shared by the Acceptance, Text and Step pages.
SEL_ROUND = "sel.round"
#: The selected prompt, shared by the trace pages: a prompt_id, or :data:`ALL` (every prompt).
SEL_PROMPT = "sel.prompt"
#: Every prompt of the trace (the value of :data:`SEL_PROMPT`; ``prompt=all`` in a link).
ALL = links.ALL
#: The draft step a link pointed at: (prompt_id, round, k), highlighted while that round is shown.
SEL_STEP = "sel.step"
#: The URL the app last wrote or took for the page shown: (page, sorted query items).
URL_SEEN = "url.seen"
#: What this run's URL asked for (a :class:`mtpscope.app.links.View`), or its one-line refusal (str).
URL_ARRIVAL = "url.arrival"
#: The sweep directory last opened on the Sweep page.
SEL_SWEEP = "sel.sweep"

# ---------------------------------------------------------------------------------- session keys by page

# Files
FILES_MODELS_FROM_MANIFEST = "trace.models_from_manifest"  # the models a newly chosen trace selected
FILES_AS_TARGET = "w.drafter.as_target"
FILES_N_CTX = "w.est.n_ctx"
FILES_URL = "w.url"


def picker_keys(slot: str) -> tuple[str, str, str]:
    """The Files page's widgets for ``slot``: (select box, free path, the selection they last showed)."""
    return f"w.{slot}.pick", f"w.{slot}.text", f"w.{slot}.seen"


def upload_key(slot: str) -> str:
    """The Files page's file uploader for ``slot``."""
    return f"w.{slot}.upload"


def uploaded_key(slot: str) -> str:
    """The id of the last upload acted on for ``slot`` (an upload is stored once)."""
    return f"upl.{slot}"


def refused_key(slot: str) -> str:
    """(path, reason) of the last path refused for ``slot`` (a target offered as the drafter)."""
    return f"refused.{slot}"


# Tensors
TENSORS_WHICH = "w.tensors.which"
TENSORS_GLOB = "w.tensors.glob"
TENSORS_COMPONENT = "w.tensors.comp"
TENSORS_LAYER = "w.tensors.layer"
TENSORS_TYPE = "w.tensors.type"
TENSORS_FOCUS = "w.tensors.focus"
TENSORS_TREEMAP = "tensors.treemap"
TENSORS_GRID = "tensors.grid"

# Validate
VAL_PAIR = "w.val.pair"
VAL_HF = "w.val.hf"
VAL_HF_ROWS = "val.hf.rows"
VAL_HF_CONFIG = "val.hf.cfg"
VAL_HF_ONLY = "val.hf.only"

# Centroids
CENT_SOURCE = "w.cent.src"
CENT_ID = "w.cent.id"
CENT_QUERY = "w.cent.q"
CENT_SIZES = "cent.sizes"
CENT_COVERAGE = "cent.cov"
CENT_CHOSEN_VS_HOME = "cent.cvh"

# Tensor values
VALUES_WHICH = "w.values.which"
VALUES_TENSOR = "w.values.tensor"
VALUES_LOG = "w.values.log"
VALUES_HIST = "values.hist"
VALUES_HEAT = "values.heat"


def values_count_key(tensor: str) -> str:
    """The Tensor values page's row count for ``tensor``."""
    return f"w.values.count.{tensor}"


def values_start_key(tensor: str) -> str:
    """The Tensor values page's first row for ``tensor``."""
    return f"w.values.start.{tensor}"


# Acceptance
ACC_PROMPT = "w.acc.prompt"
ACC_WINDOW = "w.acc.window"
ACC_ROLL = "w.acc.roll"
ACC_ROLL_MODE = "w.acc.rollmode"
ACC_OVERVIEW = "acc.overview"
ACC_OVERVIEW_HANDLED = "acc.ov_handled"
ACC_TIMELINE = "acc.timeline"
ACC_HANDLED = "acc.handled"
ACC_PER_POSITION = "acc.perpos"
ACC_HIST = "acc.hist"
ACC_ROLLING = "acc.rolling"
ACC_WORST = "w.acc.worst"

# Text
TEXT_PROMPT = "w.text.prompt"
TEXT_COLOUR = "w.text.colour"
TEXT_PREV = "w.text.prev"
TEXT_NEXT = "w.text.next"
TEXT_VIEW = "text.view"
TEXT_HANDLED = "text.handled"


def text_start_key(prompt_id: int) -> str:
    """The Text page's first output position shown for ``prompt_id``."""
    return f"w.text.start.{prompt_id}"


# Step
STEP_PROMPT = "w.step.prompt"
STEP_ROUND = "w.step.round"
STEP_PREV = "w.step.prev"
STEP_NEXT = "w.step.next"
STEP_HIDDEN = "w.step.hidden"
STEP_WORST = "w.step.worst"
STEP_TEXT = "step.text"
STEP_TEXT_HANDLED = "step.text.handled"
STEP_TABLE = "step.table"
STEP_REPLAY = "step.replay"
STEP_DRIFT = "step.drift"
STEP_NORMS = "step.norms"


def step_top_key(i: int) -> str:
    """The Step page's top-candidates chart of the round's ``i``-th step."""
    return f"step.top.{i}"


# Explain
EXP_PROMPT = "w.exp.prompt"
EXP_CAUSES = "exp.causes"
EXP_RANKS = "exp.ranks"
EXP_BY_POSITION = "exp.bypos"
EXP_CLASS = "exp.class"
EXP_CLASS_POSITION = "exp.classpos"
EXP_CHANNEL = "exp.channel"
EXP_CATEGORY = "exp.category"
EXP_DRIFT = "exp.drift"
EXP_WHAT_IF = "exp.whatif"
EXP_WHAT_IF_TABLE = "exp.whatif.table"
EXP_FIRST_MISMATCHES = "exp.fm"
EXP_CATEGORY_FIELD = "w.exp.catfield"
EXP_RECOMMENDATION_BY_CATEGORY = "exp.rec.cat"
EXP_BREAK_EVEN_BY_CATEGORY = "exp.be.cat"


def exp_tokens_key(section: str) -> str:
    """The Explain page's table of the most-rejected tokens ``section`` (``top_target_tokens``)."""
    return f"exp.{section}"


# Compare
CMP_MODE = "w.cmp.mode"
CMP_PROMPT_A = "w.cmp.pa"
CMP_PROMPT_B = "w.cmp.pb"
CMP_ONLY_CLASS = "cmp.only.cls"
CMP_ONLY_POSITION = "cmp.only.k"
CMP_DELTA = "cmp.delta"
CMP_PROMPTS = "cmp.prompts"
CMP_RUNTIMES = "cmp.runtimes"
CMP_PER_POSITION = "cmp.perpos"
CMP_ROLLING = "cmp.rolling"
CMP_DELTAS = "cmp.deltas"
CMP_REPLAY = "cmp.replay"


def cmp_variant_key(i: int) -> str:
    """The Compare page's "trace B = variant" button of the replay's ``i``-th variant trace."""
    return f"w.cmp.vt.{i}"


# Server (issue 24)
SERVER_MODE = "w.server.mode"
SERVER_URL = "w.server.url"
SERVER_HEADER = "w.server.header"
SERVER_PROMPTS = "w.server.prompts"
SERVER_OUT = "w.server.out"
SERVER_N_PREDICT = "w.server.n_predict"
SERVER_REPEAT = "w.server.repeat"
SERVER_TRACE = "w.server.trace"
SERVER_TIME = "server.time"
SERVER_CAT = "server.cat"
SERVER_POS = "server.pos"
SERVER_TABLE = "server.table"
SERVER_PICKED = "server.picked"
SERVER_REQUEST = "w.server.request"
SERVER_ASSISTANT = "w.server.assistant"
SERVER_TARGET = "w.server.target"
SERVER_REPLAY = "server.replay"
SERVER_REPLAYED = "server.replayed"
SERVER_STEP = "server.step"
SERVER_PROBE_FORM = "server.probe"
SERVER_JOB = "server.job"
SERVER_PROMPT_SOURCE = "w.server.prompt_source"
SERVER_PROMPTS_UPLOAD = "w.server.prompts_upload"

# Diagnose (issue 27)
DIAG_REFERENCE = "w.diag.reference"
DIAG_SAVED = "w.diag.saved"
DIAG_RUN = "diag.run"  # the inputs of the diagnosis the page shows (set by its button)
DIAG_FIGURES = "diag.fig"
DIAG_WHICH = "w.diag.which"  # which open trace to diagnose (A or B) when two are open
DIAG_DOWNLOAD = "w.diag.download"


def diag_open_key(i: int, j: int = 0) -> str:
    """The Diagnose page's ``j``-th evidence button of the ``i``-th finding (0: the finding's own link)."""
    return f"w.diag.open.{i}" + (f".{j}" if j else "")


def diag_figure_key(name: str) -> str:
    """The Diagnose page's figure ``name`` (``per_position``, ``variants``, ...)."""
    return f"diag.fig.{name}"


# Sweep
SWEEP_PATH = "w.sweep.path"
SWEEP_VALUE = "w.sweep.value"
SWEEP_CONFIG = "w.sweep.config"
SWEEP_CATEGORY = "w.sweep.category"
SWEEP_SHARD = "w.sweep.shard"
SWEEP_HEAT = "sweep.heat"
SWEEP_HANDLED = "sweep.handled"
SWEEP_RECOMMENDATION_BY_CATEGORY = "sweep.rec.cat"
SWEEP_BREAK_EVEN_BY_CATEGORY = "sweep.be.cat"
SWEEP_QUANT_VALUE = "w.sweep.quant_value"
SWEEP_QUANT_TABLE = "sweep.quant"


def sweep_open_key(page: str) -> str:
    """The Sweep page's "open in PAGE" button (``acceptance``, ``step``, ``explain``)."""
    return f"sweep.open.{page}"


# ------------------------------------------------------------------------------------- roots and the demo

def roots() -> tuple[Path, ...]:
    """The allowed folders: working directory and demo cache, plus ``MTPSCOPE_ROOTS`` (see
    :func:`mtpscope.app.safety.allowed_roots`)."""
    return safety.allowed_roots()


def demo_paths() -> DemoPaths:
    """Where the demo's files are (:class:`mtpscope.demo.spec.DemoPaths` under the cache's demo folder;
    they may not exist yet)."""
    from mtpscope.cache import demo_dir

    return DemoPaths.under(demo_dir(), RECORD_CONFIG)


def short(path: str | os.PathLike[str] | None) -> str:
    """A path shown relative to the demo folder, the uploads folder or the working directory when it lies
    below one (``demo/traces``); ``—`` for none."""
    if not path:
        return "—"
    p = Path(path)
    for base, tag in ((demo_paths().root, "demo/"), (safety.uploads_dir(), "uploads/"), (Path.cwd(), "")):
        try:
            return tag + str(p.resolve().relative_to(base.resolve()))
        except ValueError:
            continue
    return str(p)


def same_path(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """True when ``a`` and ``b`` name the same file or folder (resolved; compared as written when a path
    cannot be resolved)."""
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return str(a) == str(b)


def resolve_near(path: str | os.PathLike[str], folder: str | os.PathLike[str]) -> Path | None:
    """A path written by another command (absolute, relative to the working directory, or relative to
    ``folder`` by its last parts), resolved to an existing allowed folder, else None."""
    p = Path(path)
    tries = [p] if p.is_absolute() else [Path.cwd() / p, Path(folder) / p,
                                         Path(folder) / p.parent.name / p.name, Path(folder) / p.name]
    for c in tries:
        if c.is_dir() and safety.is_allowed(c, roots()):
            return c.resolve()
    return None


def same_trace(recorded: str | None, path: str | os.PathLike[str], near: str | os.PathLike[str]) -> bool:
    """True when ``recorded`` (a trace path another command wrote, e.g. a replay summary's ``trace``;
    resolved like :func:`resolve_near` from ``near``) is the trace folder ``path``."""
    if not recorded:
        return False
    found = resolve_near(recorded, near)
    try:
        return found is not None and found == Path(path).resolve()
    except OSError:
        return False


# ------------------------------------------------------------------------------------------- selection

def default_selection(preset: Mapping[str, str | None] | None = None) -> dict[str, str | None]:
    """What :func:`init_selection` selects (slot -> path or None) in a session whose slots ``preset`` holds (a
    link's; kept): the demo's default view (``demo.json``'s trained pair, else the constructed clean and noisy
    traces), the models that recorded trace A, never a default trace B = trace A; without ``preset``, a fresh
    session's (warmed at server start: :mod:`mtpscope.app.warmup`). Reads no session state."""
    preset, demo = dict(preset or {}), demo_paths()
    d = {DRAFTER: demo.drafter_fork, TARGET: demo.target, TRACE: demo.traces_clean, TRACE_B: demo.traces_noisy,
         CHECKPOINT: None, REPLAY: None, **_trained_defaults(demo.root)}   # the trained pair's, when built

    def ok(v: Any) -> bool:
        return v is not None and Path(v).exists() and safety.is_allowed(v, roots())

    out: dict[str, str | None] = {k: str(v) if ok(v) else None for k, v in d.items()}
    a = preset.get(TRACE, out[TRACE])
    out.update({**(recorded_models(a) if a else {}), **preset})
    if TRACE_B not in preset and a and (b := out[TRACE_B]) and same_path(a, b):  # a B the user chose is theirs
        out[TRACE_B] = next((str(t) for t in (demo.traces_noisy, demo.traces_clean) if ok(t) and not same_path(t, a)), None)
    return out


def init_selection() -> None:
    """Preselect the demo (once per session) for every selection slot that is still unset (:func:`default_selection`:
    the trained pair's F32 trace with its buggy trace as trace B, the models that recorded trace A)."""
    if st.session_state.get(SEL_INIT):
        return
    st.session_state[SEL_INIT] = True
    have = {k: st.session_state[slot_key(k)] for k in SLOTS if slot_key(k) in st.session_state}
    for k, v in default_selection(have).items():
        st.session_state.setdefault(slot_key(k), v)


def recorded_models(trace_path: str | os.PathLike[str]) -> dict[str, str]:
    """``{"drafter": path, "target": path}`` of the models a trace's manifest names (its ``assistant``
    and ``target`` entries) that exist and are allowed; read from ``manifest.json`` only (nothing else
    of the trace), so an unreadable trace gives ``{}``."""
    from mtpscope.traces.store.reader import read_manifest

    out: dict[str, str] = {}
    try:
        m = read_manifest(trace_path)
    except (MtpscopeError, OSError):
        return out
    models = m.get("models")
    if not isinstance(models, dict):
        return out
    for role, slot in (("assistant", "drafter"), ("target", "target")):
        e = models.get(role)
        p = e.get("path") if isinstance(e, dict) else None
        if isinstance(p, str) and p and "\x00" not in p and Path(p).is_file() and safety.is_allowed(p, roots()):
            out[slot] = str(Path(p))
    return out


def select_trace(path: str | None) -> dict[str, str]:
    """Select a trace and, when its manifest names models that are readable and allowed, the drafter
    and target that recorded it; when trace B was this trace, B becomes the previous trace A. Another
    trace than the one selected clears the prompt and round selection (they are the old trace's ids).
    Returns the models it selected (slot -> path)."""
    previous = get(TRACE)
    set_(TRACE, path)
    if not path:
        return {}
    if not previous or not same_path(previous, path):
        for k in (SEL_PROMPT, SEL_ROUND, SEL_STEP):
            st.session_state.pop(k, None)
    found = recorded_models(path)
    for slot, p in found.items():
        set_(slot, p)
    b = get(TRACE_B)
    if b and same_path(b, path):  # never B = A: B becomes the trace A was
        set_(TRACE_B, previous if previous and not same_path(previous, path) else None)
    return found


def _trained_defaults(root: Path) -> dict[str, Path]:
    """The trained demo's default view from ``<demo>/demo.json`` (trace, trace B, drafter, target); {} when
    absent. No prompt is preselected: the start page links to the worst prompt, and a trace page opens on every
    prompt until one is chosen."""
    try:
        doc = json.loads((root / "demo.json").read_text())
        d = doc.get("default") if isinstance(doc, dict) else None
    except (OSError, ValueError):
        return {}
    if not isinstance(d, dict):
        return {}
    out: dict[str, Path] = {}
    for k in (TRACE, TRACE_B, DRAFTER, TARGET):
        v = d.get(k)
        if isinstance(v, str) and v and (root / v).exists():
            out[k] = root / v
    return out


def get(slot: str) -> str | None:
    """The selected path of ``slot`` (one of :data:`SLOTS`), or None."""
    init_selection()
    v = st.session_state.get(slot_key(slot))
    return v or None


def set_(slot: str, value: str | None) -> None:
    """Select a path for ``slot`` (no check here; the loaders check)."""
    st.session_state[slot_key(slot)] = value or None


def selected_round() -> tuple[int, int] | None:
    """The selected round (prompt_id, round), or None."""
    v = st.session_state.get(SEL_ROUND)
    return (int(v[0]), int(v[1])) if v else None


def select_round(sel: tuple[int, int]) -> None:
    """Select a round (the Step view opens on it); a selected single prompt follows it (a selection of
    every prompt stays so)."""
    p, r = int(sel[0]), int(sel[1])
    st.session_state[SEL_ROUND] = (p, r)
    if isinstance(st.session_state.get(SEL_PROMPT), int):
        st.session_state[SEL_PROMPT] = p


def selected_prompt() -> int | str | None:
    """The selected prompt: a prompt_id, :data:`ALL`, or None when none was chosen yet."""
    v = st.session_state.get(SEL_PROMPT)
    return v if v == ALL or (isinstance(v, int) and not isinstance(v, bool)) else None


def select_prompt(p: int | str) -> None:
    """Select a prompt (a prompt_id) or every prompt (:data:`ALL`) on every trace page; a selected round
    of another prompt is dropped."""
    if p == ALL:
        st.session_state[SEL_PROMPT] = ALL
        return
    st.session_state[SEL_PROMPT] = int(p)
    r = selected_round()
    if r is not None and r[0] != int(p):
        st.session_state.pop(SEL_ROUND, None)


@overload
def page_prompt(pids: list[int], allow_all: Literal[False]) -> int: ...
@overload
def page_prompt(pids: list[int], allow_all: bool) -> int | str: ...


def page_prompt(pids: list[int], allow_all: bool) -> int | str:
    """The prompt a trace page shows of ``pids`` (the trace's prompt ids, sorted): the selected prompt;
    with every prompt (or none) selected, :data:`ALL` where the page can show it, else the selected round's
    prompt, else the first. A selection the trace does not have counts as none."""
    p = selected_prompt()
    if isinstance(p, int) and p in pids:
        return p
    if allow_all:
        return ALL
    r = selected_round()
    return r[0] if r is not None and r[0] in pids else pids[0]


def prompt_picker(where: Any, key: str, pids: list[int], labels: dict[int, str], allow_all: bool = False,
                  label: str = "prompt") -> int | str:
    """The page's prompt box (select box ``key`` in ``where``, a column or ``st``), showing and setting the
    shared prompt (:func:`page_prompt`, :func:`select_prompt`); returns the prompt shown."""
    options: list[int | str] = ([ALL] if allow_all else []) + list(pids)
    st.session_state[key] = page_prompt(pids, allow_all)
    return where.selectbox(label, options, key=key, on_change=lambda: select_prompt(st.session_state[key]),
                           format_func=lambda p: "all prompts" if p == ALL else labels.get(p, f"prompt {p}"))


def open_round(sel: tuple[int, int]) -> None:
    """Select a round and open the Step view on it (its link in the address bar)."""
    select_round(sel)
    view = links.View("step", trace=get(TRACE), prompt=int(sel[0]), round=int(sel[1]))
    st.switch_page("screens/step.py", query_params=view.params())


def clicked_round(event: Any, handled_key: str, prompt_id: int | None = None) -> tuple[int, int] | None:
    """The (prompt_id, round) a click on a chart chose, once per click: ``customdata`` [round, …] of the
    first selected point (with ``prompt_id``), or [prompt_id, round, …] without it. ``handled_key``
    remembers the last click so a rerun does not act on it twice; None when nothing new was clicked."""
    pts = list(getattr(getattr(event, "selection", None), "points", None) or []) if event else []
    if not pts:
        st.session_state.pop(handled_key, None)  # so the same point can be clicked again later
        return None
    cd = pts[0].get("customdata")
    if isinstance(cd, dict):  # bar points come back as {"0": …, "1": …}
        cd = [cd.get(str(i), cd.get(i)) for i in range(len(cd))]
    if cd is None or len(cd) < (1 if prompt_id is not None else 2):
        return None
    sel = (int(prompt_id), int(cd[0])) if prompt_id is not None else (int(cd[0]), int(cd[1]))
    if st.session_state.get(handled_key) == sel:
        return None
    st.session_state[handled_key] = sel
    return sel


# ------------------------------------------------------------------------------ showing the selection

def sidebar() -> None:
    """Current selection in the sidebar (short names; the full paths are on the Files page)."""
    init_selection()
    with st.sidebar:
        st.caption("Selection")
        for slot, label in SLOT_LABELS.items():
            v = get(slot)
            st.caption(f"**{label}**: `{short(v)}`" if v else f"**{label}**: —")


def demo_missing_hint() -> None:
    """An info box when the demo has not been built."""
    if not demo_paths().target.exists():
        st.info("The built-in demo is not built yet: run `mtpscope demo build` (or `make run`).", icon=":material/info:")


def selected_or_stop(slot: str, message: str, hint: bool = True) -> str:
    """The selected path of ``slot`` (see :func:`get`); without one, ``message`` as an info box (and,
    with ``hint``, :func:`demo_missing_hint`) and the page stops there (``st.stop``)."""
    path = get(slot)
    if not path:
        st.info(message)
        if hint:
            demo_missing_hint()
        st.stop()
    return path


# ------------------------------------------------------------------------------------- opening a view

#: The pages a link can open, by URL path -> the page's script.
PAGE_SCRIPTS = {name: f"screens/{name}.py" for name in links.PAGES}


def open_view(page: str, params: dict[str, Any]) -> None:
    """Open ``page`` on the view a finding's link names (``diagnose``'s ``ViewRef``: ``trace``, ``trace_b``,
    ``drafter``, ``target``, ``prompt``, ``round``, ``step``): the link's parameters go into the page's URL, and
    the page takes them on arrival as it takes any deep link (:mod:`mtpscope.app.url_state`: files selected and
    checked, the prompt and round selected, a bad value refused in one line).

    Raises:
        LinkError: an unknown page, or a parameter the page does not take (:func:`mtpscope.app.links.make_view`).
    """
    view = links.make_view(page, **params)
    st.switch_page(PAGE_SCRIPTS[page], query_params=view.params())
