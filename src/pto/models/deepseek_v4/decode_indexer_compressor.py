"""Lightning-indexer key compressor, decode step (pypto-lib `models/deepseek/v4-flash/decode_indexer_compressor.py`; transformers `models/deepseek_v4/modeling_deepseek_v4.py`).

The ratio-4 core of :mod:`prefill_compressor_ratio4` at width ``index_head_dim`` over one
decode step of ``B`` requests (request-major tokens, ``state_block_table [B, L]``), then the
Hadamard and INT8 key-cache finalize of :mod:`prefill_indexer_compressor`; tasks are named
``decode_idx_c4_*``. Math and contract as in those modules. Deviation (pypto-lib `decode_indexer_compressor.py`): no FP32
``kv [B, S, c]`` test output; flat ``[T]`` token metadata.
"""

import functools

from pto.errors import ConfigError
from pto.golden import CaseRun, KernelCase, register
from pto.models.deepseek_v4.config import DeepSeekV4Config, get_config
from pto.models.deepseek_v4.decode_compressor_ratio4 import decode_start_positions
from pto.models.deepseek_v4.prefill_compressor_ratio4 import ratio4_case, ratio4_fixture
from pto.models.deepseek_v4.prefill_indexer_compressor import (
    _ARG_ORDER,
    _OUTPUTS,
    BF16_TOLERANCES,
    TOLERANCES,
    golden_prefill_indexer_compressor,
    indexer_cache_inputs,
    indexer_compressor_entry,
    indexer_compressor_inline,
)
from pto.models.deepseek_v4.weight_format import with_weight_format

__all__ = ["decode_indexer_compressor", "decode_indexer_compressor_entry", "golden_decode_indexer_compressor",
           "make_decode_indexer_compressor_inputs", "build_decode_indexer_compressor"]

# ---- kernel ----
decode_indexer_compressor = indexer_compressor_inline("decode")  # the shared body; table [B, L]


def decode_indexer_compressor_entry(cfg: DeepSeekV4Config, max_cmp_writes: int | None = None):
    """The ``@pl.jit`` test entry ``decode_indexer_compressor_test``
    (:func:`prefill_indexer_compressor.indexer_compressor_entry` of mode ``decode``)."""
    return indexer_compressor_entry(cfg, "decode", max_cmp_writes)
# ---- end kernel ----


def golden_decode_indexer_compressor(*args, **kwargs):
    """Decode indexer compressor golden: :func:`prefill_indexer_compressor.golden_prefill_indexer_compressor`
    (same arguments; ``state_block_table [B, L]``), which handles both table shapes."""
    return golden_prefill_indexer_compressor(*args, **kwargs)


def make_decode_indexer_compressor_inputs(cfg: DeepSeekV4Config, starts=None, num_tokens=None, seed: int = 0) -> dict:
    """Fixture for ``B = decode_batch`` requests of ``S = decode_seq`` tokens at ``starts``
    (default :func:`decode_compressor_ratio4.decode_start_positions`): :func:`ratio4_fixture`
    at width ``index_head_dim`` then :func:`prefill_indexer_compressor.indexer_cache_inputs`.

    Raises:
        BindError: see :func:`ratio4_fixture`.
    """
    B, S = cfg.decode_batch, cfg.decode_seq
    starts = decode_start_positions(cfg, B) if starts is None else list(starts)
    nt = B * S if num_tokens is None else num_tokens
    return indexer_cache_inputs(ratio4_fixture(cfg, starts, S, cfg.index_head_dim, nt, seed), cfg, seed)


def build_decode_indexer_compressor(preset: str = "tiny", mode: str = "decode", *, starts=None,
                                    num_tokens: int | None = None, seed: int = 0,
                                    weight_format: str = "int8") -> CaseRun:
    """KernelCase builder: the decode indexer compressor (``B x S`` tokens); compare functions
    from ``TOLERANCES`` (``weight_format="bf16"``: the BF16 key cache, ``BF16_TOLERANCES``).

    Raises:
        ConfigError: unknown preset or mode; BindError: a fixture the config cannot hold.
    """
    cfg = with_weight_format(get_config(preset), weight_format)
    if mode != "decode":
        raise ConfigError(f"decode_indexer_compressor: unknown mode {mode!r}; the only mode is 'decode'")
    inputs = make_decode_indexer_compressor_inputs(cfg, starts, num_tokens, seed)
    entry = decode_indexer_compressor_entry(cfg, None)

    return ratio4_case(entry, inputs, _ARG_ORDER, _OUTPUTS,
                       functools.partial(golden_decode_indexer_compressor, weight_format=weight_format),
                       BF16_TOLERANCES if weight_format == "bf16" else TOLERANCES, cfg,
                       f"{preset} {mode} starts={inputs['position_ids'][::cfg.decode_seq].tolist()}"
                       + (" weight_format=bf16" if weight_format == "bf16" else ""))


register(KernelCase("decode_indexer_compressor", build_decode_indexer_compressor, modes=("decode",),
                    description="CSA indexer key compressor, decode step: ratio-4 pool, Hadamard, INT8 keys (pypto-lib `decode_indexer_compressor.py`)"))
