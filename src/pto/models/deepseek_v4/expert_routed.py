"""Routed experts (single rank): tokens grouped by expert, W8A8 INT8 SwiGLU, weighted combine.

Math (pypto-lib `models/deepseek/v4-flash/expert_routed.py` and the combine of `moe.py`, collapsed to one rank; transformers `models/deepseek_v4/modeling_deepseek_v4.py`
8; transformers ``DeepseekV4Experts``), per route ``(t, k)`` with expert ``e =
indices[t, k] >= 0`` and weight ``w = weights[t, k]``:

    h            = silu(min(x@w1_e^T, L)) * clamp(x@w3_e^T, -L, L)   # W8A8 as expert_shared
    h_i8, h_s    = int8_per_row(h)
    y[t, k]      = bf16_rne((h_i8 @ w2_e^T in INT32) * (h_s * w) * w2_scale_e)
    routed_y[t]  = sum_k y[t, k]   (FP32, in k order; a route with e = -1 adds nothing)

Kernel (:func:`expert_routed`), tasks in order:

* ``moe_dispatch`` (one block): reads every route, groups them by expert (counting sort,
  stable in ``(t, k)`` order), writes the per-expert row counts ``expert_count [1, E]``,
  the compact rows ``recv_x [n, D]`` INT8, ``recv_scale`` / ``recv_w [n, 1]`` (gathered in
  one go through a transpose and ``pl.gather``) and ``route_slot [1, T*K]`` (the compact row
  of route ``t*K + k``, ``n`` for no route);
* the row tiles (an expert with rows, up to ``ROUTED_M_TILE`` of them) in ``min(ROUTED_GROUPS,
  tiles)`` contiguous groups, two tasks per group: ``expert_gate_up`` (per tile ``F /
  ROUTED_F_TILE`` blocks, one per intermediate column tile: gate/up matmuls and SwiGLU into
  the FP32 scratch ``h_f32 [n, F]``) and ``expert_down`` (per tile ``D / ROUTED_D_TILE``
  blocks, one per hidden column tile: the per-row INT8 quantisation of the whole ``h`` row,
  then w2 into ``recv_y [n, D]`` BF16). Only output columns are split, so every element sums
  the same products in the same order as one whole-expert block (bit-identical results); the
  groups let the first group's ``expert_down`` overlap the second group's ``expert_gate_up``
  with a task count that does not depend on the routing (given 2 or more tiles). The
  orchestration reads the counts, so **an expert that receives no token has no block and
  costs no work**;
* ``moe_combine`` (hidden column tiles): ``recv_y`` gathered back into route order (the
  zero row ``n`` for empty routes) and summed over ``k`` into ``routed_y [T, D]`` FP32.

GM scratch (uninitialised; capacity ``token_capacity * K`` routes): ``recv_x``,
``recv_scale``, ``recv_w``, ``recv_y``, ``h_f32``, ``route_slot``, ``expert_count``. Deviations
from the reference (which runs the EP dispatch / combine across ranks and 6 tasks per (expert,
16-row tile): gate 2 + up 2 blocks of 1024 columns, act, h quantisation, w2, w2 dequant): one
rank; 2 tasks per group of tiles (gate and up share a block per 1024 columns; each
``expert_down`` block re-quantises the rows it needs); gathers by transpose + ``pl.gather``
instead of per-row puts.
"""

import functools
from types import SimpleNamespace

import torch

import pto.language as pl
from pto.errors import BindError, ConfigError
from pto.golden import CaseRun, KernelCase, TensorSpec, ratio_reldiff, register
from pto.models.deepseek_v4.config import DeepSeekV4Config
from pto.models.deepseek_v4.expert_shared import (down_bf16_rows, down_int8_rows, expert_ffn_tiling, golden_swiglu_ffn,
                                                  make_expert_activations, make_expert_weights, quantize_h_rows,
                                                  swiglu_bf16_rows, swiglu_int8_rows)
from pto.models.deepseek_v4.weight_format import act_dtype, is_bf16, weight_dtype, with_weight_format
from pto.models.deepseek_v4.tiling import (MATMUL_M_TILE, check_token_capacity, mode_tokens, need, round_up,
                                           token_capacity)

__all__ = ["TOLERANCES", "ROUTED_M_TILE", "expert_routed_kernels", "expert_routed", "golden_expert_routed",
           "make_routes", "make_routed_inputs", "build_expert_routed"]

# pypto-lib `models/deepseek/v4-flash/expert_routed.py`; the pypto-lib tests' tolerances (recv_y: ratio_reldiff(2e-3, 0.01)); routed_y is its k-sum.
TOLERANCES: dict[str, tuple[float, float]] = {"routed_y": (2e-3, 0.01)}

# ---- kernel ----
T_DYN = pl.dynamic("T")
ROUTED_M_TILE = 128  # rows of one expert per row tile (expert_gate_up / expert_down blocks) [16]
ROUTED_F_TILE = 1024  # intermediate columns per expert_gate_up block (the reference: gate and up blocks of 1024 each)
ROUTED_D_TILE = 1024  # hidden columns per expert_down block
ROUTED_GROUPS = 2  # row-tile groups, an expert_gate_up and an expert_down task each (2: the tasks of the 1st group overlap the 2nd)
COMBINE_D_TILE = 1024  # hidden columns per moe_combine block


def _col_tile(size: int, tile: int) -> int:
    """The largest of ``tile``, ``tile / 2``, ... that divides ``size`` (a multiple of 32)."""
    t = min(tile, size)
    while size % t:
        t //= 2
    return t


@functools.lru_cache(maxsize=None)
def expert_routed_kernels(cfg: DeepSeekV4Config) -> SimpleNamespace:
    """Build the single-rank routed experts for ``cfg`` (cached per config).

    Shapes (``E = n_routed_experts``, ``K = num_experts_per_tok``, ``D = hidden_size``,
    ``F = moe_intermediate_size``): ``x_i8 [T, D] INT8``, ``x_scale [T, 1] FP32`` (gate's
    outputs), ``indices [T, K] INT32`` (``-1`` = no route), ``weights [T, K] FP32``,
    ``w1, w3 [E, F, D] INT8`` with ``w1_scale, w3_scale [E, F] FP32``, ``w2 [E, D, F] INT8``
    with ``w2_scale [E, D] FP32``; output ``routed_y [T, D] FP32``. ``cfg.weight_format ==
    "bf16"`` (weight_format.py): ``x_i8`` / ``recv_x`` and the expert weights are BF16, ``h``
    is rounded to BF16 instead of quantised, ``y = (h @ w2^T) * w``; the scales are not read.

    Returns:
        namespace with the inline body ``expert_routed(x_i8, x_scale, indices, weights, w1,
        w1_scale, w3, w3_scale, w2, w2_scale, routed_y)`` (returns ``routed_y``) and its entry
        ``expert_routed_test``.

    Raises:
        ConfigError: ``cfg`` cannot be tiled. At run time ``BindError`` for an expert id
            outside ``[-1, E)`` (naming the route, before anything is written) and
            ``CapacityError`` for more than ``token_capacity * K`` routes.
    """
    tl = expert_ffn_tiling(cfg, "expert_routed")
    D, Fd, L = tl.d, tl.f, tl.limit
    E, K = cfg.n_routed_experts, cfg.num_experts_per_tok
    need(E >= 1 and 1 <= K <= E, "expert_routed", cfg, f"need 1 <= num_experts_per_tok={K} <= n_routed_experts={E}")
    cap = token_capacity(cfg) * K
    CT, FT, DT = (_col_tile(size, tile) for size, tile in ((D, COMBINE_D_TILE), (Fd, ROUTED_F_TILE),
                                                           (D, ROUTED_D_TILE)))
    n_f, n_d = Fd // FT, D // DT
    WD, AD, bf16 = weight_dtype(cfg), act_dtype(cfg), is_bf16(cfg)

    @pl.jit.inline
    def expert_routed(x_i8: pl.Tensor[[T_DYN, D], AD],
                      x_scale: pl.Tensor[[T_DYN, 1], pl.FP32],
                      indices: pl.Tensor[[T_DYN, K], pl.INT32],
                      weights: pl.Tensor[[T_DYN, K], pl.FP32],
                      w1: pl.Tensor[[E, Fd, D], WD],
                      w1_scale: pl.Tensor[[E, Fd], pl.FP32],
                      w3: pl.Tensor[[E, Fd, D], WD],
                      w3_scale: pl.Tensor[[E, Fd], pl.FP32],
                      w2: pl.Tensor[[E, D, Fd], WD],
                      w2_scale: pl.Tensor[[E, D], pl.FP32],
                      routed_y: pl.Out[pl.Tensor[[T_DYN, D], pl.FP32]]):
        """Routed experts on one rank (module docstring); returns ``routed_y``."""
        t = pl.tensor.dim(x_i8, 0)
        tk = t * K
        recv_x = pl.create_tensor([tk, D], AD, capacity=cap, name="recv_x")
        recv_scale = pl.create_tensor([tk, 1], pl.FP32, capacity=cap, name="recv_scale")
        recv_w = pl.create_tensor([tk, 1], pl.FP32, capacity=cap, name="recv_w")
        recv_y = pl.create_tensor([tk, D], pl.BF16, capacity=cap, name="recv_y")
        route_slot = pl.create_tensor([1, tk], pl.INT32, capacity=[None, cap], name="route_slot")
        expert_count = pl.create_tensor([1, E], pl.INT32, name="expert_count")
        w1f, w3f, w2f = pl.reshape(w1, [E * Fd, D]), pl.reshape(w3, [E * Fd, D]), pl.reshape(w2, [E * D, Fd])

        # 1. group the routes by expert and gather their activation rows
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="moe_dispatch"):
            idx = indices[0:t, 0:K]
            buckets = [[] for _ in range(E)]
            for r, e in enumerate(pl.read_values(pl.reshape(idx, [1, tk]), [0, 0], tk)):  # route r = ti * K + k
                if e < -1 or e >= E:
                    raise BindError(f"expert_routed: indices[{r // K}, {r % K}] = {int(e)} outside [-1, "
                                    f"n_routed_experts={E})")
                if e >= 0:
                    buckets[e].append(r)
            order = [r for bucket in buckets for r in bucket]
            n = len(order)
            # the map rows are built in Python and written in one call each (pl.write_values)
            expert_count[0:1, 0:E] = pl.write_values(pl.full([1, E], pl.INT32, 0), [0, 0], list(map(len, buckets)))
            slots = [n] * tk  # route r -> its row in expert order (n: an empty route)
            for s, r in enumerate(order):
                slots[r] = s
            route_slot[0:1, 0:tk] = pl.write_values(pl.full([1, tk], pl.INT32, n), [0, 0], slots)
            if n > 0:
                src = pl.write_values(pl.full([1, n], pl.INT32, 0), [0, 0], [r // K for r in order])
                rid = pl.write_values(pl.full([1, n], pl.INT32, 0), [0, 0], order)
                xt = pl.transpose(x_i8[0:t, 0:D])  # [D, t]: rows gathered as columns
                recv_x[0:n, 0:D] = pl.transpose(pl.gather(xt, index=src))
                if not bf16:
                    recv_scale[0:n, 0:1] = pl.transpose(pl.gather(pl.transpose(x_scale[0:t, 0:1]), index=src))
                w_flat = pl.reshape(weights[0:t, 0:K], [1, tk])
                recv_w[0:n, 0:1] = pl.transpose(pl.gather(w_flat, index=rid))

        # 2. per group of (expert with rows, row tile): gate/up + SwiGLU over F column tiles into h_f32,
        #    then the down projection over D column tiles; empty experts get no block. Only output columns are
        #    split (every element's reduction is the one of a whole-expert block, so bit-identical).
        tiles, off = [], 0
        for e, cnt in enumerate(pl.read_values(expert_count, [0, 0], E)):
            for m0 in range(0, cnt, ROUTED_M_TILE):
                tiles.append((e, off + m0, min(ROUTED_M_TILE, cnt - m0)))
            off += cnt
        if tiles:
            h_f32 = pl.create_tensor([tk, Fd], pl.FP32, capacity=cap, name="h_f32")
            n_g = min(ROUTED_GROUPS, len(tiles))  # a fixed task count whatever the routing (>= n_g tiles)
            for g in range(n_g):  # one group's expert_down overlaps the next group's expert_gate_up
                group = tiles[g * len(tiles) // n_g:(g + 1) * len(tiles) // n_g]
                for b in pl.spmd(len(group) * n_f, name_hint="expert_gate_up"):
                    (e, r0, rows), f0 = group[b // n_f], (b % n_f) * FT
                    w1t, w3t = w1f[e * Fd + f0:e * Fd + f0 + FT, 0:D], w3f[e * Fd + f0:e * Fd + f0 + FT, 0:D]
                    if bf16:  # a tile of whole 16-row granules, the pad rows zero
                        m = min(ROUTED_M_TILE, round_up(rows, MATMUL_M_TILE))
                        a = pl.slice(recv_x, [m, D], [r0, 0], valid_shape=[rows, D])
                        h = pl.set_validshape(swiglu_bf16_rows(a, w1t, w3t, L), rows, FT)
                    else:  # the exact INT32 products of the valid rows alone (pad rows change no valid row)
                        h = swiglu_int8_rows(recv_x[r0:r0 + rows, 0:D], recv_scale[r0:r0 + rows, 0:1], w1t,
                                             w1_scale[e:e + 1, f0:f0 + FT], w3t, w3_scale[e:e + 1, f0:f0 + FT], L)
                    pl.assemble(h_f32, h, [r0, f0])
                for b in pl.spmd(len(group) * n_d, name_hint="expert_down"):
                    (e, r0, rows), d0 = group[b // n_d], (b % n_d) * DT
                    w2t = w2f[e * D + d0:e * D + d0 + DT, 0:Fd]
                    if bf16:
                        m = min(ROUTED_M_TILE, round_up(rows, MATMUL_M_TILE))
                        h = pl.slice(h_f32, [m, Fd], [r0, 0], valid_shape=[rows, Fd])  # pad rows zero, as a's
                        rw = pl.slice(recv_w, [m, 1], [r0, 0], valid_shape=[rows, 1])
                        y = down_bf16_rows(pl.cast(h, pl.BF16, mode="rint"), w2t, rw)
                        y = pl.set_validshape(pl.cast(y, pl.BF16, mode="rint"), rows, DT)
                    else:
                        # whole rows (the amax spans F), again per D tile
                        codes, hs = quantize_h_rows(h_f32[r0:r0 + rows, 0:Fd])
                        y = down_int8_rows(codes, hs * recv_w[r0:r0 + rows, 0:1], w2t, w2_scale[e:e + 1, d0:d0 + DT])
                        y = pl.cast(y, pl.BF16, mode="rint")
                    pl.assemble(recv_y, y, [r0, d0])

        # 3. back to route order (row n = zero for empty routes), summed over k
        for b in pl.spmd(D // CT, name_hint="moe_combine"):
            d0 = b * CT
            if off == 0:
                pl.assemble(routed_y, pl.full([t, CT], pl.FP32, 0.0), [0, d0])
            else:
                ry = pl.cast(recv_y[0:off, d0:d0 + CT], pl.FP32, mode="none")
                ry = pl.assemble(pl.full([off + 1, CT], pl.FP32, 0.0), ry, [0, 0])  # row off: empty routes
                per_route = pl.transpose(pl.gather(pl.transpose(ry), index=route_slot[0:1, 0:tk]))
                rows = pl.reshape(per_route, [t, K * CT])  # token row: its K routes side by side
                acc = pl.slice(rows, [t, CT], [0, 0])
                for k in range(1, K):
                    acc = acc + pl.slice(rows, [t, CT], [0, k * CT])
                pl.assemble(routed_y, acc, [0, d0])
        return routed_y

    expert_routed_test = pl.jit.entry(expert_routed, name="expert_routed_test")
    return SimpleNamespace(expert_routed=expert_routed, expert_routed_test=expert_routed_test)


@pl.jit.inline
def expert_routed(x_i8: pl.Tensor, x_scale: pl.Tensor, indices: pl.Tensor, weights: pl.Tensor, w1: pl.Tensor,
                  w1_scale: pl.Tensor, w3: pl.Tensor, w3_scale: pl.Tensor, w2: pl.Tensor, w2_scale: pl.Tensor,
                  routed_y: pl.Out[pl.Tensor], cfg):
    """Stable inline signature ``expert_routed(x_i8, x_scale, indices, weights, w1, w1_scale, w3,
    w3_scale, w2, w2_scale, routed_y, cfg) -> routed_y`` (see :func:`expert_routed_kernels`)."""
    return expert_routed_kernels(cfg).expert_routed(x_i8, x_scale, indices, weights, w1, w1_scale, w3, w3_scale,
                                                    w2, w2_scale, routed_y)
# ---- end kernel ----


def golden_expert_routed(
    x: torch.Tensor,  # [T, D] int8 codes ("int8") | float ("bf16")
    x_scale: torch.Tensor | None,  # [T, 1] fp32
    indices: torch.Tensor,  # [T, K] int, -1 = no route
    weights: torch.Tensor,  # [T, K] fp32
    w1: torch.Tensor, w1_scale: torch.Tensor | None,  # [E, F, D] ; [E, F]
    w3: torch.Tensor, w3_scale: torch.Tensor | None,  # [E, F, D] ; [E, F]
    w2: torch.Tensor, w2_scale: torch.Tensor | None,  # [E, D, F] ; [E, D]
    cfg: DeepSeekV4Config,
    *,
    weight_format: str = "int8",
    float32: bool = False,
) -> torch.Tensor:  # [T, D] fp32
    """Routed-experts golden (pypto-lib `models/deepseek/v4-flash/expert_routed.py`, transformers `models/deepseek_v4/modeling_deepseek_v4.py`), one expert at a time.

    For each expert with routes: its rows ``x[t]`` (in ``(t, k)`` order) through
    :func:`expert_shared.golden_swiglu_ffn` with the routing weight as the row weight (the
    expert's INT8 weights are widened alone, never all experts at once); each route's result
    is rounded to BF16 (RNE) unless ``float32`` (for ``"bf16"`` so is ``h``, as the kernel); ``routed_y[t] = sum_k y[t, k]`` in FP32,
    ``k = 0, 1, ...`` in order; empty routes (``-1``) add nothing.

    Raises:
        BindError: unknown ``weight_format``, shapes off ``cfg`` or an expert id outside
            ``[-1, E)``.
    """
    fn = "golden_expert_routed"
    if weight_format not in ("int8", "bf16"):
        raise BindError(f"{fn}: weight_format must be 'int8' or 'bf16', got {weight_format!r}")
    E, K, D, Fd = cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.hidden_size, cfg.moe_intermediate_size
    if x.dim() != 2 or x.shape[1] != D:
        raise BindError(f"{fn}: x must be [T, {D}], got {list(x.shape)}")
    T = x.shape[0]
    for name, t, shape in (("indices", indices, (T, K)), ("weights", weights, (T, K)), ("w1", w1, (E, Fd, D)),
                           ("w3", w3, (E, Fd, D)), ("w2", w2, (E, D, Fd))):
        if tuple(t.shape) != shape:
            raise BindError(f"{fn}: {name} must be {list(shape)}, got {list(t.shape)}")
    idx = indices.long()
    bad = ((idx < -1) | (idx >= E)).nonzero()
    if bad.numel():
        ti, k = (int(v) for v in bad[0])
        raise BindError(f"{fn}: indices[{ti}, {k}] = {int(idx[ti, k])} outside [-1, n_routed_experts={E})")
    per_route = torch.zeros(T, K, D)
    q = weight_format == "int8"
    for e in torch.unique(idx[idx >= 0]).tolist():
        t_i, k_i = (idx == e).nonzero(as_tuple=True)
        y = golden_swiglu_ffn(x[t_i], x_scale[t_i] if q else None, w1[e], w1_scale[e] if q else None, w3[e],
                              w3_scale[e] if q else None, w2[e], w2_scale[e] if q else None,
                              float(cfg.swiglu_limit), weight_format=weight_format,
                              row_weight=weights[t_i, k_i].float().unsqueeze(1), round_h=not float32)
        per_route[t_i, k_i] = y if float32 else y.to(torch.bfloat16).float()
    routed = per_route[:, 0]
    for k in range(1, K):
        routed = routed + per_route[:, k]
    return routed


def make_routes(cfg: DeepSeekV4Config, T: int, gen: torch.Generator, *, routing: str = "random",
                num_tokens: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(indices [T, K] INT32, weights [T, K] FP32)``: ``K`` distinct experts per token and
    positive weights summing to ``routed_scaling_factor``. ``routing``: ``"random"``;
    ``"one_expert"`` (every token routes to expert 0 first, the rest random among 1..E-1);
    ``"skip_last"`` (expert ``E - 1`` gets no token). Rows ``>= num_tokens`` are ``-1`` / 0.

    Raises:
        ConfigError: an unknown ``routing`` or one that ``E`` cannot satisfy.
    """
    E, K = cfg.n_routed_experts, cfg.num_experts_per_tok
    if routing not in ("random", "one_expert", "skip_last"):
        raise ConfigError(f"make_routes: routing must be 'random', 'one_expert' or 'skip_last', got {routing!r}")
    pool = E - 1 if routing != "random" else E
    if pool < (K - 1 if routing == "one_expert" else K):
        raise ConfigError(f"make_routes: routing {routing!r} needs more than {K} experts, config has {E}")
    perm = torch.rand(T, pool, generator=gen).argsort(dim=-1)
    if routing == "one_expert":
        idx = torch.cat([torch.zeros(T, 1, dtype=torch.long), perm[:, :K - 1] + 1], dim=1)
    else:
        idx = perm[:, :K]
    w = torch.rand(T, K, generator=gen) + 0.1
    w = w / w.sum(dim=-1, keepdim=True) * cfg.routed_scaling_factor
    n = T if num_tokens is None else num_tokens
    idx[n:] = -1
    w[n:] = 0
    return idx.to(torch.int32), w


_ROUTED_INPUTS = ("x_i8", "x_scale", "indices", "weights", "w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale")


def make_routed_inputs(cfg: DeepSeekV4Config, T: int, seed: int, *, routing: str = "random",
                       num_tokens: int | None = None, std: float = 1.5,
                       weight_format: str = "int8") -> dict[str, torch.Tensor]:
    """Seeded fixture for :func:`golden_expert_routed`: activations
    (:func:`expert_shared.make_expert_activations`), routes (:func:`make_routes`), then the
    ``E`` experts' INT8 (``"bf16"``: BF16) weights (:func:`expert_shared.make_expert_weights`),
    all from one ``torch.Generator(seed)`` in that order."""
    gen = torch.Generator().manual_seed(seed)
    ins = make_expert_activations(cfg, T, gen, weight_format=weight_format)
    ins["indices"], ins["weights"] = make_routes(cfg, T, gen, routing=routing, num_tokens=num_tokens)
    ins.update(make_expert_weights(cfg, cfg.n_routed_experts, gen, std=std, weight_format=weight_format))
    return ins


# ---- registration ----
def build_expert_routed(preset: str = "tiny", mode: str = "prefill", *, T: int | None = None, seed: int = 0,
                        routing: str = "random", num_tokens: int | None = None, std: float = 1.5,
                        seed_scopes: bool = False, weight_format: str = "int8") -> CaseRun:
    """KernelCase builder: the routed experts at ``preset`` in ``mode`` (decode 8 tokens,
    prefill 128) or ``T`` tokens, fixture :func:`make_routed_inputs`; ``routed_y`` compared with
    ``ratio_reldiff(2e-3, 0.01)`` (``weight_format="bf16"``: the unquantised kernel, same
    tolerance). The demo runs it at the ``demo`` preset at most (FLASH's
    256 experts are 6 GiB of INT8 weights).

    Raises:
        ConfigError: unknown preset / mode / routing, bad ``T``, ``seed_scopes`` (no seed
            variant) or an untileable config.
    """
    if seed_scopes:
        raise ConfigError("expert_routed has no seed variant (its scratch is never initialised)")
    cfg, T = mode_tokens(preset, mode, T)
    cfg = with_weight_format(cfg, weight_format)
    check_token_capacity("expert_routed", cfg, T)  # before any input is built (recv_* hold T * topk rows)
    ins = make_routed_inputs(cfg, T, seed, routing=routing, num_tokens=num_tokens, std=std,
                             weight_format=weight_format)
    specs = [TensorSpec(k, list(ins[k].shape), ins[k].dtype, init_value=ins[k]) for k in _ROUTED_INPUTS]
    specs.append(TensorSpec("routed_y", [T, cfg.hidden_size], torch.float32, is_output=True))

    def golden(v: dict) -> None:
        v["routed_y"] = golden_expert_routed(*(v[k] for k in _ROUTED_INPUTS), cfg, weight_format=weight_format)

    label = (f"{preset} {mode} T={T} routing={routing}" + (f" num_tokens={num_tokens}" if num_tokens is not None
                                                            else "")
             + (" weight_format=bf16" if weight_format == "bf16" else ""))
    return CaseRun(expert_routed_kernels(cfg).expert_routed_test, specs, golden,
                   {"routed_y": ratio_reldiff(*TOLERANCES["routed_y"])}, rtol=1e-3, atol=1e-3, label=label)


register(KernelCase("expert_routed", build_expert_routed, modes=("decode", "prefill"),
                    max_preset="demo",
                    description="routed experts, one rank: dispatch by expert, W8A8 SwiGLU, combine (pypto-lib `expert_routed.py`)"))
