"""Transformers parity fixtures: a tiny random DeepSeek-V4 checkpoint and one captured forward.

The session fixture :func:`hf_run` builds ``transformers.DeepseekV4ForCausalLM`` (5.23.0) at
the ``tiny`` preset of :mod:`pto.models.deepseek_v4.config` (transformers `models/deepseek_v4/modeling_deepseek_v4.py`, TINY
column): hidden 128, 8 heads of 128 (rope 64 = partial rotary 0.5), q_lora 64, o_groups 4 x
o_lora 32, window 64, layers sliding, sliding, CSA, HCA, CSA, HCA, hash MoE on layers 0-2,
16 experts top-4 (sqrtsoftplus, x1.5, swiglu limit 10), indexer 16 heads x 128 top-16,
hc_mult 4 (20 Sinkhorn iterations), RoPE theta 1e4 / compress 1.6e5 with YaRN (factor 16,
beta 32/1, original context 65536, attention factor 1).

Every parameter is re-initialised from one seeded generator at unit scale (see
:func:`_reinit_unit_scale`), so the attention sinks, compressor position biases (``ape``), HC
biases/scales, router bias and hash table are all non-trivial. The model is float32 and eager
(attention and experts), is saved with ``save_pretrained`` (safetensors) in a temporary
directory and reloaded with ``from_pretrained``; the reloaded state must equal the saved one
bit for bit. One no-cache forward over :data:`PARITY_TOKENS` random tokens (positions
0..S-1) runs with forward hooks on every module recording inputs (positional and keyword)
and outputs, plus a torch-function mode that records the two ``torch.sigmoid`` results inside
each hyper-connection (HF consumes ``pre`` internally and returns only post/comb/collapsed).

S = 461: three complete HCA windows (positions 0..383) and a 77-token tail that must be
dropped; 115 CSA entries of which the indexer keeps 16 per late query (a strict subset).

The golden argument mapping (HF ``nn.Linear`` weights are ``[out, in]``; the goldens take
``[in, out]`` for the qkv projections and the HF layout for the o-projection and the
compressor, transformers `models/deepseek_v4/modeling_deepseek_v4.py`) lives in :class:`ParityRun`.
"""

from __future__ import annotations

import math
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from pto.models.deepseek_v4.config import DeepSeekV4Config, get_config
from pto.models.deepseek_v4.rope import profile_for_ratio, rope_tables

_HERE = Path(__file__).resolve().parent
PARITY_SEED = 20260611  # generator seed of the weights and the token ids
PARITY_TOKENS = 461  # S: 3 closed HCA windows + a 77-token tail; 115 CSA entries
# torch intra-op threads for the forward and the tests: the tensors are tiny, and on the
# shared 2-core machine one thread avoids oversubscription stalls (results differ from a
# 2-thread run only in the last bits, transformers `models/deepseek_v4/modeling_deepseek_v4.py`).
PARITY_THREADS = 1

_LAYER_TYPE_OF_RATIO = {
    0: "sliding_attention",
    4: "compressed_sparse_attention",
    128: "heavily_compressed_attention",
}


def pytest_configure(config) -> None:
    """Register the ``parity`` marker (``pytest -m parity`` runs only these tests)."""
    config.addinivalue_line("markers", "parity: transformers parity tests (tests/parity)")


def pytest_collection_modifyitems(config, items) -> None:
    """Mark every test collected under tests/parity with ``parity``."""
    here = str(_HERE)
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.parity)


def hf_config_from_preset(cfg: DeepSeekV4Config):
    """The ``transformers.DeepseekV4Config`` equivalent of a pto preset.

    Field mapping: ``qk_rope_head_dim`` becomes ``partial_rotary_factor = r / head_dim``;
    ``compress_ratios`` (0 / 4 / 128) become ``layer_types``; ``num_hash_layers`` becomes
    ``mlp_layer_types``; ``rope_scaling`` becomes the YaRN ``rope_parameters`` (HF forces
    ``attention_factor = 1`` for the compress profile). ``max_position_embeddings`` is set to
    ``factor * original_max_position_embeddings`` (the YaRN-consistent value HF expects; the
    inverse frequencies do not depend on it).

    Raises:
        ImportError: transformers is not installed (callers use ``pytest.importorskip``).
    """
    from transformers import DeepseekV4Config as HFConfig

    ys = cfg.rope_scaling
    n = cfg.num_hidden_layers
    return HFConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        moe_intermediate_size=cfg.moe_intermediate_size, num_hidden_layers=n,
        num_attention_heads=cfg.num_attention_heads, num_key_value_heads=1,
        head_dim=cfg.head_dim, q_lora_rank=cfg.q_lora_rank,
        partial_rotary_factor=cfg.qk_rope_head_dim / cfg.head_dim,
        num_experts_per_tok=cfg.num_experts_per_tok, n_routed_experts=cfg.n_routed_experts,
        n_shared_experts=cfg.n_shared_experts, scoring_func=cfg.scoring_func,
        routed_scaling_factor=cfg.routed_scaling_factor,
        max_position_embeddings=int(ys.factor * ys.original_max_position_embeddings),
        rope_theta=cfg.rope_theta, compress_rope_theta=cfg.compress_rope_theta,
        rope_parameters={"rope_type": "yarn", "factor": ys.factor, "beta_fast": ys.beta_fast,
                         "beta_slow": ys.beta_slow,
                         "original_max_position_embeddings": ys.original_max_position_embeddings},
        layer_types=[_LAYER_TYPE_OF_RATIO[r] for r in cfg.compress_ratios],
        mlp_layer_types=["hash_moe" if i < cfg.num_hash_layers else "moe" for i in range(n)],
        swiglu_limit=cfg.swiglu_limit, sliding_window=cfg.sliding_window,
        o_groups=cfg.o_groups, o_lora_rank=cfg.o_lora_rank, index_n_heads=cfg.index_n_heads,
        index_head_dim=cfg.index_head_dim, index_topk=cfg.index_topk, hc_mult=cfg.hc_mult,
        hc_sinkhorn_iters=cfg.hc_sinkhorn_iters, hc_eps=cfg.hc_eps,
        rms_norm_eps=cfg.rms_norm_eps, tie_word_embeddings=False,
    )


def _reinit_unit_scale(model, cfg: DeepSeekV4Config, gen: torch.Generator) -> None:
    """Re-initialise every parameter and persistent buffer at unit scale (in place).

    Rules, by name, in ``named_parameters`` order (one generator, so the result is seeded):

    * norm weights (``*norm.weight``, 1-D): ``1 + 0.1 * N(0, 1)`` (around 1);
    * ``embed_tokens``, ``sinks``, ``position_bias`` (compressor / indexer ``ape``), HC
      ``base`` / ``hc_base``: ``N(0, 1)``;
    * HC ``scale`` / ``hc_scale``: ``U(0.5, 1.5)`` (positive, order 1);
    * every other matrix (``nn.Linear`` weights, HC ``fn``, expert stacks): ``N(0, 1) /
      sqrt(fan_in)`` with ``fan_in = shape[-1]``, so each projection has unit-variance
      outputs for unit-variance inputs;
    * buffers: router ``e_score_correction_bias`` ``N(0, 1)``; hash table ``tid2eid``
      ``[V, K]`` rows of ``K`` distinct expert ids (a random permutation prefix per token).

    Raises:
        AssertionError: a parameter matched no rule (new HF parameter names).
    """
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif leaf in ("sinks", "position_bias", "base", "hc_base") or "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            elif leaf in ("scale", "hc_scale"):
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
            else:
                assert p.dim() >= 2, f"no re-init rule for parameter {name} {tuple(p.shape)}"
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=gen))
            elif name.endswith("tid2eid"):
                V, K = b.shape
                rows = [torch.randperm(cfg.n_routed_experts, generator=gen)[:K] for _ in range(V)]
                b.copy_(torch.stack(rows))


def _detach(obj: Any) -> Any:
    """Deep copy of tensors inside tuples / lists / dicts (detached clones); rest as is."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, tuple):
        return tuple(_detach(o) for o in obj)
    if isinstance(obj, list):
        return [_detach(o) for o in obj]
    if isinstance(obj, dict):
        return {k: _detach(v) for k, v in obj.items()}
    return obj


@dataclass
class Capture:
    """One recorded module call: positional ``args``, keyword ``kwargs`` and ``output``."""

    args: tuple
    kwargs: dict
    output: Any


class _SigmoidRecorder(torch.overrides.TorchFunctionMode):
    """Records ``torch.sigmoid`` results while a hyper-connection module is running.

    Entered by the HC module's forward pre-hook and left by its forward hook, so only the
    ops of ``attn_hc`` / ``ffn_hc`` pass through it (HF computes ``pre`` and ``post`` there
    with exactly two ``torch.sigmoid`` calls, in that order).
    """

    def __init__(self) -> None:
        super().__init__()
        self.current: str | None = None
        self.records: dict[str, list[torch.Tensor]] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.current is not None and func in (torch.sigmoid, torch.Tensor.sigmoid):
            self.records.setdefault(self.current, []).append(out.detach().clone())
        return out


@dataclass
class CompareResult:
    """Error statistics of one parity comparison (see :meth:`ParityRun.compare`)."""

    label: str
    max_abs: float
    max_rel: float
    worst_ratio: float
    atol: float
    rtol: float


@dataclass
class ParityRun:
    """The reloaded HF model, its inputs and every captured module call of one forward.

    Attributes:
        cfg: the pto ``tiny`` preset the checkpoint was built from.
        hf_config: the transformers config.
        model: reloaded ``DeepseekV4ForCausalLM`` (float32, eager, eval mode).
        input_ids: ``[1, S]`` int64 token ids.
        positions: ``[S]`` int64 absolute positions ``0..S-1``.
        calls: module name (``named_modules`` key) -> list of :class:`Capture` in call order.
        hc_sigmoids: HC module name -> ``[sigmoid(pre logits), sigmoid(post logits)]``.
        checkpoint_keys: tensor names in the saved safetensors file.
        timings: seconds spent building, saving/loading and running the forward.
    """

    cfg: DeepSeekV4Config
    hf_config: Any
    model: Any
    input_ids: torch.Tensor
    positions: torch.Tensor
    calls: dict[str, list[Capture]]
    hc_sigmoids: dict[str, list[torch.Tensor]]
    checkpoint_keys: list[str]
    timings: dict[str, float]
    results: list[CompareResult] = field(default_factory=list)

    # ---- raw access --------------------------------------------------------------------
    @property
    def S(self) -> int:
        """Number of tokens in the forward."""
        return int(self.input_ids.shape[1])

    def call(self, name: str, index: int = 0) -> Capture:
        """Capture ``index`` of module ``name`` (raises KeyError naming the module)."""
        if name not in self.calls:
            raise KeyError(f"no captured call of module {name!r}")
        return self.calls[name][index]

    def param(self, name: str) -> torch.Tensor:
        """A parameter or buffer of the reloaded model by its HF module name (detached)."""
        state = self.model.state_dict()
        if name not in state:
            raise KeyError(f"no parameter {name!r} in the HF model")
        return state[name].detach()

    def layer_ratio(self, layer: int) -> int:
        """Compress ratio (0, 4, 128) of ``layer`` from the pto config."""
        return self.cfg.compress_ratios[layer]

    def rope_rows(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token ``[S, r]`` FP32 cos / sin rows of the layer's RoPE profile (pto tables)."""
        cos, sin = rope_tables(self.cfg, profile_for_ratio(self.layer_ratio(layer)), max_pos=self.S)
        return cos[self.positions], sin[self.positions]

    # ---- HF -> golden argument mapping ------------------------------------------------
    def hc_args(self, layer: int, site: str) -> dict[str, torch.Tensor]:
        """``golden_hc_pre`` arguments of ``site`` ("attn" or "ffn") of ``layer``.

        ``x [S, hc, D]`` is the HC module's captured input stream; ``hc_fn [24, hc*D]``,
        ``hc_scale [3]``, ``hc_base [24]`` are ``layers.L.{site}_hc.{fn,scale,base}`` (same
        layout in HF and the golden; upstream names ``hc_{site}_{fn,scale,base}``).
        """
        p = f"model.layers.{layer}.{site}_hc"
        return {
            "x": self.call(p).args[0][0],
            "hc_fn": self.param(f"{p}.fn"),
            "hc_scale": self.param(f"{p}.scale"),
            "hc_base": self.param(f"{p}.base"),
        }

    def qkv_args(self, layer: int) -> dict[str, torch.Tensor | None]:
        """``golden_qkv_proj_rope`` arguments (``weight_format="bf16"``) of ``layer``.

        ``x`` is HF's ``input_layernorm`` output (the attention input). HF ``nn.Linear``
        weights are ``[out, in]``; the golden takes ``wq_a [D, q_lora]``, ``wq_b [q_lora,
        H*d]``, ``wkv [D, d]``, i.e. the transposes. ``gamma_cq`` / ``gamma_ckv`` are
        ``q_a_norm`` / ``kv_norm`` weights; cos/sin rows come from the layer's profile.
        """
        a = f"model.layers.{layer}.self_attn"
        cos, sin = self.rope_rows(layer)
        return {
            "x": self.call(f"model.layers.{layer}.input_layernorm").output[0],
            "wq_a": self.param(f"{a}.q_a_proj.weight").T.contiguous(),
            "wq_b": self.param(f"{a}.q_b_proj.weight").T.contiguous(),
            "wq_b_scale": None,
            "wkv": self.param(f"{a}.kv_proj.weight").T.contiguous(),
            "rope_cos": cos,
            "rope_sin": sin,
            "gamma_cq": self.param(f"{a}.q_a_norm.weight"),
            "gamma_ckv": self.param(f"{a}.kv_norm.weight"),
        }

    def swa_inputs(self, layer: int) -> dict:
        """``golden_prefill_attention_swa`` inputs for a sliding ``layer`` (one request).

        ``x_hc`` is the layer's input stream (``attn_hc`` input). The raw cache is a float32
        ``[ori_kv_block_num, block_size, 1, d]`` zero pool with an identity block table and
        ``ori_slot_mapping[t] = t`` (token ``t`` at position ``t``); tables are the FP32
        main-profile RoPE. Weights: as :meth:`qkv_args`, plus ``attn_norm_w`` =
        ``input_layernorm.weight``, ``attn_sink`` = ``sinks``, ``wo_a [G, o_lora, (H/G)*d]``
        = ``o_a_proj.weight.view(G, o_lora, -1)`` (HF ``[G*o_lora, (H/G)*d]``, group g = rows
        ``g*o_lora ..``), ``wo_b [D, G*o_lora]`` = ``o_b_proj.weight`` (same layout).

        Raises:
            AssertionError: ``layer`` is not a sliding layer or S exceeds the raw pool.
        """
        cfg = self.cfg
        assert self.layer_ratio(layer) == 0, f"layer {layer} is not a sliding layer"
        S, hd, bs, pages = self.S, cfg.head_dim, cfg.block_size, cfg.ori_kv_block_num
        assert S <= pages * bs, f"S={S} exceeds the raw cache pool ({pages * bs} rows)"
        a = f"model.layers.{layer}.self_attn"
        q = self.qkv_args(layer)
        blk = torch.arange(cfg.max_blocks_per_seq)
        cos, sin = rope_tables(cfg, "main", max_pos=S)
        G, Lo = cfg.o_groups, cfg.o_lora_rank
        hc = self.hc_args(layer, "attn")
        return {
            "x_hc": hc["x"], "hc_attn_fn": hc["hc_fn"], "hc_attn_scale": hc["hc_scale"],
            "hc_attn_base": hc["hc_base"],
            "attn_norm_w": self.param(f"model.layers.{layer}.input_layernorm.weight"),
            "wq_a": q["wq_a"], "wq_b": q["wq_b"], "wq_b_scale": None, "wkv": q["wkv"],
            "gamma_cq": q["gamma_cq"], "gamma_ckv": q["gamma_ckv"],
            "freqs_cos": cos, "freqs_sin": sin,
            "kv_cache": torch.zeros(pages, bs, 1, hd),
            "block_table": torch.where(blk < pages, blk, torch.full_like(blk, -1)).to(torch.int32),
            "ori_slot_mapping": torch.arange(S, dtype=torch.int64),
            "position_ids": self.positions.to(torch.int32),
            "attn_sink": self.param(f"{a}.sinks"),
            "wo_a": self.param(f"{a}.o_a_proj.weight").view(G, Lo, -1),
            "wo_b": self.param(f"{a}.o_b_proj.weight"),
            "wo_b_scale": None,
            "num_tokens": S,
        }

    def compressor_inputs(self, layer: int) -> dict:
        """``golden_prefill_compressor_ratio128`` inputs for an HCA ``layer``, one call of S.

        ``x`` = ``input_layernorm`` output (FP32). ``wkv`` / ``wgate`` =
        ``compressor.kv_proj`` / ``gate_proj`` weights ``[d, D]`` (the golden uses ``x @
        w^T`` like HF, no transpose), ``ape`` = ``compressor.position_bias [128, d]``,
        ``norm_w`` = ``compressor.kv_norm.weight``; FP32 compress-profile tables. Empty FP32
        state (ring of ``hca_state_block_num`` pages, identity table) and an FP32 compressed
        pool with an identity page table: entry ``w`` (closed by token ``128w + 127``) goes
        to flat row ``w``; every token writes its state row ``t``.

        Raises:
            AssertionError: ``layer`` is not HCA or S exceeds the state ring.
        """
        cfg = self.cfg
        assert self.layer_ratio(layer) == 128, f"layer {layer} is not an HCA layer"
        S, d, M = self.S, cfg.head_dim, 128
        page, spages = cfg.hca_state_block_size, cfg.hca_state_block_num
        assert S <= page * spages, f"S={S} exceeds the HCA state ring ({page * spages} rows)"
        c = f"model.layers.{layer}.self_attn.compressor"
        cos, sin = rope_tables(cfg, "compress", max_pos=S)
        pos = self.positions
        closes = (pos + 1) % M == 0
        cmp_slot = torch.where(closes, (pos + 1) // M - 1, torch.full_like(pos, -1))
        return {
            "x": self.call(f"model.layers.{layer}.input_layernorm").output[0],
            "compress_state": torch.zeros(spages, page, 2 * d),
            "state_block_table": (torch.arange(cfg.max_position_embeddings // page)
                                  % spages).to(torch.int32),
            "wkv": self.param(f"{c}.kv_proj.weight"),
            "wgate": self.param(f"{c}.gate_proj.weight"),
            "ape": self.param(f"{c}.position_bias"),
            "norm_w": self.param(f"{c}.kv_norm.weight"),
            "cos_table": cos, "sin_table": sin,
            "cmp_kv": torch.zeros(cfg.cmp_kv_block_num, cfg.block_size, 1, d),
            "position_ids": pos.to(torch.int32),
            "num_tokens": S,
            "cmp_slot_mapping": cmp_slot.to(torch.int64),
            "state_slot_mapping": pos.to(torch.int64),
        }

    # ---- comparison --------------------------------------------------------------------
    def compare(self, label: str, got: torch.Tensor, want: torch.Tensor, *, atol: float,
                rtol: float) -> CompareResult:
        """Compare a golden result with the HF value, print the errors and assert.

        Prints ``max_abs = max|got - want|``, ``max_rel = max|got - want| / max|want|``
        (norm-wise, so near-zero elements do not dominate) and ``worst = max(|got - want| /
        (atol + rtol*|want|))``; passes iff ``worst <= 1`` (i.e. ``torch.allclose(got, want,
        rtol, atol)``) and shapes agree.

        Raises:
            AssertionError: shape mismatch, a non-finite value, or an element out of tolerance.
        """
        assert tuple(got.shape) == tuple(want.shape), \
            f"{label}: shape {tuple(got.shape)} vs HF {tuple(want.shape)}"
        g, w = got.double(), want.double()
        assert bool(torch.isfinite(g).all()) and bool(torch.isfinite(w).all()), \
            f"{label}: non-finite values"
        diff = (g - w).abs()
        res = CompareResult(label, float(diff.max()),
                            float(diff.max() / w.abs().max().clamp_min(1e-30)),
                            float((diff / (atol + rtol * w.abs())).max()), atol, rtol)
        self.results.append(res)
        print(f"[parity] {label}: max_abs={res.max_abs:.3e} max_rel={res.max_rel:.3e} "
              f"(tol atol={atol:g} rtol={rtol:g}, worst={res.worst_ratio:.3f})")
        assert res.worst_ratio <= 1.0, (
            f"{label}: out of tolerance, max_abs={res.max_abs:.3e} max_rel={res.max_rel:.3e} "
            f"worst ratio {res.worst_ratio:.3f} (atol={atol}, rtol={rtol})")
        return res


def build_parity_run(cfg: DeepSeekV4Config, seq_len: int, seed: int) -> ParityRun:
    """Build, save, reload and run the tiny checkpoint; see the module docstring.

    Raises:
        AssertionError: the reloaded state differs from the saved one, or a checkpoint
            tensor is missing.
    """
    from safetensors import safe_open
    from transformers import DeepseekV4ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    hf_config = hf_config_from_preset(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):  # HF's own init draws from the global RNG
        model = DeepseekV4ForCausalLM(hf_config)
    _reinit_unit_scale(model, cfg, gen)
    saved = {k: v.detach().clone() for k, v in model.state_dict().items()}
    timings["build"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pto_parity_") as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        with safe_open(f"{tmp}/model.safetensors", framework="pt") as f:
            checkpoint_keys = sorted(f.keys())
        with torch.random.fork_rng(devices=[]):
            model = DeepseekV4ForCausalLM.from_pretrained(
                tmp, dtype=torch.float32, attn_implementation="eager",
                experts_implementation="eager")
    model.eval()
    loaded = model.state_dict()
    assert set(loaded) == set(saved), f"state keys differ: {set(loaded) ^ set(saved)}"
    for k, v in saved.items():
        assert torch.equal(loaded[k], v), f"reloaded tensor {k} differs from the saved one"
    timings["save_load"] = time.perf_counter() - t0

    input_ids = torch.randint(0, cfg.vocab_size, (1, seq_len), generator=gen)
    calls: dict[str, list[Capture]] = {}
    recorder = _SigmoidRecorder()
    handles = []
    for name, module in model.named_modules():
        if not name:
            continue

        is_hc = name.endswith(("attn_hc", "ffn_hc"))

        def hook(mod, args, kwargs, output, _name=name, _is_hc=is_hc):
            if _is_hc:  # leave the sigmoid recorder entered by the pre-hook
                recorder.__exit__(None, None, None)
                recorder.current = None
            calls.setdefault(_name, []).append(
                Capture(_detach(args), _detach(kwargs), _detach(output)))

        handles.append(module.register_forward_hook(hook, with_kwargs=True))
        if is_hc:
            def pre_hook(mod, args, _name=name):
                recorder.current = _name
                recorder.__enter__()
            handles.append(module.register_forward_pre_hook(pre_hook))

    t0 = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(PARITY_THREADS)
    try:
        with torch.no_grad():
            out = model(input_ids=input_ids, use_cache=False)
    finally:
        torch.set_num_threads(threads)
        for h in handles:
            h.remove()
    timings["forward"] = time.perf_counter() - t0
    assert bool(torch.isfinite(out.logits).all()), "HF forward produced non-finite logits"
    return ParityRun(cfg=cfg, hf_config=hf_config, model=model, input_ids=input_ids,
                     positions=torch.arange(seq_len), calls=calls,
                     hc_sigmoids=recorder.records, checkpoint_keys=checkpoint_keys,
                     timings=timings)


@pytest.fixture(autouse=True)
def _parity_threads():
    """Run each parity test with :data:`PARITY_THREADS` torch threads, then restore."""
    threads = torch.get_num_threads()
    torch.set_num_threads(PARITY_THREADS)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def hf_run() -> ParityRun:
    """Session-wide tiny-checkpoint forward (built once; skipped without transformers)."""
    pytest.importorskip("transformers", minversion="5.23.0")
    pytest.importorskip("transformers.models.deepseek_v4")
    run = build_parity_run(get_config("tiny"), PARITY_TOKENS, PARITY_SEED)
    print(f"[parity] tiny checkpoint: S={run.S}, timings "
          + ", ".join(f"{k}={v:.2f}s" for k, v in run.timings.items()))
    return run
