"""Argument specs of the golden harness (pypto-lib `golden/`)."""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch

from pto.errors import BindError
from pto.language.dtypes import to_torch

__all__ = ["TensorSpec", "ScalarSpec"]

_RANDOM_FACTORIES = (torch.randn, torch.rand, torch.zeros, torch.ones)


@dataclass
class TensorSpec:
    """One tensor argument, in kernel parameter order.

    Args:
        name: the kernel parameter name.
        shape: list of ints.
        dtype: torch or pl dtype.
        init_value: None (zeros), a number (filled), a tensor (converted to
            ``dtype``), ``torch.randn``/``rand``/``zeros``/``ones`` (called as
            ``f(shape, dtype=dtype)`` on the seeded global RNG) or another
            callable taking no arguments.
        is_output: validate this tensor after the run (True) or not (False);
            None (the default): take it from the kernel's annotation, i.e. a
            ``pl.Out`` / ``pl.InOut`` / ``pl.PartialOut`` parameter is validated
            (resolved by :func:`pto.golden.run_jit`). With ``init_value`` None an
            output is a pure output; otherwise an in/out state tensor.

    Raises:
        BindError: a dim that is not a non-negative int, or an ``is_output`` that is
            not a bool or None.
    """

    name: str
    shape: list
    dtype: Any
    init_value: Any = None
    is_output: bool | None = None

    def __post_init__(self):
        self.dtype = to_torch(self.dtype)
        if self.is_output is not None and not isinstance(self.is_output, bool):
            raise BindError(f"TensorSpec {self.name!r}: is_output must be True, False or None (from the "
                            f"kernel's annotation), got {self.is_output!r}")
        shape = []
        for d, s in enumerate(self.shape):
            try:
                n = operator.index(s) if not isinstance(s, bool) else None
            except TypeError:
                n = None
            if n is None or n < 0:
                raise BindError(f"TensorSpec {self.name!r}: dim {d} of shape {list(self.shape)} must be a "
                                f"non-negative int, got {s!r}")
            shape.append(n)
        self.shape = shape

    @property
    def is_pure_output(self) -> bool:
        """An output without an initial value (created as zeros, not read by the kernel);
        ``is_output`` None counts as not an output until resolved."""
        return bool(self.is_output) and self.init_value is None

    def create_tensor(self) -> torch.Tensor:
        """Build the initial tensor from ``init_value``.

        Raises:
            BindError: an ``init_value`` of an unsupported kind, ``torch.randn`` /
                ``torch.rand`` for an integer dtype, or a tensor of the wrong shape.
        """
        v = self.init_value
        if v is None:
            return torch.zeros(self.shape, dtype=self.dtype)
        if isinstance(v, (bool, int, float)):
            return torch.full(self.shape, v, dtype=self.dtype)
        if isinstance(v, torch.Tensor):
            if list(v.shape) != self.shape:
                raise BindError(f"TensorSpec {self.name!r}: init tensor shape {list(v.shape)} != spec {self.shape}")
            return v.to(self.dtype).contiguous()
        if any(v is f for f in _RANDOM_FACTORIES):
            if v in (torch.randn, torch.rand) and not self.dtype.is_floating_point:
                raise BindError(f"TensorSpec {self.name!r}: init_value torch.{v.__name__} needs a float dtype, "
                                f"got {self.dtype}; use a callable such as lambda: torch.randint(...)")
            return v(self.shape, dtype=self.dtype)
        if callable(v):
            out = torch.as_tensor(v(), dtype=self.dtype)
            if list(out.shape) != self.shape:
                raise BindError(f"TensorSpec {self.name!r}: init callable gave shape {list(out.shape)} != {self.shape}")
            return out.contiguous()
        raise BindError(f"TensorSpec {self.name!r}: unsupported init_value {type(v).__name__}")


@dataclass
class ScalarSpec:
    """One by-value scalar argument (``value`` is checked against ``dtype``).

    Raises:
        BindError: a bool for a number dtype, a float for an integer dtype, or
            an integer out of range.
    """

    name: str
    dtype: Any
    value: Any

    def __post_init__(self):
        self.dtype = to_torch(self.dtype)
        v = self.value
        if isinstance(v, torch.Tensor):
            if v.dim() != 0 or v.dtype != self.dtype:
                raise BindError(f"ScalarSpec {self.name!r}: tensor value must be 0-dim {self.dtype}")
            v = v.item()
        if self.dtype == torch.bool:
            if not isinstance(v, bool):
                raise BindError(f"ScalarSpec {self.name!r}: bool dtype needs a bool, got {v!r}")
        elif self.dtype.is_floating_point:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise BindError(f"ScalarSpec {self.name!r}: {self.dtype} needs a number, got {v!r}")
        else:
            info = torch.iinfo(self.dtype)
            if isinstance(v, bool) or not isinstance(v, int) or not info.min <= v <= info.max:
                raise BindError(f"ScalarSpec {self.name!r}: {self.dtype} needs an int in range, got {v!r}")
        self.value = torch.tensor(v, dtype=self.dtype)

    def to_python(self):
        """The value at device precision as a Python number."""
        return self.value.item()
