"""Regression: ``pto generate --prompt`` imports the ``tokenizers`` package, but pyproject.toml
did not declare it anywhere, so an install by ``make demo`` (runtime dependencies only) could
not run the README's ``--prompt`` example, and the error said ``pip install tokenizers`` with
nothing in the project to say so. It is now pto's ``text`` extra (``pip install -e '.[text]'``;
``make test`` installs it), and the error names that install command.

The wheel alone is 3.4 MB but it pulls in huggingface-hub and 13 more packages (11 MB in
all, a network client among them) that nothing else in pto needs, so it is an extra, not a
runtime dependency.
"""

import json
import sys
import tomllib
from pathlib import Path

import pytest

from pto.cli import main
from pto.models.deepseek_v4.checkpoint import write_tiny_checkpoint

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tok") / "tiny", seed=3)


def test_the_text_extra_declares_tokenizers():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["optional-dependencies"]["text"] == ["tokenizers"]
    assert not any(d.startswith("tokenizers") for d in project["dependencies"])
    make = (ROOT / "Makefile").read_text()
    assert "'.[test,parity,text]'" in make  # make test installs it


def test_prompt_without_the_package_names_the_extra(tiny, capsys, monkeypatch):
    (tiny / "tokenizer.json").write_text("{}")  # present: the package is what is missing
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # `import tokenizers` raises ImportError
    try:
        assert main(["generate", str(tiny), "--prompt", "hello"]) == 2
    finally:
        (tiny / "tokenizer.json").unlink()
    out, err = capsys.readouterr()
    assert out == ""
    assert err == ("error: --prompt needs the 'tokenizers' package, pto's 'text' extra: pip install -e '.[text]' "
                   "in the pto source tree (or pip install tokenizers)\n")


def test_prompt_without_a_tokenizer_json_names_the_file(tiny, capsys):
    assert main(["generate", str(tiny), "--prompt", "hello"]) == 2
    assert capsys.readouterr().err == f"error: --prompt needs a tokenizer: no tokenizer.json in {tiny}\n"


def test_prompt_with_a_tokenizer_written_by_tokenizers(tiny, tmp_path, capsys):
    tokenizers = pytest.importorskip("tokenizers")
    d = tmp_path / "with_tok"
    d.mkdir()
    for f in tiny.iterdir():
        (d / f.name).symlink_to(f)
    # a byte-level BPE trained on a few words: real merges, not a hand-made table
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=120, special_tokens=["[UNK]"])
    tok.train_from_iterator(["the tile runs a task", "a task graph of tiles", "tiles and tasks"] * 4, trainer)
    tok.save(str(d / "tokenizer.json"))
    ids = tok.encode("the task graph").ids
    assert 1 < len(ids) and max(ids) < 120
    # the same run as --input-ids with the encoded ids (one path: a near-tie logit cannot differ)
    fast = ["--max-new-tokens", "3", "--backend", "golden"]
    assert main(["generate", str(d), "--input-ids", " ".join(map(str, ids)), *fast, "--json"]) == 0
    want = json.loads(capsys.readouterr().out)
    assert main(["generate", str(d), "--prompt", "the task graph", *fast, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["prompt_tokens"] == [len(ids)] and out["tokens"] == want["tokens"] and len(want["tokens"][0]) == 3
    assert out["text"] == [tok.decode(want["tokens"][0])] and "text" not in want
    assert main(["generate", str(d), "--prompt", "the task graph", *fast]) == 0
    text = capsys.readouterr().out
    assert f"tokens: {' '.join(map(str, want['tokens'][0]))}  ({want['stop_reasons'][0]})" in text
    assert f"text: {tok.decode(want['tokens'][0])}" in text
