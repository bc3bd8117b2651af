"""Multi-token prediction: the MTP draft layer and self-speculative greedy decoding.

The MTP layer (DeepSeek-V4-Flash ``inference/model.py`` ``MTPBlock``; pypto-lib
`models/deepseek/v4-flash/` ``mtp_projection.py``, ``decode_mtp.py``, ``prefill_mtp.py``) at
position ``p`` reads the main model's streams ``X_p`` (before ``hc_head``) and the embedding
of the token at ``p + 1``:

    x = mtp_projection(embed[t_{p+1}], X_p)       # e_proj(enorm(e)) + h_proj(hnorm(X))
    x = SWA attention + MoE of the MTP layer       # layer num_hidden_layers: ratio 0, learned routing
    draft_{p+2} = argmax head(norm(hc_head(x)))    # its own hc_head / norm, the shared head

at the main model's RoPE position ``p`` with its own sliding-window cache (``Cache.layers[L]``
on the kernel path, a :class:`LayerState` on the golden path).

Decoding (:func:`generate_mtp`): after the prefill, the MTP layer runs over every prompt
position (chunk by chunk, before the chunk is committed, so its window pages are still held)
and drafts ``d``. Each decode step feeds ``[t, d]`` at positions ``[p, p + 1]`` (the ``S = 2``
decode shape, ``T = 2B``): ``t' = argmax logits[p]``; the draft is accepted iff ``t' == d``
(then ``argmax logits[p + 1]`` is a second new token). A rejected draft's cache writes
(its raw kv row, compressor-state rows, a compressed entry it closed, indexer keys) are undone
from a snapshot taken before the step, so every cache equals plain greedy's. The MTP layer
then runs over the committed positions (one or two active rows) and drafts the next token.

Exactness: plain greedy in the same ``S = 2`` shape (the second token inactive, ``drafts=
"none"``) gives logits bit-identical to the MTP run's verify rows, because a row's result does
not depend on the other rows of the step; the tests find plain ``generate()`` (``S = 1``
steps through ``decode_fwd``) bit-identical too, so no plain run needs the ``S = 2`` shape.
The golden model (:class:`GoldenModel`, either weight format) verifies token by token (one
``S = 1`` forward for ``t``, a second for ``d`` only when accepted), so its tokens and logits
are plain greedy's by construction and its full-history cache never holds a rejected token.

Draft modes: ``"model"`` (the MTP layer's drafts), ``"accept"`` / ``"reject"`` (a plain greedy
run's next token / a token known to be wrong, from ``reference``; the MTP layer still runs so
its cache is kept), ``"none"`` (no draft: plain greedy in the ``S = 2`` shape).
"""

from __future__ import annotations

import time

import torch

from pto.errors import BindError, ConfigError
from pto.models.deepseek_v4.generate import finite_logits
from pto.models.deepseek_v4.lm_head import golden_final_logits
from pto.models.deepseek_v4.model import GoldenModel, LayerState
from pto.models.deepseek_v4.mtp_layer import mtp_layer_kernels
from pto.models.deepseek_v4.mtp_projection import golden_mtp_projection
from pto.models.deepseek_v4.qkv_proj_rope import quantize_weight_per_column
from pto.models.deepseek_v4.weights import QuantWeight

__all__ = ["DRAFT_MODES", "MtpLayer", "generate_mtp", "draft_rows"]

DRAFT_MODES = ("model", "accept", "reject", "none")


class MtpLayer:
    """The MTP layer of a :class:`GoldenModel` or :class:`KernelModel` (module docstring).

    Raises:
        ConfigError: the checkpoint has no MTP layer (``Checkpoint.has_mtp``).
    """

    def __init__(self, model):
        ckpt = model.ckpt
        if not getattr(ckpt, "has_mtp", False):
            raise ConfigError("mtp: the checkpoint has no MTP layer (mtp.0.* tensors with "
                              "num_nextn_predict_layers > 0; write one with 'pto checkpoint tiny --mtp')")
        self.model, self.cfg = model, model.cfg
        self.L = self.cfg.num_hidden_layers
        self.kernel = hasattr(model, "step_hidden")
        w = ckpt.layer(self.L)
        glob = ckpt.globals()
        self.w = w
        bf16 = torch.bfloat16
        if self.kernel:
            def proj(name):  # [in, out]: INT8 per output column (W8A8), or BF16 with unit scales
                w = ckpt.tensor(name).T.contiguous()
                if getattr(model, "weight_format", "int8") == "bf16":
                    return w.to(bf16), torch.ones(w.shape[1])
                return quantize_weight_per_column(w)
            ew, es = proj("mtp.0.e_proj.weight")
            hw, hs = proj("mtp.0.h_proj.weight")
            self.proj_w = [w["enorm.weight"].to(bf16), w["hnorm.weight"].to(bf16), ew, es, hw, hs]
            self.head_w = [w["hc_head_fn"], w["hc_head_scale"], w["hc_head_base"], w["norm.weight"].to(bf16),
                           glob["head.weight"].to(bf16)]
            self._programs = mtp_layer_kernels(model.kcfg)
        else:
            self.head_w = [w["hc_head_fn"], w["hc_head_scale"], w["hc_head_base"], w["norm.weight"],
                           glob["head.weight"]]

    # ---- golden ---------------------------------------------------------------------------
    def golden(self, ids_next: torch.Tensor, X: torch.Tensor, pos: torch.Tensor, st: LayerState) -> torch.Tensor:
        """Golden MTP layer: logits ``[S, V]`` FP32 from ``ids_next [S]`` and the main streams
        ``X [S, HC, D]`` at positions ``pos``; appends to the MTP layer's ``st``."""
        g: GoldenModel = self.model
        w = self.w

        def mat(leaf):
            q = w[leaf]
            return (q.codes.T, q.scale) if isinstance(q, QuantWeight) else (q.T, None)

        emb = g.embed(ids_next)[:, 0]
        x = golden_mtp_projection(emb, X, w["enorm.weight"], w["hnorm.weight"], *mat("e_proj.weight"),
                                  *mat("h_proj.weight"), self.cfg.rms_norm_eps)
        x = g.attn_sublayer(self.L, x, pos, st)
        x = g.ffn_sublayer(self.L, x, ids_next)
        return golden_final_logits(x, *self.head_w, self.cfg, float32=True)

    # ---- kernels ---------------------------------------------------------------------------
    def kernels(self, ids_next: torch.Tensor, X: torch.Tensor, rids: list[int], pos: torch.Tensor,
                prefill: bool) -> torch.Tensor:
        """MTP layer on the kernels, one program (``mtp_layer.mtp_{decode,prefill}_layer``:
        projection, the SWA layer body with the MTP weights and its cache layer, the MTP head);
        logits ``[T, V]`` FP32. The embedding rows are the shared BF16 table's."""
        m = self.model
        T = ids_next.numel()
        ids_next = ids_next.to(torch.int64)
        x_out = torch.empty_like(X)
        logits = torch.empty(T, self.cfg.vocab_size)
        phase = "prefill" if prefill else "decode"
        n_tok = [int((pos >= 0).sum())] if prefill else []
        m._run(f"mtp_{phase}_layer", getattr(self._programs, f"mtp_{phase}_layer"), m._embed_w[ids_next], X,
               *self.proj_w, *m.layer_args(self.L, rids, pos, prefill), ids_next, *self.head_w, x_out, logits,
               *n_tok)
        return logits


def draft_rows(model, rid: int, q: int) -> list[tuple[torch.Tensor, int]]:
    """Every cache row the main model's decode writes for request ``rid`` at position ``q``:
    ``(flat tensor view, row)`` pairs -- the raw kv row of every layer, the compressor-state
    rows and, when ``q`` closes a window, the compressed entry (and the indexer's key and
    scale) of CSA / HCA layers (module ``cache`` docstring)."""
    c, out = model.cache, []
    pos = torch.tensor([q])

    def add(t: torch.Tensor, kind: str):
        row = int(c.slot_mapping(rid, pos, kind)[0])
        if row >= 0:
            out.append((t.reshape(-1, t.shape[-1]), row))

    for i, ratio in enumerate(model.cfg.compress_ratios):
        lay = c.layers[i]
        add(lay["kv"], "swa_kv")
        if ratio == 4:
            for k in ("state", "idx_state"):
                add(lay[k], "csa_state")
            for k in ("cmp_kv", "idx_kv", "idx_kv_scale"):
                add(lay[k], "csa_cmp")
        elif ratio == 128:
            add(lay["state"], "hca_state")
            add(lay["cmp_kv"], "hca_cmp")
    return out


def _check_reference(reference, B: int, max_new_tokens: int, drafts: str) -> None:
    if drafts not in DRAFT_MODES:
        raise BindError(f"generate: mtp drafts must be one of {DRAFT_MODES}, got {drafts!r}")
    if drafts in ("accept", "reject"):
        if reference is None or len(reference) != B or any(len(r) < max_new_tokens for r in reference):
            raise BindError(f"generate: drafts={drafts!r} needs reference= the plain greedy tokens of each of "
                            f"the {B} requests ({max_new_tokens} each)")


def generate_mtp(model, prompts: list[list[int]], res, *, chunk: int, max_new_tokens: int, eos,
                 keep_logits: bool, drafts: str = "model", reference=None, progress=None) -> None:
    """Greedy decoding with MTP drafts (module docstring); fills ``res`` (a
    :class:`GenerateResult`) in place: tokens, stop reasons, logits, timings, ``decode_steps``,
    ``mtp_drafts`` / ``mtp_accepted``. ``eos``: the stop token ids (a set:
    :func:`~pto.models.deepseek_v4.generate.stop_ids`; empty: never stop early).

    Raises:
        BindError: a bad ``drafts`` mode or ``reference``. ConfigError: no MTP layer (except
            ``drafts="none"`` on the kernel path), or an expert-parallel model.
    """
    B = len(prompts)
    _check_reference(reference, B, max_new_tokens, drafts)
    if getattr(model, "ep", 1) > 1:  # EPModel: its MoE runs across ranks, step_hidden does not
        raise ConfigError("generate: mtp=True with expert parallelism (--ep) is not supported yet")
    kernel = hasattr(model, "step_hidden")
    mtp = MtpLayer(model) if (drafts != "none" or not kernel) else None
    if not kernel and drafts == "none":
        raise BindError("generate: drafts='none' (the S = 2 decode shape) is a kernel-path mode")
    V = model.cfg.vocab_size
    states = []
    mtp_st = [LayerState(kv=torch.zeros(0, model.cfg.head_dim)) for _ in range(B)]
    tokens, reasons = res.tokens, res.stop_reasons
    total = sum(len(p) for p in prompts) + B * max_new_tokens
    done = 0

    def want_draft(r, k):  # the draft for request r's new token k (0-based), by mode
        if drafts == "accept":
            return reference[r][k]
        if drafts == "reject":
            return (reference[r][k] + 1) % V
        return None

    draft = [None] * B
    running = []
    try:
        for _ in range(B):  # inside the try: a CapacityError part way returns the pages taken so far
            states.append(model.new_state())
        with torch.no_grad():
            for r, p in enumerate(prompts):  # ---- prefill, the MTP layer chunk by chunk
                t0 = time.perf_counter()
                parts, hidden = [], []
                chunks = list(range(0, len(p), chunk))
                for ci, c0 in enumerate(chunks):
                    ids = p[c0:c0 + chunk]
                    if kernel:
                        st = states[r]
                        idt = model.golden.check_ids(ids, st)
                        S = idt.numel()
                        model.cache.reserve(st.rid, S)
                        pos = torch.arange(st.pos, st.pos + S)
                        logits, X = model.step_hidden(idt, [st.rid], pos, True)
                        nxt = p[c0 + chunk] if ci + 1 < len(chunks) else int(logits[-1].argmax())
                        if mtp is not None:
                            ml = mtp.kernels(torch.tensor(ids[1:] + [nxt]), X, [st.rid], pos, True)
                        model.cache.commit(st.rid, S)
                        st.pos += S
                    else:
                        logits, X = model.forward_hidden(ids, states[r])
                        hidden.append(X)
                    parts.append(logits)
                    done += len(ids)
                    if progress:
                        progress(done, total, "prefill")
                if not kernel:  # the golden MTP layer over the whole prompt (full-history cache)
                    nxt = int(parts[-1][-1].argmax())
                    ml = mtp.golden(torch.tensor(p[1:] + [nxt]), torch.cat(hidden), torch.arange(len(p)), mtp_st[r])
                res.prefill_s += time.perf_counter() - t0
                last = finite_logits(parts[-1][-1], f"request {r}, the prompt's last position")
                if keep_logits:
                    res.prompt_logits.append(torch.cat(parts))
                    res.step_logits[r].append(last)
                nxt = int(last.argmax())
                tokens[r].append(nxt)
                done += 1
                if mtp is not None:
                    draft[r] = int(ml[-1].argmax())
                if nxt in eos:
                    reasons[r] = "eos"
                elif max_new_tokens > 1:
                    running.append(r)
            while running:  # ---- decode steps
                t0 = time.perf_counter()
                for r in running:
                    forced = want_draft(r, len(tokens[r]))
                    if forced is not None:
                        draft[r] = forced
                    if len(tokens[r]) + 1 >= max_new_tokens:  # no room for a second token
                        draft[r] = None
                if kernel:
                    new = _kernel_step(model, mtp, [states[r] for r in running], [tokens[r][-1] for r in running],
                                       [draft[r] if drafts != "none" else None for r in running])
                else:
                    new = [_golden_step(model, mtp, states[r], mtp_st[r], tokens[r][-1], draft[r]) for r in running]
                res.decode_s += time.perf_counter() - t0
                res.decode_steps += 1
                still = []
                for (got, rows, nd), r in zip(new, running):
                    kept = 0
                    for tok, row in zip(got, rows):
                        if reasons[r] == "eos" or len(tokens[r]) >= max_new_tokens:
                            break
                        finite_logits(row, f"request {r}, decode step {res.decode_steps}")
                        tokens[r].append(tok)
                        kept += 1
                        done += 1
                        if keep_logits:
                            res.step_logits[r].append(row)
                        if tok in eos:
                            reasons[r] = "eos"
                    if draft[r] is not None:  # accepted: the draft's token was kept (not cut by an eos before it)
                        res.mtp_drafts += 1
                        res.mtp_accepted += max(0, kept - 1)
                    draft[r] = nd
                    if reasons[r] != "eos" and len(tokens[r]) < max_new_tokens:
                        still.append(r)
                if progress:
                    progress(done, total, "decode")
                running = still
    finally:
        if hasattr(model, "release_state"):
            for st in states:
                model.release_state(st)
    if progress:
        progress(total, total, "done")


def _golden_step(model, mtp: MtpLayer, st, mst: LayerState, tok: int, draft):
    """One golden decode step: ``t`` (and the draft only if it is accepted), token by token;
    then the MTP layer over the committed positions. Returns ``(new tokens, their logits
    rows, next draft)``."""
    p = st.pos
    logits, X = model.forward_hidden([tok], st)
    got, rows, hid = [int(logits[0].argmax())], [logits[0]], [X]
    if draft is not None and got[0] == draft:
        l2, X2 = model.forward_hidden([draft], st)
        got.append(int(l2[0].argmax()))
        rows.append(l2[0])
        hid.append(X2)
    n = len(got)
    ml = mtp.golden(torch.tensor(got), torch.cat(hid), torch.arange(p, p + n), mst)
    return got, rows, int(ml[-1].argmax())


def _kernel_step(model, mtp, states, toks: list[int], drafts: list):
    """One kernel decode step of ``B`` requests in the ``S = 2`` shape: rows ``[t, d]`` per
    request (``d`` inactive when None); verify, undo a rejected draft's cache rows, the MTP
    layer over the committed rows, commit. Returns per request ``(new tokens, logits rows,
    next draft or None)``."""
    g = model.golden
    ids, pos = [], []
    for st, t, d in zip(states, toks, drafts):
        g.check_ids([t] if d is None else [t, d], st)
        ids += [t, t if d is None else d]
        pos += [st.pos, -1 if d is None else st.pos + 1]
    rids = [st.rid for st in states]
    for st in states:
        model.cache.reserve(st.rid, 2)
    saved = [[(v, row, v[row].clone()) for v, row in draft_rows(model, st.rid, st.pos + 1)]
             if d is not None else [] for st, d in zip(states, drafts)]
    pos_t = torch.tensor(pos)
    logits, X = model.step_hidden(torch.tensor(ids), rids, pos_t, False)
    out, m_ids, m_pos = [], [], []
    for b, (st, d) in enumerate(zip(states, drafts)):
        first = int(logits[2 * b].argmax())
        if d is not None and first == d:
            got, rows = [first, int(logits[2 * b + 1].argmax())], [logits[2 * b], logits[2 * b + 1]]
        else:
            got, rows = [first], [logits[2 * b]]
            for v, row, old in saved[b]:  # undo the rejected draft's writes
                v[row] = old
        out.append((got, rows))
        m_ids += [got[0], got[1] if len(got) > 1 else got[0]]
        m_pos += [st.pos, st.pos + 1 if len(got) > 1 else -1]
    nd = [None] * len(states)
    if mtp is not None:
        ml = mtp.kernels(torch.tensor(m_ids), X, rids, torch.tensor(m_pos), False)
        nd = [int(ml[2 * b + len(got) - 1].argmax()) for b, (got, _) in enumerate(out)]
    for st, (got, _) in zip(states, out):
        model.cache.commit(st.rid, len(got))
        st.pos += len(got)
    return [(got, rows, n) for (got, rows), n in zip(out, nd)]
