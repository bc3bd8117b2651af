"""The kernel model across ranks: attention data parallel over requests, MoE expert parallel,
LM head vocabulary parallel (docs/distributed.md; pypto-lib `models/deepseek/v4-flash/moe.py`, `lm_head.py`, `decode_layer.py`).

:class:`EPModel` is a :class:`KernelModel` for one rank of a ``pld`` world of ``N`` ranks
(``pto.runtime.distributed.init``), with the interface :func:`generate` drives. Every rank runs
the same generate loop over the same prompts; a request belongs to one rank (round robin in
creation order: with 4 requests and 2 ranks, requests 0 and 2 on rank 0, 1 and 3 on rank 1),
which alone runs its embedding and attention and holds its cache pages. Per layer:

* attention: the owner's ``prefill_attention_*`` / ``decode_attention_*`` program on its own
  requests' rows (prefill: each rank one chunk of its own requests per round,
  :meth:`EPModel.prefill_many`; a rank with no chunk left has no rows);
* MoE: :func:`moe_ep.moe_ep_kernels` on every rank (a rank without rows passes one zero row
  with ``num_tokens = 0`` and still serves its experts); rank ``r`` reads from the checkpoint
  only the routed experts ``[r*E/N, (r+1)*E/N)``;
* head: :func:`moe_ep.lm_head_ep_kernels` on every rank with its vocabulary shard; every rank
  gets the whole ``[rows, V]`` logits, so every rank's generate loop picks the same tokens.

Each program with cross-rank traffic runs through ``pto.runtime.distributed.run`` (an
end-of-program exchange on every rank); the others are local. Statistics per program name as
:class:`KernelModel` (``stats``), per rank.
"""

import torch

import pto.language.distributed as pld
from pto.errors import ConfigError, DistributedError, PtoError
from pto.models.deepseek_v4.config import DeploymentConfig
from pto.models.deepseek_v4.decode_attention_hca import decode_attention_hca_kernels
from pto.models.deepseek_v4.decode_attention_swa import decode_attention_swa_kernels
from pto.models.deepseek_v4.layer import KernelModel, KernelState
from pto.models.deepseek_v4.moe import MOE_INPUTS
from pto.models.deepseek_v4.moe_ep import (EPWindows, check_ep, expert_slice, lm_head_ep_kernels, moe_ep_kernels,
                                          vocab_slice)
from pto.models.deepseek_v4.prefill_attention_csa import csa_block_kernels
from pto.models.deepseek_v4.prefill_attention_hca import prefill_attention_hca_kernels
from pto.models.deepseek_v4.prefill_attention_swa import prefill_attention_swa_kernels
from pto.models.deepseek_v4.weights import Checkpoint
from pto.runtime import distributed as dist

__all__ = ["EPModel", "PeerFailed", "ROUTED_KEYS"]

_FAMILY = {0: "swa", 4: "csa", 128: "hca"}  # compress ratio -> attention kernel family
ROUTED_KEYS = ("w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale")  # the per-expert MoE inputs
_N_MOE = len(MOE_INPUTS) - 2  # moe arguments of KernelModel.layer_args (no x_hc, no input_ids)
_IDS_AT = MOE_INPUTS.index("input_ids") - 1  # input_ids' place among moe's arguments after x_hc


class PeerFailed(DistributedError):
    """Another rank failed a step every rank takes together (loading its weights); that rank
    reports the error itself, this one only stops."""


class EPModel(KernelModel):
    """One rank of the expert-parallel kernel model (see the module docstring).

    Args:
        checkpoint: an opened checkpoint with ``weight_format="int8"``.
        deployment: as :class:`KernelModel`.
        check: check mode for every program (cross-rank race check included).

    Every rank reads only its routed experts and its vocabulary rows of the head
    (:meth:`Checkpoint.shard`), and all of its weights at construction; the ranks then agree
    (:meth:`World.agree`) that every one of them loaded, so a bad tensor is one error.

    Raises:
        ConfigError: the world size is not one the config allows (:func:`moe_ep.check_ep`),
            or :class:`KernelModel`'s errors; CheckpointError: a tensor of this rank's shard is
            corrupt (non-finite values). These are raised on the lowest failing rank;
            every other rank raises :class:`PeerFailed` naming it.
        DistributedError: a peer did not report within the timeout.
    """

    def __init__(self, checkpoint: Checkpoint, deployment: DeploymentConfig | None = None, check: bool = False):
        self.ep, self.rank = pld.world_size(), pld.rank()
        err = None
        try:
            check_ep(checkpoint.config, self.ep)
            cfg = checkpoint.config
            shard = checkpoint.shard(expert_slice(cfg, self.ep, self.rank), vocab_slice(cfg, self.ep, self.rank))
            super().__init__(shard, deployment, check=check, per_layer=True)
            for i in range(self.cfg.num_hidden_layers):  # this rank's weights, now: a bad tensor fails here
                self.attn_weights(i)
                self.ffn_weights(i)
        except PtoError as e:
            err = e
        failed = pld.world().agree(None if err is None else f"{type(err).__name__}: {err}", "loading the weights")
        if failed:
            first, why = next(iter(failed.items()))
            if first == self.rank:
                raise type(err)(f"rank {self.rank}: {err}") from None
            raise PeerFailed(f"rank {self.rank}: stopped, rank {first} failed loading its weights: {why}")
        self._setup_programs()

    def _setup_programs(self) -> None:
        """The rank's programs and windows (``self.kcfg``, ``self.ep`` and ``self._head_w`` set;
        also used by the graph-only rank of :func:`graph_only.decode_step_graph`)."""
        k = self.kcfg
        self.windows = EPWindows(k)
        self._moe_ep = moe_ep_kernels(k, self.ep).moe_ep_test
        self._head_ep = lm_head_ep_kernels(k, self.ep).lm_head_ep_test
        self._head_shard = self._head_w[4]  # the checkpoint shard's head: this rank's vocabulary rows
        self._attn_entry = {
            ("prefill", "swa"): prefill_attention_swa_kernels(k).prefill_attention_swa_test,
            ("prefill", "csa"): csa_block_kernels(k, "prefill").entry,
            ("prefill", "hca"): prefill_attention_hca_kernels(k).prefill_attention_hca_test,
            ("decode", "swa"): decode_attention_swa_kernels(k).decode_attention_swa_test,
            ("decode", "csa"): csa_block_kernels(k, "decode").entry,
            ("decode", "hca"): decode_attention_hca_kernels(k).decode_attention_hca_test,
        }
        self._owner: dict[int, int] = {}
        self._made = 0

    # ---- requests and weights -------------------------------------------------------------------
    def new_state(self) -> KernelState:
        """A new request, owned by rank ``k mod N`` for the ``k``-th request made (round robin:
        any number of requests, and every later generate call, spread evenly)."""
        st = super().new_state()
        self._owner[st.rid] = self._made % self.ep
        self._made += 1
        return st

    def owner(self, state: KernelState) -> int:
        """The rank that runs ``state``'s attention and holds its cache pages."""
        return self._owner[state.rid]

    def step_hidden(self, *args, **kwargs):
        """Not across ranks: MTP decoding (``generate(mtp=True)``) runs on one rank.

        Raises:
            ConfigError: always.
        """
        raise ConfigError("EPModel: MTP self-speculative decoding is not supported across ranks (run it "
                          "without --ep)")

    # ---- one step ----------------------------------------------------------------------------
    def _comm(self, name: str, entry, *args) -> None:
        import time
        t0 = time.perf_counter()
        prog = dist.run(entry, *args, config=self.run_config)
        self.stats.add(name, prog, time.perf_counter() - t0)

    def _ep_step(self, ids: torch.Tensor, rids: list[int], pos: torch.Tensor, prefill: bool,
                 counts: list[int]) -> torch.Tensor:
        """This rank's rows (``ids``, possibly none) through every layer and the head; returns
        the logits of every rank's rows, rank-major ``[sum(counts), V]``."""
        phase, T, cfg = ("prefill" if prefill else "decode"), ids.numel(), self.cfg
        HC, D = cfg.hc_mult, cfg.hidden_size
        ids = ids.to(torch.int64)
        if T:
            X = torch.empty(T, HC, D)
            self._run("lookup_embedding", self._embed, ids, self._embed_w, X)
        else:  # a rank without rows: one zero row with no active token
            X, ids = torch.zeros(1, HC, D), torch.zeros(1, dtype=torch.int64)
        for i, ratio in enumerate(cfg.compress_ratios):
            f = self.ffn_weights(i)
            moe_args = [f.get(key) for key in MOE_INPUTS[1:]]
            moe_args[_IDS_AT] = ids
            if T:
                args = self.layer_args(i, rids, pos, prefill)[:-_N_MOE]
                x_mid = torch.empty_like(X)
                fam = _FAMILY[ratio]
                name = f"{phase}_attention_{fam}"
                n_tok = [T] if prefill or fam == "csa" else []
                self._run(name, self._attn_entry[(phase, fam)], X, *args, x_mid, *n_tok)
            else:
                x_mid = X
            x_next = torch.empty_like(X)
            self._comm("moe_ep", self._moe_ep, x_mid, *moe_args, *self.windows.moe_args(), x_next, i, T,
                       self.windows.moe_epoch)
            X = x_next
        logits = torch.empty(sum(counts), cfg.vocab_size)
        self._comm("lm_head_ep", self._head_ep, X, *self._head_w[:4], self._head_shard, *self.windows.head_args(),
                   logits, counts, self.windows.head_epoch)
        return logits

    def forward(self, ids, state: KernelState) -> torch.Tensor:
        """Prefill chunk of one request (every rank calls it; the owner computes the attention):
        logits ``[S, V]`` FP32 on every rank.

        Raises:
            BindError / CapacityError: as :meth:`KernelModel.forward` (before any program).
        """
        ids = self.golden.check_ids(ids, state)
        S = ids.numel()
        o = self.owner(state)
        mine = o == self.rank
        if mine:
            self.cache.reserve(state.rid, S)
        counts = [S if r == o else 0 for r in range(self.ep)]
        logits = self._ep_step(ids if mine else ids[:0], [state.rid], torch.arange(state.pos, state.pos + S), True,
                               counts)
        if mine:
            self.cache.commit(state.rid, S)
        state.pos += S
        return logits

    __call__ = forward

    def prefill_many(self, prompts: list[list[int]], states: list[KernelState], chunk: int) -> list[list[torch.Tensor]]:
        """Prefill every request, the ranks in parallel (attention data parallel in prefill too):
        each rank prefills its own requests' chunks in order, one chunk per round, and a round's
        MoE and head programs carry every rank's chunk (a rank with no chunk left passes no rows).
        Rounds: the most chunks any rank owns (4 one-chunk requests on 2 ranks: 2 rounds, was 4).

        Returns:
            per request, its chunks' logits ``[S_c, V]`` FP32 in order (the same on every rank;
            bit-identical to one chunk at a time, docs/distributed.md).

        Raises:
            BindError / CapacityError: as :meth:`forward`, for any request (before any program).
        """
        ids = [self.golden.check_ids(p, st) for p, st in zip(prompts, states)]
        queues: list[list] = [[] for _ in range(self.ep)]  # per rank: (request, chunk ids) in order
        for r, st in enumerate(states):
            for c0 in range(0, ids[r].numel(), chunk):
                queues[self.owner(st)].append((r, ids[r][c0:c0 + chunk]))
        out: list[list[torch.Tensor]] = [[] for _ in prompts]
        for i in range(max(len(q) for q in queues)):
            items = [q[i] if i < len(q) else None for q in queues]
            counts = [0 if it is None else it[1].numel() for it in items]
            mine = items[self.rank]
            if mine is not None:
                st, S = states[mine[0]], counts[self.rank]
                self.cache.reserve(st.rid, S)
                logits = self._ep_step(mine[1], [st.rid], torch.arange(st.pos, st.pos + S), True, counts)
                self.cache.commit(st.rid, S)
            else:
                logits = self._ep_step(ids[0][:0], [], torch.zeros(0, dtype=torch.int64), True, counts)
            off = 0
            for it, n in zip(items, counts):
                if it is not None:
                    out[it[0]].append(logits[off:off + n])
                    states[it[0]].pos += n
                    off += n
        return out

    def decode(self, tokens: list[int], states: list[KernelState]) -> torch.Tensor:
        """One decode step of ``B`` requests; each rank runs the attention of its own; logits
        ``[B, V]`` FP32 (batch order) on every rank.

        Raises:
            BindError / CapacityError: as :meth:`KernelModel.decode`.
        """
        ids = self.golden.check_ids(tokens)
        for t, st in zip(tokens, states):
            self.golden.check_ids([t], st)
        owners = [self.owner(st) for st in states]
        order = sorted(range(len(states)), key=lambda b: (owners[b], b))  # rank-major rows of the head
        counts = [owners.count(r) for r in range(self.ep)]
        mine = [b for b in order if owners[b] == self.rank]
        for b in mine:
            self.cache.reserve(states[b].rid, 1)
        rm = self._ep_step(ids[mine], [states[b].rid for b in mine], torch.tensor([states[b].pos for b in mine]),
                           False, counts)
        logits = torch.empty_like(rm)
        logits[order] = rm
        for b in mine:
            self.cache.commit(states[b].rid, 1)
        for st in states:
            st.pos += 1
        return logits


def ep_launch(args):
    """The option checks of ``pto generate --ep`` (called first by the command, before anything
    is read): in the parent and in every rank.

    Raises:
        ConfigError: ``--ep`` not a positive integer, with a non-kernel backend or ``--mtp``, or
            an ``--ep`` that differs from ``WORLD_SIZE`` in a rank.
    """
    import os

    ep = getattr(args, "ep", None)
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world > 1:
        if ep is not None and ep != world:
            raise ConfigError(f"--ep {ep} but this rank runs in a world of WORLD_SIZE={world}")
        ep = world
    if ep is None:
        return None
    if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1:
        raise ConfigError(f"--ep must be a positive integer, got {ep!r}")
    if ep > 1 and generate_backend(args) != "kernels":
        raise ConfigError(f"--ep {ep}: expert parallelism runs on the kernel path (not --backend golden)")
    if ep > 1 and getattr(args, "mtp", False):
        raise ConfigError(f"--ep {ep}: --mtp (self-speculative decoding) runs on one rank only")
    return None


def generate_backend(args) -> str:
    """``pto generate``'s backend: ``args.backend`` unless ``"auto"``, which is ``"kernels"``
    (in both weight formats)."""
    return "kernels" if args.backend == "auto" else args.backend


def ep_start(args, cfg, deployment):
    """The launch part of ``pto generate --ep`` (called once the prompts, the checkpoint's
    tensor list and the deployment are checked, before any model is built).

    * In a rank of a multi-rank run (``WORLD_SIZE > 1``: a rank spawned by ``--ep N`` or started
      by ``torchrun``): join the world (``pto.runtime.distributed.init``), silence stdout on
      ranks other than 0, return None (the command goes on with :func:`ep_rank_model`).
    * Otherwise with ``--ep N > 1``: check the world size and the kernel tiling against the
      config, then start ``N`` ranks of the same command line and return the exit code (0 when
      every rank succeeded). Nothing has started when this raises.
    * Otherwise: None.

    Raises:
        ConfigError: a world size the config does not allow (:func:`moe_ep.check_ep`) or a
            deployment the kernels cannot tile.
    """
    import os
    import sys

    from pto.models.deepseek_v4.config import kernel_config

    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    ep = world if world > 1 else getattr(args, "ep", None)
    if ep is None:
        return None
    check_ep(cfg, ep)
    kernel_config(cfg, deployment)
    if world > 1:
        dist.init()
        if pld.rank() != 0:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - one rank prints the result
        return None
    if ep == 1:
        return None
    argv = list(getattr(args, "argv", None) or sys.argv[1:])
    return dist.spawn(argv, ep)


def ep_rank_model(checkpoint: Checkpoint, deployment: DeploymentConfig, check: bool = False) -> EPModel:
    """:class:`EPModel` for the command line: on a rank that stops because another failed
    (:class:`PeerFailed`), stderr is silenced too, so the run prints the failing rank's error
    once.

    Raises:
        as :class:`EPModel`.
    """
    import os
    import sys

    try:
        return EPModel(checkpoint, deployment, check=check)
    except PeerFailed:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - the failing rank prints the error
        raise


__all__ += ["ep_launch", "ep_start", "ep_rank_model"]
