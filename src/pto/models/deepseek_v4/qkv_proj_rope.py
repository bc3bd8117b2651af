"""MLA query / kv projections with RMSNorm, interleaved RoPE and the INT8 q-LoRA latent.

Math (pypto-lib `models/deepseek/v4-flash/qkv_proj_rope.py`; transformers `models/deepseek_v4/modeling_deepseek_v4.py`), FP32 unless noted, ``n = nope_head_dim``:

    qr_f      = rmsnorm(x @ wq_a) * gamma_cq                    # [T, q_lora]
    qr, s_qr  = int8_per_row(qr_f)                               # W8A8 activation side
    q         = (qr @ wq_b  in INT32) * s_qr * wq_b_scale         # [T, H*head_dim]
    q         = per-head rmsnorm(q) (no weight); q[..., n:] = rope(q[..., n:])
    kv        = rmsnorm(x @ wkv) * gamma_ckv; kv[:, n:] = rope(kv[:, n:])
    q, kv -> BF16 (RNE); qr INT8; qr_scale = 1/s FP32

RoPE is interleaved (pairs (2i, 2i+1) rotate with frequency i) on the trailing
``qk_rope_head_dim`` channels.

RoPE table convention (taken here): ``rope_cos`` / ``rope_sin`` are per-token rows
``[T, rope_dim]`` in the *full-width duplicated* layout of the reference tables, i.e.
column ``i`` and column ``i + rope_dim/2`` both hold frequency ``i``. Only the first half
is read: pair ``i`` (channels ``2i``, ``2i+1``) uses ``cos[:, i]``, ``sin[:, i]``. This is
what the kernel's ``gather(cos, j >> 1)`` over ``j = 0..rope_dim-1`` and the reference
golden's ``cos[:, :rope_dim/2]`` both read; the duplicated second half is ignored. (A
strided ``cos[:, 0::2]`` would be wrong for this layout.) :func:`rope_interleaved` also
accepts half-width ``[T, rope_dim/2]`` tables.

Kernel (:func:`qkv_proj_rope`, after commit 3b6971a3): seven tasks, 7 derived edges
(``qr_proj_matmul -> qr_rms_norm_quant -> qproj_matmul -> qproj_dequant_rms_nope_rope``,
``qr_rms_norm_quant -> qproj_dequant_rms_nope_rope``, ``kv_proj_matmul -> kv_rms_norm_rope``,
``q_rope_prepare`` -> both RoPE consumers). The split-K accumulators ``qr_fp32`` /
``kv_fp32`` are zero-initialised at allocation and sized ``[t_pad, .]`` with
``t_pad = round_up(T, 16)`` and a declared capacity (128); ``seed_scopes=True`` is the
pre-commit shape (static scratch at capacity, ``qr_proj_seed`` / ``kv_proj_seed`` tasks:
9 tasks, 11 edges). ``materialize_rope_rows`` builds the per-token table rows for prefill.
Deviations from the reference, all value-preserving except the K association of the BF16
matmuls (the golden is one FP32 matmul either way): the matmul tasks take up to 128 rows
and their whole K-slice per matmul (reference: 16 rows, 256/128-wide K steps), the vector
tasks token tiles of up to 32 rows (reference 8), ``qproj_dequant_rms_nope_rope`` all ``T``
rows of its 4 heads at once; the quantiser takes ``amax`` of ``qr*inv*gamma`` directly (the
golden's order) instead of ``inv * amax(qr*gamma)``; q is stored as one strided window whose
footprint is one exact box per token row (its 4 heads, contiguous in ``q``; a bounding box
of the multi-token window would overlap the neighbouring blocks' heads).
"""

import functools
from types import SimpleNamespace

import torch

import pto.language as pl
from pto.errors import BindError
from pto.golden import CaseRun, KernelCase, TensorSpec, exact, ratio_allclose, register
from pto.models.deepseek_v4.config import DeepSeekV4Config
from pto.models.deepseek_v4.tiling import (MATMUL_M_TILE, VEC_T_TILE, check_seed_capacity, check_token_capacity,
                                           expect_tensor,
                                           mode_tokens, need, round_up, token_capacity, token_tile)
from pto.models.deepseek_v4.weight_format import act_dtype, is_bf16, weight_dtype, with_weight_format

__all__ = [
    "qkv_proj_rope",
    "materialize_rope_rows",
    "qkv_proj_rope_tiling",
    "qkv_proj_rope_entry",
    "materialize_rope_rows_entry",
    "build_qkv_proj_rope",
    "INT8_SCALE_MAX",
    "INT8_AMAX_EPS",
    "int8_row_amax",
    "int8_row_codes",
    "int8_quantize_rows",
    "golden_qr_split_k",
    "rotate_interleaved",
    "TOLERANCES",
    "quantize_per_row_int8",
    "quantize_weight_per_column",
    "rope_interleaved",
    "golden_qkv_proj_rope",
    "make_qkv_inputs",
]

INT8_SCALE_MAX = 127.0  # symmetric INT8 range +-127 (pypto-lib `models/deepseek/v4-flash/` INT8 conventions)
INT8_AMAX_EPS = 1e-4  # floor on amax so an all-zero row/column has a finite scale

# Compare functions per output as ratio_allclose (atol, rtol, max_error_ratio);
# pypto-lib `models/deepseek/v4-flash/qkv_proj_rope.py`; the pypto-lib tests' tolerances. qr: every INT8 code within +-1. The reference harness
# run also sets rtol=atol=5e-3. The registered case uses the q / kv entries; it compares
# qr / qr_scale exactly against the split-K emulation (golden_qr_split_k).
TOLERANCES: dict[str, tuple[float, float, float]] = {
    "q": (1e-4, 1 / 128, 0.005),
    "kv": (1e-4, 1 / 128, 0.005),
    "qr": (1.0, 0.0, 0.0),
    "qr_scale": (2.5e-5, 5e-3, 0.005),
}

# ---- kernel ----
T_DYN = pl.dynamic("T")  # runtime token count
D_DYN = pl.dynamic("D")  # hidden_size
LQ_DYN = pl.dynamic("Q_LORA")  # q_lora_rank
QD_DYN = pl.dynamic("Q_DIM")  # num_attention_heads * head_dim
H_DYN = pl.dynamic("H")  # num_attention_heads
HD_DYN = pl.dynamic("HEAD_DIM")  # head_dim
R_DYN = pl.dynamic("ROPE_DIM")  # qk_rope_head_dim
P_DYN = pl.dynamic("P")  # rope table rows (max positions)

# Tiling. Tasks, split-K factors and the per-task work split follow pypto-lib `models/deepseek/v4-flash/qkv_proj_rope.py`;
# tile sizes are CPU-sized (reference values in brackets): the matmul tasks take all
# t_pad rows (up to QKV_M_TILE) and their whole K-slice per step, the vector tasks 32 tokens.
QR_OK = 2  # K-slices of qr_proj_matmul (atomic add into qr_fp32) [2]
QR_N_TILE = 128  # q_lora columns per qr_proj_matmul block [128]
KV_OK = 4  # K-slices of kv_proj_matmul (atomic add into kv_fp32) [4]
KV_N_TILE = 128  # head_dim columns per kv_proj_matmul block [128]
QP_N_TILE = 1024  # q columns per qproj_matmul N-tile [1024]
QP_TILES_PER_TASK = 2  # N-tiles per qproj_matmul block [2]
QD_HEADS = 4  # heads per qproj_dequant_rms_nope_rope block [4]
QKV_M_TILE = 128  # matmul rows per step, a multiple of MATMUL_M_TILE [16]
QKV_K_TILE_MAX = 4096  # K per matmul step [256 (BF16), 128 (INT8)]
QKV_T_TILE = 32  # token rows per vector-task step [8]
ROPE_ROWS_T_TILE = VEC_T_TILE  # token rows per qkv_rope_rows block [8]


def _k_steps(k: int, kmax: int) -> int:
    """Number of equal steps of at most ``kmax`` covering ``k`` (0 if none divides evenly)."""
    s = -(-k // kmax)
    return s if k % s == 0 else 0


def qkv_proj_rope_tiling(cfg: DeepSeekV4Config) -> SimpleNamespace:
    """Tile sizes of :func:`qkv_proj_rope` for ``cfg``.

    Returns a namespace with the model dims (``d``, ``lq``, ``h``, ``hd``, ``r``, ``n`` =
    nope dims, ``qd``) and ``qr_n`` / ``qr_k`` / ``qr_steps`` (qr_proj N tile, K-slice,
    steps per slice), ``kv_n`` / ``kv_k`` / ``kv_steps``, ``qp_n`` / ``qp_per_task``,
    ``qd_heads``, ``m_tile``, ``t_tile``.

    Raises:
        ConfigError: a dimension that does not split into the tiles above: ``hidden_size``
            not divisible into ``QR_OK`` and ``KV_OK`` K-slices of whole 16-column steps;
            ``q_lora_rank`` not a multiple of 32 (INT8 rows of 32 bytes) or of its N tile;
            ``head_dim`` not a multiple of its N tile; ``num_attention_heads`` not a
            multiple of the heads per dequant block; the q width not a multiple of its
            N tile; ``q_lora_rank * 127^2`` not below 2^31 (exact INT32 accumulation).
    """
    k = "qkv_proj_rope"
    D, Lq, H, hd, r = cfg.hidden_size, cfg.q_lora_rank, cfg.num_attention_heads, cfg.head_dim, cfg.qk_rope_head_dim
    qd = H * hd
    need(D > 0 and D % (QR_OK * 16) == 0 and D % (KV_OK * 16) == 0, k, cfg,
         f"hidden_size={D} must split into {QR_OK} and {KV_OK} K-slices of a multiple of 16")
    need(Lq > 0 and Lq % 32 == 0, k, cfg, f"q_lora_rank={Lq} must be a positive multiple of 32")
    need(Lq * 127 * 127 < 2 ** 31, k, cfg, f"q_lora_rank={Lq} overflows the INT32 accumulator")
    qr_n = min(QR_N_TILE, Lq)
    need(Lq % qr_n == 0, k, cfg, f"q_lora_rank={Lq} is not a multiple of the qr N tile {qr_n}")
    kv_n = min(KV_N_TILE, hd)
    need(hd % 16 == 0 and hd % kv_n == 0, k, cfg, f"head_dim={hd} must be a multiple of 16 and of {kv_n}")
    need(r % 2 == 0 and 0 < r <= hd, k, cfg, f"qk_rope_head_dim={r} must be even and in (0, head_dim]")
    qd_heads = min(QD_HEADS, H)
    need(H % qd_heads == 0, k, cfg, f"num_attention_heads={H} is not a multiple of {qd_heads}")
    qp_n = min(QP_N_TILE, qd)
    need(qd % qp_n == 0, k, cfg, f"q width {qd} is not a multiple of the q-proj N tile {qp_n}")
    qp_per_task = QP_TILES_PER_TASK if (qd // qp_n) % QP_TILES_PER_TASK == 0 else 1
    qr_k, kv_k = D // QR_OK, D // KV_OK
    qr_steps, kv_steps = _k_steps(qr_k, QKV_K_TILE_MAX), _k_steps(kv_k, QKV_K_TILE_MAX)
    need(qr_steps and (qr_k // qr_steps) % 16 == 0 and kv_steps and (kv_k // kv_steps) % 16 == 0, k, cfg,
         f"K-slices {qr_k} / {kv_k} do not split into equal steps of a multiple of 16")
    return SimpleNamespace(d=D, lq=Lq, h=H, hd=hd, r=r, n=hd - r, qd=qd, qr_n=qr_n, qr_k=qr_k, qr_steps=qr_steps,
                           kv_n=kv_n, kv_k=kv_k, kv_steps=kv_steps, qp_n=qp_n, qp_per_task=qp_per_task,
                           qd_heads=qd_heads, m_tile=QKV_M_TILE, t_tile=QKV_T_TILE)


def _split_k_matmul(a, w, acc_dst, t: int, t_pad: int, m_tile: int, k0: int, k: int, steps: int, n0: int,
                    n: int) -> None:
    """One split-K block: ``acc_dst[:, n0:n0+n] += a[:, k0:k0+k] @ w[k0:k0+k, n0:n0+n]``
    over row tiles of ``m_tile`` (rows ``>= t`` of ``a`` read as zero), atomically."""
    kt = k // steps
    for m0 in pl.range(0, t_pad, m_tile):
        m = min(m_tile, t_pad - m0)
        rows = min(m, t - m0)
        acc = None
        for s in pl.range(steps):
            xa = pl.slice(a, [m, kt], [m0, k0 + s * kt], valid_shape=[rows, kt])
            wb = pl.slice(w, [kt, n], [k0 + s * kt, n0])
            acc = pl.matmul(xa, wb) if acc is None else pl.matmul_acc(acc, xa, wb)
        pl.assemble(acc_dst, acc, [m0, n0], atomic=pl.AtomicType.Add)


def _rope_tiles(cos_il, sin_signed, swap_idx, t0: int, tt: int, rows: int, r: int):
    """Load the per-token rope tables of rows ``t0 .. t0+rows`` as ``[tt, r]`` tiles."""
    return (pl.slice(cos_il, [tt, r], [t0, 0], valid_shape=[rows, r]),
            pl.slice(sin_signed, [tt, r], [t0, 0], valid_shape=[rows, r]),
            pl.slice(swap_idx, [tt, r], [t0, 0], valid_shape=[rows, r]))


def rotate_interleaved(y, cos, sin, swap):
    """Interleaved RoPE of the FP32 tile ``y [M, r]``: ``y*cos + y[:, j^1]*sin``, i.e. two
    multiplies, one gather and one add, in that order.

    ``cos [M, r]`` FP32 holds ``cos[j>>1]``, ``sin [M, r]`` FP32 the sign-folded
    ``sign[j] * sin[j>>1]`` (``-1`` on even lanes rotates forward, as in qkv_proj_rope;
    ``+1`` rotates back, as in prefill_sparse_attn), ``swap`` INT32 ``j^1`` (``[M, r]`` or
    one ``[1, r]`` row). Returns ``[M, r]`` FP32.
    """
    return y * cos + pl.gather(y, index=swap) * sin


def int8_row_amax(x):
    """Tile half of the per-row INT8 activation quantisation (:func:`quantize_per_row_int8`,
    pypto-lib `models/deepseek/v4-flash/` INT8 conventions): ``max(row_max(|x|), INT8_AMAX_EPS)`` ``[M, 1]`` FP32 of
    the FP32 tile ``x [M, N]``; the caller forms the scale ``s = 127 / amax``."""
    return pl.maximum(pl.row_max(pl.abs(x)), INT8_AMAX_EPS)


def int8_row_codes(x, s):
    """INT8 codes ``[M, N]`` of the FP32 tile ``x [M, N]`` scaled per row by ``s [M, 1]`` FP32:
    ``x * s`` -rint-> INT8 in one saturating cast (NaN gives 0). The reference's chain
    (FP32 -rint-> INT32 -round-> FP16 -trunc-> INT8, which :func:`quantize_per_row_int8`
    reproduces) gives the same code for every FP32 input: the FP16 hop keeps every integer in
    ``[-128, 127]`` and rounds any other one monotonically to a value that saturates alike."""
    return pl.cast(pl.row_expand_mul(x, s), pl.INT8, mode="rint")


def int8_quantize_rows(x):
    """Per-row INT8 quantisation of the FP32 tile ``x [M, N]`` as the kernels do it (and as
    :func:`quantize_per_row_int8` reproduces bit for bit): ``s = 127 / amax`` in one IEEE
    division, codes by :func:`int8_row_codes`. Returns ``(codes [M, N] INT8, s [M, 1] FP32)``;
    the dequant scale is ``pl.recip(s)``."""
    s = pl.div(INT8_SCALE_MAX, int8_row_amax(x))
    return int8_row_codes(x, s), s


@pl.jit.inline
def qkv_proj_rope(
    x: pl.Tensor[[T_DYN, D_DYN], pl.BF16],
    wq_a: pl.Tensor[[D_DYN, LQ_DYN], pl.BF16],
    wq_b: pl.Tensor,  # [LQ, QD] INT8, or BF16 for weight_format "bf16" (checked in the body)
    wq_b_scale: pl.Tensor[[QD_DYN], pl.FP32],
    wkv: pl.Tensor[[D_DYN, HD_DYN], pl.BF16],
    rope_cos: pl.Tensor[[T_DYN, R_DYN], pl.BF16],
    rope_sin: pl.Tensor[[T_DYN, R_DYN], pl.BF16],
    gamma_cq: pl.Tensor[[LQ_DYN], pl.BF16],
    gamma_ckv: pl.Tensor[[HD_DYN], pl.BF16],
    q: pl.Out[pl.Tensor[[T_DYN, H_DYN, HD_DYN], pl.BF16]],
    kv: pl.Out[pl.Tensor[[T_DYN, HD_DYN], pl.BF16]],
    qr: pl.Out[pl.Tensor],  # [T, LQ] INT8, or BF16 for weight_format "bf16"
    qr_scale: pl.Out[pl.Tensor[[T_DYN, 1], pl.FP32]],
    late_dep: pl.Scalar[pl.TASK_ID],
    cfg,
    seed_scopes: bool = False,
):
    """MLA q / kv projections with RMSNorm, INT8 q-LoRA latent and interleaved RoPE (pypto-lib `qkv_proj_rope.py`).

    Stable inline signature:
    ``qkv_proj_rope(x, wq_a, wq_b, wq_b_scale, wkv, rope_cos, rope_sin, gamma_cq, gamma_ckv,
    q, kv, qr, qr_scale, late_dep, cfg, seed_scopes=False) -> (q, kv, qr, qr_scale)``.

    Tasks, in submission order: ``q_rope_prepare`` (interleaved cos, signed sin and the
    ``j^1`` swap index per token), ``qr_proj_matmul`` (``x @ wq_a``, ``QR_OK`` K-slices
    atomically added into ``qr_fp32``), ``qr_rms_norm_quant`` (RMSNorm with ``gamma_cq``,
    per-row INT8: ``amax`` floored at 1e-4, ``s = 127/amax``, FP32 -rint-> INT32 -round->
    FP16 -trunc-> INT8; writes ``qr``, ``qr_scale = 1/s`` and ``qr_i8_matmul``),
    ``qproj_matmul`` (INT8 x INT8 -> INT32 into ``q_proj_i32``), ``qproj_dequant_rms_nope_rope``
    (``acc * qr_scale * wq_b_scale``, per-head RMSNorm without weight, RoPE on the last
    ``rope_dim`` channels, BF16 ``rint``), ``kv_proj_matmul`` (``deps=[late_dep]``,
    ``x @ wkv`` in ``KV_OK`` K-slices atomically added into ``kv_fp32``), ``kv_rms_norm_rope``.

    GM scratch (``t_pad = round_up(T, 16)``, capacity :func:`token_capacity`):
    ``qr_fp32 [t_pad, q_lora]`` and ``kv_fp32 [t_pad, head_dim]`` FP32 zero-initialised at
    allocation; ``qr_i8_matmul [t_pad, q_lora]`` INT8 and ``q_proj_i32 [t_pad, H*head_dim]``
    INT32 uninitialised; ``q_rope_cos_il`` / ``q_rope_sin_signed`` FP32 and ``q_rope_swap_idx``
    INT32, ``[T, rope_dim]`` uninitialised. Tail rows go through ``valid_shape``; padding rows
    are never stored to an output. ``seed_scopes=True`` is the pre-commit variant: the four
    projection scratch tensors static at ``capacity`` rows, and ``qr_proj_seed`` /
    ``kv_proj_seed`` tasks zero-filling rows ``[0, t_pad)``; outputs are bit-identical.

    Args:
        x: ``[T, D]`` BF16 attention-normed activations.
        wq_a: ``[D, q_lora]`` BF16. wq_b: ``[q_lora, H*head_dim]`` INT8 per-column codes.
        wq_b_scale: ``[H*head_dim]`` FP32 per-column dequant scale.
        wkv: ``[D, head_dim]`` BF16.
        rope_cos, rope_sin: ``[T, rope_dim]`` BF16 per-token rows, full-width duplicated
            layout (pair ``i`` reads column ``i``).
        gamma_cq: ``[q_lora]`` BF16. gamma_ckv: ``[head_dim]`` BF16.
        q: ``[T, H, head_dim]`` BF16 out. kv: ``[T, head_dim]`` BF16 out.
        qr: ``[T, q_lora]`` INT8 out. qr_scale: ``[T, 1]`` FP32 out (``amax / 127``).
        late_dep: task id that ``kv_proj_matmul`` waits for (``-1``: none); callers pass
            ``pl.system.task_dummy(deps=[rms_norm_tid])`` (scheduling only).
        cfg: model config. seed_scopes: build the seed-task variant.

    ``cfg.weight_format == "bf16"`` (weight_format.py): ``wq_b`` and ``qr`` are BF16, the q-LoRA
    latent is rounded to BF16 (``rint``) instead of quantised (``qr_scale`` written as 1),
    ``qproj_matmul`` is BF16 x BF16 -> FP32 into an FP32 ``q_proj_i32`` and the dequant step
    applies no scale; the same tasks, and one edge fewer (the dequant step does not read
    ``qr_scale``).

    Returns:
        ``(q, kv, qr, qr_scale)``.

    Raises:
        ConfigError: ``cfg`` cannot be tiled (:func:`qkv_proj_rope_tiling`).
        BindError: an argument whose shape does not match ``cfg``.
        CapacityError: ``round_up(T, 16)`` exceeds :func:`token_capacity`, naming the
            scratch tensor, before any task is submitted.
    """
    tl = qkv_proj_rope_tiling(cfg)
    D, Lq, H, hd, r, n, qd = tl.d, tl.lq, tl.h, tl.hd, tl.r, tl.n, tl.qd
    t = pl.tensor.dim(x, 0)
    kname = "qkv_proj_rope"
    expect_tensor(kname, "x", x, [t, D], pl.BF16)
    expect_tensor(kname, "wq_a", wq_a, [D, Lq], pl.BF16)
    bf16 = is_bf16(cfg)
    expect_tensor(kname, "wq_b", wq_b, [Lq, qd], weight_dtype(cfg))
    expect_tensor(kname, "qr", qr, [t, Lq], act_dtype(cfg))
    expect_tensor(kname, "wkv", wkv, [D, hd], pl.BF16)
    expect_tensor(kname, "rope_cos", rope_cos, [t, r], pl.BF16)
    expect_tensor(kname, "q", q, [t, H, hd], pl.BF16)
    eps = cfg.rms_norm_eps
    cap = token_capacity(cfg)
    t_pad = round_up(t, MATMUL_M_TILE)
    MT, TT = tl.m_tile, token_tile(t, tl.t_tile)

    # ---- GM scratch (allocated at scope entry, before any task) ----
    if seed_scopes:
        check_seed_capacity(kname, "qr_fp32", t_pad, t, cap)
        qr_fp32 = pl.create_tensor([cap, Lq], pl.FP32, name="qr_fp32")
        qr_i8_matmul = pl.create_tensor([cap, Lq], act_dtype(cfg), name="qr_i8_matmul")
        q_proj_i32 = pl.create_tensor([cap, qd], pl.FP32 if bf16 else pl.INT32, name="q_proj_i32")
        kv_fp32 = pl.create_tensor([cap, hd], pl.FP32, name="kv_fp32")
    else:
        qr_fp32 = pl.create_tensor([t_pad, Lq], pl.FP32, init_value=0, capacity=cap, name="qr_fp32")
        qr_i8_matmul = pl.create_tensor([t_pad, Lq], act_dtype(cfg), capacity=cap, name="qr_i8_matmul")
        q_proj_i32 = pl.create_tensor([t_pad, qd], pl.FP32 if bf16 else pl.INT32, capacity=cap, name="q_proj_i32")
        kv_fp32 = pl.create_tensor([t_pad, hd], pl.FP32, init_value=0, capacity=cap, name="kv_fp32")
    q_rope_cos_il = pl.create_tensor([t, r], pl.FP32, capacity=cap, name="q_rope_cos_il")
    q_rope_sin_signed = pl.create_tensor([t, r], pl.FP32, capacity=cap, name="q_rope_sin_signed")
    q_rope_swap_idx = pl.create_tensor([t, r], pl.INT32, capacity=cap, name="q_rope_swap_idx")

    gamma_cq_row = pl.reshape(gamma_cq, [1, Lq])
    gamma_ckv_row = pl.reshape(gamma_ckv, [1, hd])
    wq_b_scale_row = pl.reshape(wq_b_scale, [1, qd])

    # 1. head-invariant rope tables: cos_il[j] = cos[j>>1], sin_signed[j] = +-sin[j>>1], swap[j] = j^1
    for b in pl.spmd(-(-t // TT), name_hint="q_rope_prepare", allow_early_resolve=True):
        t0 = b * TT
        rows = min(TT, t - t0)
        j = pl.arange(0, [1, r], pl.INT32)
        half = j / 2  # j >> 1 (j >= 0: the truncated quotient)
        pm = (j - half * 2) * 2 - 1  # 2 * (j & 1) - 1: -1 on even lanes, +1 on odd lanes
        swap = j - pm  # j ^ 1
        sign = pl.cast(pm, pl.FP32, mode="none")
        cos = pl.cast(pl.slice(rope_cos, [TT, r], [t0, 0], valid_shape=[rows, r]), pl.FP32, mode="none")
        sin = pl.cast(pl.slice(rope_sin, [TT, r], [t0, 0], valid_shape=[rows, r]), pl.FP32, mode="none")
        pl.assemble(q_rope_cos_il, pl.set_validshape(pl.gather(cos, index=half), rows, r), [t0, 0])
        sin_signed = pl.col_expand_mul(pl.gather(sin, index=half), sign)
        pl.assemble(q_rope_sin_signed, pl.set_validshape(sin_signed, rows, r), [t0, 0])
        swap_rows = pl.col_expand(pl.full([TT, r], pl.INT32, 0), swap)
        pl.assemble(q_rope_swap_idx, pl.set_validshape(swap_rows, rows, r), [t0, 0])

    # 2. qr_fp32 += x[:, K-half] @ wq_a[K-half, N-group]  (split-K, atomic add)
    if seed_scopes:
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="qr_proj_seed", allow_early_resolve=True):
            qr_fp32[0:t_pad, 0:Lq] = pl.full([t_pad, Lq], pl.FP32, 0.0)
    n_qr = Lq // tl.qr_n
    for b in pl.spmd(n_qr * QR_OK, name_hint="qr_proj_matmul", allow_early_resolve=True):
        _split_k_matmul(x, wq_a, qr_fp32, t, t_pad, MT, (b % QR_OK) * tl.qr_k, tl.qr_k, tl.qr_steps,
                        (b // QR_OK) * tl.qr_n, tl.qr_n)

    # 3. RMSNorm(gamma_cq) + per-row INT8 quantisation of the q-LoRA latent
    for b in pl.spmd(-(-t // TT), name_hint="qr_rms_norm_quant", allow_early_resolve=True):
        t0 = b * TT
        rows = min(TT, t - t0)
        a = pl.slice(qr_fp32, [TT, Lq], [t0, 0], valid_shape=[rows, Lq])
        inv = pl.rsqrt(pl.row_sum(a * a) / float(Lq) + eps, high_precision=True)
        g = pl.cast(gamma_cq_row[0:1, 0:Lq], pl.FP32, mode="none")
        y = pl.col_expand_mul(pl.row_expand_mul(a, inv), g)
        if bf16:  # unquantised: the latent in BF16, unit scale
            code = pl.set_validshape(pl.cast(y, pl.BF16, mode="rint"), rows, Lq)
            dq = pl.full([rows, 1], pl.FP32, 1.0)
        else:
            code, s = int8_quantize_rows(y)  # [TT, Lq] INT8, [TT, 1] FP32
            code = pl.set_validshape(code, rows, Lq)
            dq = pl.set_validshape(pl.recip(s), rows, 1)
        pl.assemble(qr, code, [t0, 0])
        pl.assemble(qr_i8_matmul, code, [t0, 0])
        pl.assemble(qr_scale, dq, [t0, 0])

    # 4. q_proj_i32 = qr_i8 @ wq_b  (INT8 x INT8 -> exact INT32)
    PN, PPT = tl.qp_n, tl.qp_per_task
    for b in pl.spmd(qd // PN // PPT, name_hint="qproj_matmul", allow_early_resolve=True):
        for j in pl.range(PPT):
            n0 = (b * PPT + j) * PN
            for m0 in pl.range(0, t_pad, MT):
                m = min(MT, t_pad - m0)
                a8 = pl.slice(qr_i8_matmul, [m, Lq], [m0, 0], valid_shape=[min(m, t - m0), Lq])
                wt = pl.slice(wq_b, [Lq, PN], [0, n0])
                pl.assemble(q_proj_i32, pl.matmul(a8, wt) if bf16 else pl.matmul(a8, wt, out_dtype=pl.INT32),
                            [m0, n0])

    # 5. dequant, per-head RMSNorm (no weight), RoPE on the last r channels, BF16; all t token rows at
    #    once (every op is per element or per (token, head) row)
    QH = tl.qd_heads
    for b in pl.spmd(H // QH, name_hint="qproj_dequant_rms_nope_rope", allow_early_resolve=True):
        h0 = b * QH
        c0, w = h0 * hd, QH * hd
        if t > 0:
            acc = q_proj_i32[0:t, c0:c0 + w]
            if bf16:  # FP32 product, no scale
                dq = pl.reshape(acc, [t * QH, hd])
            else:
                acc = pl.cast(acc, pl.FP32, mode="none")
                dq = pl.reshape(pl.col_expand_mul(pl.row_expand_mul(acc, qr_scale[0:t, 0:1]),
                                                  wq_b_scale_row[0:1, c0:c0 + w]), [t * QH, hd])
            inv = pl.rsqrt(pl.row_sum(dq * dq) / float(hd) + eps, high_precision=True)
            y = pl.reshape(pl.row_expand_mul(dq, inv), [t, QH, hd])
            out = pl.cast(y, pl.BF16, mode="rint")
            # every head's rope channels at once: rows (token, head) of [t*QH, r], the token's cos / sin
            # rows repeated per head (each element sees the same ops as per head); the swap index j^1
            # is the same in every row (one row, broadcast by the gather)
            cos, sin = (pl.reshape(pl.concat([tab[0:t, 0:r]] * QH), [t * QH, r])
                        for tab in (q_rope_cos_il, q_rope_sin_signed))
            yr = pl.reshape(pl.slice(y, [t, QH, r], [0, 0, n]), [t * QH, r])
            rot = pl.cast(rotate_interleaved(yr, cos, sin, q_rope_swap_idx[0:1, 0:r]), pl.BF16, mode="rint")
            out = pl.assemble(out, pl.reshape(rot, [t, QH, r]), [0, 0, n])
            # the rows' QH heads in one strided store (one footprint box per token row)
            pl.assemble(q, out, [0, h0, 0])

    # 6. kv_fp32 += x[:, K-quarter] @ wkv[K-quarter, N-group]  (split-K, atomic add), gated by late_dep
    if seed_scopes:
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="kv_proj_seed", allow_early_resolve=True):
            kv_fp32[0:t_pad, 0:hd] = pl.full([t_pad, hd], pl.FP32, 0.0)
    n_kv = hd // tl.kv_n
    for b in pl.spmd(n_kv * KV_OK, name_hint="kv_proj_matmul", deps=[late_dep], allow_early_resolve=True):
        _split_k_matmul(x, wkv, kv_fp32, t, t_pad, MT, (b % KV_OK) * tl.kv_k, tl.kv_k, tl.kv_steps,
                        (b // KV_OK) * tl.kv_n, tl.kv_n)

    # 7. kv = RMSNorm(gamma_ckv), RoPE on the last r channels (after gamma), BF16
    for b in pl.spmd(-(-t // TT), name_hint="kv_rms_norm_rope", allow_early_resolve=True):
        t0 = b * TT
        rows = min(TT, t - t0)
        a = pl.slice(kv_fp32, [TT, hd], [t0, 0], valid_shape=[rows, hd])
        inv = pl.rsqrt(pl.row_sum(a * a) / float(hd) + eps, high_precision=True)
        g = pl.cast(gamma_ckv_row[0:1, 0:hd], pl.FP32, mode="none")
        y = pl.col_expand_mul(pl.row_expand_mul(a, inv), g)
        cos, sin, swap = _rope_tiles(q_rope_cos_il, q_rope_sin_signed, q_rope_swap_idx, t0, TT, rows, r)
        rot = pl.cast(rotate_interleaved(pl.slice(y, [TT, r], [0, n]), cos, sin, swap), pl.BF16, mode="rint")
        out = pl.assemble(pl.cast(y, pl.BF16, mode="rint"), rot, [0, n])
        pl.assemble(kv, pl.set_validshape(out, rows, hd), [t0, 0])
    return q, kv, qr, qr_scale


@pl.jit.inline
def materialize_rope_rows(
    freqs_cos: pl.Tensor[[P_DYN, R_DYN], pl.BF16],
    freqs_sin: pl.Tensor[[P_DYN, R_DYN], pl.BF16],
    position_ids: pl.Tensor[[T_DYN], pl.INT32],
    num_tokens: pl.Scalar[pl.INT32],
    rope_cos_t: pl.Out[pl.Tensor[[T_DYN, R_DYN], pl.BF16]],
    rope_sin_t: pl.Out[pl.Tensor[[T_DYN, R_DYN], pl.BF16]],
):
    """Per-token RoPE rows for prefill (pypto-lib `models/deepseek/v4-flash/qkv_proj_rope.py` ``materialize_rope_rows``).

    Stable inline signature:
    ``materialize_rope_rows(freqs_cos, freqs_sin, position_ids, num_tokens, rope_cos_t,
    rope_sin_t) -> task id``.

    One task ``qkv_rope_rows`` of ``ceil(T/8)`` blocks: for every row ``t < num_tokens``
    (clamped into ``[0, T]``) copy table row ``position_ids[t]`` of ``freqs_cos`` /
    ``freqs_sin`` into row ``t`` of ``rope_cos_t`` / ``rope_sin_t``; rows ``>= num_tokens``
    are not touched (they keep the caller's values).

    Args:
        freqs_cos, freqs_sin: ``[P, rope_dim]`` BF16 full tables (``rope.rope_tables``).
        position_ids: ``[T]`` INT32 absolute positions, each in ``[0, P)`` for active rows.
        num_tokens: active prefix length (INT32 scalar).
        rope_cos_t, rope_sin_t: ``[T, rope_dim]`` BF16 outputs.

    Returns:
        The task id of ``qkv_rope_rows``.

    Raises:
        DslError: an active position outside ``[0, P)`` (a table window out of bounds).
        UndefinedValueError: (check mode) an undefined position used as a row index.
    """
    t = pl.tensor.dim(position_ids, 0)
    r = pl.tensor.dim(freqs_cos, 1)
    active = pl.min(pl.max(num_tokens, 0), t)
    RT = ROPE_ROWS_T_TILE
    task = pl.spmd(-(-t // RT), name_hint="qkv_rope_rows", allow_early_resolve=True)
    for b in task:
        t0 = b * RT
        rows = min(RT, active - t0)
        if rows > 0:
            pos = pl.read_values(pl.slice(position_ids, [RT], [t0], valid_shape=[rows]), [0], rows)
            # the rows' table rows in one row gather each (the union of the one-row loads), one store each
            rope_cos_t[t0:t0 + rows, 0:r] = pl.gather_rows(freqs_cos, pos)
            rope_sin_t[t0:t0 + rows, 0:r] = pl.gather_rows(freqs_sin, pos)
    return task.tid


@functools.lru_cache(maxsize=None)
def qkv_proj_rope_entry(cfg: DeepSeekV4Config, seed_scopes: bool = False):
    """The ``@pl.jit`` test entry ``qkv_proj_rope_test(x, wq_a, wq_b, wq_b_scale, wkv,
    rope_cos, rope_sin, gamma_cq, gamma_ckv, q, kv, qr, qr_scale)`` for ``cfg`` (static dims
    from the config, ``T`` dynamic; shapes as :func:`qkv_proj_rope`). Like the reference
    test entry it passes ``late_dep = pl.system.task_dummy(deps=[])`` (no gate).

    Raises:
        ConfigError: ``cfg`` cannot be tiled.
    """
    tl = qkv_proj_rope_tiling(cfg)
    D, Lq, H, hd, r, qd = tl.d, tl.lq, tl.h, tl.hd, tl.r, tl.qd
    WD, AD = weight_dtype(cfg), act_dtype(cfg)

    @pl.jit
    def qkv_proj_rope_test(
        x: pl.Tensor[[T_DYN, D], pl.BF16],
        wq_a: pl.Tensor[[D, Lq], pl.BF16],
        wq_b: pl.Tensor[[Lq, qd], WD],
        wq_b_scale: pl.Tensor[[qd], pl.FP32],
        wkv: pl.Tensor[[D, hd], pl.BF16],
        rope_cos: pl.Tensor[[T_DYN, r], pl.BF16],
        rope_sin: pl.Tensor[[T_DYN, r], pl.BF16],
        gamma_cq: pl.Tensor[[Lq], pl.BF16],
        gamma_ckv: pl.Tensor[[hd], pl.BF16],
        q: pl.Out[pl.Tensor[[T_DYN, H, hd], pl.BF16]],
        kv: pl.Out[pl.Tensor[[T_DYN, hd], pl.BF16]],
        qr: pl.Out[pl.Tensor[[T_DYN, Lq], AD]],
        qr_scale: pl.Out[pl.Tensor[[T_DYN, 1], pl.FP32]],
    ):
        late_dep = pl.system.task_dummy(deps=[])
        return qkv_proj_rope(x, wq_a, wq_b, wq_b_scale, wkv, rope_cos, rope_sin, gamma_cq, gamma_ckv,
                             q, kv, qr, qr_scale, late_dep, cfg, seed_scopes)

    return qkv_proj_rope_test


@functools.lru_cache(maxsize=None)
def materialize_rope_rows_entry(cfg: DeepSeekV4Config):
    """The ``@pl.jit`` test entry ``materialize_rope_rows_test(freqs_cos [P, r], freqs_sin
    [P, r], position_ids [T] INT32, num_tokens INT32, rope_cos_t PartialOut [T, r], rope_sin_t
    PartialOut [T, r])`` with ``P = cfg.max_position_embeddings``, ``r = cfg.qk_rope_head_dim``."""
    P, r = cfg.max_position_embeddings, cfg.qk_rope_head_dim

    @pl.jit
    def materialize_rope_rows_test(
        freqs_cos: pl.Tensor[[P, r], pl.BF16],
        freqs_sin: pl.Tensor[[P, r], pl.BF16],
        position_ids: pl.Tensor[[T_DYN], pl.INT32],
        num_tokens: pl.Scalar[pl.INT32],
        rope_cos_t: pl.PartialOut[pl.Tensor[[T_DYN, r], pl.BF16]],  # rows >= num_tokens left alone
        rope_sin_t: pl.PartialOut[pl.Tensor[[T_DYN, r], pl.BF16]],
    ):
        materialize_rope_rows(freqs_cos, freqs_sin, position_ids, num_tokens, rope_cos_t, rope_sin_t)
        return rope_cos_t, rope_sin_t

    return materialize_rope_rows_test
# ---- end kernel ----


def _check(fn: str, name: str, t: torch.Tensor, shape: tuple[int, ...], kind: str) -> None:
    """Raise BindError unless ``t`` has ``shape`` and dtype kind ``float``/``int8``."""
    ok_dtype = t.is_floating_point() if kind == "float" else t.dtype == torch.int8
    if tuple(t.shape) != tuple(shape) or not ok_dtype:
        article = "an" if kind == "int8" else "a"
        raise BindError(f"{fn}: {name} must be {article} {kind} tensor of shape {list(shape)}, "
                        f"got {t.dtype} {list(t.shape)}")


def quantize_per_row_int8(
    x: torch.Tensor,  # [..., K] float
) -> tuple[torch.Tensor, torch.Tensor]:  # ([..., K] int8, [..., 1] fp32)
    """Symmetric per-row INT8 activation quantisation (pypto-lib `models/deepseek/v4-flash/` INT8 conventions, W8A8).

    Per row (last axis): ``amax = max(max|x|, 1e-4)``, ``s = 127 / amax`` (one IEEE division),
    ``q = int8(fp16(rint(x * s)))`` (round-half-even to an integer, through FP16 -- exact
    for |v| <= 127 -- then truncation to INT8, as the kernel's rint/round/trunc cast chain),
    and the dequant scale is ``1 / s`` (so ``x ~= q * scale``; about ``amax / 127``).
    All arithmetic in FP32.

    Args:
        x: ``[..., K]`` float rows (any float dtype; computed in FP32).

    Returns:
        ``(q, scale)``: ``q [..., K]`` INT8 in [-127, 127]; ``scale [..., 1]`` FP32, finite
        and positive even for an all-zero row (then ``q`` is all zero).

    Raises:
        BindError: ``x`` is not a float tensor of rank >= 1.
    """
    if x.dim() < 1 or not x.is_floating_point():
        raise BindError(f"quantize_per_row_int8: x must be a float tensor of rank >= 1, "
                        f"got {x.dtype} {list(x.shape)}")
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True).clamp_min(INT8_AMAX_EPS)
    # one IEEE division like the kernel's pl.div (torch's ``127 / amax`` is 127 * (1/amax): two roundings)
    s = torch.full_like(amax, INT8_SCALE_MAX) / amax
    q = torch.round(xf * s).to(torch.int32).to(torch.float16).to(torch.int8)
    return q, torch.reciprocal(s)


def quantize_weight_per_column(
    w: torch.Tensor,  # [K, N] float (input dim K, output dim N)
) -> tuple[torch.Tensor, torch.Tensor]:  # ([K, N] int8, [N] fp32)
    """Symmetric per-output-column INT8 weight quantisation (pypto-lib `models/deepseek/v4-flash/` INT8 conventions).

    Per column ``n``: ``scale[n] = max(max_k |w[k, n]|, 1e-4) / 127``,
    ``q[k, n] = clamp(round_half_even(w[k, n] / scale[n]), -127, 127)``. FP32 arithmetic.

    Args:
        w: ``[K, N]`` float weight in ``x @ w`` layout (columns are output channels).

    Returns:
        ``(w_int8 [K, N] int8, scale [N] fp32)`` with ``w ~= w_int8 * scale``.

    Raises:
        BindError: ``w`` is not a float rank-2 tensor.
    """
    if w.dim() != 2 or not w.is_floating_point():
        raise BindError(f"quantize_weight_per_column: w must be a float [K, N] tensor, "
                        f"got {w.dtype} {list(w.shape)}")
    wf = w.float()
    scale = wf.abs().amax(dim=0).clamp_min(INT8_AMAX_EPS) / INT8_SCALE_MAX
    q = torch.round(wf / scale).clamp(-INT8_SCALE_MAX, INT8_SCALE_MAX).to(torch.int8)
    return q, scale


def rope_interleaved(
    x: torch.Tensor,  # [T, ..., r] float
    cos: torch.Tensor,  # [T, r] (full-width duplicated) or [T, r/2] float
    sin: torch.Tensor,  # same shape as cos
    inverse: bool = False,
) -> torch.Tensor:  # [T, ..., r], dtype of x
    """Interleaved RoPE on the last axis (transformers `models/deepseek_v4/modeling_deepseek_v4.py`; pypto-lib `models/deepseek/v4-flash/rope_tables.py`).

    Pair ``i`` = channels ``(2i, 2i+1)`` rotates by frequency ``i``:
    ``y[2i] = x[2i]*c_i - x[2i+1]*s_i``, ``y[2i+1] = x[2i]*s_i + x[2i+1]*c_i`` with
    ``c_i = cos[t, i]``, ``s_i = sin[t, i]``. ``inverse=True`` negates the sine (the
    rotation by minus the angle, used on the attention output before o-proj).

    Table convention: a full-width ``[T, r]`` table is read from its first ``r/2``
    columns only (its second half duplicates the first); a ``[T, r/2]`` table is used as
    is. Tables broadcast over any middle axes of ``x`` (e.g. heads). Computed in FP32 (or
    wider if ``x`` is FP64) and returned in ``x.dtype``.

    Args:
        x: ``[T, ..., r]`` float, ``r`` even.
        cos: ``[T, r]`` or ``[T, r/2]`` float per-token cosines.
        sin: like ``cos``.
        inverse: rotate by the negative angle.

    Returns:
        ``[T, ..., r]`` rotated tensor, ``x.dtype``.

    Raises:
        BindError: odd ``r``, tables of another shape, or non-float inputs.
    """
    fn = "rope_interleaved"
    if x.dim() < 2 or x.shape[-1] % 2 or not x.is_floating_point():
        raise BindError(f"{fn}: x must be a float [T, ..., r] tensor with even r, "
                        f"got {x.dtype} {list(x.shape)}")
    T, r = x.shape[0], x.shape[-1]
    for name, tab in (("cos", cos), ("sin", sin)):
        if tab.dim() != 2 or tab.shape[0] != T or tab.shape[1] not in (r, r // 2) \
                or not tab.is_floating_point():
            raise BindError(f"{fn}: {name} must be a float [T={T}, {r}] or [T={T}, {r // 2}] "
                            f"table, got {tab.dtype} {list(tab.shape)}")
    if cos.shape != sin.shape:
        raise BindError(f"{fn}: cos {list(cos.shape)} and sin {list(sin.shape)} differ in shape")
    work = torch.promote_types(x.dtype, torch.float32)
    view = (T,) + (1,) * (x.dim() - 2) + (r // 2,)
    c = cos[:, : r // 2].to(work).reshape(view)
    s = sin[:, : r // 2].to(work).reshape(view)
    if inverse:
        s = -s
    xw = x.to(work)
    even, odd = xw[..., 0::2], xw[..., 1::2]
    y = torch.empty_like(xw)
    y[..., 0::2] = even * c - odd * s
    y[..., 1::2] = even * s + odd * c
    return y.to(x.dtype)


def _rms_normalize(t: torch.Tensor, eps: float) -> torch.Tensor:
    """``t * rsqrt(mean(t^2, -1) + eps)`` in FP32 (no weight)."""
    return t * torch.rsqrt(t.square().mean(dim=-1, keepdim=True) + eps)


def golden_qkv_proj_rope(
    x: torch.Tensor,  # [T, D] bf16 (already RMS-normed)
    wq_a: torch.Tensor,  # [D, q_lora] bf16
    wq_b: torch.Tensor,  # [q_lora, H*head_dim] int8 ("int8") | float ("bf16")
    wq_b_scale: torch.Tensor | None,  # [H*head_dim] fp32 ("int8"); ignored for "bf16"
    wkv: torch.Tensor,  # [D, head_dim] bf16
    rope_cos: torch.Tensor,  # [T, rope_dim] bf16, per-token full-width duplicated rows
    rope_sin: torch.Tensor,  # [T, rope_dim] bf16
    gamma_cq: torch.Tensor,  # [q_lora] bf16
    gamma_ckv: torch.Tensor,  # [head_dim] bf16
    cfg: DeepSeekV4Config,
    *,
    weight_format: str = "int8",
    out_bf16: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q/KV LoRA projections + RMSNorm + RoPE golden (pypto-lib `models/deepseek/v4-flash/qkv_proj_rope.py`).

    Numerics (FP32 throughout, inputs used at their given precision, not re-rounded):

    1. ``qr_f = (qr * rsqrt(mean(qr^2) + eps)) * gamma_cq`` with ``qr = x @ wq_a``.
    2. ``weight_format="int8"``: ``qr, qr_scale = quantize_per_row_int8(qr_f)``;
       ``acc = qr @ wq_b`` exactly in integers (computed in FP64, exact for
       ``q_lora * 127^2 < 2^53``, returned as INT32);
       ``q = (float(acc) * qr_scale) * wq_b_scale``.
       ``weight_format="bf16"``: no quantisation at all -- ``q = qr_f @ wq_b`` with the
       float ``wq_b`` (``wq_b_scale`` ignored, may be None); the ``qr`` output is then the
       FP32 normalised latent ``qr_f`` and ``qr_scale`` is all ones, so parity with an
       unquantised model is exact up to float rounding. With ``out_bf16`` (the bf16 kernels'
       numerics) ``qr_f`` is first rounded to BF16: ``q = bf16(qr_f) @ wq_b``, ``qr`` BF16.
    3. Per head: ``q_h = q_h * rsqrt(mean(q_h^2) + eps)`` (unweighted), then interleaved
       RoPE on the trailing ``qk_rope_head_dim`` channels.
    4. ``kv = ((x @ wkv) * rsqrt(mean(.^2) + eps)) * gamma_ckv``, RoPE on its trailing
       ``qk_rope_head_dim`` channels (after gamma).
    5. ``q`` and ``kv`` cast to BF16 (RNE) when ``out_bf16``, else kept FP32.

    ``eps = cfg.rms_norm_eps``. RoPE tables follow the module-docstring convention:
    pair ``i`` uses column ``i`` of ``rope_cos`` / ``rope_sin``.

    Args:
        x: ``[T, D]`` attention-normed activations, BF16 (FP32 allowed for parity runs).
        wq_a: ``[D, q_lora]`` BF16 (float) q-LoRA down projection.
        wq_b: ``[q_lora, H*head_dim]`` INT8 per-output-column codes ("int8"), or a float
            weight ("bf16").
        wq_b_scale: ``[H*head_dim]`` FP32 dequant scale per output column ("int8").
        wkv: ``[D, head_dim]`` BF16 (float) kv projection.
        rope_cos: ``[T, rope_dim]`` per-token cosine rows (first half read).
        rope_sin: ``[T, rope_dim]`` per-token sine rows (first half read).
        gamma_cq: ``[q_lora]`` q-LoRA norm weight.
        gamma_ckv: ``[head_dim]`` kv norm weight.
        cfg: model config (``hidden_size``, ``q_lora_rank``, ``num_attention_heads``,
            ``head_dim``, ``qk_rope_head_dim``, ``rms_norm_eps``).
        weight_format: ``"int8"`` (W8A8 on the q "b" projection) or ``"bf16"``.
        out_bf16: BF16 ``q`` / ``kv`` outputs; ``False`` keeps them FP32.

    Returns:
        ``(q, kv, qr, qr_scale)``: ``q [T, H, head_dim]`` BF16 (FP32), ``kv [T, head_dim]``
        BF16 (FP32), ``qr [T, q_lora]`` INT8 codes ("int8") or FP32 latent ("bf16"),
        ``qr_scale [T, 1]`` FP32 (``1/s``; ones for "bf16"). ``out_bf16`` does not change
        ``qr`` / ``qr_scale``.

    Raises:
        BindError: unknown ``weight_format``, or an argument of the wrong shape/dtype.
    """
    fn = "golden_qkv_proj_rope"
    if weight_format not in ("int8", "bf16"):
        raise BindError(f"{fn}: weight_format must be 'int8' or 'bf16', got {weight_format!r}")
    D, Lq, H, hd, r = (cfg.hidden_size, cfg.q_lora_rank, cfg.num_attention_heads,
                       cfg.head_dim, cfg.qk_rope_head_dim)
    n = cfg.nope_head_dim
    if x.dim() != 2:
        raise BindError(f"{fn}: x must be [T, {D}], got {list(x.shape)}")
    T = x.shape[0]
    _check(fn, "x", x, (T, D), "float")
    _check(fn, "wq_a", wq_a, (D, Lq), "float")
    if weight_format == "int8":
        _check(fn, "wq_b", wq_b, (Lq, H * hd), "int8")
        if wq_b_scale is None:
            raise BindError(f"{fn}: wq_b_scale [{H * hd}] is required for weight_format='int8'")
        _check(fn, "wq_b_scale", wq_b_scale, (H * hd,), "float")
    else:
        _check(fn, "wq_b", wq_b, (Lq, H * hd), "float")
    _check(fn, "wkv", wkv, (D, hd), "float")
    _check(fn, "rope_cos", rope_cos, (T, r), "float")
    _check(fn, "rope_sin", rope_sin, (T, r), "float")
    _check(fn, "gamma_cq", gamma_cq, (Lq,), "float")
    _check(fn, "gamma_ckv", gamma_ckv, (hd,), "float")

    eps = cfg.rms_norm_eps
    xf = x.float()
    qr_f = _rms_normalize(xf @ wq_a.float(), eps) * gamma_cq.float()  # [T, Lq]
    if weight_format == "int8":
        qr, qr_scale = quantize_per_row_int8(qr_f)
        acc = (qr.double() @ wq_b.double()).to(torch.int32)  # exact integer sums
        q = (acc.float() * qr_scale) * wq_b_scale.float()
    else:
        qr, qr_scale = (qr_f.to(torch.bfloat16) if out_bf16 else qr_f), torch.ones(T, 1, dtype=torch.float32)
        q = qr.float() @ wq_b.float()
    q = _rms_normalize(q.reshape(T, H, hd), eps)
    q = torch.cat([q[..., :n], rope_interleaved(q[..., n:], rope_cos, rope_sin)], dim=-1)

    kv = _rms_normalize(xf @ wkv.float(), eps) * gamma_ckv.float()  # [T, hd]
    kv = torch.cat([kv[:, :n], rope_interleaved(kv[:, n:], rope_cos, rope_sin)], dim=-1)
    if out_bf16:
        q, kv = q.to(torch.bfloat16), kv.to(torch.bfloat16)
    return q, kv, qr, qr_scale


def golden_qr_split_k(
    x: torch.Tensor,  # [T, D] bf16
    wq_a: torch.Tensor,  # [D, q_lora] bf16
    gamma_cq: torch.Tensor,  # [q_lora] bf16
    cfg: DeepSeekV4Config,
    weight_format: str = "int8",
) -> tuple[torch.Tensor, torch.Tensor]:  # ([T, q_lora] int8 | bf16, [T, 1] fp32)
    """Target-order golden of ``qr`` / ``qr_scale`` (``weight_format="bf16"``: the BF16 latent
    and ones instead of the INT8 codes and scales): emulates ``qr_proj_matmul`` and
    ``qr_rms_norm_quant`` of :func:`qkv_proj_rope` for bit-level comparison (the plain math is
    :func:`golden_qkv_proj_rope`, one FP32 matmul).

    ``qr_fp32`` is summed as the kernel sums it: per N tile of ``qr_n`` columns, ``QR_OK``
    K-slices added in block order onto zero, each slice the sum of its ``qr_steps`` FP32 matmul
    steps over row tiles of ``m_tile`` of the zero-padded ``[round_up(T, 16), D]`` rows; then
    ``y = (a * rsqrt(sum(a*a) / q_lora + eps)) * gamma_cq`` and :func:`quantize_per_row_int8`.

    Raises:
        ConfigError: ``cfg`` cannot be tiled. BindError: shapes that do not match ``cfg``.
    """
    tl = qkv_proj_rope_tiling(cfg)
    T = x.shape[0] if x.dim() == 2 else -1
    _check("golden_qr_split_k", "x", x, (T, tl.d), "float")
    _check("golden_qr_split_k", "wq_a", wq_a, (tl.d, tl.lq), "float")
    _check("golden_qr_split_k", "gamma_cq", gamma_cq, (tl.lq,), "float")
    t_pad = round_up(T, MATMUL_M_TILE)
    xp = torch.zeros(t_pad, tl.d, dtype=torch.float32)
    xp[:T] = x.float()
    w = wq_a.float()
    acc = torch.zeros(t_pad, tl.lq, dtype=torch.float32)
    kt = tl.qr_k // tl.qr_steps
    for n0 in range(0, tl.lq, tl.qr_n):
        for k0 in range(0, tl.d, tl.qr_k):  # K-slices in block order (atomic adds)
            for m0 in range(0, t_pad, tl.m_tile):
                m1 = min(m0 + tl.m_tile, t_pad)
                part = None
                for k in range(k0, k0 + tl.qr_k, kt):
                    step = xp[m0:m1, k:k + kt] @ w[k:k + kt, n0:n0 + tl.qr_n]
                    part = step if part is None else part + step
                acc[m0:m1, n0:n0 + tl.qr_n] += part
    a = acc[:T]
    inv = torch.rsqrt((a * a).sum(dim=-1, keepdim=True) / float(tl.lq) + cfg.rms_norm_eps)
    if weight_format == "bf16":
        return ((a * inv) * gamma_cq.float()).to(torch.bfloat16), torch.ones(T, 1)
    return quantize_per_row_int8((a * inv) * gamma_cq.float())


def make_qkv_inputs(
    cfg: DeepSeekV4Config, T: int, seed: int, *, weight_format: str = "int8",
) -> dict[str, torch.Tensor]:
    """Seeded fixture for :func:`golden_qkv_proj_rope` (pypto-lib `models/deepseek/v4-flash/qkv_proj_rope.py` test data).

    Drawn from one ``torch.Generator`` seeded with ``seed``, in this order: ``x``,
    ``wq_a``, ``wq_b`` (float), ``wkv``, ``cos``, ``sin``, ``gamma_cq``, ``gamma_ckv``.
    ``x``, cos, sin and the gammas are uniform(-1, 1); weights uniform(-0.1, 0.1).
    Everything is rounded to BF16 except ``wq_b``, which for ``"int8"`` is quantised per
    output column from its FP32 draw (:func:`quantize_weight_per_column`), and for
    ``"bf16"`` is the BF16-rounded draw with ``wq_b_scale`` all ones (ignored by the
    golden). cos/sin are drawn ``[T, rope_dim/2]`` and duplicated to the full-width
    ``[T, rope_dim]`` layout (second half = first half); they are random numbers, not
    angles, like the reference fixture.

    Args:
        cfg: model config.
        T: number of tokens (> 0).
        seed: generator seed.
        weight_format: ``"int8"`` or ``"bf16"``, as for the golden.

    Returns:
        ``{"x": [T, D] bf16, "wq_a": [D, q_lora] bf16, "wq_b": [q_lora, H*head_dim] int8|bf16,
        "wq_b_scale": [H*head_dim] fp32, "wkv": [D, head_dim] bf16, "rope_cos": [T, rope_dim]
        bf16, "rope_sin": [T, rope_dim] bf16, "gamma_cq": [q_lora] bf16,
        "gamma_ckv": [head_dim] bf16}``.

    Raises:
        BindError: ``T`` not positive or unknown ``weight_format``.
    """
    if T <= 0:
        raise BindError(f"make_qkv_inputs: T must be positive, got {T}")
    if weight_format not in ("int8", "bf16"):
        raise BindError(f"make_qkv_inputs: weight_format must be 'int8' or 'bf16', got {weight_format!r}")
    D, Lq, hd, r = cfg.hidden_size, cfg.q_lora_rank, cfg.head_dim, cfg.qk_rope_head_dim
    qd = cfg.q_dim
    gen = torch.Generator().manual_seed(seed)

    def uniform(*shape: int, bound: float) -> torch.Tensor:
        return (torch.rand(*shape, generator=gen) * 2.0 - 1.0) * bound

    bf16 = torch.bfloat16
    x = uniform(T, D, bound=1.0)
    wq_a = uniform(D, Lq, bound=0.1)
    wq_b_f = uniform(Lq, qd, bound=0.1)
    wkv = uniform(D, hd, bound=0.1)
    cos_half = uniform(T, r // 2, bound=1.0)
    sin_half = uniform(T, r // 2, bound=1.0)
    gamma_cq = uniform(Lq, bound=1.0)
    gamma_ckv = uniform(hd, bound=1.0)
    if weight_format == "int8":
        wq_b, wq_b_scale = quantize_weight_per_column(wq_b_f)
    else:
        wq_b, wq_b_scale = wq_b_f.to(bf16), torch.ones(qd, dtype=torch.float32)
    return {
        "x": x.to(bf16),
        "wq_a": wq_a.to(bf16),
        "wq_b": wq_b,
        "wq_b_scale": wq_b_scale,
        "wkv": wkv.to(bf16),
        "rope_cos": torch.cat([cos_half, cos_half], dim=-1).to(bf16),
        "rope_sin": torch.cat([sin_half, sin_half], dim=-1).to(bf16),
        "gamma_cq": gamma_cq.to(bf16),
        "gamma_ckv": gamma_ckv.to(bf16),
    }


# ---- registration ----
def build_qkv_proj_rope(preset: str = "tiny", mode: str = "prefill", *, T: int | None = None, seed: int = 0,
                        seed_scopes: bool = False, weight_format: str = "int8") -> CaseRun:
    """KernelCase builder: ``qkv_proj_rope`` at ``preset`` in ``mode`` (decode: 4x2 = 8
    tokens at flash, prefill: 128) or ``T`` tokens, inputs from :func:`make_qkv_inputs`
    (INT8 ``wq_b``; BF16 for ``weight_format="bf16"``, the unquantised kernel, same
    tolerances); ``seed_scopes=True`` selects the seed-task variant. ``q`` / ``kv``
    compare with :data:`TOLERANCES` against :func:`golden_qkv_proj_rope`; ``qr`` /
    ``qr_scale`` exactly against :func:`golden_qr_split_k` (the kernel's summation order).

    Raises:
        ConfigError: unknown preset / mode, bad ``T``, or a config the kernel cannot tile.
        CapacityError: ``T`` above the token capacity (before any input is built).
    """
    cfg, T = mode_tokens(preset, mode, T)
    cfg = with_weight_format(cfg, weight_format)
    check_token_capacity("qkv_proj_rope", cfg, T)  # before any input is built
    D, Lq, H, hd, r = cfg.hidden_size, cfg.q_lora_rank, cfg.num_attention_heads, cfg.head_dim, cfg.qk_rope_head_dim
    ins = make_qkv_inputs(cfg, T, seed, weight_format=weight_format)
    bf16, f32 = torch.bfloat16, torch.float32
    q8 = bf16 if weight_format == "bf16" else torch.int8
    specs = [
        TensorSpec("x", [T, D], bf16, init_value=ins["x"]),
        TensorSpec("wq_a", [D, Lq], bf16, init_value=ins["wq_a"]),
        TensorSpec("wq_b", [Lq, H * hd], q8, init_value=ins["wq_b"]),
        TensorSpec("wq_b_scale", [H * hd], f32, init_value=ins["wq_b_scale"]),
        TensorSpec("wkv", [D, hd], bf16, init_value=ins["wkv"]),
        TensorSpec("rope_cos", [T, r], bf16, init_value=ins["rope_cos"]),
        TensorSpec("rope_sin", [T, r], bf16, init_value=ins["rope_sin"]),
        TensorSpec("gamma_cq", [Lq], bf16, init_value=ins["gamma_cq"]),
        TensorSpec("gamma_ckv", [hd], bf16, init_value=ins["gamma_ckv"]),
        TensorSpec("q", [T, H, hd], bf16, is_output=True),
        TensorSpec("kv", [T, hd], bf16, is_output=True),
        TensorSpec("qr", [T, Lq], q8, is_output=True),
        TensorSpec("qr_scale", [T, 1], f32, is_output=True),
    ]

    def golden(v: dict) -> None:
        v["q"], v["kv"], v["qr"], v["qr_scale"] = golden_qkv_proj_rope(
            v["x"], v["wq_a"], v["wq_b"], v["wq_b_scale"], v["wkv"], v["rope_cos"], v["rope_sin"],
            v["gamma_cq"], v["gamma_ckv"], cfg, weight_format=weight_format)
        # qr / qr_scale from the split-K emulation: bit for bit what the kernel must produce
        v["qr"], v["qr_scale"] = golden_qr_split_k(v["x"], v["wq_a"], v["gamma_cq"], cfg, weight_format)

    compare = {k: ratio_allclose(*tol) for k, tol in TOLERANCES.items() if k in ("q", "kv")}
    compare.update(qr=exact(), qr_scale=exact())
    label = (f"{preset} {mode} T={T}" + (" seed_scopes" if seed_scopes else "")
             + (" weight_format=bf16" if weight_format == "bf16" else ""))
    return CaseRun(qkv_proj_rope_entry(cfg, bool(seed_scopes)), specs, golden, compare, rtol=5e-3, atol=5e-3,
                   label=label)


register(KernelCase("qkv_proj_rope", build_qkv_proj_rope, modes=("decode", "prefill"), seed_variant=True,
                    description="q/kv LoRA projections, INT8 q-b, RMSNorm, RoPE; init-0 split-K scratch (pypto-lib `qkv_proj_rope.py`)"))
