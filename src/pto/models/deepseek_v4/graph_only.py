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
``layer_kernels(cfg).decode_fwd``'s). With ``ep > 1``, :func:`decode_step_graph` gives one
rank's step as :class:`~pto.models.deepseek_v4.ep_model.EPModel` runs it (one program per
layer block and the head, ranks as threads).
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
from pto.models.deepseek_v4.ep_model import EPModel
from pto.models.deepseek_v4.layer import (_FAMILY, KernelModel, KernelStats, _bodies, _forward, _jit,
                                          layer_kernels)
from pto.models.deepseek_v4.lm_head import lm_head_kernels
from pto.models.deepseek_v4.lookup_embedding import lookup_embedding_kernels
from pto.models.deepseek_v4.moe import MOE_INPUTS, moe_kernels
from pto.models.deepseek_v4.rope import profile_for_ratio, rope_tables
from pto.runtime import RunConfig
from pto.runtime.graph_only import register_assumption

__all__ = ["StageStats", "StepGraph", "decode_step_graph", "prefill_graph", "moe_graph", "balanced_routes",
           "spread_hash_table", "ep_step_graphs", "attention_weight_shapes", "REFERENCE_DECODE_TASKS"]

# The reference device graph of one FLASH decode step (pypto-lib v4-flash decode_fwd on simpler's
# host_build_graph, hw-native-sys/simpler#1860 / #1926): 15,971 device tasks on one rank at EP2 / TP2.
REFERENCE_DECODE_TASKS = 15971
_GRAPH_HEAP = 1 << 40  # graph-only heaps have no backing memory: plan any size


# ---- the balanced-routing assumption --------------------------------------------------------
def balanced_routes(T: int, K: int, E: int, dtype=torch.int32, *, rank: int = 0, ranks: int = 1) -> torch.Tensor:
    """``[T, K]`` expert ids ``(t * K + k) mod E``: ``T * K`` routes spread evenly over ``E``
    experts (every expert gets ``floor`` or ``ceil`` of ``T * K / E``), a row's ``K`` experts
    distinct when ``K <= E`` (the reference's balanced routing, pypto-lib ``moe.py``).

    With ``ranks > 1`` (expert parallelism, every rank ``T`` rows): the rows of rank ``rank``
    are the run's rows ``rank * T ..``, and route ``j = (rank * T + t) * K + k`` of the run's
    ``R = ranks * T * K`` goes to expert ``j * E // R`` when ``R <= E`` (spread over the whole
    expert range, so every rank's experts receive routes), else ``j mod E``."""
    j = (rank * T + torch.arange(T))[:, None] * K + torch.arange(K)[None, :]
    R = ranks * T * K
    return (j * E // R if ranks > 1 and R <= E else j % E).to(dtype)


def _routes_fill(shape, dtype, prog) -> torch.Tensor:
    """Fill of the ``indices [T, K]`` allocation of ``moe.py`` (:func:`balanced_routes`, over the
    run's rows when the program runs on a rank of a ``pld`` world); ``E`` is the row count of the
    program's router weight (a parameter named ``gate_w`` or ``*_gate_w``).

    Raises:
        ConfigError: the program has no such parameter.
    """
    import pto.language.distributed as pld
    for p, _caller, g in prog.args:
        if p.name == "gate_w" or p.name.endswith("_gate_w"):
            return balanced_routes(shape[0], shape[1], g.shape[0], dtype, rank=pld.rank(), ranks=pld.world_size())
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
        programs, ep, rank: an expert-parallel rank's step (``decode_step_graph(ep=N, rank=r)``,
            ``program`` None): the rank's programs in run order (embedding, per layer attention
            and ``moe_ep``, ``lm_head_ep``), the world size and the rank; ``tokens`` and
            ``requests`` are the rank's.
    """

    phase: str
    cfg: DeepSeekV4Config
    tokens: int
    requests: int
    context: int
    program: object
    stages: list
    wall_s: float
    programs: list = field(default_factory=list)
    ep: int = 1
    rank: int = 0
    ep_stats: object = None

    @property
    def stats(self):
        """The program's :class:`pto.runtime.ProgramStats` (an expert-parallel rank: its programs'
        figures summed, the heap peak the largest; edges only within each program)."""
        return self.program.stats if self.program is not None else self.ep_stats

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
                f"{self.cfg.name} {self.phase} step, graph-only"
                + (f", EP{self.ep} rank {self.rank} ({len(self.programs)} programs)" if self.ep > 1 else "")
                + f": {self.tokens} tokens ({req}, context {self.context}), {self.cfg.num_hidden_layers} layers")
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
            here = (f"{st.tasks} tasks on rank {self.rank} of EP{self.ep}, {self.cfg.n_routed_experts // self.ep} "
                    f"experts each" if self.ep > 1 else
                    f"{st.tasks} tasks on one rank holding all {self.cfg.n_routed_experts} experts")
            lines.append(f"reference device graph of one decode step: {REFERENCE_DECODE_TASKS} tasks on one rank at "
                         f"EP2/TP2; here {here} (docs/graph_only.md)")
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


def spread_hash_table(V: int, K: int, E: int, routes: int, dtype=torch.int32) -> torch.Tensor:
    """``[V, K]`` hash table (``tid2eid``) sending route ``j = t * K + k`` of token id ``t`` to
    expert ``(j * E // routes) mod E``: a run whose ``routes`` routes have the token ids
    ``0 .. routes / K - 1`` spreads them evenly over the whole expert range, so with expert
    parallelism every rank's experts receive some (``benchmarks/bench_ep.py``)."""
    j = torch.arange(V)[:, None] * K + torch.arange(K)[None, :]
    return (j * E // routes % E).to(dtype)


@functools.lru_cache(maxsize=8)
def _moe_weights(cfg: DeepSeekV4Config, ep: int = 1, routes: int = 0) -> dict:
    """Shape-only MoE inputs (the moe kernel's annotations; with ``ep > 1`` the routed experts of
    one rank, ``E / ep`` of them) and a real ``tid2eid``: :func:`balanced_routes`, or with
    ``routes`` :func:`spread_hash_table` over that many routes."""
    from pto.models.deepseek_v4.ep_model import ROUTED_KEYS
    _sig, anns = moe_kernels(cfg).moe.signature()
    V, K, E = cfg.vocab_size, cfg.num_experts_per_tok, cfg.n_routed_experts
    out = {}
    for k in MOE_INPUTS[1:]:
        if k == "input_ids":
            continue
        a = anns[k]
        dims = list(a.dims)
        if k in ROUTED_KEYS:
            dims[0] //= ep
        if k == "tid2eid":
            out[k] = spread_hash_table(V, K, E, routes) if routes else balanced_routes(V, K, E)
        else:
            out[k] = torch.empty(dims, dtype=a.dtype.torch, device="meta")
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

    def __init__(self, cfg, cache: Cache, ep: int = 1, routes: int = 0):
        self.cfg, self.cache = cfg, _MemoCache(cache)
        self._ep, self._routes = ep, routes
        self.ckpt = SimpleNamespace(layer_ratio=lambda i: cfg.compress_ratios[i])
        self._rope = {p: tuple(torch.empty(t.shape, dtype=torch.bfloat16, device="meta")
                               for t in rope_tables(cfg, p)) for p in ("main", "compress")}

    def attn_weights(self, i: int) -> dict:
        return _attn_weights(self.cfg, self.cfg.compress_ratios[i])

    def ffn_weights(self, i: int) -> dict:
        return _moe_weights(self.cfg, self._ep, self._routes)


class _RecordingStats(KernelStats):
    """:class:`KernelStats` that also keeps every program run, ``runs``: ``(name, program)``."""

    def __init__(self):
        super().__init__()
        self.runs: list = []

    def add(self, name: str, prog, wall: float) -> None:
        super().add(name, prog, wall)
        self.runs.append((name, prog))


class _EPRank(_Inputs, EPModel):
    """One rank of :class:`~pto.models.deepseek_v4.ep_model.EPModel` with shape-only weights
    (its ``E / N`` routed experts, its ``V / N`` head rows) and its own requests on its own
    cache; the programs and the step (``EPModel._ep_step``) are EPModel's, run graph-only."""

    def __init__(self, kcfg, cache: Cache, ep: int, rank: int, routes: int):
        _Inputs.__init__(self, kcfg, cache, ep, routes)
        self.kcfg, self.ep, self.rank = kcfg, ep, rank
        V, D, N = kcfg.vocab_size, kcfg.hidden_size, kcfg.hc_mult
        self._embed = lookup_embedding_kernels(kcfg).lookup_embedding_test
        self._embed_w = _meta((V, D), torch.bfloat16)
        self._head_w = [_meta((N, N * D), torch.float32), _meta((1,), torch.float32), _meta((N,), torch.float32),
                        _meta((D,), torch.bfloat16), _meta((V // ep, D), torch.bfloat16)]
        self.stats = _RecordingStats()
        self.run_config = RunConfig(execute=False, heap_bytes=_GRAPH_HEAP)
        self._setup_programs()


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


def _stage_stats(name: str, tasks: list, peak: int) -> list[StageStats]:
    """:class:`StageStats` of the graph tasks ``tasks`` of stage ``name`` (``"head"`` is split
    into hc_head and lm_head by kernel file)."""
    parts = [(name, tasks)]
    if name == "head":
        hc = [t for t in tasks if t.site.rsplit(":", 1)[0].endswith("hc_head.py")]
        parts = [("hc_head", hc), ("lm_head", [t for t in tasks if t not in hc])]
    out = []
    for pname, ts in parts:
        s = StageStats(pname, heap_peak_bytes=peak)
        for t in ts:
            s.edges += len(t.preds)
            if t.kind == "dummy":
                continue
            s.tasks += 1
            s.blocks += len(t.blocks)
            s.count_kernel(t)
        out.append(s)
    return out


def _stages(prog, marks: _Marks) -> list[StageStats]:
    """Per-stage statistics from the marks (the head split into hc_head and lm_head by kernel file)."""
    tasks = prog.graph.tasks
    bounds = [m[1] for m in marks.marks] + [len(tasks)]
    out = []
    for (name, lo), hi, peak in zip(marks.marks, bounds[1:], marks.peaks):
        out += _stage_stats(name, tasks[lo:hi], peak)
    return out


def _sum_stats(progs: list) -> SimpleNamespace:
    """The statistics of several graph-only programs summed (heap peak: the largest)."""
    keys = ("tasks", "dummies", "blocks", "edges", "tile_ops", "bytes", "flops", "scratch_tensors", "scratch_bytes",
            "assumed_reads", "assumed_footprints", "assumed_sorts", "wall_us", "task_wall_us")
    out = SimpleNamespace(**{k: sum(getattr(p.stats, k) for p in progs) for k in keys})
    out.heap_peak_bytes = max(p.stats.heap_peak_bytes for p in progs)
    out.graph_only = True
    return out


def ep_step_graphs(cfg="flash", dep=None, ep: int = 2, *, context: int | None = None, batch: int | None = None,
                   seq: int | None = None) -> list[StepGraph]:
    """Every rank's decode step at expert parallelism ``ep`` in graph-only mode, one
    :class:`StepGraph` per rank (``decode_step_graph(ep=N, rank=r)`` is the ``r``-th): every rank
    decodes its own ``batch x seq`` rows (attention data parallel) through
    :class:`~pto.models.deepseek_v4.ep_model.EPModel`'s programs, ranks as threads of this
    process (``pto.runtime.distributed.run_threads``). Arguments and errors as
    :func:`decode_step_graph`."""
    from pto.models.deepseek_v4.moe_ep import check_ep
    from pto.runtime import distributed as dist
    _check_count("ep_step_graphs", "ep", ep, 1)
    _check_count("ep_step_graphs", "context", context, 0, optional=True)
    _check_count("ep_step_graphs", "batch", batch, 1, optional=True)
    _check_count("ep_step_graphs", "seq", seq, 1, optional=True)
    cfg, dep = _resolve(cfg, dep)
    context = min(4096, dep.max_context // 2) if context is None else context
    B, S = batch or dep.decode_batch, seq or dep.decode_seq
    t0 = time.perf_counter()
    kcfg = kernel_config(cfg, dep)
    check_ep(kcfg, ep)
    T, K, V = B * S, kcfg.num_experts_per_tok, kcfg.vocab_size
    reqs = [_requests("decode", kcfg, dep, B, S, context) for _ in range(ep)]

    def body(r):
        cache, rids, pos = reqs[r]
        m = _EPRank(kcfg, cache, ep, r, ep * T * K)
        m._ep_step((torch.arange(r * T, (r + 1) * T) % V).to(torch.int64), rids, pos, False, [T] * ep)
        return m.stats.runs

    out = []
    for rank, runs in enumerate(dist.run_threads(body, ep, timeout_s=3600)):
        stages, n_attn, n_moe = [], 0, 0
        for name, prog in runs:
            if name == "lookup_embedding":
                stage = "embedding"
            elif name == "moe_ep":
                stage, n_moe = f"L{n_moe} moe", n_moe + 1
            elif name == "lm_head_ep":
                stage = "head"
            else:  # decode_attention_<family>
                stage, n_attn = f"L{n_attn} attention {name.rsplit('_', 1)[1]}", n_attn + 1
            stages += _stage_stats(stage, prog.graph.tasks, prog.stats.heap_peak_bytes)
        progs = [p for _n, p in runs]
        out.append(StepGraph("decode", kcfg, T, B, context, None, stages, time.perf_counter() - t0, programs=progs,
                             ep=ep, rank=rank, ep_stats=_sum_stats(progs)))
    return out


def _requests(phase: str, kcfg, dep: DeploymentConfig, B: int, S: int, context: int):
    """A shape-only :class:`Cache` of the deployment holding ``B`` requests of ``context`` tokens
    with room for ``S`` more each; returns ``(cache, request ids, positions [B * S])``."""
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
    return cache, rids, torch.cat([torch.arange(context, context + S) for _ in rids])


def _step(phase: str, cfg, dep: DeploymentConfig, B: int, S: int, context: int, staged: bool) -> StepGraph:
    t0 = time.perf_counter()
    kcfg = kernel_config(cfg, dep)
    cache, rids, pos = _requests(phase, kcfg, dep, B, S, context)
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


def _check_count(fn: str, name: str, value, lo: int, hi: int | None = None, optional: bool = False) -> None:
    """ConfigError unless ``value`` is an int (not a bool) in ``[lo, hi]`` (``hi`` None: no upper
    bound), or None when ``optional``; the message names ``fn``, the argument and the range."""
    if value is None and optional:
        return
    if isinstance(value, int) and not isinstance(value, bool) and value >= lo and (hi is None or value <= hi):
        return
    rng = f"an int from {lo} to {hi}" if hi is not None else f"an int >= {lo}"
    raise ConfigError(f"{fn}: {name} must be {rng}{' or None' if optional else ''}, got {value!r}")


def _resolve(cfg, dep):
    cfg = get_config(cfg) if isinstance(cfg, str) else cfg
    if dep is None:
        dep = get_deployment(cfg.name)
    elif isinstance(dep, str):
        dep = get_deployment(dep)
    return cfg, dep


def decode_step_graph(cfg="flash", dep=None, ep: int = 1, *, rank: int = 0, context: int | None = None,
                      batch: int | None = None, seq: int | None = None, staged: bool = True) -> StepGraph:
    """Graph-only build of one decode step of all layers (module docstring).

    Args:
        cfg: model config or preset name (``"flash"``, ``"tiny"`` ...).
        dep: deployment config or preset name (default: the preset of ``cfg``'s name).
        ep: expert-parallel ranks. 1: one rank holding every expert, one program. ``N > 1``:
            rank ``rank``'s step as :class:`~pto.models.deepseek_v4.ep_model.EPModel` runs it
            (attention data parallel: every rank decodes its own ``batch x seq`` rows; per layer
            its attention program and ``moe_ep``, then ``lm_head_ep``), the ``N`` ranks as
            threads of this process; the hash table sends the run's ``j``-th route to expert
            ``j * E / routes`` (:func:`spread_hash_table`), the learned routes are balanced over
            the run's rows (:func:`balanced_routes`), so every rank's experts receive routes.
        rank: with ``ep > 1``, the rank whose graph is returned.
        context: tokens every request held before the step (its positions follow); default
            ``min(4096, max_context // 2)`` (FLASH: 4096, past the CSA indexer's 512 top-k).
        batch, seq: requests and tokens per request of the step (default the deployment's
            ``decode_batch`` x ``decode_seq``: FLASH 4 x 2 = 8 token rows).
        staged: record per-stage figures (False: run ``layer_kernels(cfg).decode_fwd`` itself).

    Returns:
        :class:`StepGraph`.

    Raises:
        ConfigError: an ``ep`` the config does not allow (``moe_ep.check_ep``), a ``rank``
            outside it, a context the deployment cannot hold, an unknown preset; an argument
            that is not an int in its range (``ep >= 1``, ``rank`` in ``[0, ep)``, ``context >= 0``,
            ``batch`` / ``seq >= 1``; None for the defaults).
        CapacityError: the deployment's page pools cannot hold ``batch`` requests of that context.
    """
    _check_count("decode_step_graph", "ep", ep, 1)
    _check_count("decode_step_graph", "rank", rank, 0, ep - 1)
    _check_count("decode_step_graph", "context", context, 0, optional=True)
    _check_count("decode_step_graph", "batch", batch, 1, optional=True)
    _check_count("decode_step_graph", "seq", seq, 1, optional=True)
    if ep != 1:
        return ep_step_graphs(cfg, dep, ep, context=context, batch=batch, seq=seq)[rank]
    cfg, dep = _resolve(cfg, dep)
    context = min(4096, dep.max_context // 2) if context is None else context
    return _step("decode", cfg, dep, batch or dep.decode_batch, seq or dep.decode_seq, context, staged)


def moe_graph(cfg="flash", dep=None, *, tokens: int | None = None, layer_id: int | None = None) -> StepGraph:
    """Graph-only build of one MoE block (``moe_kernels(cfg).moe_test``: hc_pre, gate, shared and
    routed experts, hc_post) over ``tokens`` rows (default the deployment's decode step, FLASH 8)
    of layer ``layer_id`` (default the first learned-routing layer), balanced routing: the FLASH
    MoE with its 256 experts' 6 GiB of INT8 weights shape-only.

    Raises:
        ConfigError: an unknown preset, ``tokens`` not a positive int (or None), a ``layer_id``
            outside ``[0, num_hidden_layers)`` (or None).
    """
    _check_count("moe_graph", "tokens", tokens, 1, optional=True)
    cfg, dep = _resolve(cfg, dep)
    _check_count("moe_graph", "layer_id", layer_id, 0, cfg.num_hidden_layers - 1, optional=True)
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
    ``context ..``) through all layers; arguments and errors as :func:`decode_step_graph`
    (ConfigError: ``tokens`` not a positive int, ``context`` not a non-negative int)."""
    _check_count("prefill_graph", "tokens", tokens, 1)
    _check_count("prefill_graph", "context", context, 0)
    cfg, dep = _resolve(cfg, dep)
    return _step("prefill", cfg, dep, 1, tokens, context, staged)
