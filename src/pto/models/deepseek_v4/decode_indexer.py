"""Lightning indexer, decode step (pypto-lib `models/deepseek/v4-flash/decode_indexer.py`; transformers `models/deepseek_v4/modeling_deepseek_v4.py`).

The indexer core of :mod:`prefill_indexer` over one decode step of ``B`` requests
(request-major tokens, ``idx_block_table [B, n]``; position ``-1`` marks an inactive request's
row, which gets an all ``-1`` top-k row); tasks are named ``decode_idx_*``. Math, tie order and
tasks as in the prefill module. Deviations (pypto-lib `decode_indexer.py`): the visible length is ``(pos + 1) // 4``
per token (the reference also bounds it by ``kv_seq_lens / 4``, equal after this step's
compressor ran); no ``offset``; the indexer compressor runs in the attention block, before.
"""

from pto.errors import ConfigError
from pto.golden import CaseRun, KernelCase, register
from pto.models.deepseek_v4.config import DeepSeekV4Config, get_config
from pto.models.deepseek_v4.decode_compressor_ratio4 import decode_start_positions
from pto.models.deepseek_v4.prefill_indexer import (
    golden_prefill_indexer,
    indexer_case,
    indexer_entry,
    indexer_inline,
    make_indexer_inputs,
)
from pto.models.deepseek_v4.weight_format import with_weight_format

__all__ = ["decode_indexer", "decode_indexer_entry", "golden_decode_indexer", "build_decode_indexer"]

# ---- kernel ----
decode_indexer = indexer_inline("decode")  # the shared body; idx_block_table [B, n]


def decode_indexer_entry(cfg: DeepSeekV4Config, seed_scopes: bool = False):
    """The ``@pl.jit`` test entry ``decode_indexer_test`` (:func:`prefill_indexer.indexer_entry`
    of mode ``decode``)."""
    return indexer_entry(cfg, "decode", seed_scopes)
# ---- end kernel ----


def golden_decode_indexer(*args, **kwargs):
    """Decode indexer golden: :func:`prefill_indexer.golden_prefill_indexer` (same arguments,
    ``idx_block_table [B, n]``; it handles both table shapes)."""
    return golden_prefill_indexer(*args, **kwargs)


def build_decode_indexer(preset: str = "tiny", mode: str = "decode", *, starts=None, num_tokens: int | None = None,
                         seed: int = 0, seed_scopes: bool = False, weight_format: str = "int8") -> CaseRun:
    """KernelCase builder: the decode indexer over ``decode_batch x decode_seq`` tokens at
    ``starts`` (default :func:`decode_compressor_ratio4.decode_start_positions`: from a cold
    request with no visible entry to one seeing far more than ``index_topk``);
    ``weight_format="bf16"``: the unquantised indexer.

    Raises:
        ConfigError: unknown preset or mode; BindError: a fixture the config cannot hold.
    """
    cfg = with_weight_format(get_config(preset), weight_format)
    if mode != "decode":
        raise ConfigError(f"decode_indexer: unknown mode {mode!r}; the only mode is 'decode'")
    B, S = cfg.decode_batch, cfg.decode_seq
    starts = decode_start_positions(cfg, B) if starts is None else list(starts)
    nt = B * S if num_tokens is None else num_tokens
    inputs = make_indexer_inputs(cfg, starts, S, nt, seed)
    label = (f"{preset} {mode} starts={starts} num_tokens={nt}" + (" seed_scopes" if seed_scopes else "")
             + (" weight_format=bf16" if weight_format == "bf16" else ""))
    return indexer_case(decode_indexer_entry(cfg, seed_scopes), inputs, cfg, label)


register(KernelCase("decode_indexer", build_decode_indexer, modes=("decode",), seed_variant=True,
                    description="CSA lightning indexer, decode step: INT8 index scores, sort32/mrgsort top-k (pypto-lib `decode_indexer.py`)"))
