"""DeepSeek-V4 configuration presets and deployment constants.

Field names follow the model's Hugging Face ``config.json`` (upstream names:
``qk_rope_head_dim``, ``compress_ratios``, ``rope_scaling``); values of the
``flash`` preset are those of DeepSeek-V4-Flash (reference
pypto-lib `models/deepseek/v4-flash/config.py`, transformers `models/deepseek_v4/modeling_deepseek_v4.py`). ``tiny`` is the
random-checkpoint size used by the default tests and the transformers parity
tests.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from pto.errors import ConfigError

__all__ = ["RopeScaling", "DeepSeekV4Config", "KernelConfig", "kernel_config", "DeploymentConfig", "PRESETS", "DEPLOYMENTS",
           "get_config", "get_deployment", "LAYER_TYPE_OF_RATIO", "PRESET_SIZE_ORDER", "capped_preset"]

# HF ``layer_types`` entry of each compress ratio (transformers configuration_deepseek_v4).
LAYER_TYPE_OF_RATIO = {0: "sliding_attention", 4: "compressed_sparse_attention",
                       128: "heavily_compressed_attention"}
_RATIO_OF_LAYER_TYPE = {v: k for k, v in LAYER_TYPE_OF_RATIO.items()}


def _token_id_field(hf: dict, key: str, default, many: bool = False):
    """``config.json`` field ``key`` as a token id: a non-negative integer or null; with ``many``
    (``eos_token_id``) also a list of them, as Hugging Face allows (generation stops at any of
    them): one id gives the int, several a tuple, an empty list None.

    Raises:
        ConfigError: any other value (a string, a float, a bool, a negative id), naming the field.
    """
    v = hf.get(key, default)

    def one(x) -> bool:
        return type(x) is int and x >= 0

    if v is None or one(v):
        return v
    if many and isinstance(v, list) and all(one(x) for x in v):
        return None if not v else v[0] if len(v) == 1 else tuple(v)
    what = "a non-negative integer token id, a list of them or null" if many else "a non-negative integer token id or null"
    raise ConfigError(f"config.json: {key} must be {what}, got {v!r}")


MAX_SINKHORN_ITERS = 1000  # a bound on config.json's hc_sinkhorn_iters (the model's is 20)
_FP32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max, the kernels' float range


@dataclass(frozen=True)
class RopeScaling:
    """YaRN parameters of the compress RoPE profile (transformers `models/deepseek_v4/modeling_deepseek_v4.py`).

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

    Derived properties (``nope_head_dim``, ``softmax_scale``, ``hc_dim``, ``mix_hc``, ...)
    are computed, never stored. Model fields only, with HF's meaning
    (``max_position_embeddings`` is the model's context length); the serving geometry is a
    :class:`DeploymentConfig`, and kernels are built for a :class:`KernelConfig` (a model
    config plus the geometry its tensors use).

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
    bos_token_id: int | None = 0
    eos_token_id: int | tuple[int, ...] | None = 1  # a tuple: several stop tokens (HF's list form)
    num_nextn_predict_layers: int = 1

    # ---- derived -------------------------------------------------------
    @property
    def nope_head_dim(self) -> int:
        """Leading head channels without RoPE: ``head_dim - qk_rope_head_dim``."""
        return self.head_dim - self.qk_rope_head_dim

    @property
    def softmax_scale(self) -> float:
        """Attention logit scale ``head_dim ** -0.5`` (no YaRN mscale, transformers `models/deepseek_v4/modeling_deepseek_v4.py`)."""
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

    def validate(self) -> "DeepSeekV4Config":
        """Check internal consistency; returns ``self``.

        Raises:
            ConfigError: naming the first inconsistent field (a size that is not positive, a
                RoPE theta or epsilon that is not a positive finite number, ...).
        """
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ConfigError(f"config {self.name!r}: {msg}")

        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim", "q_lora_rank",
                    "o_lora_rank", "o_groups", "sliding_window", "n_routed_experts", "num_experts_per_tok",
                    "moe_intermediate_size", "vocab_size", "index_n_heads", "index_head_dim", "index_topk",
                    "hc_mult", "max_position_embeddings", "hc_sinkhorn_iters"):
            v = getattr(self, key)
            need(v > 0, f"{key}={v} must be positive")
        for key in ("rope_theta", "compress_rope_theta", "rms_norm_eps", "hc_eps"):
            v = getattr(self, key)
            need(math.isfinite(v) and v > 0, f"{key}={v} must be a positive finite number")
        for key in ("routed_scaling_factor", "swiglu_limit"):  # FP32 factors of the kernels: past FP32's range
            v = getattr(self, key)                             # they are inf, and the logits NaN
            need(math.isfinite(v) and 0 < v <= _FP32_MAX, f"{key}={v} must be a positive number within FP32's range")
        need(self.hc_sinkhorn_iters <= MAX_SINKHORN_ITERS,  # every iteration is tile ops of every layer's hc_pre
             f"hc_sinkhorn_iters={self.hc_sinkhorn_iters} is above {MAX_SINKHORN_ITERS} (DeepSeek-V4 runs 20; each "
             "iteration is a row and a column normalisation of every layer's hc_pre and hc_head)")
        need(self.num_nextn_predict_layers >= 0,
             f"num_nextn_predict_layers={self.num_nextn_predict_layers} must not be negative")
        eos = self.eos_token_id if isinstance(self.eos_token_id, tuple) else (self.eos_token_id,)
        for key, ids in (("bos_token_id", (self.bos_token_id,)), ("eos_token_id", eos)):
            bad = [t for t in ids if t is not None and not 0 <= t < self.vocab_size]
            need(not bad, f"{key} {bad[0] if bad else ''} is outside the vocabulary [0, {self.vocab_size})")
        need(self.qk_rope_head_dim % 2 == 0, f"qk_rope_head_dim={self.qk_rope_head_dim} must be even")
        need(0 < self.qk_rope_head_dim <= self.head_dim,
             f"qk_rope_head_dim={self.qk_rope_head_dim} must be in (0, head_dim={self.head_dim}]")
        need(self.num_attention_heads % self.o_groups == 0,
             f"num_attention_heads={self.num_attention_heads} not divisible by o_groups={self.o_groups}")
        need(len(self.compress_ratios) == self.num_hidden_layers,
             f"compress_ratios has {len(self.compress_ratios)} entries, num_hidden_layers={self.num_hidden_layers}")
        need(all(r in (0, 4, 128) for r in self.compress_ratios),
             f"compress_ratios {self.compress_ratios} may hold only 0, 4, 128")
        return self

    def replace(self, **changes) -> "DeepSeekV4Config":
        """A copy with ``changes`` applied and validated (raises ConfigError)."""
        return dataclasses.replace(self, **changes).validate()

    @property
    def layer_types(self) -> tuple[str, ...]:
        """HF ``layer_types``: ``sliding_attention`` / ``compressed_sparse_attention`` /
        ``heavily_compressed_attention`` per layer (from ``compress_ratios`` 0 / 4 / 128)."""
        return tuple(LAYER_TYPE_OF_RATIO[r] for r in self.compress_ratios)

    @classmethod
    def from_hf(cls, source, name: str = "hf") -> "DeepSeekV4Config":
        """Build a config from a Hugging Face DeepSeek-V4 ``config.json``, field for field.

        ``source`` is a dict (the parsed JSON), a path to ``config.json`` or a checkpoint
        directory holding one. Fields keep HF's meaning (transformers 5.23.0
        ``DeepseekV4Config``; transformers `models/deepseek_v4/` and the published DeepSeek-V4-Flash checkpoint):

        * ``max_position_embeddings`` is the model's context length (tokens);
        * the attention schedule comes from ``layer_types`` or, failing that, the legacy
          per-layer ``compress_ratios`` (0 / 4 / 128; an extra trailing MTP entry is
          dropped); neither is an error (HF would silently use a V4-Pro schedule);
        * hash layers: ``mlp_layer_types`` (leading ``hash_moe`` run) or ``num_hash_layers``;
        * RoPE: ``qk_rope_head_dim`` or ``partial_rotary_factor * head_dim``; YaRN from
          ``rope_parameters["compress"]`` (HF nesting) or a flat ``rope_scaling`` /
          ``rope_parameters`` dict; its ``attention_factor`` must be 1 (or absent);
        * ``num_key_value_heads`` must be 1 (one shared K=V head); ``tie_word_embeddings``
          must be false; ``scoring_func`` must be ``sqrtsoftplus``; ``norm_topk_prob`` must be
          true and ``attention_bias`` / ``mlp_bias`` false (when given); ``routed_scaling_factor``
          and ``swiglu_limit`` positive within FP32's range; ``bos_token_id`` / ``eos_token_id``
          inside the vocabulary.

        Unknown keys (``architectures``, ``dtype``, ``quantization_config``, ...) are
        ignored; the weight format is the loader's business (``weights.py``).

        Raises:
            ConfigError: unreadable file, a missing required field, a field of the wrong
                type, or a value this implementation does not support, naming the field.
        """
        import json
        from pathlib import Path

        if isinstance(source, (str, Path)):
            path = Path(source)
            if path.is_dir():
                path = path / "config.json"
            try:
                hf = json.loads(path.read_text())
            except FileNotFoundError:
                raise ConfigError(f"config: no config.json at {path}") from None
            except (OSError, ValueError) as exc:
                raise ConfigError(f"config: cannot read {path}: {exc}") from None
        elif isinstance(source, dict):
            hf = source
        else:
            raise ConfigError(f"config: from_hf needs a dict or a path, got {type(source).__name__}")
        if not isinstance(hf, dict):
            raise ConfigError("config: config.json must hold a JSON object")

        def get(key, kind, default=dataclasses.MISSING):
            if key not in hf or hf[key] is None:
                if default is dataclasses.MISSING:
                    raise ConfigError(f"config.json: required field {key!r} is missing")
                return default
            v = hf[key]
            if kind is int and (isinstance(v, bool) or not isinstance(v, int)):
                raise ConfigError(f"config.json: {key} must be an integer, got {v!r}")
            if kind is float and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise ConfigError(f"config.json: {key} must be a number, got {v!r}")
            return float(v) if kind is float else v

        def listed(key) -> list:
            v = hf[key]
            if not isinstance(v, list):
                raise ConfigError(f"config.json: {key} must be a list, got {v!r}")
            return v

        def obj(d: dict, key: str, where: str) -> dict:
            v = d.get(key)
            if v is None:
                return {}
            if not isinstance(v, dict):
                raise ConfigError(f"config.json: {where}{key} must be an object, got {v!r}")
            return v

        def num(d: dict, key: str, default, where: str, kind=float):
            v = d.get(key)
            if v is None:
                return default
            ok = isinstance(v, int) if kind is int else isinstance(v, (int, float))
            if isinstance(v, bool) or not ok:
                what = "an integer" if kind is int else "a number"
                raise ConfigError(f"config.json: {where}{key} must be {what}, got {v!r}")
            return kind(v)

        n_layers = get("num_hidden_layers", int)
        if hf.get("layer_types") is not None:
            types = listed("layer_types")
            if len(types) < n_layers:
                raise ConfigError(f"config.json: layer_types has {len(types)} entries, "
                                  f"num_hidden_layers={n_layers}")
            bad = [t for t in types[:n_layers] if t not in _RATIO_OF_LAYER_TYPE]
            if bad:
                raise ConfigError(f"config.json: unknown layer_types entries {bad}; "
                                  f"known: {sorted(_RATIO_OF_LAYER_TYPE)}")
            ratios = tuple(_RATIO_OF_LAYER_TYPE[t] for t in types[:n_layers])
            rates = obj(hf, "compress_rates", "")
            for t, r in rates.items():
                if t in _RATIO_OF_LAYER_TYPE and r != _RATIO_OF_LAYER_TYPE[t]:
                    raise ConfigError(f"config.json: compress_rates[{t!r}]={r}; only "
                                      f"{_RATIO_OF_LAYER_TYPE[t]} is supported")
        elif hf.get("compress_ratios") is not None:
            cr = listed("compress_ratios")
            if len(cr) < n_layers:
                raise ConfigError(f"config.json: compress_ratios has {len(cr)} entries, "
                                  f"num_hidden_layers={n_layers}")
            bad = [r for r in cr if isinstance(r, bool) or not isinstance(r, int)]
            if bad:
                raise ConfigError(f"config.json: compress_ratios entries must be integers, got {bad[0]!r}")
            ratios = tuple(cr[:n_layers])  # a trailing extra entry is the MTP layer
        else:
            raise ConfigError("config.json: neither layer_types nor compress_ratios is given "
                              "(the attention schedule of every layer)")

        if hf.get("mlp_layer_types") is not None:
            mlp = listed("mlp_layer_types")[:n_layers]
            n_hash = 0
            while n_hash < len(mlp) and mlp[n_hash] == "hash_moe":
                n_hash += 1
            if any(t != "moe" for t in mlp[n_hash:]):
                raise ConfigError(f"config.json: mlp_layer_types {mlp} must be a run of "
                                  "'hash_moe' followed by 'moe'")
        else:
            n_hash = get("num_hash_layers", int, 3)

        head_dim = get("head_dim", int)
        if hf.get("qk_rope_head_dim") is not None:
            rope_dim = get("qk_rope_head_dim", int)
        else:
            rope_dim = int(round(head_dim * get("partial_rotary_factor", float, 64 / 512)))

        rp = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        if not isinstance(rp, dict):
            raise ConfigError(f"config.json: rope_parameters must be an object, got {rp!r}")
        yarn, yw = (obj(rp, "compress", "rope_parameters."), "rope_parameters.compress.") if "compress" in rp \
            else (rp, "rope_parameters.")
        rope_theta = num(obj(rp, "main", "rope_parameters."), "rope_theta", get("rope_theta", float, 1e4),
                         "rope_parameters.main.")
        compress_theta = num(yarn, "rope_theta", get("compress_rope_theta", float, 1.6e5), yw)
        if num(yarn, "attention_factor", 1.0, yw) != 1.0:
            raise ConfigError(f"config.json: YaRN attention_factor={yarn['attention_factor']}; "
                              "DeepSeek-V4 uses 1.0 (no mscale)")
        defaults = RopeScaling()
        scaling = RopeScaling(
            factor=num(yarn, "factor", get("rope_factor", float, defaults.factor), yw),
            beta_fast=num(yarn, "beta_fast", get("beta_fast", float, defaults.beta_fast), yw),
            beta_slow=num(yarn, "beta_slow", get("beta_slow", float, defaults.beta_slow), yw),
            original_max_position_embeddings=num(
                yarn, "original_max_position_embeddings",
                get("original_seq_len", int, defaults.original_max_position_embeddings), yw, int))

        if get("num_key_value_heads", int, 1) != 1:
            raise ConfigError(f"config.json: num_key_value_heads={hf['num_key_value_heads']}; "
                              "DeepSeek-V4 has one shared K=V head")
        if hf.get("tie_word_embeddings"):
            raise ConfigError("config.json: tie_word_embeddings=true is not supported "
                              "(DeepSeek-V4 has an untied lm_head)")
        for key, want in (("norm_topk_prob", True), ("attention_bias", False), ("mlp_bias", False)):
            if key in hf and hf[key] is not None and hf[key] is not want:
                raise ConfigError(f"config.json: {key}={json.dumps(hf[key])} is not supported; DeepSeek-V4 has "
                                  f"{json.dumps(want)} (the kernels and the golden implement only that)")
        scoring = get("scoring_func", str, "sqrtsoftplus")
        if scoring != "sqrtsoftplus":
            raise ConfigError(f"config.json: scoring_func={scoring!r}; only 'sqrtsoftplus' is "
                              "implemented")
        bos = _token_id_field(hf, "bos_token_id", 0)
        eos = _token_id_field(hf, "eos_token_id", 1, many=True)

        cfg = cls(
            name=name, hidden_size=get("hidden_size", int),
            num_attention_heads=get("num_attention_heads", int), head_dim=head_dim,
            qk_rope_head_dim=rope_dim, q_lora_rank=get("q_lora_rank", int),
            o_lora_rank=get("o_lora_rank", int), o_groups=get("o_groups", int),
            sliding_window=get("sliding_window", int),
            rms_norm_eps=get("rms_norm_eps", float, 1e-6), hc_mult=get("hc_mult", int, 4),
            hc_sinkhorn_iters=get("hc_sinkhorn_iters", int, 20),
            hc_eps=get("hc_eps", float, 1e-6), n_routed_experts=get("n_routed_experts", int),
            num_experts_per_tok=get("num_experts_per_tok", int),
            n_shared_experts=get("n_shared_experts", int, 1),
            moe_intermediate_size=get("moe_intermediate_size", int),
            vocab_size=get("vocab_size", int), num_hidden_layers=n_layers,
            compress_ratios=ratios, index_n_heads=get("index_n_heads", int),
            index_head_dim=get("index_head_dim", int), index_topk=get("index_topk", int),
            rope_theta=rope_theta, compress_rope_theta=compress_theta, rope_scaling=scaling,
            max_position_embeddings=get("max_position_embeddings", int),
            scoring_func=scoring,
            routed_scaling_factor=get("routed_scaling_factor", float, 1.5),
            swiglu_limit=get("swiglu_limit", float, 10.0), num_hash_layers=n_hash,
            bos_token_id=bos, eos_token_id=eos,
            num_nextn_predict_layers=get("num_nextn_predict_layers", int, 1),
        )
        if cfg.n_shared_experts != 1:
            raise ConfigError(f"config.json: n_shared_experts={cfg.n_shared_experts}; only 1 is "
                              "implemented")
        cfg = cfg.validate()
        if cfg.num_experts_per_tok > cfg.n_routed_experts:  # (an EP rank's shard config holds fewer)
            raise ConfigError(f"config.json: num_experts_per_tok={cfg.num_experts_per_tok} exceeds "
                              f"n_routed_experts={cfg.n_routed_experts}")
        return cfg

    def to_hf(self) -> dict:
        """The HF ``config.json`` dict of this config (inverse of :meth:`from_hf`).

        Written the way transformers 5.23.0 ``save_pretrained`` writes it: ``layer_types``,
        ``mlp_layer_types``, ``partial_rotary_factor`` and nested ``rope_parameters``
        (``main`` default, ``compress`` YaRN with ``attention_factor`` 1).
        """
        ys = self.rope_scaling
        prf = self.qk_rope_head_dim / self.head_dim
        n = self.num_hidden_layers
        return {
            "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
            "dtype": "float32", "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "moe_intermediate_size": self.moe_intermediate_size, "num_hidden_layers": n,
            "num_attention_heads": self.num_attention_heads, "num_key_value_heads": 1,
            "head_dim": self.head_dim, "q_lora_rank": self.q_lora_rank,
            "partial_rotary_factor": prf, "qk_rope_head_dim": self.qk_rope_head_dim,
            "num_experts_per_tok": self.num_experts_per_tok,
            "n_routed_experts": self.n_routed_experts, "n_shared_experts": self.n_shared_experts,
            "scoring_func": self.scoring_func, "norm_topk_prob": True,
            "routed_scaling_factor": self.routed_scaling_factor,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta, "compress_rope_theta": self.compress_rope_theta,
            "rope_parameters": {
                "main": {"rope_type": "default", "rope_theta": self.rope_theta,
                         "partial_rotary_factor": prf},
                "compress": {"rope_type": "yarn", "rope_theta": self.compress_rope_theta,
                             "partial_rotary_factor": prf, "factor": ys.factor,
                             "beta_fast": ys.beta_fast, "beta_slow": ys.beta_slow,
                             "original_max_position_embeddings":
                                 ys.original_max_position_embeddings,
                             "attention_factor": 1.0}},
            "layer_types": list(self.layer_types),
            "compress_rates": {"compressed_sparse_attention": 4,
                               "heavily_compressed_attention": 128},
            "mlp_layer_types": ["hash_moe" if i < self.num_hash_layers else "moe"
                                for i in range(n)],
            "swiglu_limit": self.swiglu_limit, "sliding_window": self.sliding_window,
            "o_groups": self.o_groups, "o_lora_rank": self.o_lora_rank,
            "index_n_heads": self.index_n_heads, "index_head_dim": self.index_head_dim,
            "index_topk": self.index_topk, "hc_mult": self.hc_mult,
            "hc_sinkhorn_iters": self.hc_sinkhorn_iters, "hc_eps": self.hc_eps,
            "rms_norm_eps": self.rms_norm_eps, "tie_word_embeddings": False,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_id) if isinstance(self.eos_token_id, tuple) else self.eos_token_id,
            "num_nextn_predict_layers": self.num_nextn_predict_layers,
            "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
        }


@dataclass(frozen=True)
class KernelConfig(DeepSeekV4Config):
    """A kernel's build config: a model config plus the deployment geometry of its tensors.

    The fields below are a :class:`DeploymentConfig`'s (page rows, pool page counts, decode
    and prefill geometry); ``max_position_embeddings`` is the context the kernels' block and
    RoPE tables cover (for a served model: the deployment's ``max_context``, see
    :func:`kernel_config`). The presets of :data:`PRESETS` are KernelConfigs: each model
    preset with the reference kernels' geometry (pypto-lib ``models/deepseek/v4-flash/config.py``).

    Raises:
        ConfigError: from :meth:`validate`, also when ``max_position_embeddings`` is not a
            multiple of ``block_size``.
    """

    # deployment geometry (pypto-lib `models/deepseek/v4-flash/config.py`)
    block_size: int = 128  # paged-KV page rows
    ori_kv_block_num: int = 128  # raw / SWA kv pages
    cmp_kv_block_num: int = 32  # compressed kv pages
    hca_state_block_size: int = 8  # ratio-128 compressor state page rows
    hca_state_block_num: int = 64
    decode_batch: int = 4
    decode_seq: int = 2
    prefill_seq: int = 128
    # "int8": W8A8 kernels (INT8 weights and activations, FP32 scales); "bf16": unquantised
    # kernels (BF16 weights and activations into BF16 x BF16 -> FP32 matmuls); weight_format.py
    weight_format: str = "int8"

    @property
    def max_blocks_per_seq(self) -> int:
        """Block-table length of one request: ``max_position_embeddings // block_size``."""
        return self.max_position_embeddings // self.block_size

    @property
    def decode_tokens(self) -> int:
        """Tokens of one decode step: ``decode_batch * decode_seq``."""
        return self.decode_batch * self.decode_seq

    @property
    def model(self) -> DeepSeekV4Config:
        """The model config alone (the geometry dropped)."""
        return DeepSeekV4Config(**{f.name: getattr(self, f.name) for f in dataclasses.fields(DeepSeekV4Config)})

    def validate(self) -> "KernelConfig":
        """:meth:`DeepSeekV4Config.validate` plus the page checks; returns ``self``.

        Raises:
            ConfigError: naming the first inconsistent field.
        """
        super().validate()
        if self.weight_format not in ("int8", "bf16"):
            raise ConfigError(f"config {self.name!r}: weight_format must be 'int8' or 'bf16', "
                              f"got {self.weight_format!r}")
        if self.max_position_embeddings % self.block_size:
            raise ConfigError(f"config {self.name!r}: max_position_embeddings={self.max_position_embeddings} "
                              f"not a multiple of block_size={self.block_size}")
        return self


_FLASH_RATIOS = (0, 0) + tuple(4 if i % 2 == 0 else 128 for i in range(41))

PRESETS: dict[str, KernelConfig] = {
    "flash": KernelConfig(
        name="flash", hidden_size=4096, num_attention_heads=64, head_dim=512,
        qk_rope_head_dim=64, q_lora_rank=1024, o_lora_rank=1024, o_groups=8,
        sliding_window=128, rms_norm_eps=1e-6, hc_mult=4, hc_sinkhorn_iters=20,
        hc_eps=1e-6, n_routed_experts=256, num_experts_per_tok=6, n_shared_experts=1,
        moe_intermediate_size=2048, vocab_size=129280, num_hidden_layers=43,
        compress_ratios=_FLASH_RATIOS, index_n_heads=64, index_head_dim=128,
        index_topk=512,
    ),
    # DeepSeek-V4-Pro-like sizes: wider model, same kernel structure.
    "pro": KernelConfig(
        name="pro", hidden_size=7168, num_attention_heads=128, head_dim=512,
        qk_rope_head_dim=64, q_lora_rank=1536, o_lora_rank=1024, o_groups=16,
        sliding_window=128, rms_norm_eps=1e-6, hc_mult=4, hc_sinkhorn_iters=20,
        hc_eps=1e-6, n_routed_experts=384, num_experts_per_tok=6, n_shared_experts=1,
        moe_intermediate_size=3072, vocab_size=129280, num_hidden_layers=61,
        compress_ratios=(0, 0) + tuple(4 if i % 2 == 0 else 128 for i in range(59)),
        index_n_heads=64, index_head_dim=128, index_topk=1024,
    ),
    # A mid-size preset for quick demos: FLASH structure at a quarter of the width.
    "demo": KernelConfig(
        name="demo", hidden_size=1024, num_attention_heads=16, head_dim=256,
        qk_rope_head_dim=64, q_lora_rank=256, o_lora_rank=256, o_groups=4,
        sliding_window=128, rms_norm_eps=1e-6, hc_mult=4, hc_sinkhorn_iters=20,
        hc_eps=1e-6, n_routed_experts=32, num_experts_per_tok=4, n_shared_experts=1,
        moe_intermediate_size=256, vocab_size=8192, num_hidden_layers=6,
        compress_ratios=(0, 0, 4, 128, 4, 128), index_n_heads=16, index_head_dim=128,
        index_topk=64,
    ),
    "tiny": KernelConfig(
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


def get_config(name: str) -> KernelConfig:
    """The preset called ``name`` (``flash``, ``pro``, ``demo``, ``tiny``): the model with the
    reference kernels' geometry (:class:`KernelConfig`; ``.model`` is the model alone).

    Raises:
        ConfigError: for an unknown preset name, listing the known ones.
    """
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown preset {name!r}; known presets: {sorted(PRESETS)}") from None


# Presets from the smallest to the largest model (for ``capped_preset``).
PRESET_SIZE_ORDER = ("tiny", "demo", "flash", "pro")


def capped_preset(preset: str, max_preset: str | None) -> str:
    """``preset``, or ``max_preset`` when that is smaller (:data:`PRESET_SIZE_ORDER`): the preset
    the demo and the benchmarks run a ``KernelCase`` with ``max_preset`` at (e.g. the MoE
    kernels, whose 256 FLASH experts are 6 GiB of INT8 weights, run at ``demo``).

    Raises:
        ConfigError: an unknown preset name.
    """
    get_config(preset)
    if max_preset is None:
        return preset
    get_config(max_preset)
    return min(preset, max_preset, key=PRESET_SIZE_ORDER.index)


@dataclass(frozen=True)
class DeploymentConfig:
    """Serving geometry of one deployment, separate from the model (README.md).

    Units: ``block_size`` and ``hca_state_block_size`` are token rows per page;
    ``*_block_num`` are page counts of each pool (shared by every request of one layer);
    ``max_requests`` is the number of requests a cache holds at once; ``max_context`` the
    longest request in tokens (prompt + generated), at most the model's
    ``max_position_embeddings``; ``rope_max_pos`` the RoPE table length in positions;
    ``decode_batch`` x ``decode_seq`` the decode step's token geometry and ``prefill_seq``
    the prefill chunk capacity in tokens (pypto-lib `models/deepseek/v4-flash/` "Deployment/implementation
    constants").

    Raises:
        ConfigError: from :meth:`validate` naming the first inconsistent field.
    """

    block_size: int = 128
    ori_kv_block_num: int = 128
    cmp_kv_block_num: int = 32
    hca_state_block_size: int = 8
    hca_state_block_num: int = 64
    csa_state_block_num: int = 136  # ratio-4 compressor-state pages (4 rows, one window each)
    max_requests: int = 4
    max_context: int = 16384
    rope_max_pos: int = 16384
    decode_batch: int = 4
    decode_seq: int = 2
    prefill_seq: int = 128

    @property
    def max_blocks_per_seq(self) -> int:
        """Block-table length of one request: ``ceil(max_context / block_size)``."""
        return -(-self.max_context // self.block_size)

    @property
    def decode_tokens(self) -> int:
        """Tokens of one decode step: ``decode_batch * decode_seq``."""
        return self.decode_batch * self.decode_seq

    def validate(self, model: DeepSeekV4Config | None = None) -> "DeploymentConfig":
        """Check the fields (and against ``model`` if given); returns ``self``.

        Raises:
            ConfigError: a non-positive field, ``rope_max_pos < max_context``, or
                ``max_context`` above the model's ``max_position_embeddings``.
        """
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ConfigError(f"deployment: {f.name} must be a positive integer, got {v!r}")
        if self.rope_max_pos < self.max_context:
            raise ConfigError(f"deployment: rope_max_pos={self.rope_max_pos} is shorter than "
                              f"max_context={self.max_context}")
        if model is not None and self.max_context > model.max_position_embeddings:
            raise ConfigError(f"deployment: max_context={self.max_context} exceeds the model's "
                              f"max_position_embeddings={model.max_position_embeddings}")
        return self

    def replace(self, **changes) -> "DeploymentConfig":
        """A copy with ``changes`` applied and validated (raises ConfigError)."""
        return dataclasses.replace(self, **changes).validate()

    @classmethod
    def sized(cls, cfg: DeepSeekV4Config, max_requests: int = 4, max_context: int = 16384, *,
              block_size: int = 128, prefill_seq: int = 128, hca_state_block_size: int = 8,
              **changes) -> "DeploymentConfig":
        """A deployment whose page pools hold ``max_requests`` requests of ``max_context`` tokens.

        Pages per request (``W = sliding_window``, ``bs = block_size``, ``C = prefill_seq``):
        raw ``ceil((W - 1 + C) / bs) + 1`` (a chunk and the window before it: pages behind the
        window are returned); compressed ``ceil(ceil(max_context / 4) / bs)`` (the CSA entries,
        HCA needs fewer); ratio-4 state ``C / 4 + 2`` (the windows of a chunk and the one
        before); ratio-128 state ``2 * 128 / hca_state_block_size`` (two windows).

        Raises:
            ConfigError: a field out of range (see :meth:`validate`).
        """
        W = cfg.sliding_window
        per_raw = -(-(W - 1 + prefill_seq) // block_size) + 1
        per_cmp = -(-(-(-max_context // 4)) // block_size)
        base = dict(block_size=block_size, ori_kv_block_num=max_requests * per_raw,
                    cmp_kv_block_num=max_requests * per_cmp, hca_state_block_size=hca_state_block_size,
                    hca_state_block_num=max_requests * 2 * 128 // hca_state_block_size,
                    csa_state_block_num=max_requests * (prefill_seq // 4 + 2), max_requests=max_requests,
                    max_context=max_context, rope_max_pos=max_context, prefill_seq=prefill_seq)
        base.update(changes)
        return cls(**base).validate(cfg)

    @classmethod
    def of_model(cls, cfg: KernelConfig, **changes) -> "DeploymentConfig":
        """The deployment geometry of a kernel config (``cfg.block_size`` ...),
        ``max_context`` / ``rope_max_pos`` = ``cfg.max_position_embeddings``, plus ``changes``.
        """
        base = dict(block_size=cfg.block_size, ori_kv_block_num=cfg.ori_kv_block_num,
                    cmp_kv_block_num=cfg.cmp_kv_block_num,
                    hca_state_block_size=cfg.hca_state_block_size,
                    hca_state_block_num=cfg.hca_state_block_num,
                    max_context=cfg.max_position_embeddings,
                    rope_max_pos=cfg.max_position_embeddings, decode_batch=cfg.decode_batch,
                    decode_seq=cfg.decode_seq, prefill_seq=cfg.prefill_seq)
        base.update(changes)
        return cls(**base).validate()


DEPLOYMENTS: dict[str, DeploymentConfig] = {
    "flash": DeploymentConfig.sized(PRESETS["flash"]),
    "pro": DeploymentConfig.sized(PRESETS["pro"]),
    "demo": DeploymentConfig.sized(PRESETS["demo"]),
    # tiny: 4 requests of up to 1024 tokens (a 509-token prompt plus generation), 16-row pages
    "tiny": DeploymentConfig.sized(PRESETS["tiny"], 4, 1024, block_size=16),
}
for _dep in DEPLOYMENTS.values():
    _dep.validate()


def get_deployment(name: str) -> DeploymentConfig:
    """The deployment preset called ``name`` (same names as :data:`PRESETS`).

    Raises:
        ConfigError: for an unknown name, listing the known ones.
    """
    try:
        return DEPLOYMENTS[name]
    except KeyError:
        raise ConfigError(f"unknown deployment {name!r}; known: {sorted(DEPLOYMENTS)}") from None


def kernel_config(cfg: DeepSeekV4Config, dep: DeploymentConfig, weight_format: str = "int8") -> KernelConfig:
    """The :class:`KernelConfig` the kernels of a deployment are built for: ``cfg``'s model
    fields, ``dep``'s geometry, ``weight_format`` (``"int8"``: W8A8, ``"bf16"``: unquantised
    kernels) and ``max_position_embeddings`` = ``dep.max_context`` rounded up to a page (the
    context the kernels' block and RoPE tables cover).

    Raises:
        ConfigError: an inconsistent result (see :meth:`KernelConfig.validate`).
    """
    ctx = -(-dep.max_context // dep.block_size) * dep.block_size
    model = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(DeepSeekV4Config)}
    model["max_position_embeddings"] = ctx
    return KernelConfig(**model, block_size=dep.block_size, ori_kv_block_num=dep.ori_kv_block_num,
                        cmp_kv_block_num=dep.cmp_kv_block_num, hca_state_block_size=dep.hca_state_block_size,
                        hca_state_block_num=dep.hca_state_block_num, decode_batch=dep.decode_batch,
                        decode_seq=dep.decode_seq, prefill_seq=dep.prefill_seq,
                        weight_format=weight_format).validate()
