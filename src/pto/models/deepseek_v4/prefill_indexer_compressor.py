"""Lightning-indexer key compressor (ratio 4, overlapping), prefill: INT8 key cache with scales.

Math (pypto-lib `models/deepseek/v4-flash/decode_indexer_compressor.py`, `prefill_indexer_compressor.py`; transformers `models/deepseek_v4/modeling_deepseek_v4.py`): the ratio-4 core of
:mod:`prefill_compressor_ratio4` at width ``c = index_head_dim`` (state ``[pages, 4, 4c]``,
``wkv`` / ``wgate [2c, D]``, ``ape [4, 2c]``, RMSNorm over ``c``, RoPE on the last
``qk_rope_head_dim`` channels at ``4w``), then per entry:

    k      = bf16(bf16(entry) @ hadamard)                   # [c] (BF16 x BF16 -> FP32 -> BF16)
    q8, s  = int8 per row of k: s = 127 / max(|k|, 1e-4), q8 = int8(fp16(rint(k * s)))
    idx_kv_cache[row] = q8 ; idx_kv_scale[row] = 1 / s

The Hadamard is orthonormal in the model (a rotation of both the index queries and keys leaves
``q . k`` unchanged; transformers applies none, transformers `models/deepseek_v4/modeling_deepseek_v4.py`), so the unquantised FP32
golden mode (``float32=True``) stores ``entry @ hadamard`` unrounded with scale 1.

Kernel: tasks 1-5 of the core named ``prefill_idx_c4_*``, then ``at``
``prefill_idx_c4_kv_hadamard`` (the ``[W_pad, c] @ hadamard`` product of all write slots) and
``at`` ``prefill_idx_c4_cache_write`` (per-row INT8 quantisation, cache row and scale writes for
slots with a destination). Deviations: the reference's test-only ``kv [32, 128] INT8``
extraction task is not built (the cache rows are the output); the ``keep-alive`` self-copies
of empty write slots are not needed (the CPU runtime orders the tasks by their footprints).
"""

import functools

import torch

import pto.language as pl
from pto.errors import BindError
from pto.golden import CaseRun, KernelCase, register
from pto.models.deepseek_v4.config import DeepSeekV4Config
from pto.models.deepseek_v4.prefill_compressor_ratio4 import (
    CSA_RATIO,
    CSA_STATE_PAGE,
    CSA_STATE_PAGES,
    _table_dims,
    golden_ratio4_compress,
    prefill_case_tokens,
    ratio4_case,
    ratio4_compress_tasks,
    ratio4_fixture,
    ratio4_tiling,
)
from pto.models.deepseek_v4.weight_format import act_dtype, is_bf16, with_weight_format
from pto.models.deepseek_v4.qkv_proj_rope import int8_quantize_rows, quantize_per_row_int8

__all__ = ["TOLERANCES", "IDX_KV_BLOCK_NUM", "indexer_cache_write", "indexer_compressor_inline",
           "indexer_compressor_entry", "prefill_indexer_compressor", "prefill_indexer_compressor_entry", "golden_indexer_keys", "golden_prefill_indexer_compressor",
           "random_hadamard", "indexer_cache_inputs", "make_prefill_indexer_compressor_inputs",
           "build_prefill_indexer_compressor"]

IDX_KV_BLOCK_NUM = 64  # indexer key-cache pages (pypto-lib `models/deepseek/v4-flash/config.py`, IDX_KV_BLOCK_NUM)

# ratio_allclose (atol, rtol, max_error_ratio) per output (pypto-lib `models/deepseek/v4-flash/prefill_indexer_compressor.py`; the pypto-lib tests' tolerances)
TOLERANCES: dict[str, tuple[float, float, float]] = {
    "idx_kv_cache": (1, 0, 0.01),
    "idx_kv_scale": (1e-4, 1 / 128, 0.01),
    "compress_state": (1e-3, 1e-3, 0.0),
}
# weight_format="bf16": BF16 keys within one BF16 ulp on 1 % of the rows' elements, unit scales
BF16_TOLERANCES: dict[str, tuple[float, float, float]] = {
    "idx_kv_cache": (1e-3, 1 / 128, 0.01),
    "idx_kv_scale": (0.0, 0.0, 0.0),
    "compress_state": (1e-3, 1e-3, 0.0),
}

# ---- kernel ----
T_DYN = pl.dynamic("T")
D_DYN = pl.dynamic("D")
STATE_PAGES_DYN = pl.dynamic("STATE_PAGES")
ROPE_ROWS_DYN = pl.dynamic("ROPE_ROWS")
IDX_PAGES_DYN = pl.dynamic("IDX_PAGES")


def indexer_cache_write(normed_kv_pad, write_dst_map, n_writes: int, hadamard, idx_kv_cache, idx_kv_scale,
                        width: int, pad_capacity: int, prefix: str):
    """Finalize of the indexer compressor (module docstring): ``<prefix>_kv_hadamard`` and
    ``<prefix>_cache_write`` tasks over the ``[W_pad, width]`` FP32 pad of
    :func:`prefill_compressor_ratio4.ratio4_compress_tasks`. Writes the INT8 row and its FP32
    dequant scale of every write slot with a destination into the flat rows of
    ``idx_kv_cache [pages, bs, 1, width] INT8`` / ``idx_kv_scale [pages, bs, 1, 1] FP32``;
    ``pad_capacity`` bounds the pad rows (``Ratio4Tiling.pad_capacity``). With a BF16
    ``idx_kv_cache`` (weight_format "bf16") the BF16 rotated row itself is written and its
    scale is 1."""
    w_pad = normed_kv_pad.shape[0]
    bf16 = idx_kv_cache.dtype == pl.BF16
    n_rows = idx_kv_cache.shape[0] * idx_kv_cache.shape[1]
    cache_rows = pl.reshape(idx_kv_cache, [n_rows, width])
    scale_rows = pl.reshape(idx_kv_scale, [n_rows, 1])
    rotated = pl.create_tensor([w_pad, width], pl.FP32, capacity=[pad_capacity])
    with pl.at(level=pl.Level.CORE_GROUP, name_hint=f"{prefix}_kv_hadamard"):
        k_bf16 = pl.cast(normed_kv_pad[0:w_pad, 0:width], pl.BF16, mode="rint")
        rotated[0:w_pad, 0:width] = pl.matmul(k_bf16, hadamard[0:width, 0:width])
    with pl.at(level=pl.Level.CORE_GROUP, name_hint=f"{prefix}_cache_write"):
        k = pl.cast(rotated[0:w_pad, 0:width], pl.BF16, mode="rint")
        if bf16:  # unquantised keys, unit scale
            codes, dq = k, None
        else:
            codes, s = int8_quantize_rows(pl.cast(k, pl.FP32))
            dq = pl.recip(s)
        kept = [(i, dst) for i, dst in enumerate(pl.read_values(write_dst_map, [0, 0], n_writes)) if dst >= 0]
        rows, slots = [dst for _, dst in kept], [i for i, _ in kept]
        pl.store_rows(cache_rows, rows, codes, 0, src_rows=slots)  # one row store per kept slot
        # a [1, 1] store is below the DMA minimum: one scalar store per kept slot (pl.write of the
        # scale, a [1, 1] element store; pl.store_rows of dq's rows records the same)
        if dq is None:
            for dst in rows:
                pl.write(scale_rows, [dst, 0], 1.0)
        else:
            pl.store_rows(scale_rows, rows, dq, 0, src_rows=slots)


def _check_idx_cache(kernel: str, cache, scale, cfg) -> None:
    want = [cache.shape[0], cfg.block_size, 1, cfg.index_head_dim]
    if list(cache.shape) != want or list(scale.shape) != want[:3] + [1]:
        raise BindError(f"kernel {kernel}: idx_kv_cache {list(cache.shape)} / idx_kv_scale {list(scale.shape)} "
                        f"must be {want} / {want[:3] + [1]}")


def indexer_compressor_inline(mode: str):
    """The ``@pl.jit.inline`` indexer key compressor of ``mode`` (``prefill_indexer_compressor``
    / ``decode_indexer_compressor``): one body, the table shape and task prefix per mode."""
    name, prefix = f"{mode}_indexer_compressor", f"{mode}_idx_c4"

    @pl.jit.inline
    def indexer_compressor(
        x: pl.Tensor[[T_DYN, D_DYN], pl.BF16],
        compress_state: pl.InOut[pl.Tensor],
        state_block_table: pl.Tensor[_table_dims(mode), pl.INT32],
        wkv: pl.Tensor,
        wgate: pl.Tensor,
        ape: pl.Tensor,
        norm_w: pl.Tensor,
        cos_table: pl.Tensor,
        sin_table: pl.Tensor,
        hadamard: pl.Tensor,
        idx_kv_cache: pl.InOut[pl.Tensor],
        idx_kv_scale: pl.InOut[pl.Tensor],
        position_ids: pl.Tensor[[T_DYN], pl.INT32],
        num_tokens: pl.Scalar[pl.INT32],
        idx_slot_mapping: pl.Tensor[[T_DYN], pl.INT64],
        state_slot_mapping: pl.Tensor[[T_DYN], pl.INT64],
        cfg,
        max_cmp_writes=None,
    ):
        """Indexer key compressor over one call (pypto-lib `models/deepseek/v4-flash/prefill_indexer_compressor.py` prefill / `decode_indexer_compressor.py` decode,
        generalised).

        Shapes (``c = index_head_dim``): compress_state ``[pages, 4, 4c]`` FP32;
        state_block_table ``[L]`` INT32 (prefill) or ``[B, L]`` (decode); wkv / wgate ``[2c, D]``
        BF16; ape ``[4, 2c]`` FP32; norm_w ``[c]`` BF16; cos / sin ``[P, r]`` BF16 compress
        tables; hadamard ``[c, c]`` BF16; idx_kv_cache ``[pages, block_size, 1, c]`` INT8;
        idx_kv_scale ``[pages, block_size, 1, 1]`` FP32; idx_slot_mapping: flat key-cache row of
        a closing token (``-1`` = none).

        Returns:
            ``(idx_kv_cache, idx_kv_scale, compress_state)``.

        Raises:
            ConfigError, BindError, CapacityError: see
            :func:`prefill_compressor_ratio4.ratio4_compress_tasks`; BindError for cache shapes.
        """
        c = cfg.index_head_dim
        tl = ratio4_tiling(cfg, c, max_cmp_writes)
        _check_idx_cache(name, idx_kv_cache, idx_kv_scale, cfg)
        table2 = pl.reshape(state_block_table, [1, pl.tensor.dim(state_block_table, 0)]) if mode == "prefill" \
            else state_block_table
        normed, dst_map, n_writes = ratio4_compress_tasks(
            x, compress_state, table2, wkv, wgate, ape, norm_w, cos_table, sin_table, position_ids, num_tokens,
            idx_slot_mapping, state_slot_mapping, idx_kv_cache.shape[0] * idx_kv_cache.shape[1], cfg, tl, prefix)
        indexer_cache_write(normed, dst_map, n_writes, hadamard, idx_kv_cache, idx_kv_scale, c, tl.pad_capacity,
                            prefix)
        return idx_kv_cache, idx_kv_scale, compress_state

    indexer_compressor.__name__ = indexer_compressor.__qualname__ = name
    return indexer_compressor


prefill_indexer_compressor = indexer_compressor_inline("prefill")


@functools.lru_cache(maxsize=None)
def indexer_compressor_entry(cfg: DeepSeekV4Config, mode: str, max_cmp_writes: int | None = None):
    """The ``@pl.jit`` test entry ``<mode>_indexer_compressor_test`` (parameters of
    :func:`indexer_compressor_inline`, model dims static); returns ``(idx_kv_cache,
    idx_kv_scale, compress_state)``.

    Raises:
        ConfigError: ``cfg`` cannot be tiled, or an unknown mode.
    """
    c = cfg.index_head_dim
    tl = ratio4_tiling(cfg, c, max_cmp_writes)
    D, r, bs = cfg.hidden_size, cfg.qk_rope_head_dim, cfg.block_size
    body = indexer_compressor_inline(mode)
    KD = act_dtype(cfg)  # INT8 key cache, BF16 for weight_format "bf16"

    @pl.jit
    def indexer_compressor_test(
        x: pl.Tensor[[T_DYN, D], pl.BF16],
        compress_state: pl.InOut[pl.Tensor[[STATE_PAGES_DYN, CSA_STATE_PAGE, 4 * c], pl.FP32]],
        state_block_table: pl.Tensor[_table_dims(mode), pl.INT32],
        wkv: pl.Tensor[[2 * c, D], pl.BF16],
        wgate: pl.Tensor[[2 * c, D], pl.BF16],
        ape: pl.Tensor[[CSA_RATIO, 2 * c], pl.FP32],
        norm_w: pl.Tensor[[c], pl.BF16],
        cos_table: pl.Tensor[[ROPE_ROWS_DYN, r], pl.BF16],
        sin_table: pl.Tensor[[ROPE_ROWS_DYN, r], pl.BF16],
        hadamard: pl.Tensor[[c, c], pl.BF16],
        idx_kv_cache: pl.InOut[pl.Tensor[[IDX_PAGES_DYN, bs, 1, c], KD]],
        idx_kv_scale: pl.InOut[pl.Tensor[[IDX_PAGES_DYN, bs, 1, 1], pl.FP32]],
        position_ids: pl.Tensor[[T_DYN], pl.INT32],
        num_tokens: pl.Scalar[pl.INT32],
        idx_slot_mapping: pl.Tensor[[T_DYN], pl.INT64],
        state_slot_mapping: pl.Tensor[[T_DYN], pl.INT64],
    ):
        return body(x, compress_state, state_block_table, wkv, wgate, ape, norm_w, cos_table, sin_table, hadamard,
                    idx_kv_cache, idx_kv_scale, position_ids, num_tokens, idx_slot_mapping, state_slot_mapping, cfg,
                    tl.max_cmp_writes)

    indexer_compressor_test.__name__ = indexer_compressor_test.__qualname__ = f"{mode}_indexer_compressor_test"
    return indexer_compressor_test


def prefill_indexer_compressor_entry(cfg: DeepSeekV4Config, max_cmp_writes: int | None = None):
    """:func:`indexer_compressor_entry` of mode ``prefill``."""
    return indexer_compressor_entry(cfg, "prefill", max_cmp_writes)
# ---- end kernel ----


def golden_indexer_keys(
    entries: torch.Tensor,  # [W, c] fp32 pooled, normed, rotated entries
    hadamard: torch.Tensor,  # [c, c] bf16
    float32: bool = False,
    weight_format: str = "int8",
) -> tuple[torch.Tensor, torch.Tensor]:  # ([W, c] int8 / bf16 / fp32, [W, 1] fp32)
    """Index keys of compressed entries (module docstring): BF16 Hadamard product rounded to
    BF16, then per-row INT8 (:func:`quantize_per_row_int8`); ``weight_format="bf16"``: the BF16
    row itself with scale 1; ``float32``: the FP32 product, unquantised, with scale 1."""
    if float32:
        return entries.float() @ hadamard.float(), torch.ones(entries.shape[0], 1)
    k = (entries.to(torch.bfloat16).double() @ hadamard.double()).float().to(torch.bfloat16)
    if weight_format == "bf16":
        return k, torch.ones(entries.shape[0], 1)
    return quantize_per_row_int8(k.float())


def golden_prefill_indexer_compressor(
    x: torch.Tensor,  # [T, D] bf16
    compress_state: torch.Tensor,  # [pages, 4, 4*index_head_dim] fp32
    state_block_table: torch.Tensor,  # [L] int32 ([B, L] in decode)
    wkv: torch.Tensor,  # [2c, D] bf16
    wgate: torch.Tensor,  # [2c, D] bf16
    ape: torch.Tensor,  # [4, 2c] fp32
    norm_w: torch.Tensor,  # [c] bf16
    cos_table: torch.Tensor,  # [P, r] bf16
    sin_table: torch.Tensor,  # [P, r] bf16
    hadamard: torch.Tensor,  # [c, c] bf16
    idx_kv_cache: torch.Tensor,  # [pages, bs, 1, c] int8 (fp32 in float32 mode)
    idx_kv_scale: torch.Tensor,  # [pages, bs, 1, 1] fp32
    position_ids: torch.Tensor,  # [T] int32
    num_tokens: int,
    idx_slot_mapping: torch.Tensor,  # [T] int64
    state_slot_mapping: torch.Tensor,  # [T] int64
    cfg: DeepSeekV4Config,
    weight_format: str = "int8",
    float32: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # (idx_kv_cache, idx_kv_scale, compress_state)
    """Indexer key compressor golden (transformers `models/deepseek_v4/modeling_deepseek_v4.py`; `prefill_indexer_compressor.py`), vectorised: the ratio-4 core
    golden at width ``index_head_dim`` then :func:`golden_indexer_keys`. ``float32`` (parity
    mode) keeps the keys unquantised in an FP32 ``idx_kv_cache`` (scale 1);
    ``weight_format="bf16"`` writes the BF16 keys (scale 1) into a BF16 cache, as the bf16
    kernel; ``"int8"`` the INT8 codes and their scales. Works for
    prefill (``[L]`` table) and decode (``[B, L]``) alike; the inputs are not modified.

    Returns:
        updated copies ``(idx_kv_cache, idx_kv_scale, compress_state)``.

    Raises:
        BindError: see :func:`prefill_compressor_ratio4.golden_ratio4_compress`.
    """
    entries, dst, state_out = golden_ratio4_compress(
        x, compress_state, state_block_table, wkv, wgate, ape, norm_w, cos_table, sin_table, position_ids,
        num_tokens, idx_slot_mapping, state_slot_mapping, cfg, "golden_prefill_indexer_compressor", float32)
    keys, scale = golden_indexer_keys(entries, hadamard, float32, weight_format)
    cache, scales = idx_kv_cache.clone(), idx_kv_scale.clone()
    cache.view(-1, cache.shape[-1])[dst] = keys.to(cache.dtype)
    scales.view(-1, 1)[dst] = scale.to(scales.dtype)
    return cache, scales, state_out


def random_hadamard(c: int, gen: torch.Generator) -> torch.Tensor:  # [c, c] bf16
    """The fixtures' stand-in Hadamard (pypto-lib `decode_indexer_compressor.py`): ``U(0, 1) * c^-0.5`` BF16 (not orthonormal)."""
    return (torch.rand(c, c, generator=gen) * c ** -0.5).to(torch.bfloat16)


def indexer_cache_inputs(f: dict, cfg: DeepSeekV4Config, seed: int, pages: int = IDX_KV_BLOCK_NUM) -> dict:
    """Turn a :func:`ratio4_fixture` dict at width ``index_head_dim`` into indexer-compressor
    inputs: ``idx_slot_mapping`` (the fixture's compressed rows, recomputed over ``pages``
    key-cache pages), a prior ``idx_kv_cache`` of random INT8 codes with ``idx_kv_scale ~
    U(0.01, 0.02)`` (``cfg.weight_format == "bf16"``: BF16 ``codes * scale`` and unit scales),
    ``hadamard`` (:func:`random_hadamard`), and ``idx_block_table [B, n]``."""
    gen = torch.Generator().manual_seed(seed + 2)
    c, bs = cfg.index_head_dim, cfg.block_size
    f = dict(f)
    f.pop("cmp_pages")
    B = f["state_block_table"].shape[0]
    per = pages // B
    from pto.models.deepseek_v4.prefill_attention_swa import permuted_block_table
    table = torch.stack([permuted_block_table(per, per, offset=1) + b * per for b in range(B)])
    pos = f["position_ids"].long()
    req = torch.arange(pos.shape[0]) // (pos.shape[0] // B)
    entry = ((pos + 1) // CSA_RATIO - 1).clamp(min=0)
    if bool((entry // bs >= per).any()):
        raise BindError(f"indexer_cache_inputs: entries up to {int(entry.max())} exceed {per} key pages per request")
    rows = table[req, entry // bs].long() * bs + entry % bs
    f["idx_slot_mapping"] = torch.where(f.pop("cmp_slot_mapping") >= 0, rows, -1).to(torch.int64)
    f.pop("cmp_block_table")
    f["idx_block_table"] = table.to(torch.int32)
    f["idx_kv_cache"] = torch.randint(-127, 128, (pages, bs, 1, c), generator=gen, dtype=torch.int8)
    f["idx_kv_scale"] = 0.01 + 0.01 * torch.rand(pages, bs, 1, 1, generator=gen)
    f["hadamard"] = random_hadamard(c, gen)
    if is_bf16(cfg):  # BF16 keys, unit scales (what the bf16 compressor writes)
        f["idx_kv_cache"] = (f["idx_kv_cache"].float() * f["idx_kv_scale"]).to(torch.bfloat16)
        f["idx_kv_scale"] = torch.ones_like(f["idx_kv_scale"])
    return f


def make_prefill_indexer_compressor_inputs(cfg: DeepSeekV4Config, T: int, start_pos: int, num_tokens: int,
                                           seed: int, state_pages: int = CSA_STATE_PAGES) -> dict:
    """Fixture of :func:`golden_prefill_indexer_compressor` for one request: :func:`ratio4_fixture`
    at width ``index_head_dim`` (table ``[L]``) then :func:`indexer_cache_inputs`.

    Raises:
        BindError: see :func:`ratio4_fixture`.
    """
    f = indexer_cache_inputs(ratio4_fixture(cfg, [start_pos], T, cfg.index_head_dim, num_tokens, seed,
                                            state_pages), cfg, seed)
    f["state_block_table"] = f["state_block_table"][0]
    f["idx_block_table"] = f["idx_block_table"][0]
    return f


_ARG_ORDER = ("x", "compress_state", "state_block_table", "wkv", "wgate", "ape", "norm_w", "cos_table",
              "sin_table", "hadamard", "idx_kv_cache", "idx_kv_scale", "position_ids", "num_tokens",
              "idx_slot_mapping", "state_slot_mapping")
_OUTPUTS = ("idx_kv_cache", "idx_kv_scale", "compress_state")


def build_prefill_indexer_compressor(preset: str = "tiny", mode: str = "prefill", *, T: int | None = None,
                                     start_pos: int = 0, num_tokens: int | None = None, seed: int = 0,
                                     weight_format: str = "int8") -> CaseRun:
    """KernelCase builder: the prefill indexer compressor (``T = prefill_seq`` by default);
    compare functions from ``TOLERANCES`` (``weight_format="bf16"``: the BF16 key cache,
    :data:`BF16_TOLERANCES`).

    Raises:
        ConfigError: unknown preset or mode, ``T < 1``; BindError: a fixture the config cannot hold.
    """
    cfg, T = prefill_case_tokens("prefill_indexer_compressor", preset, mode, T)
    cfg = with_weight_format(cfg, weight_format)
    nt = T if num_tokens is None else num_tokens
    inputs = make_prefill_indexer_compressor_inputs(cfg, T, start_pos, nt, seed)
    entry = prefill_indexer_compressor_entry(cfg, None)

    return ratio4_case(entry, inputs, _ARG_ORDER, _OUTPUTS, functools.partial(golden_prefill_indexer_compressor,
                                                                              weight_format=weight_format),
                       BF16_TOLERANCES if weight_format == "bf16" else TOLERANCES, cfg,
                       f"{preset} {mode} T={T} start_pos={start_pos} num_tokens={nt}"
                       + (" weight_format=bf16" if weight_format == "bf16" else ""))


register(KernelCase("prefill_indexer_compressor", build_prefill_indexer_compressor, modes=("prefill",),
                    description="CSA indexer key compressor, prefill: ratio-4 pool, Hadamard, INT8 key cache (pypto-lib `prefill_indexer_compressor.py`)"))
