"""The demo pair in the real runtime (llama-cpp-python 0.3.36): it loads, tokenizes like the real
tokenizer, generates the passage, the noise-free drafter's greedy drafts equal the target's next tokens
(driven here through the low-level C API, independently of traces/run/recorder.py), and the demo traces
show the acceptance rates predicted by construction."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.llama

L = pytest.importorskip("llama_cpp")
X = pytest.importorskip("llama_cpp.llama_cpp_ext")

from mtpscope.cache import vocab_test_pairs  # noqa: E402  # after the importorskip of llama_cpp
from mtpscope.demo import build as demo  # noqa: E402  # after the importorskip of llama_cpp


class Pair:
    """Target + MTP drafter contexts, greedy, flash attention off (facts section 5)."""

    def __init__(self, target: Path, drafter: Path, n_ctx: int = 512) -> None:
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        self.tm = L.llama_model_load_from_file(str(target).encode(), mp)
        self.dm = L.llama_model_load_from_file(str(drafter).encode(), mp)
        assert self.tm and self.dm
        self.vocab = L.llama_model_get_vocab(self.tm)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.n_bb = L.llama_model_n_embd(self.tm)
        cp = L.llama_context_default_params()
        cp.n_ctx = cp.n_batch = cp.n_ubatch = n_ctx
        cp.flash_attn_type = 0
        self.tctx = L.llama_init_from_model(self.tm, cp)
        X.llama_set_embeddings_nextn(self.tctx, True, False)
        dp = L.llama_context_default_params()
        dp.n_ctx = dp.n_batch = dp.n_ubatch = n_ctx
        dp.flash_attn_type = 0
        dp.ctx_type = L.LLAMA_CONTEXT_TYPE_MTP
        dp.ctx_other = self.tctx
        self.dctx = L.llama_init_from_model(self.dm, dp)
        assert self.dctx
        X.llama_set_embeddings_nextn(self.dctx, True, True)
        self.batch = L.llama_batch_init(n_ctx, 0, 1)
        self.dbatch = L.llama_batch_init(1, self.n_bb, 1)
        self._tok = (L.llama_token * 1)()
        # llama_batch_init with embd > 0 leaves `token` NULL: give it our buffer, NULL it before free
        self.dbatch.token = ctypes.cast(self._tok, ctypes.POINTER(L.llama_token))

    def tokenize(self, text: str, bos: bool = True) -> list[int]:
        buf = (L.llama_token * 4096)()
        raw = text.encode()
        n = L.llama_tokenize(self.vocab, raw, len(raw), buf, 4096, bos, False)
        assert n >= 0
        return list(buf[:n])

    def detok(self, ids: list[int]) -> str:
        piece = ctypes.create_string_buffer(256)
        out = b""
        for t in ids:
            k = L.llama_token_to_piece(self.vocab, t, piece, 256, 0, False)
            out += piece.raw[:k]
        return out.decode()

    def target(self, tokens: list[int], pos0: int) -> tuple[np.ndarray, np.ndarray]:
        b = self.batch
        b.n_tokens = len(tokens)
        for i, t in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, pos0 + i, 1, 1
            b.seq_id[i][0] = 0
        assert L.llama_decode(self.tctx, b) == 0
        logits = np.ctypeslib.as_array(L.llama_get_logits(self.tctx), shape=(len(tokens), self.n_vocab)).copy()
        hs = np.stack([np.ctypeslib.as_array(X.llama_get_embeddings_nextn_ith(self.tctx, i), shape=(self.n_bb,))
                       for i in range(len(tokens))]).copy()
        return logits, hs

    def draft(self, token: int, h: np.ndarray, pos: int) -> tuple[np.ndarray, np.ndarray]:
        b = self.dbatch
        b.n_tokens = 1
        b.token[0], b.pos[0], b.n_seq_id[0], b.logits[0] = token, pos, 1, 1
        b.seq_id[0][0] = 0
        h32 = np.ascontiguousarray(h, np.float32)
        ctypes.memmove(b.embd, h32.ctypes.data, 4 * self.n_bb)
        assert L.llama_decode(self.dctx, b) == 0
        logits = np.ctypeslib.as_array(L.llama_get_logits_ith(self.dctx, 0), shape=(self.n_vocab,)).copy()
        h_next = np.ctypeslib.as_array(X.llama_get_embeddings_nextn_ith(self.dctx, 0), shape=(self.n_bb,)).copy()
        return logits, h_next

    def rollback(self, keep: int) -> None:
        L.llama_memory_seq_rm(L.llama_get_memory(self.tctx), 0, keep, -1)

    def close(self) -> None:
        self.dbatch.token = ctypes.POINTER(L.llama_token)()
        L.llama_batch_free(self.dbatch)
        L.llama_batch_free(self.batch)
        L.llama_free(self.dctx)
        L.llama_free(self.tctx)
        L.llama_model_free(self.dm)
        L.llama_model_free(self.tm)


def _mtp(pair: Pair, prompt: str, n_draft: int = 3, rounds: int = 8) -> tuple[int, int, list[bool]]:
    """Greedy MTP loop; returns (accepted, drafted, [first draft == target's token] per round)."""
    toks = pair.tokenize(prompt)
    logits, hs = pair.target(toks, 0)
    pending, h, pos = int(logits[-1].argmax()), hs[-1], len(toks)
    acc = drafted = 0
    first_ok = []
    for _ in range(rounds):
        drafts, t, hh = [], pending, h
        for _k in range(n_draft):
            lg, hh = pair.draft(t, hh, pos)   # every step at the pending position (KV end + 1)
            t = int(lg.argmax())
            drafts.append(t)
        logits, hs = pair.target([pending, *drafts], pos)
        tgt = logits.argmax(1)
        first_ok.append(drafts[0] == int(tgt[0]))
        n = 0
        while n < n_draft and drafts[n] == int(tgt[n]):
            n += 1
        acc, drafted = acc + n, drafted + n_draft
        pair.rollback(pos + 1 + n)
        pending, h, pos = int(tgt[n]), hs[n], pos + 1 + n
    return acc, drafted, first_ok


@pytest.fixture(scope="module")
def clean_pair(demo_dir) -> Pair:
    p = Pair(demo_dir.target, demo_dir.drafter_upstream)
    yield p
    p.close()


def _real_token_ids(texts: list[str]) -> list[int]:
    """Ids by exact token text in the real tokenizer file (read with the project's GGUF reader)."""
    from mtpscope.cache import vocab_path
    from mtpscope.inspector.gguf import open_gguf

    with open_gguf(vocab_path()) as f:
        toks = f.get("tokenizer.ggml.tokens")
        want = set(texts)
        found = {}
        for i in range(len(toks)):
            s = toks[i]
            if s in want:
                found[s] = i
    return [found[t] for t in texts]


def test_demo_pair_loads_and_tokenizes_a_real_prompt(clean_pair: Pair) -> None:
    assert clean_pair.n_vocab == 262144
    assert L.llama_model_n_layer(clean_pair.tm) == 6
    assert L.llama_model_n_layer_nextn(clean_pair.dm) == 4
    ids = clean_pair.tokenize("The quick brown fox jumps", bos=True)
    expected = _real_token_ids(["<bos>", "The", "\u2581quick", "\u2581brown", "\u2581fox", "\u2581jumps"])
    assert ids == expected
    assert clean_pair.detok(ids[1:]) == "The quick brown fox jumps"


def test_demo_target_tokenizes_like_llama_cpp_test_pairs(clean_pair: Pair) -> None:
    inp_path, out_path = vocab_test_pairs()
    inp = inp_path.read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    out = out_path.read_text(encoding="utf-8").split("\n")
    assert len(inp) >= 20
    for text, ids in zip(inp, out, strict=False):
        expected = [int(x) for x in ids.split()]
        assert clean_pair.tokenize(text, bos=False) == expected, repr(text)


def test_target_generates_the_passage(clean_pair: Pair) -> None:
    toks = clean_pair.tokenize("The quick brown fox")
    out: list[int] = []
    logits, _ = clean_pair.target(toks, 0)
    pos = len(toks)
    for _ in range(6):
        t = int(logits[-1].argmax())
        out.append(t)
        logits, _ = clean_pair.target([t], pos)
        pos += 1
    clean_pair.rollback(0)
    assert clean_pair.detok(out) == " jumps over lazy dogs while seven"


def test_noise_free_drafts_equal_the_target_tokens(clean_pair: Pair) -> None:
    for prompt in ("Tell me a story about dragons.", "Hello world"):
        acc, drafted, first_ok = _mtp(clean_pair, prompt)
        clean_pair.rollback(0)
        assert acc == drafted == 24 and all(first_ok)


def test_noisy_drafter_accepts_some_but_not_all(demo_dir) -> None:
    p = Pair(demo_dir.target, demo_dir.drafter_upstream_noisy)
    try:
        acc, drafted, _ = _mtp(p, "The quick brown fox", rounds=12)
    finally:
        p.close()
    assert 0 < acc < drafted


def test_demo_traces_acceptance_by_construction(demo_dir) -> None:
    import pyarrow.parquet as pq

    for d in (demo_dir.traces_clean, demo_dir.traces_noisy):
        if not (d / "manifest.json").exists():
            pytest.skip("demo traces not recorded (traces.recorder unavailable)")
    clean = pq.read_table(sorted((demo_dir.traces_clean / "rounds").glob("*.parquet"))).to_pandas()
    noisy = pq.read_table(sorted((demo_dir.traces_noisy / "rounds").glob("*.parquet"))).to_pandas()
    assert clean["n_draft"].sum() > 0
    assert clean["n_accepted"].sum() == clean["n_draft"].sum()          # acceptance rate exactly 1.0
    per_prompt = noisy.groupby("prompt_id")[["n_accepted", "n_draft"]].sum()
    rate = per_prompt["n_accepted"] / per_prompt["n_draft"]
    assert ((rate > 0) & (rate < 1)).any()
    assert 0 < noisy["n_accepted"].sum() < noisy["n_draft"].sum()
    # every emitted token of the clean trace is the target's token: the text walks the passage
    cfg = demo.load_record_config()
    assert sorted(clean["prompt_id"].unique().tolist()) == list(range(len(cfg["record"]["prompts"])))


@pytest.mark.slow
def test_clean_trace_shows_misplaced_tokens_as_unreachable(demo_dir) -> None:
    """The fork file's centroid head misplaces some passage tokens on purpose: in the clean trace (every
    dense draft accepted) the sparse head misses exactly those targets whose ordering row is not among
    the top-k centroids, and some of them are misplaced tokens."""
    import pyarrow.parquet as pq

    from mtpscope.inspector.gguf import open_gguf

    if not (demo_dir.traces_clean / "manifest.json").exists():
        pytest.skip("demo traces not recorded")
    steps = pq.read_table(sorted((demo_dir.traces_clean / "steps").glob("*.parquet"))).to_pandas()
    with open_gguf(demo_dir.drafter_fork) as f:
        ordering = np.array(f.tensor_data("mtp.token_ordering.weight"))
        n_c = f.get("gemma4_assistant.n_centroids")
    vsc = 262144 // n_c
    row_of = np.empty(262144, np.int64)
    row_of[ordering] = np.arange(262144) // vsc
    reachable = [int(row_of[t]) in set(ids) for t, ids in zip(steps["target_token"], steps["centroid_ids"])]
    assert reachable == steps["target_in_candidates"].tolist()
    missed = steps.loc[~steps["target_in_candidates"], "target_token"].astype(int).unique().tolist()
    assert missed, "the demo's misplaced tokens should make the sparse head miss"
    cfg = demo.load_record_config()
    voc = demo.load_vocab(cfg["vocab"])
    tw = demo.target_weights(voc, seed=cfg["seed"])
    _, intended, _ = demo.centroid_head(tw, voc, n_centroids=n_c, misplace=0.0, seed=cfg["seed"])
    moved = set(ordering[np.flatnonzero(intended != ordering)].tolist())
    assert set(missed) & moved


def test_cli_import_does_not_import_numpy() -> None:
    """Every ``mtpscope`` command pays for the CLI's imports; numpy (about 50 ms) is loaded by the commands that
    need it, not by ``mtpscope.cli.main``. Independent of the demo, so it runs even where the demo is stale."""
    import subprocess
    import sys

    code = "import sys\nimport mtpscope.cli.main\nprint(sorted(m for m in ('numpy', 'pandas', 'pyarrow') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "[]"


def test_demo_build_on_a_current_demo_does_not_import_numpy(demo_dir) -> None:
    """The stamp check of ``mtpscope demo build`` runs at every make test / make run: it must not pay for
    numpy (or the builder) when nothing changed."""
    import subprocess
    import sys

    if not (demo_dir.traces_clean / "manifest.json").exists():
        pytest.skip("demo traces not recorded, so the demo is never 'current'")
    code = ("import sys\nfrom mtpscope.cli.main import app\n"
            "try:\n    app(['demo', 'build', '-q'])\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print('numpy' in sys.modules, 'mtpscope.demo.build' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[-2:] == ["False", "False"]
    assert out[0] == str(demo_dir.root)
