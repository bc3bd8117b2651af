"""Token embedding lookup, expanded to the ``hc_mult`` hyper-connection streams.

Math (transformers `models/deepseek_v4/modeling_deepseek_v4.py`; transformers ``DeepseekV4Model.forward``): no scaling, every stream
starts as a copy of the token's embedding row, and the stream stays FP32 end to end
(pypto-lib `models/deepseek/v4-flash/hc_post.py`):

    x_hc[t, h, :] = fp32(embed[input_ids[t], :])        for h in 0 .. hc_mult-1

Kernel (:func:`lookup_embedding`): the orchestration reads every id once and raises a
``BindError`` naming the first position whose id is outside ``[0, vocab_size)`` before any
task is submitted (nothing half-written); then one task ``embedding_lookup`` of
``ceil(T / EMB_T_TILE)`` blocks, each loading its ids as a tile (so the read footprint on
``input_ids`` is recorded) and gathering its tokens' table rows into one ``[tokens, D]`` tile
(``pl.gather_rows``: one footprint per row), cast to FP32 and stored once per stream, each
store the ``[tokens, D]`` column window of stream ``h`` in the block's rows of ``x_hc`` viewed
as ``[T, hc_mult * D]`` (no ``[tokens, hc_mult * D]`` concatenated tile: one write of the
output instead of a tile build and its copy). No GM scratch. The reference has no
embedding kernel (the table lookup is host-side in pypto-lib); this one follows the
layer's conventions.
"""

import functools
from types import SimpleNamespace

import torch

import pto.language as pl
from pto.errors import BindError, ConfigError
from pto.golden import CaseRun, KernelCase, TensorSpec, exact, register
from pto.models.deepseek_v4.config import DeepSeekV4Config
from pto.models.deepseek_v4.tiling import mode_tokens, need, token_tile

__all__ = ["EMB_T_TILE", "check_token_ids", "lookup_embedding_kernels", "lookup_embedding",
           "golden_lookup_embedding", "pattern_table", "make_embedding_inputs", "build_lookup_embedding"]

EMB_T_TILE = 32  # tokens per embedding_lookup block [no reference kernel]

# ---- kernel ----
T_DYN = pl.dynamic("T")


def check_token_ids(kernel: str, input_ids, vocab_size: int, n: int | None = None) -> int:
    """Orchestration-level check of ``input_ids [T]``: every id of the first ``n`` (default
    all ``T``) in ``[0, vocab_size)``.

    Returns:
        ``T``.

    Raises:
        BindError: naming the kernel, the first bad position and its id.
    """
    t = pl.tensor.dim(input_ids, 0)
    for i, tok in enumerate(pl.read_values(input_ids, [0], t if n is None else n)):
        if not 0 <= tok < vocab_size:
            raise BindError(f"{kernel}: input_ids[{i}] = {int(tok)} outside [0, vocab_size={vocab_size})")
    return t


@functools.lru_cache(maxsize=None)
def lookup_embedding_kernels(cfg: DeepSeekV4Config) -> SimpleNamespace:
    """Build the embedding lookup for ``cfg`` (cached per config).

    Returns:
        namespace with the inline body ``lookup_embedding(input_ids [T] INT64, embed [V, D]
        BF16, x_hc Out [T, hc_mult, D] FP32) -> task id`` and its ``@pl.jit`` entry
        ``lookup_embedding_test`` (same parameters), ``V = vocab_size``, ``D = hidden_size``.

    Raises:
        ConfigError: ``hidden_size`` not a positive multiple of 16 or ``hc_mult < 1``.
    """
    V, D, HC = cfg.vocab_size, cfg.hidden_size, cfg.hc_mult
    need(D > 0 and D % 16 == 0, "lookup_embedding", cfg, f"hidden_size={D} must be a positive multiple of 16")
    need(HC >= 1, "lookup_embedding", cfg, f"hc_mult={HC} must be >= 1")

    @pl.jit.inline
    def lookup_embedding(input_ids: pl.Tensor[[T_DYN], pl.INT64],
                         embed: pl.Tensor[[V, D], pl.BF16],
                         x_hc: pl.Out[pl.Tensor[[T_DYN, HC, D], pl.FP32]]):
        """``x_hc[t, h] = fp32(embed[input_ids[t]])`` for every stream ``h``; returns the task id."""
        t = check_token_ids("lookup_embedding", input_ids, V)
        TT = token_tile(t, EMB_T_TILE)
        x_rows = pl.reshape(x_hc, [t, HC * D])  # token t's streams: one contiguous row of HC * D
        task = pl.spmd(-(-t // TT), name_hint="embedding_lookup", allow_early_resolve=True)
        for b in task:
            t0 = b * TT
            rows = min(TT, t - t0)
            ids = input_ids[t0:t0 + rows]
            toks = pl.read_values(ids, [0], rows)
            x = pl.cast(pl.gather_rows(embed, toks), pl.FP32, mode="none")  # [rows, D]
            for h in pl.range(HC):  # stream h: columns h * D .. (h + 1) * D - 1 of the block's rows
                pl.assemble(x_rows, x, [t0, h * D])
        return task.tid

    lookup_embedding_test = pl.jit.entry(lookup_embedding, name="lookup_embedding_test")
    return SimpleNamespace(lookup_embedding=lookup_embedding, lookup_embedding_test=lookup_embedding_test)


@pl.jit.inline
def lookup_embedding(input_ids: pl.Tensor, embed: pl.Tensor, x_hc: pl.Out[pl.Tensor], cfg):
    """Stable inline signature ``lookup_embedding(input_ids, embed, x_hc, cfg) -> task id``
    (shapes in :func:`lookup_embedding_kernels`).

    Raises:
        ConfigError: ``cfg`` cannot be tiled. BindError: a shape off the config or an id
            outside ``[0, vocab_size)`` (naming its position, before any task).
    """
    return lookup_embedding_kernels(cfg).lookup_embedding(input_ids, embed, x_hc)
# ---- end kernel ----


def golden_lookup_embedding(
    input_ids: torch.Tensor,  # [T] int64
    embed: torch.Tensor,  # [V, D] bf16 (fp32 for parity runs)
    hc_mult: int,
) -> torch.Tensor:  # [T, hc_mult, D] fp32
    """Embedding rows copied to every hyper-connection stream (transformers `models/deepseek_v4/modeling_deepseek_v4.py`).

    ``x_hc[t, h] = embed[input_ids[t]]`` in FP32 (the BF16 table converts exactly, so the
    result is the same with ``float32`` parity inputs).

    Raises:
        BindError: ``input_ids`` not a rank-1 integer tensor, ``embed`` not rank 2, or an
            id outside ``[0, V)`` (naming the first position).
    """
    fn = "golden_lookup_embedding"
    if input_ids.dim() != 1 or input_ids.is_floating_point():
        raise BindError(f"{fn}: input_ids must be an integer [T] tensor, got {input_ids.dtype} "
                        f"{list(input_ids.shape)}")
    if embed.dim() != 2 or not embed.is_floating_point():
        raise BindError(f"{fn}: embed must be a float [V, D] tensor, got {embed.dtype} {list(embed.shape)}")
    V = embed.shape[0]
    bad = ((input_ids < 0) | (input_ids >= V)).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        raise BindError(f"{fn}: input_ids[{i}] = {int(input_ids[i])} outside [0, vocab_size={V})")
    rows = embed[input_ids.long()].float()
    return rows.unsqueeze(1).expand(-1, hc_mult, -1).contiguous()


def pattern_table(rows: int, cols: int, seed: int, scale: float) -> torch.Tensor:
    """``[rows, cols]`` BF16 table ``((r % P) * 131 + c * 7 + seed) % 251 - 125) * scale`` with
    ``P = 4099`` (prime): exact in BF16 for power-of-two ``scale``, rows distinct within any
    4099 consecutive ids, built by repeating one ``[P, cols]`` block (no 2-GiB FP32 random draw
    or integer temporaries at FLASH's 129280 x 4096)."""
    P = 4099
    r = torch.arange(min(rows, P), dtype=torch.int32).unsqueeze(1) * 131
    c = torch.arange(cols, dtype=torch.int32).unsqueeze(0) * 7
    block = (((r + c + seed) % 251 - 125).to(torch.float32) * scale).to(torch.bfloat16)
    return block.repeat(-(-rows // block.shape[0]), 1)[:rows].contiguous()


def make_embedding_inputs(cfg: DeepSeekV4Config, T: int, seed: int) -> dict[str, torch.Tensor]:
    """Seeded fixture: ``input_ids [T]`` INT64 uniform in ``[0, V)`` with ``0`` and ``V - 1``
    at the first two positions (when ``T >= 2``), and a BF16 table ``embed [V, D]``:
    :func:`pattern_table` with scale 1/64 (exact in BF16, rows distinct within 4099
    consecutive ids, cheap to build at FLASH size).

    Raises:
        BindError: ``T`` not positive.
    """
    if T <= 0:
        raise BindError(f"make_embedding_inputs: T must be positive, got {T}")
    V, D = cfg.vocab_size, cfg.hidden_size
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (T,), generator=gen, dtype=torch.int64)
    ids[:2] = torch.tensor([0, V - 1])[:T]
    return {"input_ids": ids, "embed": pattern_table(V, D, seed, 1 / 64)}


# ---- registration ----
def build_lookup_embedding(preset: str = "tiny", mode: str = "prefill", *, T: int | None = None, seed: int = 0,
                           seed_scopes: bool = False) -> CaseRun:
    """KernelCase builder: the embedding lookup at ``preset`` in ``mode`` (decode 8 tokens,
    prefill 128) or ``T`` tokens, inputs from :func:`make_embedding_inputs`; ``x_hc`` must
    equal the golden exactly (it is a copy).

    Raises:
        ConfigError: unknown preset / mode, bad ``T``, or ``seed_scopes`` (no seed variant).
    """
    if seed_scopes:
        raise ConfigError("lookup_embedding has no seed variant (it has no scratch)")
    cfg, T = mode_tokens(preset, mode, T)
    ins = make_embedding_inputs(cfg, T, seed)
    V, D, HC = cfg.vocab_size, cfg.hidden_size, cfg.hc_mult
    specs = [TensorSpec("input_ids", [T], torch.int64, init_value=ins["input_ids"]),
             TensorSpec("embed", [V, D], torch.bfloat16, init_value=ins["embed"]),
             TensorSpec("x_hc", [T, HC, D], torch.float32, is_output=True)]

    def golden(v: dict) -> None:
        v["x_hc"] = golden_lookup_embedding(v["input_ids"], v["embed"], HC)

    return CaseRun(lookup_embedding_kernels(cfg).lookup_embedding_test, specs, golden, {"x_hc": exact()},
                   label=f"{preset} {mode} T={T}")


register(KernelCase("lookup_embedding", build_lookup_embedding, modes=("decode", "prefill"),
                    description="token embedding rows copied to the hc_mult FP32 streams"))
