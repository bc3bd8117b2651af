"""The layer programs (layer.py): one @pl.jit program per layer equals its attention block
and its MoE block run as separate programs, bit for bit, with exactly their tasks."""

import pytest
import torch

from pto.models.deepseek_v4.checkpoint import write_tiny_checkpoint
from pto.models.deepseek_v4.config import get_deployment
from pto.models.deepseek_v4.layer import KernelModel
from pto.models.deepseek_v4.moe import moe_kernels
from pto.models.deepseek_v4.layer import orthonormal_hadamard
from pto.models.deepseek_v4.prefill_attention_csa import csa_block_kernels
from pto.models.deepseek_v4.prefill_attention_hca import prefill_attention_hca_kernels
from pto.models.deepseek_v4.prefill_attention_swa import prefill_attention_swa_kernels
from pto.models.deepseek_v4.weights import open_checkpoint
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
    X = km._embed_ids(ids)
    rc = RunConfig(check=True, heap_bytes=1 << 28)
    cache0 = {k: v.clone() for k, v in km.cache.layers[layer].items()}
    rid = km.cache.add_request()
    km.cache.reserve(rid, T)
    attn = km._attn_args(layer, X, [rid], pos, True)
    ffn = km._ffn_args(layer, ids)
    # the layer program (check mode: sanitizer and race checker)
    x_out = torch.empty_like(X)
    prog = getattr(km._layers, f"prefill_layer_{fam}").run(*attn, *ffn, x_out, layer, T, config=rc)
    caches = {k: v.clone() for k, v in km.cache.layers[layer].items()}
    # the two blocks as separate programs on fresh caches
    for k, v in km.cache.layers[layer].items():
        v.copy_(cache0[k])
    x_mid = torch.empty_like(X)
    p1 = attn_entry(km.kcfg).run(*attn, x_mid, T, config=rc)
    x_ref = torch.empty_like(X)
    p2 = moe_kernels(km.kcfg).moe_test.run(x_mid, *ffn, x_ref, layer, T, config=rc)
    assert torch.equal(x_out, x_ref)
    assert all(torch.equal(caches[k], km.cache.layers[layer][k]) for k in caches)
    assert prog.stats.tasks == p1.stats.tasks + p2.stats.tasks
    km.cache.release(rid)


def test_orthonormal_hadamard():
    h = orthonormal_hadamard(8)
    assert torch.allclose(h @ h.T, torch.eye(8), atol=1e-6)
    assert set((h * 8 ** 0.5).round().flatten().tolist()) == {-1.0, 1.0}
