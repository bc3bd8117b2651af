"""Prefill sparse attention core with an attention sink, plus the grouped INT8 o-projection.

Math (v4flash-kernels.md B.4; dsv4-math.md 3, 4), per active token ``t`` (``t < num_tokens``):

    keys_t  = [ori_kv rows swa_indices[t, :] >= 0] ++ [cmp_kv rows of cmp_indices[t, :] >= 0]
    s_h,j   = (q[t, h] . k_j) * head_dim^-0.5                     # FP32
    o_h     = sum_j exp(s_h,j - m) * k_j / (sum_j exp(s_h,j - m) + exp(sink_h - m))
    o[..., n:] = inverse_rope(o[..., n:], cos[t], sin[t])         # rotate by -pos*w
    o_r[g]  = o[t, heads of g].flatten() @ wo_a[g]^T               # [G, o_lora]
    out     = sum_g dequant(int8(o_r[g]) @ wo_b[:, g]^T) * wo_b_scale  -> BF16

K = V = the gathered 512-wide (``head_dim``) rows; one shared kv head for all query heads
(MQA). The softmax runs as an online merge over key tiles of ``key_tile`` rows: per tile
``m_i = max s``, ``p = exp(s - m_i)`` (FP32), ``l_i = sum p`` (FP32), ``o_i = bf16(p) @ kv``;
tiles merge with ``alpha = exp(m - m_new)``, ``beta = exp(m_i - m_new)``; finally
``o = o / (l + exp(sink - m))``. A token with no valid key gets a zero row (never NaN).

Compressed slots are *logical*: slot ``s`` lives on page ``cmp_block_table[s // block_size]``
at row ``s % block_size`` (page size ``cfg.block_size``); a slot whose page index is past the
table or whose table entry is negative is skipped, as in the reference golden. ``swa_indices``
are *physical* flat rows of ``ori_kv``. Any negative index is invalid.

Quantisation (``weight_format="int8"``): ``wo_a`` BF16 grouped GEMM with FP32 accumulate;
``o_r`` quantised per token per group (``quantize_per_row_int8`` over ``o_lora``); ``wo_b`` INT8
per output row with scale ``wo_b_scale [D]``; integer GEMM, dequantised per group and summed in
group order. ``weight_format="bf16"``: ``o_r`` rounded to BF16 and multiplied by a float ``wo_b``
(no quantisation, ``wo_b_scale`` ignored).

Not modelled: the reference kernel's bias columns only cover the first 256 compressed
candidates (``cmp_indices[:, :256]``); pass ``cmp_candidate_limit=256`` to reproduce that.
"""

from __future__ import annotations

import math

import torch

from pto.errors import BindError
from pto.models.deepseek_v4.config import DeepSeekV4Config
from pto.models.deepseek_v4.qkv_proj_rope import (
    quantize_per_row_int8,
    quantize_weight_per_column,
    rope_interleaved,
)
from pto.models.deepseek_v4.rope import profile_for_ratio, rope_tables

__all__ = [
    "ATTN_KEY_TILE_MAX",
    "TOLERANCES",
    "attn_key_tile",
    "quantize_wo_b",
    "gather_key_rows",
    "golden_attention_core",
    "golden_grouped_o_proj",
    "golden_prefill_sparse_attn",
    "make_sparse_attn_inputs",
]

# Largest key tile of the online softmax (v4flash-kernels.md B.4 ATTN_TILE = 128).
ATTN_KEY_TILE_MAX = 128

# Compare functions per output as ratio_allclose (atol, rtol, max_error_ratio);
# v4flash-kernels.md B.4 / C.2 (run-level rtol=atol=1e-3 in the reference harness).
TOLERANCES: dict[str, tuple[float, float, float]] = {
    "attn_out": (1e-4, 1 / 128, 0.005),
}

# ---- kernel ----
# (The pto.language kernel goes here; the goldens below are its numerical contract.)
# ---- end kernel ----


def attn_key_tile(cfg: DeepSeekV4Config) -> int:
    """Key rows per online-softmax tile: ``min(ATTN_KEY_TILE_MAX, cfg.sliding_window)``.

    128 at FLASH (one window per tile, v4flash-kernels.md B.4), 64 at tiny.
    """
    return min(ATTN_KEY_TILE_MAX, cfg.sliding_window)


def _check(fn: str, name: str, t: torch.Tensor, shape: tuple[int, ...], kind: str) -> None:
    """Raise BindError unless ``t`` has ``shape`` and dtype kind float / int8 / int."""
    if kind == "float":
        ok = t.is_floating_point()
    elif kind == "int8":
        ok = t.dtype == torch.int8
    else:
        ok = t.dtype in (torch.int32, torch.int64)
    if tuple(t.shape) != tuple(shape) or not ok:
        raise BindError(f"{fn}: {name} must be a {kind} tensor of shape {list(shape)}, "
                        f"got {t.dtype} {list(t.shape)}")


def quantize_wo_b(
    wo_b: torch.Tensor,  # [D, G*o_lora] float
) -> tuple[torch.Tensor, torch.Tensor]:  # ([D, G*o_lora] int8, [D] fp32)
    """INT8 per-output-row quantisation of ``wo_b`` (v4flash-kernels.md section 0, B.4).

    Row ``d`` is output channel ``d``: ``scale[d] = max(max|wo_b[d, :]|, 1e-4) / 127``,
    codes ``clamp(round_half_even(wo_b / scale), -127, 127)``; the same rule as
    ``quantize_weight_per_column`` applied to ``wo_b^T``.

    Args:
        wo_b: ``[D, G*o_lora]`` float weight (``out = o_r @ wo_b^T``).

    Returns:
        ``(codes [D, G*o_lora] int8, scale [D] fp32)``.

    Raises:
        BindError: ``wo_b`` not a float rank-2 tensor.
    """
    if wo_b.dim() != 2 or not wo_b.is_floating_point():
        raise BindError(f"quantize_wo_b: wo_b must be a float [D, G*o_lora] tensor, "
                        f"got {wo_b.dtype} {list(wo_b.shape)}")
    codes_t, scale = quantize_weight_per_column(wo_b.t())
    return codes_t.t().contiguous(), scale


def gather_key_rows(
    swa_row: torch.Tensor,  # [window] int
    cmp_row: torch.Tensor,  # [n_cmp] int
    ori_flat: torch.Tensor,  # [pages*block_size, head_dim]
    cmp_flat: torch.Tensor,  # [cmp_pages*block_size, head_dim]
    cmp_block_table: torch.Tensor,  # [cmp_table_len] int
    block_size: int,
) -> torch.Tensor:  # [n_valid, head_dim], dtype of the caches
    """Gather one token's valid key rows: raw window rows first, then compressed rows.

    Order follows the index columns (swa columns, then cmp columns); negative entries are
    skipped. Compressed slot ``s`` maps to flat row
    ``cmp_block_table[s // block_size] * block_size + s % block_size``; slots whose page
    index is ``>= len(cmp_block_table)`` or whose table entry is negative are skipped.

    Raises:
        BindError: a raw row or a lowered compressed row outside its cache.
    """
    swa = swa_row.long()
    swa = swa[swa >= 0]
    if swa.numel() and int(swa.max()) >= ori_flat.shape[0]:
        raise BindError(f"gather_key_rows: swa index {int(swa.max())} outside ori_kv "
                        f"({ori_flat.shape[0]} rows)")
    slots = cmp_row.long()
    slots = slots[slots >= 0]
    page = slots // block_size
    slots, page = slots[page < cmp_block_table.shape[0]], page[page < cmp_block_table.shape[0]]
    phys_page = cmp_block_table.long()[page]
    keep = phys_page >= 0
    cmp_rows = phys_page[keep] * block_size + slots[keep] % block_size
    if cmp_rows.numel() and int(cmp_rows.max()) >= cmp_flat.shape[0]:
        raise BindError(f"gather_key_rows: compressed row {int(cmp_rows.max())} outside cmp_kv "
                        f"({cmp_flat.shape[0]} rows); check cmp_block_table")
    return torch.cat([ori_flat.index_select(0, swa), cmp_flat.index_select(0, cmp_rows)], dim=0)


def _online_softmax_with_sink(
    qh: torch.Tensor,  # [H, d] fp32
    keys: torch.Tensor,  # [n, d] fp32 (bf16 values)
    sink: torch.Tensor,  # [H] fp32
    scale: float,
    key_tile: int,
) -> torch.Tensor:  # [H, d] fp32
    """Tiled online softmax with a sink column, FP32 exp, BF16 probabilities for PV."""
    H, d = qh.shape
    if keys.shape[0] == 0:
        return torch.zeros(H, d, dtype=torch.float32)
    m = torch.full((H,), -math.inf, dtype=torch.float32)
    l = torch.zeros(H, dtype=torch.float32)
    o = torch.zeros(H, d, dtype=torch.float32)
    for k0 in range(0, keys.shape[0], key_tile):
        kt = keys[k0:k0 + key_tile]
        s = (qh @ kt.T) * scale  # [H, nt]
        m_i = s.amax(dim=-1)
        p = torch.exp(s - m_i[:, None])
        l_i = p.sum(dim=-1)
        o_i = p.to(torch.bfloat16).float() @ kt
        m_new = torch.maximum(m, m_i)
        alpha, beta = torch.exp(m - m_new), torch.exp(m_i - m_new)
        l = alpha * l + beta * l_i
        o = alpha[:, None] * o + beta[:, None] * o_i
        m = m_new
    return o / (l + torch.exp(sink - m))[:, None]


def _check_core_args(fn, q, ori_kv, swa_indices, cmp_kv, cmp_block_table, cmp_indices,
                     attn_sink, num_tokens, rope_cos, rope_sin, cfg) -> None:
    """Shape / dtype validation shared by the attention goldens (raises BindError)."""
    H, hd, r, bs = cfg.num_attention_heads, cfg.head_dim, cfg.qk_rope_head_dim, cfg.block_size
    if q.dim() != 3:
        raise BindError(f"{fn}: q must be [T, {H}, {hd}], got {list(q.shape)}")
    T = q.shape[0]
    _check(fn, "q", q, (T, H, hd), "float")
    if ori_kv.dim() != 4:
        raise BindError(f"{fn}: ori_kv must be [pages, {bs}, 1, {hd}], got {list(ori_kv.shape)}")
    _check(fn, "ori_kv", ori_kv, (ori_kv.shape[0], bs, 1, hd), "float")
    if swa_indices.dim() != 2:
        raise BindError(f"{fn}: swa_indices must be [T, window], got {list(swa_indices.shape)}")
    _check(fn, "swa_indices", swa_indices, (T, swa_indices.shape[1]), "int")
    if cmp_kv.dim() != 4:
        raise BindError(f"{fn}: cmp_kv must be [cmp_pages, {bs}, 1, {hd}], got {list(cmp_kv.shape)}")
    _check(fn, "cmp_kv", cmp_kv, (cmp_kv.shape[0], bs, 1, hd), "float")
    if cmp_block_table.dim() != 1:
        raise BindError(f"{fn}: cmp_block_table must be rank 1, got {list(cmp_block_table.shape)}")
    _check(fn, "cmp_block_table", cmp_block_table, tuple(cmp_block_table.shape), "int")
    if cmp_indices.dim() != 2:
        raise BindError(f"{fn}: cmp_indices must be [T, topk], got {list(cmp_indices.shape)}")
    _check(fn, "cmp_indices", cmp_indices, (T, cmp_indices.shape[1]), "int")
    _check(fn, "attn_sink", attn_sink, (H,), "float")
    _check(fn, "rope_cos", rope_cos, (T, r), "float")
    _check(fn, "rope_sin", rope_sin, (T, r), "float")
    if not 0 <= int(num_tokens) <= T:
        raise BindError(f"{fn}: num_tokens={num_tokens} outside [0, {T}]")


def golden_attention_core(
    q: torch.Tensor,  # [T, H, head_dim] bf16
    ori_kv: torch.Tensor,  # [pages, block_size, 1, head_dim] bf16
    swa_indices: torch.Tensor,  # [T, window] int32, physical flat rows, -1 invalid
    cmp_kv: torch.Tensor,  # [cmp_pages, block_size, 1, head_dim] bf16
    cmp_block_table: torch.Tensor,  # [cmp_pages] int32, logical page -> physical page
    cmp_indices: torch.Tensor,  # [T, index_topk] int32, logical compressed slots, -1 invalid
    attn_sink: torch.Tensor,  # [H] fp32
    num_tokens: int,
    rope_cos: torch.Tensor,  # [T, rope_dim] bf16 per-token rows (full-width duplicated)
    rope_sin: torch.Tensor,  # [T, rope_dim] bf16
    cfg: DeepSeekV4Config,
    *,
    key_tile: int | None = None,
    cmp_candidate_limit: int | None = None,
    out_bf16: bool = True,
) -> torch.Tensor:  # [T, H, head_dim] bf16 (fp32 if not out_bf16)
    """Sparse attention with sink and inverse RoPE, before the o-projection (B.4 steps 1-6).

    Per active token: :func:`gather_key_rows`, scores ``q . k * cfg.softmax_scale`` in FP32,
    online softmax over tiles of ``key_tile`` gathered rows with BF16-rounded probabilities
    for PV (see the module docstring), sink in the denominator, then inverse interleaved RoPE
    (``rope_interleaved(..., inverse=True)``: ``e' = e*cos + o*sin``, ``o' = o*cos - e*sin``)
    on the trailing ``qk_rope_head_dim`` channels with the token's own cos/sin row. The kernel
    stores the result BF16 (``o_packed``), hence ``out_bf16``. Rows ``t >= num_tokens`` are
    zero; a token with no valid key gets a zero row.

    Args:
        q: ``[T, H, head_dim]`` roped, per-head-normed queries (BF16; FP32 allowed).
        ori_kv: ``[pages, block_size, 1, head_dim]`` raw / SWA paged cache.
        swa_indices: ``[T, window]`` INT32/INT64 physical flat rows of ``ori_kv``; < 0 invalid.
        cmp_kv: ``[cmp_pages, block_size, 1, head_dim]`` compressed paged cache.
        cmp_block_table: ``[n]`` INT32 logical -> physical compressed page (< 0 = none).
        cmp_indices: ``[T, topk]`` INT32 logical compressed slots; < 0 invalid.
        attn_sink: ``[H]`` FP32 per-head sink logits.
        num_tokens: active prefix, ``0 <= num_tokens <= T``.
        rope_cos, rope_sin: ``[T, rope_dim]`` per-token rows (layer's profile).
        cfg: model config (``head_dim``, heads, ``qk_rope_head_dim``, ``block_size``,
            ``softmax_scale``, ``sliding_window``).
        key_tile: gathered rows per softmax tile; default :func:`attn_key_tile`.
        cmp_candidate_limit: only the first N columns of ``cmp_indices`` are considered
            (the reference kernel uses 256); default all.
        out_bf16: round to BF16 (RNE) as the kernel stores it; ``False`` keeps FP32.

    Returns:
        ``[T, H, head_dim]`` attention output after inverse RoPE.

    Raises:
        BindError: wrong shapes / dtypes, ``num_tokens`` out of range, or an index outside
            its cache.
    """
    fn = "golden_attention_core"
    _check_core_args(fn, q, ori_kv, swa_indices, cmp_kv, cmp_block_table, cmp_indices,
                     attn_sink, num_tokens, rope_cos, rope_sin, cfg)
    T, H, hd = q.shape
    n = cfg.nope_head_dim
    tile = attn_key_tile(cfg) if key_tile is None else int(key_tile)
    if tile <= 0:
        raise BindError(f"{fn}: key_tile must be positive, got {key_tile}")
    ori_flat = ori_kv.reshape(-1, hd).float()
    cmp_flat = cmp_kv.reshape(-1, hd).float()
    cmp_cols = cmp_indices if cmp_candidate_limit is None else cmp_indices[:, :cmp_candidate_limit]
    sink = attn_sink.float()
    out = torch.zeros(T, H, hd, dtype=torch.float32)
    for t in range(int(num_tokens)):
        keys = gather_key_rows(swa_indices[t], cmp_cols[t], ori_flat, cmp_flat,
                               cmp_block_table, cfg.block_size)
        out[t] = _online_softmax_with_sink(q[t].float(), keys, sink, cfg.softmax_scale, tile)
    nt = int(num_tokens)
    if nt:
        out[:nt, :, n:] = rope_interleaved(out[:nt, :, n:], rope_cos[:nt], rope_sin[:nt], inverse=True)
    return out.to(torch.bfloat16) if out_bf16 else out


def golden_grouped_o_proj(
    o: torch.Tensor,  # [T, H, head_dim] bf16 (attention output after inverse RoPE)
    wo_a: torch.Tensor,  # [o_groups, o_lora, o_group_in] bf16
    wo_b: torch.Tensor,  # [D, o_groups*o_lora] int8 ("int8") | float ("bf16")
    wo_b_scale: torch.Tensor | None,  # [D] fp32 ("int8"); ignored for "bf16"
    cfg: DeepSeekV4Config,
    *,
    weight_format: str = "int8",
    out_bf16: bool = True,
) -> torch.Tensor:  # [T, D] bf16 (fp32 if not out_bf16)
    """Grouped output projection (v4flash-kernels.md B.4 step 7-8; dsv4-math.md 4).

    ``o`` is viewed ``[T, G, (H/G)*head_dim]`` (group g = consecutive heads, head-major);
    ``o_r[t, g] = o[t, g] @ wo_a[g]^T`` in FP32. ``"int8"``: ``codes, s = quantize_per_row_int8
    (o_r)`` per (token, group); ``out = sum_g float(codes[t, g] @ wo_b[:, g]^T) * s[t, g]``
    (integer GEMM exact, groups summed in order, FP32) then ``* wo_b_scale``. ``"bf16"``:
    ``out = bf16(o_r).flatten() @ wo_b^T`` in FP32.

    Args:
        o: ``[T, H, head_dim]`` float (the kernel's BF16 ``o_packed``).
        wo_a: ``[G, o_lora, o_group_in]`` float.
        wo_b: ``[D, G*o_lora]`` INT8 codes per output row, or float for ``"bf16"``.
        wo_b_scale: ``[D]`` FP32 (``"int8"`` only).
        cfg: model config.
        weight_format: ``"int8"`` or ``"bf16"``.
        out_bf16: BF16 (RNE) output; ``False`` keeps FP32.

    Returns:
        ``[T, D]`` projection output.

    Raises:
        BindError: unknown ``weight_format`` or wrong shapes / dtypes.
    """
    fn = "golden_grouped_o_proj"
    if weight_format not in ("int8", "bf16"):
        raise BindError(f"{fn}: weight_format must be 'int8' or 'bf16', got {weight_format!r}")
    G, Lo, gin, D = cfg.o_groups, cfg.o_lora_rank, cfg.o_group_in, cfg.hidden_size
    H, hd = cfg.num_attention_heads, cfg.head_dim
    if o.dim() != 3:
        raise BindError(f"{fn}: o must be [T, {H}, {hd}], got {list(o.shape)}")
    T = o.shape[0]
    _check(fn, "o", o, (T, H, hd), "float")
    _check(fn, "wo_a", wo_a, (G, Lo, gin), "float")
    _check(fn, "wo_b", wo_b, (D, G * Lo), "int8" if weight_format == "int8" else "float")
    o_r = torch.einsum("tgk,gok->tgo", o.float().reshape(T, G, gin), wo_a.float())  # [T, G, Lo]
    if weight_format == "bf16":
        out = o_r.to(torch.bfloat16).float().reshape(T, G * Lo) @ wo_b.float().T
    else:
        if wo_b_scale is None:
            raise BindError(f"{fn}: wo_b_scale [{D}] is required for weight_format='int8'")
        _check(fn, "wo_b_scale", wo_b_scale, (D,), "float")
        codes, act_scale = quantize_per_row_int8(o_r)  # [T, G, Lo] int8, [T, G, 1]
        w = wo_b.double().reshape(D, G, Lo)
        out = torch.zeros(T, D, dtype=torch.float32)
        for g in range(G):
            partial = (codes[:, g].double() @ w[:, g].T).float()  # exact integer sums
            out = out + partial * act_scale[:, g]
        out = out * wo_b_scale.float()
    return out.to(torch.bfloat16) if out_bf16 else out


def golden_prefill_sparse_attn(
    q: torch.Tensor,  # [T, H, head_dim] bf16
    ori_kv: torch.Tensor,  # [pages, block_size, 1, head_dim] bf16
    swa_indices: torch.Tensor,  # [T, window] int32 physical rows, -1 invalid
    cmp_kv: torch.Tensor,  # [cmp_pages, block_size, 1, head_dim] bf16
    cmp_block_table: torch.Tensor,  # [cmp_pages] int32
    cmp_indices: torch.Tensor,  # [T, index_topk] int32 logical slots, -1 invalid
    attn_sink: torch.Tensor,  # [H] fp32
    num_tokens: int,
    rope_cos: torch.Tensor,  # [T, rope_dim] bf16
    rope_sin: torch.Tensor,  # [T, rope_dim] bf16
    wo_a: torch.Tensor,  # [o_groups, o_lora, o_group_in] bf16
    wo_b: torch.Tensor,  # [D, o_groups*o_lora] int8 (bf16 for weight_format="bf16")
    wo_b_scale: torch.Tensor | None,  # [D] fp32
    cfg: DeepSeekV4Config,
    *,
    weight_format: str = "int8",
    out_bf16: bool = True,
    key_tile: int | None = None,
    cmp_candidate_limit: int | None = None,
) -> torch.Tensor:  # [T, D] bf16 (fp32 if not out_bf16)
    """Prefill sparse attention + grouped o-projection golden (v4flash-kernels.md B.4).

    :func:`golden_attention_core` (BF16, as the kernel's ``o_packed``) followed by
    :func:`golden_grouped_o_proj`; rows ``t >= num_tokens`` of the result are zero.
    Arguments are those of the two parts (same names); see their docstrings.

    Returns:
        ``attn_out [T, D]`` BF16 (FP32 when ``out_bf16`` is False).

    Raises:
        BindError: see the two parts.
    """
    o = golden_attention_core(q, ori_kv, swa_indices, cmp_kv, cmp_block_table, cmp_indices,
                              attn_sink, num_tokens, rope_cos, rope_sin, cfg, key_tile=key_tile,
                              cmp_candidate_limit=cmp_candidate_limit, out_bf16=True)
    out = golden_grouped_o_proj(o, wo_a, wo_b, wo_b_scale, cfg, weight_format=weight_format,
                                out_bf16=out_bf16)
    out[int(num_tokens):] = 0
    return out


def make_sparse_attn_inputs(
    cfg: DeepSeekV4Config,
    T: int,
    num_tokens: int,
    seed: int,
    *,
    compress_ratio: int = 4,
    weight_format: str = "int8",
) -> dict[str, torch.Tensor | int]:
    """Seeded standalone fixture for :func:`golden_prefill_sparse_attn`.

    Token ``t`` sits at position ``sliding_window + t`` (a full window behind it) with an
    identity raw block table; ``swa_indices[t]`` holds that token's ``window`` keys
    ``pos-window+1 .. pos`` as physical rows (every column valid). Compressed candidates:
    ``n_cmp = 0`` for ratio 0, else ``min(index_topk, max(1, T // ratio))`` distinct random
    logical slots below ``n_cmp * 2`` per token (rest -1), through the permuted table
    ``cmp_block_table[b] = (b * 5 + 1) % cmp_pages`` (5 is coprime with every pool size
    used). ``q``, ``ori_kv``, ``cmp_kv`` ~ N(0, 1) (the kernels see RMS-normed rows);
    ``attn_sink`` ~ U(-1, 1); ``wo_a`` / ``wo_b`` ~ U(-1, 1) * fan_in^-0.5, ``wo_b``
    quantised per row for ``"int8"``; cos/sin rows from the ratio's RoPE profile, BF16.
    Rows ``t >= num_tokens`` of ``q`` are zero.

    Returns:
        dict keyed by the golden's argument names (``num_tokens`` as int).

    Raises:
        BindError: ``T`` not positive, ``num_tokens`` outside ``[0, T]``, pools too small.
        ConfigError: unknown compress ratio.
    """
    fn = "make_sparse_attn_inputs"
    if T <= 0 or not 0 <= num_tokens <= T:
        raise BindError(f"{fn}: need T > 0 and 0 <= num_tokens <= T, got T={T}, num_tokens={num_tokens}")
    profile = profile_for_ratio(compress_ratio)
    H, hd, bs, W = cfg.num_attention_heads, cfg.head_dim, cfg.block_size, cfg.sliding_window
    G, Lo, gin, D = cfg.o_groups, cfg.o_lora_rank, cfg.o_group_in, cfg.hidden_size
    pages, cpages = cfg.ori_kv_block_num, cfg.cmp_kv_block_num
    if W + T > pages * bs:
        raise BindError(f"{fn}: window {W} + T {T} positions exceed the raw pool ({pages * bs} rows)")
    gen = torch.Generator().manual_seed(seed)
    bf16 = torch.bfloat16
    q = torch.randn(T, H, hd, generator=gen)
    q[num_tokens:] = 0
    ori_kv = torch.randn(pages, bs, 1, hd, generator=gen)
    cmp_kv = torch.randn(cpages, bs, 1, hd, generator=gen)
    pos = W + torch.arange(T)
    swa = (pos[:, None] - W + 1 + torch.arange(W)[None, :]).to(torch.int32)  # identity table
    n_cmp = 0 if compress_ratio == 0 else min(cfg.index_topk, max(1, T // compress_ratio))
    if 2 * n_cmp > cpages * bs:
        raise BindError(f"{fn}: {2 * n_cmp} compressed slots exceed the pool ({cpages * bs})")
    cmp_indices = torch.full((T, cfg.index_topk), -1, dtype=torch.int32)
    for t in range(T):
        if n_cmp:
            cmp_indices[t, :n_cmp] = torch.randperm(2 * n_cmp, generator=gen)[:n_cmp].to(torch.int32)
    cmp_block_table = ((torch.arange(cpages) * 5 + 1) % cpages).to(torch.int32)
    attn_sink = torch.rand(H, generator=gen) * 2 - 1
    wo_a = (torch.rand(G, Lo, gin, generator=gen) * 2 - 1) * gin ** -0.5
    wo_b_f = (torch.rand(D, G * Lo, generator=gen) * 2 - 1) * (G * Lo) ** -0.5
    if weight_format == "int8":
        wo_b, wo_b_scale = quantize_wo_b(wo_b_f)
    elif weight_format == "bf16":
        wo_b, wo_b_scale = wo_b_f.to(bf16), torch.ones(D, dtype=torch.float32)
    else:
        raise BindError(f"{fn}: weight_format must be 'int8' or 'bf16', got {weight_format!r}")
    cos_tab, sin_tab = rope_tables(cfg, profile, max_pos=W + T)
    return {
        "q": q.to(bf16), "ori_kv": ori_kv.to(bf16), "swa_indices": swa,
        "cmp_kv": cmp_kv.to(bf16), "cmp_block_table": cmp_block_table, "cmp_indices": cmp_indices,
        "attn_sink": attn_sink, "num_tokens": int(num_tokens),
        "rope_cos": cos_tab[pos].to(bf16), "rope_sin": sin_tab[pos].to(bf16),
        "wo_a": wo_a.to(bf16), "wo_b": wo_b, "wo_b_scale": wo_b_scale,
    }
