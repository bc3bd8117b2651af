"""Regression: at EP2 (tiny) a prefill chunk of about 64 tokens or more, or with the ranks
prefilling in parallel two chunks of 34 (272 routes: one owner gets more than 128), failed with ``CapacityError: create_tensor 'recv_x'
... exceeds its declared capacity 512``: the owner's
local routed-expert kernel took every received route as a row of K route slots (K - 1 of them
empty), so ``n_recv * K`` slots against a capacity of one rank's ``128 * K``. It now takes one
route per row (K = 1) with room for every source's routes (``N * 128 * K`` rows); tokens and
logits stay EP1's."""

import torch

from pto.models.deepseek_v4.checkpoint import write_tiny_checkpoint
from pto.models.deepseek_v4.config import get_deployment
from pto.models.deepseek_v4.generate import generate
from pto.models.deepseek_v4.layer import KernelModel
from pto.models.deepseek_v4.weights import open_checkpoint
from pto.runtime import distributed as dist


def test_ep2_prefill_of_two_34_token_prompts(tmp_path):
    from pto.models.deepseek_v4.ep_model import EPModel

    ck = write_tiny_checkpoint(tmp_path / "tiny", seed=5)
    dep = get_deployment("tiny").replace(max_context=64, rope_max_pos=64)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 512, (34,), generator=g).tolist() for _ in range(2)]  # request r on rank r
    ref = generate(KernelModel(open_checkpoint(ck, "int8"), dep), prompts, max_new_tokens=1, eos_token_id=None,
                   keep_logits=True)

    def rank(r):
        return generate(EPModel(open_checkpoint(ck, "int8"), dep), prompts, max_new_tokens=1, eos_token_id=None,
                        keep_logits=True)

    for res in dist.run_threads(rank, 2, timeout_s=300):
        assert res.tokens == ref.tokens
        assert all(torch.equal(a, b) for a, b in zip(res.prompt_logits, ref.prompt_logits))
