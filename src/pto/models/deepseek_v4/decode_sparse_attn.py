"""Decode sparse attention core with an attention sink, shared by the SWA, HCA and CSA layers.

Math (pypto-lib `models/deepseek/v4-flash/decode_sparse_attn_swa.py`, `decode_sparse_attn_hca.py`, `decode_sparse_attn.py`; transformers `models/deepseek_v4/modeling_deepseek_v4.py`), per decode token ``t`` of request
``b = t // S`` (``T = B * S``):

    keys_t  = [ori_kv rows swa_indices[t, :] >= 0]
              ++ [cmp_kv rows cmp_block_table[b, k // bs] * bs + k % bs, k = cmp_indices[t, :] >= 0]
    s_h,j   = (q[t, h] . k_j) * head_dim^-0.5                             # FP32
    o_h     = sum_j exp(s_h,j - m) k_j / (sum_j exp(s_h,j - m) + exp(sink_h - m))
    o[..., n:] = inverse_rope(o[..., n:], cos[t], sin[t])
    attn_out = grouped o-projection (prefill_sparse_attn.golden_grouped_o_proj)

One shared kv head (K = V, MQA). Key columns: the ``W`` window columns, then ``n_cmp``
compressed columns, padded to ``key_pad = round_up(W + n_cmp, key_tile)`` and processed as
``key_blocks`` tiles of ``key_tile`` rows with an online-softmax merge (BF16 probabilities in
the PV product, FP32 statistics). Variants by ``n_cmp``: SWA ``0`` (pypto-lib `decode_sparse_attn_swa.py`: one block at FLASH),
HCA :func:`decode_metadata.hca_cmp_cols` (pypto-lib `decode_sparse_attn_hca.py`: 128, two blocks at FLASH), CSA ``index_topk``
(pypto-lib `decode_sparse_attn.py`: 512, five blocks). A token with no valid key (an inactive row, every index ``-1``)
gets a zero row. ``swa_indices`` are physical flat rows of ``ori_kv``; ``cmp_indices`` are
logical compressed slots of the token's request, lowered through its table row.

Deviations from the reference: the inverse RoPE is fused into ``merge_norm`` (as pypto-lib `decode_sparse_attn_hca.py`; pypto-lib `decode_sparse_attn_swa.py`
has a separate ``rope_cs`` task: here the interleaved cos / signed sin rows are built in the
merge block); the gather runs one block per (token, key block) rather than per quarter
window; the bias is built from the indices (the test of pypto-lib's
`decode_sparse_attn_swa.py` builds it from ``swa_lens``); a
valid compressed slot whose page is missing raises ``BindError`` (the reference does not
check).
"""

import functools
from dataclasses import dataclass
from types import SimpleNamespace

import torch

import pto.language as pl
from pto.errors import BindError, ConfigError
from pto.golden import CaseRun, KernelCase, TensorSpec, ratio_allclose, register
from pto.models.deepseek_v4.config import DeepSeekV4Config, get_config
from pto.models.deepseek_v4.decode_metadata import (HCA_RATIO, decode_block_tables, golden_decode_cmp_indices,
                                                    hca_cmp_cols, make_decode_metadata)
from pto.models.deepseek_v4.prefill_sparse_attn import (BIAS_TOK_TILE, FP32_MAX, attn_key_tile, bias_block,
                                                        gather_key_block, golden_grouped_o_proj, key_block_stats,
                                                        merge_key_blocks, proj_b_act_task, quant_o_r_tile,
                                                        quantize_wo_b, rope_index_rows)
from pto.models.deepseek_v4.qkv_proj_rope import rope_interleaved
from pto.models.deepseek_v4.rope import rope_tables
from pto.models.deepseek_v4.weight_format import is_bf16, weight_dtype, with_weight_format
from pto.models.deepseek_v4.tiling import MATMUL_M_TILE, round_up, token_capacity

__all__ = [
    "DecodeAttnTiling",
    "decode_attn_tiling",
    "decode_sparse_attn_kernels",
    "decode_sparse_attn_swa",
    "decode_sparse_attn_hca",
    "decode_sparse_attn_csa",
    "CSA_START_POS",
    "grouped_o_proj_tasks",
    "golden_decode_attention_core",
    "golden_decode_sparse_attn",
    "make_decode_attn_inputs",
    "TOLERANCES",
    "DEFAULT_START_POS",
    "decode_case_options",
]

# pypto-lib `models/deepseek/v4-flash/decode_sparse_attn_swa.py`; pypto-lib `models/deepseek/v4-flash/decode_sparse_attn_hca.py`; the pypto-lib tests' tolerances: attn_out ratio_allclose(1e-4, 1/128), run rtol=atol=1e-3.
TOLERANCES: dict[str, tuple[float, float, float]] = {"attn_out": (1e-4, 1 / 128, 0.005)}

# Start positions of the registered decode fixtures, per preset (pypto-lib `decode_compressor_ratio128.py` / pypto-lib `decode_attention_hca.py` hca_decode_start_set
# at FLASH: long context, window boundary, first full window, second window boundary).
DEFAULT_START_POS = {"flash": (8192, 127, 128, 255), "tiny": (300, 127, 1, 0)}
# CSA fixtures: every visible entry must fit one request's share of the compressed pool
# (cmp_kv_block_num / B pages): 1024 entries at FLASH, 32 at tiny
CSA_START_POS = {"flash": (4090, 127, 6, 0), "tiny": (122, 60, 6, 0)}

# ---- kernel ----
PROJ_A_N_TILE_MAX = 128  # o_lora columns per proj_a_mm block (pypto-lib `decode_sparse_attn_swa.py`: 8 blocks of 128 per group)
PROJ_B_D_TILE_MAX = 512  # output columns per proj_b_mm block (pypto-lib `decode_sparse_attn_swa.py`: 8 blocks of 512)
QUANT_TOK_TILE = 16  # token rows per quant tile (T padded to 16 in pypto-lib `decode_sparse_attn_swa.py`)
ACT_COL_TILE_MAX = 512  # output columns per proj_b_act block
ACT_TOK_TILE = 16  # token rows per proj_b_act block
GATHER_ROWS = 32  # key rows per decode_gather_kv block (pypto-lib `decode_sparse_attn_swa.py` / `_hca.py`: 32)

T_DYN = pl.dynamic("T")
B_DYN = pl.dynamic("B")


@dataclass(frozen=True)
class DecodeAttnTiling:
    """Tile sizes of :func:`decode_sparse_attn_kernels` for one config and variant.

    Attributes:
        n_cmp: compressed key columns (0 SWA, 128 HCA, 512 CSA at FLASH).
        key_tile: key rows per online-softmax block (``attn_key_tile``: 128 FLASH, 64 tiny).
        swa_blocks: key blocks of the window (``sliding_window / key_tile``).
        key_pad: key columns per token, ``round_up(W + n_cmp, key_tile)``.
        proj_a_n_tile, proj_b_n_tile, act_col_tile: o-projection tiles.
    """

    n_cmp: int
    key_tile: int
    swa_blocks: int
    key_pad: int
    proj_a_n_tile: int
    proj_b_n_tile: int
    act_col_tile: int

    @property
    def key_blocks(self) -> int:
        """Key blocks per token: ``key_pad // key_tile`` (1 SWA, 2 HCA, 5 CSA at FLASH)."""
        return self.key_pad // self.key_tile


def decode_attn_tiling(cfg: DeepSeekV4Config, n_cmp: int) -> DecodeAttnTiling:
    """Derive and validate the decode core's tiles (see :class:`DecodeAttnTiling`).

    Raises:
        ConfigError: a negative ``n_cmp``, a window that is not a multiple of the key tile,
            an odd ``qk_rope_head_dim``, or an ``o_lora_rank`` / ``hidden_size`` that the
            o-projection tiles do not divide.
    """
    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise ConfigError(f"decode_sparse_attn: config {cfg.name!r} cannot be tiled: {msg}")

    W, kt = cfg.sliding_window, attn_key_tile(cfg)
    need(isinstance(n_cmp, int) and n_cmp >= 0, f"n_cmp={n_cmp!r} must be an int >= 0")
    need(kt > 0 and W % kt == 0, f"sliding_window={W} is not a multiple of the key tile {kt}")
    need(cfg.qk_rope_head_dim % 2 == 0, f"qk_rope_head_dim={cfg.qk_rope_head_dim} must be even")
    na = min(PROJ_A_N_TILE_MAX, cfg.o_lora_rank)
    need(cfg.o_lora_rank % na == 0, f"o_lora_rank={cfg.o_lora_rank} is not a multiple of {na}")
    D = cfg.hidden_size
    nb = min(PROJ_B_D_TILE_MAX, D)
    act = min(ACT_COL_TILE_MAX, D)
    need(D % nb == 0 and D % act == 0, f"hidden_size={D} is not a multiple of the o-projection tiles {nb}/{act}")
    return DecodeAttnTiling(n_cmp=n_cmp, key_tile=kt, swa_blocks=W // kt, key_pad=round_up(W + n_cmp, kt),
                            proj_a_n_tile=na, proj_b_n_tile=nb, act_col_tile=act)


def grouped_o_proj_tasks(o_packed, wo_a, wo_b, wo_b_scale, attn_out, t: int, deps: list, cfg: DeepSeekV4Config,
                         tl: DecodeAttnTiling) -> None:
    """Grouped W8A8 output projection tasks (pypto-lib `decode_sparse_attn_swa.py` step 5-6), ``o_packed [G*T, o_group_in]``
    BF16 group-major (row ``g*T + t``) into ``attn_out [T, D]`` BF16.

    Inside ``pl.manual_scope()``, per group ``g``: ``proj_a_mm`` ``spmd(o_lora / NA)`` (deps
    ``deps``) -> ``quant`` (per-(token, group) INT8, dequant scale ``1/s``) -> ``proj_b_mm``
    ``spmd(D / NB)`` (exact INT32 into ``partials``); then ``proj_b_act`` ``spmd`` over
    ``(D / act_col_tile) * ceil(T / 16)`` blocks after every ``proj_b_mm``: groups summed in
    order, ``* wo_b_scale``, BF16 (``rint``). ``cfg.weight_format == "bf16"``: ``quant`` rounds
    to BF16, ``proj_b_mm`` is BF16 x BF16 -> FP32, no scale is applied (weight_format.py).
    """
    G, LO, D = cfg.o_groups, cfg.o_lora_rank, cfg.hidden_size
    bf16 = is_bf16(cfg)
    NA, NB, CT = tl.proj_a_n_tile, tl.proj_b_n_tile, tl.act_col_tile
    cap = token_capacity(cfg)
    o_r = pl.create_tensor([t, G * LO], pl.FP32, capacity=cap)
    o_r_i8 = pl.create_tensor([t, G * LO], weight_dtype(cfg), capacity=cap)
    act_scale_dq = None if bf16 else pl.create_tensor([t, G], pl.FP32, capacity=cap)
    partials = pl.create_tensor([t, G * D], pl.FP32 if bf16 else pl.INT32, capacity=cap)
    wo_b_scale_row = pl.reshape(wo_b_scale, [1, D])
    n_qt = -(-t // QUANT_TOK_TILE)
    proj_b_tids = []
    # bf16: the FP32 GEMM rows take MATMUL_M_TILE-padded tiles, so a token's row does not depend
    # on how many requests share the step (torch's b-transposed GEMM rounds rows differently
    # below 4; EP ranks decode fewer requests than one rank). INT8 products are exact anyway.
    mp = round_up(t, MATMUL_M_TILE) if bf16 else t
    GIN = o_packed.shape[1]
    # wo_a [G, o_lora, GIN] as [G * o_lora, GIN] rows: group g's N-tile is a 2-D row window (the
    # same elements as wo_a[g, rows, :], a rank-2 load and the matmul's 2-D path, no unit batch)
    wo_a_rows = pl.reshape(wo_a, [G * LO, GIN])
    with pl.manual_scope():
        for g in pl.parallel(G):
            pa = pl.spmd(LO // NA, name_hint="proj_a_mm", deps=deps)
            for nf in pa:
                a = pl.slice(o_packed, [mp, GIN], [g * t, 0], valid_shape=[t, GIN]) \
                    if bf16 else o_packed[g * t:(g + 1) * t, 0:GIN]
                w0 = g * LO + nf * NA
                acc = pl.matmul(a, wo_a_rows[w0:w0 + NA, 0:GIN], b_trans=True)
                pl.assemble(o_r, pl.set_validshape(acc, t, NA) if bf16 else acc, [0, g * LO + nf * NA])
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="quant", deps=[pa.tid]) as q_tid:
                for tc in pl.range(n_qt):
                    quant_o_r_tile(o_r, o_r_i8, act_scale_dq, t, tc * QUANT_TOK_TILE, g, o_lora=LO,
                                   tok_tile=QUANT_TOK_TILE, bf16=bf16)
            pb = pl.spmd(D // NB, name_hint="proj_b_mm", deps=[q_tid])
            for dc in pb:
                a = pl.slice(o_r_i8, [mp, LO], [0, g * LO], valid_shape=[t, LO]) if bf16 \
                    else o_r_i8[0:t, g * LO:(g + 1) * LO]
                acc = pl.matmul(a, wo_b[dc * NB:(dc + 1) * NB, g * LO:(g + 1) * LO], b_trans=True)
                # exact INT32 (FP32 for bf16)
                pl.assemble(partials, pl.set_validshape(acc, t, NB) if bf16 else acc, [0, g * D + dc * NB])
            proj_b_tids.append(pb.tid)
    proj_b_act_task(partials, act_scale_dq, wo_b_scale_row, attn_out, t, proj_b_tids, groups=G, hidden=D,
                    col_tile=CT, tok_tile=ACT_TOK_TILE)


@functools.lru_cache(maxsize=None)
def decode_sparse_attn_kernels(cfg: DeepSeekV4Config, n_cmp: int) -> SimpleNamespace:
    """Build the decode sparse-attention core for ``cfg`` with ``n_cmp`` compressed columns.

    Tasks (``NB = key_blocks``, ``KT = key_tile``, ``T`` dynamic, ``S = T / B``):

    1. ``decode_gather_kv`` ``spmd(T * NB * GP)``, ``GP = KT / GATHER_ROWS`` (4 at FLASH):
       block = (token, key block, part of ``GATHER_ROWS`` rows), the grid of the reference's
       hoisted gathers (32 rows per block, pypto-lib decode_sparse_attn_swa.py /
       decode_sparse_attn_hca.py), so the scattered compressed rows of one key block are
       copied by ``GP`` cores; a zeroed ``[KT / GP, head_dim]`` stage receives the part's
       valid rows (window rows as given; compressed slot ``k`` lowered through
       ``cmp_block_table[t // S, k // block_size]``), copied in runs of consecutive rows; a
       key block whose every index is ``-1`` is not written.
    2. ``decode_build_bias`` ``spmd(ceil(T/16))``: additive mask ``[T, key_pad]`` (0 valid,
       ``-FP32_MAX`` for ``-1`` and the pad columns).
    3. ``decode_qk_pv`` ``spmd(T * NB)``: all heads of one (token, key block): scores,
       ``* softmax_scale``, ``+ bias``, row max, ``exp``, row sum, BF16 probabilities @ kv;
       ``(m, l, o)`` to scratch. A fully masked block stores ``(-FP32_MAX, 0, 0)`` unread.
    4. ``decode_merge_norm`` ``spmd(T)``: online merge in block order, sink in the
       denominator, inverse interleaved RoPE of the trailing ``qk_rope_head_dim`` channels
       (cos / signed sin rows of the token built in the block), BF16 (``rint``) into the
       group-major ``o_packed [G*T, o_group_in]``.
    5. :func:`grouped_o_proj_tasks` (deps = merge).

    Returns:
        namespace with ``tiling`` and the inline bodies ``decode_sparse_attn(q, ori_kv,
        swa_indices, cmp_kv, cmp_block_table, cmp_indices, attn_sink, rope_cos, rope_sin,
        wo_a, wo_b, wo_b_scale, attn_out)`` (``n_cmp > 0``) or ``decode_sparse_attn(q,
        ori_kv, swa_indices, attn_sink, rope_cos, rope_sin, wo_a, wo_b, wo_b_scale,
        attn_out)`` (``n_cmp == 0``), each returning ``attn_out``, and the ``@pl.jit`` entry
        ``decode_sparse_attn_test`` (same parameters). Shapes: ``q [T, H, head_dim]`` BF16,
        ``ori_kv [ori_kv_block_num, block_size, 1, head_dim]`` BF16, ``swa_indices [T, W]``
        INT32, ``cmp_kv [cmp_kv_block_num, block_size, 1, head_dim]`` BF16,
        ``cmp_block_table [B, cmp_kv_block_num]`` INT32, ``cmp_indices [T, n_cmp]`` INT32,
        ``attn_sink [H]`` FP32, ``rope_cos / rope_sin [T, rope_dim]`` BF16 (the layer's
        profile), ``wo_a [G, o_lora, o_group_in]`` BF16, ``wo_b [D, G*o_lora]`` INT8,
        ``wo_b_scale [D]`` FP32, ``attn_out [T, D]`` BF16.

    Raises:
        ConfigError: from :func:`decode_attn_tiling`. At run time: ``CapacityError`` for
            ``T`` above ``token_capacity(cfg)``; ``BindError`` for ``T`` not a multiple of
            ``B``, a compressed slot past the table, or a valid slot whose page entry is
            negative or outside ``cmp_kv``.
    """
    tl = decode_attn_tiling(cfg, n_cmp)
    H, HD, R, N = cfg.num_attention_heads, cfg.head_dim, cfg.qk_rope_head_dim, cfg.nope_head_dim
    BS, P, CP, W = cfg.block_size, cfg.ori_kv_block_num, cfg.cmp_kv_block_num, cfg.sliding_window
    G, HPG, LO, GIN, D = cfg.o_groups, cfg.heads_per_group, cfg.o_lora_rank, cfg.o_group_in, cfg.hidden_size
    KT, NB, NBS, PAD, NC = tl.key_tile, tl.key_blocks, tl.swa_blocks, tl.key_pad, n_cmp
    GP = max(1, KT // GATHER_ROWS) if KT % GATHER_ROWS == 0 else 1  # gather blocks per key block
    scale = cfg.softmax_scale
    cap = token_capacity(cfg)

    def body(q, ori_kv, swa_indices, cmp_kv, cmp_block_table, cmp_indices, attn_sink, rope_cos, rope_sin,
             wo_a, wo_b, wo_b_scale, attn_out):
        t = pl.tensor.dim(q, 0)
        s_req, cmp_flat = 1, None
        if NC:
            n_req = pl.tensor.dim(cmp_block_table, 0)
            if n_req < 1 or t % n_req:
                raise BindError(f"decode_sparse_attn: T={t} tokens is not a multiple of the B={n_req} rows of "
                                "cmp_block_table")
            s_req = t // n_req
            cmp_flat = pl.reshape(cmp_kv, [CP * BS, HD])
        ori_flat = pl.reshape(ori_kv, [P * BS, HD])
        sink_row = pl.reshape(attn_sink, [1, H])

        sparse_kv = pl.create_tensor([t * PAD, HD], pl.BF16, capacity=cap * PAD)
        sparse_bias = pl.create_tensor([t, PAD], pl.FP32, capacity=cap)
        blk_m = pl.create_tensor([t * NB * H, 1], pl.FP32, capacity=cap * NB * H)
        blk_l = pl.create_tensor([t * NB * H, 1], pl.FP32, capacity=cap * NB * H)
        blk_o = pl.create_tensor([t * NB * H, HD], pl.FP32, capacity=cap * NB * H)
        o_packed = pl.create_tensor([G * t, GIN], pl.BF16, capacity=G * cap)
        o_head_rows = pl.reshape(o_packed, [G * t * HPG, HD])

        # 1. gather the valid key rows, one (token, key block) per block
        geo = dict(key_tile=KT, key_blocks=NB, swa_blocks=NBS, n_cmp=NC, head_dim=HD, cmp_pages=CP, block_size=BS)
        gather = pl.spmd(t * NB * GP, name_hint="decode_gather_kv")
        for b in gather:
            tok, rest = divmod(b, NB * GP)
            kb, part = divmod(rest, GP)
            gather_key_block("decode_sparse_attn", tok, kb, swa_indices, cmp_indices, ori_flat, cmp_flat,
                             cmp_block_table, (tok // s_req,), sparse_kv, part=(part, GP), **geo)

        # 2. additive mask: 0 valid, -FP32_MAX for -1 and the pad columns
        for b in pl.spmd(-(-t // BIAS_TOK_TILE), name_hint="decode_build_bias"):
            bias_block(b, t, swa_indices, cmp_indices, sparse_bias, window=W, n_cmp=NC, key_pad=PAD)

        # 3. (m, l, o) of every (token, key block), all heads at once
        q_rows = pl.reshape(q, [t * H, HD])  # q[tok, :, :] as a 2-D window: the same load, its fast path
        for b in pl.spmd(t * NB, name_hint="decode_qk_pv", deps=[gather.tid]):
            tok, kb = divmod(b, NB)
            key_block_stats(lambda: q_rows[tok * H:(tok + 1) * H, 0:HD], tok, kb, sparse_kv, sparse_bias, blk_m,
                            blk_l, blk_o, scale=scale, key_tile=KT, key_blocks=NB, heads=H, head_dim=HD)

        # 4. merge the blocks, sink, inverse RoPE, pack group-major
        merge = pl.spmd(t, name_hint="decode_merge_norm")
        for tok in merge:
            o = merge_key_blocks(tok, blk_m, blk_l, blk_o, sink_row, key_blocks=NB, heads=H)
            pair, swap, sign = rope_index_rows(R)
            cos_il = pl.gather(pl.cast(rope_cos[tok:tok + 1, 0:R], pl.FP32), index=pair)  # [1, R]
            sin_signed = pl.mul(pl.gather(pl.cast(rope_sin[tok:tok + 1, 0:R], pl.FP32), index=pair), sign)
            x = pl.slice(o, [H, R], [0, N])
            rot = pl.add(pl.col_expand_mul(x, cos_il), pl.col_expand_mul(pl.gather(x, index=swap), sin_signed))
            packed = pl.assemble(pl.cast(o, pl.BF16, mode="rint"), pl.cast(rot, pl.BF16, mode="rint"), [0, N])
            if t == 1:  # the G groups' rows g*HPG .. are consecutive: the whole [H, HD] tile in one store
                pl.assemble(o_head_rows, packed, [0, 0])
                continue
            for g in pl.range(G):  # group g's heads into rows (g*T + tok)*HPG .. of the [G*T*HPG, HD] view
                pl.assemble(o_head_rows, pl.slice(packed, [HPG, HD], [g * HPG, 0]), [(g * t + tok) * HPG, 0])

        # 5. grouped o-projection
        grouped_o_proj_tasks(o_packed, wo_a, wo_b, wo_b_scale, attn_out, t, [merge.tid], cfg, tl)
        return attn_out

    if NC:
        @pl.jit.inline
        def decode_sparse_attn(q: pl.Tensor[[T_DYN, H, HD], pl.BF16],
                               ori_kv: pl.Tensor[[P, BS, 1, HD], pl.BF16],
                               swa_indices: pl.Tensor[[T_DYN, W], pl.INT32],
                               cmp_kv: pl.Tensor[[CP, BS, 1, HD], pl.BF16],
                               cmp_block_table: pl.Tensor[[B_DYN, CP], pl.INT32],
                               cmp_indices: pl.Tensor[[T_DYN, NC], pl.INT32],
                               attn_sink: pl.Tensor[[H], pl.FP32],
                               rope_cos: pl.Tensor[[T_DYN, R], pl.BF16],
                               rope_sin: pl.Tensor[[T_DYN, R], pl.BF16],
                               wo_a: pl.Tensor[[G, LO, GIN], pl.BF16],
                               wo_b: pl.Tensor[[D, G * LO], weight_dtype(cfg)],
                               wo_b_scale: pl.Tensor[[D], pl.FP32],
                               attn_out: pl.Out[pl.Tensor[[T_DYN, D], pl.BF16]]):
            """Decode sparse attention over window + compressed rows (pypto-lib `decode_sparse_attn_hca.py` / pypto-lib `decode_sparse_attn.py`)."""
            return body(q, ori_kv, swa_indices, cmp_kv, cmp_block_table, cmp_indices, attn_sink, rope_cos,
                        rope_sin, wo_a, wo_b, wo_b_scale, attn_out)
    else:
        @pl.jit.inline
        def decode_sparse_attn(q: pl.Tensor[[T_DYN, H, HD], pl.BF16],
                               ori_kv: pl.Tensor[[P, BS, 1, HD], pl.BF16],
                               swa_indices: pl.Tensor[[T_DYN, W], pl.INT32],
                               attn_sink: pl.Tensor[[H], pl.FP32],
                               rope_cos: pl.Tensor[[T_DYN, R], pl.BF16],
                               rope_sin: pl.Tensor[[T_DYN, R], pl.BF16],
                               wo_a: pl.Tensor[[G, LO, GIN], pl.BF16],
                               wo_b: pl.Tensor[[D, G * LO], weight_dtype(cfg)],
                               wo_b_scale: pl.Tensor[[D], pl.FP32],
                               attn_out: pl.Out[pl.Tensor[[T_DYN, D], pl.BF16]]):
            """Decode sparse attention over the window only (pypto-lib `decode_sparse_attn_swa.py`)."""
            return body(q, ori_kv, swa_indices, None, None, None, attn_sink, rope_cos, rope_sin, wo_a, wo_b,
                        wo_b_scale, attn_out)

    decode_sparse_attn_test = pl.jit.entry(decode_sparse_attn, name="decode_sparse_attn_test")
    return SimpleNamespace(tiling=tl, decode_sparse_attn=decode_sparse_attn,
                           decode_sparse_attn_test=decode_sparse_attn_test)


@pl.jit.inline
def decode_sparse_attn_swa(q: pl.Tensor, ori_kv: pl.Tensor, swa_indices: pl.Tensor, attn_sink: pl.Tensor,
                           rope_cos: pl.Tensor, rope_sin: pl.Tensor, wo_a: pl.Tensor, wo_b: pl.Tensor,
                           wo_b_scale: pl.Tensor, attn_out: pl.Out[pl.Tensor], cfg):
    """Stable inline signature ``decode_sparse_attn_swa(q, ori_kv, swa_indices, attn_sink,
    rope_cos, rope_sin, wo_a, wo_b, wo_b_scale, attn_out, cfg) -> attn_out``: the window-only
    core (pypto-lib `decode_sparse_attn_swa.py`), :func:`decode_sparse_attn_kernels` with ``n_cmp = 0`` (shapes and errors there)."""
    return decode_sparse_attn_kernels(cfg, 0).decode_sparse_attn(
        q, ori_kv, swa_indices, attn_sink, rope_cos, rope_sin, wo_a, wo_b, wo_b_scale, attn_out)


@pl.jit.inline
def decode_sparse_attn_hca(q: pl.Tensor, ori_kv: pl.Tensor, swa_indices: pl.Tensor, cmp_kv: pl.Tensor,
                           cmp_block_table: pl.Tensor, cmp_indices: pl.Tensor, attn_sink: pl.Tensor,
                           rope_cos: pl.Tensor, rope_sin: pl.Tensor, wo_a: pl.Tensor, wo_b: pl.Tensor,
                           wo_b_scale: pl.Tensor, attn_out: pl.Out[pl.Tensor], cfg):
    """Stable inline signature ``decode_sparse_attn_hca(q, ori_kv, swa_indices, cmp_kv,
    cmp_block_table, cmp_indices, attn_sink, rope_cos, rope_sin, wo_a, wo_b, wo_b_scale,
    attn_out, cfg) -> attn_out``: window + every visible compressed row (pypto-lib `decode_sparse_attn_hca.py`),
    :func:`decode_sparse_attn_kernels` with ``n_cmp = hca_cmp_cols(cfg)``."""
    return decode_sparse_attn_kernels(cfg, hca_cmp_cols(cfg)).decode_sparse_attn(
        q, ori_kv, swa_indices, cmp_kv, cmp_block_table, cmp_indices, attn_sink, rope_cos, rope_sin, wo_a, wo_b,
        wo_b_scale, attn_out)


@pl.jit.inline
def decode_sparse_attn_csa(q: pl.Tensor, ori_kv: pl.Tensor, swa_indices: pl.Tensor, cmp_kv: pl.Tensor,
                           cmp_block_table: pl.Tensor, cmp_indices: pl.Tensor, attn_sink: pl.Tensor,
                           rope_cos: pl.Tensor, rope_sin: pl.Tensor, wo_a: pl.Tensor, wo_b: pl.Tensor,
                           wo_b_scale: pl.Tensor, attn_out: pl.Out[pl.Tensor], cfg):
    """Stable inline signature ``decode_sparse_attn_csa(q, ori_kv, swa_indices, cmp_kv,
    cmp_block_table, cmp_indices, attn_sink, rope_cos, rope_sin, wo_a, wo_b, wo_b_scale,
    attn_out, cfg) -> attn_out``: window + the indexer's ``index_topk`` selected rows (pypto-lib `decode_sparse_attn.py`;
    ``cmp_indices [T, index_topk]`` with ``-1`` past the visible count, as the indexer writes
    them), :func:`decode_sparse_attn_kernels` with ``n_cmp = index_topk``."""
    return decode_sparse_attn_kernels(cfg, cfg.index_topk).decode_sparse_attn(
        q, ori_kv, swa_indices, cmp_kv, cmp_block_table, cmp_indices, attn_sink, rope_cos, rope_sin, wo_a, wo_b,
        wo_b_scale, attn_out)
# ---- end kernel ----


def _lower_cmp_rows(fn: str, cmp_indices, cmp_block_table, T: int, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows [T, n] int64, valid [T, n] bool)``: compressed slots lowered through the
    request's table row (``t // S``)."""
    bs, CP = cfg.block_size, cfg.cmp_kv_block_num
    B = cmp_block_table.shape[0]
    if B < 1 or T % B:
        raise BindError(f"{fn}: T={T} is not a multiple of the B={B} rows of cmp_block_table")
    slots = cmp_indices.long()
    valid = slots >= 0
    page = torch.where(valid, slots // bs, torch.zeros_like(slots))
    if bool((page >= cmp_block_table.shape[1]).any()):
        raise BindError(f"{fn}: compressed slot {int(slots[page >= cmp_block_table.shape[1]].max())} is past "
                        f"cmp_block_table ({cmp_block_table.shape[1]} pages of {bs})")
    req = (torch.arange(T) // (T // B))[:, None].expand_as(page)
    phys = cmp_block_table.long()[req, page]
    bad = valid & ((phys < 0) | (phys >= CP))
    if bool(bad.any()):
        raise BindError(f"{fn}: a valid compressed slot maps to page entry {int(phys[bad][0])}, not a page of "
                        f"cmp_kv ({CP} pages)")
    rows = torch.where(valid, phys * bs + slots % bs, torch.zeros_like(slots))
    return rows, valid


def golden_decode_attention_core(
    q: torch.Tensor,  # [T, H, head_dim] bf16
    ori_kv: torch.Tensor,  # [pages, block_size, 1, head_dim] bf16
    swa_indices: torch.Tensor,  # [T, W] int32 physical rows, -1 invalid
    cmp_kv: torch.Tensor | None,  # [cmp_pages, block_size, 1, head_dim] bf16
    cmp_block_table: torch.Tensor | None,  # [B, cmp_pages] int32
    cmp_indices: torch.Tensor | None,  # [T, n_cmp] int32 logical slots, -1 invalid
    attn_sink: torch.Tensor,  # [H] fp32
    rope_cos: torch.Tensor,  # [T, rope_dim] bf16
    rope_sin: torch.Tensor,  # [T, rope_dim] bf16
    cfg: DeepSeekV4Config,
    *,
    key_tile: int | None = None,
    float32: bool = False,
) -> torch.Tensor:  # [T, H, head_dim] bf16 (fp32 with float32)
    """Decode attention with sink and inverse RoPE before the o-projection, over whole tensors.

    Keys ``[T, K]`` = the window rows then the lowered compressed rows (module docstring),
    padded to a multiple of ``key_tile`` (default ``attn_key_tile(cfg)``) with invalid
    columns. Scores ``q . k * softmax_scale`` FP32; per key tile ``m_i`` (``-FP32_MAX`` for a
    tile without a valid key), ``p = exp(s - m_i)`` (0 on invalid keys), ``l_i = sum p``,
    ``o_i = bf16(p) @ k`` (FP32 ``p`` with ``float32``); tiles merged in order with
    ``alpha = exp(m - m_new)``, ``beta = exp(m_i - m_new)``; ``o / (l + exp(sink - m))``;
    inverse interleaved RoPE on the trailing ``qk_rope_head_dim`` channels with the token's
    cos / sin row. A token without a valid key gets a zero row.

    Raises:
        BindError: an index outside its cache (see :func:`_lower_cmp_rows`), or shapes that
            do not match ``cfg``.
    """
    fn = "golden_decode_attention_core"
    H, hd, n = cfg.num_attention_heads, cfg.head_dim, cfg.nope_head_dim
    if q.dim() != 3 or tuple(q.shape[1:]) != (H, hd):
        raise BindError(f"{fn}: q must be [T, {H}, {hd}], got {list(q.shape)}")
    T = q.shape[0]
    if tuple(swa_indices.shape) != (T, cfg.sliding_window):
        raise BindError(f"{fn}: swa_indices must be [{T}, {cfg.sliding_window}], got {list(swa_indices.shape)}")
    tile = attn_key_tile(cfg) if key_tile is None else int(key_tile)
    ori_flat = ori_kv.reshape(-1, hd).float()
    swa = swa_indices.long()
    if bool((swa >= ori_flat.shape[0]).any()):
        raise BindError(f"{fn}: swa index {int(swa.max())} outside ori_kv ({ori_flat.shape[0]} rows)")
    keys, valid = [ori_flat[swa.clamp(min=0)]], [swa >= 0]
    if cmp_indices is not None and cmp_indices.shape[1]:
        rows, ok = _lower_cmp_rows(fn, cmp_indices, cmp_block_table, T, cfg)
        keys.append(cmp_kv.reshape(-1, hd).float()[rows])
        valid.append(ok)
    keys, valid = torch.cat(keys, dim=1), torch.cat(valid, dim=1)  # [T, K, hd], [T, K]
    pad = round_up(keys.shape[1], tile) - keys.shape[1]
    if pad:
        keys = torch.cat([keys, torch.zeros(T, pad, hd)], dim=1)
        valid = torch.cat([valid, torch.zeros(T, pad, dtype=torch.bool)], dim=1)
    nb = keys.shape[1] // tile
    s = torch.einsum("thd,tkd->thk", q.float(), keys) * cfg.softmax_scale
    s = s.reshape(T, H, nb, tile)
    vb = valid.reshape(T, 1, nb, tile)
    m_b = torch.where(vb, s, torch.full_like(s, -torch.inf)).amax(dim=-1)
    m_b = torch.where(vb.any(dim=-1), m_b, torch.full_like(m_b, -FP32_MAX))  # [T, H, nb]
    p = torch.where(vb, torch.exp(s - m_b[..., None]), torch.zeros_like(s))
    l_b = p.sum(dim=-1)
    pv = p if float32 else p.to(torch.bfloat16).float()
    o_b = torch.einsum("thnk,tnkd->thnd", pv, keys.reshape(T, nb, tile, hd))  # [T, H, nb, hd]
    m, l, o = m_b[..., 0], l_b[..., 0], o_b[..., 0, :]
    for i in range(1, nb):
        m_new = torch.maximum(m, m_b[..., i])
        alpha, beta = torch.exp(m - m_new), torch.exp(m_b[..., i] - m_new)
        l = alpha * l + beta * l_b[..., i]
        o = alpha[..., None] * o + beta[..., None] * o_b[..., i, :]
        m = m_new
    o = o / (l + torch.exp(attn_sink.float()[None, :] - m))[..., None]
    o[..., n:] = rope_interleaved(o[..., n:], rope_cos.float(), rope_sin.float(), inverse=True)
    return o if float32 else o.to(torch.bfloat16)


def golden_decode_sparse_attn(
    q: torch.Tensor,  # [T, H, head_dim] bf16
    ori_kv: torch.Tensor,  # [pages, block_size, 1, head_dim] bf16
    swa_indices: torch.Tensor,  # [T, W] int32
    cmp_kv: torch.Tensor | None,  # [cmp_pages, block_size, 1, head_dim] bf16
    cmp_block_table: torch.Tensor | None,  # [B, cmp_pages] int32
    cmp_indices: torch.Tensor | None,  # [T, n_cmp] int32
    attn_sink: torch.Tensor,  # [H] fp32
    rope_cos: torch.Tensor,  # [T, rope_dim] bf16
    rope_sin: torch.Tensor,  # [T, rope_dim] bf16
    wo_a: torch.Tensor,  # [G, o_lora, o_group_in] bf16
    wo_b: torch.Tensor,  # [D, G*o_lora] int8 (float for weight_format="bf16")
    wo_b_scale: torch.Tensor | None,  # [D] fp32
    cfg: DeepSeekV4Config,
    *,
    weight_format: str = "int8",
    key_tile: int | None = None,
    float32: bool = False,
) -> torch.Tensor:  # [T, D] bf16 (fp32 with float32)
    """Decode sparse attention + grouped o-projection golden (pypto-lib `decode_sparse_attn_swa.py` / pypto-lib `decode_sparse_attn_hca.py` / pypto-lib `decode_sparse_attn.py`):
    :func:`golden_decode_attention_core` then ``prefill_sparse_attn.golden_grouped_o_proj``
    (``weight_format`` ``"int8"`` as the kernel, ``"bf16"`` unquantised; ``float32=True``:
    no BF16 rounding anywhere, FP32 result). SWA: pass ``None`` for the three compressed
    arguments.

    Raises:
        BindError: see the two parts.
    """
    o = golden_decode_attention_core(q, ori_kv, swa_indices, cmp_kv, cmp_block_table, cmp_indices, attn_sink,
                                     rope_cos, rope_sin, cfg, key_tile=key_tile, float32=float32)
    return golden_grouped_o_proj(o, wo_a, wo_b, wo_b_scale, cfg, weight_format=weight_format, float32=float32)


def make_decode_attn_inputs(
    cfg: DeepSeekV4Config,
    start_pos: tuple | list,
    S: int,
    seed: int,
    *,
    n_cmp: int,
    reverse_tables: bool = False,
    ratio: int = HCA_RATIO,
    weight_format: str = "int8",
) -> dict:
    """Seeded fixture of the decode cores: ``B = len(start_pos)`` requests of ``S`` tokens.

    Tables from :func:`decode_metadata.decode_block_tables` (``reverse_tables`` reverses
    the page order), indices from :func:`decode_metadata.make_decode_metadata`; ``q``,
    ``ori_kv``, ``cmp_kv`` ~ N(0, 1) (the kernels see RMS-normed rows), ``attn_sink`` ~
    U(-1, 1), ``wo_a`` / ``wo_b`` ~ U(-1, 1) * fan_in^-0.5 with ``wo_b`` quantised per row
    (``weight_format="bf16"``: BF16 ``wo_b``, unit scales);
    cos / sin rows of the positions (``"main"`` profile for ``n_cmp == 0``, ``"compress"``
    otherwise; zero rows for inactive tokens), BF16.

    Returns:
        dict keyed by the kernel parameter names (without ``attn_out``).

    Raises:
        BindError: the pools cannot hold the batch.
    """
    gen = torch.Generator().manual_seed(seed)
    bf16 = torch.bfloat16
    B = len(start_pos)
    T, H, hd, D = B * S, cfg.num_attention_heads, cfg.head_dim, cfg.hidden_size
    G, Lo, gin = cfg.o_groups, cfg.o_lora_rank, cfg.o_group_in
    tables = decode_block_tables(cfg, start_pos, S, reverse=reverse_tables)
    meta = make_decode_metadata(cfg, start_pos, S, tables["block_table"], tables["cmp_block_table"])
    q = torch.randn(T, H, hd, generator=gen)
    ori_kv = torch.randn(cfg.ori_kv_block_num, cfg.block_size, 1, hd, generator=gen)
    cmp_kv = torch.randn(cfg.cmp_kv_block_num, cfg.block_size, 1, hd, generator=gen)
    sink = torch.rand(H, generator=gen) * 2 - 1
    wo_a = (torch.rand(G, Lo, gin, generator=gen) * 2 - 1) * gin ** -0.5
    wo_b_f = (torch.rand(D, G * Lo, generator=gen) * 2 - 1) * (G * Lo) ** -0.5
    wo_b, wo_b_scale = (wo_b_f.to(bf16), torch.ones(D)) if weight_format == "bf16" else quantize_wo_b(wo_b_f)
    cos, sin = rope_tables(cfg, "main" if n_cmp == 0 else "compress")
    pos = meta["position_ids"].long()
    act = (pos >= 0)[:, None]
    d = {"q": q.to(bf16), "ori_kv": ori_kv.to(bf16), "swa_indices": meta["swa_indices"],
         "attn_sink": sink,
         "rope_cos": torch.where(act, cos[pos.clamp(min=0)], 0.0).to(bf16),
         "rope_sin": torch.where(act, sin[pos.clamp(min=0)], 0.0).to(bf16),
         "wo_a": wo_a.to(bf16), "wo_b": wo_b, "wo_b_scale": wo_b_scale, "position_ids": meta["position_ids"]}
    if n_cmp:
        d.update(cmp_kv=cmp_kv.to(bf16), cmp_block_table=tables["cmp_block_table"],
                 cmp_indices=golden_decode_cmp_indices(meta["position_ids"], n_cmp, ratio))  # first n_cmp visible
    return d


_SWA_ARGS = ("q", "ori_kv", "swa_indices", "attn_sink", "rope_cos", "rope_sin", "wo_a", "wo_b", "wo_b_scale")
_HCA_ARGS = ("q", "ori_kv", "swa_indices", "cmp_kv", "cmp_block_table", "cmp_indices", "attn_sink", "rope_cos",
             "rope_sin", "wo_a", "wo_b", "wo_b_scale")


def decode_case_options(kernel: str, preset: str, mode: str, options: dict, *, starts: dict | None = None,
                        flags: tuple = (), weight_formats: bool = False) -> SimpleNamespace:
    """The options every decode ``KernelCase`` builder takes, parsed and checked.

    ``start_pos`` (per request, ``< 0`` inactive; default ``starts[preset]`` or
    ``starts["flash"]``, ``starts`` defaulting to :data:`DEFAULT_START_POS`), ``S`` (default
    ``cfg.decode_seq``), ``seed`` (0), ``reverse_tables`` (False) and every boolean option
    named in ``flags`` (False); with ``weight_formats`` also ``weight_format`` (``"int8"``;
    ``"bf16"`` gives ``cfg`` the unquantised kernels, weight_format.py).

    Returns:
        namespace ``cfg, start_pos (tuple), S, seed, reverse_tables, weight_format`` plus one
        attribute per flag.

    Raises:
        ConfigError: unknown preset, a mode other than ``"decode"``, or an unknown option,
            naming ``kernel``.
    """
    cfg = get_config(preset)
    if mode != "decode":
        raise ConfigError(f"{kernel}: unknown mode {mode!r}; modes: decode")
    opts = dict(options)
    starts = DEFAULT_START_POS if starts is None else starts
    out = SimpleNamespace(cfg=cfg, start_pos=tuple(opts.pop("start_pos", starts.get(preset, starts["flash"]))),
                          S=int(opts.pop("S", cfg.decode_seq)), seed=int(opts.pop("seed", 0)),
                          reverse_tables=bool(opts.pop("reverse_tables", False)),
                          weight_format=str(opts.pop("weight_format", "int8")) if weight_formats else "int8")
    out.cfg = with_weight_format(cfg, out.weight_format)
    for flag in flags:
        setattr(out, flag, bool(opts.pop(flag, False)))
    if opts:
        raise ConfigError(f"{kernel}: unknown options {sorted(opts)}")
    return out


def _build(variant: str, preset: str, mode: str, **options) -> CaseRun:
    o = decode_case_options(f"decode_sparse_attn_{variant}", preset, mode, options,
                            starts=CSA_START_POS if variant == "csa" else DEFAULT_START_POS, weight_formats=True)
    cfg, start, S, seed, reverse = o.cfg, o.start_pos, o.S, o.seed, o.reverse_tables
    n_cmp = {"swa": 0, "hca": hca_cmp_cols(cfg), "csa": cfg.index_topk}[variant]
    k = decode_sparse_attn_kernels(cfg, n_cmp)
    d = make_decode_attn_inputs(cfg, start, S, seed, n_cmp=n_cmp, reverse_tables=reverse,
                                ratio=4 if variant == "csa" else HCA_RATIO, weight_format=o.weight_format)
    names = _SWA_ARGS if variant == "swa" else _HCA_ARGS
    specs = [TensorSpec(n, list(d[n].shape), d[n].dtype, d[n]) for n in names]
    T = d["q"].shape[0]
    specs.append(TensorSpec("attn_out", [T, cfg.hidden_size], torch.bfloat16, is_output=True))

    def golden(v: dict) -> None:
        cmp = (None, None, None) if variant == "swa" else (v["cmp_kv"], v["cmp_block_table"], v["cmp_indices"])
        v["attn_out"] = golden_decode_sparse_attn(v["q"], v["ori_kv"], v["swa_indices"], *cmp, v["attn_sink"],
                                                  v["rope_cos"], v["rope_sin"], v["wo_a"], v["wo_b"],
                                                  v["wo_b_scale"], cfg, weight_format=o.weight_format)

    return CaseRun(fn=k.decode_sparse_attn_test, specs=specs, golden=golden,
                   compare={"attn_out": ratio_allclose(*TOLERANCES["attn_out"])}, rtol=1e-3, atol=1e-3,
                   label=f"decode B={len(start)} S={S} start_pos={list(start)}"
                         + (" weight_format=bf16" if o.weight_format == "bf16" else ""))


def build_case_swa(preset: str, mode: str, **options) -> CaseRun:
    """Registry builder of ``decode_sparse_attn_swa`` (pypto-lib `decode_sparse_attn_swa.py`). Mode ``"decode"``; options
    ``start_pos`` (per request, ``< 0`` inactive; default :data:`DEFAULT_START_POS`), ``S``
    (default ``decode_seq``), ``seed``, ``reverse_tables``. Golden
    :func:`golden_decode_sparse_attn`; ``attn_out`` ``ratio_allclose(*TOLERANCES["attn_out"])``.

    Raises:
        ConfigError: unknown preset, mode or option. BindError: pools too small.
    """
    return _build("swa", preset, mode, **options)


def build_case_hca(preset: str, mode: str, **options) -> CaseRun:
    """Registry builder of ``decode_sparse_attn_hca`` (pypto-lib `decode_sparse_attn_hca.py`); options as :func:`build_case_swa`.

    Raises:
        ConfigError: unknown preset, mode or option. BindError: pools too small.
    """
    return _build("hca", preset, mode, **options)


register(KernelCase("decode_sparse_attn_swa", build_case_swa, modes=("decode",),
                    description="decode sparse attention over the window + sink + grouped INT8 o-proj, "
                                "pypto-lib's decode_sparse_attn_swa.py"))
register(KernelCase("decode_sparse_attn_hca", build_case_hca, modes=("decode",),
                    description="decode sparse attention over window + compressed rows + sink + o-proj, "
                                "pypto-lib's decode_sparse_attn_hca.py"))


def build_case_csa(preset: str, mode: str, **options) -> CaseRun:
    """Registry builder of ``decode_sparse_attn_csa`` (pypto-lib `decode_sparse_attn.py`): ``n_cmp = index_topk`` columns
    holding each token's first visible entries (``k < (p + 1) // 4``); default start positions
    :data:`CSA_START_POS`; options as :func:`build_case_swa`.

    Raises:
        ConfigError: unknown preset, mode or option. BindError: pools too small.
    """
    return _build("csa", preset, mode, **options)


register(KernelCase("decode_sparse_attn_csa", build_case_csa, modes=("decode",),
                    description="decode sparse attention over window + index_topk selected rows + sink + o-proj, "
                                "pypto-lib's decode_sparse_attn.py"))
