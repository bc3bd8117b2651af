"""The MTP draft layer as one program: projection, sliding-window attention + MoE, head.

Chain (pypto-lib `models/deepseek/v4-flash/decode_mtp.py`, `prefill_mtp.py`; DeepSeek-V4-Flash
``inference/model.py`` ``MTPBlock``):

    x_hc   = mtp_projection(emb, prev_hc)              # e_proj(enorm(e)) + h_proj(hnorm(X))
    x_out  = MoE(SWA attention(x_hc))                  # the layer body of a ratio-0 layer, layer_id L
    logits = lm_head(rms_norm(hc_head(x_out)))         # the MTP layer's hc_head / norm, shared head

``mtp_decode_layer``: ``B`` requests of ``S`` tokens (``[B, n]`` tables; the decode SWA
block of `decode_attention_swa.py`); ``mtp_prefill_layer``: one request, ``T`` rows of which ``num_tokens`` are
active (`prefill_attention_swa.py`). ``layer_id`` is ``num_hidden_layers`` (learned routing with the router bias;
the MTP layer has no hash table). Outputs: ``x_out [T, hc_mult, D]`` FP32 (`decode_mtp.py`'s
``next_pre_hc_hidden``, the streams a second MTP depth would read) and ``logits [T, V]``.

Deviations: the reference returns the normed hidden (``hidden_out``) and applies the
TP-sharded LM head outside (`lm_head.py`); here the head runs inside the program (the shared head
on one rank), so the draft is one program per step.
"""

import functools
from types import SimpleNamespace

import torch

import pto.language as pl
from pto.golden import CaseRun, KernelCase, ScalarSpec, TensorSpec, ratio_reldiff, register, valid_ratio_reldiff
from pto.models.deepseek_v4.config import DeepSeekV4Config
from pto.models.deepseek_v4.decode_attention_swa import golden_decode_attention_swa, make_decode_swa_inputs
from pto.models.deepseek_v4.decode_sparse_attn import decode_case_options
from pto.models.deepseek_v4.hc_head import make_hc_head_inputs
from pto.models.deepseek_v4.layer import _bodies, _jit
from pto.models.deepseek_v4.lm_head import golden_final_logits, lm_head_kernels, make_lm_head_weight
from pto.models.deepseek_v4.moe import MOE_INPUTS, golden_moe, make_moe_inputs
from pto.models.deepseek_v4.mtp_projection import (MTP_PROJ_ARGS, golden_mtp_projection,
                                                   make_mtp_projection_inputs, mtp_projection_kernels)
from pto.models.deepseek_v4.prefill_attention_swa import golden_prefill_attention_swa, make_swa_inputs
from pto.models.deepseek_v4.weight_format import weight_format_of, with_weight_format
from pto.models.deepseek_v4.tiling import mode_tokens, token_capacity

__all__ = ["TOLERANCES", "HEAD_ARGS", "mtp_layer_kernels", "golden_mtp_layer", "build_case"]

REFERENCE = "pypto-lib models/deepseek/v4-flash/{decode,prefill}_mtp.py @ 3b6971a3"

# ratio_reldiff (diff_thd, pct_thd): decode_mtp.py's next_pre_hc_hidden / kv_cache; logits as its hidden_out
TOLERANCES: dict[str, tuple[float, float]] = {"x_out": (0.02, 0.05), "logits": (0.02, 0.10),
                                              "kv_cache": (0.01, 0.05)}
HEAD_ARGS = ("mtp_hc_fn", "mtp_hc_scale", "mtp_hc_base", "mtp_norm_w", "head_w")


# ---- kernel ----
@functools.lru_cache(maxsize=None)
def mtp_layer_kernels(cfg: DeepSeekV4Config) -> SimpleNamespace:
    """``mtp_decode_layer`` and ``mtp_prefill_layer`` for ``cfg``, and ``names(phase)``: the
    parameter names in order -- :data:`MTP_PROJ_ARGS` without ``x_hc``, the SWA layer body's
    weight / cache / metadata arguments (``layer.layer_kernels``' ``{phase}_layer_swa`` after
    ``x_hc``), ``input_ids``, :data:`HEAD_ARGS`, ``x_out`` and ``logits`` (Out), then for prefill
    ``num_tokens``.

    Raises:
        ConfigError: a composed kernel cannot tile ``cfg``.
    """
    proj = mtp_projection_kernels(cfg).mtp_projection
    head = lm_head_kernels(cfg).final_logits
    p_sig, p_anns = proj.signature()
    h_sig, h_anns = head.signature()
    HC, D, cap, L = cfg.hc_mult, cfg.hidden_size, token_capacity(cfg), cfg.num_hidden_layers
    bodies = _bodies(cfg)
    out = {}
    for phase in ("decode", "prefill"):
        lb = bodies[f"{phase}_swa"]
        p_names = list(MTP_PROJ_ARGS[:-1])
        names = p_names + lb.names + ["input_ids"] + list(HEAD_ARGS) + ["x_out", "logits"] + \
            (["num_tokens"] if phase == "prefill" else [])
        anns = {**{n: p_anns[n] for n in p_names}, **lb.annotations, "input_ids": lb.moe_annotations["input_ids"],
                "mtp_hc_fn": h_anns["hc_fn"], "mtp_hc_scale": h_anns["hc_scale"], "mtp_hc_base": h_anns["hc_base"],
                "mtp_norm_w": h_anns["norm_w"], "head_w": h_anns["weight"], "x_out": lb.moe_annotations["x_next"],
                "logits": h_anns["logits"], "num_tokens": lb.moe_annotations["num_tokens"]}
        n_p, n_l = len(p_names), len(lb.names)

        def body(*args, _lb=lb, _prefill=phase == "prefill", _n_p=n_p, _n_l=n_l):
            emb = args[0]
            t = pl.tensor.dim(emb, 0)
            k = _n_p + _n_l
            input_ids = args[k]
            hc_fn, hc_scale, hc_base, norm_w, head_w, x_out, logits = args[k + 1:k + 8]
            num_tokens = args[k + 8] if _prefill else t
            x_hc = pl.create_tensor([t, HC, D], pl.FP32, capacity=cap, name="mtp_x_hc")
            proj(*args[:_n_p], x_hc)
            _lb(x_hc, args[_n_p:k], input_ids, x_out, L, num_tokens)
            head(x_out, hc_fn, hc_scale, hc_base, norm_w, head_w, logits)
            return logits

        name = f"mtp_{phase}_layer"
        out[name] = _jit(name, f"{name}: mtp_projection, the MTP layer's SWA attention + MoE, its head; "
                               "returns ``logits``.", names, anns, body)
        out[f"{phase}_names"] = names
    return SimpleNamespace(**out, names=lambda phase: out[f"{phase}_names"])
# ---- end kernel ----


def golden_mtp_layer(inputs: dict, cfg: DeepSeekV4Config, phase: str) -> dict[str, torch.Tensor]:
    """Golden of :func:`mtp_layer_kernels` (module docstring): ``golden_mtp_projection`` ->
    ``golden_decode_attention_swa`` / ``golden_prefill_attention_swa`` -> ``golden_moe``
    (``layer_id = num_hidden_layers``) -> ``golden_final_logits``, each in ``cfg``'s weight
    format (``"bf16"``: the unquantised kernels' numerics).

    Args:
        inputs: the program's arguments by name (``phase`` ``"prefill"``: with ``num_tokens``).

    Returns:
        ``{"kv_cache", "x_out", "logits"}``.
    """
    i = dict(inputs)
    wf = weight_format_of(cfg)
    n = int(i["num_tokens"]) if phase == "prefill" else i["emb"].shape[0]
    proj = [i[k] for k in MTP_PROJ_ARGS[:-1]]
    if wf == "bf16":  # float weights, no scale, BF16 activations
        proj[5] = proj[7] = None
    x_hc = golden_mtp_projection(*proj, cfg.rms_norm_eps, bf16_act=wf == "bf16")
    if phase == "prefill":
        x_hc[n:] = 0
        kv, x_attn = golden_prefill_attention_swa({**i, "x_hc": x_hc}, cfg, weight_format=wf)
    else:
        kv, x_attn = golden_decode_attention_swa({**i, "x_hc": x_hc}, cfg, weight_format=wf)
    moe = {k: i[k] for k in MOE_INPUTS[1:]}
    x_out = golden_moe({**moe, "x_hc": x_attn, "layer_id": cfg.num_hidden_layers, "num_tokens": n}, cfg,
                       weight_format=wf)
    logits = golden_final_logits(x_out, *[i[k] for k in HEAD_ARGS], cfg)
    return {"kv_cache": kv, "x_out": x_out, "logits": logits}


def build_case(preset: str, mode: str, **options) -> CaseRun:
    """KernelCase builder of the MTP layer: ``decode`` (``decode_batch`` requests of ``S``
    tokens at :data:`decode_sparse_attn.DEFAULT_START_POS`; options of
    ``decode_case_options``) or ``prefill`` (``prefill_seq`` rows, options ``T``,
    ``num_tokens``, ``start_pos``, ``seed``); both take ``weight_format`` (``"bf16"``: the
    unquantised kernels, same tolerances). Fixtures: the SWA block's
    (``make_decode_swa_inputs`` / ``make_swa_inputs``), the MoE block's
    (``make_moe_inputs``, learned routing), the projection's and the head's.
    Compared: ``x_out``, ``logits`` and ``kv_cache`` by :data:`TOLERANCES`."""
    if mode == "decode":
        o = decode_case_options("mtp_layer", preset, mode, options, weight_formats=True)
        cfg, seed, wf = o.cfg, o.seed, o.weight_format
        T = len(o.start_pos) * o.S
        d = make_decode_swa_inputs(cfg, o.start_pos, o.S, seed, weight_format=wf)
        n = T
    else:
        opts = dict(options)
        cfg, T = mode_tokens(preset, mode, opts.pop("T", None))
        wf = str(opts.pop("weight_format", "int8"))
        cfg = with_weight_format(cfg, wf)
        seed, n = int(opts.pop("seed", 0)), int(opts.pop("num_tokens", T))
        d = make_swa_inputs(cfg, T, int(opts.pop("start_pos", 0)), n, seed, weight_format=wf)
        d.pop("num_tokens")
    d.update({k: v for k, v in make_moe_inputs(cfg, T, seed + 10, num_tokens=n, weight_format=wf).items()
              if k != "x_hc"})
    d.update(make_mtp_projection_inputs(cfg, T, seed + 20))
    hh = make_hc_head_inputs(cfg, T, seed + 30)
    d.update(mtp_hc_fn=hh["hc_fn"], mtp_hc_scale=hh["hc_scale"], mtp_hc_base=hh["hc_base"],
             mtp_norm_w=(1 + 0.1 * torch.randn(cfg.hidden_size, generator=torch.Generator().manual_seed(seed + 40))
                         ).to(torch.bfloat16),
             head_w=make_lm_head_weight(cfg, seed + 50),
             x_out=torch.zeros(T, cfg.hc_mult, cfg.hidden_size), logits=torch.zeros(T, cfg.vocab_size))
    k = mtp_layer_kernels(cfg)
    specs = []
    for name in k.names(mode):
        if name == "num_tokens":
            specs.append(ScalarSpec("num_tokens", torch.int32, n))
            continue
        t = d[name]
        specs.append(TensorSpec(name, list(t.shape), t.dtype, t, is_output=name in ("x_out", "logits", "kv_cache")))

    def golden(v: dict) -> None:
        v.update(golden_mtp_layer(v, cfg, mode))

    if mode == "decode":
        compare = {k2: ratio_reldiff(*TOLERANCES[k2]) for k2 in ("x_out", "logits", "kv_cache")}
    else:
        compare = {"x_out": valid_ratio_reldiff(n, *TOLERANCES["x_out"]),
                   "logits": valid_ratio_reldiff(n, *TOLERANCES["logits"]),
                   "kv_cache": ratio_reldiff(*TOLERANCES["kv_cache"])}
    return CaseRun(getattr(k, f"mtp_{mode}_layer"), specs, golden, compare,
                   label=f"mtp {mode} T={T} active={n}" + (" weight_format=bf16" if wf == "bf16" else ""))


register(KernelCase("mtp_layer", build_case, modes=("decode", "prefill"), max_preset="demo",
                    description="MTP draft layer: mtp_projection, SWA attention + MoE (layer L), its head (pypto-lib `decode_mtp.py` / `prefill_mtp.py`)"))
