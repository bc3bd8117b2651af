"""DeepSeek-V4 configuration presets and deployment constants.

Field names follow the model's Hugging Face ``config.json`` (upstream names:
``qk_rope_head_dim``, ``compress_ratios``, ``rope_scaling``); values of the
``flash`` preset are those of DeepSeek-V4-Flash (reference
v4flash-kernels.md "FLASH preset", dsv4-math.md section 0). ``tiny`` is the
random-checkpoint size used by the default tests and the transformers parity
tests.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from pto.errors import ConfigError

__all__ = ["RopeScaling", "DeepSeekV4Config", "PRESETS", "get_config"]


@dataclass(frozen=True)
class RopeScaling:
    """YaRN parameters of the compress RoPE profile (dsv4-math.md section 3).

    ``factor`` divides the low frequencies; ``beta_fast`` / ``beta_slow`` bound
    the blended ramp; ``original_max_position_embeddings`` is the pre-extension
    context length in tokens.
    """

    factor: float = 16.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    original_max_position_embeddings: int = 65536


@dataclass(frozen=True)
class DeepSeekV4Config:
    """Frozen model config; see the module docstring for the source of each value.

    Derived properties (``nope_head_dim``, ``softmax_scale``, ``hc_dim``,
    ``mix_hc``, ...) are computed, never stored. Deployment constants (page
    size, cache pools, serving geometry) are fields too so that a preset fully
    describes one deployment.

    Raises:
        ConfigError: from :meth:`validate` when fields are inconsistent
            (e.g. ``qk_rope_head_dim`` odd or larger than ``head_dim``).
    """

    name: str
    hidden_size: int
    num_attention_heads: int
    head_dim: int
    qk_rope_head_dim: int
    q_lora_rank: int
    o_lora_rank: int
    o_groups: int
    sliding_window: int
    rms_norm_eps: float
    hc_mult: int
    hc_sinkhorn_iters: int
    hc_eps: float
    n_routed_experts: int
    num_experts_per_tok: int
    n_shared_experts: int
    moe_intermediate_size: int
    vocab_size: int
    num_hidden_layers: int
    compress_ratios: tuple[int, ...]
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    max_position_embeddings: int = 16384
    scoring_func: str = "sqrtsoftplus"
    routed_scaling_factor: float = 1.5
    swiglu_limit: float = 10.0
    num_hash_layers: int = 3
    # deployment constants (v4flash-kernels.md "Deployment/implementation constants")
    block_size: int = 128  # paged-KV page rows
    ori_kv_block_num: int = 128  # raw / SWA kv pages
    cmp_kv_block_num: int = 32  # compressed kv pages
    hca_state_block_size: int = 8  # ratio-128 compressor state page rows
    hca_state_block_num: int = 64
    decode_batch: int = 4
    decode_seq: int = 2
    prefill_seq: int = 128

    # ---- derived -------------------------------------------------------
    @property
    def nope_head_dim(self) -> int:
        """Leading head channels without RoPE: ``head_dim - qk_rope_head_dim``."""
        return self.head_dim - self.qk_rope_head_dim

    @property
    def softmax_scale(self) -> float:
        """Attention logit scale ``head_dim ** -0.5`` (no YaRN mscale, dsv4-math.md 10.11)."""
        return self.head_dim ** -0.5

    @property
    def hc_dim(self) -> int:
        """Width of the flattened hyper-connection stream: ``hc_mult * hidden_size``."""
        return self.hc_mult * self.hidden_size

    @property
    def mix_hc(self) -> int:
        """Width of the hc_pre mixing vector: ``(2 + hc_mult) * hc_mult`` (pre, post, comb)."""
        return (2 + self.hc_mult) * self.hc_mult

    @property
    def heads_per_group(self) -> int:
        """Query heads per o-projection group: ``num_attention_heads // o_groups``."""
        return self.num_attention_heads // self.o_groups

    @property
    def o_group_in(self) -> int:
        """Input width of one o-projection group: ``heads_per_group * head_dim``."""
        return self.heads_per_group * self.head_dim

    @property
    def q_dim(self) -> int:
        """Width of the full query: ``num_attention_heads * head_dim``."""
        return self.num_attention_heads * self.head_dim

    @property
    def max_blocks_per_seq(self) -> int:
        """Block-table length of one request: ``max_position_embeddings // block_size``."""
        return self.max_position_embeddings // self.block_size

    @property
    def decode_tokens(self) -> int:
        """Tokens of one decode step: ``decode_batch * decode_seq``."""
        return self.decode_batch * self.decode_seq

    def validate(self) -> "DeepSeekV4Config":
        """Check internal consistency; returns ``self``.

        Raises:
            ConfigError: naming the first inconsistent field.
        """
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ConfigError(f"config {self.name!r}: {msg}")

        need(self.qk_rope_head_dim % 2 == 0, f"qk_rope_head_dim={self.qk_rope_head_dim} must be even")
        need(0 < self.qk_rope_head_dim <= self.head_dim,
             f"qk_rope_head_dim={self.qk_rope_head_dim} must be in (0, head_dim={self.head_dim}]")
        need(self.num_attention_heads % self.o_groups == 0,
             f"num_attention_heads={self.num_attention_heads} not divisible by o_groups={self.o_groups}")
        need(len(self.compress_ratios) == self.num_hidden_layers,
             f"compress_ratios has {len(self.compress_ratios)} entries, num_hidden_layers={self.num_hidden_layers}")
        need(all(r in (0, 4, 128) for r in self.compress_ratios),
             f"compress_ratios {self.compress_ratios} may hold only 0, 4, 128")
        need(self.max_position_embeddings % self.block_size == 0,
             f"max_position_embeddings={self.max_position_embeddings} not a multiple of block_size={self.block_size}")
        return self

    def replace(self, **changes) -> "DeepSeekV4Config":
        """A copy with ``changes`` applied and validated (raises ConfigError)."""
        return dataclasses.replace(self, **changes).validate()


_FLASH_RATIOS = (0, 0) + tuple(4 if i % 2 == 0 else 128 for i in range(41))

PRESETS: dict[str, DeepSeekV4Config] = {
    "flash": DeepSeekV4Config(
        name="flash", hidden_size=4096, num_attention_heads=64, head_dim=512,
        qk_rope_head_dim=64, q_lora_rank=1024, o_lora_rank=1024, o_groups=8,
        sliding_window=128, rms_norm_eps=1e-6, hc_mult=4, hc_sinkhorn_iters=20,
        hc_eps=1e-6, n_routed_experts=256, num_experts_per_tok=6, n_shared_experts=1,
        moe_intermediate_size=2048, vocab_size=129280, num_hidden_layers=43,
        compress_ratios=_FLASH_RATIOS, index_n_heads=64, index_head_dim=128,
        index_topk=512,
    ),
    # DeepSeek-V4-Pro-like sizes: wider model, same kernel structure.
    "pro": DeepSeekV4Config(
        name="pro", hidden_size=7168, num_attention_heads=128, head_dim=512,
        qk_rope_head_dim=64, q_lora_rank=1536, o_lora_rank=1024, o_groups=16,
        sliding_window=128, rms_norm_eps=1e-6, hc_mult=4, hc_sinkhorn_iters=20,
        hc_eps=1e-6, n_routed_experts=384, num_experts_per_tok=6, n_shared_experts=1,
        moe_intermediate_size=3072, vocab_size=129280, num_hidden_layers=61,
        compress_ratios=(0, 0) + tuple(4 if i % 2 == 0 else 128 for i in range(59)),
        index_n_heads=64, index_head_dim=128, index_topk=1024,
    ),
    # A mid-size preset for quick demos: FLASH structure at a quarter of the width.
    "demo": DeepSeekV4Config(
        name="demo", hidden_size=1024, num_attention_heads=16, head_dim=256,
        qk_rope_head_dim=64, q_lora_rank=256, o_lora_rank=256, o_groups=4,
        sliding_window=128, rms_norm_eps=1e-6, hc_mult=4, hc_sinkhorn_iters=20,
        hc_eps=1e-6, n_routed_experts=32, num_experts_per_tok=4, n_shared_experts=1,
        moe_intermediate_size=256, vocab_size=8192, num_hidden_layers=6,
        compress_ratios=(0, 0, 4, 128, 4, 128), index_n_heads=16, index_head_dim=128,
        index_topk=64,
    ),
    "tiny": DeepSeekV4Config(
        name="tiny", hidden_size=128, num_attention_heads=8, head_dim=128,
        qk_rope_head_dim=64, q_lora_rank=64, o_lora_rank=32, o_groups=4,
        sliding_window=64, rms_norm_eps=1e-6, hc_mult=4, hc_sinkhorn_iters=20,
        hc_eps=1e-6, n_routed_experts=16, num_experts_per_tok=4, n_shared_experts=1,
        moe_intermediate_size=64, vocab_size=512, num_hidden_layers=6,
        compress_ratios=(0, 0, 4, 128, 4, 128), index_n_heads=16, index_head_dim=128,
        index_topk=16, block_size=16, ori_kv_block_num=64, cmp_kv_block_num=8,
        hca_state_block_num=64,
    ),
}
for _cfg in PRESETS.values():
    _cfg.validate()


def get_config(name: str) -> DeepSeekV4Config:
    """The preset called ``name`` (``flash``, ``pro``, ``demo``, ``tiny``).

    Raises:
        ConfigError: for an unknown preset name, listing the known ones.
    """
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown preset {name!r}; known presets: {sorted(PRESETS)}") from None
