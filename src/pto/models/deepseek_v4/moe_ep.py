"""Expert parallelism: the MoE sub-block and the LM head across ranks (pypto-lib `models/deepseek/v4-flash/moe.py`,
`lm_head.py`; hw-native-sys/pypto `docs/en/user/`), one process per rank over ``pld`` (pto.runtime.distributed).

MoE (:func:`moe_ep_kernels` ``.moe_ep``), per rank on its own token rows (attention is data
parallel: each rank holds the rows of its requests). Rank ``p`` owns the ``EL = E / N`` routed
experts ``[p*EL, (p+1)*EL)``; router, shared expert and HC weights are replicated:

    x_mixed, post, comb = hc_pre(x_hc);  x_i8, x_s, idx, w = gate(x_mixed)    # as moe.py
    sh = expert_shared(x_i8, x_s)
    moe_ep_dispatch:  for each rank p, the routes (t, k) with idx in p's range, in (t, k)
                      order: INT8 rows, (scale, weight), local expert -> p's windows at rows
                      [me*CAP, me*CAP + n); the count -> recv_meta[me]; notify arrived(p) += 1
    moe_ep_dispatch_wait: arrived >= N * epoch
    moe_ep_gather:    the received rows, source-major, as tokens of one route each
    expert_routed     (moe.py's kernel with the EL local experts): y per received route
    moe_ep_combine_send: each source's y rows (BF16) -> its comb_y rows [me*CAP, ...);
                      notify combined(src) += 1
    moe_ep_combine_wait: combined >= N * epoch
    moe_ep_combine:   routed_y[t] = sum over k in k order of comb_y[slot(t, k)] (FP32)
    moe_shared_routed, hc_post_prefill                                        # as moe.py

Why the result is bit-identical to EP1 for the same token rows: a route's ``y`` depends only
on its own row (the gate/up/down GEMMs are INT8 x INT8 with exact INT32 sums, SwiGLU and the
per-row INT8 re-quantisation are elementwise / per row), so computing it on another rank among
other rows changes nothing; the owner's ``y + 0 + 0 + 0`` (its K-1 empty routes) and the BF16
trip back are exact, and the origin sums the K routes of a token in the same order k = 0..K-1
as the single-rank ``moe_combine`` (FP32 additions in a fixed order, empty routes adding 0),
then adds the shared expert the same way. The float GEMMs over a rank's own rows (hc_pre,
gate) see 16-row padded tiles whatever the rank's share (docs/distributed.md).

LM head (:func:`lm_head_ep_kernels` ``.lm_head_ep``): each rank collapses and normalises its
own rows (hc_head, final RMSNorm), publishes them to every rank's ``hid_win`` at its global
row offset, computes its vocabulary shard ``[v0, v0 + V/N)`` for all ``B`` rows with the
single-rank ``lm_head`` GEMM, and stores that shard into every rank's ``logit_win``; every rank
ends with the full ``[B, V]`` FP32 logits (so each picks the same argmax).

Windows are host-level (:class:`EPWindows`, once per world and config); counters are monotonic
(waits use ``>= N * epoch``, ``epoch`` the 1-based call number of that counter), and the
program-end exchange of ``pto.runtime.distributed.run`` orders a window's reuse by the next
call. Deviations from the reference: one task per phase (the reference shards dispatch and
combine over 32 blocks per local expert), rows of one source stored as one tile per window.
"""

import dataclasses
import functools
from types import SimpleNamespace

import pto.language as pl
import pto.language.distributed as pld
from pto.errors import BindError, ConfigError, DslError
from pto.models.deepseek_v4.config import DeepSeekV4Config
from pto.models.deepseek_v4.expert_routed import COMBINE_D_TILE, expert_routed_kernels
from pto.models.deepseek_v4.hc_head import hc_head_kernels
from pto.models.deepseek_v4.lm_head import lm_head_kernels
from pto.models.deepseek_v4.moe import moe_back, moe_front, moe_kernels
from pto.models.deepseek_v4.rms_norm import rms_norm
from pto.models.deepseek_v4.weight_format import act_dtype, weight_dtype
from pto.models.deepseek_v4.tiling import token_capacity

__all__ = ["EP_SIZES", "check_ep", "local_config", "shard_config", "EPWindows", "moe_ep_kernels",
           "lm_head_ep_kernels", "expert_slice", "vocab_slice", "shard_moe_weights", "expert_weight_bytes"]

EP_SIZES = (1, 2, 4, 8)  # world sizes a deployment allows (the reference's --ep 2/4/8, plus 1)

T_DYN = pl.dynamic("T")
B_DYN = pl.dynamic("B")


def check_ep(cfg: DeepSeekV4Config, ep: int) -> int:
    """Validate an expert-parallel world size for ``cfg`` (before any process starts).

    Returns:
        experts per rank.

    Raises:
        ConfigError: ``ep`` not in :data:`EP_SIZES`, ``n_routed_experts`` not divisible by it,
            fewer local experts than ``num_experts_per_tok`` (the local routed kernel needs
            ``K <= E_local``), or a vocabulary not divisible by it.
    """
    if isinstance(ep, bool) or not isinstance(ep, int) or ep not in EP_SIZES:
        raise ConfigError(f"--ep {ep!r}: the deployment allows world sizes {list(EP_SIZES)}")
    E, K, V = cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.vocab_size
    if E % ep:
        raise ConfigError(f"--ep {ep}: {cfg.name} has n_routed_experts={E}, not divisible by the world size {ep}")
    if E // ep < K:
        raise ConfigError(f"--ep {ep}: {E // ep} experts per rank is fewer than num_experts_per_tok={K}")
    if V % ep:
        raise ConfigError(f"--ep {ep}: vocab_size={V} is not divisible by the world size {ep} (vocabulary shards)")
    return E // ep


def local_config(cfg: DeepSeekV4Config, ep: int) -> DeepSeekV4Config:
    """``cfg`` with ``n_routed_experts`` = the experts of one rank (the local routed kernel)."""
    return dataclasses.replace(cfg, n_routed_experts=check_ep(cfg, ep))


def shard_config(cfg: DeepSeekV4Config, ep: int) -> DeepSeekV4Config:
    """``cfg`` with ``vocab_size`` = one rank's vocabulary shard (the local lm_head GEMM)."""
    check_ep(cfg, ep)
    return dataclasses.replace(cfg, vocab_size=cfg.vocab_size // ep)


def expert_slice(cfg: DeepSeekV4Config, ep: int, rank: int) -> slice:
    """The global expert ids rank ``rank`` owns."""
    el = check_ep(cfg, ep)
    return slice(rank * el, (rank + 1) * el)


def vocab_slice(cfg: DeepSeekV4Config, ep: int, rank: int) -> slice:
    """The vocabulary rows rank ``rank`` computes."""
    check_ep(cfg, ep)
    vs = cfg.vocab_size // ep
    return slice(rank * vs, (rank + 1) * vs)


class EPWindows:
    """The window buffers of :func:`moe_ep_kernels` and :func:`lm_head_ep_kernels` for ``cfg``
    on the current world (host level; every rank creates them in the same order).

    ``CAP = token_capacity * K`` routes per source rank, ``BCAP = token_capacity`` head rows.
    MoE: ``recv_x [N*CAP, D] INT8``, ``recv_aux [N*CAP, 2] FP32`` (scale, weight),
    ``recv_route [N*CAP, 1] INT32`` (local expert), ``recv_meta [N, 1] INT32`` (rows per
    source), ``comb_y [N*CAP, D] BF16``, counters ``arrived``, ``combined`` ``[1, 1] INT32``.
    Head: ``hid_win [BCAP, D] BF16``, ``logit_win [BCAP, V] FP32``, counters ``hid_done``,
    ``logit_done``. ``moe_epoch`` / ``head_epoch`` count the calls (the wait targets).
    """

    def __init__(self, cfg: DeepSeekV4Config):
        N, D, K, V = pld.world_size(), cfg.hidden_size, cfg.num_experts_per_tok, cfg.vocab_size
        self.cap = cap = token_capacity(cfg) * K
        self.bcap = bcap = token_capacity(cfg)

        def win(name, shape, dt):
            return pld.window(pld.alloc_window_buffer(shape, dt, name=name), shape, dt, name=name)
        self.recv_x = win("recv_x", [N * cap, D], act_dtype(cfg))  # BF16 rows for weight_format "bf16"
        self.recv_aux = win("recv_aux", [N * cap, 2], pl.FP32)
        self.recv_route = win("recv_route", [N * cap, 1], pl.INT32)
        self.recv_meta = win("recv_meta", [N, 1], pl.INT32)
        self.comb_y = win("comb_y", [N * cap, D], pl.BF16)
        self.arrived = win("arrived", [1, 1], pl.INT32)
        self.combined = win("combined", [1, 1], pl.INT32)
        self.hid_win = win("hid_win", [bcap, D], pl.BF16)
        self.logit_win = win("logit_win", [bcap, V], pl.FP32)
        self.hid_done = win("hid_done", [1, 1], pl.INT32)
        self.logit_done = win("logit_done", [1, 1], pl.INT32)
        self.moe_epoch = 0
        self.head_epoch = 0

    def moe_args(self) -> list:
        """The MoE windows in :func:`moe_ep_kernels` parameter order; counts the call."""
        self.moe_epoch += 1
        return [self.recv_x, self.recv_aux, self.recv_route, self.recv_meta, self.comb_y, self.arrived,
                self.combined]

    def head_args(self) -> list:
        """The head windows in :func:`lm_head_ep_kernels` parameter order; counts the call."""
        self.head_epoch += 1
        return [self.hid_win, self.logit_win, self.hid_done, self.logit_done]


# ---- kernel ----
@functools.lru_cache(maxsize=None)
def moe_ep_kernels(cfg: DeepSeekV4Config, ep: int) -> SimpleNamespace:
    """Build the expert-parallel MoE sub-block of one rank of ``ep`` (cached).

    Parameters: ``moe.moe_kernels``'s, with the routed weights of this rank's experts only
    (``w1, w3 [EL, F, D]``, ``w2 [EL, D, F]`` INT8, scales ``[EL, F]`` / ``[EL, D]``), then the
    seven MoE windows of :class:`EPWindows` (``pld.DistributedTensor``), ``x_next`` (Out), and
    scalars ``layer_id``, ``num_tokens`` and ``epoch`` (1-based call number of the counters).
    ``T >= 1``; a rank without tokens passes one zero row with ``num_tokens = 0`` (no routes,
    it still serves its experts and joins the exchange).

    Returns:
        namespace with the inline body ``moe_ep`` and its entry ``moe_ep_test``.

    Raises:
        ConfigError: :func:`check_ep`; at run time DslError when the world size is not ``ep``,
            BindError for an expert id outside ``[-1, E)``, DistributedError from the waits.
    """
    EL = check_ep(cfg, ep)
    lcfg = local_config(cfg, ep)
    D, HC, MIX = cfg.hidden_size, cfg.hc_mult, cfg.mix_hc
    E, K, V, Fd = cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.vocab_size, cfg.moe_intermediate_size
    CAP = token_capacity(cfg) * K
    N = ep
    # one route per received row (K = 1), up to every source's CAP routes: the local experts take
    # N * CAP rows (each source's prefill chunk at once); K = 1 sums no empty route slots
    routed = expert_routed_kernels(dataclasses.replace(lcfg, num_experts_per_tok=1,
                                                       prefill_seq=N * CAP)).expert_routed
    moe_kernels(cfg)  # ConfigError now for a config the single-rank MoE cannot tile
    WD, AD = weight_dtype(cfg), act_dtype(cfg)  # INT8, or BF16 for weight_format "bf16"
    CT = min(COMBINE_D_TILE, D)
    while D % CT:
        CT //= 2

    @pl.jit.inline
    def moe_ep(x_hc: pl.Tensor[[T_DYN, HC, D], pl.FP32],
               hc_ffn_fn: pl.Tensor[[MIX, HC * D], pl.FP32],
               hc_ffn_scale: pl.Tensor[[3], pl.FP32],
               hc_ffn_base: pl.Tensor[[MIX], pl.FP32],
               norm_w: pl.Tensor[[D], pl.BF16],
               gate_w: pl.Tensor[[E, D], pl.FP32],
               gate_bias: pl.Tensor[[E], pl.FP32],
               tid2eid: pl.Tensor[[V, K], pl.INT32],
               input_ids: pl.Tensor[[T_DYN], pl.INT64],
               w1: pl.Tensor[[EL, Fd, D], WD],
               w1_scale: pl.Tensor[[EL, Fd], pl.FP32],
               w3: pl.Tensor[[EL, Fd, D], WD],
               w3_scale: pl.Tensor[[EL, Fd], pl.FP32],
               w2: pl.Tensor[[EL, D, Fd], WD],
               w2_scale: pl.Tensor[[EL, D], pl.FP32],
               sh_w1: pl.Tensor[[Fd, D], WD],
               sh_w1_scale: pl.Tensor[[Fd], pl.FP32],
               sh_w3: pl.Tensor[[Fd, D], WD],
               sh_w3_scale: pl.Tensor[[Fd], pl.FP32],
               sh_w2: pl.Tensor[[D, Fd], WD],
               sh_w2_scale: pl.Tensor[[D], pl.FP32],
               recv_x: pld.DistributedTensor[[N * CAP, D], AD],
               recv_aux: pld.DistributedTensor[[N * CAP, 2], pl.FP32],
               recv_route: pld.DistributedTensor[[N * CAP, 1], pl.INT32],
               recv_meta: pld.DistributedTensor[[N, 1], pl.INT32],
               comb_y: pld.DistributedTensor[[N * CAP, D], pl.BF16],
               arrived: pld.DistributedTensor[[1, 1], pl.INT32],
               combined: pld.DistributedTensor[[1, 1], pl.INT32],
               x_next: pl.Out[pl.Tensor[[T_DYN, HC, D], pl.FP32]],
               layer_id: pl.Scalar[pl.INT32],
               num_tokens: pl.Scalar[pl.INT32],
               epoch: pl.Scalar[pl.INT32]):
        """Expert-parallel MoE of one rank (module docstring); returns ``x_next``."""
        if pld.world_size() != N:
            raise DslError(f"moe_ep built for {N} ranks runs in a world of {pld.world_size()}")
        me = pld.rank()
        f = moe_front(cfg, False, "moe_ep", x_hc, hc_ffn_fn, hc_ffn_scale, hc_ffn_base, norm_w, gate_w, gate_bias,
                      tid2eid, input_ids, sh_w1, sh_w1_scale, sh_w3, sh_w3_scale, sh_w2, sh_w2_scale, layer_id,
                      num_tokens)
        t, active = f.t, f.active
        tk = t * K
        route_slot = pl.create_tensor([1, tk], pl.INT32, capacity=[None, CAP], name="route_slot")

        # 1. dispatch: each owner gets its routes' rows in (t, k) order at rows [me*CAP, ...)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="moe_ep_dispatch"):
            idx = f.indices[0:t, 0:K]
            lists = [[] for _ in range(N)]
            for r, e in enumerate(pl.read_values(pl.reshape(idx, [1, tk]), [0, 0], active * K)):  # r = ti * K + k
                if e < -1 or e >= E:
                    raise BindError(f"moe_ep: indices[{r // K}, {r % K}] = {int(e)} outside [-1, n_routed_experts={E})")
                if e >= 0:
                    lists[e // EL].append((r, e % EL))
            slots = [N * CAP] * tk  # route -> its row at its owner (row N*CAP: the zero row of empty routes)
            xt = pl.transpose(f.x_norm_i8[0:t, 0:D])
            st = pl.transpose(f.x_norm_scale[0:t, 0:1])
            w_flat = pl.reshape(f.weights[0:t, 0:K], [1, tk])
            for p in range(N):
                n = len(lists[p])
                pld.tile.remote_store(pl.full([1, 1], pl.INT32, n), recv_meta, p, [me, 0])
                if n:
                    # the map rows are built in Python and written in one call each (pl.write_values)
                    src = pl.write_values(pl.full([1, n], pl.INT32, 0), [0, 0], [r // K for r, _ in lists[p]])
                    rid = pl.write_values(pl.full([1, n], pl.INT32, 0), [0, 0], [r for r, _ in lists[p]])
                    loc = pl.reshape(pl.write_values(pl.full([1, n], pl.INT32, 0), [0, 0], [le for _, le in lists[p]]),
                                     [n, 1])
                    for j, (r, _) in enumerate(lists[p]):
                        slots[r] = p * CAP + j
                    pld.tile.remote_store(pl.transpose(pl.gather(xt, index=src)), recv_x, p, [me * CAP, 0])
                    aux = pl.assemble(pl.full([n, 2], pl.FP32, 0.0), pl.transpose(pl.gather(st, index=src)), [0, 0])
                    aux = pl.assemble(aux, pl.transpose(pl.gather(w_flat, index=rid)), [0, 1])
                    pld.tile.remote_store(aux, recv_aux, p, [me * CAP, 0])
                    pld.tile.remote_store(loc, recv_route, p, [me * CAP, 0])
                pld.system.notify(arrived, p, [0, 0], 1, pld.NotifyOp.AtomicAdd)
            route_slot[0:1, 0:tk] = pl.write_values(pl.full([1, tk], pl.INT32, N * CAP), [0, 0], slots)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="moe_ep_dispatch_wait") as dwait:
            pld.system.wait(arrived, [0, 0], N * epoch, pld.WaitCmp.Ge)

        # 2. the received routes, source-major, one route per row through the local experts
        counts = [pl.read(recv_meta, [s, 0]) for s in range(N)]
        n_recv = sum(counts)
        if n_recv:
            rx = pl.create_tensor([n_recv, D], AD, capacity=N * CAP, name="ep_recv_x")
            rs = pl.create_tensor([n_recv, 1], pl.FP32, capacity=N * CAP, name="ep_recv_scale")
            ridx = pl.create_tensor([n_recv, 1], pl.INT32, capacity=N * CAP, name="ep_recv_idx")
            rw = pl.create_tensor([n_recv, 1], pl.FP32, capacity=N * CAP, name="ep_recv_w")
            ry = pl.create_tensor([n_recv, D], pl.FP32, capacity=N * CAP, name="ep_recv_y")
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="moe_ep_gather", deps=[dwait]):
                off = 0
                for s in range(N):
                    c = counts[s]
                    if c:
                        r0 = s * CAP
                        rx[off:off + c, 0:D] = recv_x[r0:r0 + c, 0:D]
                        aux = recv_aux[r0:r0 + c, 0:2]
                        rs[off:off + c, 0:1] = pl.slice(aux, [c, 1], [0, 0])
                        rw[off:off + c, 0:1] = pl.slice(aux, [c, 1], [0, 1])
                        ridx[off:off + c, 0:1] = recv_route[r0:r0 + c, 0:1]
                        off += c
            routed(rx, rs, ridx, rw, w1, w1_scale, w3, w3_scale, w2, w2_scale, ry)

        # 3. combine: every route's y back to its origin, then the k-ordered sum there
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="moe_ep_combine_send"):
            off = 0
            for s in range(N):
                c = counts[s]
                if c:
                    y = pl.cast(ry[off:off + c, 0:D], pl.BF16, mode="rint")  # exact: y is BF16-valued
                    pld.tile.remote_store(y, comb_y, s, [me * CAP, 0])
                    off += c
                pld.system.notify(combined, s, [0, 0], 1, pld.NotifyOp.AtomicAdd)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="moe_ep_combine_wait") as cwait:
            pld.system.wait(combined, [0, 0], N * epoch, pld.WaitCmp.Ge)
        for b in pl.spmd(D // CT, name_hint="moe_ep_combine", deps=[cwait]):
            d0 = b * CT
            ys = pl.cast(comb_y[0:N * CAP, d0:d0 + CT], pl.FP32, mode="none")
            ys = pl.assemble(pl.full([N * CAP + 1, CT], pl.FP32, 0.0), ys, [0, 0])
            per_route = pl.transpose(pl.gather(pl.transpose(ys), index=route_slot[0:1, 0:tk]))
            rows = pl.reshape(per_route, [t, K * CT])
            acc = pl.slice(rows, [t, CT], [0, 0])
            for k in range(1, K):
                acc = acc + pl.slice(rows, [t, CT], [0, k * CT])
            pl.assemble(f.routed_y, acc, [0, d0])

        moe_back(cfg, f, x_hc, x_next, num_tokens)
        return x_next

    return SimpleNamespace(moe_ep=moe_ep, moe_ep_test=pl.jit.entry(moe_ep, name="moe_ep_test"), ep=ep)


@functools.lru_cache(maxsize=None)
def lm_head_ep_kernels(cfg: DeepSeekV4Config, ep: int) -> SimpleNamespace:
    """Build the vocabulary-parallel model head of one rank of ``ep`` (cached).

    Parameters: ``x_hc [T, hc_mult, D] FP32`` (this rank's rows; ``T >= 1``, ``own_rows`` of
    them real), ``hc_fn``, ``hc_scale``, ``hc_base``, ``norm_w`` as ``final_logits``, ``weight
    [V/N, D] BF16`` (this rank's vocabulary shard), the four head windows of
    :class:`EPWindows`, ``logits [B, V] FP32`` (Out: every rank's rows, full vocabulary), and
    the unannotated ``row_counts`` (rows per rank, summing to ``B``) and ``epoch``.

    Returns:
        namespace with the inline body ``lm_head_ep`` and its entry ``lm_head_ep_test``.

    Raises:
        ConfigError: :func:`check_ep`; BindError at run time for ``row_counts`` that do not sum
            to ``B`` or exceed this rank's ``T``, or ``B`` above the head window capacity.
    """
    check_ep(cfg, ep)
    scfg = shard_config(cfg, ep)
    D, NH, V = cfg.hidden_size, cfg.hc_mult, cfg.vocab_size
    VS = V // ep
    N = ep
    BCAP = token_capacity(cfg)
    cap = token_capacity(cfg)
    hc_head = hc_head_kernels(cfg).hc_head
    lm_head = lm_head_kernels(scfg).lm_head

    @pl.jit.inline
    def lm_head_ep(x_hc: pl.Tensor[[T_DYN, NH, D], pl.FP32],
                   hc_fn: pl.Tensor[[NH, NH * D], pl.FP32],
                   hc_scale: pl.Tensor[[1], pl.FP32],
                   hc_base: pl.Tensor[[NH], pl.FP32],
                   norm_w: pl.Tensor[[D], pl.BF16],
                   weight: pl.Tensor[[VS, D], pl.BF16],
                   hid_win: pld.DistributedTensor[[BCAP, D], pl.BF16],
                   logit_win: pld.DistributedTensor[[BCAP, V], pl.FP32],
                   hid_done: pld.DistributedTensor[[1, 1], pl.INT32],
                   logit_done: pld.DistributedTensor[[1, 1], pl.INT32],
                   logits: pl.Out[pl.Tensor[[B_DYN, V], pl.FP32]],
                   row_counts, epoch):
        """Vocabulary-parallel head of one rank (module docstring); returns ``logits``."""
        me = pld.rank()
        t = pl.tensor.dim(x_hc, 0)
        B = pl.tensor.dim(logits, 0)
        counts = [int(c) for c in row_counts]
        if len(counts) != N or sum(counts) != B or counts[me] > t or B > BCAP:
            raise BindError(f"lm_head_ep: row_counts {counts} must give {N} ranks' rows summing to B={B} "
                            f"<= {BCAP}, this rank's at most T={t}")
        row0 = sum(counts[:me])
        head_x = pl.create_tensor([t, D], pl.BF16, capacity=cap, name="head_x")
        head_normed = pl.create_tensor([t, D], pl.BF16, capacity=cap, name="head_normed")
        hidden = pl.create_tensor([B, D], pl.BF16, capacity=cap, name="head_hidden")
        shard = pl.create_tensor([B, VS], pl.FP32, capacity=cap, name="logits_shard")
        hc_head(x_hc, hc_fn, hc_scale, hc_base, head_x)
        rms_norm(head_x, norm_w, head_normed, cfg)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="head_publish"):
            for p in range(N):
                if counts[me]:
                    pld.tensor.put(hid_win, p, head_normed, [row0, 0], [0, 0], [counts[me], D])
                pld.system.notify(hid_done, p, [0, 0], 1, pld.NotifyOp.AtomicAdd)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="head_publish_wait") as hw:
            pld.system.wait(hid_done, [0, 0], N * epoch, pld.WaitCmp.Ge)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="head_hidden_copy", deps=[hw]):
            hidden[0:B, 0:D] = hid_win[0:B, 0:D]
        lm_head(hidden, weight, shard)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="head_logits_route"):
            for p in range(N):
                pld.tensor.put(logit_win, p, shard, [0, me * VS], [0, 0], [B, VS])
                pld.system.notify(logit_done, p, [0, 0], 1, pld.NotifyOp.AtomicAdd)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="head_logits_wait") as lw:
            pld.system.wait(logit_done, [0, 0], N * epoch, pld.WaitCmp.Ge)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="head_logits_out", deps=[lw]):
            logits[0:B, 0:V] = logit_win[0:B, 0:V]
        return logits

    return SimpleNamespace(lm_head_ep=lm_head_ep, lm_head_ep_test=pl.jit.entry(lm_head_ep, name="lm_head_ep_test"),
                           ep=ep)
# ---- end kernel ----


def shard_moe_weights(ffn_w: list, cfg: DeepSeekV4Config, ep: int, rank: int) -> list:
    """``moe``'s weight list (``MOE_INPUTS`` order after ``x_hc``) with the routed experts
    cut to rank ``rank``'s (``w1, w1_scale, w3, w3_scale, w2, w2_scale`` are entries 8-13)."""
    sl = expert_slice(cfg, ep, rank)
    out = list(ffn_w)
    for j in range(8, 14):
        out[j] = out[j][sl].contiguous()
    return out


def expert_weight_bytes(ffn_w: list) -> int:
    """Bytes of the routed expert weights in a ``moe`` weight list (entries 8-13)."""
    return sum(t.numel() * t.element_size() for t in ffn_w[8:14])

