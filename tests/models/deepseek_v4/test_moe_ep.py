"""Expert-parallel MoE and vocabulary-parallel head on 2 spawned ranks (tests/models/ep_ranks.py):
bit-identical to the single-rank kernels, check mode on every rank; ConfigError for world
sizes the deployment does not allow."""

import os
import sys

import pytest
import torch

import pto
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.moe_ep import check_ep, expert_slice, vocab_slice
from pto.runtime import distributed as dist

RANKS = os.path.join(os.path.dirname(__file__), "ep_ranks.py")
sys.path.insert(0, os.path.dirname(__file__))


def test_moe_and_head_ep2_bit_identical_to_ep1(tmp_path):
    assert dist.spawn(["blocks", str(tmp_path)], 2, script=RANKS, timeout_s=120) == 0
    for r in (0, 1):
        res = torch.load(tmp_path / f"rank{r}.pt")
        # hash layer 0 and learned layer 3; every row on each rank, then half the rows each
        assert sorted(res) == ["head_split", "moe0_same", "moe0_split", "moe3_same", "moe3_split"]
        for name, (got, want) in res.items():
            assert torch.equal(got, want), name
            assert got.abs().sum() > 0, name


def test_moe_ep4_as_threads_bit_identical_to_ep1():
    """EP4 (4 experts per rank) with ranks as threads: each rank's 2 of 8 rows."""
    from pto.models.deepseek_v4.moe import MOE_INPUTS, make_moe_inputs, moe_kernels
    from pto.models.deepseek_v4.moe_ep import EPWindows, moe_ep_kernels, shard_moe_weights

    cfg, T, N, layer = get_config("tiny"), 8, 4, 3
    ins = make_moe_inputs(cfg, T, seed=5)
    args = [ins[k] for k in MOE_INPUTS]
    ref = torch.empty(T, cfg.hc_mult, cfg.hidden_size)
    # expert_routed has 2 tasks per (expert with rows, row tile), which differs per rank: compare the others
    routed = ("expert_gate_up", "expert_down")

    def other_tasks(graph):
        return sum(t.name not in routed for t in graph.tasks)
    one_rank_tasks = other_tasks(moe_kernels(cfg).moe_test.run(*args, ref, layer, T).graph)
    kernel = moe_ep_kernels(cfg, N).moe_ep_test

    def rank(r):
        win = EPWindows(cfg)
        rows = slice(2 * r, 2 * r + 2)
        w = shard_moe_weights(args[1:], cfg, N, r)
        w[7] = ins["input_ids"][rows].contiguous()
        x = args[0][rows].contiguous()
        out = torch.empty_like(x)
        prog = dist.run(kernel, x, *w, *win.moe_args(), out, layer, 2, win.moe_epoch, config=pto.RunConfig(check=True))
        names = [t.name for t in prog.graph.tasks]
        assert names.count("expert_gate_up") == names.count("expert_down") >= 1
        return out, other_tasks(prog.graph)

    res = dist.run_threads(rank, N, timeout_s=60)
    assert torch.equal(torch.cat([o for o, _ in res]), ref)
    # the single-rank tasks (its routed experts now over the received rows) plus dispatch,
    # dispatch wait, gather, combine send, combine wait and the k-ordered combine
    assert [t for _, t in res] == [one_rank_tasks + 6] * N


def test_world_sizes_the_deployment_rejects():
    cfg = get_config("tiny")  # 16 experts, 4 per token, vocabulary 512
    assert check_ep(cfg, 2) == 8 and check_ep(cfg, 4) == 4
    assert expert_slice(cfg, 4, 3) == slice(12, 16) and vocab_slice(cfg, 2, 1) == slice(256, 512)
    with pytest.raises(pto.ConfigError, match="allows world sizes \\[1, 2, 4, 8\\]"):
        check_ep(cfg, 3)
    with pytest.raises(pto.ConfigError, match="2 experts per rank is fewer than num_experts_per_tok=4"):
        check_ep(cfg, 8)
    import dataclasses
    odd = dataclasses.replace(cfg, n_routed_experts=12)
    with pytest.raises(pto.ConfigError, match="n_routed_experts=12, not divisible by the world size 8"):
        check_ep(odd, 8)


def _generate_ep(tmp_path, ep, max_new, check, weight_format="int8"):
    from pto.models.deepseek_v4.checkpoint import write_tiny_checkpoint
    from pto.models.deepseek_v4.generate import generate
    from pto.models.deepseek_v4.layer import KernelModel
    from pto.models.deepseek_v4.weights import open_checkpoint
    from ep_ranks import PROMPTS, deployment

    ckpt = write_tiny_checkpoint(tmp_path / "tiny", seed=3)
    out = tmp_path / "out"
    out.mkdir()
    assert dist.spawn(["generate", str(out), str(ckpt), str(max_new), check, weight_format], ep, script=RANKS,
                      timeout_s=300) == 0
    ref = generate(KernelModel(open_checkpoint(ckpt, weight_format), deployment()), PROMPTS,
                   max_new_tokens=max_new, eos_token_id=None, keep_logits=True)
    for r in range(ep):
        got = torch.load(out / f"rank{r}.pt")
        assert got["tokens"] == ref.tokens
        # every prefill and decode logit bit-identical to EP1 (INT8 or BF16 experts: each route's
        # y is computed on its own row and the origin sums a token's routes in k order)
        for a, b in zip(got["prompt_logits"], ref.prompt_logits):
            assert torch.equal(a, b)
        for sa, sb in zip(got["step_logits"], ref.step_logits):
            assert len(sa) == len(sb) == max_new and all(torch.equal(a, b) for a, b in zip(sa, sb))
        assert len(got["prompt_logits"]) == len(ref.prompt_logits) == 4
        # prefill in parallel: each rank prefills its 4 / ep one-chunk requests in 4 / ep rounds,
        # so 6 layers x (4 / ep prefill rounds + (max_new - 1) decode steps) MoE programs on every rank
        assert got["programs"]["moe_ep"] == 6 * (4 // ep + max_new - 1)
        assert got["programs"]["lm_head_ep"] == 4 // ep + max_new - 1
        # attention runs on the owner only (EP2: rank r owns requests r, r + 2)
        assert got["programs"]["prefill_attention_swa"] == 2 * (4 // ep)  # 2 SWA layers
    return ref


def test_generate_ep2_same_tokens_and_logits_as_ep1(tmp_path):
    _generate_ep(tmp_path, 2, 3, "fast")


def test_generate_ep2_bf16_logits_bit_identical_to_ep1(tmp_path):
    """The unquantised (bf16) kernels across 2 ranks: tokens and every logit bit for bit EP1's."""
    _generate_ep(tmp_path, 2, 2, "fast", "bf16")


@pytest.mark.slow
def test_generate_ep4_check_mode_same_as_ep1(tmp_path):
    _generate_ep(tmp_path, 4, 8, "check")


@pytest.mark.slow
def test_generate_ep4_bf16_logits_bit_identical_to_ep1(tmp_path):
    _generate_ep(tmp_path, 4, 4, "fast", "bf16")
