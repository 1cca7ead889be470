"""A GGUF's tokenizer as writer values: every ``tokenizer.*`` key, whole or as a consistent first-n subset.

One job: the vocabulary a writer copies into a new GGUF (the converter's ``--vocab-from``, the demo models).
:func:`tokenizer_kv` reads the ``tokenizer.*`` keys of a GGUF with the hardened reader
(:func:`inspector.gguf.open_gguf`) as :class:`gguf_write.MetaValue` records (token strings as raw bytes,
copied verbatim); :func:`subset_kv` keeps the first ``n`` tokens with their scores and types, and only the
merges whose two parts and whose result all lie inside that set (llama.cpp loads and runs such a file,
docs/reference/gemma4-assistant-facts.md section 5).

May import: inspector.gguf, inspector.gguf_write, mtpscope.errors.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from mtpscope.errors import LayoutError
from mtpscope.inspector.gguf import open_gguf
from mtpscope.inspector.gguf_write import MetaValue, meta_value

PREFIX = "tokenizer."
TOKENS = "tokenizer.ggml.tokens"
#: the smallest subset :func:`subset_kv` makes
MIN_SUBSET = 16

KV = tuple[tuple[str, MetaValue], ...]


def tokenizer_kv(path: str | os.PathLike[str]) -> KV:
    """Every ``tokenizer.*`` key of the GGUF at ``path``, in file order, as writer values.

    Token strings and merges are lists of raw ``bytes``; numeric arrays numpy copies. Read once per
    (path, size, mtime): callers share the result, so they must not modify it.

    Raises:
        GGUFFormatError / UnsupportedFileError: ``path`` is not a readable GGUF (from :func:`open_gguf`).
        FileNotFoundError: no such file.
    """
    p = Path(path)
    st = p.stat()
    return _read(os.fspath(p.resolve()), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _read(path: str, _size: int, _mtime_ns: int) -> KV:
    with open_gguf(path) as f:
        return tuple((k, meta_value(kv)) for k, kv in f.kv.items() if k.startswith(PREFIX))


def n_tokens(kv: KV) -> int | None:
    """Length of ``tokenizer.ggml.tokens`` in ``kv``, None when absent."""
    toks = dict(kv).get(TOKENS)
    return None if toks is None else len(toks.value)


def subset_kv(kv: KV, n: int, path: str | os.PathLike[str] | None = None) -> KV:
    """The first ``n`` tokens of a tokenizer (``kv`` from :func:`tokenizer_kv`), consistent for llama.cpp.

    ``tokenizer.ggml.tokens`` keeps its first ``n`` entries, ``scores`` / ``token_type`` likewise, ``merges``
    only those whose two parts and whose result are all among the kept tokens; other keys are unchanged.

    Raises:
        LayoutError: ``kv`` has no token list (``path`` named in the error).
        ValueError: ``n`` outside ``16..len(tokens)``.
    """
    kvd = dict(kv)
    if TOKENS not in kvd:
        raise LayoutError("tokenizer GGUF has no token list", path=path, key=TOKENS)
    tokens = kvd[TOKENS].value
    if not MIN_SUBSET <= n <= len(tokens):
        raise ValueError(f"n_subset must be in {MIN_SUBSET}..{len(tokens)}, got {n}")
    keep = tokens[:n]
    inside = set(keep)
    merges = []
    for m in kvd["tokenizer.ggml.merges"].value if "tokenizer.ggml.merges" in kvd else ():
        left, sep, right = m.partition(b" ")
        if sep and left in inside and right in inside and left + right in inside:
            merges.append(m)
    out: list[tuple[str, MetaValue]] = []
    for k, v in kv:
        if k == TOKENS:
            v = MetaValue(v.type, list(keep), v.sub_type)
        elif k in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
            v = MetaValue(v.type, v.value[:n].copy(), v.sub_type)
        elif k == "tokenizer.ggml.merges":
            v = MetaValue(v.type, merges, v.sub_type)
        out.append((k, v))
    return tuple(out)


__all__ = ["MIN_SUBSET", "PREFIX", "TOKENS", "n_tokens", "subset_kv", "tokenizer_kv"]
