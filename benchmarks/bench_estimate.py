"""``mtpscope estimate`` against llama.cpp's own reports (the baseline), per model and n_ctx.

For the demo pair and two synthetic gemma4 targets with many layers (tests/estimate_models.py: 48
layers; 35 layers of which 20 share KV, head dims 256 / 512), loads each model with the real llama.cpp
(through ``traces.run.llama``, log captured), creates contexts at several n_ctx / flash-attention /
cache-type settings, and prints what llama.cpp logged (MiB), our estimate, and estimate / llama.cpp for
the weights, the KV buffer and the compute buffer. Asserts nothing.

Run: ``.venv/bin/python -m benchmarks.bench_estimate``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from mtpscope.inspector.estimate import EstimateParams, estimate
from tests.estimate_models import E2B_LIKE, SynthTarget, parse_llama_sizes, write_synth_target

MiB = 1 << 20
SETTINGS = [(4096, True, False, 512, "f16"), (4096, False, False, 512, "f16"), (16384, True, False, 512, "q8_0"),
            (16384, False, True, 512, "f16"), (65536, True, False, 512, "f16"), (131072, True, False, 512, "f16"),
            (8192, True, False, 2048, "f16")]
TYPE_ID = {"f16": 1, "q8_0": 8}


def main() -> None:
    from mtpscope.demo.build import build_demo
    from mtpscope.demo.vocab import load_vocab
    from mtpscope.traces.run.llama import logs
    from mtpscope.traces.run.llama import model as lm

    demo = build_demo(traces=False)
    voc = list(load_vocab("subset").kv)
    with tempfile.TemporaryDirectory() as tmp:
        models = {"demo pair": (demo.target, demo.drafter_upstream),
                  "synthetic 48 layers": (write_synth_target(Path(tmp) / "m48.gguf", SynthTarget(n_layer=48), voc), None),
                  "synthetic E2B-like (35 layers, 20 shared-KV)": (write_synth_target(Path(tmp) / "e2b.gguf", E2B_LIKE,
                                                                                        voc), None)}
        worst = {"kv": 0.0, "compute": 0.0}
        for name, (tp, dp) in models.items():
            with logs.capture_log() as log:
                m = lm.LlamaModel(tp)
            w_log = parse_llama_sizes(log)["model"]["CPU_Mapped"]
            e0 = estimate(tp, dp)
            exact = e0.target.weights == m.model_size
            print(f"== {name}: weights llama.cpp {w_log:.2f} MiB (llama_model_size "
                  f"{m.model_size} B), estimate {e0.target.weights} B -> "
                  f"{'exact' if exact else 'DIFFERENT'}")
            dm = lm.LlamaModel(dp) if dp else None
            if dm:
                print(f"   drafter weights: llama_model_size {dm.model_size} B, "
                      f"estimate {e0.drafter.weights} B")
            print(f"   {'n_ctx':>7} {'fa':>4} {'swa':>7} {'ub':>5} {'K/V':>5} | {'KV llama':>10} {'est':>10} {'ratio':>7} |"
                  f" {'compute llama':>13} {'est':>10} {'ratio':>7}" + (" | drafter KV buffers / compute ratio" if dm else ""))
            for n_ctx, fa, swa_full, ub, ct in SETTINGS:
                e = estimate(tp, dp, EstimateParams(n_ctx=n_ctx, flash_attn=fa, swa_full=swa_full, n_ubatch=ub,
                                                    cache_type_k=ct, cache_type_v=ct))
                with logs.capture_log() as log:
                    c = lm.LlamaContext(m, n_ctx=n_ctx, n_batch=ub, flash_attn=fa, swa_full=swa_full, nextn=False,
                                        type_k=TYPE_ID[ct], type_v=TYPE_ID[ct])
                got = parse_llama_sizes(log)
                kv = sum(got["kv_buffer"].values())
                comp = got["compute"]["CPU"]
                r_kv, r_c = e.target.kv / MiB / kv, e.target.compute_bytes / MiB / comp
                worst["kv"] = max(worst["kv"], abs(r_kv - 1))
                worst["compute"] = max(worst["compute"], abs(r_c - 1))
                extra = ""
                if dm:
                    with logs.capture_log() as dlog:
                        dc = lm.LlamaContext(dm, n_ctx=n_ctx, n_batch=ub, flash_attn=fa, swa_full=swa_full, mtp_of=c,
                                             masked=True, type_k=TYPE_ID[ct], type_v=TYPE_ID[ct])
                    dg = parse_llama_sizes(dlog)
                    dc.close()
                    rd = e.drafter.compute_bytes / MiB / dg["compute"]["CPU"]
                    worst["compute"] = max(worst["compute"], abs(rd - 1))
                    extra = f" | {dg['kv_buffer'] or 'none'} (estimate 0) / {rd:.3f}"
                print(f"   {n_ctx:>7} {'on' if fa else 'off':>4} {'full' if swa_full else 'window':>7} {ub:>5} {ct:>5} | "
                      f"{kv:>10.2f} {e.target.kv / MiB:>10.2f} {r_kv:>7.4f} | {comp:>13.2f} "
                      f"{e.target.compute_bytes / MiB:>10.2f} {r_c:>7.3f}{extra}")
                c.close()
            m.close()
            if dm:
                dm.close()
        print(f"worst |estimate / llama.cpp - 1|: KV {worst['kv'] * 100:.2f} % (target <= 2 %), compute "
              f"{worst['compute'] * 100:.1f} %")


if __name__ == "__main__":
    main()
