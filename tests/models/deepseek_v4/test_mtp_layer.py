"""The MTP layer program against its golden chain, and the kernel path's drafts against the
golden model's."""

import pytest
import torch

from pto.golden import run_jit
from pto.models.deepseek_v4.checkpoint import write_tiny_checkpoint
from pto.models.deepseek_v4.config import DeploymentConfig
from pto.models.deepseek_v4.layer import KernelModel
from pto.models.deepseek_v4.model import GoldenModel
from pto.models.deepseek_v4.mtp import MtpLayer
from pto.models.deepseek_v4.mtp_layer import build_case
from pto.models.deepseek_v4.model import LayerState
from pto.models.deepseek_v4.weights import Checkpoint


@pytest.mark.parametrize("mode,opts", [("decode", {}), ("decode", {"start_pos": (70, -1, 3, 0)}),
                                       ("prefill", {"T": 40, "num_tokens": 33, "start_pos": 50})])
def test_mtp_layer_matches_golden(mode, opts):
    cr = build_case("tiny", mode, **opts)
    res = run_jit(cr.fn, cr.specs, cr.golden, compare_fn=cr.compare, check=True)
    assert res.passed, res


def test_kernel_drafts_match_the_golden_mtp_layer(tmp_path):
    # the same prompt through the int8 kernel path and the int8 golden model: the MTP layer's
    # logits over the prompt agree within W8A8 / BF16 noise and give the same drafts
    ck = Checkpoint(write_tiny_checkpoint(tmp_path / "c", 0, mtp=True), "int8")
    dep = DeploymentConfig.sized(ck.config, 2, 128, block_size=16)
    km, gm = KernelModel(ck, dep), GoldenModel(ck, dep)
    ids = [5, 17, 300, 41, 9, 77, 2, 100, 3, 14, 250, 6]
    nxt = ids[1:] + [0]
    st = km.new_state()
    km.cache.reserve(st.rid, len(ids))
    pos = torch.arange(len(ids))
    k_main, X = km.step_hidden(torch.tensor(ids), [st.rid], pos, True)
    k_logits = MtpLayer(km).kernels(torch.tensor(nxt), X, [st.rid], pos, True)
    gst = gm.new_state()
    g_main, Xg = gm.forward_hidden(ids, gst)
    g_logits = MtpLayer(gm).golden(torch.tensor(nxt), Xg, pos, LayerState(kv=torch.zeros(0, ck.config.head_dim)))
    rel = float((k_logits - g_logits).norm() / g_logits.norm())
    rel_main = float((k_main - g_main).norm() / g_main.norm())
    print(rel, rel_main, (k_logits.argmax(-1) == g_logits.argmax(-1)).float().mean())
    assert rel < 0.05 and rel < 3 * rel_main, (rel, rel_main)  # one more layer of the same kernels
    assert (k_logits.argmax(-1) == g_logits.argmax(-1)).float().mean() >= 0.9
