"""Regression: ``pto run rms_nrom`` printed "unknown kernel 'rms_nrom'; known kernels:
['decode_attention_csa', ... 'expert..." cut at 400 characters: the list of 37 names lost
its second half (rms_norm among them) and no close match was named.
"""

from pto.cli import main


def test_unknown_kernel_names_the_close_match_and_lists_every_kernel(capsys):
    from pto.golden import all_cases
    assert main(["run", "rms_nrom"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown kernel 'rms_nrom' (did you mean 'rms_norm'?); known kernels: [")
    assert err.count("\n") == 1 and "..." not in err
    assert all(repr(c.name) in err for c in all_cases())


def test_no_close_match_no_hint(capsys):
    assert main(["run", "xyzzy"]) == 2
    assert capsys.readouterr().err.startswith("error: unknown kernel 'xyzzy'; known kernels: [")
