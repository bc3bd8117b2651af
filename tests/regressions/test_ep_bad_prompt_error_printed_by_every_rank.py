"""Regression: ``pto generate --ep N`` with a bad prompt (an id outside the vocabulary, an empty
prompt, a prompt too long for the context) started N ranks, each of which found the problem and
printed it: N identical error lines. The parent now checks the prompts (and the checkpoint's
tensor list and the deployment) before it starts any rank: one error line, exit 2, no process."""

import pytest

from pto.cli import main
from pto.models.deepseek_v4.checkpoint import write_tiny_checkpoint
from pto.runtime import distributed as dist

ARGS = ["--weights", "int8", "--max-new-tokens", "3", "--max-context", "64", "--json"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return str(write_tiny_checkpoint(tmp_path_factory.mktemp("ep") / "tiny", seed=3))


def _no_spawn(*a, **k):
    raise AssertionError("a rank was started")


@pytest.mark.parametrize("inputs, needle", [
    (["--input-ids", "5 17 512"], "BindError: generate: request 0 token 2 = 512 is outside the vocabulary [0, 512)"),
    (["--input-ids", " "], "BindError: generate: request 0 has an empty prompt"),
    (["--input-ids", " ".join(["5"] * 62)],
     "CapacityError: generate: request 0 needs 62 prompt + 3 new tokens, more than the deployment's max_context=64"),
])
def test_bad_prompts_are_one_error_before_any_rank_starts(ckpt, capsys, monkeypatch, inputs, needle):
    monkeypatch.setattr(dist, "spawn", _no_spawn)
    assert main(["generate", ckpt, *inputs, *ARGS, "--ep", "2"]) == 2
    assert [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()] == [f"error: {needle}"]
