"""The sweep directory and its ``sweep.json``: the one description of a sweep's layout, shared by the
Ray runner (:mod:`traces.sweep`) and the reader (:mod:`traces.sweep.reader`).

A sweep records one prompt set against several configurations; each task is one (assistant, n_draft,
prompt shard) and writes an ordinary trace (docs/TRACE_FORMAT.md) into a hive-partitioned folder::

    DIR/sweep.json                                         spec, prompts, every task's state
    DIR/assistant=<name>/n_draft=<k>/shard=<i>/            one trace per task
    DIR/assistant=baseline/n_draft=0/shard=<i>/            plain decoding of the target (``--baseline``)
    DIR/_logs/worker-<n>.log                               each worker's stderr (llama.cpp's messages)

The baseline is plain decoding, i.e. zero drafts per round, hence ``n_draft=0``; ``baseline`` is
reserved as an assistant name. Prompts go to shards round-robin (prompt ``i`` to shard
``i % n_shards``), so every shard sees every category; inside a shard's trace a prompt's
``prompt_id`` is its position in that shard.

Only the driver writes ``sweep.json`` (to a temporary file, then ``os.replace``), after each task
changes state, so a killed sweep leaves a readable one. Its keys (version 1)::

    sweep_version, created, updated, command, complete (every task done), spec {...},
    prompts [{index, category, shard, prompt_id, text[, tokens, messages, id, extra]}],
    ray {address, workers, threads_per_worker, gpus_per_worker},
    tasks [{task, assistant, n_draft, shard, dir, state, attempts, worker, started, finished, seconds,
            load_seconds, n_prompts, n_rounds, n_generated, n_drafted, n_accepted, tokens_per_s,
            acceptance_rate, error, stderr_tail}]

``state`` is ``pending`` | ``running`` | ``done`` | ``failed``.

Imports: mtpscope.errors, traces.run.prompts (the one prompts-file parser), traces.run.record_config (a task's
run parameters: :meth:`SweepSpec.record_config`, whose rules :meth:`SweepSpec.check` applies), traces.analysis.wording.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from mtpscope.errors import MtpscopeError, TraceError, TraceFormatError
from mtpscope.traces.analysis.wording import category_field_note, category_like_fields
from mtpscope.traces.run.prompts import CATEGORY_FIELD, PromptSpec, read_prompt_specs
from mtpscope.traces.run.record_config import MAX_N_DRAFT, RecordConfig
from mtpscope.traces.store.layout import MANIFEST, now

SWEEP_FILE = "sweep.json"
SWEEP_VERSION = 1
LOG_DIR = "_logs"
#: the assistant name of the plain-decoding baseline tasks (their n_draft is 0)
BASELINE = "baseline"
#: the category of prompts whose line names none
DEFAULT_CATEGORY = "default"
#: the category of totals over every prompt in reports
ALL = "all"
STATES = ("pending", "running", "done", "failed")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


# ------------------------------------------------------------------------------------------ prompts

@dataclass(frozen=True)
class SweepPrompt:
    """One prompt of the prompt set: ``index`` (0-based line order), its ``text`` and ``category``, and
    for a ``tokens`` / ``messages`` prompt its ids or chat (``text`` is then ``""``: the recorded trace
    holds the detokenized or rendered text), with the line's ``id`` and other fields (``extra``)."""

    index: int
    text: str
    category: str
    tokens: tuple[int, ...] | None = None
    messages: tuple[tuple[str, str], ...] | None = None
    id: str | None = None
    extra: tuple[tuple[str, Any], ...] = ()

    def prompt_spec(self) -> PromptSpec:
        """The prompt as the recorder takes it (:class:`traces.run.prompts.PromptSpec`, with its category)."""
        msgs = None if self.messages is None else tuple({"role": r, "content": c} for r, c in self.messages)
        return PromptSpec(text=None if self.tokens is not None or msgs is not None else self.text,
                          tokens=self.tokens, messages=msgs, id=self.id, category=self.category,
                          extra=dict(self.extra))

    def to_dict(self) -> dict[str, Any]:
        """The prompt's ``sweep.json`` fields besides ``shard`` / ``prompt_id``: ``index``, ``category``,
        ``text``, and when set ``tokens``, ``messages``, ``id``, ``extra``."""
        d: dict[str, Any] = {"index": self.index, "category": self.category, "text": self.text}
        if self.tokens is not None:
            d["tokens"] = list(self.tokens)
        if self.messages is not None:
            d["messages"] = [{"role": r, "content": c} for r, c in self.messages]
        if self.id is not None:
            d["id"] = self.id
        if self.extra:
            d["extra"] = dict(self.extra)
        return d

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> SweepPrompt:
        """The inverse of :meth:`to_dict` (``KeyError`` / ``TypeError`` / ``ValueError`` on a malformed entry)."""
        toks = d.get("tokens")
        msgs = d.get("messages")
        return SweepPrompt(int(d["index"]), str(d["text"]), str(d["category"]),
                           tokens=None if toks is None else tuple(int(t) for t in toks),
                           messages=None if msgs is None else tuple((str(m["role"]), str(m["content"])) for m in msgs),
                           id=None if d.get("id") is None else str(d["id"]),
                           extra=tuple(sorted(dict(d.get("extra") or {}).items())))


def read_prompt_set(path: str | os.PathLike[str], *, category_field: str = CATEGORY_FIELD) -> tuple[SweepPrompt, ...]:
    """The prompt set of a sweep: the prompts of :func:`traces.run.prompts.read_prompt_specs` (the one
    prompts reader ``record`` uses too: text, ``tokens`` and ``messages`` prompts, ``id``, other fields)
    with a category each: the ``.jsonl`` object's ``category`` (or ``category_field``) string
    (SPEED-Bench style), else :data:`DEFAULT_CATEGORY`.

    Raises:
        MtpscopeError: what :func:`read_prompt_specs` raises; a category that is the reserved :data:`ALL`
            (names the line).
        FileNotFoundError: missing file.
    """
    out = []
    for i, sp in enumerate(read_prompt_specs(path, category_field=category_field)):
        cat = sp.category.strip() if sp.category is not None else DEFAULT_CATEGORY
        if not cat:
            raise MtpscopeError(f"line {sp.line}: {category_field!r} must be a non-empty string", path=sp.path,
                                key=f"line {sp.line}", expected="a string", actual=repr(sp.category))
        if cat == ALL:
            raise MtpscopeError(f"the category {ALL!r} is reserved for the totals over all prompts",
                                path=sp.path, key=f"line {sp.line}: {category_field}",
                                expected=f"a category other than {ALL!r}", actual=cat)
        msgs = None if sp.messages is None else tuple((m["role"], m["content"]) for m in sp.messages)
        out.append(SweepPrompt(i, sp.text or "", cat, tokens=sp.tokens, messages=msgs, id=sp.id,
                               extra=tuple(sorted(sp.extra.items()))))
    return tuple(out)


#: ``sweep``'s default shard count (at most the number of prompts): several shards interleave every cell in
#: time, so a change of load hits them alike (issue 34: one shard ran n_draft 1 at 0.104x against n_draft 3's
#: 0.425x, pure load)
DEFAULT_SHARDS = 4


def default_shards(n_prompts: int) -> int:
    """``min(DEFAULT_SHARDS, n_prompts)``, at least 1: the shard count of a sweep run without ``--shards``."""
    return max(1, min(DEFAULT_SHARDS, int(n_prompts)))


def prompt_set_note(prompts: Sequence[SweepPrompt]) -> str | None:
    """The one-line note of :func:`traces.run.prompts.category_note` for a prompt set: no prompt has a
    category (all :data:`DEFAULT_CATEGORY`) but every prompt carries a field that looks like one."""
    if not prompts or any(p.category != DEFAULT_CATEGORY for p in prompts):
        return None
    return category_field_note(category_like_fields(dict(p.extra).keys() for p in prompts))


def file_sha256(path: str | os.PathLike[str]) -> str:
    """sha256 of a (small) file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ------------------------------------------------------------------------------------------ spec

def assistant_name(path: str | os.PathLike[str]) -> str:
    """The default partition name of an assistant file: its stem with characters outside
    ``[A-Za-z0-9._-]`` replaced by ``-`` (``gemma-4 assistant Q8_0.gguf`` -> ``gemma-4-assistant-Q8_0``)."""
    stem = Path(path).name
    if stem.lower().endswith(".gguf"):
        stem = stem[:-5]
    name = re.sub(r"[^A-Za-z0-9._-]", "-", stem).strip("-.") or "assistant"
    return name[:64]


def parse_assistant(arg: str) -> tuple[str, str]:
    """``NAME=PATH`` or ``PATH`` (name from :func:`assistant_name`) -> ``(name, path)``.

    Raises:
        MtpscopeError: a name that is not ``[A-Za-z0-9][A-Za-z0-9._-]*`` (at most 64 characters).
    """
    name, sep, path = arg.partition("=")
    if sep and "/" not in name and not Path(arg).exists():
        if not _NAME_RE.match(name):
            raise MtpscopeError("bad assistant name", key="--assistant", expected="NAME=PATH with NAME of "
                                "letters, digits, '.', '_', '-' (at most 64)", actual=name)
        return name, path
    return assistant_name(arg), arg


@dataclass(frozen=True)
class QuantAssistant:
    """An assistant that the sweep made by quantizing a drafter with llama.cpp's quantizer
    (``--assistant-quant``, :mod:`traces.sweep.quant`): its partition ``name`` (one of the spec's
    assistants), llama.cpp's file type ``qtype`` (``"q4_k_m"``), the ``source`` drafter (absolute path),
    the source's content hash ``source_sha256`` and the quantized file's size ``n_bytes``."""

    name: str
    qtype: str
    source: str
    source_sha256: str
    n_bytes: int = 0


@dataclass(frozen=True)
class SweepSpec:
    """What a sweep records (the part of ``sweep.json`` that ``--resume`` must match).

    Attributes:
        target: target GGUF path (absolute).
        assistants: ``(name, path)`` pairs, names unique, none :data:`BASELINE`.
        prompts: the prompt set.
        n_drafts: drafts per round of each configuration (each in 1..``MAX_N_DRAFT``, distinct, ascending).
        n_shards: prompt shards (1..number of prompts).
        baseline: also record plain decoding of the target (tasks with ``n_draft`` 0).
        max_tokens: tokens generated per prompt at most; hidden: ``f16`` | ``f32`` | ``off``.
        chat: apply the target's chat template; prompts_file / prompts_sha256: where the prompts came from.
        quantized: the assistants made by ``--assistant-quant`` (:class:`QuantAssistant`; each names one of
            ``assistants``), empty otherwise.
    """

    target: str
    assistants: tuple[tuple[str, str], ...]
    prompts: tuple[SweepPrompt, ...]
    n_drafts: tuple[int, ...]
    n_shards: int
    baseline: bool = False
    max_tokens: int = 128
    hidden: str = "f16"
    chat: bool = False
    prompts_file: str | None = None
    prompts_sha256: str | None = None
    quantized: tuple[QuantAssistant, ...] = ()

    def check(self) -> SweepSpec:
        """Return self after checking the rules above.

        Raises:
            MtpscopeError: the first broken rule, naming the option with expected vs actual.
        """
        if not self.assistants:
            raise MtpscopeError("a sweep needs at least one assistant", key="--assistant",
                                expected=">= 1", actual=0)
        names = [n for n, _ in self.assistants]
        for n in names:
            if not _NAME_RE.match(n):
                raise MtpscopeError("bad assistant name", key="--assistant",
                                    expected="letters, digits, '.', '_', '-' (at most 64)", actual=n)
            if n == BASELINE:
                raise MtpscopeError(f"the assistant name {BASELINE!r} is reserved for plain decoding; "
                                    "name it with --assistant NAME=PATH", key="--assistant",
                                    expected=f"a name other than {BASELINE!r}", actual=n)
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise MtpscopeError("two assistants have the same name; name them with --assistant NAME=PATH",
                                key="--assistant", expected="distinct names", actual=", ".join(dup))
        if not self.prompts:
            raise MtpscopeError("no prompts", key="--prompts", expected=">= 1", actual=0)
        for p in self.prompts:
            if p.category == ALL:
                raise MtpscopeError(f"the category {ALL!r} is reserved for the totals over all prompts",
                                    key=f"prompt {p.index}", expected=f"a category other than {ALL!r}",
                                    actual=p.category)
        if not self.n_drafts:
            raise MtpscopeError("no n_draft values", key="--n-draft", expected="e.g. 1,2,3", actual="none")
        for k in self.n_drafts:           # each task's run parameters, by the recorder's rules
            try:
                self.record_config(k)
            except TraceError as e:        # again with the sweep's option as the key (``--max-tokens``)
                msg = f"n_draft must be in 1..{MAX_N_DRAFT}" if e.key == "n_draft" else e.message
                raise MtpscopeError(msg, key=f"--{str(e.key).replace('_', '-')}", expected=e.expected,
                                    actual=e.actual) from None
        if len(set(self.n_drafts)) != len(self.n_drafts):
            raise MtpscopeError("n_draft values repeat", key="--n-draft", expected="distinct values",
                                actual=",".join(map(str, self.n_drafts)))
        if not 1 <= self.n_shards <= len(self.prompts):
            raise MtpscopeError("shards must be in 1..number of prompts", key="--shards",
                                expected=f"1..{len(self.prompts)}", actual=self.n_shards)
        for q in self.quantized:
            if self.assistant_path(q.name) is None:
                raise MtpscopeError("a quantized assistant is not one of the sweep's assistants",
                                    key="--assistant-quant", expected=", ".join(names), actual=q.name)
        return self

    def record_config(self, n_draft: int | None = None) -> RecordConfig:
        """The run parameters of this sweep's tasks with ``n_draft`` drafts per round (None: the
        baseline's plain decoding, which uses only ``max_tokens`` and ``chat``): ``max_tokens``,
        ``hidden`` and ``chat`` from the spec, the rest :class:`RecordConfig`'s defaults (the runner sets
        its actor's ``n_gpu_layers`` and ``n_threads``).

        Raises:
            TraceError: a value :class:`RecordConfig` refuses (:meth:`check` reports it per option).
        """
        kw: dict[str, Any] = {} if n_draft is None else {"n_draft": n_draft}
        return RecordConfig(max_tokens=self.max_tokens, hidden=self.hidden, chat=self.chat, **kw)

    def shard_prompts(self, shard: int) -> tuple[SweepPrompt, ...]:
        """The prompts of ``shard`` in their order there (its trace's prompt_id = position)."""
        return tuple(p for p in self.prompts if p.index % self.n_shards == shard)

    def tasks(self) -> tuple[SweepTask, ...]:
        """Every task, in the order they start: assistant, then shard, then n_draft, each shard's plain
        decoding after its n_drafts. The cells of one assistant are interleaved shard by shard, so a change
        of the machine's speed during the sweep (a shared or throttling machine) hits every n_draft and
        the baseline alike instead of biasing the cells run first or last."""
        out = []
        for i, (a, _) in enumerate(self.assistants):
            for s in range(self.n_shards):
                out += [SweepTask(a, k, s) for k in self.n_drafts]
                if self.baseline and i == 0:
                    out.append(SweepTask(BASELINE, 0, s))
        return tuple(out)

    def assistant_path(self, name: str) -> str | None:
        """The GGUF path of an assistant name (None for the baseline)."""
        return dict(self.assistants).get(name)

    def to_dict(self) -> dict[str, Any]:
        """The ``spec`` object of ``sweep.json`` (prompts are stored beside it, see :func:`new_state`)."""
        return {"target": self.target, "assistants": [{"name": n, "path": p} for n, p in self.assistants],
                "n_draft": list(self.n_drafts), "shards": self.n_shards, "baseline": self.baseline,
                "max_tokens": self.max_tokens, "hidden": self.hidden, "chat": self.chat,
                "prompts_file": self.prompts_file, "prompts_sha256": self.prompts_sha256,
                "n_prompts": len(self.prompts), "assistant_quant": [asdict(q) for q in self.quantized]}

    @staticmethod
    def from_state(state: Mapping[str, Any], path: str | os.PathLike[str] = SWEEP_FILE) -> SweepSpec:
        """The spec stored in a ``sweep.json`` dict.

        Raises:
            TraceFormatError: a missing or mistyped key (names it).
        """
        try:
            s = state["spec"]
            prompts = tuple(SweepPrompt.from_dict(p) for p in state["prompts"])
            return SweepSpec(target=str(s["target"]),
                             assistants=tuple((str(a["name"]), str(a["path"])) for a in s["assistants"]),
                             prompts=prompts, n_drafts=tuple(int(k) for k in s["n_draft"]),
                             n_shards=int(s["shards"]), baseline=bool(s["baseline"]),
                             max_tokens=int(s["max_tokens"]), hidden=str(s["hidden"]), chat=bool(s["chat"]),
                             prompts_file=s.get("prompts_file"), prompts_sha256=s.get("prompts_sha256"),
                             quantized=tuple(QuantAssistant(str(q["name"]), str(q["qtype"]), str(q["source"]),
                                                            str(q["source_sha256"]), int(q.get("n_bytes") or 0))
                                             for q in s.get("assistant_quant") or ()))
        except (KeyError, TypeError, ValueError) as e:
            raise TraceFormatError(f"sweep.json spec is malformed ({type(e).__name__}: {e})", path=path,
                                   key="spec", expected="the keys of docs/SWEEP.md", actual="other") from None

    def differences(self, other: SweepSpec) -> list[str]:
        """What differs between two specs, one ``key: this vs other`` string per difference (where the
        prompts came from is not compared, their texts and categories are)."""
        a, b = self.to_dict(), other.to_dict()
        out = [f"{k}: {a[k]!r} vs {b[k]!r}" for k in a if a[k] != b[k] and k not in ("prompts_file", "prompts_sha256")]
        if self.prompts != other.prompts:
            out.append("prompts: texts or categories differ")
        return out


#: a task's name (:attr:`SweepTask.task_id`, :meth:`SweepTask.parse_task_id`), the one home of its format: its
#: fields in order, each ``<field>=<value>``, joined by ``/``, and what a value may be (a regex)
_TASK_ID_FIELDS = (("assistant", r"[^/]+"), ("n_draft", r"[0-9]+"), ("shard", r"[0-9]+"))
_TASK_ID_RE = re.compile("/".join(f"{k}=(?P<{k}>{v})" for k, v in _TASK_ID_FIELDS))
#: the format in words (a refusal's "expected")
TASK_ID_WORDS = "assistant=<name>/n_draft=<k>/shard=<i>"


@dataclass(frozen=True)
class SweepTask:
    """One task: ``assistant`` name (or :data:`BASELINE`), ``n_draft`` (0 for the baseline), ``shard``."""

    assistant: str
    n_draft: int
    shard: int

    @property
    def task_id(self) -> str:
        """``assistant=<a>/n_draft=<k>/shard=<i>``, also the trace's folder below the sweep directory."""
        return "/".join(f"{k}={getattr(self, k)}" for k, _ in _TASK_ID_FIELDS)

    @classmethod
    def parse_task_id(cls, name: str) -> SweepTask | None:
        """The task a name (:attr:`task_id`) names; None when ``name`` is not one."""
        m = _TASK_ID_RE.fullmatch(name)
        return None if m is None else cls(m["assistant"], int(m["n_draft"]), int(m["shard"]))

    @property
    def is_baseline(self) -> bool:
        return self.assistant == BASELINE


@dataclass(frozen=True)
class TaskState:
    """One task's entry in ``sweep.json`` (see the module docstring for the fields)."""

    task: str
    assistant: str
    n_draft: int
    shard: int
    dir: str
    state: str = "pending"
    attempts: int = 0
    worker: str | None = None
    started: str | None = None
    finished: str | None = None
    seconds: float | None = None
    load_seconds: float | None = None
    n_prompts: int | None = None
    n_rounds: int | None = None
    n_generated: int | None = None
    n_drafted: int | None = None
    n_accepted: int | None = None
    tokens_per_s: float | None = None
    acceptance_rate: float | None = None
    error: str | None = None
    stderr_tail: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def fresh(task: SweepTask) -> TaskState:
        return TaskState(task=task.task_id, assistant=task.assistant, n_draft=task.n_draft, shard=task.shard,
                         dir=task.task_id)

    def with_(self, **kw: Any) -> TaskState:
        return replace(self, **kw)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if not d["extra"]:
            d.pop("extra")
        return d

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> TaskState:
        known = set(TaskState.__dataclass_fields__)
        kw = {k: v for k, v in d.items() if k in known}
        return TaskState(**kw)


# ------------------------------------------------------------------------------------------ sweep.json

def new_state(spec: SweepSpec, *, command: Sequence[str], ray: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A fresh ``sweep.json`` dict: every task pending."""
    prompts = []
    for s in range(spec.n_shards):
        for pid, p in enumerate(spec.shard_prompts(s)):
            prompts.append({**p.to_dict(), "shard": s, "prompt_id": pid})
    prompts.sort(key=lambda d: d["index"])
    t = now()
    return {"sweep_version": SWEEP_VERSION, "created": t, "updated": t, "command": list(command),
            "complete": False, "spec": spec.to_dict(), "prompts": prompts, "ray": dict(ray or {}),
            "tasks": [TaskState.fresh(x).to_dict() for x in spec.tasks()]}


def write_state(out: str | os.PathLike[str], state: dict[str, Any]) -> None:
    """Write ``DIR/sweep.json`` atomically (temporary file in the same folder, then ``os.replace``)."""
    p = Path(out) / SWEEP_FILE
    state["updated"] = now()
    tmp = p.with_name(f".{SWEEP_FILE}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(state, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, p)


def sweep_of(path: str | os.PathLike[str], levels: int = 3) -> Path | None:
    """The sweep directory ``path`` lies inside (``path`` itself excluded; up to ``levels`` folders up), or
    None: a configuration folder ``DIR/assistant=A/n_draft=N`` holds no trace of its own."""
    p = Path(path).resolve()
    for parent in list(p.parents)[:levels]:
        if is_sweep(parent):
            return parent
    return None


def is_sweep(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a directory holding a ``sweep.json``."""
    return (Path(path) / SWEEP_FILE).is_file()


#: the typed keys of a prompt entry and of a task entry in sweep.json (:func:`read_state`)
_PROMPT_KINDS: tuple[tuple[str, type[int] | type[str]], ...] = (
    ("index", int), ("shard", int), ("prompt_id", int), ("text", str), ("category", str))
_TASK_KINDS: tuple[tuple[str, type[int] | type[str]], ...] = (
    ("task", str), ("assistant", str), ("n_draft", int), ("shard", int))


def read_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    """``DIR/sweep.json`` parsed and checked (version; prompts with index, shard, prompt_id, text and
    category, each once, its shard one of ``spec.shards``, its category not :data:`ALL`; tasks with task,
    assistant, n_draft, shard, dir and a known state, each once, its fields agreeing with its name and folder
    (:func:`_check_task_names`)).

    Raises:
        TraceFormatError: not a sweep directory, unreadable or malformed ``sweep.json`` (names the
            offset or key, e.g. ``tasks[3].n_draft``).
    """
    p = Path(path) / SWEEP_FILE
    if not Path(path).is_dir():
        raise TraceFormatError("not a sweep directory", path=path, expected=f"a directory with {SWEEP_FILE}",
                               actual="missing" if not Path(path).exists() else "not a directory")
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise TraceFormatError(f"not a sweep directory (no {SWEEP_FILE})", path=p, expected=SWEEP_FILE,
                               actual="missing") from None
    try:
        state = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise TraceFormatError("sweep.json is not UTF-8", path=p, offset=e.start) from None
    except json.JSONDecodeError as e:
        raise TraceFormatError(f"sweep.json is not valid JSON: {e.msg}", path=p, offset=e.pos) from None
    except RecursionError:
        raise TraceFormatError("sweep.json is nested too deeply", path=p) from None
    if not isinstance(state, dict):
        raise TraceFormatError("sweep.json is not an object", path=p, expected="object", actual=type(state).__name__)
    if state.get("sweep_version") != SWEEP_VERSION:
        raise TraceFormatError("unsupported sweep version", path=p, key="sweep_version",
                               expected=SWEEP_VERSION, actual=state.get("sweep_version"))
    for key, container in (("spec", dict), ("prompts", list), ("tasks", list)):
        if not isinstance(state.get(key), container):
            raise TraceFormatError("sweep.json key missing or of the wrong type", path=p, key=key,
                                   expected=container.__name__,
                                   actual="missing" if key not in state else type(state.get(key)).__name__)
    shards = state["spec"].get("shards")
    n_shards = shards if isinstance(shards, int) and not isinstance(shards, bool) and shards >= 1 else None
    at: dict[Any, int] = {}
    indices: dict[Any, int] = {}
    for i, q in enumerate(state["prompts"]):
        if not isinstance(q, dict):
            raise TraceFormatError("malformed prompt entry", path=p, key=f"prompts[{i}]",
                                   expected="object", actual=type(q).__name__)
        for k, kind in _PROMPT_KINDS:
            v = q.get(k)
            if not isinstance(v, kind) or isinstance(v, bool) or (isinstance(v, int) and v < 0):
                raise TraceFormatError("malformed prompt entry", path=p, key=f"prompts[{i}].{k}",
                                       expected="int >= 0" if kind is int else "string",
                                       actual="missing" if k not in q else repr(v)[:40])
        _in_shards(p, f"prompts[{i}].shard", q["shard"], n_shards)
        if q["category"] == ALL:                                # the report's totals row has this name
            raise TraceFormatError(f"the category {ALL!r} is reserved for the totals over all prompts", path=p,
                                   key=f"prompts[{i}].category", expected=f"a category other than {ALL!r}",
                                   actual=repr(q["category"]))
        _once(p, "prompt", i, f"prompts[{i}]", at, (q["shard"], q["prompt_id"]),
              f"shard {q['shard']} prompt_id {q['prompt_id']}")
        _once(p, "prompt", i, f"prompts[{i}].index", indices, q["index"], f"index {q['index']}")
    tasks: dict[Any, int] = {}
    for i, t in enumerate(state["tasks"]):
        if not isinstance(t, dict):
            raise TraceFormatError("malformed task entry", path=p, key=f"tasks[{i}]", expected="object",
                                   actual=type(t).__name__)
        if t.get("state") not in STATES:
            raise TraceFormatError("malformed task entry", path=p, key=f"tasks[{i}].state",
                                   expected=f"one of {', '.join(STATES)}",
                                   actual="missing" if "state" not in t else repr(t["state"])[:40])
        for k, kind in _TASK_KINDS:
            v = t.get(k)
            if not isinstance(v, kind) or isinstance(v, bool) or (isinstance(v, int) and v < 0):
                raise TraceFormatError("malformed task entry", path=p, key=f"tasks[{i}].{k}",
                                       expected="int >= 0" if kind is int else "string",
                                       actual="missing" if k not in t else repr(v)[:40])
        if not isinstance(t.get("dir"), str):
            raise TraceFormatError("malformed task entry", path=p, key=f"tasks[{i}].dir", expected="string",
                                   actual="missing" if "dir" not in t else repr(t["dir"])[:40])
        d = Path(t["dir"])
        if d.is_absolute() or ".." in d.parts:
            raise TraceFormatError("task folder must lie inside the sweep directory", path=p,
                                   key=f"tasks[{i}].dir", expected="a relative path", actual=t["dir"])
        _check_task_names(p, i, t, n_shards)
        _once(p, "task", i, f"tasks[{i}]", tasks, (t["assistant"], t["n_draft"], t["shard"]), t["task"])
    return state


def _check_task_names(p: Path, i: int, t: Mapping[str, Any], n_shards: int | None) -> None:
    """Refuse (naming ``tasks[i].<field>``) a task entry whose ``assistant`` / ``n_draft`` / ``shard`` disagree
    with its name (``task``) or folder (``dir``: the sweep reader labels rows by its ``key=value`` parts), or
    whose shard is not one of the sweep's: its rounds would be reported under another label or join no prompt."""
    want = SweepTask(t["assistant"], t["n_draft"], t["shard"]).task_id
    named = SweepTask.parse_task_id(t["task"])
    if named is None:
        raise TraceFormatError("malformed task entry", path=p, key=f"tasks[{i}].task", expected=TASK_ID_WORDS,
                               actual=repr(t["task"])[:60])
    for k, v in (("assistant", named.assistant), ("n_draft", named.n_draft), ("shard", named.shard)):
        if t[k] != v:
            raise TraceFormatError("the task entry disagrees with its name", path=p, key=f"tasks[{i}].{k}",
                                   expected=f"{v!r} (its task {t['task']!r})", actual=repr(t[k]))
    if Path(t["dir"]).parts != Path(want).parts:
        raise TraceFormatError("the task's folder is not its name", path=p, key=f"tasks[{i}].dir",
                               expected=repr(want), actual=repr(t["dir"])[:80])
    _in_shards(p, f"tasks[{i}].shard", t["shard"], n_shards)


def _in_shards(p: Path, key: str, shard: int, n_shards: int | None) -> None:
    """Refuse a shard outside ``0..n_shards - 1`` (its rows would join nothing and be left out silently)."""
    if n_shards is not None and shard >= n_shards:
        raise TraceFormatError("not one of the sweep's shards", path=p, key=key,
                               expected=f"0..{n_shards - 1} (spec.shards = {n_shards})", actual=shard)


def _once(p: Path, what: str, i: int, key: str, seen: dict[Any, int], value: Any, name: str) -> None:
    """Refuse entry ``i`` of ``what`` (``prompt`` / ``task``) whose ``value`` an earlier one has (its rows would be
    counted twice), naming ``key``."""
    j = seen.setdefault(value, i)
    if j != i:
        raise TraceFormatError(f"{what} listed twice", path=p, key=key, expected=f"each {what} once",
                               actual=f"{name} again (also {what}s[{j}])")


def task_states(state: Mapping[str, Any]) -> list[TaskState]:
    """The ``tasks`` of a ``sweep.json`` dict as records."""
    return [TaskState.from_dict(t) for t in state["tasks"]]


def check_out_dir(out: str | os.PathLike[str], resume: bool) -> None:
    """Refuse to start a new sweep over an existing one (without ``resume``) or in a trace folder.

    Raises:
        TraceError: naming the folder.
    """
    p = Path(out)
    if (p / MANIFEST).exists():
        raise TraceError("this folder holds a trace, not a sweep; choose another --out", path=p)
    if is_sweep(p) and not resume:
        raise TraceError("this folder already holds a sweep (pass --resume to finish it)", path=p,
                         expected="an empty or new folder", actual=f"{SWEEP_FILE} present")
    if resume and not is_sweep(p):
        raise TraceError("--resume: no sweep here", path=p, expected=SWEEP_FILE, actual="missing")
