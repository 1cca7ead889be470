"""``open_gguf(path, like=other)``: a string array that repeats ``other``'s byte for byte (a drafter's copy of its
target's vocabulary) is taken from ``other`` instead of walked again -- the same records as a plain open
(gguf-py, an independent reader, agrees on every value) -- and any difference walks it."""

from __future__ import annotations

from pathlib import Path

import gguf as gguf_py
import numpy as np
import pytest

from mtpscope.inspector import gguf as G
from tests.gguf_oracle import assert_parity

V = gguf_py.GGUFValueType
TOKENS = [f"tok{i}" for i in range(300)] + ["▁naïve", "日本", ""]


def _file(write_gguf, name: str, tokens: list[str], merges: list[str], extra: str = "x") -> Path:
    return write_gguf(name, "gemma4", kv=[("tokenizer.ggml.tokens", tokens, V.ARRAY, V.STRING),
                                          ("tokenizer.ggml.merges", merges, V.ARRAY, V.STRING),
                                          ("general.name", extra, V.STRING)],
                      tensors=[("t", np.zeros((2, 32), np.float32))])


def test_repeated_arrays_are_reused_and_equal_a_walk(write_gguf, monkeypatch: pytest.MonkeyPatch) -> None:
    merges = ["a b", "c d", "tok1 tok2"]
    a = _file(write_gguf, "a.gguf", TOKENS, merges, extra="first")
    b = _file(write_gguf, "b.gguf", TOKENS, merges, extra="a longer name: the arrays sit at other offsets")
    walks: list[str] = []
    orig = G._Parser.walk_strings

    def spy(self, start, n, key):
        walks.append(key)
        return orig(self, start, n, key)

    monkeypatch.setattr(G._Parser, "walk_strings", spy)
    with G.open_gguf(a) as fa:
        assert walks == ["tokenizer.ggml.tokens", "tokenizer.ggml.merges"]
        walks.clear()
        with G.open_gguf(b, like=fa) as fb:
            assert walks == []                                   # both arrays taken from a
            with G.open_gguf(b) as plain:
                for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
                    got, want = fb.kv[key].value, plain.kv[key].value
                    np.testing.assert_array_equal(got._elem_offsets, want._elem_offsets)
                    assert got.to_list() == want.to_list()
                assert fb.data_offset == plain.data_offset and fb.tensors == plain.tensors
            assert_parity(fb, gguf_py.GGUFReader(str(b)))
            assert fb.get("tokenizer.ggml.tokens")[301] == "日本"


@pytest.mark.parametrize("change", ["one byte", "one token more", "other merges"])
def test_any_difference_walks_the_array(write_gguf, change: str) -> None:
    merges = ["a b", "c d"]
    a = _file(write_gguf, "a.gguf", TOKENS, merges)
    toks, mg = list(TOKENS), list(merges)
    if change == "one byte":
        toks[150] = "tok15X"          # same length, one byte differs
    elif change == "one token more":
        toks.append("extra")
    else:
        mg[1] = "c e"
    b = _file(write_gguf, "b.gguf", toks, mg)
    with G.open_gguf(a) as fa, G.open_gguf(b, like=fa) as fb:
        assert fb.get("tokenizer.ggml.tokens").to_list() == toks
        assert fb.get("tokenizer.ggml.merges").to_list() == mg
        assert_parity(fb, gguf_py.GGUFReader(str(b)))
