"""Prefill attention sub-block of ratio-128 (HCA, heavily compressed attention) layers.

Chain (pypto-lib `models/deepseek/v4-flash/prefill_attention_hca.py`; transformers `models/deepseek_v4/modeling_deepseek_v4.py`), one request, ``T`` token rows of which
the first ``num_tokens`` are active:

    x_mixed, post, comb = hc_pre(x_hc) ; x_normed = rms_norm(x_mixed, attn_norm_w)
    cos_t, sin_t        = compress-profile rows at position_ids     # the whole layer uses it
    q, kv               = qkv_proj_rope(x_normed, ...)
    kv_cache[ori_slot_mapping[t]] = kv[t]
    cmp_kv, state       = prefill_compressor_ratio128(x_normed, ...)  # entries of windows closing here
    swa_indices         = window rows pos-W+1 .. pos via block_table
    cmp_indices[t, k]   = k for k < (pos + 1) // 128, else -1         # every visible entry
    attn_out            = prefill_sparse_attn(q, kv_cache, swa_indices, cmp_kv, cmp_block_table,
                                              cmp_indices, ...)
    x_out               = hc_post_prefill(attn_out, x_hc, post, comb)   # rows >= num_tokens = 0

The compressor runs after the cache write and before the attention, so a token at ``pos >=
127`` of the chunk sees the entry its window's closing token wrote in this chunk. The
prefill sparse-attention core attends the first ``SparseAttnTiling.cmp_cols`` compressed
columns (256 at FLASH, i.e. every entry up to position 32767; 16 at tiny, up to position
2047); a token with more visible entries raises ``BindError`` rather than silently dropping
some. ``seed_scopes=True`` passes the seed variant to hc_pre, qkv_proj_rope and the
compressor (zero-fill tasks instead of allocation-time fills; bit-identical results).
"""

import functools
from types import SimpleNamespace

import torch

import pto.language as pl
from pto.errors import BindError, ConfigError
from pto.golden import (CaseRun, KernelCase, ScalarSpec, TensorSpec, ratio_allclose, register,
                        valid_ratio_reldiff)
from pto.models.deepseek_v4.attention_front import attention_front, golden_attention_front
from pto.models.deepseek_v4.config import DeepSeekV4Config, get_config
from pto.models.deepseek_v4.decode_metadata import HCA_RATIO
from pto.models.deepseek_v4.hc_post import golden_hc_post_prefill, hc_post_kernels
from pto.models.deepseek_v4.prefill_attention_swa import (build_window_indices, make_swa_inputs,
                                                          permuted_block_table, prefill_attention_swa_kernels)
from pto.models.deepseek_v4.prefill_compressor_ratio128 import (golden_prefill_compressor_ratio128,
                                                                make_compressor_inputs, prefill_compressor_ratio128)
from pto.models.deepseek_v4.prefill_sparse_attn import (golden_prefill_sparse_attn, prefill_sparse_attn_kernels,
                                                        sparse_attn_tiling)
from pto.models.deepseek_v4.qkv_proj_rope import materialize_rope_rows
from pto.models.deepseek_v4.rope import golden_materialize_rope_rows, rope_tables
from pto.models.deepseek_v4.weight_format import weight_dtype, with_weight_format
from pto.models.deepseek_v4.tiling import check_num_tokens, check_token_capacity, token_capacity

__all__ = [
    "prefill_attention_hca_kernels",
    "prefill_attention_hca",
    "golden_prefill_cmp_indices",
    "golden_prefill_attention_hca",
    "make_prefill_hca_inputs",
    "build_case",
    "TOLERANCES",
    "PREFILL_HCA_ARGS",
]

# pypto-lib `models/deepseek/v4-flash/prefill_attention_hca.py`; the pypto-lib tests' tolerances (run-level rtol=atol=1e-2); compressor outputs as `prefill_compressor_ratio128.py`.
TOLERANCES: dict[str, tuple[float, float, float]] = {
    "x_out": (5e-3, 0.005, 1.0),
    "kv_cache": (1e-4, 1 / 128, 0.005),
    "cmp_kv": (1e-4, 1 / 128, 0.0),
    "compress_state": (1e-3, 1e-3, 0.0),
}

PREFILL_HCA_ARGS = ("x_hc", "hc_attn_fn", "hc_attn_scale", "hc_attn_base", "attn_norm_w", "wq_a", "wq_b",
                    "wq_b_scale", "wkv", "gamma_cq", "gamma_ckv", "freqs_cos", "freqs_sin", "cmp_wkv", "cmp_wgate",
                    "cmp_ape", "cmp_norm_w", "compress_state", "state_block_table", "kv_cache", "block_table",
                    "ori_slot_mapping", "cmp_kv", "cmp_block_table", "cmp_slot_mapping", "state_slot_mapping",
                    "position_ids", "attn_sink", "wo_a", "wo_b", "wo_b_scale")

# ---- kernel ----
T_DYN = pl.dynamic("T")


@functools.lru_cache(maxsize=None)
def prefill_attention_hca_kernels(cfg: DeepSeekV4Config, seed_scopes: bool = False) -> SimpleNamespace:
    """Build the ratio-128 prefill attention sub-layer for ``cfg`` (cached per config / variant).

    Composition (pypto-lib `prefill_attention_hca.py`; ``T`` dynamic, ``num_tokens`` active rows): ``attention_front``
    (``hc_pre`` -> ``rms_norm`` -> ``late_dep`` -> ``materialize_rope_rows`` -> ``qkv_proj_rope``) ->
    ``prefill_swa_cache_write`` -> ``prefill_compressor_ratio128(x_normed, ...)`` ->
    ``prefill_swa_window_indices`` -> ``prefill_hca_cmp_indices`` (``at``: row ``t <
    num_tokens`` holds ``0 .. (pos+1)//128 - 1``, the rest ``-1``) -> ``prefill_sparse_attn``
    -> ``hc_post_prefill``.

    Returns:
        namespace with ``cmp_cols`` (compressed columns the core attends), the inline body
        ``prefill_attention_hca(x_hc, hc_attn_fn, hc_attn_scale, hc_attn_base, attn_norm_w,
        wq_a, wq_b, wq_b_scale, wkv, gamma_cq, gamma_ckv, freqs_cos, freqs_sin, cmp_wkv,
        cmp_wgate, cmp_ape, cmp_norm_w, compress_state, state_block_table, kv_cache,
        block_table, ori_slot_mapping, cmp_kv, cmp_block_table, cmp_slot_mapping,
        state_slot_mapping, position_ids, attn_sink, wo_a, wo_b, wo_b_scale, x_out,
        num_tokens)`` returning ``(kv_cache, cmp_kv, compress_state, x_out)`` and its
        ``@pl.jit`` entry ``prefill_attention_hca_test``. Shapes: prefill_attention_swa's
        (``block_table [max_blocks_per_seq]``) plus the compressor's
        (prefill_compressor_ratio128: ``compress_state [hca_state_block_num, page,
        2*head_dim]`` FP32, ``state_block_table [max_pos // page]`` INT32, ``cmp_kv
        [cmp_kv_block_num, block_size, 1, head_dim]`` BF16, slot mappings ``[T]`` INT64) and
        ``cmp_block_table [cmp_kv_block_num]`` INT32; ``freqs_*`` are the compress profile.

    Raises:
        ConfigError: the config cannot be tiled by a composed kernel. At run time the
            composed kernels' errors, and ``BindError`` for a token with more visible
            compressed entries than ``cmp_cols``.
    """
    D, HC, H, HD, R = cfg.hidden_size, cfg.hc_mult, cfg.num_attention_heads, cfg.head_dim, cfg.qk_rope_head_dim
    LQ, G, LO, GIN, W = cfg.q_lora_rank, cfg.o_groups, cfg.o_lora_rank, cfg.o_group_in, cfg.sliding_window
    BS, P, CP, TOPK, MAXPOS, NBLK, MIX = cfg.block_size, cfg.ori_kv_block_num, cfg.cmp_kv_block_num, \
        cfg.index_topk, cfg.max_position_embeddings, cfg.max_blocks_per_seq, cfg.mix_hc
    SP, page = cfg.hca_state_block_num, cfg.hca_state_block_size
    NST = MAXPOS // page
    NCC = sparse_attn_tiling(cfg).cmp_cols
    cap = token_capacity(cfg)
    swa = prefill_attention_swa_kernels(cfg)
    attn = prefill_sparse_attn_kernels(cfg).prefill_sparse_attn
    hc_post_prefill = hc_post_kernels(cfg).hc_post_prefill

    @pl.jit.inline
    def prefill_attention_hca(x_hc: pl.Tensor[[T_DYN, HC, D], pl.FP32],
                              hc_attn_fn: pl.Tensor[[MIX, HC * D], pl.FP32],
                              hc_attn_scale: pl.Tensor[[3], pl.FP32],
                              hc_attn_base: pl.Tensor[[MIX], pl.FP32],
                              attn_norm_w: pl.Tensor[[D], pl.BF16],
                              wq_a: pl.Tensor[[D, LQ], pl.BF16],
                              wq_b: pl.Tensor[[LQ, H * HD], weight_dtype(cfg)],
                              wq_b_scale: pl.Tensor[[H * HD], pl.FP32],
                              wkv: pl.Tensor[[D, HD], pl.BF16],
                              gamma_cq: pl.Tensor[[LQ], pl.BF16],
                              gamma_ckv: pl.Tensor[[HD], pl.BF16],
                              freqs_cos: pl.Tensor[[MAXPOS, R], pl.BF16],
                              freqs_sin: pl.Tensor[[MAXPOS, R], pl.BF16],
                              cmp_wkv: pl.Tensor[[HD, D], pl.BF16],
                              cmp_wgate: pl.Tensor[[HD, D], pl.BF16],
                              cmp_ape: pl.Tensor[[HCA_RATIO, HD], pl.FP32],
                              cmp_norm_w: pl.Tensor[[HD], pl.BF16],
                              compress_state: pl.InOut[pl.Tensor[[SP, page, 2 * HD], pl.FP32]],
                              state_block_table: pl.Tensor[[NST], pl.INT32],
                              kv_cache: pl.InOut[pl.Tensor[[P, BS, 1, HD], pl.BF16]],
                              block_table: pl.Tensor[[NBLK], pl.INT32],
                              ori_slot_mapping: pl.Tensor[[T_DYN], pl.INT64],
                              cmp_kv: pl.InOut[pl.Tensor[[CP, BS, 1, HD], pl.BF16]],
                              cmp_block_table: pl.Tensor[[CP], pl.INT32],
                              cmp_slot_mapping: pl.Tensor[[T_DYN], pl.INT64],
                              state_slot_mapping: pl.Tensor[[T_DYN], pl.INT64],
                              position_ids: pl.Tensor[[T_DYN], pl.INT32],
                              attn_sink: pl.Tensor[[H], pl.FP32],
                              wo_a: pl.Tensor[[G, LO, GIN], pl.BF16],
                              wo_b: pl.Tensor[[D, G * LO], weight_dtype(cfg)],
                              wo_b_scale: pl.Tensor[[D], pl.FP32],
                              x_out: pl.Out[pl.Tensor[[T_DYN, HC, D], pl.FP32]],
                              num_tokens: pl.Scalar[pl.INT32]):
        """Ratio-128 prefill attention sub-layer (pypto-lib `prefill_attention_hca.py`); returns ``(kv_cache, cmp_kv,
        compress_state, x_out)``."""
        t = pl.tensor.dim(x_hc, 0)
        active = check_num_tokens("prefill_attention_hca", num_tokens, t)
        f = attention_front(x_hc, hc_attn_fn, hc_attn_scale, hc_attn_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv,
                            gamma_cq, gamma_ckv,
                            lambda cos_t, sin_t: materialize_rope_rows(freqs_cos, freqs_sin, position_ids, num_tokens,
                                                                       cos_t, sin_t),
                            cfg, seed_scopes)
        swa_indices = pl.create_tensor([t, W], pl.INT32, capacity=cap)
        cmp_indices = pl.create_tensor([t, TOPK], pl.INT32, capacity=cap)
        attn_out = pl.create_tensor([t, D], pl.BF16, capacity=cap)
        swa.swa_cache_write(f.kv, ori_slot_mapping, num_tokens, kv_cache)
        prefill_compressor_ratio128(f.x_normed, compress_state, state_block_table, cmp_wkv, cmp_wgate, cmp_ape,
                                    cmp_norm_w, freqs_cos, freqs_sin, cmp_kv, position_ids, num_tokens,
                                    cmp_slot_mapping, state_slot_mapping, cfg, None, seed_scopes)
        swa.swa_window_indices(position_ids, block_table, num_tokens, swa_indices)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="prefill_hca_cmp_indices"):
            positions = pl.read_values(position_ids, [0], active)  # the active tokens' positions, one call
            rows = []
            for tok in pl.range(t):
                runs = []
                if tok < active:
                    n_vis = (positions[tok] + 1) // HCA_RATIO
                    if n_vis > NCC:
                        raise BindError(f"prefill_attention_hca: token {tok} sees {n_vis} compressed entries, the "
                                        f"sparse-attention core attends {NCC} (config {cfg.name!r})")
                    if n_vis > 0:
                        runs = [(0, 0, n_vis)]
                # pl.full(-1), then pl.arange(0, [1, n_vis]) at column 0 when the token sees an entry
                rows.append(pl.arange_runs([1, TOPK], pl.INT32, -1, runs))
            pl.store_rows(cmp_indices, list(range(t)), rows)  # row tok into cmp_indices[tok]: one store per row
        attn(f.q, kv_cache, swa_indices, cmp_kv, cmp_block_table, cmp_indices, attn_sink, num_tokens, f.rope_cos_t,
             f.rope_sin_t, wo_a, wo_b, wo_b_scale, attn_out)
        hc_post_prefill(attn_out, x_hc, f.post, f.comb, x_out, num_tokens)
        return kv_cache, cmp_kv, compress_state, x_out

    prefill_attention_hca_test = pl.jit.entry(prefill_attention_hca, name="prefill_attention_hca_test")
    return SimpleNamespace(cmp_cols=NCC, prefill_attention_hca=prefill_attention_hca,
                           prefill_attention_hca_test=prefill_attention_hca_test, seed_scopes=seed_scopes)


@pl.jit.inline
def prefill_attention_hca(x_hc: pl.Tensor, hc_attn_fn: pl.Tensor, hc_attn_scale: pl.Tensor, hc_attn_base: pl.Tensor,
                          attn_norm_w: pl.Tensor, wq_a: pl.Tensor, wq_b: pl.Tensor, wq_b_scale: pl.Tensor,
                          wkv: pl.Tensor, gamma_cq: pl.Tensor, gamma_ckv: pl.Tensor, freqs_cos: pl.Tensor,
                          freqs_sin: pl.Tensor, cmp_wkv: pl.Tensor, cmp_wgate: pl.Tensor, cmp_ape: pl.Tensor,
                          cmp_norm_w: pl.Tensor, compress_state: pl.InOut[pl.Tensor], state_block_table: pl.Tensor,
                          kv_cache: pl.InOut[pl.Tensor], block_table: pl.Tensor, ori_slot_mapping: pl.Tensor,
                          cmp_kv: pl.InOut[pl.Tensor], cmp_block_table: pl.Tensor, cmp_slot_mapping: pl.Tensor,
                          state_slot_mapping: pl.Tensor, position_ids: pl.Tensor, attn_sink: pl.Tensor,
                          wo_a: pl.Tensor, wo_b: pl.Tensor, wo_b_scale: pl.Tensor, x_out: pl.Out[pl.Tensor],
                          num_tokens: pl.Scalar[pl.INT32], cfg, seed_scopes: bool = False):
    """Stable inline signature ``prefill_attention_hca(x_hc, hc_attn_fn, hc_attn_scale,
    hc_attn_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq, gamma_ckv, freqs_cos,
    freqs_sin, cmp_wkv, cmp_wgate, cmp_ape, cmp_norm_w, compress_state, state_block_table,
    kv_cache, block_table, ori_slot_mapping, cmp_kv, cmp_block_table, cmp_slot_mapping,
    state_slot_mapping, position_ids, attn_sink, wo_a, wo_b, wo_b_scale, x_out, num_tokens, cfg,
    seed_scopes=False) -> (kv_cache, cmp_kv, compress_state, x_out)``: the body of
    :func:`prefill_attention_hca_kernels` (shapes and errors there)."""
    return prefill_attention_hca_kernels(cfg, seed_scopes).prefill_attention_hca(
        x_hc, hc_attn_fn, hc_attn_scale, hc_attn_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq,
        gamma_ckv, freqs_cos, freqs_sin, cmp_wkv, cmp_wgate, cmp_ape, cmp_norm_w, compress_state, state_block_table,
        kv_cache, block_table, ori_slot_mapping, cmp_kv, cmp_block_table, cmp_slot_mapping, state_slot_mapping,
        position_ids, attn_sink, wo_a, wo_b, wo_b_scale, x_out, num_tokens)
# ---- end kernel ----


def golden_prefill_cmp_indices(
    position_ids: torch.Tensor,  # [T] int32
    num_tokens: int,
    n_cols: int,
    cmp_cols: int | None = None,
) -> torch.Tensor:  # [T, n_cols] int32
    """Compressed candidates of a prefill HCA chunk: row ``t < num_tokens`` holds ``k`` for
    ``k < (pos + 1) // 128``, the rest and rows ``>= num_tokens`` are ``-1`` (pypto-lib `prefill_attention_hca.py`).

    Raises:
        BindError: a token with more visible entries than ``cmp_cols`` (default ``n_cols``).
    """
    pos = position_ids.long()
    n_vis = torch.where(torch.arange(pos.shape[0]) < int(num_tokens), (pos + 1) // HCA_RATIO, 0)
    limit = n_cols if cmp_cols is None else cmp_cols
    if bool((n_vis > limit).any()):
        raise BindError(f"golden_prefill_cmp_indices: a token sees {int(n_vis.max())} compressed entries, "
                        f"the core attends {limit}")
    k = torch.arange(n_cols)[None, :]
    return torch.where(k < n_vis[:, None], k, torch.full_like(k, -1)).to(torch.int32)


def golden_prefill_attention_hca(
    inputs: dict,
    cfg: DeepSeekV4Config,
    *,
    weight_format: str = "int8",
    float32: bool = False,
    return_intermediates: bool = False,
    blocking: str = "packed",
):
    """Golden of the ratio-128 prefill attention block (pypto-lib `models/deepseek/v4-flash/prefill_attention_hca.py`): the
    sub-goldens in kernel order (module docstring) -- ``golden_materialize_rope_rows``,
    ``golden_attention_front`` (hc_pre, RMSNorm, q / kv), the cache scatter,
    ``golden_prefill_compressor_ratio128`` on ``x_normed``, ``build_window_indices``,
    :func:`golden_prefill_cmp_indices`, ``golden_prefill_sparse_attn`` (limited to the
    ``cmp_cols`` the core attends), ``golden_hc_post_prefill``.

    Args:
        inputs: dict keyed by :data:`PREFILL_HCA_ARGS` plus ``num_tokens``; not modified.
        cfg: model config.
        weight_format: ``"int8"`` (the kernel) or ``"bf16"``.
        float32: parity mode (no BF16 rounding of intermediates; caches keep their dtypes).
        return_intermediates: also return ``{x_normed, q, kv, swa_indices, cmp_indices,
            attn_out}``.
        blocking: key tiling of ``golden_attention_core`` (``"packed"`` or ``"columns"``, the
            kernel's blocks). The two agree bit for bit here: a token sees a compressed entry
            only from position 127 on, where its window is full.

    Returns:
        ``(kv_cache, cmp_kv, compress_state, x_out)`` (+ the intermediates dict).

    Raises:
        BindError: a missing input, bad shapes, or an index outside its tensor.
    """
    missing = [k for k in PREFILL_HCA_ARGS + ("num_tokens",) if k not in inputs]
    if missing:
        raise BindError(f"golden_prefill_attention_hca: inputs missing {missing}")
    i = inputs
    nt = int(i["num_tokens"])
    T = i["x_hc"].shape[0]
    zeros = torch.zeros(T, cfg.qk_rope_head_dim, dtype=i["freqs_cos"].dtype)
    rope_cos, rope_sin = golden_materialize_rope_rows(i["freqs_cos"], i["freqs_sin"], i["position_ids"], nt, zeros,
                                                      zeros)
    f = golden_attention_front(i, rope_cos, rope_sin, cfg, weight_format=weight_format, float32=float32)
    x_normed, q, kv, post, comb = f["x_normed"], f["q"], f["kv"], f["post"], f["comb"]
    kv_cache = i["kv_cache"].clone()
    flat = kv_cache.view(-1, cfg.head_dim)
    slots = i["ori_slot_mapping"][:nt].long()
    for t in torch.nonzero(slots >= 0).flatten().tolist():  # token order: a repeated slot keeps the last
        flat[int(slots[t])] = kv[t].to(kv_cache.dtype)
    cmp_kv, state = golden_prefill_compressor_ratio128(
        x_normed, i["compress_state"], i["state_block_table"], i["cmp_wkv"], i["cmp_wgate"], i["cmp_ape"],
        i["cmp_norm_w"], i["freqs_cos"], i["freqs_sin"], i["cmp_kv"], i["position_ids"], nt, i["cmp_slot_mapping"],
        i["state_slot_mapping"], cfg)
    swa_indices = build_window_indices(i["position_ids"], nt, i["block_table"], cfg)
    cmp_cols = sparse_attn_tiling(cfg).cmp_cols
    cmp_indices = golden_prefill_cmp_indices(i["position_ids"], nt, cfg.index_topk, cmp_cols)
    attn_out = golden_prefill_sparse_attn(q, kv_cache, swa_indices, cmp_kv, i["cmp_block_table"], cmp_indices,
                                          i["attn_sink"], nt, rope_cos, rope_sin, i["wo_a"], i["wo_b"],
                                          i["wo_b_scale"], cfg, weight_format=weight_format,
                                          cmp_candidate_limit=cmp_cols, float32=float32, blocking=blocking)
    x_out = golden_hc_post_prefill(attn_out, i["x_hc"], post, comb, nt)
    if not return_intermediates:
        return kv_cache, cmp_kv, state, x_out
    return kv_cache, cmp_kv, state, x_out, {"x_normed": x_normed, "q": q, "kv": kv, "swa_indices": swa_indices,
                                            "cmp_indices": cmp_indices, "attn_out": attn_out}


def make_prefill_hca_inputs(
    cfg: DeepSeekV4Config,
    T: int,
    start_pos: int,
    num_tokens: int,
    seed: int,
    *,
    block_table: str = "identity",
    weight_format: str = "int8",
) -> dict:
    """Seeded fixture of the HCA prefill block: ``prefill_attention_swa.make_swa_inputs`` (the
    block's weights, ``x_hc``, the raw cache with the window before ``start_pos``, slots) with
    the compress RoPE profile, plus ``prefill_compressor_ratio128.make_compressor_inputs`` (seed
    + 2: compressor weights, the state of the open window before ``start_pos``, the state ring
    table, ``cmp_kv ~ N(0, 1)`` holding the entries before the chunk, slot mappings) and its
    compressed table ``permuted_block_table(cmp_kv_block_num, cmp_kv_block_num, offset=1)``.

    Returns:
        dict keyed by :data:`PREFILL_HCA_ARGS` plus ``num_tokens``.

    Raises:
        BindError: the fixture does not fit the pools (see the two builders).
    """
    d = make_swa_inputs(cfg, T, start_pos, num_tokens, seed, block_table=block_table, weight_format=weight_format)
    c = make_compressor_inputs(cfg, T, start_pos, num_tokens, seed + 2)
    cos, sin = rope_tables(cfg, "compress")
    d.update(freqs_cos=cos.to(torch.bfloat16), freqs_sin=sin.to(torch.bfloat16), cmp_wkv=c["wkv"],
             cmp_wgate=c["wgate"], cmp_ape=c["ape"], cmp_norm_w=c["norm_w"], compress_state=c["compress_state"],
             state_block_table=c["state_block_table"], cmp_kv=c["cmp_kv"],
             cmp_block_table=permuted_block_table(cfg.cmp_kv_block_num, cfg.cmp_kv_block_num, offset=1),
             cmp_slot_mapping=c["cmp_slot_mapping"], state_slot_mapping=c["state_slot_mapping"])
    return d


def build_case(preset: str, mode: str, **options) -> CaseRun:
    """Registry builder of ``prefill_attention_hca`` (pypto-lib `prefill_attention_hca.py`).

    Mode ``"prefill"`` (``T = prefill_seq``). Options: ``T``, ``start_pos`` (default 0),
    ``num_tokens`` (default ``T``), ``block_table`` (``"identity"`` / ``"permuted"``),
    ``seed_scopes``, ``seed``. Golden :func:`golden_prefill_attention_hca` (the kernel's column
    blocking); ``x_out``
    ``valid_ratio_reldiff(num_tokens, *TOLERANCES["x_out"])``, the caches ``ratio_allclose``.

    Raises:
        ConfigError: unknown preset, mode or option. BindError: a fixture the pools cannot hold.
    """
    cfg = get_config(preset)
    if mode != "prefill":
        raise ConfigError(f"prefill_attention_hca: unknown mode {mode!r}; modes: prefill")
    opts = dict(options)
    T = int(opts.pop("T", cfg.prefill_seq))
    start_pos = int(opts.pop("start_pos", 0))
    num_tokens = int(opts.pop("num_tokens", T))
    table = opts.pop("block_table", "identity")
    seed_scopes = bool(opts.pop("seed_scopes", False))
    seed = int(opts.pop("seed", 0))
    wf = str(opts.pop("weight_format", "int8"))  # "bf16": the unquantised kernels, same tolerances
    if opts:
        raise ConfigError(f"prefill_attention_hca: unknown options {sorted(opts)}")
    cfg = with_weight_format(cfg, wf)
    check_token_capacity("prefill_attention_hca", cfg, T)  # before any input is built
    k = prefill_attention_hca_kernels(cfg, seed_scopes)
    d = make_prefill_hca_inputs(cfg, T, start_pos, num_tokens, seed, block_table=table, weight_format=wf)
    outs = ("kv_cache", "cmp_kv", "compress_state")
    specs = [TensorSpec(n, list(d[n].shape), d[n].dtype, d[n], is_output=n in outs) for n in PREFILL_HCA_ARGS]
    specs.append(TensorSpec("x_out", list(d["x_hc"].shape), torch.float32, is_output=True))
    specs.append(ScalarSpec("num_tokens", torch.int32, num_tokens))

    def golden(v: dict) -> None:
        v["kv_cache"], v["cmp_kv"], v["compress_state"], v["x_out"] = golden_prefill_attention_hca(
            v, cfg, blocking="columns", weight_format=wf)

    compare = {"x_out": valid_ratio_reldiff(num_tokens, *TOLERANCES["x_out"])}
    compare.update({n: ratio_allclose(*TOLERANCES[n]) for n in outs})
    label = (f"prefill T={T} start_pos={start_pos} num_tokens={num_tokens} block_table={table}"
             + (" seed_scopes" if seed_scopes else "") + (" weight_format=bf16" if wf == "bf16" else ""))
    return CaseRun(fn=k.prefill_attention_hca_test, specs=specs, golden=golden, compare=compare, rtol=1e-2,
                   atol=1e-2, label=label)


register(KernelCase("prefill_attention_hca", build_case, modes=("prefill",), seed_variant=True,
                    description="ratio-128 prefill attention sub-layer (.. compressor .. sparse attn over window + "
                                "compressed rows .. hc_post_prefill), pypto-lib's prefill_attention_hca.py"))
