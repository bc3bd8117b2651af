"""The DeepSeek-V4 golden forward: the whole model in FP32 torch, chained from the kernels'
goldens, with a per-request cache so chunked prefill and decode steps are the same code.

Composition (transformers `models/deepseek_v4/modeling_deepseek_v4.py`; pypto-lib `models/deepseek/v4-flash/` decode_layer.py, prefill_layer.py, decode_fwd.py, prefill_fwd.py, host modules):

    e = embed[ids];  X = [e] * hc_mult                          # [S, N, D] residual streams
    per layer:  x, post, comb = hc_pre(X, hc_attn_*)             # golden_hc_pre (FP32 out)
                X = hc_post(attention(RMSNorm(x, attn_norm)), X, post, comb)
                x, post, comb = hc_pre(X, hc_ffn_*)
                X = hc_post(moe(RMSNorm(x, ffn_norm)), X, post, comb)
    h = hc_head(X);  logits = RMSNorm(h, norm) @ head^T          # [S, V]

Goldens chained: ``golden_lookup_embedding``; per sublayer ``golden_hc_pre`` /
``golden_hc_post``; ``golden_qkv_proj_rope``; ``golden_moe`` (gate, shared and routed
experts, in its FP32 parity mode); ``golden_final_logits`` (hc_head, RMSNorm, lm_head).
The attention core and the compressors / indexer are written here over the golden's own
full-history cache (the kernels' attention goldens read paged caches):

Attention of a layer with compress ratio 0 (SWA), 4 (CSA) or 128 (HCA): q / kv from
``golden_qkv_proj_rope`` (the layer's RoPE profile: main for SWA, compress otherwise); keys
are the raw kv of positions ``t-W+1 .. t`` plus, for CSA / HCA, compressed entries ``w``
visible to ``t`` (``w < (t+1) // ratio``; CSA only those the indexer selects, top
``index_topk`` by score); softmax with the per-head sink in the denominator; inverse RoPE
on the output; grouped o-projection. MoE (``golden_moe``): sqrt-softplus router (hash table
on the first ``num_hash_layers`` layers, bias for selection only), normalised weights times
``routed_scaling_factor``, SwiGLU experts clamped at ``swiglu_limit`` plus the shared expert.

Weight formats: ``"bf16"`` runs every matrix unquantised in FP32 (the parity mode,
``float32=True``); ``"int8"`` runs the W8A8 matrices of :data:`weights.INT8_WEIGHTS` and the
routed experts with per-row INT8 activations and exact integer products by the kernels'
quantisation rules (``qkv_proj_rope.quantize_per_row_int8`` / ``quantize_weight_per_column``;
the experts through ``golden_moe(weight_format="int8")``); everything else stays FP32.

The cache (:class:`GoldenState`) keeps, per layer, every raw kv row, the compressor and
indexer projections of every token and the compressed entries emitted so far. That is
more than the paged kernel cache holds (the last ``W - 1`` raw rows, the open window) but
gives the same attention inputs, so prefill in chunks, prefill-then-decode and one-shot
prefill agree to FP32 rounding (transformers' own cache does the same bookkeeping).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pto.errors import BindError, CapacityError, ConfigError
from pto.models.deepseek_v4.config import DeepSeekV4Config, DeploymentConfig
from pto.models.deepseek_v4.hc_post import golden_hc_post
from pto.models.deepseek_v4.hc_pre import golden_hc_pre
from pto.models.deepseek_v4.lm_head import golden_final_logits
from pto.models.deepseek_v4.lookup_embedding import golden_lookup_embedding
from pto.models.deepseek_v4.moe import golden_moe
from pto.models.deepseek_v4.qkv_proj_rope import (golden_qkv_proj_rope, quantize_per_row_int8,
                                                  rope_interleaved)
from pto.models.deepseek_v4.rope import profile_for_ratio, rope_tables
from pto.models.deepseek_v4.weights import Checkpoint, QuantWeight, moe_inputs

__all__ = ["GoldenModel", "GoldenState", "LayerState", "linear", "rms_norm"]


def rms_norm(x: torch.Tensor, eps: float, weight: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm over the last axis in FP32 (transformers `models/deepseek_v4/modeling_deepseek_v4.py`); weighted if ``weight`` is given."""
    y = x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + eps)
    return y if weight is None else y * weight


_rms = rms_norm


def linear(x: torch.Tensor, w) -> torch.Tensor:
    """``x @ w^T``: ``x [S, in]`` FP32, ``w [out, in]`` FP32 or a :class:`QuantWeight`.

    A QuantWeight runs W8A8 as the kernels do: the rows of ``x`` are quantised by
    ``quantize_per_row_int8`` (scale ``max(amax, 1e-4) / 127``), the products are exact
    integers (FP64 sums of INT8 products), and ``(acc * s_x) * s_w`` is returned in FP32.
    """
    if isinstance(w, QuantWeight):
        codes, s = quantize_per_row_int8(x)
        acc = (codes.double() @ w.codes.double().T).float()
        return (acc * s) * w.scale[None, :]
    return x @ w.T


@dataclass
class LayerState:
    """Golden cache of one layer for one request (all FP32, rows in position order).

    ``kv [P, d]``: raw (normed, RoPE'd) kv of every token so far. ``cmp_kv / cmp_gate
    [P, c*d]``: compressor projections (``c = 2`` for CSA, 1 for HCA), ``cmp [Tw, d]``:
    entries emitted so far; ``idx_*`` the same for the CSA indexer at width ``dI``.
    """

    kv: torch.Tensor
    cmp_kv: torch.Tensor | None = None
    cmp_gate: torch.Tensor | None = None
    cmp: torch.Tensor | None = None
    idx_kv: torch.Tensor | None = None
    idx_gate: torch.Tensor | None = None
    idx: torch.Tensor | None = None


@dataclass
class GoldenState:
    """Per-request golden cache: ``pos`` tokens seen and one :class:`LayerState` per layer."""

    pos: int = 0
    layers: list[LayerState] = field(default_factory=list)


class GoldenModel:
    """FP32 golden DeepSeek-V4 over a checkpoint (see the module docstring).

    Args:
        checkpoint: an opened :class:`Checkpoint` (its ``weight_format`` is used).
        deployment: bounds the context (``max_context``) and the RoPE table length;
            default ``DeploymentConfig(max_context=rope_max_pos=max_position_embeddings)``
            capped at 16384 positions.
        float32: must be True (the golden runs in FP32; accepted for the documented
            ``weight_format="bf16", float32=True`` spelling).

    Raises:
        ConfigError: ``float32`` is not True.
    """

    def __init__(self, checkpoint: Checkpoint, deployment: DeploymentConfig | None = None,
                 float32: bool = True):
        if float32 is not True:
            raise ConfigError("GoldenModel: only float32=True is implemented (the golden is FP32)")
        self.ckpt = checkpoint
        self.cfg: DeepSeekV4Config = checkpoint.config
        n = min(self.cfg.max_position_embeddings, 16384)
        self.deployment = (deployment or DeploymentConfig(max_context=n, rope_max_pos=n)
                           ).validate(self.cfg)
        self.weight_format = checkpoint.weight_format
        self._layers: dict[int, dict] = {}
        self._moe_w: dict[int, dict] = {}
        self._glob = checkpoint.globals()
        self._rope = {p: rope_tables(self.cfg, p, max_pos=self.deployment.rope_max_pos)
                      for p in ("main", "compress")}

    # ---- weights ----------------------------------------------------------------------------
    def layer_weights(self, i: int) -> dict:
        """Tensors of layer ``i`` (loaded on first use, then kept)."""
        if i not in self._layers:
            self._layers[i] = self.ckpt.layer(i)
        return self._layers[i]

    def new_state(self) -> GoldenState:
        """An empty cache for one request."""
        d = self.cfg.head_dim
        return GoldenState(0, [LayerState(kv=torch.zeros(0, d)) for _ in range(self.cfg.num_hidden_layers)])

    # ---- pieces -----------------------------------------------------------------------------
    def _rope_rows(self, profile: str, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self._rope[profile]
        return cos[pos], sin[pos]

    def _compress(self, kv: torch.Tensor, gate: torch.Tensor, ape: torch.Tensor, norm_w,
                  ratio: int, first: int, count: int, width: int) -> torch.Tensor:
        """Entries ``first .. first+count-1`` from all-token projections ``kv, gate [P, c*w]``.

        HCA (ratio 128): softmax over the 128 slots of window ``w`` of ``gate + ape``, per
        channel. CSA (ratio 4): 8 slots, the first half of window ``w-1`` (``[:width]``,
        gates ``+ ape[:, :width]``; -inf for ``w = 0``) and the second half of window
        ``w`` (``[width:]``). Then weighted RMSNorm and compress RoPE at position
        ``ratio * w`` (transformers `models/deepseek_v4/modeling_deepseek_v4.py`).
        """
        out = []
        for w in range(first, first + count):
            cur = slice(w * ratio, (w + 1) * ratio)
            if ratio == 4:
                kb, gb = kv[cur, width:], gate[cur, width:] + ape[:, width:]
                if w > 0:
                    prev = slice((w - 1) * ratio, w * ratio)
                    ka, ga = kv[prev, :width], gate[prev, :width] + ape[:, :width]
                else:
                    ka = torch.zeros(ratio, width)
                    ga = torch.full((ratio, width), float("-inf"))
                k, g = torch.cat([ka, kb]), torch.cat([ga, gb])
            else:
                k, g = kv[cur], gate[cur] + ape
            out.append((k * torch.softmax(g, dim=0)).sum(dim=0))
        if not out:
            return torch.zeros(0, width)
        e = _rms(torch.stack(out), self.cfg.rms_norm_eps, norm_w)
        pos = torch.arange(first, first + count) * ratio
        cos, sin = self._rope_rows("compress", pos)
        r = self.cfg.qk_rope_head_dim
        return torch.cat([e[:, :-r], rope_interleaved(e[:, -r:], cos, sin)], dim=-1)

    def _update_compressor(self, st: LayerState, w: dict, xn: torch.Tensor, ratio: int,
                           prefix: str, attr: str, width: int, p_end: int) -> torch.Tensor:
        """Append this chunk's projections and emit the windows it completes; returns all
        entries so far ``[Tw, width]``."""
        kv_new, gate_new = linear(xn, w[f"{prefix}.wkv.weight"]), linear(xn, w[f"{prefix}.wgate.weight"])
        kv_all = kv_new if getattr(st, attr + "_kv") is None else torch.cat([getattr(st, attr + "_kv"), kv_new])
        gate_all = gate_new if getattr(st, attr + "_gate") is None else \
            torch.cat([getattr(st, attr + "_gate"), gate_new])
        setattr(st, attr + "_kv", kv_all)
        setattr(st, attr + "_gate", gate_all)
        have = 0 if getattr(st, attr) is None else getattr(st, attr).shape[0]
        total = p_end // ratio
        new = self._compress(kv_all, gate_all, w[f"{prefix}.ape"], w[f"{prefix}.norm.weight"],
                             ratio, have, total - have, width)
        entries = new if getattr(st, attr) is None else torch.cat([getattr(st, attr), new])
        setattr(st, attr, entries)
        return entries

    def _indexer_select(self, w: dict, xn, q_res, pos, entries_i: torch.Tensor) -> torch.Tensor:
        """``[S, T]`` bool: entries the lightning indexer selects per query (transformers `models/deepseek_v4/modeling_deepseek_v4.py`)."""
        cfg = self.cfg
        S, T = xn.shape[0], entries_i.shape[0]
        HI, dI, r = cfg.index_n_heads, cfg.index_head_dim, cfg.qk_rope_head_dim
        qi = linear(q_res, w["attn.indexer.wq_b.weight"]).reshape(S, HI, dI)
        cos, sin = self._rope_rows("compress", pos)
        qi = torch.cat([qi[..., :-r], rope_interleaved(qi[..., -r:], cos, sin)], dim=-1)
        hw = linear(xn, w["attn.indexer.weights_proj.weight"]) * HI ** -0.5  # [S, HI]
        dots = torch.relu(torch.einsum("shd,td->sht", qi, entries_i)) * dI ** -0.5
        score = (hw[:, :, None] * dots).sum(dim=1)  # [S, T]
        visible = torch.arange(T)[None, :] < ((pos + 1) // 4)[:, None]
        score = score.masked_fill(~visible, float("-inf"))
        sel = torch.zeros(S, T, dtype=torch.bool)
        k = min(cfg.index_topk, T)
        if k:
            top = score.topk(k, dim=-1).indices
            sel.scatter_(1, top, True)
        return sel & visible

    def attention(self, i: int, xn: torch.Tensor, pos: torch.Tensor, st: LayerState) -> torch.Tensor:
        """Attention block of layer ``i`` on normed input ``xn [S, D]`` at positions ``pos [S]``;
        appends to ``st``; returns ``[S, D]`` FP32."""
        cfg, w = self.cfg, self.layer_weights(i)
        ratio = self.ckpt.layer_ratio(i)  # layer num_hidden_layers: the MTP layer (sliding-window)
        S, H, d, r, eps = xn.shape[0], cfg.num_attention_heads, cfg.head_dim, cfg.qk_rope_head_dim, \
            cfg.rms_norm_eps
        cos, sin = self._rope_rows(profile_for_ratio(ratio), pos)
        wq_b = w["attn.wq_b.weight"]
        if isinstance(wq_b, QuantWeight):
            q, kv, _, _ = golden_qkv_proj_rope(
                xn, w["attn.wq_a.weight"].T, wq_b.codes.T, wq_b.scale, w["attn.wkv.weight"].T, cos, sin,
                w["attn.q_norm.weight"], w["attn.kv_norm.weight"], cfg, weight_format="int8", out_bf16=False)
        else:
            q, kv, _, _ = golden_qkv_proj_rope(
                xn, w["attn.wq_a.weight"].T, wq_b.T, None, w["attn.wkv.weight"].T, cos, sin,
                w["attn.q_norm.weight"], w["attn.kv_norm.weight"], cfg, weight_format="bf16", out_bf16=False)
        st.kv = torch.cat([st.kv, kv])
        kpos = torch.arange(st.kv.shape[0])
        keys = st.kv
        mask = (kpos[None, :] <= pos[:, None]) & (kpos[None, :] > pos[:, None] - cfg.sliding_window)
        p_end = int(pos[-1]) + 1
        if ratio:
            width = d
            entries = self._update_compressor(st, w, xn, ratio, "attn.compressor", "cmp", width, p_end)
            T = entries.shape[0]
            visible = torch.arange(T)[None, :] < ((pos + 1) // ratio)[:, None]
            if ratio == 4:
                q_res = _rms(linear(xn, w["attn.wq_a.weight"]), eps, w["attn.q_norm.weight"])
                ent_i = self._update_compressor(st, w, xn, 4, "attn.indexer.compressor", "idx",
                                                cfg.index_head_dim, p_end)
                visible = self._indexer_select(w, xn, q_res, pos, ent_i)
            keys = torch.cat([keys, entries])
            mask = torch.cat([mask, visible], dim=1)
        logits = torch.einsum("shd,kd->shk", q, keys) * cfg.softmax_scale
        logits = logits.masked_fill(~mask[:, None, :], float("-inf"))
        sink = w["attn.attn_sink"].float()[None, :, None].expand(S, H, 1)
        full = torch.cat([logits, sink], dim=-1)
        probs = torch.softmax(full, dim=-1)[..., :-1]  # the sink has no value
        o = torch.einsum("shk,kd->shd", probs, keys)
        o = torch.cat([o[..., :-r], rope_interleaved(o[..., -r:], cos, sin, inverse=True)], dim=-1)
        G, Lo = cfg.o_groups, cfg.o_lora_rank
        og = o.reshape(S, G, -1)
        wo_a = w["attn.wo_a.weight"].reshape(G, Lo, -1)
        z = torch.einsum("sgi,goi->sgo", og, wo_a).reshape(S, G * Lo)
        return linear(z, w["attn.wo_b.weight"])

    # ---- forward ----------------------------------------------------------------------------
    def check_ids(self, ids, state: GoldenState | None = None) -> torch.Tensor:
        """Token ids as an int64 ``[S]`` tensor, checked.

        Raises:
            BindError: empty, not integers, or outside ``[0, vocab_size)``.
            CapacityError: the request would exceed the deployment's ``max_context``.
        """
        t = torch.as_tensor(ids)
        if t.dim() != 1 or t.numel() == 0:
            raise BindError(f"token ids must be a non-empty 1-D sequence, got shape {list(t.shape)}")
        if t.is_floating_point() or t.dtype == torch.bool:
            raise BindError(f"token ids must be integers, got {t.dtype}")
        V = self.cfg.vocab_size
        bad = (t < 0) | (t >= V)
        if bool(bad.any()):
            k = int(bad.nonzero()[0, 0])
            raise BindError(f"token id {int(t[k])} at index {k} is outside the vocabulary [0, {V})")
        start = 0 if state is None else state.pos
        if start + t.numel() > self.deployment.max_context:
            raise CapacityError(f"request of {start + t.numel()} tokens exceeds the deployment's "
                                f"max_context={self.deployment.max_context}")
        return t.to(torch.int64)

    def forward(self, ids, state: GoldenState | None = None) -> torch.Tensor:
        """Logits ``[S, V]`` FP32 of token ids ``ids [S]`` at positions ``state.pos ..``.

        With ``state`` the call continues that request and appends to its cache (prefill
        chunk or decode step); without it the call is a fresh request.

        Raises:
            BindError / CapacityError: see :meth:`check_ids` (nothing is appended then).
        """
        return self.forward_hidden(ids, state)[0]

    __call__ = forward

    def forward_hidden(self, ids, state: GoldenState | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`forward` that also returns the last layer's streams ``X [S, hc_mult, D]`` FP32
        (before ``hc_head``: the MTP layer's input). Same errors as :meth:`forward`."""
        state = self.new_state() if state is None else state
        ids = self.check_ids(ids, state)
        pos = torch.arange(state.pos, state.pos + ids.numel())
        X = self.embed(ids)
        for i in range(self.cfg.num_hidden_layers):
            X = self.attn_sublayer(i, X, pos, state.layers[i])
            X = self.ffn_sublayer(i, X, ids)
        state.pos += ids.numel()
        return self.logits(X), X

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """``[S]`` ids -> ``[S, hc_mult, D]`` FP32 streams (``golden_lookup_embedding``)."""
        return golden_lookup_embedding(ids, self._glob["embed.weight"], self.cfg.hc_mult)

    def attn_sublayer(self, i: int, X: torch.Tensor, pos: torch.Tensor, st: LayerState) -> torch.Tensor:
        """``X' = hc_post(attention(RMSNorm(hc_pre(X))), X)`` of layer ``i``; ``[S, N, D]`` FP32."""
        cfg, w = self.cfg, self.layer_weights(i)
        x, post, comb = golden_hc_pre(X, w["hc_attn_fn"], w["hc_attn_scale"], w["hc_attn_base"],
                                      cfg, out_bf16=False)
        y = self.attention(i, _rms(x, cfg.rms_norm_eps, w["attn_norm.weight"]), pos, st)
        return golden_hc_post(y, X, post, comb)

    def ffn_sublayer(self, i: int, X: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """``X' = hc_post(moe(RMSNorm(hc_pre(X))), X)`` of layer ``i`` (``golden_moe`` in its
        FP32 parity mode: hc_pre, gate, shared and routed SwiGLU experts, hc_post); ``[S, N,
        D]`` FP32. ``"int8"``: the kernels' INT8 expert weights and activation rule."""
        if i not in self._moe_w:
            self._moe_w[i] = moe_inputs(self.ckpt, i, self.weight_format)
        inputs = dict(self._moe_w[i], x_hc=X, input_ids=ids, layer_id=i, num_tokens=X.shape[0])
        return golden_moe(inputs, self.cfg, weight_format=self.weight_format, float32=True)

    def logits(self, X: torch.Tensor) -> torch.Tensor:
        """``[S, N, D]`` streams -> ``[S, V]`` FP32 logits (``golden_final_logits``: hc_head,
        final RMSNorm, lm_head; FP32 parity mode)."""
        g = self._glob
        return golden_final_logits(X, g["hc_head_fn"], g["hc_head_scale"], g["hc_head_base"], g["norm.weight"],
                                   g["head.weight"], self.cfg, float32=True)
