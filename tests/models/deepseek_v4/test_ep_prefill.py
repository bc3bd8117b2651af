"""EPModel prefill, data parallel over requests: ranks (threads here) prefill their own
requests' chunks at once, one chunk per round, ranks with fewer chunks passing no rows; tokens
and every prompt logit bit-identical to one rank prefilling one chunk at a time. Each rank holds
only its experts and head rows."""

import torch

from pto.models.deepseek_v4.checkpoint import write_tiny_checkpoint
from pto.models.deepseek_v4.config import get_deployment
from pto.models.deepseek_v4.generate import generate
from pto.models.deepseek_v4.layer import KernelModel
from pto.models.deepseek_v4.weights import open_checkpoint
from pto.runtime import distributed as dist

# chunk 2, owners round robin: rank 0 owns requests 0 (3 chunks) and 2 (1 chunk), rank 1
# requests 1 (2 chunks) and 3 (1)
PROMPTS = [[5, 17, 300, 4, 9], [7, 8, 9], [100], [42]]


def test_prefill_rounds_of_unequal_chunk_counts_bit_identical(tmp_path):
    from pto.models.deepseek_v4.ep_model import EPModel

    ck = write_tiny_checkpoint(tmp_path / "tiny", seed=4)
    dep = get_deployment("tiny").replace(max_context=64, rope_max_pos=64)
    model_ref = KernelModel(open_checkpoint(ck, "int8"), dep)
    ref = generate(model_ref, PROMPTS, max_new_tokens=2, chunk=2, eos_token_id=None, keep_logits=True)

    def rank(r):
        model = EPModel(open_checkpoint(ck, "int8"), dep)
        # the rank read only its 8 of 16 experts, its 256 of 512 head rows; the golden inside
        # (id and context checks) holds no copy of the embedding or the head
        assert model.ffn_weights(0)["w1"].shape == (8, 64, 128) and model._head_shard.shape == (256, 128)
        assert torch.equal(model._head_shard, model_ref._head_w[4][256 * r:256 * (r + 1)])
        assert model.golden._glob._got == {}
        res = generate(model, PROMPTS, max_new_tokens=2, chunk=2, eos_token_id=None, keep_logits=True)
        return res, dict(model.stats.programs)

    for res, runs in dist.run_threads(rank, 2, timeout_s=120):
        assert res.tokens == ref.tokens
        assert len(res.prompt_logits) == 4
        for a, b in zip(res.prompt_logits, ref.prompt_logits):
            assert a.shape == b.shape and torch.equal(a, b)
        # 4 prefill rounds (rank 0's 4 chunks) + 1 decode step, each one head program
        assert runs["lm_head_ep"] == 5
