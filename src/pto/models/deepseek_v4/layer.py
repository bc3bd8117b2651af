"""The model on the kernels: layer programs, the prefill / decode forward programs and the
:class:`KernelModel` that runs them over the paged :class:`Cache` (README.md;
pypto-lib `models/deepseek/v4-flash/` decode_layer.py, prefill_layer.py, decode_fwd.py, prefill_fwd.py, host modules).

:func:`layer_kernels` composes the kernels' ``@pl.jit.inline`` bodies into ``@pl.jit``
programs: a layer (the attention block of its type, then the MoE block) and the whole
forward step (``lookup_embedding`` -> every layer -> ``final_logits``). Per layer type:

* sliding-window (ratio 0): ``prefill_attention_swa`` / ``decode_attention_swa`` (hc_pre,
  RMSNorm, q/kv + RoPE, cache write, window attention with sinks, grouped o-projection,
  hc_post);
* CSA (ratio 4): ``prefill_attention_csa`` / ``decode_attention_csa`` (the same plus the
  ratio-4 overlapping compressor, the indexer compressor into INT8 keys rotated by an
  orthonormal Hadamard, the lightning-indexer top-k, attention over window + selected
  entries);
* HCA (ratio 128): ``prefill_attention_hca`` / ``decode_attention_hca`` (the same with the
  ratio-128 compressor into the paged state ring and compressed cache, every visible entry);
* every layer's MoE: ``moe`` (hc_pre, gate with hash or learned routing, shared + routed
  W8A8 SwiGLU experts, hc_post).

The kernels run in the checkpoint's weight format (weight_format.py): ``"int8"`` is W8A8
(INT8 ``wq_b`` / ``wo_b`` / indexer ``wq_b`` / experts with per-channel scales, BF16
activations and other weights), ``"bf16"`` the unquantised kernels (those matrices in BF16,
BF16 activations into BF16 x BF16 -> FP32 matmuls, a BF16 indexer key cache). The FP32
golden forward (:class:`pto.models.deepseek_v4.model.GoldenModel`) is the reference of both.
:class:`KernelModel` has the interface :func:`generate` drives (``new_state``, ``forward``
for a prefill chunk, ``decode`` for one batched decode step, ``release_state``);
:attr:`KernelModel.stats` counts the programs, tasks, edges, heap peaks and wall time.
"""

import contextlib
import functools
import inspect
import os
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

import pto.language as pl

from pto.models.deepseek_v4.cache import Cache
from pto.models.deepseek_v4.config import DeepSeekV4Config, DeploymentConfig, kernel_config
from pto.models.deepseek_v4.decode_attention_hca import decode_attention_hca_kernels
from pto.models.deepseek_v4.decode_attention_swa import decode_attention_swa_kernels
from pto.models.deepseek_v4.lm_head import lm_head_kernels
from pto.models.deepseek_v4.lookup_embedding import lookup_embedding_kernels
from pto.models.deepseek_v4.moe import MOE_INPUTS, moe_kernels
from pto.models.deepseek_v4.prefill_attention_csa import csa_block_kernels
from pto.models.deepseek_v4.prefill_attention_hca import prefill_attention_hca_kernels
from pto.models.deepseek_v4.prefill_attention_swa import prefill_attention_swa_kernels
from pto.models.deepseek_v4.model import GoldenModel
from pto.models.deepseek_v4.rope import profile_for_ratio, rope_tables
from pto.models.deepseek_v4.tiling import token_capacity
from pto.models.deepseek_v4.weight_format import torch_weight_dtype
from pto.models.deepseek_v4.weights import Checkpoint, attention_inputs, moe_inputs
from pto.runtime import RunConfig, block_templates, parametric_replay_enabled
from pto.runtime.program import gc_paused
from pto.runtime.replay import program_cache_bypass

__all__ = ["KernelModel", "KernelState", "KernelStats", "layer_kernels"]

_HEAP_BYTES = 256 << 20  # ring heap of one kernel program (tiny: < 10 MiB peak)


def _templates(enabled: bool | None):
    """``block_templates(enabled)`` for one program run, or no switch at all (None: the global
    setting holds)."""
    return contextlib.nullcontext() if enabled is None else block_templates(enabled)


# ---- kernel ----
class _LayerBody:
    """One layer as two inline bodies: ``attn`` (an attention block) then ``moe``.

    ``names`` are the layer's weight, cache and metadata parameters: ``attn``'s (without
    ``x_hc``, ``x_out``, ``num_tokens``), then ``moe``'s (without ``x_hc``, ``input_ids``,
    ``x_next``, ``layer_id``, ``num_tokens``); ``annotations`` are the blocks' own (plus
    ``x_hc``). :meth:`__call__` runs the layer inside a program: the attention reads ``x_in``
    and writes the scratch ``x_mid [T, hc_mult, D]`` FP32 (in the caller's heap scope) that the
    MoE block turns into ``x_out``; each block runs in its own ``pl.scope()``, so its scratch is
    freed when it ends (the reference's ``decode_fwd`` runs every stage in its own scope).
    """

    def __init__(self, attn, moe, attn_num_tokens: bool, cfg: DeepSeekV4Config):
        a_sig, a_anns = attn.signature()
        m_sig, m_anns = moe.signature()
        self.a_names = [n for n in a_sig.parameters if n not in ("x_hc", "x_out", "num_tokens")]
        self.m_names = [n for n in m_sig.parameters if n not in ("x_hc", "input_ids", "x_next", "layer_id",
                                                                 "num_tokens")]
        self.names = self.a_names + self.m_names
        self.annotations = {**{n: a_anns[n] for n in self.a_names}, **{n: m_anns[n] for n in self.m_names},
                            "x_hc": a_anns["x_hc"]}
        self.moe_annotations = m_anns
        self.attn, self.moe, self.attn_num_tokens = attn, moe, attn_num_tokens
        self.HC, self.D, self.cap = cfg.hc_mult, cfg.hidden_size, token_capacity(cfg)
        ids_at = [n for n in m_sig.parameters if n != "x_hc"].index("input_ids")
        self._ids_at = ids_at  # input_ids' place among moe's arguments after x_hc

    def __call__(self, x_in, args, input_ids, x_out, layer_id, num_tokens, mark=None):
        """Run the layer (``mark()``, if given, is called between the two blocks)."""
        na = len(self.a_names)
        t = pl.tensor.dim(x_in, 0)
        x_mid = pl.create_tensor([t, self.HC, self.D], pl.FP32, capacity=self.cap, name="x_mid")
        with pl.scope():
            self.attn(x_in, *args[:na], x_mid, *([num_tokens] if self.attn_num_tokens else []))
        if mark is not None:
            mark()
        moe_args = list(args[na:])
        moe_args.insert(self._ids_at, input_ids)
        with pl.scope():
            self.moe(x_mid, *moe_args, x_out, layer_id, num_tokens)
        return x_out


def _forward(cfg: DeepSeekV4Config, layers: list, emb, head, args, prefill: bool, mark=None):
    """The body of ``prefill_fwd`` / ``decode_fwd`` (:func:`layer_kernels`): ``lookup_embedding``
    -> ``layers`` (one :class:`_LayerBody` per layer) -> ``final_logits``; returns ``logits``.

    Heap scopes: every layer runs in its own ``pl.scope()`` (and each of its two blocks in one
    more, :class:`_LayerBody`), so a layer's scratch is freed when it ends. The residual streams
    ``x_layer{i} [T, hc_mult, D]`` FP32 between layers are allocated by halving the layer range:
    the stream at the middle of a range lives in a scope around that range, so at most about
    ``log2(layers) + 1`` streams are live (FLASH: 7 of 43) and the heap peak is one layer's
    scratch plus those. Every stream is a new tensor, so the tasks and edges are those of one
    top scope.

    ``mark(name)``, if given, is called at each stage start (``"embedding"``, ``"L{i} attention
    {swa|csa|hca}"``, ``"L{i} moe"``, ``"head"``) and with ``None`` at the end (graph_only.py's
    stage figures).
    """
    mark = mark or (lambda name: None)
    input_ids, embed = args[0], args[1]
    t = pl.tensor.dim(input_ids, 0)
    num_tokens = args[-1] if prefill else t
    HC, D, cap = cfg.hc_mult, cfg.hidden_size, token_capacity(cfg)
    at = [2]
    for lb in layers:
        at.append(at[-1] + len(lb.names))

    def stream(name):
        return pl.create_tensor([t, HC, D], pl.FP32, capacity=cap, name=name)

    run = _LayerRange(cfg, layers, args, at, input_ids, num_tokens, mark, stream)
    x_last = stream(f"x_layer{len(layers) - 1}")
    with pl.scope():
        mark("embedding")
        x = stream("x_embed")
        emb(input_ids, embed, x)
        run(0, len(layers), x, x_last)
    mark("head")
    hc_fn, hc_scale, hc_base, norm_w, head_w, logits = args[at[-1]:at[-1] + 6]
    head(x_last, hc_fn, hc_scale, hc_base, norm_w, head_w, logits)
    mark(None)
    return logits


class _LayerRange:
    """The layers of :func:`_forward`: ``run(lo, hi, x_in, x_out)`` runs layers ``lo .. hi-1``
    (``x_in`` -> ``x_out``), halving the range with the middle stream in a scope around it. A
    callable object, not a closure calling itself, so the step's arguments are in no reference
    cycle and are freed by refcount when the program ends."""

    def __init__(self, cfg, layers, args, at, input_ids, num_tokens, mark, stream):
        self.cfg, self.layers, self.args, self.at = cfg, layers, args, at
        self.input_ids, self.num_tokens, self.mark, self.stream = input_ids, num_tokens, mark, stream

    def __call__(self, lo: int, hi: int, x_in, x_out) -> None:
        mark, at = self.mark, self.at
        if hi - lo == 1:
            mark(f"L{lo} attention {_FAMILY[self.cfg.compress_ratios[lo]]}")
            with pl.scope():
                self.layers[lo](x_in, self.args[at[lo]:at[lo + 1]], self.input_ids, x_out, lo, self.num_tokens,
                                mark=lambda: mark(f"L{lo} moe"))
            return
        mid = (lo + hi) // 2
        with pl.scope():
            x_m = self.stream(f"x_layer{mid - 1}")
            self(lo, mid, x_in, x_m)
            self(mid, hi, x_m, x_out)


def _jit(name: str, doc: str, names: list[str], annotations: dict, body):
    """``@pl.jit`` of ``body(*args)`` with the signature ``names`` and ``annotations``."""
    body.__name__ = body.__qualname__ = name
    body.__doc__ = doc
    body.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])
    body.__annotations__ = {n: annotations[n] for n in names}
    return pl.jit(body)


def _bodies(cfg: DeepSeekV4Config) -> dict[str, _LayerBody]:
    """``"{prefill,decode}_{swa,csa,hca}"`` -> :class:`_LayerBody` of that layer type and phase."""
    moe = moe_kernels(cfg).moe
    return {
        "prefill_swa": _LayerBody(prefill_attention_swa_kernels(cfg).prefill_attention_swa, moe, True, cfg),
        "prefill_csa": _LayerBody(csa_block_kernels(cfg, "prefill").csa_block, moe, True, cfg),
        "prefill_hca": _LayerBody(prefill_attention_hca_kernels(cfg).prefill_attention_hca, moe, True, cfg),
        "decode_swa": _LayerBody(decode_attention_swa_kernels(cfg).decode_attention_swa, moe, False, cfg),
        "decode_csa": _LayerBody(csa_block_kernels(cfg, "decode").csa_block, moe, True, cfg),
        "decode_hca": _LayerBody(decode_attention_hca_kernels(cfg).decode_attention_hca, moe, False, cfg),
    }


_FAMILY = {0: "swa", 4: "csa", 128: "hca"}  # compress ratio -> attention kernel family


@functools.lru_cache(maxsize=None)
def layer_kernels(cfg: DeepSeekV4Config) -> SimpleNamespace:
    """The ``@pl.jit`` programs of ``cfg`` (cached per config; pypto-lib `models/deepseek/v4-flash/` decode_layer.py, prefill_layer.py, decode_fwd.py, prefill_fwd.py, host modules).

    Layer programs (one layer: the attention block of its type, then the MoE block):
    ``prefill_layer_{swa,csa,hca}(x_hc, <layer args>, input_ids, x_out, layer_id,
    num_tokens)``: one request, ``T`` token rows of which the first ``num_tokens`` are active;
    ``decode_layer_{swa,csa,hca}(x_hc, <layer args>, input_ids, x_out, layer_id)``: ``B``
    requests of one token (``[B, n]`` tables), every row active. ``<layer args>`` are the
    attention block's arguments after ``x_hc`` (``prefill_attention_swa`` / ``CSA_ARGS`` /
    ``prefill_attention_hca`` and their decode twins, without ``x_out`` / ``num_tokens``) then
    ``moe``'s (without ``x_hc``, ``input_ids``); ``x_hc`` / ``x_out [T, hc_mult, D]`` FP32 are
    the layer's input and output streams.

    Forward programs over the whole layer schedule ``cfg.compress_ratios``:
    ``prefill_fwd(input_ids, embed, <layer 0 args as l0_*>, ..., hc_fn, hc_scale, hc_base,
    norm_w, head_w, logits, num_tokens)`` and ``decode_fwd(...)`` (no ``num_tokens``):
    ``lookup_embedding`` -> every layer -> ``final_logits`` (hc_head, RMSNorm, lm_head) into
    ``logits [T, V]`` FP32, one task graph for the whole step; every layer and block in its own
    heap scope, so the heap peak is one layer's scratch plus a few residual streams (:func:`_forward`).

    Returns:
        namespace with the six layer programs, ``prefill_fwd``, ``decode_fwd`` and
        ``layer_args(i, phase)`` (the ``l{i}_*`` parameter names of layer ``i``).

    Raises:
        ConfigError: a composed kernel cannot tile ``cfg``; at run time the composed kernels'
            errors (``BindError`` naming a parameter of the wrong shape).
    """
    bodies = _bodies(cfg)
    out = {}
    for key, lb in bodies.items():
        phase = key.split("_")[0]
        tail = ["input_ids", "x_out", "layer_id"] + (["num_tokens"] if phase == "prefill" else [])
        anns = {**lb.annotations, "input_ids": lb.moe_annotations["input_ids"],
                "x_out": lb.moe_annotations["x_next"], "layer_id": lb.moe_annotations["layer_id"],
                "num_tokens": lb.moe_annotations["num_tokens"]}

        def layer(*args, _lb=lb, _prefill=phase == "prefill"):
            n = len(_lb.names)
            x_out = args[n + 2]
            num_tokens = args[n + 4] if _prefill else pl.tensor.dim(x_out, 0)
            return _lb(args[0], args[1:n + 1], args[n + 1], x_out, args[n + 3], num_tokens)

        name = f"{phase}_layer_{key.split('_')[1]}"
        out[name] = _jit(name, f"{name}: the layer's attention block, then its MoE block; returns ``x_out``.",
                         ["x_hc"] + lb.names + tail, anns, layer)

    emb = lookup_embedding_kernels(cfg).lookup_embedding
    head = lm_head_kernels(cfg).final_logits
    e_sig, e_anns = emb.signature()
    h_sig, h_anns = head.signature()
    head_names = ["hc_fn", "hc_scale", "hc_base", "norm_w", "head_w"]  # final_logits' (weight -> head_w)

    def layer_args(i: int, phase: str) -> list[str]:
        return [f"l{i}_{n}" for n in bodies[f"{phase}_{_FAMILY[cfg.compress_ratios[i]]}"].names]

    for phase in ("prefill", "decode"):
        per_layer = [bodies[f"{phase}_{_FAMILY[r]}"] for r in cfg.compress_ratios]
        names = ["input_ids", "embed"]
        anns = {"input_ids": e_anns["input_ids"], "embed": e_anns["embed"]}
        for i, lb in enumerate(per_layer):
            names += layer_args(i, phase)
            anns.update({f"l{i}_{n}": lb.annotations[n] for n in lb.names})
        names += head_names + ["logits"] + (["num_tokens"] if phase == "prefill" else [])
        anns.update({"hc_fn": h_anns["hc_fn"], "hc_scale": h_anns["hc_scale"], "hc_base": h_anns["hc_base"],
                     "norm_w": h_anns["norm_w"], "head_w": h_anns["weight"], "logits": h_anns["logits"],
                     "num_tokens": per_layer[0].moe_annotations["num_tokens"]})

        def fwd(*args, _layers=per_layer, _prefill=phase == "prefill"):
            return _forward(cfg, _layers, emb, head, args, _prefill)

        name = f"{phase}_fwd"
        out[name] = _jit(name, f"{name}: embedding, every layer of the schedule, the head; returns ``logits``.",
                         names, anns, fwd)
    return SimpleNamespace(**out, layer_args=layer_args)
# ---- end kernel ----


@dataclass
class KernelState:
    """One request on the kernel path: its cache id and the tokens it has seen."""

    rid: int
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
    """DeepSeek-V4 over the DSL kernels on the paged :class:`Cache` (module docstring).

    Each prefill chunk and each decode step is one ``@pl.jit`` program (``prefill_fwd`` /
    ``decode_fwd`` of :func:`layer_kernels`: embedding, every layer, head), or with
    ``per_layer=True`` one program per layer plus the embedding and head programs (the same
    results bit for bit; per-layer statistics).

    Args:
        checkpoint: an opened checkpoint; its ``weight_format`` (``"int8"`` or ``"bf16"``)
            picks the kernels' path.
        deployment: pools and context (default: :class:`GoldenModel`'s).
        check: run every kernel program in check mode (sanitizer and race checker).
        per_layer: run one program per layer instead of one per step.
        block_templates: run the programs with block templates (``pto.runtime.blocks``: an
            SPMD task of many blocks runs its blocks from a recording of the first, batched
            where the operations allow; the same results, graph and statistics). None (the
            default): on, unless ``PTO_BLOCK_TEMPLATES`` is set in the environment, which then
            decides as it does for every program. The model's kernels keep their state in GM,
            as the templates require (docs/performance.md, block templates).

    Raises:
        ConfigError: a config the kernels cannot tile.
        TypeError: ``block_templates`` is not None, True or False.
    """

    block_templates: bool | None = None  # a subclass that skips __init__ keeps the global setting

    def __init__(self, checkpoint: Checkpoint, deployment: DeploymentConfig | None = None,
                 check: bool = False, per_layer: bool = False, block_templates: bool | None = None):
        if block_templates is not None and not isinstance(block_templates, bool):
            raise TypeError(f"KernelModel(block_templates): expected None, True or False, got {block_templates!r}")
        if block_templates is None and "PTO_BLOCK_TEMPLATES" not in os.environ:
            block_templates = True
        self.block_templates = block_templates
        self.golden = GoldenModel(checkpoint, deployment)  # id / context checks
        self.ckpt = checkpoint
        self.weight_format = fmt = checkpoint.weight_format
        self.cfg, self.deployment = self.golden.cfg, self.golden.deployment
        self.kcfg = kernel_config(self.cfg, self.deployment, fmt)
        self.cache = Cache(self.cfg, self.deployment,
                           mtp_layers=self.cfg.num_nextn_predict_layers if checkpoint.has_mtp else 0,
                           idx_dtype=torch_weight_dtype(fmt))
        self.run_config = RunConfig(heap_bytes=_HEAP_BYTES, check=check)
        self.per_layer = per_layer
        bf16 = torch.bfloat16
        self._rope = {p: tuple(t.to(bf16) for t in rope_tables(self.kcfg, p))
                      for p in ("main", "compress")}
        self._attn_w: dict[int, dict] = {}
        self._ffn_w: dict[int, dict] = {}
        self.stats = KernelStats()
        self.programs = layer_kernels(self.kcfg)
        self._embed = lookup_embedding_kernels(self.kcfg).lookup_embedding_test
        self._final_logits = lm_head_kernels(self.kcfg).final_logits_test
        glob = checkpoint.globals()
        self._embed_w = glob["embed.weight"].to(bf16)
        self._head_w = [glob["hc_head_fn"], glob["hc_head_scale"], glob["hc_head_base"],
                        glob["norm.weight"].to(bf16), glob["head.weight"].to(bf16)]

    @property
    def max_chunk(self) -> int:
        """The most tokens one prefill chunk may carry: the kernels' token capacity (128)."""
        return token_capacity(self.kcfg)

    def coverage(self) -> list[dict[str, str]]:
        """Per layer: ``{"type", "attn prefill", "attn decode", "ffn"}`` -> the kernel it runs."""
        return [{"type": self.cfg.layer_types[i], "attn prefill": f"prefill_attention_{_FAMILY[r]}",
                 "attn decode": f"decode_attention_{_FAMILY[r]}", "ffn": "moe"}
                for i, r in enumerate(self.cfg.compress_ratios)]

    # ---- weights ----------------------------------------------------------------------------
    def attn_weights(self, i: int) -> dict[str, torch.Tensor]:
        """Layer ``i``'s attention inputs in the kernels' layout (:func:`weights.attention_inputs`),
        converted on first use and kept."""
        if i not in self._attn_w:
            self._attn_w[i] = attention_inputs(self.ckpt, i, self.weight_format)
        return self._attn_w[i]

    def ffn_weights(self, i: int) -> dict[str, torch.Tensor]:
        """Layer ``i``'s MoE inputs (:func:`weights.moe_inputs`), converted on first use: INT8
        experts with scales, or for ``"bf16"`` BF16 experts with unit scales and a BF16
        ``norm_w`` (the bf16 kernels read no scale)."""
        if i not in self._ffn_w:
            w = moe_inputs(self.ckpt, i, self.weight_format)
            if self.weight_format == "bf16":
                for k in ("w1", "w3", "w2", "sh_w1", "sh_w3", "sh_w2"):
                    w[k] = w[k].to(torch.bfloat16)
                    w[k + "_scale"] = torch.ones(w[k].shape[:-1])
                w["norm_w"] = w["norm_w"].to(torch.bfloat16)
            self._ffn_w[i] = w
        return self._ffn_w[i]

    # ---- requests ---------------------------------------------------------------------------
    def new_state(self) -> KernelState:
        """A new request (cache pages for its compressor-state rings are taken now).

        Raises:
            CapacityError: the cache holds ``max_requests`` requests already.
        """
        return KernelState(self.cache.add_request())

    def release_state(self, state: KernelState) -> None:
        """Return the request's cache pages."""
        if state.rid in self.cache.requests:
            self.cache.release(state.rid)

    def _run(self, name: str, entry, *args, cached: bool = True) -> None:
        """Run program ``entry`` on ``args`` and count it under ``name``. ``cached=False`` (a
        decode step): a plain run that skips the program cache's key and lookup
        (``replay.program_cache_bypass``) while the cache keys on exact values (no parametric
        replay): a decode step's positions and tables change every step, so its exact key never
        hits (docs/performance.md, parametric recordings) and only costs its hashing (about 1.3 ms
        per tiny decode step). The same program, results and statistics as a plain ``entry.run``."""
        # the GC stays paused until the program is counted and dropped: its graph is then freed by
        # refcount, where a collection at the first allocation after the run would scan it live
        with gc_paused(), _templates(self.block_templates):
            t0 = time.perf_counter()
            if cached or parametric_replay_enabled():
                prog = entry.run(*args, config=self.run_config)
            else:
                with program_cache_bypass():
                    prog = entry.run(*args, config=self.run_config)
            self.stats.add(name, prog, time.perf_counter() - t0)
            del prog

    def layer_args(self, i: int, rids: list[int], pos, prefill: bool, memo: dict | None = None) -> list:
        """Layer ``i``'s program arguments after ``x_hc`` (the attention block's, then the
        MoE block's without ``input_ids``): prefill = one request, ``[n]`` tables; decode =
        ``B = len(rids)`` requests of ``S = len(pos) / B`` tokens, ``[B, n]`` tables. A token
        at position ``-1`` is inactive (all its slots ``-1``: it writes nothing). Layer
        ``num_hidden_layers`` is the MTP layer (sliding-window, its own ``kv``).

        ``memo``: a dict shared by the layers of one step (the cache unchanged in between):
        each block table, slot mapping and the INT32 positions are built once per step, later
        uses get a copy (every argument keeps its own storage, as the program cache's key and
        in-place replay see it)."""
        w, c, ratio = self.attn_weights(i), self.cache, self.ckpt.layer_ratio(i)
        S = pos.numel() // len(rids)
        cos, sin = self._rope[profile_for_ratio(ratio)]
        memo = {} if memo is None else memo

        def table(kind):
            t = memo.get(("table", kind))
            if t is None:
                t = [c.block_table(r, kind) for r in rids]
                memo["table", kind] = t = t[0] if prefill else torch.stack(t)
                return t
            return t.clone()

        def slots(kind):
            t = memo.get(("slots", kind))
            if t is None:
                memo["slots", kind] = t = torch.cat([c.slot_mapping(r, pos[b * S:(b + 1) * S], kind)
                                                     for b, r in enumerate(rids)])
                return t
            return t.clone()

        pos32 = memo.get("pos")
        if pos32 is None:
            memo["pos"] = pos32 = pos.to(torch.int32)
        else:
            pos32 = pos32.clone()

        head = [w["hc_attn_fn"], w["hc_attn_scale"], w["hc_attn_base"], w["attn_norm_w"], w["wq_a"],
                w["wq_b"], w["wq_b_scale"], w["wkv"], w["gamma_cq"], w["gamma_ckv"], cos, sin]
        tail = [pos32, w["attn_sink"], w["wo_a"], w["wo_b"], w["wo_b_scale"]]
        L = c.layers[i]
        if ratio == 0:
            attn = head + [L["kv"], table("swa_kv"), slots("swa_kv")] + tail
        elif ratio == 4:  # CSA_ARGS order; the indexer keys share the compressed entries' table
            attn = head + [L["kv"], table("swa_kv"), slots("swa_kv")] + tail + [
                w["cmp_wkv"], w["cmp_wgate"], w["cmp_ape"], w["cmp_norm_w"], L["state"], table("csa_state"),
                L["cmp_kv"], table("csa_cmp"), slots("csa_cmp"), slots("csa_state"),
                w["idx_wkv"], w["idx_wgate"], w["idx_ape"], w["idx_norm_w"], L["idx_state"], table("csa_state"),
                slots("csa_state"), w["hadamard"], L["idx_kv"], L["idx_kv_scale"], table("csa_cmp"),
                slots("csa_cmp"), w["idx_wq_b"], w["idx_wq_b_scale"], w["idx_weights_proj"]]
        else:
            attn = head + [w["cmp_wkv"], w["cmp_wgate"], w["cmp_ape"], w["cmp_norm_w"], L["state"],
                           table("hca_state"), L["kv"], table("swa_kv"), slots("swa_kv"), L["cmp_kv"],
                           table("hca_cmp"), slots("hca_cmp"), slots("hca_state")] + tail
        f = self.ffn_weights(i)
        return attn + [f[k] for k in MOE_INPUTS[1:] if k != "input_ids"]

    # ---- forward ----------------------------------------------------------------------------
    def _step(self, ids: torch.Tensor, rids: list[int], pos: torch.Tensor, prefill: bool) -> torch.Tensor:
        """Logits ``[T, V]`` of one prefill chunk (one request) or decode step (``T`` requests)."""
        phase, T = ("prefill" if prefill else "decode"), ids.numel()
        ids = ids.to(torch.int64)
        n_tok = [T] if prefill else []
        logits = torch.empty(T, self.cfg.vocab_size)
        if not self.per_layer:
            memo: dict = {}
            args = [a for i in range(self.cfg.num_hidden_layers) for a in self.layer_args(i, rids, pos, prefill, memo)]
            self._run(f"{phase}_fwd", getattr(self.programs, f"{phase}_fwd"), ids, self._embed_w, *args,
                      *self._head_w, logits, *n_tok, cached=prefill)
            return logits
        return self.step_hidden(ids, rids, pos, prefill)[0]

    def step_hidden(self, ids: torch.Tensor, rids: list[int], pos: torch.Tensor, prefill: bool,
                    num_tokens: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One step through the per-layer programs: ``(logits [T, V], X [T, hc_mult, D])`` FP32,
        ``X`` the last layer's streams before ``hc_head`` (the MTP layer's input). Decode
        steps may carry ``S > 1`` tokens per request (``pos`` ``-1`` = inactive); prefill runs
        ``num_tokens`` (default all) active rows. Caches are written, nothing is committed."""
        phase, T = ("prefill" if prefill else "decode"), ids.numel()
        ids = ids.to(torch.int64)
        n_tok = [T if num_tokens is None else num_tokens] if prefill else []
        logits = torch.empty(T, self.cfg.vocab_size)
        X = torch.empty(T, self.cfg.hc_mult, self.cfg.hidden_size)
        self._run("lookup_embedding", self._embed, ids, self._embed_w, X, cached=prefill)
        memo: dict = {}
        for i, ratio in enumerate(self.cfg.compress_ratios):
            x_out = torch.empty_like(X)
            name = f"{phase}_layer_{_FAMILY[ratio]}"
            self._run(name, getattr(self.programs, name), X, *self.layer_args(i, rids, pos, prefill, memo), ids, x_out,
                      i, *n_tok, cached=prefill)
            X = x_out
        self._run("final_logits", self._final_logits, X, *self._head_w, logits, cached=prefill)
        return logits, X

    def forward(self, ids, state: KernelState) -> torch.Tensor:
        """Prefill chunk: logits ``[S, V]`` FP32 of ``ids`` at positions ``state.pos ..``.

        Raises:
            BindError / CapacityError: bad ids, the context or a cache pool exhausted (before
                any kernel runs). CapacityError: more than the kernels' token capacity (128)
                in one chunk.
        """
        ids = self.golden.check_ids(ids, state)
        S = ids.numel()
        self.cache.reserve(state.rid, S)
        logits = self._step(ids, [state.rid], torch.arange(state.pos, state.pos + S), True)
        self.cache.commit(state.rid, S)
        state.pos += S
        return logits

    __call__ = forward

    def decode(self, tokens: list[int], states: list[KernelState]) -> torch.Tensor:
        """One decode step of ``B`` requests, one token each; logits ``[B, V]`` FP32.

        Raises:
            BindError / CapacityError: as :meth:`forward`.
        """
        ids = self.golden.check_ids(tokens)
        for t, st in zip(tokens, states):
            self.golden.check_ids([t], st)
        for st in states:
            self.cache.reserve(st.rid, 1)
        logits = self._step(ids, [st.rid for st in states], torch.tensor([st.pos for st in states]), False)
        for st in states:
            self.cache.commit(st.rid, 1)
            st.pos += 1
        return logits
