"""``pto generate --input-ids-file`` with more than four prompts was refused ("5 requests
exceed max_requests=4"): the CLI sized its deployment for exactly four requests. The pools now
hold every prompt, and each request still gets the tokens it gets alone."""

import json

from pto.cli import main
from pto.models.deepseek_v4.checkpoint import write_tiny_checkpoint


def test_six_prompts_in_one_run_each_get_their_own_tokens(tmp_path, capsys):
    ckpt = write_tiny_checkpoint(tmp_path / "tiny", seed=3)
    prompts = ["5 6 7", "8 9", "10 11 12 13", "14", "15 16", "17 18 19"]
    f = tmp_path / "ids.txt"
    f.write_text("\n".join(prompts) + "\n")
    assert main(["generate", str(ckpt), "--input-ids-file", str(f), "--max-new-tokens", "3", "--json"]) == 0
    batch = json.loads(capsys.readouterr().out)["tokens"]
    assert len(batch) == 6
    for i in (0, 3, 5):
        assert main(["generate", str(ckpt), "--input-ids", prompts[i], "--max-new-tokens", "3", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["tokens"] == [batch[i]]
