"""Regression: ``pto generate --input-ids`` parsed ids with ``int()`` and, on failure, looked for
the bad token with ``str.isdigit``: a token both rejected ('--5', '²': isdigit after stripping
'-', but not an int) made that search raise a bare StopIteration, printed as
"error: StopIteration:" with exit 1; '1_0' (int()'s digit grouping) was taken as id 10. Each id is
now ASCII digits with an optional sign, anything else one ConfigError line naming the token and
where it came from, exit 2. An --input-ids-file with no prompt line names the file (it was
generate's "prompts must be a non-empty list")."""

import pytest

from pto import cli


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("ck") / "tiny"
    assert cli.main(["checkpoint", "tiny", str(d), "--seed", "0"]) == 0
    return str(d)


@pytest.mark.parametrize("ids", ["1 --5", "1 ²", "1 1_0", "3 -+5", "7 x"])
def test_bad_token_id_is_one_config_error_line(ckpt, ids, capsys):
    code = cli.main(["generate", ckpt, "--input-ids", ids, "--max-new-tokens", "1"])
    err = capsys.readouterr().err
    bad = ids.split()[1]
    assert code == 2
    assert err.strip() == f"error: --input-ids: {bad!r} is not an integer token id"


def test_bad_token_in_a_file_names_the_line(ckpt, tmp_path, capsys):
    f = tmp_path / "ids.txt"
    f.write_text("5 17\n\n3 --5\n")
    code = cli.main(["generate", ckpt, "--input-ids-file", str(f), "--max-new-tokens", "1"])
    assert code == 2
    assert capsys.readouterr().err.strip() == f"error: {f} line 3: '--5' is not an integer token id"


def test_file_without_a_prompt_names_the_file(ckpt, tmp_path, capsys):
    f = tmp_path / "blank.txt"
    f.write_text("\n  \n")
    code = cli.main(["generate", ckpt, "--input-ids-file", str(f)])
    assert code == 2
    assert capsys.readouterr().err.strip() == (f"error: --input-ids-file: {f} holds no prompt (no line with a "
                                               "token id; one prompt per line)")


def test_signed_ids_still_parse(ckpt, capsys):
    code = cli.main(["generate", ckpt, "--input-ids", "+5,7", "--max-new-tokens", "1", "--backend", "golden"])
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("tokens: ")
