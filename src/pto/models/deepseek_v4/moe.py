"""MoE FFN sub-block of one layer (single rank): hc_pre -> gate -> experts -> combine -> hc_post.

Chain (pypto-lib `models/deepseek/v4-flash/moe.py` with expert parallelism collapsed to one rank; transformers `models/deepseek_v4/modeling_deepseek_v4.py`,
8; transformers ``DeepseekV4DecoderLayer`` second half), ``T`` token rows of which the first
``num_tokens`` are active:

    x_mixed, post, comb      = hc_pre(x_hc; hc_ffn_*)                 # [T, D] bf16, [T, 4], [T, 16]
    x_i8, x_scale, idx, w    = gate(x_mixed; ffn norm, router, layer_id)
    sh                       = expert_shared(x_i8, x_scale)           # [T, D] bf16
    routed_y                 = expert_routed(x_i8, x_scale, idx, w)   # [T, D] fp32
    ffn_out                  = bf16_rne(sh + routed_y)                # task "moe_shared_routed"
    x_next                   = hc_post_prefill(ffn_out, x_hc, post, comb, num_tokens)

Rows ``>= num_tokens`` of ``x_next`` are exactly zero (``hc_post_prefill``'s tail fill); the
gate gives them no route, so they cost no expert work. ``seed_scopes=True`` passes the seed
variant to ``hc_pre`` and ``expert_shared`` (bit-identical results, two more tasks).
"""

import functools
from types import SimpleNamespace

import torch

import pto.language as pl
from pto.errors import BindError
from pto.golden import CaseRun, KernelCase, ScalarSpec, TensorSpec, register, valid_ratio_reldiff
from pto.models.deepseek_v4.config import DeepSeekV4Config
from pto.models.deepseek_v4.expert_routed import expert_routed_kernels, golden_expert_routed, make_routed_inputs
from pto.models.deepseek_v4.expert_shared import expert_shared_kernels, golden_expert_shared, make_expert_weights
from pto.models.deepseek_v4.gate import gate_kernels, golden_gate, make_gate_inputs
from pto.models.deepseek_v4.hc_post import golden_hc_post_prefill, hc_post_kernels
from pto.models.deepseek_v4.hc_pre import golden_hc_pre, hc_pre, make_hc_pre_inputs
from pto.models.deepseek_v4.tiling import (check_num_tokens, check_token_capacity, mode_tokens, token_capacity,
                                           token_tile)
from pto.models.deepseek_v4.weight_format import act_dtype, weight_dtype, with_weight_format

__all__ = ["TOLERANCES", "MOE_INPUTS", "moe_kernels", "moe", "moe_front", "moe_back", "golden_moe", "make_moe_inputs",
           "build_moe"]

# pypto-lib `models/deepseek/v4-flash/moe.py`; the pypto-lib tests' tolerances: x_next ratio_reldiff(diff_thd=3e-3, pct_thd=0.05); rows past
# num_tokens exactly zero.
TOLERANCES: dict[str, tuple[float, float]] = {"x_next": (3e-3, 0.05)}

MOE_INPUTS = ("x_hc", "hc_ffn_fn", "hc_ffn_scale", "hc_ffn_base", "norm_w", "gate_w", "gate_bias", "tid2eid",
              "input_ids", "w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale", "sh_w1", "sh_w1_scale", "sh_w3",
              "sh_w3_scale", "sh_w2", "sh_w2_scale")

# ---- kernel ----
T_DYN = pl.dynamic("T")
MOE_T_TILE = 128  # token rows per moe_shared_routed block


@functools.lru_cache(maxsize=None)
def moe_kernels(cfg: DeepSeekV4Config, seed_scopes: bool = False) -> SimpleNamespace:
    """Build the single-rank MoE sub-block for ``cfg`` (cached per config and variant).

    Parameters of the body (``HC = hc_mult``, ``MIX = mix_hc``, others as the composed
    kernels): ``x_hc [T, HC, D] FP32``, ``hc_ffn_fn [MIX, HC*D]``, ``hc_ffn_scale [3]``,
    ``hc_ffn_base [MIX]`` FP32, ``norm_w [D] BF16``, ``gate_w [E, D]``, ``gate_bias [E]`` FP32,
    ``tid2eid [V, K] INT32``, ``input_ids [T] INT64``, routed ``w1, w3 [E, F, D]`` /
    ``w2 [E, D, F]`` INT8 with ``[E, F]`` / ``[E, D]`` FP32 scales, shared ``sh_w1, sh_w3
    [F, D]`` / ``sh_w2 [D, F]`` INT8 with ``[F]`` / ``[D]`` scales, ``x_next [T, HC, D] FP32``
    (Out), scalars ``layer_id`` and ``num_tokens`` (INT32); with ``cfg.weight_format ==
    "bf16"`` every expert weight and ``x_norm_i8`` are BF16 (weight_format.py, scales not
    read). GM scratch (capacity
    :func:`token_capacity`): ``x_mixed``, ``post``, ``comb``, ``x_norm_i8``, ``x_norm_scale``,
    ``indices``, ``weights``, ``sh``, ``routed_y``, ``ffn_out`` (rows past ``num_tokens`` of
    ``ffn_out`` are never written nor read).

    Returns:
        namespace with the inline body ``moe(*MOE_INPUTS, x_next, layer_id, num_tokens)``
        (returns ``x_next``), its entry ``moe_test`` and ``seed_scopes``.

    Raises:
        ConfigError: one of the composed kernels cannot tile ``cfg``. At run time the errors
            of the composed kernels (``BindError`` for ``num_tokens`` outside ``[0, T]`` or a
            hash-layer id outside the vocabulary, ``CapacityError`` above the capacity).
    """
    D, HC, MIX = cfg.hidden_size, cfg.hc_mult, cfg.mix_hc
    E, K, V, Fd = cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.vocab_size, cfg.moe_intermediate_size
    routed = expert_routed_kernels(cfg).expert_routed
    gate_kernels(cfg), expert_shared_kernels(cfg, seed_scopes), hc_post_kernels(cfg)  # ConfigError now, not at run
    WD = weight_dtype(cfg)

    @pl.jit.inline
    def moe(x_hc: pl.Tensor[[T_DYN, HC, D], pl.FP32],
            hc_ffn_fn: pl.Tensor[[MIX, HC * D], pl.FP32],
            hc_ffn_scale: pl.Tensor[[3], pl.FP32],
            hc_ffn_base: pl.Tensor[[MIX], pl.FP32],
            norm_w: pl.Tensor[[D], pl.BF16],
            gate_w: pl.Tensor[[E, D], pl.FP32],
            gate_bias: pl.Tensor[[E], pl.FP32],
            tid2eid: pl.Tensor[[V, K], pl.INT32],
            input_ids: pl.Tensor[[T_DYN], pl.INT64],
            w1: pl.Tensor[[E, Fd, D], WD],
            w1_scale: pl.Tensor[[E, Fd], pl.FP32],
            w3: pl.Tensor[[E, Fd, D], WD],
            w3_scale: pl.Tensor[[E, Fd], pl.FP32],
            w2: pl.Tensor[[E, D, Fd], WD],
            w2_scale: pl.Tensor[[E, D], pl.FP32],
            sh_w1: pl.Tensor[[Fd, D], WD],
            sh_w1_scale: pl.Tensor[[Fd], pl.FP32],
            sh_w3: pl.Tensor[[Fd, D], WD],
            sh_w3_scale: pl.Tensor[[Fd], pl.FP32],
            sh_w2: pl.Tensor[[D, Fd], WD],
            sh_w2_scale: pl.Tensor[[D], pl.FP32],
            x_next: pl.Out[pl.Tensor[[T_DYN, HC, D], pl.FP32]],
            layer_id: pl.Scalar[pl.INT32],
            num_tokens: pl.Scalar[pl.INT32]):
        """MoE FFN sub-block (module docstring); returns ``x_next``."""
        f = moe_front(cfg, seed_scopes, "moe", x_hc, hc_ffn_fn, hc_ffn_scale, hc_ffn_base, norm_w, gate_w,
                      gate_bias, tid2eid, input_ids, sh_w1, sh_w1_scale, sh_w3, sh_w3_scale, sh_w2, sh_w2_scale,
                      layer_id, num_tokens)
        routed(f.x_norm_i8, f.x_norm_scale, f.indices, f.weights, w1, w1_scale, w3, w3_scale, w2, w2_scale,
               f.routed_y)
        moe_back(cfg, f, x_hc, x_next, num_tokens)
        return x_next

    moe_test = pl.jit.entry(moe, name="moe_test")
    return SimpleNamespace(moe=moe, moe_test=moe_test, seed_scopes=seed_scopes)


def moe_front(cfg: DeepSeekV4Config, seed_scopes: bool, kernel: str, x_hc, hc_ffn_fn, hc_ffn_scale, hc_ffn_base,
              norm_w, gate_w, gate_bias, tid2eid, input_ids, sh_w1, sh_w1_scale, sh_w3, sh_w3_scale, sh_w2,
              sh_w2_scale, layer_id, num_tokens) -> SimpleNamespace:
    """Inside a MoE program (this one and ``moe_ep``): the scratch of :func:`moe_kernels` and
    the tasks before the routed experts, ``hc_pre`` -> ``gate`` -> ``expert_shared`` (GM
    tensors as :func:`moe_kernels`' parameters).

    Returns:
        namespace ``t`` (rows), ``active`` (checked ``num_tokens``) and the scratch tensors
        ``x_mixed, post, comb, x_norm_i8, x_norm_scale, indices, weights, sh, routed_y,
        ffn_out`` (``routed_y`` [T, D] FP32 is for the caller's routed experts to fill).

    Raises:
        BindError: ``num_tokens`` outside ``[0, T]`` (naming ``kernel``); the composed kernels'.
    """
    D, HC, K, cap = cfg.hidden_size, cfg.hc_mult, cfg.num_experts_per_tok, token_capacity(cfg)
    t = pl.tensor.dim(x_hc, 0)
    f = SimpleNamespace(t=t, active=check_num_tokens(kernel, num_tokens, t))
    f.x_mixed = pl.create_tensor([t, D], pl.BF16, capacity=cap, name="x_mixed")
    f.post = pl.create_tensor([t, HC], pl.FP32, capacity=cap, name="post")
    f.comb = pl.create_tensor([t, HC * HC], pl.FP32, capacity=cap, name="comb")
    f.x_norm_i8 = pl.create_tensor([t, D], act_dtype(cfg), capacity=cap, name="x_norm_i8")
    f.x_norm_scale = pl.create_tensor([t, 1], pl.FP32, capacity=cap, name="x_norm_scale")
    f.indices = pl.create_tensor([t, K], pl.INT32, capacity=cap, name="indices")
    f.weights = pl.create_tensor([t, K], pl.FP32, capacity=cap, name="weights")
    f.sh = pl.create_tensor([t, D], pl.BF16, capacity=cap, name="sh")
    f.routed_y = pl.create_tensor([t, D], pl.FP32, capacity=cap, name="routed_y")
    f.ffn_out = pl.create_tensor([t, D], pl.BF16, capacity=cap, name="ffn_out")
    hc_pre(x_hc, hc_ffn_fn, hc_ffn_scale, hc_ffn_base, f.x_mixed, f.post, f.comb, cfg, seed_scopes)
    gate_kernels(cfg).gate(f.x_mixed, norm_w, gate_w, gate_bias, tid2eid, input_ids, f.x_norm_i8, f.x_norm_scale,
                           f.indices, f.weights, layer_id, num_tokens)
    expert_shared_kernels(cfg, seed_scopes).expert_shared(f.x_norm_i8, f.x_norm_scale, sh_w1, sh_w1_scale, sh_w3,
                                                          sh_w3_scale, sh_w2, sh_w2_scale, f.sh)
    return f


def moe_back(cfg: DeepSeekV4Config, f: SimpleNamespace, x_hc, x_next, num_tokens) -> None:
    """Inside a MoE program, after the routed experts filled ``f.routed_y``: task
    ``moe_shared_routed`` (``ffn_out = bf16_rne(sh + routed_y)`` on the active rows), then
    ``hc_post_prefill`` into ``x_next``."""
    D, active = cfg.hidden_size, f.active
    if active > 0:
        TT = token_tile(active, MOE_T_TILE)
        for b in pl.spmd(-(-active // TT), name_hint="moe_shared_routed", allow_early_resolve=True):
            t0 = b * TT
            rows = min(TT, active - t0)
            s = pl.cast(pl.slice(f.sh, [TT, D], [t0, 0], valid_shape=[rows, D]), pl.FP32, mode="none")
            y = s + pl.slice(f.routed_y, [TT, D], [t0, 0], valid_shape=[rows, D])
            pl.assemble(f.ffn_out, pl.set_validshape(pl.cast(y, pl.BF16, mode="rint"), rows, D), [t0, 0])
    hc_post_kernels(cfg).hc_post_prefill(f.ffn_out, x_hc, f.post, f.comb, x_next, num_tokens)


@pl.jit.inline
def moe(x_hc: pl.Tensor, hc_ffn_fn: pl.Tensor, hc_ffn_scale: pl.Tensor, hc_ffn_base: pl.Tensor, norm_w: pl.Tensor,
        gate_w: pl.Tensor, gate_bias: pl.Tensor, tid2eid: pl.Tensor, input_ids: pl.Tensor, w1: pl.Tensor,
        w1_scale: pl.Tensor, w3: pl.Tensor, w3_scale: pl.Tensor, w2: pl.Tensor, w2_scale: pl.Tensor,
        sh_w1: pl.Tensor, sh_w1_scale: pl.Tensor, sh_w3: pl.Tensor, sh_w3_scale: pl.Tensor, sh_w2: pl.Tensor,
        sh_w2_scale: pl.Tensor, x_next: pl.Out[pl.Tensor], layer_id: pl.Scalar[pl.INT32],
        num_tokens: pl.Scalar[pl.INT32], cfg, seed_scopes: bool = False):
    """Stable inline signature ``moe(x_hc, hc_ffn_fn, hc_ffn_scale, hc_ffn_base, norm_w, gate_w,
    gate_bias, tid2eid, input_ids, w1, w1_scale, w3, w3_scale, w2, w2_scale, sh_w1, sh_w1_scale,
    sh_w3, sh_w3_scale, sh_w2, sh_w2_scale, x_next, layer_id, num_tokens, cfg, seed_scopes=False)
    -> x_next`` (shapes, scratch and errors in :func:`moe_kernels`)."""
    return moe_kernels(cfg, seed_scopes).moe(
        x_hc, hc_ffn_fn, hc_ffn_scale, hc_ffn_base, norm_w, gate_w, gate_bias, tid2eid, input_ids, w1, w1_scale,
        w3, w3_scale, w2, w2_scale, sh_w1, sh_w1_scale, sh_w3, sh_w3_scale, sh_w2, sh_w2_scale, x_next, layer_id,
        num_tokens)
# ---- end kernel ----


def golden_moe(
    inputs: dict,
    cfg: DeepSeekV4Config,
    *,
    weight_format: str = "int8",
    float32: bool = False,
    return_intermediates: bool = False,
):
    """Golden of the MoE sub-block (pypto-lib `models/deepseek/v4-flash/moe.py` on one rank, transformers `models/deepseek_v4/modeling_deepseek_v4.py`).

    Chains the sub-goldens: ``golden_hc_pre`` (hc_ffn weights) -> ``golden_gate`` ->
    ``golden_expert_shared`` and ``golden_expert_routed`` (one expert at a time) ->
    ``ffn_out = bf16(sh + routed_y)`` -> ``golden_hc_post_prefill``. ``float32=True`` (parity
    with an FP32 model) keeps ``x_mixed``, ``sh``, every routed term and ``ffn_out`` in FP32;
    ``weight_format="bf16"`` takes float expert weights (scales ignored) and the gate's
    unquantised (transformers-order) activation, rounded to BF16 unless ``float32`` (as the
    bf16 kernels).

    Args:
        inputs: dict keyed by :data:`MOE_INPUTS` plus ``layer_id`` and ``num_tokens`` (ints),
            shapes as :func:`moe_kernels` (float weights for ``"bf16"``; the ``*_scale``
            entries may then be None). Not modified.
        cfg: model config.
        weight_format: ``"int8"`` or ``"bf16"``.
        float32: parity mode (above).
        return_intermediates: also return a dict with ``x_mixed, post, comb, x_norm,
            x_norm_scale, indices, weights, sh, routed_y, ffn_out``.

    Returns:
        ``x_next [T, hc_mult, D]`` FP32 (rows ``>= num_tokens`` zero), plus the dict.

    Raises:
        BindError: a missing input or the sub-goldens' shape errors.
    """
    missing = [k for k in MOE_INPUTS + ("layer_id", "num_tokens") if k not in inputs]
    if missing:
        raise BindError(f"golden_moe: inputs missing {missing}")
    i = inputs
    n = int(i["num_tokens"])
    x_mixed, post, comb = golden_hc_pre(i["x_hc"], i["hc_ffn_fn"], i["hc_ffn_scale"], i["hc_ffn_base"], cfg,
                                        out_bf16=not float32)
    xn, xs, idx, w = golden_gate(x_mixed, i["norm_w"], i["gate_w"], i["gate_bias"], i["tid2eid"], i["input_ids"],
                                 int(i["layer_id"]), n, cfg, weight_format=weight_format)
    if weight_format == "bf16" and not float32:
        xn = xn.to(torch.bfloat16)  # the kernels' BF16 expert activation
    sh = golden_expert_shared(xn, xs, i["sh_w1"], i["sh_w1_scale"], i["sh_w3"], i["sh_w3_scale"], i["sh_w2"],
                              i["sh_w2_scale"], cfg, weight_format=weight_format, float32=float32)
    routed = golden_expert_routed(xn, xs, idx, w, i["w1"], i["w1_scale"], i["w3"], i["w3_scale"], i["w2"],
                                  i["w2_scale"], cfg, weight_format=weight_format, float32=float32)
    ffn_out = sh.float() + routed
    if not float32:
        ffn_out = ffn_out.to(torch.bfloat16)
    x_next = golden_hc_post_prefill(ffn_out, i["x_hc"], post, comb, n)
    if not return_intermediates:
        return x_next
    return x_next, {"x_mixed": x_mixed, "post": post, "comb": comb, "x_norm": xn, "x_norm_scale": xs,
                    "indices": idx, "weights": w, "sh": sh, "routed_y": routed, "ffn_out": ffn_out}


def make_moe_inputs(cfg: DeepSeekV4Config, T: int, seed: int, *, num_tokens: int | None = None,
                    std: float = 1.5, weight_format: str = "int8") -> dict:
    """Seeded fixture for :func:`golden_moe`: ``x_hc`` / ``hc_ffn_*`` from
    :func:`hc_pre.make_hc_pre_inputs` (rows ``>= num_tokens`` of ``x_hc`` zeroed), the router
    tensors from :func:`gate.make_gate_inputs` (``seed + 1``), the routed experts from
    :func:`expert_routed.make_routed_inputs` (``seed + 2``) and the shared expert from
    :func:`expert_shared.make_expert_weights` (``seed + 3``), weight scale ``std``; expert
    weights INT8 with scales, or BF16 with unit scales for ``weight_format="bf16"``.

    Raises:
        BindError: ``T`` not positive or ``num_tokens`` outside ``[0, T]``.
        ConfigError: ``hc_mult != 4`` (the reference hc base).
    """
    n = T if num_tokens is None else int(num_tokens)
    if T <= 0 or not 0 <= n <= T:
        raise BindError(f"make_moe_inputs: need T > 0 and 0 <= num_tokens <= T, got T={T}, num_tokens={n}")
    hc = make_hc_pre_inputs(cfg, T, seed)
    hc["x"][n:] = 0
    g = make_gate_inputs(cfg, T, seed + 1, num_tokens=n)
    r = make_routed_inputs(cfg, 1, seed + 2, std=std, weight_format=weight_format)
    s = make_expert_weights(cfg, None, torch.Generator().manual_seed(seed + 3), std=std, weight_format=weight_format)
    out = {"x_hc": hc["x"], "hc_ffn_fn": hc["hc_fn"], "hc_ffn_scale": hc["hc_scale"], "hc_ffn_base": hc["hc_base"],
           "norm_w": g["norm_w"], "gate_w": g["gate_w"], "gate_bias": g["gate_bias"], "tid2eid": g["tid2eid"],
           "input_ids": g["input_ids"]}
    out.update({k: r[k] for k in ("w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale")})
    out.update({"sh_" + k: v for k, v in s.items()})
    return out


# ---- registration ----
def build_moe(preset: str = "tiny", mode: str = "prefill", *, T: int | None = None, seed: int = 0,
              layer_id: int | None = None, num_tokens: int | None = None, std: float = 1.5,
              seed_scopes: bool = False, weight_format: str = "int8") -> CaseRun:
    """KernelCase builder (``weight_format="bf16"``: the unquantised kernels, same tolerance):
    the MoE sub-block at ``preset`` in ``mode`` (decode 8 tokens, a hash
    layer by default; prefill 128 tokens, a learned layer) or ``T`` tokens with ``num_tokens``
    active, fixture :func:`make_moe_inputs`; ``x_next`` compared with
    ``valid_ratio_reldiff(num_tokens, 3e-3, 0.05)`` (rows past ``num_tokens`` exactly zero).
    ``seed_scopes=True`` selects the seed variants of hc_pre and expert_shared. The demo
    runs it at the ``demo`` preset at most (FLASH's routed experts are 6 GiB of INT8).

    Raises:
        ConfigError: unknown preset / mode, bad ``T`` or an untileable config.
    """
    cfg, T = mode_tokens(preset, mode, T)
    cfg = with_weight_format(cfg, weight_format)
    check_token_capacity("moe", cfg, T)  # before any input is built
    if layer_id is None:
        layer_id = 0 if mode == "decode" else cfg.num_hash_layers
    n = T if num_tokens is None else int(num_tokens)
    ins = make_moe_inputs(cfg, T, seed, num_tokens=n, std=std, weight_format=weight_format)
    specs = [TensorSpec(k, list(ins[k].shape), ins[k].dtype, init_value=ins[k]) for k in MOE_INPUTS]
    specs += [TensorSpec("x_next", [T, cfg.hc_mult, cfg.hidden_size], torch.float32, is_output=True),
              ScalarSpec("layer_id", torch.int32, int(layer_id)), ScalarSpec("num_tokens", torch.int32, n)]

    def golden(v: dict) -> None:
        v["x_next"] = golden_moe(v, cfg, weight_format=weight_format)

    kind = "hash" if layer_id < cfg.num_hash_layers else "learned"
    label = (f"{preset} {mode} T={T} layer={layer_id} ({kind})" + (f" num_tokens={n}" if n != T else "")
             + (" seed_scopes" if seed_scopes else "") + (" weight_format=bf16" if weight_format == "bf16" else ""))
    return CaseRun(moe_kernels(cfg, bool(seed_scopes)).moe_test, specs, golden,
                   {"x_next": valid_ratio_reldiff(n, *TOLERANCES["x_next"])}, rtol=1e-3, atol=1e-3, label=label)


register(KernelCase("moe", build_moe, modes=("decode", "prefill"), seed_variant=True,
                    max_preset="demo",
                    description="MoE FFN sub-block, one rank: hc_pre, gate, shared + routed experts, hc_post (pypto-lib `moe.py`)"))
