"""generate() and the ``pto checkpoint`` / ``pto generate`` commands on a tiny checkpoint.

Short prompts only (the 509-token runs are in tests/parity/test_parity_model.py).
"""

import dataclasses
import json

import pytest
import torch

from pto.cli import main
from pto.errors import BindError, CapacityError
from pto.models.deepseek_v4.checkpoint import write_tiny_checkpoint
from pto.models.deepseek_v4.config import DeploymentConfig
from pto.models.deepseek_v4.generate import generate
from pto.models.deepseek_v4.model import GoldenModel
from pto.models.deepseek_v4.weights import open_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("gen") / "tiny", seed=3)


@pytest.fixture(scope="module")
def model(ckpt):
    return GoldenModel(open_checkpoint(ckpt), DeploymentConfig(max_context=64, rope_max_pos=64))


def test_prefill_then_resume_equals_one_shot(model):
    ids = list(range(5, 45))
    one = model(ids)
    st = model.new_state()
    parts = [model(ids[:13], st), model(ids[13:14], st), model(ids[14:], st)]
    assert st.pos == 40
    assert float((torch.cat(parts) - one).abs().max()) < 1e-5
    # the caches agree too: raw kv rows and emitted CSA entries / indexer keys
    ref = model.new_state()
    model(ids, ref)
    for a, b in zip(st.layers, ref.layers):
        assert float((a.kv - b.kv).abs().max()) < 1e-5
        if a.cmp is not None:
            assert a.cmp.shape == b.cmp.shape and torch.allclose(a.cmp, b.cmp, rtol=0, atol=1e-5)
        if a.idx is not None:
            assert a.idx.shape == (10, 128) and torch.allclose(a.idx, b.idx, rtol=0, atol=1e-5)


def test_eos_and_max_new_tokens(model):
    ids = [7, 8, 9]
    free = generate(model, [ids], max_new_tokens=6, eos_token_id=None)
    assert len(free.tokens[0]) == 6 and free.stop_reasons == ["length"]
    eos = free.tokens[0][2]
    first = free.tokens[0].index(eos)
    stopped = generate(model, [ids], max_new_tokens=6, eos_token_id=eos)
    assert stopped.tokens[0] == free.tokens[0][:first + 1] and stopped.stop_reasons == ["eos"]
    assert stopped.decode_steps == first
    # a list of stop ids (Hugging Face's form): the first of them generated stops the request
    other = free.tokens[0][4]
    listed = generate(model, [ids], max_new_tokens=6, eos_token_id=[10_000, other, eos])
    assert listed.tokens[0] == stopped.tokens[0] and listed.stop_reasons == ["eos"]
    # the config's eos_token_id (-1, the default), also as a tuple of several
    cfg = model.cfg
    try:
        model.cfg = dataclasses.replace(cfg, eos_token_id=(10_000, eos))
        assert generate(model, [ids], max_new_tokens=6).tokens[0] == stopped.tokens[0]
    finally:
        model.cfg = cfg
    for bad in ("7", 7.0, True, [7, None]):
        with pytest.raises(BindError, match="eos_token_id must be None, a token id or a list of token ids"):
            generate(model, [ids], max_new_tokens=2, eos_token_id=bad)


def test_batch_of_different_lengths(model):
    a, b = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3], [2, 7]
    both = generate(model, [a, b], max_new_tokens=4, chunk=4, eos_token_id=None)
    assert both.tokens == [generate(model, [a], max_new_tokens=4, eos_token_id=None).tokens[0],
                           generate(model, [b], max_new_tokens=4, eos_token_id=None).tokens[0]]
    assert both.decode_steps == 3 and both.new_tokens == 8


@pytest.mark.parametrize("prompts, kw, err, needle", [
    ([[1, 512]], {}, BindError, "request 0 token 1 = 512 is outside the vocabulary"),
    ([[1], [-1]], {}, BindError, "request 1 token 0 = -1"),
    ([[]], {}, BindError, "request 0 has an empty prompt"),
    ([], {}, BindError, "non-empty list"),
    ([1, 2], {}, BindError, "flat list"),
    ([[1.5]], {}, BindError, "not an integer id"),
    ([list(range(60))], {"max_new_tokens": 8}, CapacityError, "max_context=64"),
    ([[1]] * 5, {}, CapacityError, "max_requests=4"),
    ([[1]], {"max_new_tokens": 0}, BindError, "max_new_tokens"),
    ([[1]], {"chunk": 0}, BindError, "chunk"),
])
def test_bad_input(model, prompts, kw, err, needle):
    with pytest.raises(err, match=needle):
        generate(model, prompts, **kw)


def test_forward_bad_ids_append_nothing(model):
    st = model.new_state()
    with pytest.raises(BindError, match="outside the vocabulary"):
        model([1, 2, 9999], st)
    assert st.pos == 0 and st.layers[0].kv.shape[0] == 0


# ---- CLI -------------------------------------------------------------------------------------

def test_cli_checkpoint_and_generate(tmp_path, capsys):
    d = tmp_path / "c"
    assert main(["checkpoint", "tiny", str(d), "--seed", "3"]) == 0
    capsys.readouterr()
    assert main(["generate", str(d), "--input-ids", "5 17 300", "--max-new-tokens", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    want = generate(GoldenModel(open_checkpoint(d)), [[5, 17, 300]], max_new_tokens=4)
    assert out["tokens"] == want.tokens and out["prompt_tokens"] == [3]
    assert {"prefill_s", "decode_ms_per_token", "tokens_per_s"} <= set(out)
    f = tmp_path / "ids.txt"
    f.write_text("5 17 300\n\n9 9\n")
    assert main(["generate", str(d), "--input-ids-file", str(f), "--max-new-tokens", "2"]) == 0
    text = capsys.readouterr().out
    assert "request 0:" in text and "request 1:" in text and "ms/token" in text


@pytest.mark.parametrize("argv, needle", [
    (["--input-ids", "5 x"], "'x' is not an integer"),
    (["--input-ids", "5 512"], "outside the vocabulary"),
    (["--input-ids", " "], "empty prompt"),
    (["--input-ids", "5", "--max-context", "4", "--max-new-tokens", "8"], "max_context=4"),
    (["--prompt", "hello"], "no tokenizer.json"),
    (["--input-ids-file", "/nonexistent/ids"], "cannot read"),
])
def test_cli_bad_input_exits_2(ckpt, capsys, argv, needle):
    assert main(["generate", str(ckpt)] + argv) == 2
    assert needle in capsys.readouterr().err


def test_cli_bad_checkpoint_exits_2(tmp_path, capsys):
    assert main(["generate", str(tmp_path), "--input-ids", "1"]) == 2
    assert "no config.json" in capsys.readouterr().err
    from safetensors.torch import load_file, save_file

    bad = write_tiny_checkpoint(tmp_path / "bad", seed=0)
    t = load_file(str(bad / "model.safetensors"))
    t["model.layers.4.attn.wo_b.weight"] = torch.zeros(128, 64)
    save_file(t, str(bad / "model.safetensors"))
    assert main(["generate", str(bad), "--input-ids", "1 2"]) == 2
    err = capsys.readouterr().err
    assert "'model.layers.4.attn.wo_b.weight' has shape [128, 64]; expected [128, 128]" in err
    assert err.count("\n") == 1  # one line, no traceback
    d = write_tiny_checkpoint(tmp_path / "t", seed=0)
    assert main(["checkpoint", "tiny", str(d)]) == 2
    assert "already holds" in capsys.readouterr().err


def test_cli_generate_on_kernels(ckpt, capsys):
    from pto.models.deepseek_v4.config import get_deployment
    from pto.models.deepseek_v4.layer import KernelModel

    assert main(["generate", str(ckpt), "--input-ids", "5 17 300", "--max-new-tokens", "3",
                 "--weights", "int8", "--max-context", "64", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    km = KernelModel(open_checkpoint(ckpt, "int8"), get_deployment("tiny").replace(max_context=64, rope_max_pos=64))
    want = generate(km, [[5, 17, 300]], max_new_tokens=3)
    assert out["backend"] == "kernels" and out["tokens"] == want.tokens
    rows = {r["program"]: r for r in out["programs"]}  # per program kind: the graph of one run
    # 3 steps (1 prefill + 2 decode), one forward program each (embedding, 6 layers, head)
    assert km.stats.programs == {"prefill_fwd": 1, "decode_fwd": 2}
    assert rows["decode_fwd"]["runs"] == 2 and rows["decode_fwd"]["tasks"] == km.stats.tasks["decode_fwd"] / 2
    assert all(r["tasks"] > 0 and r["edges"] > 0 and r["heap_peak_bytes"] > 0 for r in out["programs"])
    assert {c["attn prefill"] for c in km.coverage()} == {"prefill_attention_swa", "prefill_attention_csa",
                                                          "prefill_attention_hca"}
    assert not km.cache.requests  # generate released the request's pages
    assert main(["generate", str(ckpt), "--input-ids", "5", "--backend", "golden", "--check"]) == 2
    assert "not --backend golden" in capsys.readouterr().err
    assert main(["generate", str(ckpt), "--input-ids", "5 17 300", "--max-new-tokens", "3", "--weights", "int8",
                 "--max-context", "64", "--check", "--json"]) == 0  # check mode: nothing raised, same tokens
    assert json.loads(capsys.readouterr().out)["tokens"] == want.tokens


def test_fp8_layout_checkpoint_generates(tmp_path):
    """The published FP8 / FP4 layout loads converted and runs the same model as its FP32 source
    up to the FP8 / FP4 rounding of its weights."""
    hf = GoldenModel(open_checkpoint(write_tiny_checkpoint(tmp_path / "hf", seed=4)))
    fp8 = GoldenModel(open_checkpoint(write_tiny_checkpoint(tmp_path / "fp8", seed=4, layout="fp8")))
    ids = list(range(10, 40))
    a, b = hf(ids), fp8(ids)
    agree = float((a.argmax(-1) == b.argmax(-1)).float().mean())
    assert agree >= 0.8, agree
    assert 0 < float((a - b).abs().max()) < 0.5 * float(a.abs().max())


def test_cli_prompt_uses_the_tokenizer(tmp_path, capsys):
    tokenizers = pytest.importorskip("tokenizers")
    d = write_tiny_checkpoint(tmp_path / "t", seed=3)
    vocab = {f"w{i}": i for i in range(512) if i not in (300, 17)}
    vocab["hello"], vocab["world"] = 300, 17
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(d / "tokenizer.json"))
    assert main(["generate", str(d), "--prompt", "hello world", "--max-new-tokens", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    want = generate(GoldenModel(open_checkpoint(d)), [[300, 17]], max_new_tokens=3)
    assert out["tokens"] == want.tokens and out["prompt_tokens"] == [2]
    assert out["text"] == [tok.decode(want.tokens[0])]
