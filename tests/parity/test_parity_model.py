"""The whole model against transformers 5.23.0 float32 on pto's own tiny checkpoint.

``pto checkpoint tiny`` writes the checkpoint without transformers; here transformers loads
it (no missing / unexpected keys, values equal) and is the oracle for:

* the FP32 golden forward (``weight_format="bf16"``): logits max abs error <= 1e-4 on a
  509-token prompt (3 HCA windows + tail, 127 CSA entries, top-16 a strict subset), greedy
  tokens identical for 8 new tokens (transformers' cached generate vs pto's cache);
* the int8 (W8A8) golden: top-1 agreement with transformers >= 0.80 over every prompt
  position and generated token (measured and printed);
* chunked prefill (128, 100) and a batch of different lengths giving the one-shot tokens;
* the kernel model in both weight formats (int8 >= 0.80, bf16 >= 0.90 top-1 agreement over
  every prompt position and generated token; logits error and greedy tokens printed and in the
  assertion message).
"""

import pytest
import torch

from pto.models.deepseek_v4.checkpoint import tiny_state, write_tiny_checkpoint
from pto.models.deepseek_v4.generate import generate
from pto.models.deepseek_v4.model import GoldenModel
from pto.models.deepseek_v4.weights import open_checkpoint

SEED = 11
PROMPT = 509  # 3 closed HCA windows and a tail, 127 CSA entries of which top-16 is a strict subset
NEW = 8


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("pto_tiny") / "tiny", seed=SEED)


@pytest.fixture(scope="module")
def hf_model(ckpt_dir):
    pytest.importorskip("transformers", minversion="5.23.0")
    from transformers import DeepseekV4ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    model, info = DeepseekV4ForCausalLM.from_pretrained(
        ckpt_dir, dtype=torch.float32, attn_implementation="eager",
        experts_implementation="eager", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    return model.eval()


@pytest.fixture(scope="module")
def prompt():
    return torch.randint(0, 512, (PROMPT,), generator=torch.Generator().manual_seed(SEED)).tolist()


@pytest.fixture(scope="module")
def hf_greedy(hf_model, prompt):
    """transformers' cached greedy generate: 8 tokens and the logits each was chosen from."""
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False,
                                eos_token_id=None, output_logits=True, return_dict_in_generate=True)
        full = hf_model(input_ids=out.sequences[:, :-1], use_cache=False).logits[0]
    return out.sequences[0, PROMPT:].tolist(), full


def test_transformers_loads_the_written_checkpoint(hf_model):
    state = tiny_state(seed=SEED)
    sd = hf_model.state_dict()
    assert torch.equal(sd["model.layers.2.self_attn.compressor.indexer.q_b_proj.weight"],
                       state["layers.2.attn.indexer.wq_b.weight"])
    gate_up = sd["model.layers.4.mlp.experts.gate_up_proj"]
    assert torch.equal(gate_up[5, :64], state["layers.4.ffn.experts.5.w1.weight"])
    assert torch.equal(gate_up[5, 64:], state["layers.4.ffn.experts.5.w3.weight"])
    assert torch.equal(sd["model.layers.3.mlp.gate.e_score_correction_bias"], state["layers.3.ffn.gate.bias"])
    assert torch.equal(sd["lm_head.weight"], state["head.weight"])


def test_golden_forward_matches_transformers(ckpt_dir, hf_model, prompt, hf_greedy):
    tokens_hf, full_hf = hf_greedy
    golden = GoldenModel(open_checkpoint(ckpt_dir, "bf16"), float32=True)
    res = generate(golden, [prompt], max_new_tokens=NEW, eos_token_id=None, keep_logits=True)
    assert res.tokens[0] == tokens_hf
    logits = golden(prompt + tokens_hf[:-1])  # one-shot forward over prompt + generated
    err = float((logits - full_hf).abs().max())
    step_err = max(float((a - b).abs().max()) for a, b in
                   zip(res.step_logits[0], full_hf[PROMPT - 1:]))
    print(f"[parity] golden fp32 vs transformers: logits max abs err {err:.3e} over "
          f"{logits.shape[0]} positions, cached decode steps {step_err:.3e}, "
          f"tokens {res.tokens[0]}")
    assert err <= 1e-4 and step_err <= 1e-4
    assert bool((logits.argmax(-1) == full_hf.argmax(-1)).all())


def test_int8_top1_agreement(ckpt_dir, prompt, hf_greedy):
    tokens_hf, full_hf = hf_greedy
    golden = GoldenModel(open_checkpoint(ckpt_dir, "int8"))
    logits = golden(prompt + tokens_hf[:-1])
    agree = float((logits.argmax(-1) == full_hf.argmax(-1)).float().mean())
    res = generate(golden, [prompt], max_new_tokens=NEW, eos_token_id=None)
    print(f"[parity] int8 W8A8 golden vs transformers fp32: top-1 agreement {agree:.4f} over "
          f"{logits.shape[0]} positions, logits max abs err {float((logits - full_hf).abs().max()):.3f}, "
          f"greedy tokens {res.tokens[0]} vs {tokens_hf}")
    assert agree >= 0.80


def test_chunked_prefill_and_batch_give_the_same_tokens(ckpt_dir, prompt, hf_greedy):
    golden = GoldenModel(open_checkpoint(ckpt_dir))
    want = hf_greedy[0]
    for chunk in (128, 100):
        res = generate(golden, [prompt], max_new_tokens=NEW, chunk=chunk, eos_token_id=None)
        assert res.tokens[0] == want, chunk
    short = prompt[:37]
    alone = generate(golden, [short], max_new_tokens=NEW, eos_token_id=None).tokens[0]
    both = generate(golden, [prompt, short], max_new_tokens=NEW, chunk=128, eos_token_id=None)
    assert both.tokens == [want, alone]


# ---- the kernel path ---------------------------------------------------------------------------

def _kernel_agreement(ckpt_dir, hf_model, ids: list[int],
                      weight_format: str = "int8") -> tuple[float, float, list[int], list[int]]:
    """Top-1 agreement and logits max abs error of the kernel model (``weight_format``) with
    transformers fp32 over every prompt position and generated token (teacher-forced on pto's
    tokens); also the greedy tokens of both."""
    from pto.models.deepseek_v4.config import get_deployment
    from pto.models.deepseek_v4.layer import KernelModel

    km = KernelModel(open_checkpoint(ckpt_dir, weight_format), get_deployment("tiny"))
    res = generate(km, [ids], max_new_tokens=NEW, eos_token_id=None, keep_logits=True)
    ours = torch.cat([res.prompt_logits[0], torch.stack(res.step_logits[0][1:])])
    with torch.no_grad():
        ref = hf_model(input_ids=torch.tensor([ids + res.tokens[0][:-1]]), use_cache=False).logits[0]
        hf_tokens = hf_model.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False,
                                      eos_token_id=None)[0, len(ids):].tolist()
    agree = float((ours.argmax(-1) == ref.argmax(-1)).float().mean())
    return agree, float((ours - ref).abs().max()), res.tokens[0], hf_tokens


def test_kernel_model_int8_top1_short(ckpt_dir, hf_model, prompt):
    agree, err, ours, theirs = _kernel_agreement(ckpt_dir, hf_model, prompt[:100])
    print(f"[parity] kernels (int8; every layer on kernels) vs transformers fp32, 100-token prompt: "
          f"top-1 {agree:.4f}, logits max abs err {err:.3f}, tokens {ours} vs {theirs}")
    assert agree >= 0.80


@pytest.mark.slow
def test_kernel_model_int8_top1_509(ckpt_dir, hf_model, prompt):
    agree, err, ours, theirs = _kernel_agreement(ckpt_dir, hf_model, prompt)
    print(f"[parity] kernels (int8; every layer on kernels) vs transformers fp32, 509-token prompt: "
          f"top-1 {agree:.4f}, logits max abs err {err:.3f}, tokens {ours} vs {theirs}")
    assert agree >= 0.80


def _bf16_kernel_report(ckpt_dir, hf_model, ids: list[int]) -> str:
    agree, err, ours, theirs = _kernel_agreement(ckpt_dir, hf_model, ids, "bf16")
    same = sum(a == b for a, b in zip(ours, theirs))
    msg = (f"kernels (bf16: unquantised BF16 kernels) vs transformers fp32, {len(ids)}-token prompt: top-1 "
           f"{agree:.4f}, logits max abs err {err:.3f}, greedy tokens {ours} vs {theirs} ({same}/{NEW} equal)")
    print(f"[parity] {msg}")
    assert agree >= 0.90, msg
    return msg


def test_kernel_model_bf16_top1_short(ckpt_dir, hf_model, prompt):
    _bf16_kernel_report(ckpt_dir, hf_model, prompt[:100])


@pytest.mark.slow
def test_kernel_model_bf16_top1_509(ckpt_dir, hf_model, prompt):
    _bf16_kernel_report(ckpt_dir, hf_model, prompt)
