"""Benchmark: one numpy reference draft step at real drafter sizes, and replay of a 1,000-round trace.

Measured ("step"): :meth:`ReferenceDrafter.step` with random float32 weights (in memory, no file) and
random donor K/V of ``--context`` cells:

* **E2B** drafter: n_embd 256, n_embd_backbone 1536, n_ff 2048, 4 heads / 1 KV head, head dims 256 / 512,
  4 layers [s, s, s, f], window 512, vocab 262144, centroid head (2048 centroids, top-32).
* **26B-A4B** drafter: n_embd 1024, n_embd_backbone 2816, n_ff 8192, 16 heads / 8 (sliding) and 2 (full)
  KV heads, same head dims, window 1024, vocab 262144, **dense** head.

Baseline ("floor"): one ``np.einsum`` matrix-vector product over the drafter's ``token_embd``
(262144 rows) - the memory traffic of the dense head alone, the least a dense step must do. The ratio
step/floor is printed (for E2B the centroid head reads only 4096 rows, so the ratio can be below 1).

Replay ("--replay", off by default, takes a few minutes): records a trace of >= 1,000 rounds on the tiny
demo pair (4096-token vocabulary slice, or ``--vocab full``: all 262144 tokens) with the real recorder and replays it with the baseline and one
variant; prints rounds, seconds, and ms per recomputed step. Exits 0 whatever the numbers (speed targets
are reported, never asserted).

Usage: ``python -m benchmarks.bench_reference [--repeats 5] [--context 2048] [--replay]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from mtpscope.inspector.layouts import GEMMA4_N_VOCAB
from mtpscope.inspector.reference import (
    DonorKV,
    DrafterHParams,
    DrafterWeights,
    LayerWeights,
    ReferenceDrafter,
    StepOptions,
)

N_VOCAB = GEMMA4_N_VOCAB


def make_drafter(n_embd: int, n_bb: int, n_ff: int, n_head: int, kv: tuple[int, int], window: int,
                 centroids: bool, seed: int = 0) -> tuple[ReferenceDrafter, dict[str, int]]:
    rng = np.random.default_rng(seed)
    swa = (True, True, True, False)
    hd = tuple(256 if s else 512 for s in swa)
    n_kv = tuple(kv[0] if s else kv[1] for s in swa)

    def mat(o: int, i: int) -> np.ndarray:
        return (rng.standard_normal((o, i), dtype=np.float32) / np.float32(np.sqrt(i)))

    hp = DrafterHParams(arch="bench", dialect="arrays", n_embd=n_embd, n_embd_backbone=n_bb, n_vocab=N_VOCAB,
                        n_layer=4, n_head=(n_head,) * 4, n_head_kv=n_kv, n_ff=(n_ff,) * 4, is_swa=swa,
                        head_dim=hd, n_rot=hd, rope_base=tuple(1e4 if s else 1e6 for s in swa),
                        sliding_window=window, n_centroids=2048 if centroids else None,
                        centroid_top_k=32 if centroids else None)
    ones = np.ones(n_embd, np.float32)
    layers = tuple(LayerWeights(attn_norm=ones, attn_q=mat(n_head * h, n_embd), attn_q_norm=np.ones(h, np.float32),
                                attn_output=mat(n_embd, n_head * h), post_attention_norm=ones, ffn_norm=ones,
                                ffn_gate=mat(n_ff, n_embd), ffn_up=mat(n_ff, n_embd), ffn_down=mat(n_embd, n_ff),
                                post_ffw_norm=ones) for h in hd)
    rf = np.array([1.0] * 64 + [1e30] * 192, np.float32)
    w = DrafterWeights(pre_projection=mat(n_embd, 2 * n_bb), post_projection=mat(n_bb, n_embd),
                       token_embd=rng.standard_normal((N_VOCAB, n_embd), dtype=np.float32), output_norm=ones,
                       layers=layers, rope_freqs=rf,
                       centroids=rng.standard_normal((2048, n_embd), dtype=np.float32) if centroids else None,
                       token_ordering=rng.permutation(N_VOCAB) if centroids else None)
    target_embd = rng.standard_normal((4096, n_bb), dtype=np.float32)  # only the rows we feed
    return ReferenceDrafter(hp, w, lambda ids: target_embd[np.asarray(ids) % 4096]), {"kv_s": kv[0], "kv_f": kv[1]}


def donor_kv(ctx: int, kv: dict[str, int], seed: int = 1) -> dict[str, DonorKV]:
    rng = np.random.default_rng(seed)
    pos = np.arange(ctx)
    return {"sliding": DonorKV(rng.standard_normal((ctx, kv["kv_s"], 256), dtype=np.float32),
                               rng.standard_normal((ctx, kv["kv_s"], 256), dtype=np.float32), pos),
            "full": DonorKV(rng.standard_normal((ctx, kv["kv_f"], 512), dtype=np.float32),
                            rng.standard_normal((ctx, kv["kv_f"], 512), dtype=np.float32), pos)}


def median_ms(fn, repeats: int) -> float:
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def bench_steps(repeats: int, context: int) -> None:
    for name, args in (("E2B (centroid head)", (256, 1536, 2048, 4, (1, 1), 512, True)),
                       ("26B-A4B (dense head)", (1024, 2816, 8192, 16, (8, 2), 1024, False))):
        t0 = time.perf_counter()
        d, kvh = make_drafter(*args)
        kv = {k: v.rounded_f16() for k, v in donor_kv(context, kvh).items()}  # once, as replay does
        setup = time.perf_counter() - t0
        h = np.random.default_rng(2).standard_normal(d.hp.n_embd_backbone).astype(np.float32)
        opts = StepOptions(kv_f16=True, gelu="ggml-f16")
        step = median_ms(lambda d=d, h=h, kv=kv, opts=opts: d.step(17, h, context, kv, opts), repeats)
        x = np.ones(d.hp.n_embd, np.float32)
        floor = median_ms(lambda d=d, x=x: np.einsum("ij,j->i", d.w.token_embd, x), repeats)
        print(f"{name:22s} context {context}: step {step:8.2f} ms   floor (dense-head matvec) {floor:7.2f} ms   "
              f"ratio {step / floor:5.2f}   (weights built in {setup:.1f} s)")


def bench_replay(n_rounds: int, vocab: str) -> None:
    from mtpscope.demo import build as demo
    from mtpscope.demo.vocab import load_vocab
    from mtpscope.traces.run.record_config import RecordConfig
    from mtpscope.traces.run.recorder import record
    from mtpscope.traces.run.replay import replay

    voc = load_vocab(vocab)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        t = demo.write_target(d / "t.gguf", vocab=voc)
        dr = demo.write_drafter(d / "d.gguf", vocab=voc, noise=2.0)
        words = demo.DEMO_PASSAGE.split()
        prompts = [" ".join(words[i:i + 6]) for i in range(0, 24, 3)]
        t0 = time.perf_counter()
        record(RecordConfig(max_tokens=max(64, int(n_rounds * 2.2 / len(prompts)))), target=t, assistant=dr,
               out=d / "trace", prompts=prompts)
        t_rec = time.perf_counter() - t0
        t0 = time.perf_counter()
        r = replay(d / "trace", variants=["position=p-1"])
        t_rep = time.perf_counter() - t0
        sm = r.summary().to_dict()
        n_steps = sm["n_steps"] * len(sm["variants"])
        print(f"replay ({voc.n_vocab}-token vocabulary): {sm['n_rounds']} rounds ({sm['n_steps']} steps) recorded in {t_rec:.1f} s; replayed with "
              f"{len(sm['variants'])} variants in {t_rep:.1f} s = {t_rep / n_steps * 1e3:.2f} ms per recomputed step; "
              f"baseline agreement {sm['variants']['baseline']['agreement']:.4f}, ratio replay/record "
              f"{t_rep / t_rec:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--replay", action="store_true", help="also record and replay a >= 1,000-round trace")
    ap.add_argument("--rounds", type=int, default=1000)
    ap.add_argument("--vocab", choices=("subset", "full"), default="subset",
                    help="demo pair vocabulary for --replay: 4096-token slice or the full 262144 tokens")
    a = ap.parse_args()
    bench_steps(a.repeats, a.context)
    if a.replay:
        bench_replay(a.rounds, a.vocab)


if __name__ == "__main__":
    main()
