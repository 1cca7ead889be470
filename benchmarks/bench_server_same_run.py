"""Issue 33's table, the recorder's side: does a recording equal llama-server's run of the same request?

For each trained demo prompt (36), each prompt form (token ids to ``/completion``; the prompt's text to
``/completion``; the text as one user message to ``/v1/chat/completions``) and each sampling (greedy; T = 0.8
with a seed and the server's default top-k / top-p / min-p), the real llama-server (``mtpscope server build``,
``--parallel 1``) answers the request and mtpscope's recorder (``MtpRuntime``, prompt ids from
``traces.run.mtp_runtime.spec_tokens``) runs it; the script prints per form and sampling how many requests
agree on the prompt token count, drafted (``timings.draft_n``), accepted (``timings.draft_n_accepted``) and
output (the tokens for ``/completion``; the number of tokens for the chat route, which answers text), and
lists every request that differs.

Not a timing: the numbers are counts, the same on a busy machine. Run from the checkout's root:

    python -m benchmarks.bench_server_same_run [--n-draft 3] [--n-predict 64] [--seed 11] [--limit N]
"""

from __future__ import annotations

import argparse
import tempfile
from collections import Counter
from pathlib import Path

THREADS = ["--threads", "1", "--threads-batch", "1", "--spec-draft-threads", "1", "--spec-draft-threads-batch", "1"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n-draft", type=int, default=3)
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--temp", type=float, default=0.8)
    ap.add_argument("--limit", type=int, default=None, help="first N prompts only")
    a = ap.parse_args()

    from mtpscope.demo.build import build_demo
    from mtpscope.demo.spec import TrainedPaths
    from mtpscope.demo.trained import read_prompts
    from mtpscope.traces.run.mtp_runtime import MtpRuntime, spec_tokens
    from mtpscope.traces.run.prompts import PromptSpec
    from mtpscope.traces.run.record_config import RecordConfig
    from mtpscope.traces.server.build import find_build
    from mtpscope.traces.server.client import ServerClient
    from mtpscope.traces.server.launch import launch

    b = find_build()
    if b is None:
        raise SystemExit("llama-server is not built: run `mtpscope server build`")
    tp = TrainedPaths.under(Path(build_demo().root))
    prompts = read_prompts()[: a.limit]
    tally: Counter[tuple[str, str, str]] = Counter()
    diffs: list[str] = []
    log = Path(tempfile.mkdtemp(prefix="mtpscope-same-run-")) / "llama-server.log"
    with launch(tp.target, tp.drafter, n_draft=a.n_draft, log=log, binary=b.binary, extra=THREADS) as srv, \
            ServerClient(srv.url) as c, \
            MtpRuntime(tp.target, tp.drafter, capture=False, n_gpu_layers=0, n_threads=1) as rt:
        for p in prompts:
            text = rt.tmodel.detokenize(p["ids"])
            text = text.removeprefix("<bos>")
            forms = {"ids": PromptSpec(tokens=tuple(p["ids"])), "text": PromptSpec(text=text),
                     "chat": PromptSpec(messages=({"role": "user", "content": text},))}
            for temp in (0.0, a.temp):
                cfg = RecordConfig(n_draft=a.n_draft, max_tokens=a.n_predict, temp=temp, seed=a.seed, hidden="off")
                for form, spec in forms.items():
                    ids, _ = spec_tokens(rt.tmodel, spec)
                    rounds = list(rt.run(ids, cfg, trace=False))
                    out = [rt.first_token] + [t for r in rounds for t in r.emitted]
                    ours = (len(ids), sum(len(r.drafted) for r in rounds), sum(r.n_accepted for r in rounds))
                    body = {"n_predict": a.n_predict, "temperature": temp, "seed": a.seed, "cache_prompt": False}
                    if form == "chat":
                        resp = c.json("POST", "/v1/chat/completions", body={**body, "max_tokens": a.n_predict,
                                                                           "messages": list(spec.messages or ())})
                        tm = resp["timings"]
                        same_out = tm.get("predicted_n") == len(out)
                    else:
                        resp = c.completion({**body, "prompt": list(ids) if form == "ids" else text,
                                             "return_tokens": True})
                        tm = resp["timings"]
                        same_out = resp.get("tokens") == out
                    theirs = (tm.get("prompt_n"), tm.get("draft_n", 0), tm.get("draft_n_accepted", 0))
                    s = "greedy" if temp <= 0 else f"T={temp:g}"
                    tally[(form, s, "n")] += 1
                    for name, ok in (("prompt", ours[0] == theirs[0]), ("drafted", ours[1] == theirs[1]),
                                     ("accepted", ours[2] == theirs[2]), ("output", same_out)):
                        tally[(form, s, name)] += ok
                    if ours != theirs or not same_out:
                        diffs.append(f"{p['name']} {form} {s}: recording (prompt, drafted, accepted) {ours} "
                                     f"server {theirs} same output {same_out}")
    print(f"{'form':6} {'sampling':8} {'requests':>8} {'prompt':>7} {'drafted':>8} {'accepted':>9} {'output':>7}")
    for form in ("ids", "text", "chat"):
        for s in ("greedy", f"T={a.temp:g}"):
            n = tally[(form, s, "n")]
            print(f"{form:6} {s:8} {n:8d} " + " ".join(f"{tally[(form, s, k)]:>{w}d}" for k, w in
                                                      (("prompt", 7), ("drafted", 8), ("accepted", 9), ("output", 7))))
    print("\n".join(diffs) if diffs else "every request equal")


if __name__ == "__main__":
    main()
