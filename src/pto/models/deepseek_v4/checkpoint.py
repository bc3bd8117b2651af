"""DeepSeek-V4 checkpoint tensor names, shapes and the seeded tiny checkpoint writer.

Two on-disk layouts are understood (transformers `models/deepseek_v4/` and the published DeepSeek-V4-Flash checkpoint, transformers `models/deepseek_v4/modeling_deepseek_v4.py`):

* ``"hf"``: what transformers 5.23.0 ``save_pretrained`` writes -- the upstream leaf names
  with a ``model.`` prefix, except ``head.weight``, ``model.embed_tokens.weight`` and
  ``model.hc_head.hc_{fn,base,scale}``; per-expert ``w1``/``w2``/``w3``; every float
  tensor in the model dtype (float32 here), ``tid2eid`` int64.
* ``"fp8"``: the published DeepSeek-V4-Flash layout -- no prefix, ``embed.weight``,
  ``hc_head_{fn,base,scale}``; the attention projections, ``indexer.wq_b`` and the shared
  expert stored F8_E4M3 with one F8_E8M0 ``.scale`` byte per 128x128 block; routed experts
  FP4 (e2m1, two per int8 byte, low nibble = even column) with one E8M0 byte per row per
  32 inputs; norms, embedding, head, compressor ``wkv``/``wgate``, ``weights_proj`` and
  the router weight BF16; HC parameters, sinks, ``ape`` and the router bias F32.

Inside pto every tensor has its *canonical* name: the official name (``layers.{i}.attn.
wq_a.weight``, ``embed.weight``, ``hc_head_fn``, ...). :func:`expected_tensors` lists them
with their shapes for a config.

The writer (:func:`write_tiny_checkpoint`) needs only torch and safetensors. Its weights
follow the unit-scale rules of the team's transformers-built parity checkpoint
(tests/parity/conftest.py): norm weights ``1 + 0.1 N(0,1)``; embedding, sinks, ``ape`` and
HC bases ``N(0,1)``; HC scales ``U(0.5, 1.5)``; every other matrix ``N(0,1)/sqrt(fan_in)``;
router bias ``N(0,1)``; ``tid2eid`` rows of K distinct experts (a random permutation
prefix). Drawn from one generator seeded with ``seed`` in canonical-name order.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch

from pto.errors import CheckpointError
from pto.models.deepseek_v4.config import DeepSeekV4Config, get_config

__all__ = ["expected_tensors", "expected_mtp_tensors", "canonical_name", "stored_name", "write_tiny_checkpoint",
           "FP8_BLOCK", "FP4_GROUP", "FP8_WEIGHTS", "MTP_FP8_WEIGHTS", "FP4_WEIGHTS", "quantize_fp8_block",
           "quantize_fp4", "dequantize_fp8_block", "dequantize_fp4"]

FP8_BLOCK = 128  # official FP8 weights: one E8M0 scale per 128 x 128 block
FP4_GROUP = 32  # official FP4 experts: one E8M0 scale per row per 32 inputs
E4M3_MAX = 448.0
E2M1_MAX = 6.0
_E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])

# leaves stored FP8 / FP4 in the official layout (transformers `models/deepseek_v4/` and the published DeepSeek-V4-Flash checkpoint)
FP8_WEIGHTS = ("attn.wq_a.weight", "attn.wq_b.weight", "attn.wkv.weight", "attn.wo_a.weight",
               "attn.wo_b.weight", "attn.indexer.wq_b.weight", "ffn.shared_experts.w1.weight",
               "ffn.shared_experts.w2.weight", "ffn.shared_experts.w3.weight")
FP4_WEIGHTS = ("w1.weight", "w2.weight", "w3.weight")  # under ffn.experts.{j}.
MTP_FP8_WEIGHTS = ("e_proj.weight", "h_proj.weight")  # under mtp.{k}. (transformers `models/deepseek_v4/` and the published DeepSeek-V4-Flash checkpoint)
_BF16_IN_FP8 = ("norm.weight", "embed.weight", "head.weight", "compressor.wkv.weight",
                "compressor.wgate.weight", "weights_proj.weight", "gate.weight")


def expected_tensors(cfg: DeepSeekV4Config) -> dict[str, tuple[tuple[int, ...], str]]:
    """Canonical name -> (shape, kind) of every tensor a checkpoint of ``cfg`` holds.

    ``kind`` is ``"float"`` (any float storage) or ``"index"`` (``tid2eid``, integer).
    Shapes are HF/upstream ``[out, in]`` (transformers `models/deepseek_v4/modeling_deepseek_v4.py`). MTP tensors are
    listed by :func:`expected_mtp_tensors` (the loader reads them when present).
    """
    D, N, V = cfg.hidden_size, cfg.hc_mult, cfg.vocab_size
    out: dict[str, tuple[tuple[int, ...], str]] = {
        "embed.weight": ((V, D), "float"), "head.weight": ((V, D), "float"),
        "norm.weight": ((D,), "float"), "hc_head_fn": ((N, N * D), "float"),
        "hc_head_base": ((N,), "float"), "hc_head_scale": ((1,), "float"),
    }
    for i, ratio in enumerate(cfg.compress_ratios):
        for k, v in _layer_tensors(cfg, ratio, i < cfg.num_hash_layers).items():
            out[f"layers.{i}." + k] = v
    return out


def _layer_tensors(cfg: DeepSeekV4Config, ratio: int, hash_layer: bool) -> dict[str, tuple[tuple[int, ...], str]]:
    """Leaf name (relative to the layer prefix) -> (shape, kind) of one decoder layer of
    compress ratio ``ratio`` (hash routing: ``tid2eid``, else the router ``bias``)."""
    D, H, d = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim
    Lq, G, Lo, F, E = cfg.q_lora_rank, cfg.o_groups, cfg.o_lora_rank, cfg.moe_intermediate_size, \
        cfg.n_routed_experts
    HI, dI, N, V, K = cfg.index_n_heads, cfg.index_head_dim, cfg.hc_mult, cfg.vocab_size, \
        cfg.num_experts_per_tok
    t = {
        "attn_norm.weight": (D,), "ffn_norm.weight": (D,),
        "attn.wq_a.weight": (Lq, D), "attn.q_norm.weight": (Lq,),
        "attn.wq_b.weight": (H * d, Lq), "attn.wkv.weight": (d, D),
        "attn.kv_norm.weight": (d,), "attn.wo_a.weight": (G * Lo, H * d // G),
        "attn.wo_b.weight": (D, G * Lo), "attn.attn_sink": (H,),
        "ffn.gate.weight": (E, D),
        "ffn.shared_experts.w1.weight": (F, D), "ffn.shared_experts.w3.weight": (F, D),
        "ffn.shared_experts.w2.weight": (D, F),
    }
    for site in ("attn", "ffn"):
        t[f"hc_{site}_fn"] = ((2 + N) * N, N * D)
        t[f"hc_{site}_base"] = ((2 + N) * N,)
        t[f"hc_{site}_scale"] = (3,)
    if ratio:
        c = 2 if ratio == 4 else 1  # CSA pools two overlapping series
        t.update({"attn.compressor.ape": (ratio, c * d), "attn.compressor.wkv.weight": (c * d, D),
                  "attn.compressor.wgate.weight": (c * d, D),
                  "attn.compressor.norm.weight": (d,)})
    if ratio == 4:
        t.update({"attn.indexer.wq_b.weight": (HI * dI, Lq),
                  "attn.indexer.weights_proj.weight": (HI, D),
                  "attn.indexer.compressor.ape": (4, 2 * dI),
                  "attn.indexer.compressor.wkv.weight": (2 * dI, D),
                  "attn.indexer.compressor.wgate.weight": (2 * dI, D),
                  "attn.indexer.compressor.norm.weight": (dI,)})
    for j in range(E):
        t[f"ffn.experts.{j}.w1.weight"] = (F, D)
        t[f"ffn.experts.{j}.w3.weight"] = (F, D)
        t[f"ffn.experts.{j}.w2.weight"] = (D, F)
    out = {k: (shape, "float") for k, shape in t.items()}
    if hash_layer:
        out["ffn.gate.tid2eid"] = ((V, K), "index")
    else:
        out["ffn.gate.bias"] = ((E,), "float")
    return out


def expected_mtp_tensors(cfg: DeepSeekV4Config) -> dict[str, tuple[tuple[int, ...], str]]:
    """Canonical name -> (shape, kind) of the multi-token-prediction layers ``mtp.{k}.``,
    ``k < num_nextn_predict_layers`` (transformers `models/deepseek_v4/` and the published DeepSeek-V4-Flash checkpoint): a sliding-window
    (ratio 0) decoder layer with learned routing (router ``bias``, no ``tid2eid``) and no
    compressor / indexer, plus ``e_proj.weight`` / ``h_proj.weight [D, D]`` (FP8 in the
    published layout), ``enorm`` / ``hnorm`` / ``norm`` ``.weight [D]`` and its own
    ``hc_head_{fn,base,scale}``. The embedding and the LM head are the main model's.
    """
    D, N = cfg.hidden_size, cfg.hc_mult
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    for k in range(cfg.num_nextn_predict_layers):
        p = f"mtp.{k}."
        extra = {"e_proj.weight": (D, D), "h_proj.weight": (D, D), "enorm.weight": (D,),
                 "hnorm.weight": (D,), "norm.weight": (D,), "hc_head_fn": (N, N * D),
                 "hc_head_base": (N,), "hc_head_scale": (1,)}
        for leaf, v in _layer_tensors(cfg, 0, False).items():
            out[p + leaf] = v
        for leaf, shape in extra.items():
            out[p + leaf] = (shape, "float")
    return out


_HF_GLOBAL = {"model.embed_tokens.weight": "embed.weight", "model.hc_head.hc_fn": "hc_head_fn",
              "model.hc_head.hc_base": "hc_head_base", "model.hc_head.hc_scale": "hc_head_scale",
              "lm_head.weight": "head.weight"}
_HF_GLOBAL_INV = {v: k for k, v in _HF_GLOBAL.items() if k != "lm_head.weight"}


def canonical_name(stored: str) -> str:
    """Canonical (official) name of a stored tensor name of either layout.

    ``model.`` is stripped; ``model.embed_tokens.weight`` -> ``embed.weight``,
    ``model.hc_head.hc_X`` -> ``hc_head_X``; official names map to themselves.
    """
    if stored in _HF_GLOBAL:
        return _HF_GLOBAL[stored]
    return stored[len("model."):] if stored.startswith("model.") else stored


def stored_name(canonical: str, layout: str) -> str:
    """The on-disk name of ``canonical`` in ``layout`` (``"hf"`` or ``"fp8"``)."""
    if layout == "fp8":
        return canonical
    if canonical == "head.weight":
        return canonical
    return _HF_GLOBAL_INV.get(canonical, "model." + canonical)


# ---- FP8 / FP4 codecs (transformers `models/deepseek_v4/` and the published DeepSeek-V4-Flash checkpoint, "Dequantisation") ---------------------

def _e8m0_exponent(amax: torch.Tensor, fmt_max: float) -> torch.Tensor:
    """Power-of-two exponent ``e`` with ``amax / 2^e <= fmt_max``, clamped to E8M0's [-127, 127]."""
    e = torch.ceil(torch.log2(amax.clamp_min(1e-30) / fmt_max))
    return e.clamp(-127, 127)


def quantize_fp8_block(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[R, C]`` float -> (F8_E4M3 ``[R, C]``, F8_E8M0 scale ``[ceil(R/128), ceil(C/128)]``).

    Per 128 x 128 block: ``e = ceil(log2(amax / 448))``, codes = ``e4m3(w / 2^e)``.
    """
    R, C = w.shape
    nb_r, nb_c = -(-R // FP8_BLOCK), -(-C // FP8_BLOCK)
    pad = torch.zeros(nb_r * FP8_BLOCK, nb_c * FP8_BLOCK)
    pad[:R, :C] = w.float()
    blocks = pad.reshape(nb_r, FP8_BLOCK, nb_c, FP8_BLOCK)
    e = _e8m0_exponent(blocks.abs().amax(dim=(1, 3)), E4M3_MAX)  # [nb_r, nb_c]
    scaled = blocks / torch.exp2(e)[:, None, :, None]
    codes = scaled.reshape(nb_r * FP8_BLOCK, nb_c * FP8_BLOCK)[:R, :C].to(torch.float8_e4m3fn)
    return codes, torch.exp2(e).to(torch.float8_e8m0fnu)


def dequantize_fp8_block(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`quantize_fp8_block`: ``w[r, c] = e4m3[r, c] * 2^S[r//128, c//128]``
    in FP32 (transformers `models/deepseek_v4/` and the published DeepSeek-V4-Flash checkpoint)."""
    R, C = codes.shape
    s = scale.float().repeat_interleave(FP8_BLOCK, 0).repeat_interleave(FP8_BLOCK, 1)[:R, :C]
    return codes.float() * s


def quantize_fp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[R, C]`` float -> (int8 ``[R, C/2]`` packed e2m1, F8_E8M0 ``[R, C/32]``).

    Per row and 32 inputs: ``e = ceil(log2(amax / 6))``; each value rounds to the nearest
    e2m1 magnitude {0, .5, 1, 1.5, 2, 3, 4, 6} of ``|w| / 2^e`` (sign in bit 3); byte ``k``
    holds column ``2k`` in its low nibble and ``2k+1`` in its high nibble.
    """
    R, C = w.shape
    g = w.float().reshape(R, C // FP4_GROUP, FP4_GROUP)
    e = _e8m0_exponent(g.abs().amax(dim=-1), E2M1_MAX)  # [R, C/32]
    x = (g / torch.exp2(e)[..., None]).reshape(R, C)
    mag = (x.abs()[..., None] - _E2M1_VALUES).abs().argmin(dim=-1)  # nearest magnitude code
    nib = (mag | ((x < 0) & (mag > 0)).to(torch.int64) << 3).to(torch.uint8)
    packed = nib[:, 0::2] | (nib[:, 1::2] << 4)
    return packed.view(torch.int8), torch.exp2(e).to(torch.float8_e8m0fnu)


def dequantize_fp4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`quantize_fp4`: unpack nibbles (low = even column), map e2m1 codes
    (bit 3 = sign), times ``2^S[r, c//32]``; FP32 ``[R, 2 * packed.shape[1]]``."""
    b = packed.view(torch.uint8).to(torch.int64)
    nib = torch.stack([b & 0xF, b >> 4], dim=-1).reshape(b.shape[0], -1)
    val = _E2M1_VALUES[nib & 7] * torch.where(nib >= 8, -1.0, 1.0)
    return val * scale.float().repeat_interleave(FP4_GROUP, 1)


# ---- the tiny checkpoint writer ---------------------------------------------------------------

def _unit_scale(name: str, shape: tuple[int, ...], kind: str, cfg: DeepSeekV4Config,
                gen: torch.Generator) -> torch.Tensor:
    """One tensor drawn by the unit-scale rules of the module docstring."""
    leaf = name.rsplit(".", 1)[-1]
    if kind == "index":  # tid2eid: K distinct experts per token
        V, K = shape
        return torch.stack([torch.randperm(cfg.n_routed_experts, generator=gen)[:K]
                            for _ in range(V)])
    if name.endswith("norm.weight"):
        return 1.0 + 0.1 * torch.randn(shape, generator=gen)
    if leaf in ("attn_sink", "ape", "bias") or name == "embed.weight" \
            or name.endswith(("_base",)):
        return torch.randn(shape, generator=gen)
    if name.endswith("_scale"):
        return 0.5 + torch.rand(shape, generator=gen)
    return torch.randn(shape, generator=gen) / math.sqrt(shape[-1])


def tiny_state(cfg: DeepSeekV4Config | None = None, seed: int = 0, mtp: bool = False) -> dict[str, torch.Tensor]:
    """Canonical name -> FP32 (``tid2eid``: int64) tensor of a seeded unit-scale checkpoint.

    ``mtp=True`` adds the ``mtp.*`` tensors (:func:`expected_mtp_tensors`), drawn after the
    main model's from the same generator, so the main tensors equal those of ``mtp=False``.

    Raises:
        CheckpointError: ``seed`` is not an integer in ``[0, 2**64)`` (a torch generator seed).
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 64:
        raise CheckpointError(f"tiny checkpoint: seed must be an integer in [0, 2**64), got {seed!r}")
    cfg = cfg or get_config("tiny")
    gen = torch.Generator().manual_seed(seed)
    out = {name: _unit_scale(name, shape, kind, cfg, gen)
           for name, (shape, kind) in sorted(expected_tensors(cfg).items())}
    if mtp:
        out.update({name: _unit_scale(name, shape, kind, cfg, gen)
                    for name, (shape, kind) in sorted(expected_mtp_tensors(cfg).items())})
    return out


def _fp8_layout(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Convert a canonical FP32 state into the published FP8/FP4 layout's stored tensors."""
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        rest = name.split(".", 2)[-1] if name.startswith(("layers.", "mtp.")) else name
        if rest in FP8_WEIGHTS or rest in MTP_FP8_WEIGHTS:
            out[name], out[name[:-len("weight")] + "scale"] = quantize_fp8_block(t)
        elif ".ffn.experts." in name and name.endswith(FP4_WEIGHTS):
            out[name], out[name[:-len("weight")] + "scale"] = quantize_fp4(t)
        elif name.endswith(_BF16_IN_FP8):
            out[name] = t.to(torch.bfloat16)
        else:
            out[name] = t
    return out


def write_tiny_checkpoint(directory, seed: int = 0, *, cfg: DeepSeekV4Config | None = None,
                          layout: str = "hf", shards: int = 1, mtp: bool = False) -> Path:
    """Write a seeded tiny DeepSeek-V4 checkpoint (``config.json`` + safetensors).

    ``layout="hf"`` writes FP32 tensors under transformers' saved names (loadable by
    ``DeepseekV4ForCausalLM.from_pretrained``); ``layout="fp8"`` the published FP8/FP4
    layout (module docstring). ``shards > 1`` splits the tensors over that many
    ``model-0000k-of-0000n.safetensors`` files plus ``model.safetensors.index.json``.
    ``mtp=True`` also writes the MTP layer under its published names (``mtp.0.*``, FP8
    ``e_proj`` / ``h_proj`` in the ``fp8`` layout; ``model.mtp.0.*`` in ``hf``) and
    ``num_nextn_predict_layers`` >= 1 in config.json.
    Files are written to a temporary name and renamed, so a failure leaves no partial file.

    Args:
        directory: output directory (created; must not already hold a config.json).
        seed: generator seed (an int in ``[0, 2**64)``).
        cfg: model config (default: the ``tiny`` preset).
        layout: ``"hf"`` or ``"fp8"``.
        shards: number of safetensors files (>= 1).
        mtp: also write the multi-token-prediction layer.

    Returns:
        The directory path.

    Raises:
        CheckpointError: bad seed / layout / shards (more shards than tensors), the
            directory already holds a checkpoint, or it is a dangling symlink.
        OSError: the directory cannot be created or written; nothing is left behind (no
            partial file, no directory this call created).
    """
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    if layout not in ("hf", "fp8"):
        raise CheckpointError(f"tiny checkpoint: layout must be 'hf' or 'fp8', got {layout!r}")
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise CheckpointError(f"tiny checkpoint: shards must be a positive integer, got {shards!r}")
    cfg = cfg or get_config("tiny")
    if mtp and cfg.num_nextn_predict_layers < 1:
        cfg = cfg.replace(num_nextn_predict_layers=1)
    state = tiny_state(cfg, seed, mtp=mtp)
    root = Path(directory)
    if (root / "config.json").exists():
        raise CheckpointError(f"tiny checkpoint: {root} already holds a config.json")
    if root.is_symlink() and not root.exists():
        raise CheckpointError(f"tiny checkpoint: {root} is a symlink to {os.readlink(root)!r}, which does not exist")
    tensors = _fp8_layout(state) if layout == "fp8" else state
    stored = {stored_name(k, layout): v.contiguous() for k, v in tensors.items()}
    if shards > len(stored):
        raise CheckpointError(f"tiny checkpoint: shards={shards} is more than its {len(stored)} tensors "
                              "(a shard would be empty)")
    created = [d for d in (root, *root.parents) if not d.exists()]  # removed again on a failure
    root.mkdir(parents=True, exist_ok=True)
    hf = cfg.to_hf()
    if layout == "fp8":
        hf["dtype"] = "bfloat16"
        hf["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3",
                                     "activation_scheme": "dynamic", "scale_fmt": "ue8m0",
                                     "weight_block_size": [FP8_BLOCK, FP8_BLOCK]}
        hf["expert_dtype"] = "fp4"
    names = sorted(stored)
    written: list[Path] = []
    made: list[Path] = []  # files this call put in place (removed again on a failure)
    try:
        if shards == 1:
            files = {"model.safetensors": names}
        else:  # balanced: every shard holds len(names) // shards or one more tensors
            n = len(names)
            files = {f"model-{k + 1:05d}-of-{shards:05d}.safetensors": names[k * n // shards:(k + 1) * n // shards]
                     for k in range(shards)}
        umask = os.umask(0)
        os.umask(umask)
        for fname, keys in files.items():
            tmp = root / (fname + ".tmp")
            written.append(tmp)
            try:
                save_file({k: stored[k] for k in keys}, str(tmp), metadata={"format": "pt"})
            except SafetensorError as exc:  # safetensors reports a failed write (full disk, EFBIG) as its own error
                raise OSError(f"{tmp.name}: {exc}") from None
            tmp.chmod(0o666 & ~umask)  # safetensors writes 0600; the files get the usual mode, as config.json
        if shards > 1:
            index = {"metadata": {"total_size": sum(t.numel() * t.element_size()
                                                    for t in stored.values())},
                     "weight_map": {k: f for f, keys in files.items() for k in keys}}
            made.append(root / "model.safetensors.index.json")
            made[-1].write_text(json.dumps(index, indent=2))
        for tmp in written:
            tmp.rename(tmp.with_suffix(""))
            made.append(tmp.with_suffix(""))
        made.append(root / "config.json")  # absent before this call (checked above)
        made[-1].write_text(json.dumps(hf, indent=2) + "\n")
    except BaseException:
        for f in (*written, *made):
            f.unlink(missing_ok=True)
        for d in created:  # innermost first; only directories this call made, if left empty
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()
        raise
    return root
