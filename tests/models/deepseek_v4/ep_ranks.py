"""Ranks of the expert-parallel tests (tests/models/deepseek_v4/test_moe_ep.py), one process each through
``pto.runtime.distributed.spawn``: ``python ep_ranks.py SCENARIO OUT_DIR``.

``blocks``: the tiny MoE (a hash and a learned layer) and the vocabulary-parallel head, each
rank with (a) every token row (the same rows as the single-rank reference) and (b) its own
half of the rows (data parallel); the EP1 results come from the single-rank kernels in the
same process. Everything runs in check mode. ``generate OUT_DIR CKPT MAX_NEW check|fast
[int8|bf16]``: :class:`EPModel` generation of :data:`PROMPTS` in that weight format (tokens and
logits kept). Results ->
``OUT_DIR/rank{r}.pt``.
"""

import os
import sys

import torch

import pto
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.lm_head import lm_head_kernels, make_lm_head_weight
from pto.models.deepseek_v4.moe import MOE_INPUTS, make_moe_inputs, moe_kernels
from pto.models.deepseek_v4.moe_ep import (EPWindows, lm_head_ep_kernels, moe_ep_kernels, shard_moe_weights,
                                          vocab_slice)
from pto.runtime import RunConfig
from pto.runtime import distributed as dist

CHECK = RunConfig(check=True, heap_bytes=64 << 20)


def blocks(w, out_dir):
    cfg = get_config("tiny")
    N, me = w.size, w.rank
    win = EPWindows(cfg)
    ep_moe = moe_ep_kernels(cfg, N).moe_ep_test
    T = 8
    res = {}
    for layer in (0, cfg.num_hash_layers):  # hash routing, learned routing
        ins = make_moe_inputs(cfg, T, seed=3 + layer)
        args = [ins[k] for k in MOE_INPUTS]
        ref = torch.empty(T, cfg.hc_mult, cfg.hidden_size)
        moe_kernels(cfg).moe_test.run(*args, ref, layer, T, config=CHECK)
        mine = shard_moe_weights(args[1:], cfg, N, me)
        for mode, rows in (("same", slice(0, T)), ("split", slice(me * T // N, (me + 1) * T // N))):
            x = args[0][rows].contiguous()
            ids = ins["input_ids"][rows].contiguous()
            local = list(mine)
            local[7] = ids
            got = torch.empty_like(x)
            dist.run(ep_moe, x, *local, *win.moe_args(), got, layer, x.shape[0], win.moe_epoch, config=CHECK)
            res[f"moe{layer}_{mode}"] = (got, ref[rows])
    # the head: rows of 4 requests, half per rank; shard of the vocabulary per rank
    B = 4
    g = torch.Generator().manual_seed(11)
    x_hc = torch.randn(B, cfg.hc_mult, cfg.hidden_size, generator=g)
    hc_fn = torch.randn(cfg.hc_mult, cfg.hc_mult * cfg.hidden_size, generator=g) * 0.02
    hc_scale, hc_base = torch.tensor([0.5]), torch.randn(cfg.hc_mult, generator=g) * 0.1
    norm_w = (1 + 0.1 * torch.randn(cfg.hidden_size, generator=g)).to(torch.bfloat16)
    weight = make_lm_head_weight(cfg, 5)
    ref = torch.empty(B, cfg.vocab_size)
    lm_head_kernels(cfg).final_logits_test.run(x_hc, hc_fn, hc_scale, hc_base, norm_w, weight, ref, config=CHECK)
    counts = [B // N] * N
    rows = slice(me * B // N, (me + 1) * B // N)
    got = torch.empty(B, cfg.vocab_size)
    dist.run(lm_head_ep_kernels(cfg, N).lm_head_ep_test, x_hc[rows].contiguous(), hc_fn, hc_scale, hc_base, norm_w,
             weight[vocab_slice(cfg, N, me)].contiguous(), *win.head_args(), got, counts, win.head_epoch,
             config=CHECK)
    res["head_split"] = (got, ref)
    torch.save(res, os.path.join(out_dir, f"rank{me}.pt"))


PROMPTS = [[5, 17, 300], [7, 8, 9, 10, 11], [100], [42, 43]]


def deployment():
    from pto.models.deepseek_v4.config import get_deployment
    return get_deployment("tiny").replace(max_context=64, rope_max_pos=64)


def run_generate(w, out_dir, ckpt, max_new, check, weight_format="int8"):
    from pto.models.deepseek_v4.ep_model import EPModel
    from pto.models.deepseek_v4.generate import generate
    from pto.models.deepseek_v4.weights import open_checkpoint
    model = EPModel(open_checkpoint(ckpt, weight_format), deployment(), check=check == "check")
    res = generate(model, PROMPTS, max_new_tokens=int(max_new), eos_token_id=None, keep_logits=True)
    torch.save({"tokens": res.tokens, "prompt_logits": res.prompt_logits, "step_logits": res.step_logits,
                "tasks": dict(model.stats.tasks), "programs": dict(model.stats.programs)},
               os.path.join(out_dir, f"rank{w.rank}.pt"))


def main() -> int:
    scenario, out_dir = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    w = dist.init()
    if scenario == "blocks":
        blocks(w, out_dir)
    else:
        run_generate(w, out_dir, *sys.argv[3:])
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except pto.PtoError as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
