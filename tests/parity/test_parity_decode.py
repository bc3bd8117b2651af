"""Parity of the SWA and HCA decode goldens with transformers running with its cache.

transformers (``past_key_values``, a ``DynamicCache`` of sliding / HCA layers) prefills the
first :data:`PREFILL` = 380 tokens of the tiny checkpoint's sequence, then decodes 8 tokens one
at a time (positions 380..387; a second run decodes them two at a time, S = 2, so that 383
closes the window as the second token of its step), so the HCA window 256..383 closes inside
the decode, at position 383 (transformers `models/deepseek_v4/modeling_deepseek_v4.py`: the entry is emitted once its window is complete, rotated at
its start 256). Forward hooks record, per layer and step, the attention input streams
(``attn_hc`` input), the ``self_attn`` output and the stream after hc_post (``ffn_hc``
input), and for HCA layers the compressor's running entry list.

On the pto side the same layer runs as a serving stack would: one golden prefill of the 380
tokens (``golden_prefill_attention_swa`` / ``_hca``) into paged FP32 caches (raw kv pool,
compressor state ring, compressed pool), then 8 ``golden_decode_attention_swa`` / ``_hca``
steps (B = 1, S = 1; or 4 steps with S = 2) that read and update those caches. Each step is fed HF's input streams
of that step, so layers are compared one at a time. Compared per step: ``attn_out`` and
``x_out``; for HCA layers also the compressed row the decode writes at position 383.

Numerics: ``weight_format="bf16"`` (unquantised) and ``float32=True`` (no BF16 rounding);
FP32 on both sides, summation orders differ (HF dense masked logits, the golden gathered
keys in tiles). Bounds atol = rtol = 1e-4 as test_parity_swa.

A last test runs the DSL kernels themselves the same way (prefill chunks of 128, 128 and 124
tokens, then the 8 decode steps, BF16 caches, W8A8 q-b / o-b) and bounds their distance to
transformers by quantisation noise: relative RMS of the stream after hc_post <= 1% and of the
attention's share of it (``post * attn_out``) <= 3% (measured 0.15-0.30% and 1.0-1.6%); the
HCA row written at 383 within 2% (measured 0.5%).
"""

import pytest
import torch

from pto.models.deepseek_v4.decode_attention_hca import golden_decode_attention_hca
from pto.models.deepseek_v4.decode_attention_swa import golden_decode_attention_swa
from pto.models.deepseek_v4.decode_metadata import decode_positions, page_rows
from pto.models.deepseek_v4.prefill_attention_hca import golden_prefill_attention_hca
from pto.models.deepseek_v4.prefill_attention_swa import golden_prefill_attention_swa
from pto.models.deepseek_v4.rope import rope_tables

ATOL = 1e-4
RTOL = 1e-4
PREFILL = 380
STEPS = 8
M = 128


def _hf_cached_run(hf_run, S: int) -> dict:
    """HF prefill of PREFILL tokens with a cache, then STEPS / S decode steps of S tokens;
    returns ``{module name: [capture per call]}`` (call 0 = the prefill, call k = step k)."""
    model, ids = hf_run.model, hf_run.input_ids[:, :PREFILL + STEPS]
    calls: dict[str, list] = {}
    wanted = []
    for L in range(hf_run.cfg.num_hidden_layers):
        p = f"model.layers.{L}"
        wanted += [f"{p}.attn_hc", f"{p}.self_attn", f"{p}.ffn_hc", f"{p}.self_attn.compressor"]
    mods = dict(model.named_modules())
    handles = []
    for name in wanted:
        if name not in mods:
            continue

        def hook(mod, args, kwargs, output, _name=name):
            calls.setdefault(_name, []).append((tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a
                                                      for a in args),
                                                output[0].detach().clone()))

        handles.append(mods[name].register_forward_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            out = model(input_ids=ids[:, :PREFILL], use_cache=True)
            cache = out.past_key_values
            for p0 in range(PREFILL, PREFILL + STEPS, S):
                out = model(input_ids=ids[:, p0:p0 + S], past_key_values=cache, use_cache=True)
                cache = out.past_key_values
    finally:
        for h in handles:
            h.remove()
    return calls


@pytest.fixture(scope="module")
def hf_decode(hf_run):
    """:func:`_hf_cached_run` with single-token steps."""
    return _hf_cached_run(hf_run, 1)


@pytest.fixture(scope="module")
def hf_decode2(hf_run):
    """:func:`_hf_cached_run` with two-token steps (382, 383 is one step: the second token
    closes the HCA window)."""
    return _hf_cached_run(hf_run, 2)


def _layer_inputs(hf_run, layer: int, profile: str) -> dict:
    """Weights of ``layer`` in golden layout (as ParityRun.swa_inputs) with FP32 caches and
    identity page tables sized for PREFILL + STEPS tokens."""
    cfg = hf_run.cfg
    a = f"model.layers.{layer}.self_attn"
    q = hf_run.qkv_args(layer)
    hc = hf_run.hc_args(layer, "attn")
    G, Lo = cfg.o_groups, cfg.o_lora_rank
    cos, sin = rope_tables(cfg, profile, max_pos=PREFILL + STEPS)
    blk = torch.arange(cfg.max_blocks_per_seq)
    return {
        "hc_attn_fn": hc["hc_fn"], "hc_attn_scale": hc["hc_scale"], "hc_attn_base": hc["hc_base"],
        "attn_norm_w": hf_run.param(f"model.layers.{layer}.input_layernorm.weight"),
        "wq_a": q["wq_a"], "wq_b": q["wq_b"], "wq_b_scale": None, "wkv": q["wkv"],
        "gamma_cq": q["gamma_cq"], "gamma_ckv": q["gamma_ckv"], "freqs_cos": cos, "freqs_sin": sin,
        "kv_cache": torch.zeros(cfg.ori_kv_block_num, cfg.block_size, 1, cfg.head_dim),
        "block_table": torch.where(blk < cfg.ori_kv_block_num, blk, -1).to(torch.int32),
        "attn_sink": hf_run.param(f"{a}.sinks"),
        "wo_a": hf_run.param(f"{a}.o_a_proj.weight").view(G, Lo, -1),
        "wo_b": hf_run.param(f"{a}.o_b_proj.weight"), "wo_b_scale": None,
    }


def _hf_step(hf_decode, layer: int, k: int):
    """(x_hc [S, hc, D], attn_out [S, D], stream after hc_post [S, hc, D]) of call ``k``."""
    p = f"model.layers.{layer}"
    x_hc = hf_decode[f"{p}.attn_hc"][k][0][0][0]
    return x_hc, hf_decode[f"{p}.self_attn"][k][1][0], hf_decode[f"{p}.ffn_hc"][k][0][0][0]


@pytest.mark.parametrize("S", [1, 2], ids=["S1", "S2"])
@pytest.mark.parametrize("layer", [0, 1], ids=["L0", "L1"])
def test_swa_decode_with_cache_matches_transformers(hf_run, hf_decode, hf_decode2, layer, S):
    cfg = hf_run.cfg
    hf_calls = hf_decode if S == 1 else hf_decode2
    d = _layer_inputs(hf_run, layer, "main")
    x_hc, _, _ = _hf_step(hf_calls, layer, 0)
    pos = torch.arange(PREFILL)
    d.update(x_hc=x_hc, ori_slot_mapping=pos.to(torch.int64), position_ids=pos.to(torch.int32), num_tokens=PREFILL)
    cache, _ = golden_prefill_attention_swa(d, cfg, weight_format="bf16", float32=True)
    table = d["block_table"][None, :]
    for k in range(1, STEPS // S + 1):
        x_hc, attn_hf, stream_hf = _hf_step(hf_calls, layer, k)
        p = decode_positions([PREFILL + (k - 1) * S], S)
        step = dict(d, x_hc=x_hc, kv_cache=cache, block_table=table, position_ids=p,
                    ori_slot_mapping=page_rows(p, table, cfg.block_size, cfg.ori_kv_block_num))
        cache, x_out, mids = golden_decode_attention_swa(step, cfg, weight_format="bf16", float32=True,
                                                         return_intermediates=True)
        assert (mids["swa_indices"] >= 0).sum(dim=1).tolist() == [cfg.sliding_window] * S  # full, self included
        hf_run.compare(f"swa L{layer} S={S} decode step {k} attn_out", mids["attn_out"], attn_hf, atol=ATOL,
                       rtol=RTOL)
        hf_run.compare(f"swa L{layer} S={S} decode step {k} x_out", x_out, stream_hf, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("S", [1, 2], ids=["S1", "S2"])
@pytest.mark.parametrize("layer", [3, 5], ids=["L3", "L5"])
def test_hca_decode_with_cache_matches_transformers(hf_run, hf_decode, hf_decode2, layer, S):
    cfg = hf_run.cfg
    hf_calls = hf_decode if S == 1 else hf_decode2
    c = f"model.layers.{layer}.self_attn.compressor"
    d = _layer_inputs(hf_run, layer, "compress")
    page, spages, cpages = cfg.hca_state_block_size, cfg.hca_state_block_num, cfg.cmp_kv_block_num
    d.update(cmp_wkv=hf_run.param(f"{c}.kv_proj.weight"), cmp_wgate=hf_run.param(f"{c}.gate_proj.weight"),
             cmp_ape=hf_run.param(f"{c}.position_bias"), cmp_norm_w=hf_run.param(f"{c}.kv_norm.weight"),
             compress_state=torch.zeros(spages, page, 2 * cfg.head_dim),
             cmp_kv=torch.zeros(cpages, cfg.block_size, 1, cfg.head_dim))
    state_table = (torch.arange(cfg.max_position_embeddings // page) % spages).to(torch.int32)
    cmp_table = torch.arange(cpages, dtype=torch.int32)

    def slots(pos):
        closes = (pos + 1) % M == 0
        cmp_slot = torch.where(closes, pos // M, -1).to(torch.int64)  # entry w at flat row w
        return cmp_slot, (state_table.long()[pos // page] * page + pos % page)

    x_hc, _, _ = _hf_step(hf_calls, layer, 0)
    pos = torch.arange(PREFILL)
    cmp_slot, state_slot = slots(pos)
    d.update(x_hc=x_hc, ori_slot_mapping=pos.to(torch.int64), position_ids=pos.to(torch.int32), num_tokens=PREFILL,
             state_block_table=state_table, cmp_block_table=cmp_table, cmp_slot_mapping=cmp_slot,
             state_slot_mapping=state_slot)
    cache, cmp_kv, state, _ = golden_prefill_attention_hca(d, cfg, weight_format="bf16", float32=True)
    assert int(cmp_kv.reshape(-1, cfg.head_dim).abs().sum(dim=1).gt(0).sum()) == PREFILL // M  # entries 0, 1
    tables = {n: d[n][None, :] for n in ("block_table", "state_block_table", "cmp_block_table")}
    for k in range(1, STEPS // S + 1):
        x_hc, attn_hf, stream_hf = _hf_step(hf_calls, layer, k)
        p = decode_positions([PREFILL + (k - 1) * S], S)
        cmp_slot, state_slot = slots(p.long())
        step = dict(d, **tables, x_hc=x_hc, kv_cache=cache, cmp_kv=cmp_kv, compress_state=state, position_ids=p,
                    ori_slot_mapping=page_rows(p, tables["block_table"], cfg.block_size, cfg.ori_kv_block_num),
                    cmp_slot_mapping=cmp_slot, state_slot_mapping=state_slot)
        cache, new_cmp, state, x_out, mids = golden_decode_attention_hca(step, cfg, weight_format="bf16",
                                                                         float32=True, return_intermediates=True)
        written = (new_cmp != cmp_kv).any(dim=-1).flatten().nonzero().flatten().tolist()
        cmp_kv = new_cmp
        entries_hf = hf_calls[c][k][1][0, 0]  # [T, d] every entry emitted so far
        assert written == ([2] if 383 in p.tolist() else [])  # the closing step writes exactly entry 2
        assert entries_hf.shape[0] == (int(p[-1]) + 1) // M
        # each token sees its own count: with S = 2 at 382, 383 the first sees 2 entries, the second 3
        assert (mids["cmp_indices"] >= 0).sum(dim=1).tolist() == ((p.long() + 1) // M).tolist()
        if written:
            hf_run.compare(f"hca L{layer} S={S} decode compressed row 2 (pos 383)",
                           cmp_kv.reshape(-1, cfg.head_dim)[2], entries_hf[2], atol=ATOL, rtol=RTOL)
        hf_run.compare(f"hca L{layer} S={S} decode step {k} attn_out", mids["attn_out"], attn_hf, atol=ATOL,
                       rtol=RTOL)
        hf_run.compare(f"hca L{layer} S={S} decode step {k} x_out", x_out, stream_hf, atol=ATOL, rtol=RTOL)
    # the compressed rows matter: zeroing them moves the last step far outside the tolerance
    no_cmp = dict(step, cmp_kv=torch.zeros_like(step["cmp_kv"]))
    *_, mids0 = golden_decode_attention_hca(no_cmp, cfg, weight_format="bf16", float32=True, return_intermediates=True)
    assert (mids0["attn_out"] - attn_hf).abs().max() > 100 * ATOL


KERNEL_REL_RMS = 1e-2  # x_out, as test_parity_swa's kernel-numerics bound
KERNEL_SHARE_REL_RMS = 3e-2  # post * attn_out alone (test_parity_swa: attn_out 2e-2 at prefill)


def _kernel_inputs(d: dict) -> dict:
    """FP32 parity inputs cast the way the kernels take them: BF16 weights, tables, norms and
    caches, W8A8 q-b / o-b (pypto-lib `models/deepseek/v4-flash/` INT8 conventions); FP32 hc parameters, sink, ape, state."""
    from pto.models.deepseek_v4.prefill_sparse_attn import quantize_wo_b
    from pto.models.deepseek_v4.qkv_proj_rope import quantize_weight_per_column
    bf16 = torch.bfloat16
    e = dict(d)
    for k in ("wq_a", "wkv", "attn_norm_w", "gamma_cq", "gamma_ckv", "wo_a", "freqs_cos", "freqs_sin", "kv_cache",
              "cmp_wkv", "cmp_wgate", "cmp_norm_w", "cmp_kv"):
        if k in e:
            e[k] = d[k].to(bf16)
    e["wq_b"], e["wq_b_scale"] = quantize_weight_per_column(d["wq_b"])
    e["wo_b"], e["wo_b_scale"] = quantize_wo_b(d["wo_b"])
    return e


@pytest.mark.parametrize("layer", [1, 3], ids=["L1-swa", "L3-hca"])
def test_dsl_kernels_prefill_chunks_then_decode_within_quantisation_noise(hf_run, hf_decode, layer):
    """The DSL kernels as a serving stack runs them: three prefill chunks (128, 128, 124 tokens)
    then 8 decode steps on paged BF16 caches, W8A8; every decode step's stream after hc_post
    within 1% relative RMS of transformers (and the HCA row written at 383 within 2%)."""
    import pto
    from pto.models.deepseek_v4.hc_post import golden_hc_post
    from pto.models.deepseek_v4.hc_pre import golden_hc_pre
    from pto.models.deepseek_v4.decode_attention_hca import HCA_ARGS, decode_attention_hca_kernels
    from pto.models.deepseek_v4.decode_attention_swa import SWA_ARGS, decode_attention_swa_kernels
    from pto.models.deepseek_v4.prefill_attention_hca import PREFILL_HCA_ARGS, prefill_attention_hca_kernels
    from pto.models.deepseek_v4.prefill_attention_swa import prefill_attention_swa_kernels

    cfg, hca = hf_run.cfg, layer == 3
    d = _layer_inputs(hf_run, layer, "compress" if hca else "main")
    d["freqs_cos"], d["freqs_sin"] = rope_tables(cfg, "compress" if hca else "main")  # the kernels take full tables
    page, spages, cpages = cfg.hca_state_block_size, cfg.hca_state_block_num, cfg.cmp_kv_block_num
    state_table = (torch.arange(cfg.max_position_embeddings // page) % spages).to(torch.int32)
    if hca:
        c = f"model.layers.{layer}.self_attn.compressor"
        d.update(cmp_wkv=hf_run.param(f"{c}.kv_proj.weight"), cmp_wgate=hf_run.param(f"{c}.gate_proj.weight"),
                 cmp_ape=hf_run.param(f"{c}.position_bias"), cmp_norm_w=hf_run.param(f"{c}.kv_norm.weight"),
                 compress_state=torch.zeros(spages, page, 2 * cfg.head_dim),
                 cmp_kv=torch.zeros(cpages, cfg.block_size, 1, cfg.head_dim),
                 state_block_table=state_table, cmp_block_table=torch.arange(cpages, dtype=torch.int32))
    d = _kernel_inputs(d)
    mutable = ("kv_cache", "cmp_kv", "compress_state") if hca else ("kv_cache",)
    state = {n: d[n].clone() for n in mutable}
    run_cfg = pto.RunConfig(check=False)

    def slots(pos):
        return {"ori_slot_mapping": pos.long(), "position_ids": pos.to(torch.int32),
                "cmp_slot_mapping": torch.where((pos + 1) % M == 0, pos // M, -1).long(),
                "state_slot_mapping": state_table.long()[pos // page] * page + pos % page}

    x_all = _hf_step(hf_decode, layer, 0)[0]
    for lo in (0, 128, 256):  # prefill chunks of at most 128 tokens (the kernels' token capacity)
        hi = min(lo + 128, PREFILL)
        step = dict(d, **state, **slots(torch.arange(lo, hi)), x_hc=x_all[lo:hi].contiguous())
        x_out = torch.zeros_like(step["x_hc"])
        if hca:
            prefill_attention_hca_kernels(cfg).prefill_attention_hca_test.run(
                *[step[n] for n in PREFILL_HCA_ARGS], x_out, hi - lo, config=run_cfg)
        else:
            prefill_attention_swa_kernels(cfg).prefill_attention_swa_test.run(
                *[step[n] for n in SWA_ARGS], x_out, hi - lo, config=run_cfg)
    tables = {n: d[n][None, :] for n in ("block_table", "state_block_table", "cmp_block_table") if n in d}
    for k in range(1, STEPS + 1):
        x_hc, _, stream_hf = _hf_step(hf_decode, layer, k)
        step = dict(d, **state, **tables, **slots(torch.tensor([PREFILL + k - 1])), x_hc=x_hc.contiguous())
        x_out = torch.zeros_like(x_hc)
        if hca:
            decode_attention_hca_kernels(cfg).decode_attention_hca_test.run(*[step[n] for n in HCA_ARGS], x_out,
                                                                            config=run_cfg)
        else:
            decode_attention_swa_kernels(cfg).decode_attention_swa_test.run(*[step[n] for n in SWA_ARGS], x_out,
                                                                            config=run_cfg)
        w = stream_hf.double()
        rel_rms = float((x_out.double() - w).norm() / w.norm())
        # the attention's own share of the stream: minus the residual mix sum_i comb[i, j] X_i
        _, post, comb = golden_hc_pre(x_hc, d["hc_attn_fn"], d["hc_attn_scale"], d["hc_attn_base"], cfg,
                                      out_bf16=False)
        mix = golden_hc_post(torch.zeros(x_hc.shape[0], cfg.hidden_size), x_hc, post, comb).double()
        share = float(((x_out.double() - mix) - (w - mix)).norm() / (w - mix).norm())
        print(f"[parity] L{layer} DSL kernels decode step {k} x_out: rel_rms={rel_rms:.3e} "
              f"(tol {KERNEL_REL_RMS:g}), attention share rel_rms={share:.3e} (tol {KERNEL_SHARE_REL_RMS:g})")
        assert rel_rms <= KERNEL_REL_RMS and share <= KERNEL_SHARE_REL_RMS
    if hca:
        row = state["cmp_kv"].reshape(-1, cfg.head_dim)[2].double()
        want = hf_decode[f"model.layers.{layer}.self_attn.compressor"][STEPS][1][0, 0, 2].double()
        rel = float((row - want).norm() / want.norm())
        print(f"[parity] L{layer} DSL kernels compressed row 2 (pos 383): rel_rms={rel:.3e}")
        assert rel <= 2e-2
