"""Benchmark: the recording worker's transport (``traces.run.transport``) at real sizes.

A forked child plays the worker: per round it builds a ``RoundResult`` of ``--n-draft`` steps with
the drafter's logits (``--n-vocab`` float32, 1 MiB at 262144), ``h`` / ``h_next`` (``--n-embd-backbone``,
2816 for the 26B pair) and ``h_inner`` (``--n-embd``), and sends it with ``RoundSender.send`` (pack, one
copy into the shared-memory ring, a JSON header over the socket). The parent receives, unpacks (the
logits as ring views) and releases each round. Printed: rounds per second and GB/s end to end, and
the worker's time per round inside ``send`` -- the transport's cost in the MTP loop -- next to the
baseline of one plain ``np.copy`` of the same arrays (what the loop copies anyway).

Usage: ``python -m benchmarks.bench_transport [--rounds 2000] [--n-draft 3] [--n-vocab 262144]
[--n-embd-backbone 2816] [--n-embd 1024]``. Exits 0 whatever the numbers.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import numpy as np

from mtpscope.traces.run.mtp_runtime import DraftStep, RoundResult
from mtpscope.traces.run.transport import Channel, RoundReceiver, RoundSender


def _round(i: int, arrays: list[np.ndarray], n_draft: int) -> RoundResult:
    steps = tuple(DraftStep(7 + k, arrays[4 * k], arrays[4 * k + 1], arrays[4 * k + 2], arrays[4 * k + 3])
                  for k in range(n_draft))
    return RoundResult(round=i, pos=100 + i, pending_token=5, drafted=tuple(range(n_draft)),
                       target=tuple(range(n_draft + 1)), n_accepted=1, emitted=(0, 1), t_draft_ms=1.0,
                       t_verify_ms=2.0, steps=steps)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--n-draft", type=int, default=3)
    ap.add_argument("--n-vocab", type=int, default=262144)
    ap.add_argument("--n-embd-backbone", type=int, default=2816)
    ap.add_argument("--n-embd", type=int, default=1024)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    arrays = []
    for _ in range(args.n_draft):
        arrays += [rng.standard_normal(args.n_vocab).astype(np.float32),
                   rng.standard_normal(args.n_embd_backbone).astype(np.float32),
                   rng.standard_normal(args.n_embd_backbone).astype(np.float32),
                   rng.standard_normal(args.n_embd).astype(np.float32)]
    nbytes = sum(a.nbytes for a in arrays)
    t0 = time.perf_counter()
    for _ in range(200):
        _ = [a.copy() for a in arrays]
    copy_us = (time.perf_counter() - t0) / 200 * 1e6

    a, b = socket.socketpair()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the "worker"
        b.close()
        os.close(r)
        sender = RoundSender(Channel(a))
        times = []
        for i in range(args.rounds):
            res = _round(i, arrays, args.n_draft)
            t, w0 = time.perf_counter(), sender.wait_seconds
            sender.send("round", res, prompt_id=0)
            times.append(time.perf_counter() - t - (sender.wait_seconds - w0))   # own work, not the wait
        sender._wait_released(sender.n_sent)
        sender.chan.send({"kind": "done"})
        os.write(w, f"{statistics.median(times) * 1e6:.1f} {sender.wait_seconds:.3f}\n".encode())
        os._exit(0)
    a.close()
    os.close(w)
    recv = RoundReceiver(Channel(b))
    n = 0
    t0 = time.perf_counter()
    while True:
        msg, fds = recv.chan.recv()
        if msg["kind"] == "ring":
            recv.on_ring(msg, fds)
            continue
        if msg["kind"] == "done":
            break
        res = recv.unpack(msg)
        assert res.steps[0].logits.shape == (args.n_vocab,)
        n += 1
        recv.release()
    dt = time.perf_counter() - t0
    os.waitpid(pid, 0)
    send_us, wait_s = os.read(r, 100).decode().split()
    print(f"bench_transport: {args.rounds} rounds of {args.n_draft} steps, {nbytes / 2**20:.2f} MiB of arrays per round "
          f"(n_vocab {args.n_vocab}, n_embd_backbone {args.n_embd_backbone}, n_embd {args.n_embd})")
    print(f"  end to end: {n / dt:.0f} rounds/s, {n * nbytes / dt / 1e9:.2f} GB/s (receiver unpacks and releases each)")
    print(f"  worker's own time in send per round (pack, ring copy, header): median {float(send_us):.0f} us; "
          f"waiting for the receiver (here the worker has nothing else to do): {float(wait_s):.2f} s in total")
    print(f"  baseline: one np.copy of the same arrays {copy_us:.0f} us per round")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
