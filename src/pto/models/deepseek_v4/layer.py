"""The model on the kernels: prefill and decode sublayers through the DSL kernels where they
exist, the golden elsewhere, over the paged :class:`Cache` (DESIGN section 11; B.28-B.32).

:class:`KernelModel` has the interface :func:`generate` drives (``new_state``, ``forward``
for a prefill chunk, ``decode`` for one batched decode step, ``release_state``). Per layer
and sublayer it runs a ``@pl.jit`` kernel program when one is available for that layer
type and phase, and the matching :class:`GoldenModel` sublayer otherwise;
:meth:`KernelModel.coverage` says which is which, and :attr:`KernelModel.stats` counts the
kernel programs, tasks and wall time.

Kernel sublayers in use (the kernels are W8A8: INT8 ``wq_b`` / ``wo_b`` with per-channel
scales, BF16 activations and weights otherwise, so the kernel path needs
``weight_format="int8"``):

* sliding-window (ratio 0) attention: prefill ``prefill_attention_swa`` (hc_pre, RMSNorm,
  q/kv + RoPE, cache write, window attention with sinks, grouped o-projection, hc_post)
  and decode ``decode_attention_swa`` (the same over ``B`` requests);
* CSA (ratio 4) attention: ``prefill_attention_csa`` / ``decode_attention_csa`` (the
  ratio-4 overlapping compressor, the indexer compressor into INT8 keys rotated by an
  orthonormal Hadamard, the lightning-indexer top-k, sparse attention over window +
  selected entries);
* HCA (ratio 128) attention: ``prefill_attention_hca`` / ``decode_attention_hca`` (the
  same plus the ratio-128 compressor into the paged state ring and compressed cache);
* the MoE sublayer of every layer, prefill and decode: ``moe`` (hc_pre, gate with hash or
  learned routing, shared + routed W8A8 SwiGLU experts, hc_post).

* the embedding (``lookup_embedding``, BF16 table) and the head (``final_logits``:
  hc_head, final RMSNorm, lm_head with BF16 weights, FP32 logits).

Golden fallback: none for the tiny and FLASH schedules (every layer type has kernels); the
golden sublayers are still used for a layer type without an entry in ``_ATTN_KERNELS``. The golden state of a fallback layer is its own
full-history cache (:class:`pto.models.deepseek_v4.model.LayerState`).
"""

import functools
import inspect
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

import pto.language as pl

from pto.errors import ConfigError
from pto.models.deepseek_v4.cache import Cache, kernel_config
from pto.models.deepseek_v4.config import DeepSeekV4Config, DeploymentConfig
from pto.models.deepseek_v4.decode_attention_hca import decode_attention_hca_kernels
from pto.models.deepseek_v4.decode_attention_swa import decode_attention_swa_kernels
from pto.models.deepseek_v4.lm_head import lm_head_kernels
from pto.models.deepseek_v4.lookup_embedding import lookup_embedding_kernels
from pto.models.deepseek_v4.moe import MOE_INPUTS, moe_kernels
from pto.models.deepseek_v4.prefill_attention_csa import csa_block_kernels
from pto.models.deepseek_v4.prefill_attention_hca import prefill_attention_hca_kernels
from pto.models.deepseek_v4.prefill_attention_swa import prefill_attention_swa_kernels
from pto.models.deepseek_v4.model import GoldenModel, GoldenState
from pto.models.deepseek_v4.rope import profile_for_ratio, rope_tables
from pto.models.deepseek_v4.tiling import token_capacity
from pto.models.deepseek_v4.weights import Checkpoint, attention_inputs, moe_inputs
from pto.runtime import RunConfig

__all__ = ["KernelModel", "KernelState", "KernelStats", "layer_kernels"]

_HEAP_BYTES = 256 << 20  # ring heap of one kernel program (tiny: < 10 MiB peak)


# ---- kernel ----
def _layer_program(name: str, attn, moe, attn_num_tokens: bool, num_tokens_param: bool, cfg: DeepSeekV4Config):
    """A ``@pl.jit`` layer program: ``attn`` (an attention block's inline body) then ``moe``.

    Its parameters are ``attn``'s (without ``x_out`` / ``num_tokens``), then ``moe``'s
    (without ``x_hc``, ``x_next``, ``layer_id``, ``num_tokens``), then ``x_out`` (``moe``'s
    ``x_next`` annotation), ``layer_id`` and, if ``num_tokens_param``, ``num_tokens`` (else all
    ``T`` rows are active); the annotations are the blocks' own, so binding checks every shape.
    The attention writes the streams into the scratch ``x_mid [T, hc_mult, D]`` FP32 that the
    MoE block reads.
    """
    a_sig, a_anns = attn.signature()
    m_sig, m_anns = moe.signature()
    a_names = [n for n in a_sig.parameters if n not in ("x_out", "num_tokens")]
    m_names = [n for n in m_sig.parameters if n not in ("x_hc", "x_next", "layer_id", "num_tokens")]
    names = a_names + m_names + ["x_out", "layer_id"] + (["num_tokens"] if num_tokens_param else [])
    anns = {**{n: a_anns[n] for n in a_names}, **{n: m_anns[n] for n in m_names}, "x_out": m_anns["x_next"],
            "layer_id": m_anns["layer_id"], "num_tokens": m_anns["num_tokens"]}
    na, nm = len(a_names), len(m_names)
    HC, D, cap = cfg.hc_mult, cfg.hidden_size, token_capacity(cfg)

    def layer(*args):
        attn_args, moe_args, x_out, layer_id = args[:na], args[na:na + nm], args[na + nm], args[na + nm + 1]
        t = pl.tensor.dim(attn_args[0], 0)
        num_tokens = args[na + nm + 2] if num_tokens_param else t
        x_mid = pl.create_tensor([t, HC, D], pl.FP32, capacity=cap, name="x_mid")
        attn(*attn_args, x_mid, *([num_tokens] if attn_num_tokens else []))
        moe(x_mid, *moe_args, x_out, layer_id, num_tokens)
        return x_out

    layer.__name__ = layer.__qualname__ = name
    layer.__doc__ = f"{name}: the layer's attention block, then its MoE block; returns ``x_out``."
    layer.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])
    layer.__annotations__ = {n: anns[n] for n in names}
    return pl.jit(layer)


@functools.lru_cache(maxsize=None)
def layer_kernels(cfg: DeepSeekV4Config) -> SimpleNamespace:
    """The ``@pl.jit`` layer programs of ``cfg`` (cached per config): one program per layer,
    the attention block of the layer's type then the MoE block (v4flash-kernels.md B.28-B.29).

    ``prefill_layer_{swa,csa,hca}``: one request, ``T`` token rows of which the first
    ``num_tokens`` are active; arguments are those of ``prefill_attention_swa`` /
    ``prefill_attention_csa`` (``CSA_ARGS``) / ``prefill_attention_hca`` (without their
    ``x_out`` / ``num_tokens``), then ``moe``'s (without ``x_hc``), then ``x_out [T, hc_mult,
    D] FP32`` (Out), ``layer_id`` and ``num_tokens``. ``decode_layer_{swa,csa,hca}``: the
    decode attention block over ``B`` requests of one token (``[B, n]`` tables), then ``moe``
    over the ``T = B`` rows (all active); no ``num_tokens``. See :func:`_layer_program`.

    Returns:
        namespace with the six entries.

    Raises:
        ConfigError: a composed kernel cannot tile ``cfg``; at run time the composed kernels'
            errors (``BindError`` naming a parameter of the wrong shape).
    """
    moe = moe_kernels(cfg).moe
    blocks = {
        "prefill_layer_swa": (prefill_attention_swa_kernels(cfg).prefill_attention_swa, True, True),
        "prefill_layer_csa": (csa_block_kernels(cfg, "prefill").csa_block, True, True),
        "prefill_layer_hca": (prefill_attention_hca_kernels(cfg).prefill_attention_hca, True, True),
        "decode_layer_swa": (decode_attention_swa_kernels(cfg).decode_attention_swa, False, False),
        "decode_layer_csa": (csa_block_kernels(cfg, "decode").csa_block, True, False),
        "decode_layer_hca": (decode_attention_hca_kernels(cfg).decode_attention_hca, False, False),
    }
    return SimpleNamespace(**{name: _layer_program(name, attn, moe, attn_nt, nt_param, cfg)
                              for name, (attn, attn_nt, nt_param) in blocks.items()})
# ---- end kernel ----


@dataclass
class KernelState:
    """One request on the kernel path: its cache id, tokens seen, and the golden state of
    the fallback layers."""

    rid: int
    golden: GoldenState
    pos: int = 0


@dataclass
class KernelStats:
    """Per kernel program name: runs, tasks, edges (summed), the largest heap peak (bytes) and
    wall seconds (summed)."""

    programs: dict[str, int] = field(default_factory=dict)
    tasks: dict[str, int] = field(default_factory=dict)
    edges: dict[str, int] = field(default_factory=dict)
    heap_peak_bytes: dict[str, int] = field(default_factory=dict)
    wall_s: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, prog, wall: float) -> None:
        """Record one program run of kernel ``name``."""
        st = prog.stats
        self.programs[name] = self.programs.get(name, 0) + 1
        self.tasks[name] = self.tasks.get(name, 0) + st.tasks
        self.edges[name] = self.edges.get(name, 0) + st.edges
        self.heap_peak_bytes[name] = max(self.heap_peak_bytes.get(name, 0), st.heap_peak_bytes)
        self.wall_s[name] = self.wall_s.get(name, 0.0) + wall

    def rows(self) -> list[tuple]:
        """``(name, runs, tasks/run, edges/run, edges per task, heap peak bytes, wall ms/run)``
        per program name, in first-run order."""
        out = []
        for k, n in self.programs.items():
            t, e = self.tasks[k] / n, self.edges[k] / n
            out.append((k, n, t, e, e / t if t else 0.0, self.heap_peak_bytes[k], 1e3 * self.wall_s[k] / n))
        return out


class KernelModel:
    """DeepSeek-V4 over the DSL kernels with golden fallbacks (see the module docstring).

    Args:
        checkpoint: an opened checkpoint with ``weight_format="int8"``.
        deployment: pools and context (default: the ``tiny``-like context of
            :class:`GoldenModel`, pools from :class:`DeploymentConfig` defaults).
        check: run every kernel program in check mode (sanitizer and race checker).

    Raises:
        ConfigError: a checkpoint not in the int8 format, or a config the kernels cannot tile.
    """

    def __init__(self, checkpoint: Checkpoint, deployment: DeploymentConfig | None = None,
                 check: bool = False):
        if checkpoint.weight_format != "int8":
            raise ConfigError("KernelModel: the attention kernels are W8A8; open the checkpoint with "
                              "weight_format='int8' (weight_format='bf16' runs the golden forward)")
        self.golden = GoldenModel(checkpoint, deployment)
        self.cfg, self.deployment = self.golden.cfg, self.golden.deployment
        self.kcfg = kernel_config(self.cfg, self.deployment)
        self.cache = Cache(self.cfg, self.deployment)
        self.run_config = RunConfig(heap_bytes=_HEAP_BYTES, check=check)
        bf16 = torch.bfloat16
        self._rope = {p: tuple(t.to(bf16) for t in rope_tables(self.kcfg, p))
                      for p in ("main", "compress")}
        self._attn_w: dict[int, dict] = {}
        self.stats = KernelStats()
        self._layers = layer_kernels(self.kcfg)
        self._moe = moe_kernels(self.kcfg).moe_test
        self._embed = lookup_embedding_kernels(self.kcfg).lookup_embedding_test
        self._final_logits = lm_head_kernels(self.kcfg).final_logits_test
        glob = self.golden.ckpt.globals()
        self._embed_w = glob["embed.weight"].to(bf16)
        self._head_w = [glob["hc_head_fn"], glob["hc_head_scale"], glob["hc_head_base"],
                        glob["norm.weight"].to(bf16), glob["head.weight"].to(bf16)]
        self._ffn_w: dict[int, dict] = {}

    # ---- which sublayers run on kernels -----------------------------------------------------
    _ATTN_KERNELS = {0: "swa", 4: "csa", 128: "hca"}  # compress ratio -> attention kernel family

    def _attn_on_kernels(self, i: int) -> bool:
        return self.cfg.compress_ratios[i] in self._ATTN_KERNELS

    def coverage(self) -> list[dict[str, str]]:
        """Per layer: ``{"type", "attn prefill", "attn decode", "ffn"}`` -> kernel name or
        ``"golden"``."""
        out = []
        for i, ratio in enumerate(self.cfg.compress_ratios):
            fam = self._ATTN_KERNELS.get(ratio)
            out.append({"type": self.cfg.layer_types[i],
                        "attn prefill": f"prefill_attention_{fam}" if fam else "golden",
                        "attn decode": f"decode_attention_{fam}" if fam else "golden",
                        "ffn": "moe"})
        return out

    # ---- weights ----------------------------------------------------------------------------
    def attn_weights(self, i: int) -> dict[str, torch.Tensor]:
        """Layer ``i``'s attention inputs in the kernels' layout (:func:`weights.attention_inputs`),
        converted on first use and kept."""
        if i not in self._attn_w:
            self._attn_w[i] = attention_inputs(self.golden.ckpt, i)
        return self._attn_w[i]

    def ffn_weights(self, i: int) -> dict[str, torch.Tensor]:
        """Layer ``i``'s INT8 MoE inputs (:func:`weights.moe_inputs`), converted on first use."""
        if i not in self._ffn_w:
            self._ffn_w[i] = moe_inputs(self.golden.ckpt, i, "int8")
        return self._ffn_w[i]

    def _ffn_args(self, i: int, ids: torch.Tensor) -> list:
        """``moe``'s tensor arguments after ``x_hc`` (the token ids filled in)."""
        w = self.ffn_weights(i)
        return [ids.to(torch.int64) if k == "input_ids" else w[k] for k in MOE_INPUTS[1:]]

    def _ffn(self, i: int, X: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """MoE sublayer of layer ``i`` through the ``moe`` kernel alone; ``[T, N, D]`` FP32."""
        x_next = torch.empty_like(X)
        self._run("moe", self._moe, X, *self._ffn_args(i, ids), x_next, i, X.shape[0])
        return x_next

    def _embed_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """``lookup_embedding``: ``[T]`` ids -> ``[T, hc_mult, D]`` FP32 streams (BF16 table)."""
        x = torch.empty(ids.numel(), self.cfg.hc_mult, self.cfg.hidden_size)
        self._run("lookup_embedding", self._embed, ids.to(torch.int64), self._embed_w, x)
        return x

    def _logits(self, X: torch.Tensor) -> torch.Tensor:
        """``final_logits``: hc_head -> RMSNorm -> lm_head (BF16 weights); ``[T, V]`` FP32."""
        logits = torch.empty(X.shape[0], self.cfg.vocab_size)
        self._run("final_logits", self._final_logits, X, *self._head_w, logits)
        return logits

    # ---- requests ---------------------------------------------------------------------------
    def new_state(self) -> KernelState:
        """A new request (cache pages for its compressor-state rings are taken now).

        Raises:
            CapacityError: the cache holds ``max_requests`` requests already.
        """
        return KernelState(self.cache.add_request(), self.golden.new_state())

    def release_state(self, state: KernelState) -> None:
        """Return the request's cache pages."""
        if state.rid in self.cache.requests:
            self.cache.release(state.rid)

    def _run(self, name: str, entry, *args) -> None:
        t0 = time.perf_counter()
        prog = entry.run(*args, config=self.run_config)
        self.stats.add(name, prog, time.perf_counter() - t0)

    def _attn_args(self, i: int, X, rids: list[int], pos, prefill: bool) -> list:
        """Arguments of the layer's prefill (one request, ``[n]`` tables) or decode
        (``B = len(rids)`` requests, one token each, ``[B, n]`` tables) attention entry."""
        w, c, ratio = self.attn_weights(i), self.cache, self.cfg.compress_ratios[i]
        cos, sin = self._rope[profile_for_ratio(ratio)]

        def table(kind):
            t = [c.block_table(r, kind) for r in rids]
            return t[0] if prefill else torch.stack(t)

        def slots(kind):
            if len(rids) == 1:
                return c.slot_mapping(rids[0], pos, kind)
            return torch.cat([c.slot_mapping(r, pos[b:b + 1], kind) for b, r in enumerate(rids)])

        head = [X, w["hc_attn_fn"], w["hc_attn_scale"], w["hc_attn_base"], w["attn_norm_w"], w["wq_a"],
                w["wq_b"], w["wq_b_scale"], w["wkv"], w["gamma_cq"], w["gamma_ckv"], cos, sin]
        tail = [pos.to(torch.int32), w["attn_sink"], w["wo_a"], w["wo_b"], w["wo_b_scale"]]
        L = c.layers[i]
        if ratio == 0:
            return head + [L["kv"], table("swa_kv"), slots("swa_kv")] + tail
        if ratio == 4:  # CSA_ARGS order; the indexer keys share the compressed entries' table
            return head + [L["kv"], table("swa_kv"), slots("swa_kv")] + tail + [
                w["cmp_wkv"], w["cmp_wgate"], w["cmp_ape"], w["cmp_norm_w"], L["state"], table("csa_state"),
                L["cmp_kv"], table("csa_cmp"), slots("csa_cmp"), slots("csa_state"),
                w["idx_wkv"], w["idx_wgate"], w["idx_ape"], w["idx_norm_w"], L["idx_state"], table("csa_state"),
                slots("csa_state"), w["hadamard"], L["idx_kv"], L["idx_kv_scale"], table("csa_cmp"),
                slots("csa_cmp"), w["idx_wq_b"], w["idx_wq_b_scale"], w["idx_weights_proj"]]
        return head + [w["cmp_wkv"], w["cmp_wgate"], w["cmp_ape"], w["cmp_norm_w"], L["state"],
                       table("hca_state"), L["kv"], table("swa_kv"), slots("swa_kv"), L["cmp_kv"],
                       table("hca_cmp"), slots("hca_cmp"), slots("hca_state")] + tail

    # ---- forward ----------------------------------------------------------------------------
    def forward(self, ids, state: KernelState) -> torch.Tensor:
        """Prefill chunk: logits ``[S, V]`` FP32 of ``ids`` at positions ``state.pos ..``.

        Raises:
            BindError / CapacityError: bad ids, the context or a cache pool exhausted (before
                any kernel runs).
            CapacityError: more than the kernels' token capacity (128) in one chunk.
        """
        g = self.golden
        ids = g.check_ids(ids, state.golden)
        S = ids.numel()
        self.cache.reserve(state.rid, S)
        pos = torch.arange(state.pos, state.pos + S)
        X = self._embed_ids(ids)
        for i in range(self.cfg.num_hidden_layers):
            if self._attn_on_kernels(i):
                x_out = torch.empty_like(X)
                name = f"prefill_layer_{self._ATTN_KERNELS[self.cfg.compress_ratios[i]]}"
                self._run(name, getattr(self._layers, name), *self._attn_args(i, X, [state.rid], pos, True),
                          *self._ffn_args(i, ids), x_out, i, S)
                X = x_out
            else:
                X = self._ffn(i, g.attn_sublayer(i, X, pos, state.golden.layers[i]), ids)
        self.cache.commit(state.rid, S)
        state.pos += S
        state.golden.pos += S
        return self._logits(X)

    __call__ = forward

    def decode(self, tokens: list[int], states: list[KernelState]) -> torch.Tensor:
        """One decode step of ``B`` requests, one token each; logits ``[B, V]`` FP32.

        Raises:
            BindError / CapacityError: as :meth:`forward`.
        """
        g = self.golden
        ids = g.check_ids(tokens)
        for t, st in zip(tokens, states):
            g.check_ids([t], st.golden)
        for st in states:
            self.cache.reserve(st.rid, 1)
        pos = torch.tensor([st.pos for st in states])
        X = self._embed_ids(ids)
        rids = [st.rid for st in states]
        for i in range(self.cfg.num_hidden_layers):
            if self._attn_on_kernels(i):
                x_out = torch.empty_like(X)
                name = f"decode_layer_{self._ATTN_KERNELS[self.cfg.compress_ratios[i]]}"
                self._run(name, getattr(self._layers, name), *self._attn_args(i, X, rids, pos, False),
                          *self._ffn_args(i, ids), x_out, i)
                X = x_out
            else:
                X = torch.cat([g.attn_sublayer(i, X[b:b + 1], pos[b:b + 1], st.golden.layers[i])
                               for b, st in enumerate(states)])
                X = self._ffn(i, X, ids)
        for st in states:
            self.cache.commit(st.rid, 1)
            st.pos += 1
            st.golden.pos += 1
        return self._logits(X)
