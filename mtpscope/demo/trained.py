"""The trained demo pair, built from the committed compact checkpoints (numpy only, no torch).

``mtpscope/demo_data/`` holds what :mod:`mtpscope.demo.train` wrote: F16 weights over a compact
vocabulary (the kept ids, one shared row for the rare ids) and the id map. :func:`expand` turns them
into full-vocabulary Hugging Face checkpoints (262,144 rows: kept rows at their ids, a copy of the
shared row at every rare id, zero rows for the unused ids; the drafter's centroid head with its
permutation of all ids). :func:`build_trained` (run by ``mtpscope demo build``) converts them with our
converter into the demo's variants and records their traces with the real llama.cpp:

* ``target.gguf`` (``gemma4``, F16: the weights are F16 already, so nothing is lost);
* ``drafter.gguf`` (upstream ``gemma4-assistant``, F32) + ``drafter-centroids.gguf`` (its centroid head,
  sidecar) and ``drafter-fork.gguf`` (fork dialect with the head inside);
* ``drafter-q8_0.gguf`` (``--outtype q8_0``: a real quantization effect);
* ``drafter-buggy.gguf``: the F32 drafter with ``rope.freq_base_swa`` = ``rope.freq_base`` (1e6 on the
  sliding layers), a conversion bug llama.cpp runs silently; ``verify`` flags it, acceptance drops;
* ``traces/f32``, ``traces/q8_0``, ``traces/buggy``: every demo prompt (``category`` and ``name`` in the
  manifest's prompt entries), greedy, 3 drafts per round, 64 tokens;
* ``<demo>/demo.json``: each model and trace with its role, and the app's default view (the F32 trace,
  the worst category's worst prompt, the buggy trace as trace B).

Rebuilds only what changed (``trained/stamp.json``: :func:`mtpscope.demo.spec.trained_models_hash` /
``trained_traces_hash``).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from mtpscope.cache import sha256_file
from mtpscope.demo.spec import TRAINED_DATA
from mtpscope.errors import MtpscopeError
from mtpscope.inspector.layouts import ARCH_UPSTREAM, GEMMA4_N_VOCAB

N_VOCAB = GEMMA4_N_VOCAB  # the trained pair's checkpoints have the whole Gemma 4 vocabulary
DATA_DIR = TRAINED_DATA  # the one home of the compact checkpoints: mtpscope.demo.spec
#: the drafter variants recorded, by trace name: (role of the drafter in demo.json, its path attribute)
VARIANTS = (("f32", "drafter", "drafter"), ("q8_0", "drafter-q8_0", "drafter_q8_0"),
            ("buggy", "drafter-buggy", "drafter_buggy"))
DATA_FILES = ("target.safetensors", "drafter.safetensors", "ids.safetensors", "target.json", "drafter.json",
              "prompts.json", "recipe.json")


def read_recipe(src: str | os.PathLike[str] = DATA_DIR) -> dict[str, Any]:
    """``recipe.json`` of the compact checkpoints, after checking every listed file's sha256.

    Raises:
        MtpscopeError: a file is missing, unreadable, or differs from the hash the recipe recorded.
    """
    src = Path(src)
    try:
        rec = json.loads((src / "recipe.json").read_text())
    except (OSError, ValueError) as e:
        raise MtpscopeError(f"cannot read the demo recipe: {e}", path=src / "recipe.json") from e
    for name, want in rec.get("files", {}).items():
        p = src / name
        if not p.is_file() or sha256_file(p) != want:
            raise MtpscopeError("demo checkpoint file missing or changed", path=p, expected=want)
    return rec


def read_prompts(src: str | os.PathLike[str] = DATA_DIR) -> list[dict[str, Any]]:
    """The categorised demo prompts: ``[{"prompt_id", "category", "name", "text", "ids", ...}]``
    (``ids``: real token ids, BOS first; they are the prompt, the text is for people)."""
    return json.loads((Path(src) / "prompts.json").read_text())["prompts"]


def expand_rows(compact: np.ndarray, ids: np.ndarray, rare: np.ndarray, n_vocab: int = N_VOCAB) -> np.ndarray:
    """Full-vocabulary rows from compact rows [n_kept + 1, n_embd]: row ``ids[i]`` = compact row i, every
    rare id = compact row ``n_kept``, all else 0. Returns ``[n_vocab, n_embd]`` in the input's dtype.

    Raises:
        MtpscopeError: the compact table does not have ``len(ids) + 1`` rows.
    """
    if compact.shape[0] != len(ids) + 1:
        raise MtpscopeError("compact embedding rows do not match the id map", key="model.embed_tokens.weight",
                            expected=len(ids) + 1, actual=compact.shape[0])
    full = np.zeros((n_vocab, compact.shape[1]), dtype=compact.dtype)
    full[ids] = compact[: len(ids)]
    if len(rare):
        full[rare] = compact[len(ids)]
    return full


def expand(out: str | os.PathLike[str], src: str | os.PathLike[str] = DATA_DIR) -> tuple[Path, Path]:
    """Write the full-vocabulary HF checkpoints ``out/target`` (``Gemma4ForCausalLM``) and ``out/drafter``
    (``Gemma4AssistantForCausalLM`` with its centroid head), F16 safetensors + ``config.json``.

    Returns:
        (target folder, drafter folder).

    Raises:
        MtpscopeError: the compact files are missing or changed (:func:`read_recipe`).
    """
    from mtpscope.inspector.safetensors import read_safetensors, write_safetensors

    src, out = Path(src), Path(out)
    read_recipe(src)
    idmap = read_safetensors(src / "ids.safetensors")
    ids, rare = idmap["ids"].astype(np.int64), idmap["rare"].astype(np.int64)
    ordering = np.asarray(idmap["ordering"], dtype=np.int64)
    dirs = []
    for name in ("target", "drafter"):
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        t = {k: np.asarray(v) for k, v in read_safetensors(src / f"{name}.safetensors").items()}
        t["model.embed_tokens.weight"] = expand_rows(t["model.embed_tokens.weight"], ids, rare)
        if name == "drafter":
            t["masked_embedding.token_ordering"] = ordering
        write_safetensors(d / "model.safetensors", t)
        (d / "config.json").write_text((src / f"{name}.json").read_text())
        dirs.append(d)
    return dirs[0], dirs[1]


def write_buggy_swa_base(src: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """Copy a ``gemma4-assistant`` drafter GGUF with ``rope.freq_base_swa`` set to its ``rope.freq_base``
    (the demo's buggy drafter: a converter that writes the full layers' RoPE base, 1e6, for the sliding
    layers too). llama.cpp runs it without a word; the drafter's sliding-layer queries then rotate
    unlike the target's keys they attend to, so acceptance drops. ``verify`` names it (``E_PAIR_ROPE``
    against the target). The FLOAT32 value is patched in place in the copy: the pair starts at the
    key's offset (u64 length, key bytes, u32 value type, then the value; GGUF v3).

    Raises:
        LayoutError: not a ``gemma4-assistant`` file, a RoPE base missing or not FLOAT32.
    """
    from mtpscope.errors import LayoutError
    from mtpscope.inspector.gguf import KeyValue, open_gguf

    src, out = Path(src), Path(out)
    with open_gguf(src) as f:
        if f.architecture != ARCH_UPSTREAM:
            raise LayoutError("not an upstream Gemma 4 drafter", path=src, key="general.architecture",
                              expected=ARCH_UPSTREAM, actual=f.architecture)
        kv = {k: v for k, v in f.kv.items() if k.endswith(("rope.freq_base", "rope.freq_base_swa"))}

        def rope_base(k: str) -> KeyValue:
            e = kv.get(f"{ARCH_UPSTREAM}.{k}")
            if e is None or e.type_name != "FLOAT32":
                raise LayoutError("a RoPE base is missing or not FLOAT32", path=src, key=f"{ARCH_UPSTREAM}.{k}",
                                  expected="FLOAT32", actual=None if e is None else e.type_name)
            return e

        full, swa = rope_base("rope.freq_base"), rope_base("rope.freq_base_swa")
        at = swa.offset + 8 + len(swa.key.encode()) + 4
    tmp = out.with_name(out.name + ".tmp")
    shutil.copyfile(src, tmp)
    with open(tmp, "r+b") as fh:
        fh.seek(at)
        fh.write(np.float32(full.value).astype("<f4").tobytes())
    os.replace(tmp, out)
    return out


def _convert_all(tp: Any, say: Callable[[str], None], data: Path) -> None:
    from mtpscope.inspector.convert import convert

    t0 = time.perf_counter()
    expand(tp.root / "hf", data)
    say(f"  expanded the compact checkpoints to 262144 rows ({time.perf_counter() - t0:.1f} s)")
    convert(tp.hf_target, tp.target, outtype="f16")
    convert(tp.hf_drafter, tp.drafter, dialect="upstream", outtype="f32", centroids_out=tp.sidecar)
    convert(tp.hf_drafter, tp.drafter_q8_0, dialect="upstream", outtype="q8_0")
    convert(tp.hf_drafter, tp.drafter_fork, dialect="fork", outtype="f32")
    write_buggy_swa_base(tp.drafter, tp.drafter_buggy)
    say(f"  converted target, drafter (f32, q8_0, fork, buggy rope.freq_base_swa) and sidecar "
        f"({time.perf_counter() - t0:.1f} s)")


def per_prompt_acceptance(trace_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """``[{"prompt_id", "category", "n_drafted", "n_accepted", "acceptance_rate"}]`` of a recorded trace."""
    from mtpscope.traces.analysis import rates
    from mtpscope.traces.store.reader import open_trace

    tr = open_trace(trace_dir)
    r = tr.columns("rounds", ["prompt_id", "n_draft", "n_accepted"])
    cats = {int(p["prompt_id"]): p.get("category") for p in tr.manifest.get("prompts", [])}
    out = []
    pid: Any  # groupby keys: the prompt ids (numpy ints; pandas-stubs: any Scalar)
    for pid, g in r.groupby("prompt_id", sort=True):
        nd, na = int(g["n_draft"].sum()), int(g["n_accepted"].sum())
        out.append({"prompt_id": int(pid), "category": cats.get(int(pid)), "n_drafted": nd, "n_accepted": na,
                    "acceptance_rate": rates.acceptance_rate(na, nd)})
    return out


def by_category(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Pooled acceptance per category of :func:`per_prompt_acceptance` rows."""
    from mtpscope.traces.analysis import rates

    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        c = out.setdefault(str(r["category"]), {"n_drafted": 0, "n_accepted": 0})
        c["n_drafted"] += r["n_drafted"]
        c["n_accepted"] += r["n_accepted"]
    for c in out.values():
        c["acceptance_rate"] = rates.acceptance_rate(c["n_accepted"], c["n_drafted"])
    return out


def worst_prompt(rows: list[dict[str, Any]]) -> tuple[str | None, int | None]:
    """(worst category, its worst prompt id) by pooled / per-prompt acceptance rate."""
    cats = {k: v for k, v in by_category(rows).items() if v["acceptance_rate"] is not None}
    if not cats:
        return None, None
    worst = min(cats, key=lambda c: (cats[c]["acceptance_rate"], c))
    mine = [r for r in rows if str(r["category"]) == worst and r["acceptance_rate"] is not None]
    pid = min(mine, key=lambda r: (r["acceptance_rate"], r["prompt_id"]))["prompt_id"]
    return worst, int(pid)


def _record_all(tp: Any, say: Callable[[str], None], data: Path) -> dict[str, Any] | None:
    try:
        from mtpscope.traces.run import recorder
        from mtpscope.traces.run.llama.binding import llama
        llama()
    except Exception as e:  # noqa: BLE001 - ImportError, RuntimeUnavailableError: record later
        say(f"trained demo traces skipped: {e}")
        return None
    from mtpscope.demo.spec import TRAINED_RECORD
    from mtpscope.traces.run.prompts import PromptSpec
    from mtpscope.traces.run.record_config import RecordConfig

    prompts = read_prompts(data)
    specs = [PromptSpec(tokens=tuple(p["ids"]), id=p["name"], category=p["category"]) for p in prompts]

    def one(name: str, attr: str) -> dict[str, Any]:
        out = tp.traces[name]
        tmp = out.with_name(out.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        t0 = time.perf_counter()
        config = RecordConfig(n_draft=int(TRAINED_RECORD["n_draft"]), max_tokens=int(TRAINED_RECORD["max_tokens"]),
                              centroids=tp.sidecar if name == "f32" else None, hidden=str(TRAINED_RECORD["hidden"]),
                              n_top=int(TRAINED_RECORD["n_top"]), n_threads=1)
        res = recorder.record(
            config, target=tp.target, assistant=getattr(tp, attr), out=tmp, prompts=specs, overwrite=True,
            command=["mtpscope", "demo", "build"],
            # the recorder's pre-flight refuses the buggy pair (E_PAIR_ROPE, as verify): the demo records it
            # anyway, as `record --no-preflight` would, so that its trace shows what the bug costs
            preflight=name != "buggy")
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, out)
        rows = per_prompt_acceptance(out)
        say(f"  trained {name}: acceptance rate {res.acceptance_rate:.3f} ({res.n_accepted}/{res.n_drafted}) "
            f"in {time.perf_counter() - t0:.1f} s")
        return {"acceptance_rate": res.acceptance_rate, "n_drafted": res.n_drafted, "n_accepted": res.n_accepted,
                "n_rounds": res.n_rounds,
                "categories": {k: round(v["acceptance_rate"], 4) for k, v in by_category(rows).items()
                               if v["acceptance_rate"] is not None},
                "prompts": rows}

    # one after another: a trace's timings are part of it (the what-if prices them, the timing-quality
    # check reads their drift), and recordings side by side share the cores and memory bandwidth, so each
    # one's speed changes when another starts or ends: the demo's advice would read "cannot tell from these
    # timings" (docs/EXPLAIN.md §4). The tokens and counts would be the same either way.
    summary: dict[str, Any] = {name: one(name, attr) for name, _role, attr in VARIANTS}
    return summary


def write_demo_json(demo_root: str | os.PathLike[str], summary: dict[str, Any] | None,
                    stamp: str | None = None) -> Path:
    """``<demo>/demo.json``: every model and trace of the demo folder with its role, and the default
    view (``default``: the trained F32 trace, its worst category's worst prompt, the buggy trace as B)."""
    from mtpscope.demo.spec import RECORD_CONFIG, DemoPaths, TrainedPaths

    root = Path(demo_root)
    tp, cp = TrainedPaths.under(root), DemoPaths.under(root, RECORD_CONFIG)

    def rel(p: Path) -> str:
        return os.path.relpath(p, root)

    models = [{"role": "target", "path": rel(tp.target), "pair": "trained"},
              {"role": "drafter", "path": rel(tp.drafter), "pair": "trained", "dialect": "upstream", "outtype": "f32"},
              {"role": "drafter-q8_0", "path": rel(tp.drafter_q8_0), "pair": "trained", "dialect": "upstream",
               "outtype": "q8_0"},
              {"role": "drafter-buggy", "path": rel(tp.drafter_buggy), "pair": "trained", "dialect": "upstream",
               "bug": "rope.freq_base_swa = rope.freq_base (1e6, the full layers' RoPE base, on the sliding layers)"},
              {"role": "drafter-fork", "path": rel(tp.drafter_fork), "pair": "trained", "dialect": "fork"},
              {"role": "sidecar", "path": rel(tp.sidecar), "pair": "trained", "of": rel(tp.drafter)},
              {"role": "hf-target", "path": rel(tp.hf_target), "pair": "trained"},
              {"role": "hf-drafter", "path": rel(tp.hf_drafter), "pair": "trained"},
              {"role": "target", "path": rel(cp.target), "pair": "constructed"},
              {"role": "drafter", "path": rel(cp.drafter_upstream), "pair": "constructed", "noise": "clean"},
              {"role": "drafter-noisy", "path": rel(cp.drafter_upstream_noisy), "pair": "constructed"},
              {"role": "drafter-fork", "path": rel(cp.drafter_fork), "pair": "constructed"}]
    traces = []
    for name, _role, attr in VARIANTS:
        s = (summary or {}).get(name, {})
        traces.append({"role": f"trace-{name}", "path": rel(tp.traces[name]), "pair": "trained",
                       "drafter": rel(getattr(tp, attr)), "acceptance_rate": s.get("acceptance_rate"),
                       "categories": s.get("categories")})
    traces += [{"role": "trace-clean", "path": rel(cp.traces_clean), "pair": "constructed"},
               {"role": "trace-noisy", "path": rel(cp.traces_noisy), "pair": "constructed"}]
    default: dict[str, Any] = {"trace": rel(tp.traces_f32), "trace_b": rel(tp.traces_buggy),
                               "drafter": rel(tp.drafter_fork), "target": rel(tp.target), "centroids": rel(tp.sidecar)}
    if summary and "f32" in summary:
        cat, pid = worst_prompt(summary["f32"]["prompts"])
        default.update({"category": cat, "prompt_id": pid})
    doc = {"schema": 1, "stamp": stamp, "models": models, "traces": traces, "default": default}
    p = tp.demo_json
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, p)
    return p


def build_trained(demo_root: str | os.PathLike[str], *, force: bool = False, traces: bool = True,
                  log: Callable[[str], None] | None = None, data: str | os.PathLike[str] = DATA_DIR) -> Any:
    """Build (or reuse) the trained pair under ``<demo_root>/trained`` and write ``<demo_root>/demo.json``.

    Returns:
        :class:`mtpscope.demo.spec.TrainedPaths`, or None when the package has no trained data.

    Raises:
        MtpscopeError: the committed data is missing or changed; converter / recorder errors.

    ``data``: the compact checkpoints (default: the package's ``demo_data``).
    """
    from mtpscope.demo.spec import (
        TrainedPaths,
        _read_stamp,
        _trace_complete,
        _write_stamp,
        trained_models_hash,
        trained_traces_hash,
    )

    say = log or (lambda _m: None)
    data = Path(data)
    mh = trained_models_hash(data)
    if mh is None:
        return None
    tp = TrainedPaths.under(Path(demo_root))
    tp.root.mkdir(parents=True, exist_ok=True)
    stamp = _read_stamp(tp.stamp)
    if force or stamp.get("models") != mh or not all(p.exists() for p in tp.models):
        say(f"writing the trained demo pair into {tp.root}")
        read_recipe(data)
        _convert_all(tp, say, data)
        stamp = {"models": mh, "traces": None, "summary": None}
        _write_stamp(tp.stamp, stamp)
    if traces:
        th = trained_traces_hash(mh)
        if force or stamp.get("traces") != th or not all(_trace_complete(d) for d in tp.traces.values()):
            summary = _record_all(tp, say, data)
            if summary is not None:
                stamp = {**stamp, "traces": th, "summary": summary}
                _write_stamp(tp.stamp, stamp)
    if force or not tp.demo_json.exists() or json.loads(tp.demo_json.read_text()).get("stamp") != stamp.get("traces"):
        write_demo_json(demo_root, stamp.get("summary"), stamp.get("traces"))
    return tp


__all__ = ["DATA_DIR", "DATA_FILES", "N_VOCAB", "VARIANTS", "build_trained", "by_category", "expand", "expand_rows",
           "per_prompt_acceptance", "read_prompts", "read_recipe", "worst_prompt", "write_buggy_swa_base",
           "write_demo_json"]
