"""Drafter ↔ target pairing: can this drafter run against this target, and which target layers donate K/V.

One job: :func:`check_pairing` (facts §1 "Pairing rules", src/llama-model.cpp KV sharing): target arch,
backbone width, identical vocabulary, per layer type the KV heads and head dims, windows and rope bases,
the KV donor layers under llama.cpp's and HF's rules. Returns a :class:`findings.Pairing`.

May import: mtpscope.errors, inspector.findings, inspector.layouts, inspector.checks (helpers),
inspector.diff (byte comparison of string arrays).
"""

from __future__ import annotations

import os
from typing import Any

from mtpscope.errors import LayoutError
from mtpscope.inspector import layouts as L
from mtpscope.inspector.checks import key_value
from mtpscope.inspector.findings import ERROR, INFO, WARNING, Finding, Pairing, finding


def check_pairing(drafter: Any, target: Any, hp: L.HParams | None = None) -> Pairing:
    """Drafter ↔ target checks (facts §1 "Pairing rules", src/llama-model.cpp KV sharing).

    Checks: target arch ``gemma4``; target ``embedding_length`` == drafter backbone width; identical
    vocabulary (token text, in order); per layer type (sliding / full) the drafter's ``n_head_kv`` and head
    dim equal the target's at the donor layer; windows and rope bases; which target layers donate K/V
    (llama.cpp: n_layer−2 for sliding, n_layer−1 for full; HF: last layer of each type) and, on a target with
    KV-shared layers, whose cache that is (llama.cpp's ``reuse`` rule vs HF's ``"store"`` layer: an error when
    they differ).

    Args:
        drafter / target: open GGUF files.
        hp: drafter hparams if already read.
    """
    fs: list[Finding] = []
    add = fs.append
    tpath = os.fspath(getattr(target, "path", ""))
    donors: dict[str, int | None] = {"sliding": None, "full": None}
    donors_hf: dict[str, int | None] = {"sliding": None, "full": None}
    if target.architecture != L.ARCH_TARGET:
        arch = target.architecture      # (no string key: "no general.architecture", not Python's None)
        got = arch if arch is not None else "no general.architecture"
        add(finding(ERROR, "E_PAIR_TARGET_ARCH", "general.architecture", L.ARCH_TARGET, got,
                    f"the target must be a {L.ARCH_TARGET} model, found {got if arch is None else repr(arch)}"))
        return Pairing(tpath, False, tuple(fs), donors, donors_hf)
    if hp is None:
        hp = L.read_hparams(drafter)
    try:
        thp = L.read_hparams(target)
    except LayoutError as e:
        add(finding(ERROR, "E_KEY_VALUE" if e.actual is not None else "E_KEY_MISSING", e.key or "",
               e.expected or "present", e.actual, f"target: {e.message}"))
        return Pairing(tpath, False, tuple(fs), donors, donors_hf)
    if hp.n_embd_backbone is not None and thp.n_embd != hp.n_embd_backbone:
        add(finding(ERROR, "E_PAIR_BACKBONE", f"{L.ARCH_TARGET}.embedding_length", hp.n_embd_backbone, thp.n_embd,
               f"the drafter expects a backbone width of {hp.n_embd_backbone}, the target's "
               f"embedding_length is {thp.n_embd}"))
    _compare_vocab(drafter, target, add)
    n = thp.n_layer
    if n >= 2:
        donors = {"sliding": n - 2, "full": n - 1}
    donors_hf = {"sliding": thp.last_layer_of(True), "full": thp.last_layer_of(False)}
    for kind, il in donors.items():
        if il is not None and thp.layers[il].sliding != (kind == "sliding"):
            add(finding(ERROR, "E_PAIR_KV_DONOR", f"blk.{il}", kind, "sliding" if thp.layers[il].sliding else "full",
                   f"llama.cpp takes {kind} K/V from target layer {il}, which is a "
                   f"{'sliding' if thp.layers[il].sliding else 'full'} layer; HF uses layer {donors_hf[kind]} "
                   "(llama.cpp runs and the drafter silently reads another layer's cache: a donor missing from "
                   "the target's cache of that type resolves to that cache's first layer)"))
    # the target's own KV sharing (E2B / E4B): a donor without K/V reads an earlier layer's cache
    cache = {k: (thp.kv_owner(il) if il is not None else None) for k, il in donors.items()}
    cache_hf = {"sliding": thp.kv_store_hf(True), "full": thp.kv_store_hf(False)}
    if thp.shared_kv_layers:
        for kind in ("sliding", "full"):
            if cache[kind] is not None and cache_hf[kind] is not None and cache[kind] != cache_hf[kind]:
                add(finding(ERROR, "E_PAIR_KV_DONOR", f"{L.ARCH_TARGET}.attention.shared_kv_layers", cache_hf[kind],
                       cache[kind], f"with {thp.shared_kv_layers} KV-shared target layers llama.cpp's drafter reads "
                       f"the {kind} cache of target layer {cache[kind]}, HF's reads layer {cache_hf[kind]}"))
    shared = (f"; through the target's {thp.shared_kv_layers} KV-shared layers the caches of layers "
              f"{cache['sliding']} and {cache['full']} (HF: {cache_hf['sliding']}, {cache_hf['full']})"
              if thp.shared_kv_layers else "")
    add(finding(INFO, "I_PAIR_KV_DONORS", "", None, {"llama.cpp": donors, "hf": donors_hf, "cache": cache,
                                                      "cache_hf": cache_hf},
           f"K/V donors: sliding ← target layer {donors['sliding']}, full ← target layer {donors['full']} "
           f"(HF: {donors_hf['sliding']}, {donors_hf['full']}){shared}"))
    for kind, sliding in (("sliding", True), ("full", False)):
        d_layers = [ly for ly in hp.layers if ly.sliding == sliding]
        il = donors_hf[kind]
        if not d_layers or il is None:
            continue
        t_ly = thp.layers[il]
        for ly in d_layers:
            if ly.n_head_kv != t_ly.n_head_kv:
                add(finding(ERROR, "E_PAIR_KV_HEADS", f"{hp.arch}.attention.head_count_kv[{ly.il}]", t_ly.n_head_kv,
                       ly.n_head_kv, f"drafter {kind} layer {ly.il} has n_head_kv {ly.n_head_kv}, the target's "
                       f"{kind} layers have {t_ly.n_head_kv}"))
            if ly.head_dim != t_ly.head_dim:
                key = "attention.key_length_swa" if sliding else "attention.key_length"
                add(finding(ERROR, "E_PAIR_HEAD_DIM", f"{hp.arch}.{key}", t_ly.head_dim, ly.head_dim,
                       f"drafter {kind} head dim {ly.head_dim} != target {t_ly.head_dim}"))
    # a different window: llama.cpp masks with the drafter's own window, as HF does (kept a warning);
    # different rope bases: the drafter's queries and the target's cached keys are rotated differently,
    # llama.cpp runs and drafts change (checked: tests/test_runtime_verdicts.py)
    for key, code, sev in (("attention.sliding_window", "W_PAIR_WINDOW", WARNING),
                           ("rope.freq_base", "E_PAIR_ROPE", ERROR), ("rope.freq_base_swa", "E_PAIR_ROPE", ERROR)):
        a, b = key_value(drafter, f"{hp.arch}.{key}"), key_value(target, f"{L.ARCH_TARGET}.{key}")
        if a is not None and b is not None and a != b:
            why = "" if sev == WARNING else "; queries and the target's cached keys are rotated differently"
            add(finding(sev, code, f"{hp.arch}.{key}", b, a, f"{key}: drafter {a}, target {b}{why}"))
    ok = not any(x.severity == ERROR for x in fs)
    return Pairing(tpath, ok, tuple(fs), donors, donors_hf, cache, cache_hf)


def _compare_vocab(a: Any, b: Any, add: Any) -> None:
    ta, tb = a.get("tokenizer.ggml.tokens"), b.get("tokenizer.ggml.tokens")
    if ta is None or tb is None:
        add(finding(ERROR, "E_PAIR_VOCAB", "tokenizer.ggml.tokens", "both files carry a tokenizer",
               {"drafter": ta is not None, "target": tb is not None}, "cannot compare vocabularies"))
        return
    if len(ta) != len(tb):
        add(finding(ERROR, "E_PAIR_VOCAB", "tokenizer.ggml.tokens", len(tb), len(ta),
               f"drafter has {len(ta)} tokens, target {len(tb)}"))
        return
    from mtpscope.inspector.diff import string_array_bytes

    ra, rb = string_array_bytes(ta), string_array_bytes(tb)
    if ra is not None and ra == rb:
        return  # byte-identical token lists (the common case, no decoding of 262144 strings)
    la, lb = ta.to_list(), tb.to_list()
    if la != lb:
        diff = [i for i, (x, y) in enumerate(zip(la, lb, strict=True)) if x != y]
        add(finding(ERROR, "E_PAIR_VOCAB", "tokenizer.ggml.tokens", "identical token text", f"{len(diff)} differ",
               f"{len(diff)} token strings differ, first at id {diff[0]}: drafter {la[diff[0]]!r}, "
               f"target {lb[diff[0]]!r}"))


__all__ = ["check_pairing"]
