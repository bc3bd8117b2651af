"""Element types of the DSL and their torch storage types.

``pl.INDEX`` and ``pl.TASK_ID`` are 64-bit integers (loop variables, offsets,
task handles); ``pl.UINT32`` is stored as ``torch.uint32``. There is no
implicit promotion between dtypes: mixing widths needs ``pl.cast``
(hw-native-sys/pypto `docs/en/user/`).
"""

from __future__ import annotations

import torch

from pto.errors import DslError

__all__ = [
    "DType", "BF16", "FP16", "FP32", "INT8", "INT16", "INT32", "INT64", "UINT8",
    "UINT32", "BOOL", "INDEX", "TASK_ID", "from_torch", "to_torch", "ALL_DTYPES", "no_pto_dtype",
]


class DType:
    """One DSL element type.

    Attributes:
        name: the DSL spelling (``"BF16"``).
        torch: the torch dtype that stores it on the CPU.
        itemsize: bytes per element.
        is_float / is_int: element class; BOOL is neither.
    """

    __slots__ = ("name", "torch", "itemsize", "is_float", "is_int", "min", "max")

    def __init__(self, name: str, tdtype: torch.dtype):
        self.name = name
        self.torch = tdtype
        self.itemsize = torch.empty((), dtype=tdtype).element_size()
        self.is_float = tdtype.is_floating_point
        self.is_int = not self.is_float and tdtype != torch.bool
        if self.is_float:
            info = torch.finfo(tdtype)
        elif self.is_int:
            info = torch.iinfo(tdtype)
        else:
            info = None
        self.min = info.min if info is not None else 0
        self.max = info.max if info is not None else 1

    def __repr__(self) -> str:
        return f"pl.{self.name}"

    def __reduce__(self):
        return (_by_name, (self.name,))


BF16 = DType("BF16", torch.bfloat16)
FP16 = DType("FP16", torch.float16)
FP32 = DType("FP32", torch.float32)
INT8 = DType("INT8", torch.int8)
INT16 = DType("INT16", torch.int16)
INT32 = DType("INT32", torch.int32)
INT64 = DType("INT64", torch.int64)
UINT8 = DType("UINT8", torch.uint8)
UINT32 = DType("UINT32", torch.uint32)
BOOL = DType("BOOL", torch.bool)
INDEX = DType("INDEX", torch.int64)
TASK_ID = DType("TASK_ID", torch.int64)

ALL_DTYPES = (BF16, FP16, FP32, INT8, INT16, INT32, INT64, UINT8, UINT32, BOOL, INDEX, TASK_ID)
_BY_NAME = {d.name: d for d in ALL_DTYPES}
# canonical DSL dtype per torch dtype (INDEX / TASK_ID alias INT64)
_FROM_TORCH = {d.torch: d for d in (BF16, FP16, FP32, INT8, INT16, INT32, INT64, UINT8, UINT32, BOOL)}


def _by_name(name: str) -> DType:
    return _BY_NAME[name]


def from_torch(tdtype: torch.dtype) -> DType:
    """The DSL dtype stored as ``tdtype``.

    Raises:
        DslError: for a torch dtype with no DSL counterpart (float64, complex64, ...).
    """
    try:
        return _FROM_TORCH[tdtype]
    except KeyError:
        raise DslError(no_pto_dtype(tdtype)) from None


def no_pto_dtype(tdtype) -> str:
    """The message for a torch dtype with no DSL counterpart (with a hint for float64)."""
    if tdtype == torch.float64:
        return "float64 (torch.float64) has no pto dtype; use pl.FP32 (convert the tensor with .float())"
    return f"dtype {tdtype} has no pto dtype"


def to_torch(dtype) -> torch.dtype:
    """The torch storage dtype of a DSL dtype (a torch dtype passes through).

    Raises:
        DslError: for anything that is neither.
    """
    if isinstance(dtype, DType):
        return dtype.torch
    if isinstance(dtype, torch.dtype):
        return dtype
    raise DslError(f"expected a pl dtype (pl.FP32, pl.BF16, ...), got {dtype!r}")


def as_dtype(dtype) -> DType:
    """Normalise a DSL or torch dtype to a :class:`DType` (raises DslError)."""
    if isinstance(dtype, DType):
        return dtype
    return from_torch(to_torch(dtype))
