"""``mtpscope diff``'s tensor-data comparison on big files: the default (small tensors whole, larger ones on
sampled rows) against reading every byte (the baseline: a sequential read + blake2b of both files, and
``diff(data="whole")``).

Two GGUFs of ``--gib`` GiB each shaped like a Gemma 4 target (n_embd 5376, n_ff 21504, Q8_0 matrices, F32
norms), every data byte written (random, not a sparse hole), the second one with one feed-forward tensor's
bytes changed from a row the sampled comparison reads. Measured cold (each file's pages dropped from the
page cache with ``posix_fadvise(DONTNEED)``, only these files) and warm:

- ``diff(a, b)`` (``data="sampled"``): wall time, bytes read, whether it finds the changed tensor;
- ``diff(a, b, data="whole")``: the same, every byte;
- baseline: ``hashlib.blake2b`` over both files read sequentially in 16 MiB blocks (every byte, no GGUF).

Run: ``.venv/bin/python -m benchmarks.bench_diff [--gib 4] [--dir DIR] [--sparse]`` (needs 2 x GIB of free
disk, none with ``--sparse``; the files are deleted at the end). Prints numbers and ratios; asserts nothing
about time.

Measured (2 shared cores, virtual disk): 2 x 3.97 GiB, 99 tensors: default cold 2.4 s / warm 0.17 s
(34.5 MiB read) against every byte 58 s / 32 s (8134 MiB): 25x cold, 186x warm; with single sampled rows
instead of runs the default was 9.8 s cold (a seek and the kernel's read-ahead per row). ``--gib 20
--sparse`` (2 x 19.9 GiB, 495 tensors, holes): default cold 12-21 s / warm 0.5 s (172 MiB) against every byte
98 s / 105 s (40672 MiB, hashing zeros); the cold cost is about 5 ms per run of rows on this disk.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from mtpscope.inspector.diff import diff
from mtpscope.inspector.gguf import open_gguf
from tests.estimate_models import header_and_hole

N_EMBD, N_FF, N_HEAD, HEAD_DIM = 5376, 21504, 32, 256
BLOCK = 16 << 20


def _q8_bytes(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape)) // 32 * 34


def write_model(path: Path, gib: float, sparse: bool = False) -> list[str]:
    """A header of as many layers as fit in ``gib`` GiB (7 Q8_0 matrices + 4 F32 norms each), then every
    data byte written from a random 64 MiB pattern (rolled per tensor), or (``sparse``) the data region left
    a hole that reads as zeros without touching the disk. Returns the tensor names."""
    import gguf
    from gguf import GGMLQuantizationType as Q

    per_layer = (2 * _q8_bytes((N_HEAD * HEAD_DIM, N_EMBD)) + 2 * _q8_bytes((4 * HEAD_DIM, N_EMBD))
                 + 3 * _q8_bytes((N_FF, N_EMBD)))
    n_layers = max(1, int(gib * 2**30 // per_layer))
    w = gguf.GGUFWriter(str(path), "gemma4")
    w.add_uint32("gemma4.block_count", n_layers)
    w.add_uint32("gemma4.embedding_length", N_EMBD)
    names: list[str] = []

    def q8(name: str, shape: tuple[int, ...]) -> None:
        w.add_tensor_info(name, shape, np.dtype(np.float32), _q8_bytes(shape), raw_dtype=Q.Q8_0)
        names.append(name)

    def f32(name: str, shape: tuple[int, ...]) -> None:
        w.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
        names.append(name)

    for il in range(n_layers):
        b = f"blk.{il}."
        for n in ("attn_norm", "ffn_norm", "post_attention_norm", "post_ffw_norm"):
            f32(b + n + ".weight", (N_EMBD,))
        q8(b + "attn_q.weight", (N_HEAD * HEAD_DIM, N_EMBD))
        q8(b + "attn_k.weight", (4 * HEAD_DIM, N_EMBD))
        q8(b + "attn_v.weight", (4 * HEAD_DIM, N_EMBD))
        q8(b + "attn_output.weight", (N_EMBD, N_HEAD * HEAD_DIM))
        q8(b + "ffn_gate.weight", (N_FF, N_EMBD))
        q8(b + "ffn_up.weight", (N_FF, N_EMBD))
        q8(b + "ffn_down.weight", (N_EMBD, N_FF))
    header_and_hole(w, path)  # the data region's size; every byte of it is written below
    f = open_gguf(path)
    infos = [(t.offset, t.n_bytes or 0) for t in f.tensors]
    f.close()
    if sparse:
        return names
    pattern = np.random.default_rng(0).integers(0, 256, size=64 << 20, dtype=np.uint8)
    fd = os.open(path, os.O_WRONLY)
    try:
        for i, (off, n) in enumerate(infos):
            buf = np.roll(pattern, i * 4099)
            done = 0
            while done < n:
                k = min(n - done, len(buf))
                os.pwrite(fd, buf[:k].tobytes(), off + done)
                done += k
        os.fsync(fd)
    finally:
        os.close(fd)
    return names


def drop_cache(*paths: Path) -> None:
    """Drop these files' pages from the page cache (``posix_fadvise(DONTNEED)``; nothing else)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def hash_every_byte(*paths: Path) -> list[str]:
    """The baseline: blake2b of each file, read sequentially in 16 MiB blocks."""
    out = []
    for p in paths:
        h = hashlib.blake2b(digest_size=16)
        with open(p, "rb", buffering=0) as f:
            while block := f.read(BLOCK):
                h.update(block)
        out.append(h.hexdigest())
    return out


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=4.0, help="size of each file (GiB)")
    ap.add_argument("--dir", type=Path, default=None, help="where to write the two files (default: a temp dir)")
    ap.add_argument("--sparse", action="store_true", help="leave the data regions holes (a 20 GiB layout with no "
                                                          "disk use: measures the per-tensor cost, not the disk)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-diff-", dir=args.dir))
    try:
        a, b = tmp / "good.gguf", tmp / "bad.gguf"
        t_w, names = _timed(lambda: write_model(a, args.gib, args.sparse))
        if args.sparse:
            write_model(b, args.gib, sparse=True)
        else:
            shutil.copyfile(a, b)
        # one feed-forward tensor changed from its first row on (a sampled row: the first is always sampled)
        f = open_gguf(b)
        t = f.tensor("blk.0.ffn_up.weight")
        f.close()
        with open(b, "r+b") as fh:
            fh.seek(t.offset)
            fh.write(b"\xa5" * 4096)
        size = a.stat().st_size
        print(f"files: 2 x {size / 2**30:.2f} GiB{' (sparse: data regions are holes)' if args.sparse else ''}, "
              f"{len(names)} tensors each (written in {t_w:.0f} s); blk.0.ffn_up.weight changed in the second")
        rows = []
        for label, fn in (("diff default (data='sampled')", lambda: diff(a, b)),
                          ("diff data='whole' (every byte)", lambda: diff(a, b, data="whole")),
                          ("baseline: blake2b of both files", lambda: hash_every_byte(a, b))):
            drop_cache(a, b)
            t_cold, out = _timed(fn)
            t_warm, _ = _timed(fn)
            if label.startswith("diff"):
                read = out.compared.bytes_read
                found = [c.name for c in out.data_differ]
                extra = f"read {read / 2**20:,.1f} MiB; differing: {found}"
            else:
                extra = f"read {2 * size / 2**20:,.1f} MiB; digests differ: {out[0] != out[1]}"
            rows.append((label, t_cold, t_warm))
            print(f"  {label:34s} cold {t_cold:8.2f} s   warm {t_warm:8.2f} s   {extra}")
        base_cold, base_warm = rows[2][1], rows[2][2]
        print(f"  ratio baseline / default: cold {base_cold / rows[0][1]:.0f}x, warm {base_warm / rows[0][2]:.0f}x; "
              f"whole / default: cold {rows[1][1] / rows[0][1]:.0f}x, warm {rows[1][2] / rows[0][2]:.0f}x")
        print("  (the default's cost is per tensor, not per byte: a 20 GB file of the same tensor count reads "
              "about the same amount)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
