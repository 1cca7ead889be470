"""Convert a Hugging Face Gemma 4 target (``Gemma4ForCausalLM``, or the language model of a
``Gemma4ForConditionalGeneration``) to a ``gemma4`` GGUF, every published family: dense (31B, K = V on the
full layers), per-layer embeddings with KV-shared layers (E2B / E4B) and the mixture-of-experts block
(26B-A4B).

One job: the target's GGUF keys (:func:`target_kv`), its tensors in llama.cpp's names and layout
(:func:`map_target_tensors`) and the conversion (:func:`convert_target`). Names come from
:mod:`inspector.hf_names`; what llama.cpp loads is ``src/models/gemma4.cpp`` ``load_arch_tensors`` /
``load_arch_hparams`` (llama-cpp-python 0.3.36), the keys llama.cpp's converter writes are
``conversion/gemma.py`` ``Gemma4Model.set_gguf_parameters``:

* ``attention.shared_kv_layers`` = ``num_kv_shared_layers`` (layers ``il >= n_layer - shared`` have no K/V of
  their own; llama.cpp's ``reuse`` maps them to layer ``n_layer - shared - 2`` (sliding) / ``- 1`` (full));
* ``embedding_length_per_layer_input`` = ``hidden_size_per_layer_input`` (0 = no PLE; the loader needs the key);
  ``per_layer_token_embd`` ``ne [n_embd_per_layer·n_layer, n_vocab]`` — llama.cpp sizes it by ``n_vocab``,
  so ``vocab_size_per_layer_input`` must equal ``vocab_size`` (refused otherwise: the file would not load);
* ``expert_count`` / ``expert_used_count`` / ``expert_feed_forward_length`` from ``num_experts`` /
  ``top_k_experts`` / ``moe_intermediate_size``; the router's ``per_expert_scale`` becomes
  ``ffn_down_exps.scale`` (llama.cpp scales each selected expert's down projection by it, which equals HF's
  scaling of the normalised top-k weights);
* ``feed_forward_length`` per layer when ``use_double_wide_mlp`` doubles the KV-shared layers' MLP;
* K = V (``attention_k_eq_v``): the full layers carry no ``attn_v``; llama.cpp then uses K as V.

An HF ``Linear`` weight of numpy shape ``(out, in)`` is written as-is (GGUF ``ne [in, out]``); the expert
tensors ``(n_expert, rows, cols)`` likewise (``ne [cols, rows, n_expert]``).

The checkpoint is held to the layout its config implies before anything is written (:func:`target_layout`,
:func:`target_tensor_problems`).

May import: mtpscope.errors, inspector.convert_common, inspector.gguf_write, inspector.hf_audit (the tensor
problems' record), inspector.hf_config, inspector.hf_names, inspector.layouts, inspector.safetensors (dtypes; the
data, read once the headers pass).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtpscope.errors import HFCheckpointError
from mtpscope.inspector import layouts as L
from mtpscope.inspector.convert_common import (
    ConvertResult,
    Source,
    common_kv,
    ordered,
    refuse_nonfinite,
    tokenizer_kv_for,
    values_of,
    write_converted,
)
from mtpscope.inspector.gguf_write import MetaValue, f32, string, u32
from mtpscope.inspector.hf_audit import TensorProblem, layout_problems, refuse_problems
from mtpscope.inspector.hf_config import TextHParams, text_hparams
from mtpscope.inspector.hf_names import target_gguf_name, target_hf_name
from mtpscope.inspector.layouts import ARCH_TARGET
from mtpscope.inspector.safetensors import HFTensor, lazy_tensors


def target_kv(hp: TextHParams) -> list[tuple[str, MetaValue]]:
    """The ``gemma4.*`` keys of a target with these hyperparameters (see the module docstring), in the order
    they are written (``general.name`` not included)."""
    a = ARCH_TARGET + "."
    kv = [(k, v) for k, v in common_kv(ARCH_TARGET, hp) if k != a + "attention.shared_kv_layers"]
    kv.append((a + "attention.shared_kv_layers", u32(hp.shared_kv_layers)))
    kv.append((a + "embedding_length_per_layer_input", u32(hp.n_embd_per_layer)))
    if hp.n_expert:
        kv += [(a + "expert_count", u32(hp.n_expert)), (a + "expert_used_count", u32(hp.n_expert_used)),
               (a + "expert_feed_forward_length", u32(hp.n_ff_exp))]
    if hp.softcap:
        kv.append((a + "final_logit_softcapping", f32(hp.softcap)))
    return kv


def check_target_hparams(hp: TextHParams, where: str) -> None:
    """Refuse what llama.cpp cannot load from a converted target.

    Raises:
        HFCheckpointError: PLE with ``vocab_size_per_layer_input`` != ``vocab_size`` (the file would not
            load); KV-shared layers whose donors (llama.cpp's rule: layers ``n_kv - 2`` sliding, ``n_kv - 1``
            full, ``n_kv = n_layer - num_kv_shared_layers``) are not of those types (llama.cpp aborts creating a
            context, ``GGML_ASSERT(map_layer_ids.find(il_reuse) != map_layer_ids.end())``; the inspector's
            ``E_SHARED_KV_LAYOUT``).
    """
    if hp.n_embd_per_layer and hp.n_vocab_per_layer != hp.n_vocab:
        raise HFCheckpointError("per-layer embeddings over another vocabulary than the model's: llama.cpp sizes "
                                "per_layer_token_embd by vocab_size", path=where, key="vocab_size_per_layer_input",
                                expected=hp.n_vocab, actual=hp.n_vocab_per_layer)
    if hp.shared_kv_layers:
        n_kv = hp.n_layer - hp.shared_kv_layers
        if n_kv < 2 or not hp.is_swa[n_kv - 2] or hp.is_swa[n_kv - 1]:
            raise HFCheckpointError(
                "KV-shared layers llama.cpp cannot place: it reuses layer n_kv-2 for sliding and n_kv-1 for full "
                "attention (n_kv = num_hidden_layers - num_kv_shared_layers) and aborts creating a context when "
                "those are of the other type", path=where,
                key="layer_types / num_kv_shared_layers", expected="layer n_kv-2 sliding, n_kv-1 full",
                actual=[("sliding" if s else "full") for s in hp.is_swa[max(n_kv - 2, 0):max(n_kv, 0)]])


@dataclass(frozen=True)
class _Keys:
    """A key table with no tensors, for :func:`inspector.layouts.read_hparams`."""

    architecture: str
    kv: Mapping[str, Any]
    tensors: tuple[Any, ...] = ()
    path: str = "config.json"

    def get(self, key: str, default: Any = None) -> Any:
        return self.kv.get(key, default)


def target_layout(hp: TextHParams) -> tuple[L.HParams, tuple[L.ExpectedTensor, ...]]:
    """The target llama.cpp reads back from the keys :func:`target_kv` writes for ``hp``
    (:func:`inspector.layouts.read_hparams`) and the tensors it expects of it
    (:func:`inspector.layouts.expected_target_layout`, ``attn_v`` as ``attention_k_eq_v`` says): the one layout of a
    target config, which the converter holds a checkpoint to and ``estimate`` lays a published config out by."""
    kv = {k: (v.value.tolist() if hasattr(v.value, "tolist") else v.value) for k, v in target_kv(hp)}
    kv["tokenizer.ggml.tokens"] = range(hp.n_vocab)        # read for its length only
    lhp = L.read_hparams(_Keys(ARCH_TARGET, kv))
    return lhp, L.expected_target_layout(lhp, k_eq_v=hp.k_eq_v)


def target_tensor_problems(hp: TextHParams, headers: Mapping[str, HFTensor], where: str) -> list[TensorProblem]:
    """Every tensor of a target checkpoint against :func:`target_layout`, from the safetensors headers alone (no
    tensor data is read), by the one check of :func:`inspector.hf_audit.layout_problems`: each one the converter
    writes maps to a tensor of the layout (a name the mapping does not know, a layer past ``num_hidden_layers``, a
    MoE or per-layer embedding tensor the config does not enable are refused), with its shape (numpy order) and a
    floating-point dtype; every required tensor is there. ``lm_head`` (tied) and the vision / audio towers are left
    out, as the converter leaves them.

    Args:
        hp: the config read by :func:`inspector.hf_config.text_hparams`.
        headers: HF name -> safetensors header entry.
        where: the config.json (its folder is named for a missing tensor of a sharded checkpoint).
    """
    lhp, layout = target_layout(hp)
    prefix = "model.language_model." if any(n.startswith("model.language_model.") for n in headers) else "model."
    return layout_problems(headers.values(), {e.name: e for e in layout}, lhp.n_layer, os.fspath(Path(where).parent),
                           gguf_of=target_gguf_name, hf_of=lambda g: target_hf_name(g, prefix),
                           required=lambda e: e.required, family="text model")


def map_target_tensors(tensors: Mapping[str, Source], where: str = "checkpoint") -> dict[str, Source]:
    """HF target tensors -> GGUF names (``token_embd``, ``per_layer_*``, ``blk.N.*``); ``lm_head`` (tied) and
    the vision / audio towers are left out. ``layer_scalar`` becomes a 1-element vector.

    Raises:
        HFCheckpointError: a tensor name the mapping does not know (nothing is dropped silently).
    """
    out: dict[str, Source] = {}
    for name, arr in tensors.items():
        try:
            g = target_gguf_name(name)
        except KeyError:
            raise HFCheckpointError("unknown tensor", path=where, key=name) from None
        if g is None:
            continue
        out[g] = values_of(arr).reshape(1) if g.endswith("layer_output_scale.weight") else arr
    return out


def convert_target(tc: Mapping[str, Any], headers: Mapping[str, HFTensor], out: Path, outtype: str,
                   vocab_from: Any, where: str) -> ConvertResult:
    """Write the ``gemma4`` GGUF of a target text config ``tc`` and its tensors (``headers``: the checkpoint's
    safetensors headers; see the module docstring), after checking them whole: the config
    (:func:`check_target_hparams`), every tensor against it from the headers alone
    (:func:`target_tensor_problems`), and only then the data (:func:`inspector.safetensors.lazy_tensors`: read a
    block at a time): no NaN or Inf (:func:`inspector.convert_common.refuse_nonfinite`, in bounded chunks), then each
    tensor converted while it is written (:func:`inspector.convert_common.tensor_values`). Memory: one block of
    :data:`~inspector.convert_common.WRITE_BLOCK_ELEMENTS` values, whatever the checkpoint's size.

    Raises:
        HFCheckpointError: a bad config, a tensor missing, unknown, past the layers, of the wrong shape or dtype,
            non-finite values (see :func:`check_target_hparams`, :func:`target_tensor_problems`).
        LayoutError: the tokenizer has another size than ``vocab_size``.
    """
    hp = text_hparams(tc, where)
    check_target_hparams(hp, where)
    refuse_problems(target_tensor_problems(hp, headers, where))
    tensors = lazy_tensors(h for n, h in headers.items() if target_gguf_name(n) is not None)
    for name, arr in tensors.items():
        refuse_nonfinite(name, arr, headers[name].file)
    g = map_target_tensors(tensors, where)
    g["rope_freqs.weight"] = hp.rope_freqs
    kv = [("general.name", string("mtpscope-converted-target"))] + target_kv(hp)
    write_converted(out, ARCH_TARGET, kv, tokenizer_kv_for(hp.n_vocab, vocab_from), ordered(g), outtype)
    return ConvertResult(out=out, kind="target", dialect=None, arch=ARCH_TARGET, n_tensors=len(g))


__all__ = ["check_target_hparams", "convert_target", "map_target_tensors", "target_kv", "target_layout",
           "target_tensor_problems"]
