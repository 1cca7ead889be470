"""The demo's specification without numpy: dimensions, the sentence, folder paths, the recording
configuration and the stamp hashes, so that ``mtpscope demo build`` can tell in milliseconds that the
demo is current (no numpy import). :mod:`mtpscope.demo.build` re-exports everything here; see it for the
construction and docs/DEMO.md for the story.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import importlib.util
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypedDict

from mtpscope.errors import MtpscopeError
from mtpscope.traces.run.record_config import DEFAULT_N_DRAFT
from mtpscope.traces.store.layout import MANIFEST

#: The sentence the demo target "knows": each word (one real token each, with its leading space)
#: is followed by the next one, the last by the first. Words outside the vocabulary in use are skipped.
DEMO_PASSAGE = ("The quick brown fox jumps over lazy dogs while seven clever wizards quietly pack boxes "
                "with golden liquor , and every sailor sings about distant islands where purple dragons "
                "sleep under silver moons .")

@dataclass(frozen=True)
class TinyDims:
    """Hyperparameters of the tiny pair (all widths in elements).

    ``n_embd_backbone`` is the target's ``embedding_length`` and the drafter's backbone width;
    ``n_embd`` is the drafter's inner width (must differ from ``n_embd_backbone``: the upstream
    loader refuses equal widths). Layer-type patterns: True = sliding window attention.
    """

    n_embd_backbone: int = 64
    n_embd: int = 128
    target_swa: tuple[bool, ...] = (True, True, False, True, True, False)
    drafter_swa: tuple[bool, ...] = (True, True, True, False)
    n_head: int = 2
    n_head_kv: int = 1
    head_dim: int = 64          # full-attention head dim (key_length = value_length)
    head_dim_swa: int = 32      # sliding head dim
    n_ff: int = 128
    sliding_window: int = 128
    context_length: int = 4096
    rms_eps: float = 1e-6       # the target's; the drafter's is scaled (see module doc)
    softcap: float = 30.0
    rope_freq_base: float = 1e6
    rope_freq_base_swa: float = 1e4
    partial_rotary_factor: float = 0.25   # full layers: share of rotated pairs (proportional RoPE)
    memory_gain: float = 0.5    # layer-0 associative memory: gate/up scale
    memory_out: float = 4.0     # layer-0 post_ffw_norm weight (memory dominates the residual)
    random_out: float = 0.25    # layers 1-3 post_ffw_norm weight scale

    @property
    def n_layer_target(self) -> int:
        return len(self.target_swa)

    @property
    def n_layer_drafter(self) -> int:
        return len(self.drafter_swa)


DEFAULT_DIMS = TinyDims()


@dataclass(frozen=True)
class DemoPaths:
    """Every path of a built demo folder (see docs/ARCHITECTURE.md, Demo)."""

    root: Path
    target: Path
    drafter_upstream: Path
    drafter_upstream_noisy: Path
    drafter_fork: Path
    traces_clean: Path
    traces_noisy: Path
    stamp: Path
    record_config: Path

    @classmethod
    def under(cls, root: Path, record_config: Path) -> DemoPaths:
        root = Path(root)
        return cls(root=root, target=root / "target.gguf",
                   drafter_upstream=root / "drafter-upstream.gguf",
                   drafter_upstream_noisy=root / "drafter-upstream-noisy.gguf",
                   drafter_fork=root / "drafter-fork.gguf",
                   traces_clean=root / "traces" / "clean", traces_noisy=root / "traces" / "noisy",
                   stamp=root / "stamp.json", record_config=record_config)

    @property
    def models(self) -> tuple[Path, ...]:
        return (self.target, self.drafter_upstream, self.drafter_upstream_noisy, self.drafter_fork)




#: The demo's recording configuration (prompts, draft length, noise levels, centroid head).
#: Packaged with mtpscope (``mtpscope.sample_configs``), so an installed copy finds it without a checkout.
RECORD_CONFIG = Path(str(importlib.resources.files("mtpscope.sample_configs").joinpath("demo-record.json")))

#: Modules whose source change invalidates the demo models / the demo traces (stamp hash inputs), by
#: import name: the same hash in a checkout and in an installed copy.
_MODEL_SOURCES = ("mtpscope.demo.build", "mtpscope.demo.vocab", "mtpscope.demo.spec", "mtpscope.inspector.gguf_write",
                  "mtpscope.inspector.tokenizer")
_TRACE_SOURCES = ("mtpscope.traces.run.recorder", "mtpscope.traces.run.mtp_runtime", "mtpscope.traces.run.step_analysis",
                  "mtpscope.traces.run.derived",
                  "mtpscope.traces.run.ranking", "mtpscope.traces.run.preflight",
                  "mtpscope.traces.run.llama.binding", "mtpscope.traces.run.llama.logs",
                  "mtpscope.traces.run.llama.process", "mtpscope.traces.run.llama.capture",
                  "mtpscope.traces.run.llama.model",
                  "mtpscope.traces.store.layout", "mtpscope.traces.store.manifest", "mtpscope.traces.store.parts",
                  "mtpscope.traces.store.wal", "mtpscope.traces.store.merge", "mtpscope.traces.store.writer",
                  "mtpscope.traces.store.schema", "mtpscope.traces.store.records", "mtpscope.traces.run.centroid_head",
                  "mtpscope.inspector.centroids")


def _module_source(name: str) -> bytes:
    """The source bytes of module ``name`` (b"<missing>" when it cannot be found), without importing it or
    its package: ``find_spec`` of a submodule would run the package's ``__init__`` (``mtpscope.traces``
    imports pyarrow and numpy), which the stamp check must not pay for."""
    parent, _, leaf = name.rpartition(".")
    try:
        spec = importlib.util.find_spec(parent)  # imports the packages above ``parent``, not ``parent``
    except (ImportError, ValueError):
        spec = None
    for loc in (spec.submodule_search_locations or ()) if spec is not None else ():
        for cand in (Path(loc) / f"{leaf}.py", Path(loc) / leaf / "__init__.py"):
            if cand.is_file():
                return cand.read_bytes()
    return b"<missing>"


def load_record_config(path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Read and check the demo recording configuration (default :data:`RECORD_CONFIG`).

    Raises:
        MtpscopeError: missing or unreadable file, or a missing / mistyped key (named).
    """
    p = Path(path) if path is not None else RECORD_CONFIG
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise MtpscopeError("demo recording configuration not found", path=p) from e
    except json.JSONDecodeError as e:
        raise MtpscopeError(f"invalid JSON: {e.msg}", path=p, offset=e.pos) from e
    need: list[tuple[str, type | tuple[type, ...]]] = [
        ("seed", int), ("vocab", str), ("drafters.clean.noise", (int, float)),
        ("drafters.noisy.noise", (int, float)), ("fork.n_centroids", int), ("fork.centroid_top_k", int),
        ("fork.centroid_misplace", (int, float)), ("record.n_draft", int), ("record.max_tokens", int),
        ("record.prompts", list)]
    for dotted, typ in need:
        cur: Any = cfg
        for part in dotted.split("."):
            if not isinstance(cur, dict) or part not in cur:
                raise MtpscopeError("missing key in the demo recording configuration", path=p, key=dotted)
            cur = cur[part]
        if not isinstance(cur, typ) or isinstance(cur, bool):
            raise MtpscopeError("wrong type in the demo recording configuration", path=p, key=dotted,
                                expected=typ, actual=type(cur).__name__)
    if not cfg["record"]["prompts"] or not all(isinstance(s, str) and s for s in cfg["record"]["prompts"]):
        raise MtpscopeError("prompts must be a non-empty list of non-empty strings", path=p, key="record.prompts")
    return cfg


def _digest(obj: Any, files: tuple[str, ...]) -> str:
    h = hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode("utf-8"))
    for name in files:
        h.update(name.encode("utf-8"))
        h.update(_module_source(name))
    return h.hexdigest()


def models_hash(cfg: dict[str, Any]) -> str:
    """Hash of everything the demo models depend on: builder sources, dims, config (not ``record``),
    and the pinned tokenizer sha256."""
    from mtpscope.cache import VOCAB_SHA256
    inputs = {"dims": asdict(DEFAULT_DIMS), "passage": DEMO_PASSAGE, "vocab_sha256": VOCAB_SHA256,
              "config": {k: v for k, v in cfg.items() if k != "record"}}
    return _digest(inputs, _MODEL_SOURCES)


def traces_hash(cfg: dict[str, Any], models: str) -> str:
    """Hash of what the demo traces depend on: the models' hash, ``record`` config, recorder sources
    and the installed llama-cpp-python version."""
    import importlib.metadata
    try:
        llama_version = importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        llama_version = None
    return _digest({"models": models, "record": cfg["record"], "llama_cpp_python": llama_version},
                   _TRACE_SOURCES)


def _read_stamp(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, json.JSONDecodeError):
        return {}


def _write_stamp(path: Path, stamp: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _trace_complete(d: Path) -> bool:
    m = _read_stamp(d / MANIFEST)
    return bool(m.get("complete"))


# ----------------------------------------------------------------------------------------------
# the trained demo pair (mtpscope.demo.trained): built from the committed compact checkpoints

#: the committed compact checkpoints of the trained pair (written by ``mtpscope demo train``)
TRAINED_DATA = Path(str(importlib.resources.files("mtpscope").joinpath("demo_data")))
#: how the trained pair's traces are recorded (every demo prompt, greedy)
class TrainedRecord(TypedDict):
    """:data:`TRAINED_RECORD`'s keys: the recorder's settings for the trained pair's traces."""

    n_draft: int
    max_tokens: int
    hidden: str
    n_top: int


TRAINED_RECORD: TrainedRecord = {"n_draft": DEFAULT_N_DRAFT, "max_tokens": 64, "hidden": "f16", "n_top": 10}
_TRAINED_SOURCES = ("mtpscope.demo.trained", "mtpscope.demo.spec", "mtpscope.inspector.convert",
                    "mtpscope.inspector.convert_common", "mtpscope.inspector.convert_target",
                    "mtpscope.inspector.hf_names", "mtpscope.inspector.hf_config", "mtpscope.inspector.gguf_write",
                    "mtpscope.inspector.tokenizer",
                    "mtpscope.inspector.safetensors")


@dataclass(frozen=True)
class TrainedPaths:
    """Every path of the trained pair inside a demo folder (``<demo>/trained/``) and the demo's
    ``demo.json`` (which lists each model and trace of the folder with its role)."""

    root: Path
    hf_target: Path
    hf_drafter: Path
    target: Path
    drafter: Path
    drafter_q8_0: Path
    drafter_buggy: Path
    drafter_fork: Path
    sidecar: Path
    traces_f32: Path
    traces_q8_0: Path
    traces_buggy: Path
    stamp: Path
    demo_json: Path

    @classmethod
    def under(cls, demo_root: Path) -> TrainedPaths:
        r = Path(demo_root) / "trained"
        return cls(root=r, hf_target=r / "hf" / "target", hf_drafter=r / "hf" / "drafter", target=r / "target.gguf",
                   drafter=r / "drafter.gguf", drafter_q8_0=r / "drafter-q8_0.gguf",
                   drafter_buggy=r / "drafter-buggy.gguf", drafter_fork=r / "drafter-fork.gguf",
                   sidecar=r / "drafter-centroids.gguf", traces_f32=r / "traces" / "f32",
                   traces_q8_0=r / "traces" / "q8_0", traces_buggy=r / "traces" / "buggy", stamp=r / "stamp.json",
                   demo_json=Path(demo_root) / "demo.json")

    @property
    def models(self) -> tuple[Path, ...]:
        return (self.target, self.drafter, self.drafter_q8_0, self.drafter_buggy, self.drafter_fork, self.sidecar)

    @property
    def traces(self) -> dict[str, Path]:
        """Trace folder per drafter variant: ``f32``, ``q8_0``, ``buggy``."""
        return {"f32": self.traces_f32, "q8_0": self.traces_q8_0, "buggy": self.traces_buggy}


def trained_models_hash(data: Path = TRAINED_DATA) -> str | None:
    """Hash of what the trained pair's GGUFs depend on (``recipe.json``, which carries every committed
    file's sha256, and the builder / converter sources); None when the data is not there."""
    try:
        recipe = (Path(data) / "recipe.json").read_bytes()
    except OSError:
        return None
    from mtpscope.cache import VOCAB_SHA256
    return _digest({"recipe_sha256": hashlib.sha256(recipe).hexdigest(), "vocab_sha256": VOCAB_SHA256},
                   _TRAINED_SOURCES)


def trained_traces_hash(models: str) -> str:
    """Hash of what the trained pair's traces depend on: the models' hash, :data:`TRAINED_RECORD`, the
    recorder sources and the llama-cpp-python version."""
    import importlib.metadata
    try:
        llama_version = importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        llama_version = None
    return _digest({"models": models, "record": TRAINED_RECORD, "llama_cpp_python": llama_version},
                   _TRACE_SOURCES + ("mtpscope.demo.trained",))


def trained_is_current(demo_root: Path, data: Path = TRAINED_DATA) -> bool:
    """True when the trained pair under ``demo_root`` (models, traces, demo.json) matches today's inputs,
    or when there is no trained data to build from."""
    mh = trained_models_hash(data)
    if mh is None:
        return True
    tp = TrainedPaths.under(Path(demo_root))
    stamp = _read_stamp(tp.stamp)
    return stamp.get("models") == mh and all(p.exists() for p in tp.models) and tp.demo_json.exists() and \
        stamp.get("traces") == trained_traces_hash(mh) and all(_trace_complete(d) for d in tp.traces.values())


def demo_is_current(out_dir: str | os.PathLike[str] | None = None, *, config: str | os.PathLike[str] | None = None
                    ) -> bool:
    """True when ``out_dir`` holds models (and, if recorded before, traces) matching today's inputs."""
    from mtpscope.cache import demo_dir
    cfg = load_record_config(config)
    paths = DemoPaths.under(Path(out_dir) if out_dir is not None else demo_dir(), Path(config or RECORD_CONFIG))
    stamp = _read_stamp(paths.stamp)
    mh = models_hash(cfg)
    return stamp.get("models") == mh and all(p.exists() for p in paths.models) and \
        stamp.get("traces") == traces_hash(cfg, mh) and _trace_complete(paths.traces_clean) and \
        _trace_complete(paths.traces_noisy) and trained_is_current(paths.root)
