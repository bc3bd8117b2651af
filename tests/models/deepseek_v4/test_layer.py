"""The layer programs (layer.py): one @pl.jit program per layer equals its attention block
and its MoE block run as separate programs, bit for bit, with exactly their tasks."""

import pytest
import torch

from pto.models.deepseek_v4.checkpoint import write_tiny_checkpoint
from pto.models.deepseek_v4.config import get_deployment
from pto.models.deepseek_v4.layer import KernelModel
from pto.models.deepseek_v4.moe import MOE_INPUTS, moe_kernels
from pto.models.deepseek_v4.prefill_attention_csa import csa_block_kernels
from pto.models.deepseek_v4.prefill_attention_hca import prefill_attention_hca_kernels
from pto.models.deepseek_v4.prefill_attention_swa import prefill_attention_swa_kernels
from pto.models.deepseek_v4.weights import open_checkpoint, orthonormal_hadamard
from pto.runtime import RunConfig


@pytest.fixture(scope="module")
def km(tmp_path_factory):
    d = write_tiny_checkpoint(tmp_path_factory.mktemp("layer") / "tiny", seed=5)
    return KernelModel(open_checkpoint(d, "int8"), get_deployment("tiny").replace(max_context=256, rope_max_pos=256))


def _csa_entry(cfg):
    return csa_block_kernels(cfg, "prefill").entry


@pytest.mark.parametrize("layer, fam, attn_entry", [
    (0, "swa", lambda cfg: prefill_attention_swa_kernels(cfg).prefill_attention_swa_test),
    (2, "csa", _csa_entry),
    (3, "hca", lambda cfg: prefill_attention_hca_kernels(cfg).prefill_attention_hca_test)])
def test_prefill_layer_equals_its_blocks(km, layer, fam, attn_entry):
    T = 20
    ids = torch.arange(3, 3 + T)
    pos = torch.arange(T)
    X = torch.randn(T, 4, 128, generator=torch.Generator().manual_seed(layer))
    rc = RunConfig(check=True, heap_bytes=1 << 28)
    cache0 = {k: v.clone() for k, v in km.cache.layers[layer].items()}
    rid = km.cache.add_request()
    km.cache.reserve(rid, T)
    args = km.layer_args(layer, [rid], pos, True)
    n_attn = len(args) - (len(MOE_INPUTS) - 2)
    attn, ffn = args[:n_attn], args[n_attn:]
    # the layer program (check mode: sanitizer and race checker)
    x_out = torch.empty_like(X)
    prog = getattr(km.programs, f"prefill_layer_{fam}").run(X, *args, ids, x_out, layer, T, config=rc)
    caches = {k: v.clone() for k, v in km.cache.layers[layer].items()}
    # the two blocks as separate programs on fresh caches
    for k, v in km.cache.layers[layer].items():
        v.copy_(cache0[k])
    x_mid = torch.empty_like(X)
    p1 = attn_entry(km.kcfg).run(X, *attn, x_mid, T, config=rc)
    x_ref = torch.empty_like(X)
    moe_args = list(ffn)
    moe_args.insert(MOE_INPUTS.index("input_ids") - 1, ids)
    p2 = moe_kernels(km.kcfg).moe_test.run(x_mid, *moe_args, x_ref, layer, T, config=rc)
    assert torch.equal(x_out, x_ref)
    assert all(torch.equal(caches[k], km.cache.layers[layer][k]) for k in caches)
    assert prog.stats.tasks == p1.stats.tasks + p2.stats.tasks
    km.cache.release(rid)


def test_forward_program_equals_layer_programs(tmp_path):
    """One prefill_fwd / decode_fwd program per step gives the per-layer programs' logits and
    caches bit for bit, with their tasks plus the inter-layer edges in one graph."""
    d = write_tiny_checkpoint(tmp_path / "tiny", seed=2)
    dep = get_deployment("tiny").replace(max_context=128, rope_max_pos=128)
    runs = []
    for per_layer in (False, True):
        km = KernelModel(open_checkpoint(d, "int8"), dep, per_layer=per_layer)
        st = [km.new_state(), km.new_state()]
        logits = [km.forward(list(range(5, 25)), st[0]), km.forward(list(range(7, 16)), st[1]),
                  km.decode([3, 4], st)]
        runs.append((logits, [{k: v.clone() for k, v in L.items()} for L in km.cache.layers], km.stats))
    (lf, cf, sf), (ll, cl, sl) = runs
    assert all(torch.equal(a, b) for a, b in zip(lf, ll))
    assert all(torch.equal(a[k], b[k]) for a, b in zip(cf, cl) for k in a)
    assert sf.programs == {"prefill_fwd": 2, "decode_fwd": 1}
    assert sf.tasks["decode_fwd"] == sum(sl.tasks[k] / sl.programs[k] * (2 if k.startswith("decode_layer") else 1)
                                         for k in sl.programs if k.startswith("decode_layer")) + 1 + 5
    assert sf.edges["decode_fwd"] > sum(sl.edges[k] / sl.programs[k] * 2 for k in sl.programs
                                        if k.startswith("decode_layer"))  # plus the edges between layers


def test_orthonormal_hadamard():
    h = orthonormal_hadamard(8)
    assert torch.allclose(h @ h.T, torch.eye(8), atol=1e-6)
    assert set((h * 8 ** 0.5).round().flatten().tolist()) == {-1.0, 1.0}


def _caches(model):
    return [{k: v.clone() for k, v in layer.items()} for layer in model.cache.layers]


@pytest.mark.parametrize("n, chunks, short", [
    (24, (24, 10), 9),
    pytest.param(150, (128, 100), 23, marks=pytest.mark.slow),
])
def test_kernel_path_chunks_resume_and_batches(tmp_path, n, chunks, short):
    """Prefill in chunks of two sizes (prefill-then-resume) gives the same logits, tokens and
    caches bit for bit; a batch of two prompts of different lengths gives each its own tokens."""
    from pto.models.deepseek_v4.generate import generate

    d = write_tiny_checkpoint(tmp_path / "tiny", seed=9)
    dep = get_deployment("tiny").replace(max_context=256, rope_max_pos=256)
    ids = torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(9)).tolist()
    runs = {}
    window = torch.arange(max(0, len(ids) - 64), len(ids))  # the raw rows the next token can still see
    for chunk in chunks:
        km = KernelModel(open_checkpoint(d, "int8"), dep)
        st = km.new_state()
        logits = torch.cat([km.forward(ids[c:c + chunk], st) for c in range(0, len(ids), chunk)])
        raw = [km.cache.kv_rows(i, st.rid, window) for i in range(6)]
        runs[chunk] = (logits, raw, _caches(km))
    (la, ra, ca), (lb, rb, cb) = runs[chunks[0]], runs[chunks[1]]
    assert torch.equal(la, lb)
    assert all(torch.equal(a, b) for a, b in zip(ra, rb))
    # compressed entries, indexer keys and compressor states sit on the same pages either way
    # (raw pages are returned as the window moves, so their physical places may differ)
    for a, b in zip(ca, cb):
        assert all(torch.equal(a[k], b[k]) for k in a if k != "kv")
    km = KernelModel(open_checkpoint(d, "int8"), dep)
    alone = generate(km, [ids], max_new_tokens=2, chunk=chunks[0], eos_token_id=None)
    one = generate(km, [ids[:short]], max_new_tokens=2, eos_token_id=None)
    both = generate(km, [ids, ids[:short]], max_new_tokens=2, chunk=chunks[0], eos_token_id=None)
    assert both.tokens == [alone.tokens[0], one.tokens[0]]
    assert not km.cache.requests


def test_layer_program_checks_shapes(km):
    from pto.errors import BindError

    T = 4
    X = torch.zeros(T, 4, 128)
    rid = km.cache.add_request()
    km.cache.reserve(rid, T)
    args = km.layer_args(0, [rid], torch.arange(T), True)
    args[4] = args[4][:, :-1]  # wq_a one column short
    with pytest.raises(BindError, match="wq_a"):
        km.programs.prefill_layer_swa.run(X, *args, torch.arange(T), torch.empty_like(X), 0, T)
    km.cache.release(rid)


@pytest.mark.parametrize("n", [12, pytest.param(140, marks=pytest.mark.slow)])
def test_forward_programs_pass_check_mode(tmp_path, n):
    """prefill_fwd / decode_fwd in check mode (definedness sanitizer and race checker over the
    whole step's graph) raise nothing and give the unchecked logits bit for bit; 140 tokens
    close an HCA window inside a chunk and prefill in two chunks."""
    d = write_tiny_checkpoint(tmp_path / "tiny", seed=6)
    dep = get_deployment("tiny").replace(max_context=256, rope_max_pos=256)
    ids = torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(6)).tolist()
    runs = []
    for check in (True, False):
        km = KernelModel(open_checkpoint(d, "int8"), dep, check=check)
        a, b = km.new_state(), km.new_state()
        runs.append([km.forward(ids[:128], a), *([km.forward(ids[128:], a)] if n > 128 else []),
                     km.forward(ids[:5], b), km.decode([3, 4], [a, b])])
    assert all(torch.equal(x, y) for x, y in zip(*runs))


def test_block_templates_default_on_same_logits_and_stats(tmp_path, monkeypatch):
    """KernelModel runs its programs with block templates unless told otherwise (or unless
    PTO_BLOCK_TEMPLATES is set): a 40-token prefill chunk (tasks of >= 24 blocks) and a decode
    step give the plain runs' logits, caches and statistics bit for bit, and templates ran."""
    from pto.runtime import blocks, block_templates_enabled

    monkeypatch.delenv("PTO_BLOCK_TEMPLATES", raising=False)
    d = write_tiny_checkpoint(tmp_path / "tiny", seed=3)
    dep = get_deployment("tiny").replace(max_context=128, rope_max_pos=128)
    ids = torch.randint(0, 512, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    runs = {}
    outside = block_templates_enabled()
    for flag in (None, False):
        km = KernelModel(open_checkpoint(d, "int8"), dep, block_templates=flag)
        assert km.block_templates is (flag is not False)
        before = blocks.template_info()["tasks"]
        st = km.new_state()
        logits = [km.forward(ids, st), km.decode([7], [st])]
        used = blocks.template_info()["tasks"] - before
        runs[flag] = (logits, _caches(km), km.stats, used)
        assert block_templates_enabled() is outside  # the switch holds for the model's runs only
    (la, ca, sa, ua), (lb, cb, sb, ub) = runs[None], runs[False]
    assert ua > 0 and ub == 0
    assert all(torch.equal(a, b) for a, b in zip(la, lb))
    assert all(torch.equal(a[k], b[k]) for a, b in zip(ca, cb) for k in a)
    assert (sa.programs, sa.tasks, sa.edges, sa.heap_peak_bytes) == (sb.programs, sb.tasks, sb.edges,
                                                                     sb.heap_peak_bytes)
    monkeypatch.setenv("PTO_BLOCK_TEMPLATES", "0")  # the environment decides: the global setting holds
    assert KernelModel(open_checkpoint(d, "int8"), dep).block_templates is None
    with pytest.raises(TypeError, match="block_templates"):
        KernelModel(open_checkpoint(d, "int8"), dep, block_templates="yes")
