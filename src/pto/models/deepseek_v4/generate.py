"""Greedy generation: chunked prefill, then batched decode steps (README.md).

``generate(model, prompts)`` checks every prompt before any work (ids inside the vocabulary,
non-empty, prompt plus ``max_new_tokens`` within the deployment's context, batch within
``max_requests``), prefills each request in chunks of ``chunk`` tokens, then runs decode
steps over the requests still running until each stops at ``eos_token_id`` or after
``max_new_tokens`` tokens. The first new token comes from the last prefill position.

``model`` is a :class:`pto.models.deepseek_v4.model.GoldenModel` or anything with the
same ``new_state()``, ``forward(ids, state) -> logits [S, V]``, ``cfg`` and ``deployment``;
a model with a ``decode(tokens, states) -> logits [B, V]`` method gets one batched call per
decode step, otherwise each running request is stepped in turn; a model with
``release_state(state)`` gets every request's state back at the end (its cache pages); a model
with ``prefill_many(prompts, states, chunk) -> [[chunk logits [S, V]] per request]`` prefills
every request in one call (its own order of the chunks, e.g. several requests at once).
"""

from __future__ import annotations

import numbers
import time
from dataclasses import dataclass, field

import torch

from pto.errors import BindError, CapacityError, CheckpointError
from pto.models.deepseek_v4.decode_metadata import HCA_RATIO, hca_cmp_cols
from pto.models.deepseek_v4.prefill_sparse_attn import sparse_attn_tiling

__all__ = ["GenerateResult", "generate", "check_prompts", "hca_context", "stop_ids"]


@dataclass
class GenerateResult:
    """Result of :func:`generate`.

    Attributes:
        tokens: new token ids per request (prompt excluded).
        stop_reasons: ``"eos"`` or ``"length"`` per request.
        prompt_logits: per request ``[S, V]`` FP32 prefill logits (if requested) else None.
        step_logits: per request the ``[V]`` logits each new token was chosen from (if
            requested), else None.
        prefill_s: wall seconds of every prefill chunk.
        decode_s: wall seconds of every decode step.
        decode_steps: number of decode steps run.
        mtp_drafts: MTP drafts verified (``generate(..., mtp=True)``; 0 without MTP).
        mtp_accepted: drafts accepted (each one a token without its own decode step).
    """

    tokens: list[list[int]]
    stop_reasons: list[str]
    prompt_logits: list[torch.Tensor] | None = None
    step_logits: list[list[torch.Tensor]] | None = None
    prefill_s: float = 0.0
    decode_s: float = 0.0
    decode_steps: int = 0
    timings: dict = field(default_factory=dict)
    mtp_drafts: int = 0
    mtp_accepted: int = 0

    @property
    def acceptance_rate(self) -> float:
        """Accepted over verified MTP drafts (0 when none was verified)."""
        return self.mtp_accepted / self.mtp_drafts if self.mtp_drafts else 0.0

    @property
    def decode_steps_saved(self) -> int:
        """Decode steps plain greedy would have run minus the steps run. Plain greedy makes the
        same tokens (MTP keeps only the drafts greedy would choose) and runs one batched step
        per token after the first of the longest request, so it would run ``max(len(tokens)) - 1``
        steps; with one request this is the number of accepted drafts, with a batch fewer (one
        step decodes every request: a step saved needs the longest requests' drafts accepted)."""
        plain = max((len(t) for t in self.tokens), default=1) - 1
        return max(plain - self.decode_steps, 0)

    @property
    def new_tokens(self) -> int:
        """Total new tokens over all requests."""
        return sum(len(t) for t in self.tokens)

    @property
    def decode_ms_per_token(self) -> float:
        """Decode wall per generated token after the first (ms); 0 when none was decoded."""
        n = self.new_tokens - len(self.tokens)
        return 1e3 * self.decode_s / n if n > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        """New tokens per second of prefill plus decode wall."""
        wall = self.prefill_s + self.decode_s
        return self.new_tokens / wall if wall > 0 else 0.0


def hca_context(cfg) -> int | None:
    """Longest request, in tokens (prompt + generated), that the HCA (ratio-128) attention cores
    of ``cfg`` see whole, or None for a model without HCA layers.

    A token at position ``p`` sees ``(p + 1) // 128`` compressed entries
    (prefill_attention_hca.py); the prefill core attends ``sparse_attn_tiling(cfg).cmp_cols`` of
    them and the decode core ``hca_cmp_cols(cfg)``, so with ``n`` the smaller, positions up to
    ``(n + 1) * 128 - 2`` are seen whole. The limit counts every token of the request as one that
    may be processed (greedy decode never feeds the last new token; MTP drafts can run past it):
    ``(n + 1) * 128 - 1`` tokens, 2175 for the ``tiny`` preset, whose prefill core attends 16
    entries.

    Raises:
        ConfigError: from :func:`sparse_attn_tiling` for a config it cannot tile.
    """
    if HCA_RATIO not in cfg.compress_ratios:
        return None
    n = min(sparse_attn_tiling(cfg).cmp_cols, hca_cmp_cols(cfg))
    return (n + 1) * HCA_RATIO - 1


def _as_list(x):
    """A torch tensor or numpy array as nested Python lists (``tolist``); anything else as it is."""
    return x.tolist() if isinstance(x, torch.Tensor) or (hasattr(x, "tolist") and hasattr(x, "dtype")) else x


def check_prompts(prompts, cfg, deployment, max_new_tokens: int) -> list[list[int]]:
    """Validate a batch of prompts; returns them as lists of Python ints.

    Raises:
        BindError: an empty batch, an empty prompt, a non-integer id, an id outside
            ``[0, vocab_size)`` (naming the request and index), or a bad ``max_new_tokens``.
        CapacityError: more requests than ``deployment.max_requests``, or a prompt plus
            ``max_new_tokens`` longer than ``deployment.max_context`` or than
            :func:`hca_context` (naming the request).
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise BindError(f"generate: max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    prompts = _as_list(prompts)
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise BindError("generate: prompts must be a non-empty list of token-id lists")
    if isinstance(prompts[0], numbers.Integral) and not isinstance(prompts[0], bool):
        raise BindError("generate: prompts must be a list of token-id lists (one per request), "
                        "got a flat list of ints; wrap it in a list")
    if len(prompts) > deployment.max_requests:
        raise CapacityError(f"generate: {len(prompts)} requests exceed the deployment's "
                            f"max_requests={deployment.max_requests}")
    out = []
    V = cfg.vocab_size
    reach = hca_context(cfg)
    for r, p in enumerate(prompts):
        p = _as_list(p)
        if not isinstance(p, (list, tuple)):
            raise BindError(f"generate: request {r} is {type(p).__name__} {p!r}, not a list of token ids")
        if len(p) == 0:
            raise BindError(f"generate: request {r} has an empty prompt")
        for k, t in enumerate(p):
            if isinstance(t, bool) or not isinstance(t, numbers.Integral):
                raise BindError(f"generate: request {r} token {k} is {t!r}, not an integer id")
            if not 0 <= t < V:
                raise BindError(f"generate: request {r} token {k} = {t} is outside the vocabulary "
                                f"[0, {V})")
        if len(p) + max_new_tokens > deployment.max_context:
            raise CapacityError(f"generate: request {r} needs {len(p)} prompt + {max_new_tokens} new "
                                f"tokens, more than the deployment's max_context="
                                f"{deployment.max_context}")
        if reach is not None and len(p) + max_new_tokens > reach:
            raise CapacityError(f"generate: request {r} needs {len(p)} prompt + {max_new_tokens} new "
                                f"tokens, more than the {reach} the HCA attention cores of config "
                                f"{cfg.name!r} see whole (a token at position p sees (p + 1) // "
                                f"{HCA_RATIO} compressed entries; the cores attend {reach // HCA_RATIO})")
        out.append([int(t) for t in p])
    return out


def stop_ids(eos) -> frozenset:
    """The stop tokens of ``eos``: None -> none, an int -> that id, a list or tuple of ints -> each
    (an ``eos_token_id`` as :class:`~pto.models.deepseek_v4.config.DeepSeekV4Config` or
    :func:`generate` take it).

    Raises:
        BindError: anything else (a bool, a string, a float, a nested list), naming the value.
    """
    def is_id(t):
        return isinstance(t, numbers.Integral) and not isinstance(t, bool)  # numpy ints too

    if eos is None:
        return frozenset()
    if is_id(eos):
        return frozenset((int(eos),))
    if isinstance(eos, (list, tuple)) and all(is_id(t) for t in eos):
        return frozenset(int(t) for t in eos)
    raise BindError(f"generate: eos_token_id must be None, a token id or a list of token ids, got {eos!r}")


def generate(model, prompts, *, max_new_tokens: int = 8, chunk: int = 128,
             eos_token_id=-1, keep_logits: bool = False,
             progress=None, mtp: bool = False, drafts: str = "model",
             reference: list[list[int]] | None = None) -> GenerateResult:
    """Greedy generation for a batch of prompts (see the module docstring).

    Args:
        model: a GoldenModel-like model.
        prompts: list of token-id lists (different lengths allowed).
        max_new_tokens: new tokens per request at most (>= 1).
        chunk: prefill chunk length in tokens (>= 1).
        eos_token_id: stop token (an int) or tokens (a list or tuple of ints: a request stops at
            any of them, as with Hugging Face's list form); ``-1`` (default) means the model
            config's ``eos_token_id``; ``None`` never stops early.
        keep_logits: keep the prompt logits and each step's logits in the result.
        progress: optional callable ``progress(done_tokens, total_tokens, phase)``.
        mtp: self-speculative decoding with the checkpoint's MTP layer
            (:func:`pto.models.deepseek_v4.mtp.generate_mtp`): the same tokens, fewer decode
            steps; ``res.acceptance_rate`` / ``res.decode_steps_saved`` report it.
        drafts: with ``mtp``: ``"model"`` (default), ``"accept"`` / ``"reject"`` (forced from
            ``reference``, the plain greedy tokens per request) or ``"none"`` (plain greedy in
            the ``S = 2`` decode shape of the kernels).
        reference: plain greedy tokens per request for the forced draft modes.

    Returns:
        :class:`GenerateResult`.

    Raises:
        BindError / CapacityError: see :func:`check_prompts`; a bad ``chunk`` or
            ``eos_token_id``; a ``chunk`` above the model's ``max_chunk`` (the kernels' token
            capacity) for a prompt longer than that. Raised before any forward runs.
    """
    cfg, dep = model.cfg, model.deployment
    prompts = check_prompts(prompts, cfg, dep, max_new_tokens)
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise BindError(f"generate: chunk must be a positive integer, got {chunk!r}")
    cap = getattr(model, "max_chunk", None)
    if cap is not None and chunk > cap and any(len(p) > cap for p in prompts):
        raise CapacityError(f"generate: chunk {chunk} is more than the {cap} tokens the kernels take per prefill "
                            f"chunk; give chunk <= {cap}")
    eos = stop_ids(cfg.eos_token_id if isinstance(eos_token_id, int) and eos_token_id == -1 else eos_token_id)
    B = len(prompts)
    total = sum(len(p) for p in prompts) + B * max_new_tokens
    tokens: list[list[int]] = [[] for _ in range(B)]
    reasons = ["length"] * B
    prompt_logits = [] if keep_logits else None
    step_logits = [[] for _ in range(B)] if keep_logits else None
    res = GenerateResult(tokens, reasons, prompt_logits, step_logits)
    if mtp:
        from pto.models.deepseek_v4.mtp import generate_mtp
        generate_mtp(model, prompts, res, chunk=chunk, max_new_tokens=max_new_tokens, eos=eos,
                     keep_logits=keep_logits, drafts=drafts, reference=reference, progress=progress)
        return res
    states = []
    try:
        for _ in range(B):  # inside the try: a CapacityError part way returns the pages taken so far
            states.append(model.new_state())
        _run(model, prompts, states, res, chunk, max_new_tokens, eos, keep_logits, progress, total)
    finally:
        if hasattr(model, "release_state"):  # return the requests' cache pages
            for st in states:
                model.release_state(st)
    return res


def finite_logits(logits: torch.Tensor, what: str) -> torch.Tensor:
    """``logits`` (FP32, any shape: a ``[V]`` row or ``[T, V]``) if every value is finite, so no
    token is taken from a NaN row (``argmax`` of a NaN row is 0: a silent stream of token 0).

    Raises:
        CheckpointError: a NaN or infinite logit, naming ``what`` (the request and the step):
            the checkpoint's weights or config overflow the model's FP32 math.
    """
    if not bool(torch.isfinite(logits).all()):
        bad = int((~torch.isfinite(logits)).sum())
        raise CheckpointError(f"generate: {what}: {bad} of {logits.numel()} logits are NaN or infinite; the "
                              f"checkpoint's weights or config values overflow FP32 (no token is taken from them)")
    return logits


def _run(model, prompts, states, res, chunk, max_new_tokens, eos, keep_logits, progress, total):
    """The prefill and decode loops of :func:`generate` (fills ``res`` in place)."""
    tokens, reasons = res.tokens, res.stop_reasons
    prompt_logits, step_logits = res.prompt_logits, res.step_logits
    done = 0
    running = []
    with torch.no_grad():
        chunked = None
        if hasattr(model, "prefill_many"):  # every request's chunks in one call (EPModel: ranks in parallel)
            t0 = time.perf_counter()
            chunked = model.prefill_many(prompts, states, chunk)
            res.prefill_s += time.perf_counter() - t0
        for r, p in enumerate(prompts):
            t0 = time.perf_counter()
            parts = [] if chunked is None else chunked[r]
            for c0 in range(0, len(p), chunk):
                if chunked is None:
                    parts.append(model.forward(p[c0:c0 + chunk], states[r]))
                done += min(chunk, len(p) - c0)
                if progress:
                    progress(done, total, "prefill")
            res.prefill_s += time.perf_counter() - t0
            last = finite_logits(parts[-1][-1], f"request {r}, the prompt's last position")
            if keep_logits:
                prompt_logits.append(torch.cat(parts))
                step_logits[r].append(last)
            nxt = int(last.argmax())
            tokens[r].append(nxt)
            done += 1
            if nxt in eos:
                reasons[r] = "eos"
            elif max_new_tokens > 1:
                running.append(r)
        while running:
            t0 = time.perf_counter()
            feed = [tokens[r][-1] for r in running]
            if hasattr(model, "decode"):
                logits = model.decode(feed, [states[r] for r in running])
            else:
                logits = torch.stack([model.forward([t], states[r])[-1] for t, r in zip(feed, running)])
            res.decode_s += time.perf_counter() - t0
            res.decode_steps += 1
            still = []
            for row, r in enumerate(running):
                nxt = int(finite_logits(logits[row], f"request {r}, decode step {res.decode_steps}").argmax())
                tokens[r].append(nxt)
                done += 1
                if keep_logits:
                    step_logits[r].append(logits[row])
                if nxt in eos:
                    reasons[r] = "eos"
                elif len(tokens[r]) < max_new_tokens:
                    still.append(r)
            if progress:
                progress(done, total, "decode")
            running = still
    if progress:
        progress(total, total, "done")
