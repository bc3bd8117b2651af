"""Hyper-connection pre-mix (mHC ``hc_pre``): collapse the ``hc_mult`` residual streams.

Math (pypto-lib `models/deepseek/v4-flash/hc_pre.py`; transformers `models/deepseek_v4/modeling_deepseek_v4.py`), per token, FP32, ``N = hc_mult``:

    u       = flatten(x)                                   # [N*D]
    mixes   = (hc_fn @ u) * rsqrt(mean(u^2) + rms_norm_eps) # [(2+N)*N], K summed per 256-chunk
    pre     = sigmoid(mixes[0:N]   * s0 + base[0:N])  + hc_eps
    post    = 2 * sigmoid(mixes[N:2N] * s1 + base[N:2N])
    C[i, j] = softmax_j(mixes[2N + N*i + j] * s2 + base[2N + N*i + j]) + hc_eps
    C      /= colsum(C) + hc_eps; then (iters-1) x { C /= rowsum + hc_eps; C /= colsum + hc_eps }
    x_mixed = bf16_rne((x0*pre0 + x1*pre1) + (x2*pre2 + x3*pre3))

``comb[t, i*N + j]`` is ``C[i, j]`` with ``i`` the input stream and ``j`` the output
stream; Sinkhorn ends on a column normalisation, so ``sum_i C[i, j] ~= 1`` tightly and the
row sums only approximately. The RMS epsilon is ``rms_norm_eps`` (HF builds the HC input
norm with it); every other epsilon is ``hc_eps`` (both are 1e-6 in all presets).

Kernel (:func:`hc_pre`, the reference's "separate" variant after commit 3b6971a3): five
tasks ordered only by the derived graph -- ``hc_pre_rms`` and ``hc_pre_linear`` (independent),
then ``split_pre_post`` and ``comb_sinkhorn`` (each reads ``mixes_raw`` and ``inv_rms``),
then ``mix_x`` (reads ``pre_val_store``): 5 edges. ``hc_pre_linear`` splits K into
``HC_OK = 4`` slices whose partial sums are atomically added into ``mixes_raw``, which is
zero-initialised at allocation (no seed task). ``seed_scopes=True`` keeps the pre-commit
shape: static scratch at capacity and a ``hc_pre_seed`` task zero-filling ``mixes_raw``
(6 tasks, 8 edges: the seed precedes the atomic adds and both readers). Deviations from
the reference, all value-preserving except the K association of the linear: tiles are
CPU-sized (token tiles of up to 32 rows for rms / mix_x and up to 128 for split and
Sinkhorn, whose 20 rounds then run as ~8 tile ops on the whole token tile; the linear
takes 128 rows and its whole 4096-wide K-slice per matmul); the comb logits are loaded as one ``[tt, 16]`` tile and
viewed as ``[tt*4 (token, i), 4 (j)]`` rows for the row softmax (the reference loads four
``[8, 8]`` tiles, valid 4, with FP32-minimum pads: the same row max, and the same row sum, in
order, as over the 4 valid columns); Sinkhorn runs on the transposed ``[4 (i), tt*4 (token, j)]``
layout, its column pass one column reduction, its row pass a row reduction of the
``[4*tt (i, token), 4 (j)]`` view.
"""

import functools
from types import SimpleNamespace

import torch

import pto.language as pl
from pto.errors import BindError, ConfigError
from pto.golden import CaseRun, KernelCase, TensorSpec, ratio_allclose, register
from pto.models.deepseek_v4.config import DeepSeekV4Config
from pto.models.deepseek_v4.tiling import (MATMUL_M_TILE, check_seed_capacity, check_token_capacity, expect_tensor,
                                           mode_tokens, need, round_up, token_capacity, token_tile)

__all__ = [
    "hc_pre",
    "inv_rms_rows",
    "hc_pre_tiling",
    "hc_pre_entry",
    "build_hc_pre",
    "HC_K_CHUNK",
    "HC_SCALE_REF",
    "HC_BASE_REF",
    "TOLERANCES",
    "golden_hc_pre",
    "make_hc_pre_inputs",
]

# K width of one chunk of the mixes matmul; the golden sums chunk partials in chunk order
# (pypto-lib `models/deepseek/v4-flash/hc_pre.py` "golden sums per 256-wide K chunk in chunk order").
HC_K_CHUNK = 256

# Real hc_scale / hc_base values used by the reference test fixture (hc_mult = 4).
HC_SCALE_REF: tuple[float, ...] = (0.0761, 0.0326, 0.2270)
HC_BASE_REF: tuple[float, ...] = (
    5.9166, -3.6223, -2.9324, -3.3124, -3.9100, -0.9384, -3.3256, -2.5240,
    2.0706, -2.5728, 0.1424, -3.9453, -3.8859, 3.4634, -3.3799, -2.6077,
    -2.7191, -2.4846, 2.0395, -0.5010, -3.5992, -2.7520, -3.3493, 3.1587,
)

# Compare functions per output as ratio_allclose (atol, rtol, max_error_ratio);
# pypto-lib `models/deepseek/v4-flash/hc_pre.py`; the pypto-lib tests' tolerances. The reference harness run also sets rtol=atol=1e-3.
TOLERANCES: dict[str, tuple[float, float, float]] = {
    "x_mixed": (1e-4, 1 / 128, 0.005),
    "post": (2.5e-5, 5e-3, 0.005),
    "comb": (2.5e-5, 5e-3, 0.005),
}

# ---- kernel ----


def inv_rms_rows(x_flat, inv_rms, t: int, t0: int, tile: int, eps: float) -> None:
    """Rows ``t0 .. t0 + tile`` (clipped to ``t``) of ``inv_rms [T, 1]`` FP32 from ``x_flat [T, n]``
    FP32 inside a block: ``rsqrt(mean(x^2) + eps)`` over the whole row (``high_precision``
    rsqrt); the RMS half of hc_pre and hc_head (pypto-lib `hc_pre.py` / `hc_head.py` step 1)."""
    n = pl.tensor.dim(x_flat, 1)
    rows = min(tile, t - t0)  # a ragged last tile computes only its own rows
    xt = pl.slice(x_flat, [rows, n], [t0, 0])
    pl.assemble(inv_rms, pl.rsqrt(pl.row_sum(xt * xt) / float(n) + eps, high_precision=True), [t0, 0])


T_DYN = pl.dynamic("T")  # runtime token count
HC_DYN = pl.dynamic("HC")  # hc_mult
D_DYN = pl.dynamic("D")  # hidden_size
MIX_DYN = pl.dynamic("MIX")  # mix_hc = (2 + hc_mult) * hc_mult
HCD_DYN = pl.dynamic("HC_DIM")  # hc_dim = hc_mult * hidden_size
HCC_DYN = pl.dynamic("HC_HC")  # hc_mult * hc_mult

# Tiling. Structure as in pypto-lib `models/deepseek/v4-flash/hc_pre.py` ("separate" variant): one task per work
# type, split-K factor 4 on the linear; tile sizes are CPU-sized (reference values in
# brackets) so that each block is a few large tile ops instead of many small ones.
HC_OK = 4  # K-slices of hc_pre_linear, atomically added into mixes_raw [4]
HC_RMS_T_TILE = 32  # token rows per hc_pre_rms block [8]
HC_LINEAR_M_TILE = 128  # rows per hc_pre_linear block, a multiple of MATMUL_M_TILE [16]
HC_LINEAR_K_TILE_MAX = 4096  # K per matmul step inside a K-slice [256]
HC_SPLIT_T_TILE = 128  # token rows per split_pre_post block (a few [t, 8] tiles) [8]
HC_COMB_T_TILE = 128  # token rows per comb_sinkhorn block: 20 rounds vectorised over tokens [8]
HC_MIX_T_TILE = 32  # token rows per mix_x block [8]
HC_MIX_D_TILE_MAX = 4096  # hidden columns per mix_x block [1024]


def hc_pre_tiling(cfg: DeepSeekV4Config) -> SimpleNamespace:
    """Tile sizes of :func:`hc_pre` for ``cfg``.

    Returns a namespace with ``hc`` (hc_mult), ``d`` (hidden_size), ``hc_dim``, ``mix``
    (mix_hc), ``mix_pad`` (``mix`` rounded up to the 16-column cube granule: the matmul N
    of the linear; 32 at flash), ``hc_pad = 8`` (one 32-byte FP32 row holds the per-token
    pre / post weights), ``k_slice = hc_dim / HC_OK``, ``k_tile`` (``k_slice`` split into
    equal steps of at most :data:`HC_LINEAR_K_TILE_MAX`), ``k_steps``, ``d_tile``
    (:data:`HC_MIX_D_TILE_MAX` or less, dividing ``d``), and the per-task token tiles.

    Raises:
        ConfigError: ``hc_mult < 1``; ``hidden_size`` not a positive multiple of 16;
            ``hc_dim`` not splittable into ``HC_OK`` K-slices of whole 16-column steps;
            ``hc_mult`` above 8 (one 32-byte row of FP32 holds the per-token pre weights).
    """
    hc, D = cfg.hc_mult, cfg.hidden_size
    need(1 <= hc <= 8, "hc_pre", cfg, f"hc_mult={hc} must be in [1, 8]")
    need(D > 0 and D % 16 == 0, "hc_pre", cfg, f"hidden_size={D} must be a positive multiple of 16")
    hc_dim = hc * D
    need(hc_dim % (HC_OK * 16) == 0, "hc_pre", cfg,
         f"hc_dim={hc_dim} must split into {HC_OK} K-slices of a multiple of 16 columns")
    k_slice = hc_dim // HC_OK
    k_steps = -(-k_slice // HC_LINEAR_K_TILE_MAX)
    need(k_slice % k_steps == 0 and (k_slice // k_steps) % 16 == 0, "hc_pre", cfg,
         f"K-slice {k_slice} does not split into {k_steps} equal steps of a multiple of 16")
    d_tile = D
    while d_tile > HC_MIX_D_TILE_MAX and d_tile % 2 == 0 and (d_tile // 2) % 16 == 0:
        d_tile //= 2
    return SimpleNamespace(hc=hc, d=D, hc_dim=hc_dim, mix=cfg.mix_hc, mix_pad=round_up(cfg.mix_hc, MATMUL_M_TILE),
                           hc_pad=8, k_slice=k_slice, k_steps=k_steps, k_tile=k_slice // k_steps,
                           d_tile=d_tile, rms_t=HC_RMS_T_TILE, lin_m=HC_LINEAR_M_TILE, split_t=HC_SPLIT_T_TILE,
                           comb_t=HC_COMB_T_TILE, mix_t=HC_MIX_T_TILE)


def _sinkhorn_rows(c, tt: int, hc: int, eps: float):
    """Row pass on ``c [hc, tt*hc]`` FP32 (rows = input stream i, columns = (token, output
    stream j)): ``c / (sum_j c + eps)`` per (i, token), a row pass on the ``[hc*tt, hc]`` view."""
    cr = pl.reshape(c, [hc * tt, hc])
    return pl.reshape(pl.row_expand_div(cr, pl.row_sum(cr) + eps), [hc, tt * hc])


def _sinkhorn_cols(c, eps: float):
    """Column pass on ``c [hc, tt*hc]`` FP32: ``c / (sum_i c + eps)`` per (token, j), one column
    reduction over the ``hc`` rows (sums in row order, as a row sum of the transposed layout)."""
    return pl.col_expand_div(c, pl.col_sum(c) + eps)


@pl.jit.inline
def hc_pre(
    x: pl.Tensor[[T_DYN, HC_DYN, D_DYN], pl.FP32],
    hc_fn: pl.Tensor[[MIX_DYN, HCD_DYN], pl.FP32],
    hc_scale: pl.Tensor[[3], pl.FP32],
    hc_base: pl.Tensor[[MIX_DYN], pl.FP32],
    x_mixed: pl.Out[pl.Tensor[[T_DYN, D_DYN], pl.BF16]],
    post: pl.Out[pl.Tensor[[T_DYN, HC_DYN], pl.FP32]],
    comb: pl.Out[pl.Tensor[[T_DYN, HCC_DYN], pl.FP32]],
    cfg,
    seed_scopes: bool = False,
):
    """Hyper-connection pre-mix, "separate" variant (pypto-lib `models/deepseek/v4-flash/hc_pre.py`).

    Stable inline signature:
    ``hc_pre(x, hc_fn, hc_scale, hc_base, x_mixed, post, comb, cfg, seed_scopes=False)
    -> (x_mixed, post, comb)``.

    Tasks (ordered only by the derived graph): ``hc_pre_rms`` (inv_rms rows),
    ``hc_pre_linear`` (split-K ``x_flat @ hc_fn^T``, ``HC_OK`` K-slices atomically added
    into ``mixes_raw``), ``split_pre_post`` (pre weights, post), ``comb_sinkhorn`` (softmax
    with FP32-minimum pads, one column pass, ``iters - 1`` row/column rounds), ``mix_x``
    (weighted stream sum, BF16 ``rint``). GM scratch: ``mixes_raw [t_linear, mix_pad] FP32``
    zero-initialised at allocation, ``inv_rms [t_linear, 1]`` and ``pre_val_store
    [t_linear, hc_pad]`` uninitialised (rows >= T never read), ``t_linear = round_up(T, 16)``
    with capacity :func:`token_capacity`. ``seed_scopes=True`` is the pre-commit variant:
    static scratch of ``capacity`` rows and an explicit ``hc_pre_seed`` task zero-filling
    ``mixes_raw`` rows ``[0, t_linear)``; outputs are bit-identical.

    Args:
        x: ``[T, hc_mult, D]`` FP32 residual streams.
        hc_fn: ``[mix_hc, hc_mult*D]`` FP32 mixing projection.
        hc_scale: ``[3]`` FP32 scales of the pre, post and comb logits.
        hc_base: ``[mix_hc]`` FP32 biases.
        x_mixed: ``[T, D]`` BF16 output ``sum_h pre_h * x_h``.
        post: ``[T, hc_mult]`` FP32 output ``2*sigmoid(...)``.
        comb: ``[T, hc_mult^2]`` FP32 output, ``comb[t, i*hc_mult + j]`` (i input stream,
            j output stream), doubly stochastic after Sinkhorn.
        cfg: model config (``hc_mult``, ``hidden_size``, ``rms_norm_eps``, ``hc_eps``,
            ``hc_sinkhorn_iters``).
        seed_scopes: build the seed-task variant.

    Returns:
        ``(x_mixed, post, comb)`` (the output tensors).

    Raises:
        ConfigError: ``cfg`` cannot be tiled (:func:`hc_pre_tiling`).
        BindError: an argument whose shape does not match ``cfg``.
        CapacityError: ``round_up(T, 16)`` exceeds :func:`token_capacity`, naming the
            scratch tensor, before any task is submitted.
    """
    tl = hc_pre_tiling(cfg)
    hc, D, hc_dim, mix, mix_pad, hc_pad = tl.hc, tl.d, tl.hc_dim, tl.mix, tl.mix_pad, tl.hc_pad
    t = pl.tensor.dim(x, 0)
    expect_tensor("hc_pre", "x", x, [t, hc, D], pl.FP32)
    expect_tensor("hc_pre", "hc_fn", hc_fn, [mix, hc_dim], pl.FP32)
    expect_tensor("hc_pre", "hc_base", hc_base, [mix], pl.FP32)
    expect_tensor("hc_pre", "comb", comb, [t, hc * hc], pl.FP32)
    rms_eps, hc_eps, iters = cfg.rms_norm_eps, cfg.hc_eps, cfg.hc_sinkhorn_iters
    cap = token_capacity(cfg)
    t_linear = round_up(t, MATMUL_M_TILE)

    # ---- GM scratch (allocated at scope entry, before any task) ----
    if seed_scopes:
        check_seed_capacity("hc_pre", "mixes_raw", t_linear, t, cap)
        mixes_raw = pl.create_tensor([cap, mix_pad], pl.FP32, name="mixes_raw")
        inv_rms = pl.create_tensor([cap, 1], pl.FP32, name="inv_rms")
        pre_val_store = pl.create_tensor([cap, hc_pad], pl.FP32, name="pre_val_store")
    else:
        mixes_raw = pl.create_tensor([t_linear, mix_pad], pl.FP32, init_value=0, capacity=cap, name="mixes_raw")
        inv_rms = pl.create_tensor([t_linear, 1], pl.FP32, capacity=cap, name="inv_rms")
        pre_val_store = pl.create_tensor([t_linear, hc_pad], pl.FP32, capacity=cap, name="pre_val_store")

    x_flat = pl.reshape(x, [t, hc_dim])
    base_row = pl.reshape(hc_base, [1, mix])

    if seed_scopes:
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="hc_pre_seed", allow_early_resolve=True):
            mixes_raw[0:t_linear, 0:mix_pad] = pl.full([t_linear, mix_pad], pl.FP32, 0.0)

    # 1. inv_rms = rsqrt(mean(x_flat^2) + eps) per token
    RT = token_tile(t, tl.rms_t)
    for b in pl.spmd(-(-t // RT), name_hint="hc_pre_rms", allow_early_resolve=True):
        inv_rms_rows(x_flat, inv_rms, t, b * RT, RT, rms_eps)

    # 2. mixes_raw += x_flat[:, K-slice] @ hc_fn[:, K-slice]^T  (split-K, atomic add)
    LM, k_slice, k_tile = tl.lin_m, tl.k_slice, tl.k_tile
    for b in pl.spmd(-(-t_linear // LM) * HC_OK, name_hint="hc_pre_linear", allow_early_resolve=True):
        m0 = (b // HC_OK) * LM
        kq = b % HC_OK
        m = min(LM, t_linear - m0)
        rows = min(m, t - m0)
        acc = None
        for kc in pl.range(tl.k_steps):
            k0 = kq * k_slice + kc * k_tile
            xa = pl.slice(x_flat, [m, k_tile], [m0, k0], valid_shape=[rows, k_tile])
            wb = pl.slice(hc_fn, [mix_pad, k_tile], [0, k0], valid_shape=[mix, k_tile])
            acc = pl.matmul(xa, wb, b_trans=True) if acc is None else pl.matmul_acc(acc, xa, wb, b_trans=True)
        pl.assemble(mixes_raw, acc, [m0, 0], atomic=pl.AtomicType.Add)

    # 3. pre = sigmoid(mixes[:, :hc]*s0 + b) + eps -> pre_val_store; post = 2*sigmoid(...)
    ST = token_tile(t, tl.split_t)
    for b in pl.spmd(-(-t // ST), name_hint="split_pre_post", allow_early_resolve=True):
        t0 = b * ST
        rows = min(ST, t - t0)  # a ragged last tile computes only its own rows
        inv = pl.slice(inv_rms, [rows, 1], [t0, 0])
        s_pre, s_post = pl.read(hc_scale, [0]), pl.read(hc_scale, [1])
        z_pre = pl.row_expand_mul(pl.slice(mixes_raw, [rows, hc], [t0, 0]), inv)
        z_pre = pl.col_expand_add(z_pre * s_pre, pl.slice(base_row, [1, hc], [0, 0]))
        pl.assemble(pre_val_store, pl.recip(pl.exp(-z_pre) + 1.0) + hc_eps, [t0, 0])
        z_post = pl.row_expand_mul(pl.slice(mixes_raw, [rows, hc], [t0, hc]), inv)
        z_post = pl.col_expand_add(z_post * s_post, pl.slice(base_row, [1, hc], [0, hc]))
        pl.assemble(post, pl.recip(pl.exp(-z_post) + 1.0) * 2.0, [t0, 0])

    # 4. comb = sinkhorn(softmax_j(mixes[:, 2hc:]*s2 + b) + eps)
    CT = token_tile(t, tl.comb_t)
    for b in pl.spmd(-(-t // CT), name_hint="comb_sinkhorn", allow_early_resolve=True):
        t0 = b * CT
        tt = min(CT, t - t0)  # the block's tokens (a ragged last tile computes only its own rows)
        inv = pl.slice(inv_rms, [tt, 1], [t0, 0])
        s_comb = pl.read(hc_scale, [2])
        z = pl.row_expand_mul(pl.slice(mixes_raw, [tt, hc * hc], [t0, 2 * hc]), inv)
        z = pl.col_expand_add(z * s_comb, pl.slice(base_row, [1, hc * hc], [0, 2 * hc]))
        # rows = (token, input stream i), columns = output stream j (no pad columns: a row max,
        # and a row sum in order, over hc columns is the value over hc_pad with FP32-minimum / zero pads)
        zr = pl.reshape(z, [tt * hc, hc])
        e = pl.exp(pl.row_expand_sub(zr, pl.row_max(zr)))
        c = pl.row_expand_div(e, pl.row_sum(e)) + hc_eps
        if tt == 1:  # one token: [hc (i), hc (j)] is both layouts below (no reshapes, no transposes)
            c = _sinkhorn_cols(c, hc_eps)
            for _ in pl.range(iters - 1):
                c = _sinkhorn_cols(pl.row_expand_div(c, pl.row_sum(c) + hc_eps), hc_eps)
            pl.assemble(comb, pl.reshape(c, [1, hc * hc]), [t0, 0])
            continue
        # Sinkhorn on the [hc (i), tt*hc (token, j)] layout: the column pass is one column
        # reduction, the row pass a row reduction of a reshaped view (no transposes per round)
        c = pl.reshape(pl.transpose(pl.reshape(c, [tt, hc, hc]), 0, 1), [hc, tt * hc])
        c = _sinkhorn_cols(c, hc_eps)
        for _ in pl.range(iters - 1):
            c = _sinkhorn_cols(_sinkhorn_rows(c, tt, hc, hc_eps), hc_eps)
        out = pl.reshape(pl.transpose(pl.reshape(c, [hc, tt, hc]), 0, 1), [tt, hc * hc])
        pl.assemble(comb, out, [t0, 0])

    # 5. x_mixed = bf16_rne((x0*pre0 + x1*pre1) + (x2*pre2 + x3*pre3))
    MT, DT = token_tile(t, tl.mix_t), tl.d_tile
    n_d = D // DT
    x_rows = pl.reshape(x, [t * hc, D])  # row t*hc + h: stream h of token t
    for b in pl.spmd(-(-t // MT) * n_d, name_hint="mix_x", allow_early_resolve=True):
        t0 = (b // n_d) * MT
        d0 = (b % n_d) * DT
        rows = min(MT, t - t0)  # a ragged last tile computes only its own rows
        pre = pl.slice(pre_val_store, [rows, hc], [t0, 0])
        if n_d == 1:  # the tokens' whole rows in one load as [rows*hc, D] (row (token, stream)), every
            # x_h * pre_h in one row-broadcast multiply by pre as a [rows*hc, 1] column; stream h is
            # columns h*D .. (h+1)*D of the product's [rows, hc*D] view
            xr = pl.slice(x_rows, [rows * hc, D], [t0 * hc, 0])
            prod = pl.reshape(pl.row_expand_mul(xr, pl.reshape(pre, [rows * hc, 1])), [rows, hc * D])
            terms = [prod[:, h * D:(h + 1) * D] for h in range(hc)]
        else:  # each stream's [rows, DT] window of x_flat loaded on its own
            xs = [pl.slice(x_flat, [rows, DT], [t0, h * D + d0]) for h in range(hc)]
            terms = [pl.row_expand_mul(xs[h], pl.slice(pre, [rows, 1], [0, h])) for h in range(hc)]
        while len(terms) > 1:  # pairwise tree, as the golden
            terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i] for i in range(0, len(terms), 2)]
        pl.assemble(x_mixed, pl.cast(terms[0], pl.BF16, mode="rint"), [t0, d0])
    return x_mixed, post, comb


@functools.lru_cache(maxsize=None)
def hc_pre_entry(cfg: DeepSeekV4Config, seed_scopes: bool = False):
    """The ``@pl.jit`` test entry ``hc_pre_test(x, hc_fn, hc_scale, hc_base, x_mixed, post,
    comb)`` for ``cfg`` (static dims from the config, ``T`` dynamic; shapes as
    :func:`hc_pre`), calling :func:`hc_pre` with ``seed_scopes``.

    Raises:
        ConfigError: ``cfg`` cannot be tiled.
    """
    hc_pre_tiling(cfg)
    hc, D, mix = cfg.hc_mult, cfg.hidden_size, cfg.mix_hc

    @pl.jit
    def hc_pre_test(
        x: pl.Tensor[[T_DYN, hc, D], pl.FP32],
        hc_fn: pl.Tensor[[mix, hc * D], pl.FP32],
        hc_scale: pl.Tensor[[3], pl.FP32],
        hc_base: pl.Tensor[[mix], pl.FP32],
        x_mixed: pl.Out[pl.Tensor[[T_DYN, D], pl.BF16]],
        post: pl.Out[pl.Tensor[[T_DYN, hc], pl.FP32]],
        comb: pl.Out[pl.Tensor[[T_DYN, hc * hc], pl.FP32]],
    ):
        return hc_pre(x, hc_fn, hc_scale, hc_base, x_mixed, post, comb, cfg, seed_scopes)

    return hc_pre_test
# ---- end kernel ----


def _check_shape(fn: str, name: str, t: torch.Tensor, shape: tuple[int, ...]) -> None:
    """Raise BindError unless ``t`` is a float tensor of exactly ``shape``."""
    if tuple(t.shape) != tuple(shape) or not t.is_floating_point():
        raise BindError(f"{fn}: {name} must be a float tensor of shape {list(shape)}, "
                        f"got {t.dtype} {list(t.shape)}")


def _sinkhorn(c: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """Sinkhorn on ``[T, N, N]``: one column pass, then ``iters - 1`` (row, column) passes."""
    c = c / (c.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        c = c / (c.sum(dim=-1, keepdim=True) + eps)
        c = c / (c.sum(dim=-2, keepdim=True) + eps)
    return c


def golden_hc_pre(
    x: torch.Tensor,  # [T, hc_mult, D] fp32
    hc_fn: torch.Tensor,  # [mix_hc, hc_dim] fp32
    hc_scale: torch.Tensor,  # [3] fp32
    hc_base: torch.Tensor,  # [mix_hc] fp32
    cfg: DeepSeekV4Config,
    *,
    out_bf16: bool = True,
    return_pre: bool = False,
) -> tuple[torch.Tensor, ...]:
    """Hyper-connection pre-mix golden (pypto-lib `models/deepseek/v4-flash/hc_pre.py`, transformers `models/deepseek_v4/modeling_deepseek_v4.py`).

    Numerics: everything in FP32. ``inv_rms`` is the rsqrt of the mean of squares over
    the flattened ``hc_dim = hc_mult * D`` row plus ``cfg.rms_norm_eps``. The mixes
    matmul is split into ``HC_K_CHUNK``-wide K chunks whose ``[T, mix_hc]`` partials are
    added in chunk order, then scaled by ``inv_rms``. Sigmoid is ``torch.sigmoid``; the
    comb softmax is over the output-stream axis ``j``; Sinkhorn runs one column
    normalisation then ``cfg.hc_sinkhorn_iters - 1`` (row, column) rounds with
    ``cfg.hc_eps``. ``x_mixed`` adds the weighted streams as a pairwise tree
    (``(x0*p0 + x1*p1) + (x2*p2 + x3*p3)`` for four streams).

    Args:
        x: ``[T, hc_mult, D]`` FP32 residual streams.
        hc_fn: ``[mix_hc, hc_dim]`` FP32 mixing projection (``mix_hc = (2+hc_mult)*hc_mult``).
        hc_scale: ``[3]`` FP32 scales for the pre, post and comb logits.
        hc_base: ``[mix_hc]`` FP32 biases.
        cfg: model config (``hc_mult``, ``hidden_size``, ``rms_norm_eps``, ``hc_eps``,
            ``hc_sinkhorn_iters``).
        out_bf16: cast ``x_mixed`` to BF16 (RNE, the kernel's ``rint`` cast); ``False``
            keeps it FP32.
        return_pre: also return the stream weights ``pre`` (the kernel's ``pre_val_store``
            scratch; used by the transformers parity tests).

    Returns:
        ``(x_mixed, post, comb)``: ``x_mixed [T, D]`` BF16 (or FP32), ``post [T, hc_mult]``
        FP32 in (0, 2), ``comb [T, hc_mult*hc_mult]`` FP32 with ``comb[t, i*hc_mult + j]``
        (i = input stream, j = output stream), column sums ~= 1. With ``return_pre`` a
        fourth element ``pre [T, hc_mult]`` FP32 in (hc_eps, 1 + hc_eps).

    Raises:
        BindError: any argument with the wrong shape or a non-float dtype.
    """
    fn = "golden_hc_pre"
    hc, D = cfg.hc_mult, cfg.hidden_size
    if x.dim() != 3:
        raise BindError(f"{fn}: x must be [T, {hc}, {D}], got {list(x.shape)}")
    T = x.shape[0]
    _check_shape(fn, "x", x, (T, hc, D))
    _check_shape(fn, "hc_fn", hc_fn, (cfg.mix_hc, cfg.hc_dim))
    _check_shape(fn, "hc_scale", hc_scale, (3,))
    _check_shape(fn, "hc_base", hc_base, (cfg.mix_hc,))

    x_flat = x.float().reshape(T, cfg.hc_dim)
    w = hc_fn.float()
    inv_rms = torch.rsqrt(x_flat.square().mean(dim=-1, keepdim=True) + cfg.rms_norm_eps)  # [T, 1]
    mixes_raw = torch.zeros(T, cfg.mix_hc, dtype=torch.float32)
    for k0 in range(0, cfg.hc_dim, HC_K_CHUNK):
        mixes_raw = mixes_raw + x_flat[:, k0:k0 + HC_K_CHUNK] @ w[:, k0:k0 + HC_K_CHUNK].T
    mixes = mixes_raw * inv_rms

    s = hc_scale.float()
    base = hc_base.float()
    pre = torch.sigmoid(mixes[:, :hc] * s[0] + base[:hc]) + cfg.hc_eps
    post = 2.0 * torch.sigmoid(mixes[:, hc:2 * hc] * s[1] + base[hc:2 * hc])
    comb_logits = (mixes[:, 2 * hc:] * s[2] + base[2 * hc:]).reshape(T, hc, hc)
    comb = torch.softmax(comb_logits, dim=-1) + cfg.hc_eps
    comb = _sinkhorn(comb, cfg.hc_sinkhorn_iters, cfg.hc_eps).reshape(T, hc * hc)

    xf = x.float()
    terms = [xf[:, h, :] * pre[:, h:h + 1] for h in range(hc)]
    while len(terms) > 1:  # pairwise tree: ((t0+t1) + (t2+t3)) for four streams
        terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i]
                 for i in range(0, len(terms), 2)]
    x_mixed = terms[0]
    if out_bf16:
        x_mixed = x_mixed.to(torch.bfloat16)
    if return_pre:
        return x_mixed, post, comb, pre
    return x_mixed, post, comb


def make_hc_pre_inputs(cfg: DeepSeekV4Config, T: int, seed: int) -> dict[str, torch.Tensor]:
    """Seeded fixture for :func:`golden_hc_pre` (pypto-lib `models/deepseek/v4-flash/hc_pre.py` test inputs).

    ``x ~ N(0, 1) * 0.05`` then ``hc_fn ~ N(0, 1) * 0.0519`` (drawn in that order from a
    ``torch.Generator`` seeded with ``seed``); ``hc_scale`` and ``hc_base`` are the fixed
    real values :data:`HC_SCALE_REF` and :data:`HC_BASE_REF`.

    Args:
        cfg: model config; ``hc_mult`` must be 4 (the fixed base has 24 values).
        T: number of tokens (> 0).
        seed: generator seed.

    Returns:
        ``{"x": [T, hc_mult, D] fp32, "hc_fn": [mix_hc, hc_dim] fp32,
        "hc_scale": [3] fp32, "hc_base": [mix_hc] fp32}``.

    Raises:
        ConfigError: ``cfg.hc_mult != 4`` (no reference base for other widths).
        BindError: ``T`` not positive.
    """
    if cfg.mix_hc != len(HC_BASE_REF):
        raise ConfigError(f"make_hc_pre_inputs: config {cfg.name!r} has hc_mult={cfg.hc_mult} "
                          f"(mix_hc={cfg.mix_hc}); the reference hc_base has {len(HC_BASE_REF)} "
                          f"values (hc_mult=4)")
    if T <= 0:
        raise BindError(f"make_hc_pre_inputs: T must be positive, got {T}")
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(T, cfg.hc_mult, cfg.hidden_size, generator=gen) * 0.05
    hc_fn = torch.randn(cfg.mix_hc, cfg.hc_dim, generator=gen) * 0.0519
    return {
        "x": x,
        "hc_fn": hc_fn,
        "hc_scale": torch.tensor(HC_SCALE_REF, dtype=torch.float32),
        "hc_base": torch.tensor(HC_BASE_REF, dtype=torch.float32),
    }


# ---- registration ----
def build_hc_pre(preset: str = "tiny", mode: str = "prefill", *, T: int | None = None, seed: int = 0,
                 seed_scopes: bool = False) -> CaseRun:
    """KernelCase builder: ``hc_pre`` at ``preset`` in ``mode`` (decode: 4x2 = 8 tokens at
    flash, prefill: 128) or ``T`` tokens, inputs from :func:`make_hc_pre_inputs`;
    ``seed_scopes=True`` selects the seed-task variant.

    Raises:
        ConfigError: unknown preset / mode, bad ``T``, or a config hc_pre cannot tile.
        CapacityError: ``T`` above the token capacity (before any input is built).
    """
    cfg, T = mode_tokens(preset, mode, T)
    check_token_capacity("hc_pre", cfg, T)  # before any input is built
    hc, D, mix = cfg.hc_mult, cfg.hidden_size, cfg.mix_hc
    ins = make_hc_pre_inputs(cfg, T, seed)
    f32 = torch.float32
    specs = [
        TensorSpec("x", [T, hc, D], f32, init_value=ins["x"]),
        TensorSpec("hc_fn", [mix, hc * D], f32, init_value=ins["hc_fn"]),
        TensorSpec("hc_scale", [3], f32, init_value=ins["hc_scale"]),
        TensorSpec("hc_base", [mix], f32, init_value=ins["hc_base"]),
        TensorSpec("x_mixed", [T, D], torch.bfloat16, is_output=True),
        TensorSpec("post", [T, hc], f32, is_output=True),
        TensorSpec("comb", [T, hc * hc], f32, is_output=True),
    ]

    def golden(v: dict) -> None:
        v["x_mixed"], v["post"], v["comb"] = golden_hc_pre(v["x"], v["hc_fn"], v["hc_scale"], v["hc_base"], cfg)

    compare = {k: ratio_allclose(*tol) for k, tol in TOLERANCES.items()}
    label = f"{preset} {mode} T={T}" + (" seed_scopes" if seed_scopes else "")
    return CaseRun(hc_pre_entry(cfg, bool(seed_scopes)), specs, golden, compare, rtol=1e-3, atol=1e-3, label=label)


register(KernelCase("hc_pre", build_hc_pre, modes=("decode", "prefill"), seed_variant=True,
                    description="hyper-connection pre-mix, separate variant, split-K into init-0 mixes_raw (pypto-lib `hc_pre.py`)"))
