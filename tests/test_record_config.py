"""The run config of a recording (traces/run/record_config.py): every bad field is one TraceError naming
it, with expected vs actual; a good config passes the worker transport unchanged; the manifest's
``params`` keep the key order traces have always had (docs/TRACE_FORMAT.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from mtpscope.errors import MtpscopeError, TraceError
from mtpscope.traces.run.packing import pack, unpack
from mtpscope.traces.run.prompts import PromptSpec
from mtpscope.traces.run.record_config import CAPTURE_CHOICES, HIDDEN_CHOICES, MAX_N_DRAFT, RecordConfig, RecordJob

# (field, bad value, expected as the error states it); one case per rule and per type
BAD = [
    ("n_draft", 0, "1..64"), ("n_draft", MAX_N_DRAFT + 1, "1..64"), ("n_draft", 10**9, "1..64"),
    ("n_draft", "3", "int"), ("n_draft", 2.0, "int"), ("n_draft", True, "int"),
    ("max_tokens", 0, ">= 1"), ("max_tokens", None, "int"),
    ("temp", -0.5, "finite >= 0"), ("temp", math.nan, "finite >= 0"), ("temp", math.inf, "finite >= 0"),
    ("temp", "0.7", "real"),
    ("seed", 1.5, "int"),
    ("top_k", -1, ">= 0"),
    ("top_p", 0.0, "0 < top_p <= 1"), ("top_p", 1.5, "0 < top_p <= 1"), ("top_p", math.nan, "0 < top_p <= 1"),
    ("top_p", -math.inf, "0 < top_p <= 1"),
    ("chat", 2, "bool"), ("chat", "yes", "bool"),
    ("n_gpu_layers", None, "int"), ("n_gpu_layers", -5, ">= -1"),
    ("centroids", 3, "path | None"),
    ("centroid_top_k", 2.5, "int | None"),
    ("hidden", "f8", "f16 | f32 | off"), ("hidden", None, "choice"),
    ("n_top", 0, ">= 1"),
    ("flush_every", 0, ">= 1"), ("flush_every", -3, ">= 1"),
    ("compact", None, "bool"),
    ("flash_attn", "on", "bool"),
    ("n_threads", "4", "int | None"),
    ("hidden_target", 3, "bool"),
    ("baseline", [], "bool"),
    ("graph_capture", "graph", "bool"),
    ("repack", "no", "bool"),
]


@pytest.mark.parametrize(("name", "value", "expected"), BAD, ids=[f"{n}={v!r}" for n, v, _ in BAD])
def test_each_bad_field_is_one_error_naming_it(name: str, value: object, expected: str) -> None:
    with pytest.raises(TraceError) as ei:
        RecordConfig(**{name: value})
    e = ei.value
    assert e.key == name and e.expected == expected
    assert e.one_line().startswith(f"'{name}': ")              # the field leads the one line


def test_hidden_target_needs_stored_hidden_states() -> None:
    with pytest.raises(TraceError) as ei:
        RecordConfig(hidden="off", hidden_target=True)
    assert (ei.value.key, ei.value.expected, ei.value.actual) == ("hidden_target", "hidden f16 | f32", "hidden off")
    for h in ("f16", "f32"):
        assert RecordConfig(hidden=h, hidden_target=True).hidden_target is True


def test_messages_the_cli_prints_are_unchanged() -> None:
    """``mtpscope record`` prints these lines for bad flags (the text before this config existed)."""
    def line(**kw: object) -> str:
        with pytest.raises(MtpscopeError) as ei:
            RecordConfig(**kw)
        return ei.value.one_line()

    assert line(n_draft=65) == ("'n_draft': n_draft must be in 1..64 (llama.cpp's MTP default is 3; far more drafts "
                                "than a verify batch holds is a mistake) (expected 1..64, got 65)")
    assert line(temp=-0.5) == "'temp': temp must be a finite number >= 0 (0 = greedy) (expected finite >= 0, got -0.5)"
    assert line(top_p=0.0) == "'top_p': top_p must be in (0, 1] (1 = off) (expected 0 < top_p <= 1, got 0.0)"
    assert line(top_k=-1) == "'top_k': top_k must be >= 0 (0 = off) (expected >= 0, got -1)"
    assert line(hidden="off", hidden_target=True) == (
        "'hidden_target': hidden_target stores a hidden state: it needs hidden f16 or f32 "
        "(expected hidden f16 | f32, got hidden off)")


def test_good_values_at_the_edges_and_normalized_types() -> None:
    import numpy as np

    c = RecordConfig(n_draft=np.int64(MAX_N_DRAFT), max_tokens=1, temp=0, top_k=0, top_p=1, seed=-1, chat=1,
                     n_gpu_layers=0, centroids=Path("/m/fork.gguf"), centroid_top_k=8, hidden="off", n_top=1,
                     flush_every=1, n_threads=2)
    assert (c.n_draft, c.temp, c.top_p, c.chat, c.centroids) == (64, 0.0, 1.0, True, "/m/fork.gguf")
    assert type(c.n_draft) is int and type(c.temp) is float and type(c.top_p) is float and type(c.chat) is bool
    assert RecordConfig(top_p=1e-9).top_p == 1e-9 and RecordConfig(n_draft=1).n_draft == 1
    assert c.greedy and not RecordConfig(temp=0.1).greedy
    assert c.needs_h_inner and c.derive and not c.capture  # a centroid head needs h_inner: derived by default
    assert not RecordConfig(hidden="off").needs_h_inner and RecordConfig().derive and not RecordConfig().capture
    assert RecordConfig(graph_capture=True).capture and not RecordConfig(graph_capture=True).derive
    assert RecordConfig(hidden="off", centroids="head.gguf", graph_capture=True).capture   # the head reads it
    # seeds: llama.cpp's uint32_t (2**32 drew seed 0's numbers while the manifest said 4294967296); -1: random
    assert RecordConfig(seed=-1).seed == -1 and RecordConfig(seed=2**32 - 1).seed == 2**32 - 1
    for bad in (2**32, -2, 10**23):
        with pytest.raises(TraceError) as e:
            RecordConfig(seed=bad)
        assert e.value.key == "seed" and e.value.actual == bad
    with pytest.raises(TraceError) as e:       # nothing would read the copy (was accepted, and captured nothing)
        RecordConfig(hidden="off", graph_capture=True)
    assert e.value.key == "graph_capture"
    assert CAPTURE_CHOICES == ("derived", "graph")
    assert HIDDEN_CHOICES == ("f16", "f32", "off")


def _through_the_transport(obj: object) -> object:
    """What the recording worker gets: :func:`pack`, the control channel's JSON, :func:`unpack`."""
    header, arrays = pack(obj)
    assert arrays == []
    return unpack(json.loads(json.dumps(header, separators=(",", ":"))), arrays)


@pytest.mark.parametrize("cfg", [
    RecordConfig(),
    RecordConfig(n_draft=7, max_tokens=33, temp=0.7, seed=2**32 - 1, top_k=5, top_p=0.9, chat=True, n_gpu_layers=0,
                 centroids="/m/fork dir", centroid_top_k=4, hidden="f32", n_top=3, flush_every=2, compact=False,
                 flash_attn=True, n_threads=1, hidden_target=True, baseline=True, graph_capture=True, repack=False),
])
def test_a_good_config_round_trips_through_the_worker_transport(cfg: RecordConfig) -> None:
    back = _through_the_transport(cfg)
    assert type(back) is RecordConfig and back == cfg
    assert [type(getattr(back, f)) for f in cfg.__dataclass_fields__] == \
        [type(getattr(cfg, f)) for f in cfg.__dataclass_fields__]


def test_the_worker_job_round_trips() -> None:
    cfg = RecordConfig(n_draft=2, hidden="off")
    specs = (PromptSpec(text="The quick brown fox"), PromptSpec(tokens=(2, 651, 3823), id="t", category="c"),
             PromptSpec(messages=({"role": "user", "content": "Hello"},), path="/p.jsonl", line=3))
    job = RecordJob(target="/m/t.gguf", assistant="/m/a.gguf", prompts=specs, config=cfg)
    assert _through_the_transport(job) == job


def test_manifest_params_keep_the_trace_format_key_order() -> None:
    # docs/TRACE_FORMAT.md's params, in the order every recorded manifest has them
    order = ["n_draft", "max_tokens", "temp", "seed", "top_k", "top_p", "chat", "n_gpu_layers", "centroids",
             "centroid_top_k", "hidden", "n_top", "flush_every", "compact", "flash_attn", "n_threads", "n_ctx",
             "greedy", "isolated", "preflight", "hidden_target", "baseline", "graph_capture", "repack",
             "min_p"]
    p = RecordConfig(temp=0.5, centroids="/c", centroid_top_k=3).manifest_params(
        centroid_top_k=32, n_ctx=1024, isolated=True, preflight=False)
    assert list(p) == order
    assert (p["centroid_top_k"], p["n_ctx"], p["greedy"], p["isolated"], p["preflight"]) == (32, 1024, False, True,
                                                                                            False)


def test_the_config_is_frozen() -> None:
    from dataclasses import FrozenInstanceError, replace

    c = RecordConfig()
    with pytest.raises(FrozenInstanceError):
        c.n_draft = 4  # type: ignore[misc]  # assigning to a frozen dataclass on purpose
    with pytest.raises(TraceError, match="n_draft"):
        replace(c, n_draft=0)                          # a changed copy is checked again


def test_server_threads_counts_physical_cores_as_llama_server_does() -> None:
    """The recorder's default threads are llama-server's (``common_cpu_get_num_physical_cores``: one per distinct
    thread_siblings set); checked against /proc/cpuinfo's (physical id, core id) pairs, an independent count of
    the same cores, where Linux gives both."""
    import os
    from pathlib import Path

    from mtpscope.traces.run.record_config import server_threads

    n = server_threads()
    assert isinstance(n, int) and 1 <= n <= (os.cpu_count() or n)
    info = Path("/proc/cpuinfo")
    if not (Path("/sys/devices/system/cpu/cpu0/topology/thread_siblings").is_file() and info.is_file()):
        pytest.skip("no Linux CPU topology here")
    cores, cur = set(), {}
    for line in info.read_text().splitlines() + [""]:
        if not line.strip():
            if "physical id" in cur and "core id" in cur:
                cores.add((cur["physical id"], cur["core id"]))
            cur = {}
        elif ":" in line:
            k, v = line.split(":", 1)
            cur[k.strip()] = v.strip()
    if not cores:
        pytest.skip("/proc/cpuinfo names no cores")
    assert n == len(cores)


def _fake_sys(root: Path, siblings: list[str], atom: str | None) -> str:
    """A sysfs tree with each CPU's ``thread_siblings`` mask and, for a hybrid CPU, the efficiency cores' list."""
    for cpu, mask in enumerate(siblings):
        d = root / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "thread_siblings").write_text(mask + "\n")
    if atom is not None:
        (root / "devices" / "cpu_atom").mkdir(parents=True)
        (root / "devices" / "cpu_atom" / "cpus").write_text(atom + "\n")
    return str(root)


def test_server_threads_follows_llama_servers_rules_on_hybrid_and_ppc64(tmp_path: Path) -> None:
    """llama.cpp's ``common_cpu_get_num_math`` (common/common.cpp), worked by hand on made-up topologies: a hybrid
    Intel CPU with 8 performance cores (hyper-threaded: CPUs 0-15, siblings 2i and 2i+1) and 4 efficiency cores
    (CPUs 16-19): the server's walk counts CPUs 0, 2, ..., 14 and skips 16-19: 8 threads, where counting physical
    cores gives 12; with CPU 19 outside the affinity the server's pinning fails and it counts the 12 physical
    cores; without efficiency cores (no ``cpu_atom``), the 4 physical cores of 8 hyper-threads; a ppc64 of 4
    cores x SMT4 (16 online CPUs): 4 * min(4, 2) = 8."""
    from mtpscope.traces.run.record_config import server_threads

    p_masks = [f"{3 << (2 * (c // 2)):05x}" for c in range(16)]       # 0-15: pairs share a mask
    e_masks = [f"{1 << c:05x}" for c in range(16, 20)]
    hybrid = _fake_sys(tmp_path / "hybrid", p_masks + e_masks, "16-19")
    assert server_threads(hybrid, n_cpu=20, allowed=set(range(20)), machine="x86_64") == 8
    assert server_threads(hybrid, n_cpu=20, allowed=set(range(19)), machine="x86_64") == 12
    plain = _fake_sys(tmp_path / "plain", [f"{3 << (2 * (c // 2)):02x}" for c in range(8)], None)
    assert server_threads(plain, n_cpu=8, allowed=set(range(8)), machine="x86_64") == 4
    ppc = _fake_sys(tmp_path / "ppc", [f"{0xF << (4 * (c // 4)):04x}" for c in range(16)], None)
    assert server_threads(ppc, n_cpu=16, machine="ppc64le") == 8


def test_n_threads_is_checked_where_it_is_given(tmp_path: Path) -> None:
    """--threads 0 or -1 used to pass through (0 silently meant the default; -1 reached llama.cpp, which ran its
    own 4 threads while the manifest said -1): a value outside 1..GGML_MAX_N_THREADS (512, ggml.h) is refused by
    the config, by MtpRuntime before anything loads, and by the command line in one line."""
    from typer.testing import CliRunner

    from mtpscope.cli.main import app
    from mtpscope.traces.run.mtp_runtime import MtpRuntime

    for bad in (0, -1, 513):
        with pytest.raises(TraceError) as ei:
            RecordConfig(n_threads=bad)
        assert ei.value.key == "n_threads" and ei.value.actual == bad
        with pytest.raises(TraceError) as ei:
            MtpRuntime(tmp_path / "missing-target.gguf", tmp_path / "missing-drafter.gguf", n_threads=bad)
        assert ei.value.key == "n_threads"
    assert RecordConfig(n_threads=1).n_threads == 1 and RecordConfig(n_threads=512).n_threads == 512
    res = CliRunner().invoke(app, ["record", "--target", "t.gguf", "--assistant", "a.gguf", "--prompt", "x",
                                   "--out", str(tmp_path / "o"), "--threads", "0"])
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == [
        "mtpscope: --threads must be in 1..512 (unset: llama-server's default, one per physical core) (got 0)"]
