"""The pto DSL surface: ``import pto.language as pl``.

Reference: hw-native-sys/pypto `docs/en/user/` (construct semantics); README.md.
"""

from types import SimpleNamespace as _NS

from pto.language import system, tile_ops as _tile_ops
from pto.language.control import Level, at, manual_scope, parallel, pipeline, range, scope, spmd, unroll
from pto.language.dtypes import (BF16, BOOL, FP16, FP32, INDEX, INT8, INT16, INT32, INT64, TASK_ID, UINT8,
                                 UINT32, DType)
from pto.language.jit import jit
from pto.language.tensor_ops import (AtomicType, GMTensor, arange_rows, arange_runs, assemble, create_tensor,
                                     gather_rows, load, read, read_elements, read_values, reshape, slice, store,
                                     store_rows, write, write_values)
from pto.language.tensor_ops import dim as _dim
from pto.language.tensor_ops import max, min  # noqa: A004 - DSL names
from pto.language.tile_ops import (CAST_MODES, PadValue, Tile, abs, add, arange, cast, col_expand,  # noqa: A004
                                   col_expand_add, col_expand_div, col_expand_expdif, col_expand_mul,
                                   col_expand_sub, col_max, col_sum, div, exp, fillpad, full, gather, log,
                                   matmul, matmul_acc, maximum, minimum, mul, neg, recip, row_expand,
                                   row_expand_add, row_expand_div, row_expand_mul, row_expand_sub, row_max,
                                   row_min, row_sum, rsqrt, set_validshape, sqrt, sub, transpose)
from pto.language.tile_ops import MaskPattern, cmp, mrgsort, select, sort32
from pto.language.typing import DynVar, InOut, Out, PartialOut, Scalar, ScalarValue, Tensor, dynamic
from pto.language.compat_ops import (Array, FunctionType, KernelType, SplitMode, SyncAllMode, array, concat, const,
                                     create_l1, create_tile, function, gather_row, move, prefetch, program, split,
                                     split_aiv, transpose_view)
from pto.language.compat_ops import get_block_num as _get_block_num

tensor = _NS(dim=_dim, read=read, read_values=read_values, write=write, write_values=write_values, slice=slice,
             reshape=reshape, assemble=assemble)
tile = _NS(get_block_idx=system.get_block_idx, full=full, load=load, store=store, write=write, read=read,
           MaskPattern=MaskPattern, create=create_tile, slice=slice, gather_row=gather_row, concat=concat,
           transpose_view=transpose_view, move=move, get_block_num=_get_block_num)


class MemorySpace:
    """On-chip memory spaces (placement only; numerically inert)."""

    DDR, Vec, Mat, Left, Right, Acc, Bias = "DDR", "Vec", "Mat", "Left", "Right", "Acc", "Bias"


Mem = MemorySpace
