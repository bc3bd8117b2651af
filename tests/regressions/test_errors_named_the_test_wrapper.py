"""Regression: errors, traces and DOT output of a registered model kernel named its pypto-style
test wrapper, not the kernel the user asked for: ``pto check rms_norm --drop-init xyz`` said
"kernel rms_norm_test: ...", ``pto graph rms_norm --dot`` wrote ``digraph "rms_norm_test"``.
The CLI now runs a renamed copy of the wrapper (the case's name); the wrapper itself, and an
example's own ``@pl.jit`` function, keep their names.
"""

from pto import cli
from pto.golden import get_case
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.rms_norm import rms_norm_entry


def test_errors_and_dot_name_the_kernel(capsys):
    assert cli.main(["check", "rms_norm", "--preset", "tiny", "--drop-init", "xyz"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: kernel rms_norm: RunConfig.drop_init names ['xyz'] matched no allocation")
    assert "rms_norm_test" not in err
    assert cli.main(["graph", "rms_norm", "--preset", "tiny", "--dot"]) == 0
    assert capsys.readouterr().out.startswith('digraph "rms_norm" {')


def test_the_wrapper_and_example_names_are_left_alone():
    case = get_case("rms_norm")
    cr = case.build("tiny", "decode")
    named = cli._user_named(case, cr)
    assert cr.fn.__name__ == "rms_norm_test" and named.fn.__name__ == "rms_norm"
    assert named.fn.fn is cr.fn.fn and named.specs is cr.specs
    assert rms_norm_entry(get_config("tiny")).__name__ == "rms_norm_test"
    ex = get_case("example_splitk_matmul")
    ecr = ex.build("tiny", ex.modes[0])
    assert cli._user_named(ex, ecr) is ecr and ecr.fn.__name__ == "splitk_matmul"
