"""CLI command: estimate (see mtpscope/cli/main.py).

``mtpscope estimate --target T [--assistant A] [--n-ctx 8192] [--cache-type-k f16|q8_0 …] [--n-gpu-layers N]
[--n-parallel 1] [--weight-type bf16] [--json]``: memory llama.cpp needs for a Gemma 4 target and its MTP
drafter (weights per device, the target's KV cache, the drafter's none, output and compute buffers); see
inspector/estimate.py for the rules and what is exact. T and A are GGUFs (path, shard or URL) or a Hugging Face
model folder with its ``config.json`` (e.g. ``sample_configs/gemma-4-E2B-it``): then the weights are those
``mtpscope convert --outtype <weight-type>`` would write (inspector/config_model.py). Exit 0; 2 with one line
when a file is unreadable or the settings are impossible.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated, Any

import typer

from mtpscope.cli.common import one_line_errors
from mtpscope.cli.sources import (
    DEFAULT_MAX_HEADER_MIB,
    DEFAULT_TIMEOUT_S,
    AllowFullDownload,
    MaxHeaderMiB,
    Timeout,
    open_source,
)

#: the largest context and batch llama.cpp takes (``llama_context_params``' ``n_ctx`` / ``n_ubatch`` are uint32_t)
UINT32_MAX = 2**32 - 1


def _mib(n: int) -> str:
    return f"{n / 2**20:,.2f} MiB"


def format_text(e: Any) -> str:
    """The estimate as plain text (MiB; 1 MiB = 2**20 bytes, as llama.cpp prints)."""
    p = e.params
    t = e.target
    lines = [f"target    {t.path}", *([f"assistant {e.drafter.path}"] if e.drafter else []),
             f"n_ctx {e.n_ctx} (cells per stream: full {e.cells_full}, sliding {e.cells_swa}), n_parallel "
             f"{p.n_parallel}{' unified' if p.kv_unified else ''}, cache K {p.cache_type_k} V {p.cache_type_v}, "
             f"flash_attn {'on' if p.flash_attn else 'off'}, swa_full {'on' if p.swa_full else 'off'}, "
             f"n_batch {p.n_batch}, n_ubatch {p.n_ubatch}, n_gpu_layers {p.n_gpu_layers}", ""]
    own = [x for x in t.kv_layers if x.reuses is None]
    shared = [x for x in t.kv_layers if x.reuses is not None]
    lines.append(f"target weights {_mib(t.weights)}; KV {_mib(t.kv)} (K {_mib(t.kv_k)}, V {_mib(t.kv_v)}): "
                 f"{sum(1 for x in own if not x.sliding)} full layers x {e.cells_full} cells, "
                 f"{sum(1 for x in own if x.sliding)} sliding layers x {e.cells_swa} cells"
                 + (f", {len(shared)} shared-KV layers hold none" if shared else ""))
    if e.drafter:
        d = e.drafter
        lines.append(f"drafter weights {_mib(d.weights)}; KV none (reads target layers "
                     f"{d.kv_shared_from['sliding']} sliding, {d.kv_shared_from['full']} full)")
    lines += ["", f"{'device':<8} {'weights':>14} {'KV':>14} {'output':>12} {'compute':>14} {'total':>14}"]
    for dev, b in e.by_device.items():
        lines.append(f"{dev:<8} {_mib(b['weights']):>14} {_mib(b['kv']):>14} {_mib(b['output']):>12} "
                     f"{_mib(b['compute']):>14} {_mib(b['total']):>14}")
    lines += [f"{'total':<8} {'':>14} {'':>14} {'':>12} {'':>14} {_mib(e.total):>14}", ""]
    for m in (t, e.drafter):
        if m is not None and m.compute_bytes_max != m.compute_bytes:
            lines.append(f"{m.role} compute {_mib(m.compute_bytes)} when ggml's allocator reuses the KQ masks' "
                         f"block for the logits, {_mib(m.compute_bytes_max)} when not (the totals use the larger)")
    lines += [f"note: {n}" for n in e.notes]
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    """Add ``estimate`` to the root mtpscope app."""

    @app.command()
    def estimate(
        target: Annotated[str, typer.Option("--target", help="the gemma4 target GGUF (path, shard or URL)")],
        assistant: Annotated[str | None, typer.Option("--assistant", help="the MTP drafter GGUF")] = None,
        n_ctx: Annotated[int, typer.Option("--n-ctx", min=0, max=UINT32_MAX,
                                           help="context size (0 = the model's)")] = 8192,
        cache_type_k: Annotated[str, typer.Option("--cache-type-k", help="K cache type: f16, bf16, f32, q8_0, "
                                                  "q4_0, q4_1, q5_0, q5_1, iq4_nl")] = "f16",
        cache_type_v: Annotated[str, typer.Option("--cache-type-v", help="V cache type (quantized needs flash "
                                                  "attention)")] = "f16",
        n_gpu_layers: Annotated[int, typer.Option("--n-gpu-layers", "-ngl", min=-1, help="layers on the GPU (-1 = "
                                                  "all, 0 = CPU)")] = 0,
        n_parallel: Annotated[int, typer.Option("--n-parallel", "-np", min=1, help="parallel sequences")] = 1,
        kv_unified: Annotated[bool, typer.Option("--kv-unified", help="one KV cache for all sequences")] = False,
        flash_attn: Annotated[bool, typer.Option("--flash-attn/--no-flash-attn", help="flash attention "
                                                 "(llama.cpp's auto turns it on on CPU and CUDA)")] = True,
        swa_full: Annotated[bool, typer.Option("--swa-full", help="sliding layers keep the whole context")] = False,
        n_ubatch: Annotated[int, typer.Option("--ubatch-size", "-ub", min=1, max=UINT32_MAX,
                                              help="physical batch size (llama.cpp takes at most --batch-size)")] = 512,
        n_batch: Annotated[int, typer.Option("--batch-size", "-b", min=1, max=UINT32_MAX,
                                             help="logical batch size (llama.cpp takes at most the context)")] = 2048,
        weight_type: Annotated[str, typer.Option("--weight-type", help="for a config.json folder: the weights' type "
                                                 "as convert --outtype writes them (f32, f16, bf16, q8_0)")] = "bf16",
        as_json: Annotated[bool, typer.Option("--json", help="one JSON object (bytes)")] = False,
        allow_full_download: AllowFullDownload = False,
        max_header_mib: MaxHeaderMiB = DEFAULT_MAX_HEADER_MIB,
        timeout: Timeout = DEFAULT_TIMEOUT_S,
    ) -> None:
        """Memory llama.cpp needs for a target and its MTP drafter (weights, KV cache, buffers)."""
        from mtpscope.inspector.estimate import EstimateParams
        from mtpscope.inspector.estimate import estimate as run

        params = EstimateParams(n_ctx=n_ctx, n_parallel=n_parallel, kv_unified=kv_unified,
                                cache_type_k=cache_type_k.lower(), cache_type_v=cache_type_v.lower(),
                                flash_attn=flash_attn, swa_full=swa_full, n_ubatch=n_ubatch,
                                n_gpu_layers=n_gpu_layers, n_batch=n_batch)
        from mtpscope.errors import InspectorError
        from mtpscope.inspector.config_model import is_config_source, model_from_config

        def source(loc: str) -> object:
            if is_config_source(loc):
                return model_from_config(loc, weight_type=weight_type.lower())
            if os.path.isdir(loc):        # a folder is taken for its config.json: say that is what is missing
                raise InspectorError("a folder without a config.json", path=loc,
                                     expected="a GGUF, or a folder with a config.json", actual="no config.json")
            return open_source(loc, allow_full_download, max_header_mib, timeout)

        with one_line_errors():
            t = source(target)
            a = source(assistant) if assistant else None
            e = run(t, a, params)
        if as_json:
            sys.stdout.write(json.dumps(e.to_dict()) + "\n")
        else:
            sys.stdout.write(format_text(e) + "\n")
