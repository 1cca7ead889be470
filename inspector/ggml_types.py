"""The ggml tensor type table: type id -> name, block size (elements) and type size (bytes per block).

Source: ``enum ggml_type`` in ggml/include/ggml.h and the block layouts in ggml/src/ggml-common.h of the
llama.cpp vendored by llama-cpp-python 0.3.36 (the same numbers gguf-py keeps as ``GGML_QUANT_SIZES``).
Ids 4, 5 and 31-33, 36-38 were removed from ggml and are not in the table.

Ids this table does not know (a type newer than this table, or garbage) are not an error here:
:func:`type_info` returns a record named ``"unknown type N"`` whose sizes are ``None`` so that a reader
can still list the tensor and read the rest of the file.

Bits per weight = 8 * type_size / block_size (e.g. Q8_0: 8 * 34 / 32 = 8.5).
"""

from __future__ import annotations

from dataclasses import dataclass

QK_K = 256  # super-block size of the k-quants and i-quants (ggml-common.h)


@dataclass(frozen=True)
class GGMLType:
    """One ggml tensor type.

    Attributes:
        type_id: the ``ggml_type`` enum value stored in the GGUF tensor info.
        name: ggml's name (``"Q8_0"``, ``"BF16"``) or ``"unknown type N"``.
        block_size: elements per block (1 for plain types); None when unknown.
        type_size: bytes per block; None when unknown.
        numpy_dtype: little-endian numpy dtype string for plain numeric types (``"<f4"``), else None.
    """

    type_id: int
    name: str
    block_size: int | None
    type_size: int | None
    numpy_dtype: str | None = None

    @property
    def known(self) -> bool:
        """True when the sizes of this type are known."""
        return self.block_size is not None

    @property
    def quantized(self) -> bool:
        """True for types without a plain numpy dtype (block quants and BF16)."""
        return self.known and self.numpy_dtype is None

    @property
    def bits_per_weight(self) -> float | None:
        """Storage bits per element, ``8 * type_size / block_size``; None when unknown."""
        if self.block_size is None or self.type_size is None:
            return None
        return 8.0 * self.type_size / self.block_size

    def n_bytes(self, n_elements: int) -> int | None:
        """Bytes of a tensor of ``n_elements`` elements (a whole number of blocks); None when unknown."""
        if self.block_size is None or self.type_size is None:
            return None
        return n_elements * self.type_size // self.block_size


_TABLE: tuple[GGMLType, ...] = (
    GGMLType(0, "F32", 1, 4, "<f4"),
    GGMLType(1, "F16", 1, 2, "<f2"),
    GGMLType(2, "Q4_0", 32, 2 + 16),
    GGMLType(3, "Q4_1", 32, 2 + 2 + 16),
    GGMLType(6, "Q5_0", 32, 2 + 4 + 16),
    GGMLType(7, "Q5_1", 32, 2 + 2 + 4 + 16),
    GGMLType(8, "Q8_0", 32, 2 + 32),
    GGMLType(9, "Q8_1", 32, 2 + 2 + 32),
    GGMLType(10, "Q2_K", QK_K, 2 + 2 + QK_K // 16 + QK_K // 4),
    GGMLType(11, "Q3_K", QK_K, 2 + QK_K // 4 + QK_K // 8 + 12),
    GGMLType(12, "Q4_K", QK_K, 2 + 2 + QK_K // 2 + 12),
    GGMLType(13, "Q5_K", QK_K, 2 + 2 + QK_K // 2 + QK_K // 8 + 12),
    GGMLType(14, "Q6_K", QK_K, 2 + QK_K // 2 + QK_K // 4 + QK_K // 16),
    GGMLType(15, "Q8_K", QK_K, 4 + QK_K + QK_K // 8),
    GGMLType(16, "IQ2_XXS", QK_K, 2 + QK_K // 4),
    GGMLType(17, "IQ2_XS", QK_K, 2 + QK_K // 4 + QK_K // 32),
    GGMLType(18, "IQ3_XXS", QK_K, 2 + QK_K // 4 + QK_K // 8),
    GGMLType(19, "IQ1_S", QK_K, 2 + QK_K // 8 + QK_K // 16),
    GGMLType(20, "IQ4_NL", 32, 2 + 16),
    GGMLType(21, "IQ3_S", QK_K, 2 + QK_K // 4 + QK_K // 8 + QK_K // 32 + 4),
    GGMLType(22, "IQ2_S", QK_K, 2 + QK_K // 4 + QK_K // 16),
    GGMLType(23, "IQ4_XS", QK_K, 2 + 2 + QK_K // 2 + QK_K // 64),
    GGMLType(24, "I8", 1, 1, "<i1"),
    GGMLType(25, "I16", 1, 2, "<i2"),
    GGMLType(26, "I32", 1, 4, "<i4"),
    GGMLType(27, "I64", 1, 8, "<i8"),
    GGMLType(28, "F64", 1, 8, "<f8"),
    GGMLType(29, "IQ1_M", QK_K, QK_K // 8 + QK_K // 16 + QK_K // 32),
    GGMLType(30, "BF16", 1, 2),
    GGMLType(34, "TQ1_0", QK_K, 2 + 4 * 13),
    GGMLType(35, "TQ2_0", QK_K, 2 + 64),
    GGMLType(39, "MXFP4", 32, 1 + 16),
    GGMLType(40, "NVFP4", 64, 4 + 32),
    GGMLType(41, "Q1_0", 128, 2 + 16),
    GGMLType(42, "Q2_0", 64, 2 + 16),
)

GGML_TYPES: dict[int, GGMLType] = {t.type_id: t for t in _TABLE}
"""Known ggml types by id."""

GGML_TYPES_BY_NAME: dict[str, GGMLType] = {t.name: t for t in _TABLE}
"""Known ggml types by name (``"Q8_0"``)."""


_K_QUANTS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S",
             "IQ1_M", "IQ4_XS", "TQ1_0", "TQ2_0")
#: ggml-cpu's ``type_traits_cpu[type].vec_dot_type`` (ggml/src/ggml-cpu/ggml-cpu.c of the llama.cpp that
#: llama-cpp-python 0.3.36 vendors): what a matrix product with a weight of this ggml type converts its F32
#: activations to before the dot products. The same on every x86 path (the AVX2 / AVX-512 vec_dot, llamafile's
#: tinyBLAS, the AVX2 repack, AMX's ``GGML_DISPATCH_QTYPES``): they differ in summation order, not in what
#: they round. F32 weights (and any type not listed) keep F32 activations.
VEC_DOT_TYPES: dict[str, str] = {
    "F16": "F16", "BF16": "BF16",
    **dict.fromkeys(("Q1_0", "Q2_0", "Q4_0", "Q5_0", "Q8_0", "MXFP4", "NVFP4", "IQ4_NL"), "Q8_0"),
    "Q4_1": "Q8_1", "Q5_1": "Q8_1",
    **dict.fromkeys(_K_QUANTS, "Q8_K"),
}


def type_info(type_id: int) -> GGMLType:
    """The :class:`GGMLType` of ``type_id``; an ``"unknown type N"`` record (sizes None) if not known."""
    t = GGML_TYPES.get(type_id)
    if t is not None:
        return t
    return GGMLType(type_id, f"unknown type {type_id}", None, None)


def type_name(type_id: int) -> str:
    """ggml's name for ``type_id`` (``"Q8_0"``) or ``"unknown type N"``."""
    return type_info(type_id).name
