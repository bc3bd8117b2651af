"""The whole DeepSeek-V4 step in graph-only mode: the decode step of a deployment and a prefill
chunk at FLASH size on one CPU, with task, edge and heap figures per stage (docs/graph_only.md).

:func:`decode_step_graph` and :func:`prefill_graph` build the forward program of
:func:`pto.models.deepseek_v4.layer.layer_kernels` (embedding -> every layer's attention block
and MoE block -> hc_head / final norm / lm_head) under ``RunConfig(execute=False)``:

* weights, activations and caches are shape-only (torch ``meta``): nothing of FLASH's weights
  or caches is allocated; the weights have the kernels' layout and dtypes
  (:func:`attention_weight_shapes`, the moe kernel's annotations);
* the cache metadata is real: ``B`` requests of ``context`` tokens each on a
  :class:`~pto.models.deepseek_v4.cache.Cache` of the deployment (its pages, block tables and
  slot mappings), positions, token ids;
* routing is **balanced** (the reference's balanced-routing option, ``moe.py
  --balanced-routing``): the token ids are ``0 .. T-1``, the hash table sends route ``(t, k)``
  of token id ``t`` to expert ``(t * K + k) mod E`` and the learned layers' routes (the ``indices`` allocation of
  ``moe.py``, an allocation assumption) are ``(row * K + k) mod E``: the step's ``T * K``
  routes spread evenly over the experts, a token's ``K`` experts distinct;
* the CSA indexer's top-k over shape-only scores takes the first ``index_topk`` visible
  entries (the sort ties assumption of :mod:`pto.language.graph_only`): the same number of
  selected entries as a real run, consecutive ones.

The program is the one :class:`~pto.models.deepseek_v4.layer.KernelModel` runs, with stage
marks: one ``@pl.jit`` with ``layer_kernels``' composition (tests hold its graph equal to
``layer_kernels(cfg).decode_fwd``'s). ``ep > 1`` is not built here (the expert-parallel
programs are ``ep_model``'s).
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from pto.errors import ConfigError
from pto.language import _ctx
from pto.models.deepseek_v4.cache import Cache
from pto.models.deepseek_v4.config import DeepSeekV4Config, DeploymentConfig, get_config, get_deployment, kernel_config
from pto.models.deepseek_v4.layer import _FAMILY, KernelModel, _bodies, _forward, _jit, layer_kernels
from pto.models.deepseek_v4.lm_head import lm_head_kernels
from pto.models.deepseek_v4.lookup_embedding import lookup_embedding_kernels
from pto.models.deepseek_v4.moe import MOE_INPUTS, moe_kernels
from pto.models.deepseek_v4.rope import profile_for_ratio, rope_tables
from pto.runtime import RunConfig
from pto.runtime.graph_only import register_assumption

__all__ = ["StageStats", "StepGraph", "decode_step_graph", "prefill_graph", "moe_graph", "balanced_routes",
           "attention_weight_shapes", "REFERENCE_DECODE_TASKS"]

# The reference device graph of one FLASH decode step (pypto-lib v4-flash decode_fwd on simpler's
# host_build_graph, hw-native-sys/simpler#1860 / #1926): 15,971 device tasks on one rank at EP2 / TP2.
REFERENCE_DECODE_TASKS = 15971
_GRAPH_HEAP = 1 << 40  # graph-only heaps have no backing memory: plan any size


# ---- the balanced-routing assumption --------------------------------------------------------
def balanced_routes(T: int, K: int, E: int, dtype=torch.int32) -> torch.Tensor:
    """``[T, K]`` expert ids ``(t * K + k) mod E``: ``T * K`` routes spread evenly over ``E``
    experts (every expert gets ``floor`` or ``ceil`` of ``T * K / E``), a row's ``K`` experts
    distinct when ``K <= E`` (the reference's balanced routing, pypto-lib ``moe.py``)."""
    return ((torch.arange(T)[:, None] * K + torch.arange(K)[None, :]) % E).to(dtype)


def _routes_fill(shape, dtype, prog) -> torch.Tensor:
    """Fill of the ``indices [T, K]`` allocation of ``moe.py`` (:func:`balanced_routes`); ``E`` is
    the row count of the program's router weight (a parameter named ``gate_w`` or ``*_gate_w``).

    Raises:
        ConfigError: the program has no such parameter.
    """
    for p, _caller, g in prog.args:
        if p.name == "gate_w" or p.name.endswith("_gate_w"):
            return balanced_routes(shape[0], shape[1], g.shape[0], dtype)
    raise ConfigError(f"kernel {prog.name}: the graph-only balanced-routing assumption needs the router weight "
                      f"(a parameter named gate_w) to know the expert count")


register_assumption("indices", "moe.py", _routes_fill,
                    "MoE routes are balanced: route (t, k) goes to expert (t*K + k) mod E (the reference's "
                    "balanced-routing option)")


# ---- statistics -----------------------------------------------------------------------------
@dataclass
class StageStats:
    """One stage of a step: ``tasks`` (without join nodes), ``blocks``, ``edges`` (into its tasks
    and join nodes, from any earlier task), ``heap_peak_bytes`` (live heap bytes at the stage's
    highest point, the tensors of earlier stages still live included) and ``kernels``: tasks per
    kernel module (the file of the task's source line)."""

    name: str
    tasks: int = 0
    blocks: int = 0
    edges: int = 0
    heap_peak_bytes: int = 0
    kernels: dict = field(default_factory=dict)

    @property
    def edges_per_task(self) -> float:
        """Edges per task (0 without tasks)."""
        return self.edges / self.tasks if self.tasks else 0.0

    def count_kernel(self, task) -> None:
        """Count ``task`` under its kernel module (the file name of its source line, no ``.py``)."""
        mod = task.site.rsplit(":", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")
        self.kernels[mod] = self.kernels.get(mod, 0) + 1


@dataclass
class StepGraph:
    """A graph-only build of one forward step.

    Attributes:
        phase: ``"decode"``, ``"prefill"`` or ``"moe"`` (one MoE block); ``cfg`` the kernel config; ``tokens`` the step's
            token rows (``B * S`` for decode); ``requests``, ``context`` (tokens each request
            held before the step).
        program: the :class:`pto.Program` (its ``graph`` and ``stats``; simulate it with
            ``pto.runtime.simulate``).
        stages: :class:`StageStats` in step order: ``embedding``, per layer ``L{i} attention
            (swa|csa|hca)`` and ``L{i} moe``, then ``hc_head`` and ``lm_head`` (``final norm``
            included in lm_head).
        wall_s: build wall time (inputs and program), seconds.
    """

    phase: str
    cfg: DeepSeekV4Config
    tokens: int
    requests: int
    context: int
    program: object
    stages: list
    wall_s: float

    @property
    def stats(self):
        """The program's :class:`pto.runtime.ProgramStats`."""
        return self.program.stats

    def by_kind(self) -> list[StageStats]:
        """Stages summed by kind: embedding, ``attention swa|csa|hca`` (per layer: tasks / layers
        of that kind in ``kernels['layers']``), ``moe``, hc_head, lm_head; heap peak the max."""
        out: dict[str, StageStats] = {}
        for s in self.stages:
            kind = s.name.split(" ", 1)[1] if s.name.startswith("L") else s.name
            k = out.setdefault(kind, StageStats(kind, kernels={"layers": 0}))
            k.tasks += s.tasks
            k.blocks += s.blocks
            k.edges += s.edges
            k.heap_peak_bytes = max(k.heap_peak_bytes, s.heap_peak_bytes)
            k.kernels["layers"] += 1
        return list(out.values())

    def summary(self) -> list[str]:
        """Lines of the per-kind table and the total (what ``pto graph --model`` prints)."""
        st = self.stats
        req = f"{self.requests} request{'s' if self.requests != 1 else ''}"
        what = (f"{self.cfg.name} MoE block, graph-only: {self.tokens} tokens, {self.cfg.n_routed_experts} experts"
                if self.phase == "moe" else
                f"{self.cfg.name} {self.phase} step, graph-only: {self.tokens} tokens ({req}, "
                f"context {self.context}), {self.cfg.num_hidden_layers} layers")
        lines = [f"{what}, built in {self.wall_s:.1f} s",
                 f"{'stage':<18} {'count':>5} {'tasks':>7} {'per':>6} {'edges':>7} {'e/task':>6} {'blocks':>8} "
                 f"{'heap peak':>10}"]
        for k in self.by_kind():
            n = k.kernels["layers"]
            lines.append(f"{k.name:<18} {n:>5} {k.tasks:>7} {k.tasks / n:>6.0f} {k.edges:>7} {k.edges_per_task:>6.2f} "
                         f"{k.blocks:>8} {k.heap_peak_bytes / 2**20:>8.1f} MiB")
        lines.append(f"{'total':<18} {'':>5} {st.tasks:>7} {'':>6} {st.edges:>7} "
                     f"{st.edges / max(st.tasks, 1):>6.2f} {st.blocks:>8} {st.heap_peak_bytes / 2**20:>8.1f} MiB")
        if self.phase == "decode" and self.cfg.name == "flash":
            lines.append(f"reference device graph of one decode step: {REFERENCE_DECODE_TASKS} tasks on one rank at "
                         f"EP2/TP2; here {st.tasks} tasks on one rank holding all {self.cfg.n_routed_experts} experts "
                         f"(docs/graph_only.md)")
        lines.append(f"assumptions: {st.assumed_reads} reads of assumed routes, {st.assumed_footprints} footprints "
                     f"that follow from them, {st.assumed_sorts} top-k sorts of shape-only scores")
        return lines


# ---- inputs ---------------------------------------------------------------------------------
def attention_weight_shapes(cfg: DeepSeekV4Config, ratio: int) -> dict:
    """Name -> ``(shape, torch dtype)`` of a layer's attention inputs in the kernels' layout, as
    :func:`weights.attention_inputs` produces them for a layer of compress ratio ``ratio``
    (tests hold the two equal): BF16 ``wq_a [D, Lq]`` / ``wkv [D, d]``, INT8 ``wq_b [Lq, H*d]``
    and ``wo_b [D, G*Lo]`` with FP32 scales, ``wo_a [G, Lo, H*d/G]``; compressor (ratio 4: two
    series) and CSA indexer weights."""
    D, H, d, Lq = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim, cfg.q_lora_rank
    G, Lo, N, HI, dI = cfg.o_groups, cfg.o_lora_rank, cfg.hc_mult, cfg.index_n_heads, cfg.index_head_dim
    f32, bf16, i8 = torch.float32, torch.bfloat16, torch.int8
    out = {"hc_attn_fn": ((N * (N + 2), N * D), f32), "hc_attn_scale": ((3,), f32),
           "hc_attn_base": ((N * (N + 2),), f32), "attn_norm_w": ((D,), bf16), "wq_a": ((D, Lq), bf16),
           "wq_b": ((Lq, H * d), i8), "wq_b_scale": ((H * d,), f32), "wkv": ((D, d), bf16),
           "gamma_cq": ((Lq,), bf16), "gamma_ckv": ((d,), bf16), "attn_sink": ((H,), f32),
           "wo_a": ((G, Lo, H * d // G), bf16), "wo_b": ((D, G * Lo), i8), "wo_b_scale": ((D,), f32)}
    if ratio:
        c = 2 if ratio == 4 else 1
        out.update(cmp_wkv=((c * d, D), bf16), cmp_wgate=((c * d, D), bf16), cmp_ape=((ratio, c * d), f32),
                   cmp_norm_w=((d,), bf16))
    if ratio == 4:
        out.update(idx_wkv=((2 * dI, D), bf16), idx_wgate=((2 * dI, D), bf16), idx_ape=((4, 2 * dI), f32),
                   idx_norm_w=((dI,), bf16), hadamard=((dI, dI), bf16), idx_wq_b=((Lq, HI * dI), i8),
                   idx_wq_b_scale=((HI * dI,), f32), idx_weights_proj=((D, HI), bf16))
    return out


@functools.lru_cache(maxsize=8)
def _attn_weights(cfg: DeepSeekV4Config, ratio: int) -> dict:
    """Shape-only attention inputs of a layer of compress ratio ``ratio`` (shared by every such layer)."""
    return {k: _meta(shape, dt) for k, (shape, dt) in attention_weight_shapes(cfg, ratio).items()}


@functools.lru_cache(maxsize=8)
def _moe_weights(cfg: DeepSeekV4Config) -> dict:
    """Shape-only MoE inputs (the moe kernel's annotations) and a real balanced ``tid2eid``."""
    _sig, anns = moe_kernels(cfg).moe.signature()
    out = {}
    for k in MOE_INPUTS[1:]:
        if k == "input_ids":
            continue
        a = anns[k]
        if k == "tid2eid":
            out[k] = balanced_routes(cfg.vocab_size, cfg.num_experts_per_tok, cfg.n_routed_experts)
        else:
            out[k] = torch.empty(list(a.dims), dtype=a.dtype.torch, device="meta")
    return out


class _MemoCache:
    """The deployment's :class:`Cache` with its block tables and slot mappings computed once per
    request, kind and positions (every layer asks for the same ones)."""

    def __init__(self, cache: Cache):
        self._cache, self._memo = cache, {}
        self.layers = cache.layers

    def block_table(self, rid: int, kind: str = "swa_kv") -> torch.Tensor:
        key = ("t", rid, kind)
        if key not in self._memo:
            self._memo[key] = self._cache.block_table(rid, kind)
        return self._memo[key]

    def slot_mapping(self, rid: int, positions: torch.Tensor, kind: str = "swa_kv") -> torch.Tensor:
        key = ("s", rid, kind, tuple(positions.tolist()))
        if key not in self._memo:
            self._memo[key] = self._cache.slot_mapping(rid, positions, kind)
        return self._memo[key]


class _Inputs:
    """The duck-typed model :meth:`KernelModel.layer_args` reads (weights shape-only)."""

    def __init__(self, cfg, cache: Cache):
        self.cfg, self.cache = cfg, _MemoCache(cache)
        self.ckpt = SimpleNamespace(layer_ratio=lambda i: cfg.compress_ratios[i])
        self._rope = {p: tuple(torch.empty(t.shape, dtype=torch.bfloat16, device="meta")
                               for t in rope_tables(cfg, p)) for p in ("main", "compress")}

    def attn_weights(self, i: int) -> dict:
        return _attn_weights(self.cfg, self.cfg.compress_ratios[i])

    def ffn_weights(self, i: int) -> dict:
        return _moe_weights(self.cfg)


def _meta(shape, dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


# ---- the program with stage marks -----------------------------------------------------------
class _Marks(threading.local):
    """Stage boundaries of the program running in this thread: ``marks`` ``(name, first task
    id)`` and each stage's heap peak; the heap's running peak is reset at each mark so that
    every stage gets its own (and restored to the program's at the last one)."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.marks: list = []
        self.peaks: list = []
        self.global_peak = 0

    def mark(self, name: str | None) -> None:
        prog = _ctx.state.program
        heap = prog.heap
        if self.marks:
            self.peaks.append(heap.peak)
        self.global_peak = max(self.global_peak, heap.peak)
        heap.peak = heap.in_use
        if name is None:
            heap.peak = self.global_peak
        else:
            self.marks.append((name, len(prog.graph.tasks)))


@functools.lru_cache(maxsize=None)
def _staged_program(cfg, phase: str):
    """``layer_kernels(cfg)``'s ``<phase>_fwd`` composition as a new ``@pl.jit`` with stage marks;
    returns ``(program, marks holder)``."""
    ref = getattr(layer_kernels(cfg), f"{phase}_fwd")
    names = list(inspect.signature(ref.fn).parameters)
    anns = dict(ref.fn.__annotations__)
    bodies = _bodies(cfg)
    per_layer = [bodies[f"{phase}_{_FAMILY[r]}"] for r in cfg.compress_ratios]
    emb = lookup_embedding_kernels(cfg).lookup_embedding
    head = lm_head_kernels(cfg).final_logits
    marks = _Marks()

    def fwd(*args):
        marks.reset()
        return _forward(cfg, per_layer, emb, head, args, phase == "prefill", mark=marks.mark)

    jf = _jit(f"{phase}_fwd", f"{phase}_fwd with graph-only stage marks (pto.models.deepseek_v4.graph_only)",
              names, anns, fwd)
    return jf, marks


def _stages(prog, marks: _Marks) -> list[StageStats]:
    """Per-stage statistics from the marks (the head split into hc_head and lm_head by kernel file)."""
    tasks = prog.graph.tasks
    bounds = [m[1] for m in marks.marks] + [len(tasks)]
    out = []
    for (name, lo), hi, peak in zip(marks.marks, bounds[1:], marks.peaks):
        parts = [(name, list(range(lo, hi)))]
        if name == "head":
            hc = [j for j in range(lo, hi) if tasks[j].site.rsplit(":", 1)[0].endswith("hc_head.py")]
            rest = [j for j in range(lo, hi) if j not in set(hc)]
            parts = [("hc_head", hc), ("lm_head", rest)]
        for pname, ids in parts:
            s = StageStats(pname, heap_peak_bytes=peak)
            for j in ids:
                t = tasks[j]
                s.edges += len(t.preds)
                if t.kind == "dummy":
                    continue
                s.tasks += 1
                s.blocks += len(t.blocks)
                s.count_kernel(t)
            out.append(s)
    return out


def _step(phase: str, cfg, dep: DeploymentConfig, B: int, S: int, context: int, staged: bool) -> StepGraph:
    t0 = time.perf_counter()
    kcfg = kernel_config(cfg, dep)
    if context + S > dep.max_context:
        raise ConfigError(f"graph-only {phase}: context {context} + {S} tokens exceeds the deployment's "
                          f"max_context={dep.max_context}")
    with torch.device("meta"):  # the cache's tensors shape-only; its page tables are plain Python
        cache = Cache(kcfg, dep)
    rids = [cache.add_request() for _ in range(B)]
    for r in rids:
        done = 0
        while done < context:  # the context as chunked prefill wrote it (SWA pages behind the window freed)
            n = min(dep.prefill_seq, context - done)
            cache.reserve(r, n)
            cache.commit(r, n)
            done += n
        cache.reserve(r, S)
    pos = torch.cat([torch.arange(context, context + S) for _ in rids])
    inputs = _Inputs(kcfg, cache)
    prefill = phase == "prefill"
    largs = [a for i in range(kcfg.num_hidden_layers)
             for a in KernelModel.layer_args(inputs, i, rids, pos, prefill)]
    T = B * S
    ids = (torch.arange(T) % kcfg.vocab_size).to(torch.int64)  # ids 0..T-1: the hash layers' routes balanced too
    V, D, N = kcfg.vocab_size, kcfg.hidden_size, kcfg.hc_mult
    head_w = [_meta((N, N * D), torch.float32), _meta((1,), torch.float32), _meta((N,), torch.float32),
              _meta((D,), torch.bfloat16), _meta((V, D), torch.bfloat16)]
    args = [ids, _meta((V, D), torch.bfloat16), *largs, *head_w, _meta((T, V), torch.float32)]
    if prefill:
        args.append(T)
    rc = RunConfig(execute=False, heap_bytes=_GRAPH_HEAP)
    if staged:
        jf, marks = _staged_program(kcfg, phase)
        prog = jf.run(*args, config=rc)
        stages = _stages(prog, marks)
    else:
        prog = getattr(layer_kernels(kcfg), f"{phase}_fwd").run(*args, config=rc)
        stages = []
    return StepGraph(phase, kcfg, T, B, context, prog, stages, time.perf_counter() - t0)


def _resolve(cfg, dep):
    cfg = get_config(cfg) if isinstance(cfg, str) else cfg
    if dep is None:
        dep = get_deployment(cfg.name)
    elif isinstance(dep, str):
        dep = get_deployment(dep)
    return cfg, dep


def decode_step_graph(cfg="flash", dep=None, ep: int = 1, *, context: int | None = None, batch: int | None = None,
                      seq: int | None = None, staged: bool = True) -> StepGraph:
    """Graph-only build of one decode step of all layers (module docstring).

    Args:
        cfg: model config or preset name (``"flash"``, ``"tiny"`` ...).
        dep: deployment config or preset name (default: the preset of ``cfg``'s name).
        ep: expert-parallel ranks; only 1 (one rank holding every expert) is built here.
        context: tokens every request held before the step (its positions follow); default
            ``min(4096, max_context // 2)`` (FLASH: 4096, past the CSA indexer's 512 top-k).
        batch, seq: requests and tokens per request of the step (default the deployment's
            ``decode_batch`` x ``decode_seq``: FLASH 4 x 2 = 8 token rows).
        staged: record per-stage figures (False: run ``layer_kernels(cfg).decode_fwd`` itself).

    Returns:
        :class:`StepGraph`.

    Raises:
        ConfigError: ``ep != 1``, a context the deployment cannot hold, an unknown preset.
        CapacityError: the deployment's page pools cannot hold ``batch`` requests of that context.
    """
    if ep != 1:
        raise ConfigError(f"decode_step_graph: ep={ep}: only the single-rank step (ep=1) is built here; the "
                          f"expert-parallel rank programs are pto.models.deepseek_v4.ep_model's")
    cfg, dep = _resolve(cfg, dep)
    context = min(4096, dep.max_context // 2) if context is None else context
    return _step("decode", cfg, dep, batch or dep.decode_batch, seq or dep.decode_seq, context, staged)


def moe_graph(cfg="flash", dep=None, *, tokens: int | None = None, layer_id: int | None = None) -> StepGraph:
    """Graph-only build of one MoE block (``moe_kernels(cfg).moe_test``: hc_pre, gate, shared and
    routed experts, hc_post) over ``tokens`` rows (default the deployment's decode step, FLASH 8)
    of layer ``layer_id`` (default the first learned-routing layer), balanced routing: the FLASH
    MoE with its 256 experts' 6 GiB of INT8 weights shape-only.

    Raises:
        ConfigError: an unknown preset; BindError: a ``layer_id`` outside the layers.
    """
    cfg, dep = _resolve(cfg, dep)
    t0 = time.perf_counter()
    kcfg = kernel_config(cfg, dep)
    T = tokens or dep.decode_tokens
    lid = kcfg.num_hash_layers if layer_id is None else layer_id
    w = _moe_weights(kcfg)
    x = _meta((T, kcfg.hc_mult, kcfg.hidden_size), torch.float32)
    ids = (torch.arange(T) % kcfg.vocab_size).to(torch.int64)
    args = [x] + [ids if k == "input_ids" else w[k] for k in MOE_INPUTS[1:]] + [x, lid, T]
    prog = moe_kernels(kcfg).moe_test.run(*args, config=RunConfig(execute=False, heap_bytes=_GRAPH_HEAP))
    st = prog.stats
    stage = StageStats(f"L{lid} moe", st.tasks, st.blocks, st.edges, st.heap_peak_bytes)
    for t in prog.graph.tasks:
        if t.kind != "dummy":
            stage.count_kernel(t)
    return StepGraph("moe", kcfg, T, 1, 0, prog, [stage], time.perf_counter() - t0)


def prefill_graph(cfg="flash", dep=None, *, tokens: int = 128, context: int = 0, staged: bool = True) -> StepGraph:
    """Graph-only build of one prefill chunk of ``tokens`` tokens of one request (positions
    ``context ..``) through all layers; arguments and errors as :func:`decode_step_graph`."""
    cfg, dep = _resolve(cfg, dep)
    return _step("prefill", cfg, dep, 1, tokens, context, staged)
