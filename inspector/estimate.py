"""Memory estimate for a Gemma 4 target and its MTP drafter in llama.cpp: weights, KV cache, buffers.

The rules are llama.cpp's, as vendored by llama-cpp-python 0.3.36 (file names below are under its
``src/``), and are checked in tests/test_estimate.py against the sizes llama.cpp itself logs when it
loads the models and creates the contexts (captured through ``traces.run.llama.logs.capture_log``).

**Weights** (exact): the sum of the tensors' bytes (``llama_model_size``). Per device
(``llama-model.cpp`` ``load_tensors``): with ``n_gpu_layers = g`` (negative = all) layer ``il`` is on the
GPU when ``il >= n_layer + 1 - g``, the output layer (index ``n_layer``) when ``g >= 1``; the input
layer (``token_embd``) always stays on the CPU, so a tied output head (Gemma: ``output`` = ``token_embd``,
``TENSOR_DUPLICATED``) puts a second copy of ``token_embd`` on the GPU. The drafter has no "layers" in
that count (``llama_model_n_layer`` is 0 for it); here it goes to the GPU whole when ``g != 0``.
The per-device split is read from the source and not checked on a GPU here (no GPU on the test machines).

**KV cache** of the target (``llama-kv-cache-iswa.cpp``, ``llama-kv-cache.cpp``, ``llama-context.cpp``):
``n_ctx`` is padded to 256 (0 = the model's ``context_length``); with ``n_parallel = p`` sequences
and a non-unified cache each of ``p`` streams holds ``pad256(n_ctx / p)`` cells. Full-attention layers
hold all cells; sliding-window layers hold ``pad256(min(cells, n_swa * (unified ? p : 1) + n_ubatch))``
(all cells with ``swa_full``; llama-server's default is off, the library's ``llama_context_default_params``
on). Layers at or past ``n_layer - shared_kv_layers`` reuse earlier layers' cache and hold none. A layer
holds ``cells * row_size(type_k, n_head_kv(il) * head_dim_k(il))`` for K and the same for V with
``head_dim_v``; without flash attention V is stored transposed and every layer's V row is padded to
the widest (``n_embd_v_gqa_max``; Gemma 4 mixes 256- and 512-wide heads, so this matters).

**Drafter KV**: none. The ``gemma4-assistant`` MTP context shares the target's cache (``share`` callback in
``llama-model.cpp``: sliding layers read target layer ``n_layer - 2``, full ones ``n_layer - 1``, which on a
target with KV-shared layers are themselves the caches of layers ``n_kv - 2`` / ``n_kv - 1``,
:meth:`layouts.HParams.kv_owner`); llama.cpp still logs a "size" line for the shared layers, but allocates no
buffer.

**Output buffer** (exact at context creation): ``n_vocab * 4`` bytes per sequence (logits of one row).

**Compute buffer**: an estimate, not exact. llama.cpp reserves the graph of one ``n_ubatch`` step and
ggml's allocator reuses memory between ops; the peak is modelled as the larger of the layer phase
(one KQ mask per cache, ``cells * n_ubatch``, f16 with flash attention and f32 without; the residual;
the per-layer embeddings when the model has them, ``n_embd_per_layer * n_layer * n_ubatch`` f32 twice, alive
through every layer; and the larger of the FFN — 4 live ``n_ff * n_ubatch`` f32 tensors, or with the MoE block
the experts' ``gate_up`` / ``geglu`` / ``down`` of the ``n_expert_used`` chosen experts plus the dense MLP's
output — and the attention: q and its output, plus without flash attention the KQ scores of the widest layer,
``n_head * cells * n_ubatch * 4``) and the output phase (the logits of ``n_ubatch`` rows,
``n_vocab * n_ubatch * 4``, and four ``n_embd`` rows per token of the residual stream still alive: the last layer's
output, the output norm, its weighted copy, the rows picked for output). ggml's best-fit allocator (``ggml-alloc.c``) frees the KQ masks after the last
layer, but whether the logits then fit into their freed block depends on where it placed a few small tensors
(the output rows' ``result_norm``, ``out_ids``): seen both ways on the tiny family targets and on the real-size
E2B. So the estimate has two outcomes: ``compute_bytes`` (the block reused) and ``compute_bytes_max`` (the
logits above what the graph allocated first: the masks, or with per-layer embeddings about three
``n_embd_per_layer * n_layer * n_ubatch`` f32 tensors of their input chain when those are larger); the totals use the larger, to plan
with. Measured against llama.cpp on the models
in tests/test_estimate.py and tests/test_families.py llama.cpp's buffer lies within :data:`COMPUTE_TOLERANCE`
of one of the two (see there).

Shapes: sizes are bytes; widths in elements.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from mtpscope.errors import LayoutError
from mtpscope.inspector import layouts as L

#: KV cache types llama.cpp accepts for ``--cache-type-k/v``: name -> (block size, bytes per block)
#: (ggml/src/ggml.c type traits).
CACHE_TYPES: dict[str, tuple[int, int]] = {
    "f32": (1, 4), "f16": (1, 2), "bf16": (1, 2), "q8_0": (32, 34), "q4_0": (32, 18), "q4_1": (32, 20),
    "iq4_nl": (32, 18), "q5_0": (32, 22), "q5_1": (32, 24),
}

COMPUTE_NOTE = ("compute buffer: estimated from the largest phase of one n_ubatch graph step (masks + max of "
                "logits, FFN, KQ scores); ggml's allocator decides the real peak, and whether the logits reuse "
                "what the first-allocated inputs free: the totals take the larger outcome")
GPU_NOTE = ("per-device split from llama.cpp's layer assignment rules (src/llama-model.cpp); checked on CPU only")

MiB = 1 << 20
#: the largest n_ctx whose padding to 256 cells (``llama-context.cpp``) fits llama.cpp's uint32_t ``n_ctx``
N_CTX_MAX = (2**32 - 1) // 256 * 256
#: Relative error of the compute-buffer estimate against llama.cpp's reports on the models tried (CPU): within
#: this of ``compute_bytes`` or of ``compute_bytes_max`` (largest seen 0.08, the E4B-like tiny drafter).
COMPUTE_TOLERANCE = 0.10


def _pad(x: int, n: int) -> int:
    return -(-x // n) * n


def row_size(type_name: str, n: int) -> int:
    """Bytes of ``n`` elements of a cache type (``ggml_row_size``).

    Raises:
        LayoutError: unknown type, or ``n`` not a multiple of the type's block size.
    """
    t = CACHE_TYPES.get(type_name.lower())
    if t is None:
        raise LayoutError("unknown KV cache type", key="cache type", expected=" | ".join(CACHE_TYPES),
                          actual=type_name)
    bs, ts = t
    if n % bs:
        raise LayoutError(f"KV row of {n} elements is not a multiple of the {type_name} block size", key="cache type",
                          expected=f"a multiple of {bs}", actual=n)
    return n // bs * ts


#: the most sequences a llama.cpp context takes (src/llama-cparams.h ``LLAMA_MAX_SEQ``)
LLAMA_MAX_SEQ = 256


@dataclass(frozen=True)
class EstimateParams:
    """llama.cpp context settings the estimate depends on (llama-server / ``llama_context_params`` names).

    Attributes:
        n_ctx: context size in tokens (0 = the target's ``context_length``).
        n_parallel: sequences (``n_seq_max`` / ``--parallel``), 1 to :data:`LLAMA_MAX_SEQ`.
        kv_unified: one cache shared by all sequences (``--kv-unified``).
        cache_type_k / cache_type_v: ``f16``, ``q8_0``, ... (``--cache-type-k/-v``).
        flash_attn: flash attention on (llama.cpp's ``auto`` turns it on where the backend has it, which
            CPU and CUDA do; a quantized V cache requires it).
        swa_full: sliding layers hold the whole context (``--swa-full``).
        n_batch: logical batch (``--batch-size``, llama-server's default 2048).
        n_ubatch: physical batch (``--ubatch-size``, default 512). llama.cpp takes ``n_batch = min(n_ctx, n_batch)``
            (causal attention) and ``n_ubatch = min(n_batch, n_ubatch)`` (``src/llama-context.cpp``, the context's
            constructor): :func:`estimate` does the same, and its ``params`` hold the values it took.
        n_gpu_layers: layers on the GPU (``-ngl``; negative = all, 0 = CPU only).
    """

    n_ctx: int = 8192
    n_parallel: int = 1
    kv_unified: bool = False
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: bool = True
    swa_full: bool = False
    n_ubatch: int = 512
    n_gpu_layers: int = 0
    n_batch: int = 2048


@dataclass(frozen=True)
class LayerKV:
    """The KV cache of one target layer.

    Attributes:
        il: layer index. sliding: sliding-window layer. reuses: the layer whose cache it reads (shared KV),
            or None when it holds its own. n_head_kv, head_dim_k, head_dim_v: as the file says.
        cells: cells per stream; n_stream: streams. k_bytes / v_bytes: bytes it holds (0 when shared).
        device: ``CPU`` or ``GPU``.
    """

    il: int
    sliding: bool
    reuses: int | None
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    cells: int
    n_stream: int
    k_bytes: int
    v_bytes: int
    device: str


@dataclass(frozen=True)
class ModelEstimate:
    """One model's part.

    Attributes:
        path: the file. role: ``target`` or ``drafter``. arch: its architecture.
        weights: bytes of all tensors. weights_by_device: {device: bytes} (a tied output head on the GPU
            counts token_embd twice, see the module docstring).
        kv_layers: per-layer KV (target; empty for the drafter). kv_k / kv_v: totals.
        kv_shared_from: for the drafter, the target layers it reads ({"sliding": il, "full": il}).
        output_bytes: output buffer at context creation. compute_bytes: compute buffer estimate when ggml's
            allocator reuses the KQ masks' block for the logits; compute_bytes_max: when it does not (see the
            module docstring; equal when the masks outlast nothing).
    """

    path: str
    role: str
    arch: str | None
    weights: int
    weights_by_device: dict[str, int]
    kv_layers: tuple[LayerKV, ...] = ()
    kv_k: int = 0
    kv_v: int = 0
    kv_shared_from: dict[str, int] | None = None
    output_bytes: int = 0
    compute_bytes: int = 0
    compute_bytes_max: int = 0

    @property
    def kv(self) -> int:
        return self.kv_k + self.kv_v


@dataclass(frozen=True)
class MemoryEstimate:
    """The estimate for a target (and drafter).

    Attributes:
        params: the settings. n_ctx: cells after llama.cpp's padding (all streams). cells_full /
            cells_swa: cells per stream of the full and sliding layers.
        target / drafter: :class:`ModelEstimate` (drafter None when not given).
        by_device: {device: {"weights", "kv", "output", "compute", "total"}} bytes.
        total: everything. notes: what is estimated rather than exact, and why.
    """

    params: EstimateParams
    n_ctx: int
    cells_full: int
    cells_swa: int
    target: ModelEstimate
    drafter: ModelEstimate | None
    by_device: dict[str, dict[str, int]]
    total: int
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (bytes)."""
        import dataclasses

        def model(m: ModelEstimate | None) -> dict[str, Any] | None:
            if m is None:
                return None
            d = dataclasses.asdict(m)
            d["kv"] = m.kv
            return d

        return {"params": dataclasses.asdict(self.params), "n_ctx": self.n_ctx, "cells_full": self.cells_full,
                "cells_swa": self.cells_swa, "target": model(self.target), "drafter": model(self.drafter),
                "by_device": self.by_device, "total": self.total, "notes": list(self.notes), "unit": "bytes"}


def _weights_by_device(f: Any, hp: L.HParams, n_gpu_layers: int, drafter: bool) -> dict[str, int]:
    from mtpscope.inspector.inventory import classify

    if n_gpu_layers == 0:
        return {"CPU": sum(t.n_bytes or 0 for t in f.tensors)}
    if drafter:
        return {"GPU": sum(t.n_bytes or 0 for t in f.tensors)}
    n = hp.n_layer
    g = n + 1 if n_gpu_layers < 0 else n_gpu_layers
    start = max(n + 1 - g, 0)
    out = {"CPU": 0, "GPU": 0}
    names = {t.name for t in f.tensors}
    for t in f.tensors:
        _, il = classify(t.name)
        nb = t.n_bytes or 0
        if t.name == "token_embd.weight":
            out["CPU"] += nb
            if "output.weight" not in names and n >= start:  # tied head duplicated on the output device
                out["GPU"] += nb
        elif il is not None:
            out["GPU" if il >= start else "CPU"] += nb
        elif t.name == "rope_freqs.weight":
            first_full = next((ly.il for ly in hp.layers if not ly.sliding), n)
            out["GPU" if first_full >= start else "CPU"] += nb
        else:  # output_norm, output: the output layer
            out["GPU" if n >= start else "CPU"] += nb
    return {k: v for k, v in out.items() if v or k == "CPU"}


def _compute(hp: L.HParams, n_vocab: int, cells: list[tuple[int, int]], p: EstimateParams,
             drafter: bool) -> tuple[int, int]:
    """Compute-buffer estimate (bytes) for one graph of ``n_ubatch`` tokens; see the module docstring.

    ``cells``: (cells, n_layers) of each KV cache the graph masks (full, sliding). The peak is the
    larger of two phases (ggml's allocator frees a tensor after its last use, inputs included): the
    layers (the masks, the residual, the per-layer embeddings, and the larger of attention and FFN / MoE)
    and the output (the logits of ``n_ubatch`` rows and the residual). Returns ``(low, high)``: high also
    keeps the masks beside the logits (their freed block not reused).
    """
    ub = p.n_ubatch
    ub_pad = _pad(ub, 64)  # GGML_KQ_MASK_PAD
    masks = sum(c for c, n in cells if n) * ub_pad * (2 if p.flash_attn else 4)
    q_width = max((ly.n_head * ly.head_dim for ly in hp.layers), default=0)
    attn = 3 * q_width * ub * 4  # q, the attention output, its contiguous copy
    if not p.flash_attn:  # the KQ scores of the widest layer (soft_max works in place)
        kq = 0
        for (c, n), sliding in zip(cells, (False, True)):
            if n:
                heads = max((ly.n_head for ly in hp.layers if ly.sliding == sliding), default=0)
                kq = max(kq, heads * c * ub * 4)
        attn += kq
    ffn = 4 * max((ly.n_ff for ly in hp.layers), default=0) * ub * 4
    if hp.n_expert and not drafter:
        # the chosen experts' gate_up (2 n_ff_exp), geglu (n_ff_exp) and down (n_embd) rows, beside the dense MLP
        used = int(L._scalar(hp.raw.get(f"{hp.arch}.expert_used_count")) or 0)
        ffn = max(ffn, ((3 * hp.n_ff_exp + hp.n_embd) * used + hp.n_embd) * ub * 4)
    ple = hp.n_embd_per_layer * hp.n_layer * ub * 4 if not drafter else 0  # one [n_embd_per_layer * n_layer, ub]
    resid = 2 * hp.n_embd * ub * 4
    layer = masks + max(attn, ffn) + resid + 2 * ple
    # the logits, beside what of the residual stream is still alive: the last layer's output, the output norm,
    # its weighted copy and the rows picked for output (4 x n_embd per token)
    out = n_vocab * ub * 4 + 2 * resid
    # the graph's inputs (masks) and the per-layer embeddings' chain (get_rows, projection, norm, sum: about three
    # of them) are allocated first, at the bottom of the buffer; when what they free cannot hold the logits, the
    # logits go above the larger of the two (measured: tiny and real-size E2B / E4B at 4k and 128k, within 1 %)
    return max(layer, out), max(layer, out + max(masks, 3 * ple))


def _target_kv(f: Any, hp: L.HParams, p: EstimateParams) -> tuple[list[LayerKV], int, int, int]:
    ctx_train = L._scalar(f.get(f"{hp.arch}.context_length")) or 0
    n_ctx = p.n_ctx or int(ctx_train)
    if n_ctx <= 0:
        raise LayoutError("n_ctx is 0 and the file has no context_length", path=f.path,
                          key=f"{hp.arch}.context_length", expected="> 0", actual=n_ctx)
    if _pad(n_ctx, 256) > N_CTX_MAX:       # (llama.cpp's n_ctx is uint32_t: the padded size would wrap)
        raise LayoutError("n_ctx padded to 256 cells is past llama.cpp's uint32_t n_ctx", path=f.path, key="n_ctx",
                          expected=f"<= {N_CTX_MAX}", actual=n_ctx)
    n_ctx = _pad(n_ctx, 256)
    seqs = max(1, p.n_parallel)
    if p.kv_unified:
        cells, n_stream = n_ctx, 1
    else:
        cells, n_stream = _pad(n_ctx // seqs, 256), seqs
    n_swa = hp.sliding_window or 0
    cells_swa = cells if p.swa_full else _pad(min(cells, n_swa * (seqs if p.kv_unified else 1) + p.n_ubatch), 256)
    kv_start = hp.n_layer - hp.shared_kv_layers
    arch = hp.arch
    # llama.cpp's load_hparams (src/llama-model.cpp): value_length defaults to n_embd / n_head (of layer 0), and
    # value_length_swa to the full layers' value length (not to key_length_swa)
    n_head0 = hp.layers[0].n_head if hp.layers else 0
    vl_full = (L._scalar(f.get(f"{arch}.attention.value_length"))
               or (hp.n_embd // n_head0 if n_head0 else hp.head_dim_full))
    vl_swa = L._scalar(f.get(f"{arch}.attention.value_length_swa")) or vl_full
    v_max = max((ly.n_head_kv * (vl_swa if ly.sliding else vl_full) for ly in hp.layers), default=0)
    g = p.n_gpu_layers
    start = max(hp.n_layer + 1 - (hp.n_layer + 1 if g < 0 else g), 0) if g else hp.n_layer + 1
    out: list[LayerKV] = []
    for ly in hp.layers:
        hd_v = vl_swa if ly.sliding else vl_full
        c = cells_swa if ly.sliding else cells
        dev = "GPU" if ly.il >= start else "CPU"
        if ly.il >= kv_start:
            reuse = hp.kv_owner(ly.il)
            out.append(LayerKV(ly.il, ly.sliding, reuse, ly.n_head_kv, ly.head_dim, hd_v, c, n_stream, 0, 0, dev))
            continue
        k = row_size(p.cache_type_k, ly.n_head_kv * ly.head_dim) * c * n_stream
        v_w = ly.n_head_kv * hd_v if p.flash_attn else v_max
        v = row_size(p.cache_type_v, v_w) * c * n_stream
        out.append(LayerKV(ly.il, ly.sliding, None, ly.n_head_kv, ly.head_dim, hd_v, c, n_stream, k, v, dev))
    return out, cells * n_stream, cells, cells_swa


def estimate(target: Any, assistant: Any = None, params: EstimateParams | None = None) -> MemoryEstimate:
    """Memory estimate of a target (and its drafter) under llama.cpp (see the module docstring).

    Args:
        target: the ``gemma4`` target, a path or an open GGUF file, or a model laid out from its HF config
            (:func:`inspector.config_model.model_from_config`: same keys and tensor table, no data).
        assistant: the drafter (``gemma4-assistant`` / ``gemma4_assistant``), or None.
        params: :class:`EstimateParams` (default: n_ctx 8192, f16 cache, flash attention, 1 sequence).

    Returns:
        :class:`MemoryEstimate`.

    Raises:
        LayoutError: the target is not a gemma4 model, hyperparameters are missing, an unknown cache
            type, a quantized V cache without flash attention or more than :data:`LLAMA_MAX_SEQ` sequences
            (llama.cpp refuses both).
        GGUFFormatError & co: a file is unreadable.
    """
    p = params or EstimateParams()
    if not 1 <= p.n_parallel <= LLAMA_MAX_SEQ:
        # src/llama-context.cpp: "n_seq_max must be <= LLAMA_MAX_SEQ" (beyond it, n_ctx / n_seq_max cells can be 0)
        raise LayoutError("llama.cpp refuses this many sequences", key="n_parallel",
                          expected=f"1..{LLAMA_MAX_SEQ} (llama.cpp's LLAMA_MAX_SEQ)", actual=p.n_parallel)
    if p.cache_type_v.lower() not in ("f32", "f16", "bf16") and not p.flash_attn:
        raise LayoutError("a quantized V cache requires flash attention (llama.cpp refuses it)", key="cache type v",
                          expected="flash_attn on, or an f16 / bf16 / f32 V cache", actual=p.cache_type_v)
    tf = _open(target)
    if tf.architecture != L.ARCH_TARGET:
        raise LayoutError("the target must be a gemma4 model", path=tf.path, key="general.architecture",
                          expected=L.ARCH_TARGET, actual=tf.architecture)
    thp = L.read_hparams(tf)
    n_vocab = thp.n_vocab or 0
    ctx = p.n_ctx or int(L._scalar(tf.get(f"{thp.arch}.context_length")) or 0)
    if ctx > 0:     # llama.cpp's clamp (EstimateParams.n_ubatch), on the context before its padding
        n_batch = min(ctx, p.n_batch)
        p = replace(p, n_batch=n_batch, n_ubatch=min(n_batch, p.n_ubatch))
    layers, n_ctx, cells, cells_swa = _target_kv(tf, thp, p)
    n_full = sum(1 for ly in layers if not ly.sliding and ly.reuses is None)
    n_swa = sum(1 for ly in layers if ly.sliding and ly.reuses is None)
    seqs = max(1, p.n_parallel)
    t_comp = _compute(thp, n_vocab, [(cells, n_full), (cells_swa, n_swa)], p, False)
    t_est = ModelEstimate(
        path=str(tf.path), role="target", arch=tf.architecture,
        weights=sum(t.n_bytes or 0 for t in tf.tensors),
        weights_by_device=_weights_by_device(tf, thp, p.n_gpu_layers, False),
        kv_layers=tuple(layers), kv_k=sum(x.k_bytes for x in layers), kv_v=sum(x.v_bytes for x in layers),
        output_bytes=n_vocab * 4 * seqs,
        compute_bytes=t_comp[0], compute_bytes_max=t_comp[1])
    d_est = None
    if assistant is not None:
        df = _open(assistant)
        dhp = L.read_hparams(df)
        if dhp.dialect not in ("fork", "upstream"):
            raise LayoutError("the assistant must be a Gemma 4 drafter", path=df.path, key="general.architecture",
                              expected=f"{L.ARCH_UPSTREAM} | {L.ARCH_FORK}", actual=df.architecture)
        n = thp.n_layer
        d_n_full = sum(1 for ly in dhp.layers if not ly.sliding)
        d_n_swa = sum(1 for ly in dhp.layers if ly.sliding)
        d_comp = _compute(dhp, dhp.n_vocab or n_vocab, [(cells, d_n_full), (cells_swa, d_n_swa)], p, True)
        d_est = ModelEstimate(
            path=str(df.path), role="drafter", arch=df.architecture,
            weights=sum(t.n_bytes or 0 for t in df.tensors),
            weights_by_device=_weights_by_device(df, dhp, p.n_gpu_layers, True),
            kv_shared_from={"sliding": thp.kv_owner(n - 2), "full": thp.kv_owner(n - 1)},
            output_bytes=(dhp.n_vocab or n_vocab) * 4 * seqs,
            compute_bytes=d_comp[0], compute_bytes_max=d_comp[1])
    by_dev: dict[str, dict[str, int]] = {}

    def add(dev: str, what: str, n: int) -> None:
        d = by_dev.setdefault(dev, {"weights": 0, "kv": 0, "output": 0, "compute": 0, "total": 0})
        d[what] += n
        d["total"] += n

    gpu = p.n_gpu_layers != 0
    for m in (t_est, d_est):
        if m is None:
            continue
        for dev, n in m.weights_by_device.items():
            add(dev, "weights", n)
        add("CPU", "output", m.output_bytes)
        add("GPU" if gpu else "CPU", "compute", max(m.compute_bytes, m.compute_bytes_max))
    for ly in layers:
        if ly.k_bytes or ly.v_bytes:
            add(ly.device, "kv", ly.k_bytes + ly.v_bytes)
    notes = [COMPUTE_NOTE]
    if gpu:
        notes.append(GPU_NOTE)
    dup = sum(t_est.weights_by_device.values()) - t_est.weights
    if dup > 0:     # the device table's weights exceed the file's by the tied head's second copy: said, with its size
        notes.append(f"the devices' weights include a second copy of the target's token_embd ({dup / MiB:,.2f} MiB) "
                     "on the GPU: its tied output head is duplicated on the output layer's device (src/llama-model.cpp, "
                     "TENSOR_DUPLICATED), so they add up to more than the files' weights")
    notes += list(getattr(tf, "notes", ()))  # a model laid out from its config.json says what it assumed
    if assistant is not None:
        notes += list(getattr(df, "notes", ()))
    total = sum(d["total"] for d in by_dev.values())
    return MemoryEstimate(p, n_ctx, cells, cells_swa, t_est, d_est, by_dev, total, tuple(notes))


def _open(x: Any) -> Any:
    if hasattr(x, "tensors") and hasattr(x, "get"):
        return x
    from mtpscope.inspector.gguf import open_gguf

    return open_gguf(x)
