"""CLI command: quantize (see mtpscope/cli/main.py; the library is traces/run/quantize.py).

``mtpscope quantize IN.gguf OUT.gguf --type q4_k_m [--threads N] [--overwrite]``: llama.cpp's own
quantizer (``llama_model_quantize``) with the provenance keys ``mtpscope.quantize.*`` in the output,
written atomically. Exit 0 written; 2 unreadable input, an unknown type (the line lists llama.cpp's),
an existing output, or llama.cpp refused (its message quoted).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mtpscope.cli.common import one_line_errors
from mtpscope.traces.run.record_config import MAX_N_THREADS


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root mtpscope app."""

    @app.command()
    def quantize(
        src: Annotated[Path, typer.Argument(help="GGUF to quantize (F32 / F16 / BF16 weights; drafter or target)")],
        out: Annotated[Path, typer.Argument(help="GGUF to write")],
        qtype: Annotated[str, typer.Option(
            "--type", help="llama.cpp's file type, named as llama-quantize names it: f32, f16, bf16, q8_0, q6_k, "
                           "q5_k_m, q4_k_m, q4_0, ... (an unknown name lists them all)")] = "q8_0",
        threads: Annotated[int, typer.Option("--threads", min=0, max=MAX_N_THREADS, help="quantizer threads (0: one per core)")] = 0,
        overwrite: Annotated[bool, typer.Option("--overwrite", help="replace an existing OUT")] = False,
    ) -> None:
        """Quantize a GGUF with llama.cpp's own quantizer; the output names its source and quantizer."""
        from mtpscope.traces.run.quantize import check_types, quantize_file

        with one_line_errors():
            check_types(qtype, key="--type")
            r = quantize_file(src, out, qtype, n_threads=threads, overwrite=overwrite)
        types = ", ".join(f"{n} x{c}" for n, c in sorted(r.tensor_types.items(), key=lambda kv: (-kv[1], kv[0])))
        mib = 1024 * 1024
        typer.echo(f"wrote {r.out}: {r.qtype}, {r.n_bytes_in / mib:.1f} MiB -> {r.n_bytes_out / mib:.1f} MiB "
                   f"in {r.seconds:.1f} s ({types})")
