"""generate(..., mtp=True): plain greedy's tokens and logits, caches equal to plain greedy's
after every step, forced-accept / forced-reject drafts, ragged batches, acceptance reporting."""

import json

import pytest
import torch

from pto.cli import main
from pto.errors import BindError, ConfigError
from pto.models.deepseek_v4.checkpoint import write_tiny_checkpoint
from pto.models.deepseek_v4.config import DeploymentConfig
from pto.models.deepseek_v4.generate import generate
from pto.models.deepseek_v4.layer import KernelModel
from pto.models.deepseek_v4.model import GoldenModel
from pto.models.deepseek_v4.weights import Checkpoint

PROMPTS = {0: [5, 17, 300, 41, 9, 77, 2, 100, 3, 14], 1: [400, 2, 2, 61, 250, 7, 33]}


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("mtp")
    return {(layout, seed): write_tiny_checkpoint(root / f"{layout}{seed}", seed, layout=layout, mtp=True)
            for layout in ("hf", "fp8") for seed in (0, 1)}


def _model(path, fmt, context=256):
    ck = Checkpoint(path, fmt)
    dep = DeploymentConfig.sized(ck.config, 4, context, block_size=16)
    return KernelModel(ck, dep) if fmt == "int8" else GoldenModel(ck, dep)


def _main_cache(m):
    L = m.cfg.num_hidden_layers
    return [t.clone() for lay in m.cache.layers[:L] for t in lay.values()]


def _run(m, prompts, n, snap=None, **kw):
    """generate() from zeroed caches (stale rows of an earlier run would differ); ``snap``
    collects the main layers' caches after every decode step, keyed by tokens done."""
    if hasattr(m, "cache"):
        for lay in m.cache.layers:
            for t in lay.values():
                t.zero_()

    def progress(done, total, phase):
        if snap is not None and phase == "decode":
            snap[done] = _main_cache(m)

    kw.setdefault("eos_token_id", None)
    return generate(m, prompts, max_new_tokens=n, chunk=6, keep_logits=True, progress=progress, **kw)


def _same_logits(a, b):
    return all(torch.equal(x, y) for ra, rb in zip(a.step_logits, b.step_logits) for x, y in zip(ra, rb))


@pytest.mark.parametrize("seed", [0, 1])
def test_golden_mtp_gives_plain_greedy(ckpts, seed):
    m = _model(ckpts[("hf", seed)], "bf16")
    p = [PROMPTS[seed]]
    ref = _run(m, p, 32)
    assert ref.decode_steps == 31 and ref.mtp_drafts == 0
    for drafts in ("model", "accept", "reject"):
        r = _run(m, p, 32, mtp=True, drafts=drafts, reference=ref.tokens)
        assert r.tokens == ref.tokens, drafts
        assert _same_logits(r, ref), drafts
        if drafts == "accept":  # two tokens per step: 31 -> 16 steps
            assert r.mtp_accepted == r.mtp_drafts == 15 and r.decode_steps == 16
            assert r.acceptance_rate == 1.0 and r.decode_steps_saved == 15
        if drafts == "reject":
            assert r.mtp_accepted == 0 and r.mtp_drafts == 30 and r.decode_steps == 31


def test_golden_mtp_stops_at_eos_like_plain(ckpts):
    m = _model(ckpts[("hf", 0)], "bf16")
    ref = _run(m, [PROMPTS[0]], 32, eos_token_id=1)  # seed 0 reaches token 1 at the 15th token
    assert ref.stop_reasons == ["eos"] and ref.tokens[0][-1] == 1
    for drafts in ("model", "accept"):
        r = _run(m, [PROMPTS[0]], 32, eos_token_id=1, mtp=True, drafts=drafts, reference=[ref.tokens[0] * 3])
        assert r.tokens == ref.tokens and r.stop_reasons == ["eos"], drafts


def test_kernel_mtp_exact_with_caches(ckpts):
    m = _model(ckpts[("fp8", 0)], "int8")
    p = [PROMPTS[0]]
    plain = {}
    ref = _run(m, p, 12, snap=plain)
    mtp_kv = {}
    for drafts in ("none", "model", "accept", "reject"):
        snap = {}
        r = _run(m, p, 12, snap=snap, mtp=True, drafts=drafts, reference=ref.tokens)
        assert r.tokens == ref.tokens, drafts
        assert _same_logits(r, ref), drafts  # bit-identical verify logits (also vs the S = 1 path)
        assert snap and set(snap) <= set(plain)
        for done, caches in snap.items():  # every cache tensor equal to plain greedy's, bit for bit
            assert all(torch.equal(a, b) for a, b in zip(caches, plain[done])), (drafts, done)
        mtp_kv[drafts] = m.cache.layers[m.cfg.num_hidden_layers]["kv"].clone()
        if drafts == "accept":
            assert r.mtp_accepted == r.mtp_drafts == 5 and r.decode_steps == 6
    # the MTP layer's own cache does not depend on which drafts were accepted
    assert torch.equal(mtp_kv["accept"], mtp_kv["reject"]) and torch.equal(mtp_kv["model"], mtp_kv["reject"])
    assert mtp_kv["accept"].abs().sum() > 0 and mtp_kv["none"].abs().sum() == 0


def test_kernel_mtp_ragged_batch(ckpts):
    m = _model(ckpts[("hf", 1)], "int8")
    prompts = [PROMPTS[1], PROMPTS[0][:4], PROMPTS[0]]
    alone = [_run(m, [p], 6).tokens[0] for p in prompts]
    for drafts in ("accept", "model"):
        r = _run(m, prompts, 6, mtp=True, drafts=drafts, reference=alone)
        assert r.tokens == alone, drafts
    assert r.mtp_drafts > 0


def test_golden_mtp_ragged_batch(ckpts):
    m = _model(ckpts[("fp8", 1)], "bf16")
    prompts = [PROMPTS[0], PROMPTS[1][:3], PROMPTS[1]]
    alone = [_run(m, [p], 20).tokens[0] for p in prompts]
    for drafts in ("model", "accept", "reject"):
        r = _run(m, prompts, 20, mtp=True, drafts=drafts, reference=alone)
        assert r.tokens == alone, drafts
    assert r.mtp_drafts == 3 * 18 and r.mtp_accepted == 0


def test_kernel_mtp_in_check_mode(ckpts):
    # the definedness sanitizer and race checker on every program of an MTP run (inactive rows,
    # a rejected draft's restored rows, the MTP layer's prefill and decode programs)
    ck = Checkpoint(ckpts[("hf", 0)], "int8")
    m = KernelModel(ck, DeploymentConfig.sized(ck.config, 2, 64, block_size=16), check=True)
    p = [PROMPTS[1][:5]]
    ref = _run(m, p, 4)
    for drafts in ("accept", "reject"):
        assert _run(m, p, 4, mtp=True, drafts=drafts, reference=ref.tokens).tokens == ref.tokens


def test_bad_mtp_inputs(ckpts, tmp_path):
    m = _model(ckpts[("hf", 0)], "bf16")
    with pytest.raises(BindError, match="drafts must be one of"):
        generate(m, [[1, 2]], max_new_tokens=3, mtp=True, drafts="maybe")
    with pytest.raises(BindError, match="needs reference="):
        generate(m, [[1, 2]], max_new_tokens=3, mtp=True, drafts="accept")
    plain = GoldenModel(Checkpoint(write_tiny_checkpoint(tmp_path / "p", 0)))
    with pytest.raises(ConfigError, match="no MTP layer"):
        generate(plain, [[1, 2]], max_new_tokens=3, mtp=True)


def test_cli_generate_mtp(ckpts, capsys):
    d = str(ckpts[("hf", 0)])
    assert main(["generate", d, "--input-ids", "5 17 300", "--max-new-tokens", "6", "--mtp", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mtp_drafts"] >= 1 and 0 <= out["mtp_accepted"] <= out["mtp_drafts"]
    assert out["decode_steps"] + out["decode_steps_saved"] == 5  # plain greedy: 5 decode steps
    assert {"acceptance_rate", "decode_steps_saved", "decode_steps"} <= set(out)
    assert main(["generate", d, "--input-ids", "5 17 300", "--max-new-tokens", "4", "--mtp"]) == 0
    assert "drafts accepted (acceptance rate" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("layout,seed", [("hf", 0), ("fp8", 1)])
def test_kernel_mtp_long_across_the_hca_boundary(ckpts, layout, seed):
    # a 120-token prompt and 40 new tokens: positions 120..159 close the HCA window at 127
    m = _model(ckpts[(layout, seed)], "int8")
    p = [[(7 * k + seed) % 500 + 1 for k in range(120)]]
    plain = {}
    ref = _run(m, p, 40, snap=plain)
    for drafts in ("model", "accept", "reject"):
        snap = {}
        r = _run(m, p, 40, snap=snap, mtp=True, drafts=drafts, reference=ref.tokens)
        assert r.tokens == ref.tokens and _same_logits(r, ref), drafts
        for done, caches in snap.items():
            assert all(torch.equal(a, b) for a, b in zip(caches, plain[done])), (drafts, done)
