"""A tiny-checkpoint prompt of 2176 tokens passed `pto generate`'s up-front checks (the CLI's
deployment allows min(max_position_embeddings, 16384) tokens) and failed ~15 s into prefill with
a BindError from prefill_attention_hca ("token 127 sees 17 compressed entries, the sparse-attention
core attends 16"), exit 1. The up-front check now also caps a request at what the HCA cores see
whole (generate.hca_context): one CapacityError before any work, exit 2."""

import pytest

from pto import cli
from pto.errors import CapacityError
from pto.models.deepseek_v4.checkpoint import write_tiny_checkpoint
from pto.models.deepseek_v4.config import DeploymentConfig, get_config
from pto.models.deepseek_v4.generate import check_prompts, hca_context


def test_the_tiny_reach_is_the_hca_cores_limit():
    cfg = get_config("tiny")
    # the prefill core attends 16 compressed entries: position p sees (p + 1) // 128 of them
    assert hca_context(cfg) == 17 * 128 - 1 == 2175
    assert (2174 + 1) // 128 == 16 and (2175 + 1) // 128 == 17


def test_check_prompts_stops_a_request_past_the_reach():
    cfg = get_config("tiny")
    dep = DeploymentConfig.sized(cfg, 4, min(cfg.max_position_embeddings, 16384), block_size=16)
    assert dep.max_context > 2175  # the deployment alone would let it through
    assert check_prompts([[1] * 2174], cfg, dep, 1) == [[1] * 2174]
    with pytest.raises(CapacityError, match=r"request 0 needs 2175 prompt \+ 1 new tokens, more than the 2175 "
                                            r"the HCA attention cores of config 'tiny'"):
        check_prompts([[1] * 2175], cfg, dep, 1)


def test_cli_exits_2_before_any_work(tmp_path, capsys):
    ck = write_tiny_checkpoint(tmp_path / "tiny", seed=0)
    ids = tmp_path / "ids.txt"
    ids.write_text(" ".join(["5"] * 2176) + "\n")
    code = cli.main(["generate", str(ck), "--input-ids-file", str(ids), "--max-new-tokens", "2"])
    err = capsys.readouterr().err
    assert code == 2
    assert "HCA attention cores" in err and "2176 prompt + 2 new tokens" in err
