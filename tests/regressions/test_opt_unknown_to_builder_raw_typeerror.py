"""Regression: ``--opt weight_format=bf16`` on a kernel whose builder has no such parameter
(hc_pre, rms_norm, ... about twelve kernels) printed Python's "build_hc_pre() got an unexpected
keyword argument 'weight_format'"; the builders that take ``**options`` say "unknown options
[...]". Now every kernel case says the latter, with the options it does take (exit 2).
"""

import pytest

from pto.cli import main


@pytest.mark.parametrize("kernel", ["hc_pre", "rms_norm", "lm_head"])
def test_unknown_option_names_the_builders_options(capsys, kernel):
    assert main(["run", kernel, "--preset", "tiny", "--opt", "weight_format=bf16"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {kernel}: unknown options ['weight_format'] (its options: ")
    assert "unexpected keyword" not in err


def test_known_option_still_reaches_the_builder(capsys):
    assert main(["run", "moe", "--preset", "tiny", "--opt", "weight_format=bf16"]) == 0
    assert main(["run", "moe", "--preset", "tiny", "--opt", "foo=1"]) == 2
    err = capsys.readouterr().err
    assert "error: moe: unknown options ['foo'] (its options: T, seed, layer_id" in err
