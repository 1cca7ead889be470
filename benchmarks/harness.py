"""What the benchmarks share: timers (median / best of repeats, wall or CPU) and the synthetic traces they
read, written once into the cache folder.

Timers return seconds. A median resists one slow repeat on a shared machine; a best-of (``best``) is the
right statistic for a pure CPU-bound function whose noise only ever adds time.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def median_time(fn: Callable[[], Any], repeats: int) -> float:
    """Median wall time of ``repeats`` calls of ``fn``, seconds."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def best_time(fn: Callable[[], T], repeats: int) -> tuple[float, T | None]:
    """Best wall time of ``repeats`` calls of ``fn`` (seconds), and the last result."""
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def best_cpu_time(fn: Callable[[], Any], repeats: int) -> float:
    """Best CPU time (``time.process_time``, seconds) of ``repeats`` calls: robust when other jobs share the
    cores."""
    best = math.inf
    for _ in range(repeats):
        c0 = time.process_time()
        fn()
        best = min(best, time.process_time() - c0)
    return best


#: bytes of the memory pages :func:`idle_touch_us` touches, and how many it touches (8 MiB)
PAGE_BYTES = 4096
IDLE_TOUCH_PAGES = 2048


def idle_touch_us(idle_s: float, repeats: int = 3) -> float:
    """What this machine charges for memory left idle: µs (thread CPU time) per 4 KiB page to read one float64
    of each of :data:`IDLE_TOUCH_PAGES` pages after they sat untouched for ``idle_s`` seconds, minus the same
    read again at once (median of ``repeats``). Bare metal: a cache miss, well under 1 µs; a virtual machine
    whose host reclaims or compresses idle guest pages: a host fault per page, counted as the guest's CPU time
    (benchmarks/bench_idle_memory.py)."""
    import numpy as np

    view = np.ones(IDLE_TOUCH_PAGES * PAGE_BYTES // 8)[:: PAGE_BYTES // 8]
    out = []
    for _ in range(repeats):
        view.sum()
        time.sleep(idle_s)
        c0 = time.thread_time()
        view.sum()
        c1 = time.thread_time()
        view.sum()
        c2 = time.thread_time()
        out.append(((c1 - c0) - (c2 - c1)) / IDLE_TOUCH_PAGES * 1e6)
    return statistics.median(out)


def idle_touch_line(repeats: int = 3) -> str:
    """One line for a benchmark's header: :func:`idle_touch_us` after 50 ms and 1 s idle."""
    return (f"this machine charges {idle_touch_us(0.05, repeats):.2f} us per 4 KiB page touched after 50 ms idle, "
            f"{idle_touch_us(1.0, repeats):.2f} us after 1 s (without a host that reclaims idle pages: a cache miss, about 0.1 us; benchmarks/bench_idle_memory.py)")


def synthetic_trace(folder: str, n_rounds: int, n_prompts: int, seed: int = 0) -> Path:
    """``<cache>/<folder>/syn-<n_rounds>``: a synthetic trace (:func:`mtpscope.traces.synthetic.write_synthetic_trace`,
    3 drafts, centroid columns, no hidden states) written on first use and reused after."""
    from mtpscope.cache import cache_dir
    from mtpscope.traces.store.layout import MANIFEST
    from mtpscope.traces.synthetic import write_synthetic_trace

    d = cache_dir() / folder / f"syn-{n_rounds}"
    if not (d / MANIFEST).exists():
        t0 = time.perf_counter()
        write_synthetic_trace(d, n_rounds=n_rounds, n_prompts=n_prompts, seed=seed)
        print(f"wrote {d} in {time.perf_counter() - t0:.2f} s")
    return d


def ratio(x: float, base: float) -> str:
    """``x / base`` as ``"1.23x"`` (``"n/a"`` when the baseline is 0)."""
    return f"{x / base:.2f}x" if base else "n/a"
