"""MoE router: FFN RMSNorm, the INT8 activation of the experts, sqrt-softplus scores, top-k.

Math (pypto-lib `models/deepseek/v4-flash/gate.py`; transformers `models/deepseek_v4/modeling_deepseek_v4.py`; transformers ``DeepseekV4TopKRouter`` /
``DeepseekV4HashRouter``), per active token, FP32, ``E = n_routed_experts``,
``K = num_experts_per_tok``:

    inv        = rsqrt(mean(x^2) + eps);  xg = x * gamma          # deferred RMSNorm
    x_norm_i8  = int8_per_row(xg);        x_norm_scale = (1/s) * inv
    logits     = inv * (xg @ gate_w^T)                             # [E]
    s          = sqrt(softplus(logits))                            # stable softplus
    idx        = tid2eid[input_id]              if layer_id < num_hash_layers (hash layer)
                 top-K of (s + gate_bias)        otherwise (bias for selection only)
    weights    = s[idx] / (sum_k s[idx] + 1e-20) * routed_scaling_factor

Rows ``>= num_tokens`` are inactive: ``x_norm_i8 = 0``, ``x_norm_scale = 0``, ``indices =
-1`` (no route) and ``weights = 0``.

Stable softplus (:func:`stable_sqrt_softplus`): ``relu(x) + log1p(exp(-|x|))``, no overflow
above 88.7, and the negative tail kept alive (a naive ``log(1 + exp(x))`` is 0 in FP32 below
about -16.6 while softplus(-20) is 2.06e-9). At -200 even ``exp`` underflows: every score is
0 and the ``1e-20`` floor gives weights 0, never 0/0.

Kernel (:func:`gate`): ``ffn_norm`` (RMSNorm, INT8 quant, writes ``xg`` and ``inv`` scratch),
``gate_scores`` (FP32 matmul against ``gate_w``, scores), then an orchestration-level branch
on the scalar ``layer_id``: ``route_hash`` (table rows of ``tid2eid``, gather of the scores)
or ``route_topk``; ``gate_inactive_pad`` zero-fills rows ``>= num_tokens``. Deviations:
``ffn_norm`` quantises in the same task (the reference's separate ``x_norm_quant``) and casts
``x * s`` to INT8 in one saturating ``rint`` cast, without the FP16 hop (:func:`int8_codes`;
same values for every input); the
top-k is ``pl.sort32`` + ``pl.mrgsort`` of the whole ``[tokens, E]`` tile with the expert ids
carried along (the selected list is the prefix of a stable descending sort, i.e. ties go to
the lowest expert id, as the reference golden's stable argsort); the softplus range switch is
spelled as a saturating product (:func:`positive_step`), not a compare op; the reference's softplus (``relu(x) +
log(1 + exp(-|x|))`` above -10, ``exp(x)`` below) loses up to 1e-3 relative near -10 in
FP32, so ``log1p`` uses Goldberg's correction instead (same values up to rounding).
"""

import functools
from types import SimpleNamespace

import torch
import torch.nn.functional as F

import pto.language as pl
from pto.errors import BindError, ConfigError
from pto.golden import CaseRun, KernelCase, ScalarSpec, TensorSpec, exact, ratio_allclose, register
from pto.models.deepseek_v4.config import DeepSeekV4Config
from pto.models.deepseek_v4.lookup_embedding import check_token_ids
from pto.models.deepseek_v4.qkv_proj_rope import INT8_SCALE_MAX, int8_row_amax, int8_row_codes, quantize_per_row_int8
from pto.models.deepseek_v4.tiling import (MATMUL_M_TILE, check_num_tokens, check_token_capacity, mode_tokens, need,
                                           round_up, token_capacity, token_tile)
from pto.models.deepseek_v4.weight_format import act_dtype, is_bf16, with_weight_format

__all__ = ["TOLERANCES", "ROUTE_NORM_EPS", "SOFTPLUS_FLOOR_X", "STEP_SCALE", "int8_codes", "positive_step", "stable_sqrt_softplus",
           "gate_kernels", "gate", "golden_gate", "make_gate_inputs", "row_sorted", "build_gate"]

ROUTE_NORM_EPS = 1e-20  # renormalisation floor of the routing weights (transformers routers)
# beyond |x| = 15 the kernel's log1p(y) is y (relative error y/2 < 1.6e-7); below it
# u - 1 >= 3e-7 keeps Goldberg's quotient exact enough (the reference switches at -10)
SOFTPLUS_FLOOR_X = -15.0
FP32_MAX = 3.4028234663852886e38
STEP_SCALE = 2.0 ** 126  # positive_step: (2^126)^2 * 2^-149 = 2^103 > 1

# Compare functions (pypto-lib `models/deepseek/v4-flash/gate.py`; the pypto-lib tests' tolerances): x_norm_i8 codes within +-1 on 0.1 % of
# elements, indices as per-row sets, weights per row as sorted values; rest 1e-3.
TOLERANCES: dict[str, tuple[float, float, float]] = {
    "x_norm_i8": (1.0, 0.0, 0.001),
    "x_norm_scale": (1e-3, 1e-3, 0.0),
    "weights": (1e-3, 1e-3, 0.0),
}
# weight_format="bf16": the BF16 normed row within one BF16 ulp of the golden's (rounding order)
BF16_TOLERANCES: dict[str, tuple[float, float, float]] = {"x_norm_i8": (1e-3, 1 / 128, 0.0)}

# ---- kernel ----
T_DYN = pl.dynamic("T")
GATE_T_TILE = 128  # token rows per ffn_norm / route block [8]
GATE_M_TILE = 128  # rows per gate_scores matmul step, a multiple of MATMUL_M_TILE [16]
GATE_E_TILE = 256  # experts per gate_scores block [16]


def int8_codes(x, s):
    """INT8 codes ``[M, N]`` of the FP32 tile ``x`` scaled per row by ``s [M, 1]``: ``x * s``
    -rint-> INT8 (saturating; NaN gives 0), :func:`qkv_proj_rope.int8_row_codes`. The
    reference's FP16 hop (``round`` then ``trunc``) changes no code, so the codes equal
    :func:`quantize_per_row_int8`'s."""
    return int8_row_codes(x, s)


def positive_step(x):
    """``1.0`` where the FP32 tile ``x`` is ``> 0``, else ``0.0`` (same shape; ``+inf`` gives 1,
    NaN stays NaN): ``min(max(x, 0) * 2^126 * 2^126, 1)``. The two scalings take even the
    smallest subnormal (1.4e-45) past 1 and keep 0 at 0, so the result is exact without a
    compare op or a cast."""
    return pl.minimum(pl.maximum(x, 0.0) * STEP_SCALE * STEP_SCALE, 1.0)


def stable_sqrt_softplus(z):
    """``sqrt(softplus(z))`` of the FP32 tile ``z``, finite for every finite ``z``:
    ``softplus(z) = relu(z) + log1p(y)`` with ``y = exp(-|z|)``; ``log1p(y)`` is
    ``log(u) * y / (u - 1)`` with ``u = 1 + y`` (Goldberg's correction, a few ulp) where
    ``|z| < -SOFTPLUS_FLOOR_X`` (15), and ``y`` itself beyond (relative error below ``y / 2``)."""
    nz = pl.neg(pl.abs(z))  # -|z|, once: the exp and the range switch both read it
    y = pl.exp(nz)
    u = y + 1.0
    near = positive_step(nz - SOFTPLUS_FLOOR_X)  # 1 where |z| < 15
    far = 1.0 - near
    # u - 1 >= 3e-7 where near; the far term keeps the unused quotient finite elsewhere
    l1p = pl.log(u) * (y / (u - 1.0 + far)) * near + y * far
    return pl.sqrt(pl.maximum(z, 0.0) + l1p)


def _topk_indices(v, k: int):
    """``[M, k]`` INT32: per row the columns of the ``k`` largest values of the FP32 tile
    ``v [M, N]`` in descending order, ties to the lowest column (a stable descending sort's
    prefix, as the reference golden's stable argsort). ``pl.sort32`` of the row with the column
    ids ``0 .. N-1`` (``N`` padded to a multiple of 32 with ``-FP32_MAX``, after every real
    column), ``pl.mrgsort`` of 4 runs at a time up to one run, the first ``k`` pairs' indices.
    Both sorts are stable, so equal values keep ascending column order."""
    m_rows, n = v.shape
    n32 = round_up(n, 32)
    if n32 > n:
        v = pl.assemble(pl.full([m_rows, n32], pl.FP32, -FP32_MAX), v, [0, 0])
    pairs = pl.sort32(v, pl.arange(0, [1, n32], pl.UINT32))  # [M, 2 * n32]: runs of 32 pairs
    run_lanes = 64
    while run_lanes < 2 * n32:
        pairs = pl.mrgsort(pairs, block_len=run_lanes)
        run_lanes *= 4
    return pl.gather(pl.slice(pairs, [m_rows, 2 * k], [0, 0]), mask_pattern=pl.MaskPattern.P1010,
                     output_dtype=pl.INT32)


def _normalise(s, scale: float):
    """Routing weights ``s / (row_sum(s) + 1e-20) * scale`` of the FP32 tile ``s [M, K]``."""
    return pl.row_expand_div(s, pl.row_sum(s) + ROUTE_NORM_EPS) * scale


@functools.lru_cache(maxsize=None)
def gate_kernels(cfg: DeepSeekV4Config) -> SimpleNamespace:
    """Build the MoE router for ``cfg`` (cached per config).

    Shapes (``D = hidden_size``, ``E = n_routed_experts``, ``K = num_experts_per_tok``,
    ``V = vocab_size``): ``x [T, D] BF16`` (the FFN hc_pre output), ``norm_w [D] BF16``,
    ``gate_w [E, D] FP32``, ``gate_bias [E] FP32``, ``tid2eid [V, K] INT32``, ``input_ids [T]
    INT64``; outputs ``x_norm_i8 [T, D] INT8``, ``x_norm_scale [T, 1] FP32``, ``indices [T, K]
    INT32``, ``weights [T, K] FP32``; scalars ``layer_id``, ``num_tokens`` (INT32). With
    ``cfg.weight_format == "bf16"`` (weight_format.py) ``x_norm_i8`` is BF16 ``bf16_rne(xg *
    inv)`` (the unquantised expert activation) and ``x_norm_scale`` is 1 on the active rows.
    GM scratch
    (``t_pad = round_up(T, 16)``, capacity :func:`token_capacity`, uninitialised; rows
    ``>= num_tokens`` never read): ``xg_buf [t_pad, D]``, ``inv_rms [t_pad, 1]``,
    ``route_scores [t_pad, E]`` FP32.

    Returns:
        namespace with the inline body ``gate(x, norm_w, gate_w, gate_bias, tid2eid, input_ids,
        x_norm_i8, x_norm_scale, indices, weights, layer_id, num_tokens)`` (returns
        ``(x_norm_i8, x_norm_scale, indices, weights)``) and its entry ``gate_test``.

    Raises:
        ConfigError: ``hidden_size`` not a positive multiple of 32, ``K`` outside ``[1, E]``,
            or ``E`` above 2^24 (exact FP32 column ids). At run time: ``BindError`` for
            ``num_tokens`` outside ``[0, T]`` or (hash layers) an active id outside the
            vocabulary, ``CapacityError`` for ``T`` above the capacity.
    """
    D, E, K, V = cfg.hidden_size, cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.vocab_size
    need(D > 0 and D % 32 == 0, "gate", cfg, f"hidden_size={D} must be a positive multiple of 32")
    need(1 <= K <= E, "gate", cfg, f"num_experts_per_tok={K} must be in [1, n_routed_experts={E}]")
    need(E < 2 ** 24, "gate", cfg, f"n_routed_experts={E} must be below 2^24")
    eps, rsf, n_hash = cfg.rms_norm_eps, cfg.routed_scaling_factor, cfg.num_hash_layers
    cap = token_capacity(cfg)
    ET = min(GATE_E_TILE, E)
    n_e = -(-E // ET)
    XN, bf16_act = act_dtype(cfg), is_bf16(cfg)

    @pl.jit.inline
    def gate(x: pl.Tensor[[T_DYN, D], pl.BF16],
             norm_w: pl.Tensor[[D], pl.BF16],
             gate_w: pl.Tensor[[E, D], pl.FP32],
             gate_bias: pl.Tensor[[E], pl.FP32],
             tid2eid: pl.Tensor[[V, K], pl.INT32],
             input_ids: pl.Tensor[[T_DYN], pl.INT64],
             x_norm_i8: pl.Out[pl.Tensor[[T_DYN, D], XN]],
             x_norm_scale: pl.Out[pl.Tensor[[T_DYN, 1], pl.FP32]],
             indices: pl.Out[pl.Tensor[[T_DYN, K], pl.INT32]],
             weights: pl.Out[pl.Tensor[[T_DYN, K], pl.FP32]],
             layer_id: pl.Scalar[pl.INT32],
             num_tokens: pl.Scalar[pl.INT32]):
        """MoE router (module docstring); returns ``(x_norm_i8, x_norm_scale, indices, weights)``."""
        t = pl.tensor.dim(x, 0)
        active = check_num_tokens("gate", num_tokens, t)
        hash_layer = int(layer_id) < n_hash
        if hash_layer:
            check_token_ids("gate", input_ids, V, active)
        t_pad = round_up(t, MATMUL_M_TILE)
        xg_buf = pl.create_tensor([t_pad, D], pl.FP32, capacity=cap, name="xg_buf")
        inv_rms = pl.create_tensor([t_pad, 1], pl.FP32, capacity=cap, name="inv_rms")
        route_scores = pl.create_tensor([t_pad, E], pl.FP32, capacity=cap, name="route_scores")
        w_row = pl.reshape(norm_w, [1, D])
        bias_row = pl.reshape(gate_bias, [1, E])
        TT = token_tile(active, GATE_T_TILE)
        n_tiles = -(-active // TT)

        if active > 0:
            # 1. deferred RMSNorm + per-row INT8 quantisation of xg = x * gamma
            for b in pl.spmd(n_tiles, name_hint="ffn_norm", allow_early_resolve=True):
                t0 = b * TT
                rows = min(TT, active - t0)
                xt = pl.cast(pl.slice(x, [TT, D], [t0, 0], valid_shape=[rows, D]), pl.FP32, mode="none")
                inv = pl.rsqrt(pl.row_sum(xt * xt) / float(D) + eps, high_precision=True)
                xg = pl.col_expand_mul(xt, pl.cast(w_row[0:1, 0:D], pl.FP32, mode="none"))
                if bf16_act:  # unquantised: the normed row itself, BF16
                    xn = pl.cast(pl.row_expand_mul(xg, inv), pl.BF16, mode="rint")
                    pl.assemble(x_norm_i8, pl.set_validshape(xn, rows, D), [t0, 0])
                    pl.assemble(x_norm_scale, pl.full([rows, 1], pl.FP32, 1.0), [t0, 0])
                else:
                    s = pl.div(INT8_SCALE_MAX, int8_row_amax(xg))  # number / tile: one IEEE division
                    pl.assemble(x_norm_i8, pl.set_validshape(int8_codes(xg, s), rows, D), [t0, 0])
                    pl.assemble(x_norm_scale, pl.set_validshape(pl.recip(s) * inv, rows, 1), [t0, 0])
                pl.assemble(xg_buf, pl.set_validshape(xg, rows, D), [t0, 0])
                pl.assemble(inv_rms, pl.set_validshape(inv, rows, 1), [t0, 0])

            # 2. scores = sqrt(softplus(inv * (xg @ gate_w^T)))
            MT = min(GATE_M_TILE, round_up(active, MATMUL_M_TILE))
            n_m = -(-active // MT)
            for b in pl.spmd(n_m * n_e, name_hint="gate_scores", allow_early_resolve=True):
                m0, e0 = (b // n_e) * MT, (b % n_e) * ET
                rows, ecols = min(MT, active - m0), min(ET, E - e0)
                xa = pl.slice(xg_buf, [MT, D], [m0, 0], valid_shape=[rows, D])
                wb = pl.slice(gate_w, [ET, D], [e0, 0], valid_shape=[ecols, D])
                inv = pl.slice(inv_rms, [MT, 1], [m0, 0], valid_shape=[rows, 1])
                sc = stable_sqrt_softplus(pl.row_expand_mul(pl.matmul(xa, wb, b_trans=True), inv))
                pl.assemble(route_scores, pl.set_validshape(sc, rows, ecols), [m0, e0])

            # 3. expert selection and weights (orchestration branch on the scalar layer_id)
            if hash_layer:
                for b in pl.spmd(n_tiles, name_hint="route_hash", allow_early_resolve=True):
                    t0 = b * TT
                    rows = min(TT, active - t0)
                    toks = pl.read_values(input_ids, [t0], rows)
                    # the tokens' table rows in one row gather (the union of the one-row loads)
                    idx = pl.assemble(pl.full([TT, K], pl.INT32, 0), pl.gather_rows(tid2eid, toks), [0, 0])
                    sc = pl.slice(route_scores, [TT, E], [t0, 0], valid_shape=[rows, E])
                    w = _normalise(pl.gather(sc, index=idx), rsf)
                    pl.assemble(indices, pl.set_validshape(idx, rows, K), [t0, 0])
                    pl.assemble(weights, pl.set_validshape(w, rows, K), [t0, 0])
            else:
                for b in pl.spmd(n_tiles, name_hint="route_topk", allow_early_resolve=True):
                    t0 = b * TT
                    rows = min(TT, active - t0)
                    sc = pl.slice(route_scores, [TT, E], [t0, 0], valid_shape=[rows, E])
                    biased = pl.col_expand_add(sc, bias_row[0:1, 0:E])  # bias: selection only
                    idx = _topk_indices(biased, K)
                    w = _normalise(pl.gather(sc, index=idx), rsf)
                    pl.assemble(indices, pl.set_validshape(idx, rows, K), [t0, 0])
                    pl.assemble(weights, pl.set_validshape(w, rows, K), [t0, 0])

        # 4. inactive rows: no route, zero activation
        if active < t:
            rows = t - active
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="gate_inactive_pad"):
                pl.assemble(x_norm_i8, pl.full([rows, D], XN, 0), [active, 0])
                pl.assemble(x_norm_scale, pl.full([rows, 1], pl.FP32, 0.0), [active, 0])
                pl.assemble(indices, pl.full([rows, K], pl.INT32, -1), [active, 0])
                pl.assemble(weights, pl.full([rows, K], pl.FP32, 0.0), [active, 0])
        return x_norm_i8, x_norm_scale, indices, weights

    gate_test = pl.jit.entry(gate, name="gate_test")
    return SimpleNamespace(gate=gate, gate_test=gate_test)


@pl.jit.inline
def gate(x: pl.Tensor, norm_w: pl.Tensor, gate_w: pl.Tensor, gate_bias: pl.Tensor, tid2eid: pl.Tensor,
         input_ids: pl.Tensor, x_norm_i8: pl.Out[pl.Tensor], x_norm_scale: pl.Out[pl.Tensor],
         indices: pl.Out[pl.Tensor], weights: pl.Out[pl.Tensor], layer_id: pl.Scalar[pl.INT32],
         num_tokens: pl.Scalar[pl.INT32], cfg):
    """Stable inline signature ``gate(x, norm_w, gate_w, gate_bias, tid2eid, input_ids, x_norm_i8,
    x_norm_scale, indices, weights, layer_id, num_tokens, cfg) -> (x_norm_i8, x_norm_scale,
    indices, weights)`` (shapes and errors in :func:`gate_kernels`)."""
    return gate_kernels(cfg).gate(x, norm_w, gate_w, gate_bias, tid2eid, input_ids, x_norm_i8, x_norm_scale,
                                  indices, weights, layer_id, num_tokens)
# ---- end kernel ----


def golden_gate(
    x: torch.Tensor,  # [T, D] bf16 (fp32 for parity)
    norm_w: torch.Tensor,  # [D]
    gate_w: torch.Tensor,  # [E, D] fp32
    gate_bias: torch.Tensor,  # [E] fp32
    tid2eid: torch.Tensor,  # [V, K] int
    input_ids: torch.Tensor,  # [T] int
    layer_id: int,
    num_tokens: int,
    cfg: DeepSeekV4Config,
    *,
    weight_format: str = "int8",
    return_scores: bool = False,
):
    """MoE router golden (pypto-lib `models/deepseek/v4-flash/gate.py`, transformers `models/deepseek_v4/modeling_deepseek_v4.py`).

    FP32 throughout. ``weight_format="int8"`` follows the kernel's deferred order:
    ``xg = x * gamma``, ``x_norm_i8, sc = quantize_per_row_int8(xg)``, ``x_norm_scale = sc *
    inv``, ``logits = (xg @ gate_w^T) * inv``. ``"bf16"`` is the unquantised transformers order:
    ``x_norm = (x * inv) * gamma`` (FP32, returned in place of the codes; ``x_norm_scale`` is
    ones) and ``logits = x_norm @ gate_w^T``. Scores ``sqrt(F.softplus(logits))``; hash layers
    (``layer_id < num_hash_layers``) take ``tid2eid[input_ids]``, the others a stable
    descending sort of ``scores + gate_bias`` (ties to the lowest expert id); weights are the
    unbiased scores renormalised with the 1e-20 floor, times ``routed_scaling_factor``.
    Rows ``>= num_tokens``: zero codes / scale / weights and ``-1`` indices.

    Args:
        x, norm_w, gate_w, gate_bias, tid2eid, input_ids: as the kernel (any float / int
            dtypes). layer_id, num_tokens: ints. cfg: model config.
        weight_format: ``"int8"`` or ``"bf16"`` (see above).
        return_scores: also return the ``[T, E]`` FP32 scores (zero on inactive rows).

    Returns:
        ``(x_norm, x_norm_scale [T, 1], indices [T, K] int32, weights [T, K] fp32)`` with
        ``x_norm`` INT8 codes ("int8") or FP32 ("bf16"); plus the scores when asked.

    Raises:
        BindError: unknown ``weight_format``, bad shapes, ``num_tokens`` outside ``[0, T]``,
            or an active hash-layer id outside the vocabulary.
    """
    fn = "golden_gate"
    if weight_format not in ("int8", "bf16"):
        raise BindError(f"{fn}: weight_format must be 'int8' or 'bf16', got {weight_format!r}")
    D, E, K = cfg.hidden_size, cfg.n_routed_experts, cfg.num_experts_per_tok
    if x.dim() != 2 or x.shape[1] != D:
        raise BindError(f"{fn}: x must be [T, {D}], got {list(x.shape)}")
    T = x.shape[0]
    for name, t, shape in (("norm_w", norm_w, (D,)), ("gate_w", gate_w, (E, D)), ("gate_bias", gate_bias, (E,)),
                           ("tid2eid", tid2eid, (cfg.vocab_size, K)), ("input_ids", input_ids, (T,))):
        if tuple(t.shape) != shape:
            raise BindError(f"{fn}: {name} must be {list(shape)}, got {list(t.shape)}")
    if not 0 <= num_tokens <= T:
        raise BindError(f"{fn}: num_tokens={num_tokens} outside [0, {T}]")
    n = num_tokens
    xf = x.float()[:n]
    inv = torch.rsqrt(xf.square().mean(dim=-1, keepdim=True) + cfg.rms_norm_eps)
    if weight_format == "int8":
        xg = xf * norm_w.float()
        codes, sc = quantize_per_row_int8(xg)
        scale = sc * inv
        logits = (xg @ gate_w.float().T) * inv
    else:
        codes = (xf * inv) * norm_w.float()
        scale = torch.ones(n, 1)
        logits = codes @ gate_w.float().T
    scores = F.softplus(logits).sqrt()
    if layer_id < cfg.num_hash_layers:
        ids = input_ids[:n].long()
        if n and (int(ids.min()) < 0 or int(ids.max()) >= cfg.vocab_size):
            i = int(((ids < 0) | (ids >= cfg.vocab_size)).nonzero()[0, 0])
            raise BindError(f"{fn}: input_ids[{i}] = {int(ids[i])} outside [0, vocab_size={cfg.vocab_size})")
        idx = tid2eid.long()[ids]
    else:
        idx = torch.sort(scores + gate_bias.float(), dim=-1, descending=True, stable=True).indices[:, :K]
    w = scores.gather(1, idx)
    w = w / (w.sum(dim=-1, keepdim=True) + ROUTE_NORM_EPS) * cfg.routed_scaling_factor

    x_norm = torch.zeros(T, D, dtype=codes.dtype)
    x_norm[:n] = codes
    x_norm_scale = torch.zeros(T, 1)
    x_norm_scale[:n] = scale
    indices = torch.full((T, K), -1, dtype=torch.int32)
    indices[:n] = idx.to(torch.int32)
    weights = torch.zeros(T, K)
    weights[:n] = w
    if return_scores:
        all_scores = torch.zeros(T, E)
        all_scores[:n] = scores
        return x_norm, x_norm_scale, indices, weights, all_scores
    return x_norm, x_norm_scale, indices, weights


def make_gate_inputs(cfg: DeepSeekV4Config, T: int, seed: int, *, num_tokens: int | None = None) -> dict:
    """Seeded fixture for :func:`golden_gate` (pypto-lib `models/deepseek/v4-flash/gate.py` test data).

    One ``torch.Generator(seed)``, in order: ``x = N(0, 1)`` (BF16; rows ``>= num_tokens``
    zeroed), ``norm_w = 1 + 0.1 N(0, 1)`` (BF16), ``gate_w = N(0, 1) / sqrt(D)`` (FP32,
    unit-scale logits), ``gate_bias = 0.1 N(0, 1)``, ``tid2eid [V, K]`` rows of ``K`` distinct
    experts (a random permutation prefix per token id), ``input_ids`` uniform with ``0`` and
    ``V - 1`` at the first two positions.

    Raises:
        BindError: ``T`` not positive or ``num_tokens`` outside ``[0, T]``.
    """
    n = T if num_tokens is None else num_tokens
    if T <= 0 or not 0 <= n <= T:
        raise BindError(f"make_gate_inputs: need T > 0 and 0 <= num_tokens <= T, got T={T}, num_tokens={n}")
    D, E, K, V = cfg.hidden_size, cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.vocab_size
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(T, D, generator=gen)
    x[n:] = 0
    norm_w = 1.0 + 0.1 * torch.randn(D, generator=gen)
    gate_w = torch.randn(E, D, generator=gen) / D ** 0.5
    gate_bias = 0.1 * torch.randn(E, generator=gen)
    tid2eid = torch.rand(V, E, generator=gen).argsort(dim=-1)[:, :K].to(torch.int32)
    ids = torch.randint(0, V, (T,), generator=gen, dtype=torch.int64)
    ids[:2] = torch.tensor([0, V - 1])[:T]
    return {"x": x.to(torch.bfloat16), "norm_w": norm_w.to(torch.bfloat16), "gate_w": gate_w,
            "gate_bias": gate_bias, "tid2eid": tid2eid, "input_ids": ids}


def row_sorted(cmp):
    """Wrap compare function ``cmp`` so that each row (last dim) of both tensors is sorted
    first: ``indices`` become per-row sets, ``weights`` per-row multisets (the top-k order
    may differ between kernel and golden on near-ties)."""
    def sorted_cmp(actual, expected, **kw):
        return cmp(actual.sort(dim=-1).values, expected.sort(dim=-1).values, **kw)
    sorted_cmp.__name__ = f"row_sorted({getattr(cmp, '__name__', 'compare')})"
    if hasattr(cmp, "margin"):  # the inner compare's margin on the sorted rows
        sorted_cmp.margin = lambda actual, expected, **kw: cmp.margin(actual.sort(dim=-1).values,
                                                                      expected.sort(dim=-1).values, **kw)
    return sorted_cmp


# ---- registration ----
_GATE_INPUTS = ("x", "norm_w", "gate_w", "gate_bias", "tid2eid", "input_ids")


def build_gate(preset: str = "tiny", mode: str = "prefill", *, T: int | None = None, seed: int = 0,
               layer_id: int | None = None, num_tokens: int | None = None, inputs: dict | None = None,
               cfg: DeepSeekV4Config | None = None, seed_scopes: bool = False,
               weight_format: str = "int8") -> CaseRun:
    """KernelCase builder: the router at ``preset`` in ``mode`` (decode 8 tokens, prefill 128)
    or ``T`` tokens. ``layer_id`` defaults to the first learned (non-hash) layer;
    ``num_tokens`` to ``T``. ``inputs`` overrides fixture tensors by name (tests build edge
    cases with it); ``cfg`` replaces the preset's config (e.g. 3 experts, top-2).
    ``weight_format="bf16"``: the unquantised kernel; ``x_norm_i8`` is then the BF16 normed
    row, compared with ``ratio_allclose(1e-3, 1/128, 0)`` against the golden's FP32 row
    rounded to BF16 (one BF16 ulp: the kernel's ``(x * gamma) * inv`` vs the golden's
    ``(x * inv) * gamma``), ``x_norm_scale`` exactly (ones).

    Raises:
        ConfigError: unknown preset / mode, bad ``T``, ``seed_scopes`` (no seed variant) or an
            untileable config.
    """
    if seed_scopes:
        raise ConfigError("gate has no seed variant (its scratch is never initialised)")
    base, T = mode_tokens(preset, mode, T)
    cfg = with_weight_format(cfg or base, weight_format)
    check_token_capacity("gate", cfg, T)  # before any input is built
    layer_id = cfg.num_hash_layers if layer_id is None else int(layer_id)
    n = T if num_tokens is None else int(num_tokens)
    ins = make_gate_inputs(cfg, T, seed, num_tokens=n)
    ins.update(inputs or {})
    D, K = cfg.hidden_size, cfg.num_experts_per_tok
    specs = [TensorSpec(k, list(ins[k].shape), ins[k].dtype, init_value=ins[k]) for k in _GATE_INPUTS]
    bf16_w = weight_format == "bf16"
    specs += [TensorSpec("x_norm_i8", [T, D], torch.bfloat16 if bf16_w else torch.int8, is_output=True),
              TensorSpec("x_norm_scale", [T, 1], torch.float32, is_output=True),
              TensorSpec("indices", [T, K], torch.int32, is_output=True),
              TensorSpec("weights", [T, K], torch.float32, is_output=True),
              ScalarSpec("layer_id", torch.int32, layer_id),
              ScalarSpec("num_tokens", torch.int32, n)]

    def golden(v: dict) -> None:
        v["x_norm_i8"], v["x_norm_scale"], v["indices"], v["weights"] = golden_gate(
            *(v[k] for k in _GATE_INPUTS), v["layer_id"], v["num_tokens"], cfg, weight_format=weight_format)
        if bf16_w:
            v["x_norm_i8"] = v["x_norm_i8"].to(torch.bfloat16)

    compare = {"x_norm_i8": ratio_allclose(*TOLERANCES["x_norm_i8"]),
               "x_norm_scale": ratio_allclose(*TOLERANCES["x_norm_scale"]),
               "indices": row_sorted(exact()),
               "weights": row_sorted(ratio_allclose(*TOLERANCES["weights"]))}
    if bf16_w:
        compare.update(x_norm_i8=ratio_allclose(*BF16_TOLERANCES["x_norm_i8"]), x_norm_scale=exact())
    kind = "hash" if layer_id < cfg.num_hash_layers else "learned"
    label = (f"{preset} {mode} T={T} layer={layer_id} ({kind})" + (f" num_tokens={n}" if n != T else "")
             + (" weight_format=bf16" if bf16_w else ""))
    return CaseRun(gate_kernels(cfg).gate_test, specs, golden, compare, rtol=1e-3, atol=1e-3, label=label)


def _build_registered(preset: str, mode: str, **options) -> CaseRun:
    """Registry builder: decode runs a hash layer (layer 0), prefill a learned layer."""
    if "layer_id" not in options:
        options["layer_id"] = 0 if mode == "decode" else None
    return build_gate(preset, mode, **options)


register(KernelCase("gate", _build_registered, modes=("decode", "prefill"),
                    description="MoE router: FFN RMSNorm, INT8 activation, sqrt-softplus, hash / top-k (pypto-lib `gate.py`)"))
