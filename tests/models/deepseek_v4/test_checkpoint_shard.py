"""Reading part of a checkpoint: row ranges of a tensor (float, FP8 blocks, FP4 experts) equal
the rows of the whole tensor; an expert-parallel shard stacks only its experts and reads only its
vocabulary rows of the head; globals are read on first use but checked at once; ranks agree on a
failed load (World.agree)."""

import pytest
import torch
from safetensors.torch import load_file, save_file

import pto
from pto.models.deepseek_v4.checkpoint import write_tiny_checkpoint
from pto.models.deepseek_v4.weights import moe_inputs, open_checkpoint
from pto.runtime import distributed as dist


@pytest.fixture(scope="module", params=["hf", "fp8"])
def ck(request, tmp_path_factory):
    return open_checkpoint(write_tiny_checkpoint(tmp_path_factory.mktemp("sh") / request.param, seed=2,
                                                 layout=request.param), "int8")


def test_row_ranges_equal_rows_of_the_whole_tensor(ck):
    checked = 0
    for c in ck.names:
        whole = ck.tensor(c)
        n = whole.shape[0]
        for a, b in ((0, n), (1, n), (n // 3, n // 3 + 2), (n - 1, n)):
            if 0 <= a < b <= n:
                assert torch.equal(ck.tensor(c, slice(a, b)), whole[a:b]), (c, a, b)
        checked += 1
    assert checked == len(ck.names)
    with pytest.raises(pto.CheckpointError, match=r"rows slice\(0, 513, None\) outside 'head.weight' \(first dim 512\)"):
        ck.tensor("head.weight", slice(0, 513))


def test_fp8_rows_across_a_block_boundary(tmp_path):
    """Rows 100..300 of a 512-row FP8 tensor span three 128-row scale blocks."""
    import dataclasses
    from pto.models.deepseek_v4.config import get_config
    cfg = dataclasses.replace(get_config("tiny"), q_lora_rank=512)  # wq_a [512, 128] is FP8 in this layout
    ck = open_checkpoint(write_tiny_checkpoint(tmp_path / "fp8", seed=1, cfg=cfg, layout="fp8"), "int8")
    assert ck._stored["layers.0.attn.wq_a.weight"][2] == "F8_E4M3"
    whole = ck.tensor("layers.0.attn.wq_a.weight")
    assert torch.equal(ck.tensor("layers.0.attn.wq_a.weight", slice(100, 300)), whole[100:300])


def test_shard_holds_its_experts_and_vocabulary_rows(ck):
    sh = ck.shard(slice(8, 12), slice(128, 256))
    full, part = moe_inputs(ck, 3), moe_inputs(sh, 3)
    for k in ("w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale"):
        assert part[k].shape[0] == 4 and torch.equal(part[k], full[k][8:12]), k
    for k in ("gate_w", "gate_bias", "sh_w1", "tid2eid"):  # router and shared expert: whole
        assert torch.equal(part[k], full[k]), k
    assert torch.equal(sh.globals()["head.weight"], ck.tensor("head.weight")[128:256])
    assert torch.equal(sh.globals()["embed.weight"], ck.tensor("embed.weight"))
    assert ck.experts == range(16) and ck.vocab_rows is None  # the original is untouched
    with pytest.raises(pto.CheckpointError, match="outside 16 experts / 512 rows"):
        ck.shard(slice(8, 20), slice(0, 256))


def test_globals_read_on_first_use_checked_at_once(tmp_path):
    d = write_tiny_checkpoint(tmp_path / "g", seed=0)
    g = open_checkpoint(d).globals()
    assert sorted(g) == ["embed.weight", "hc_head_base", "hc_head_fn", "hc_head_scale", "head.weight", "norm.weight"]
    assert g._got == {}  # nothing kept until asked for
    assert g["norm.weight"] is g["norm.weight"] and list(g._got) == ["norm.weight"]
    sd = load_file(str(d / "model.safetensors"))
    sd["head.weight"][7, 1] = float("inf")
    save_file(sd, str(d / "model.safetensors"))
    with pytest.raises(pto.CheckpointError, match="tensor 'head.weight' holds 1 NaN or infinite"):
        open_checkpoint(d).globals()
    sh = open_checkpoint(d).shard(slice(0, 8), slice(256, 512))
    assert sh.globals()["head.weight"].shape == (256, 128)  # row 7 is rank 0's, not this shard's


def test_agree_reports_every_failed_rank_on_every_rank():
    def rank(r):
        import pto.language.distributed as pld
        w = pld.world()
        first = w.agree("bad tensor" if r == 2 else None, "loading")
        second = w.agree(None, "loading")
        return first, second

    res = dist.run_threads(rank, 4, timeout_s=20)
    assert res == [({2: "bad tensor"}, {})] * 4
