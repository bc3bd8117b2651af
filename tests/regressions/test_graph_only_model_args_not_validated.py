"""Regression: the graph-only model builds and ``pto graph --model`` took bad sizes and failed
deep inside (or not at all): ``--tokens 0`` ZeroDivisionError (exit 1), ``--tokens -1``
RuntimeError, ``--context -1`` accepted; ``prefill_graph(tokens=2.5)`` TypeError,
``moe_graph(tokens=-1)`` RuntimeError, ``decode_step_graph(batch=-1)`` ValueError,
``prefill_graph(context=-5)`` a DslError from inside a kernel, ``decode_step_graph(batch=0)``
silently the default batch, ``moe_graph(layer_id=99)`` built. Options that do not apply to the
chosen stage (``--tokens`` with decode, ``--context`` with moe) were ignored. Every argument is
now checked first: a ConfigError naming it and its range (exit 2 from the CLI).
"""

import pytest

from pto.cli import main
from pto.errors import ConfigError
from pto.models.deepseek_v4.graph_only import decode_step_graph, ep_step_graphs, moe_graph, prefill_graph


@pytest.mark.parametrize("fn, kw, msg", [
    (prefill_graph, {"tokens": 2.5}, "prefill_graph: tokens must be an int >= 1, got 2.5"),
    (prefill_graph, {"tokens": 0}, "prefill_graph: tokens must be an int >= 1, got 0"),
    (prefill_graph, {"context": -5}, "prefill_graph: context must be an int >= 0, got -5"),
    (moe_graph, {"tokens": -1}, "moe_graph: tokens must be an int >= 1 or None, got -1"),
    (moe_graph, {"layer_id": 99}, "moe_graph: layer_id must be an int from 0 to 5 or None, got 99"),
    (decode_step_graph, {"batch": -1}, "decode_step_graph: batch must be an int >= 1 or None, got -1"),
    (decode_step_graph, {"batch": 0}, "decode_step_graph: batch must be an int >= 1 or None, got 0"),
    (decode_step_graph, {"seq": True}, "decode_step_graph: seq must be an int >= 1 or None, got True"),
    (decode_step_graph, {"context": -1}, "decode_step_graph: context must be an int >= 0 or None, got -1"),
    (decode_step_graph, {"ep": 0}, "decode_step_graph: ep must be an int >= 1, got 0"),
    (decode_step_graph, {"ep": 2, "rank": 2}, "decode_step_graph: rank must be an int from 0 to 1, got 2"),
    (ep_step_graphs, {"ep": 2, "batch": 0}, "ep_step_graphs: batch must be an int >= 1 or None, got 0"),
])
def test_python_arguments_checked_first(fn, kw, msg):
    with pytest.raises(ConfigError) as e:
        fn("tiny", **kw)
    assert str(e.value) == msg


@pytest.mark.parametrize("argv, msg", [
    ("--stage prefill --tokens 0", "--tokens must be an integer >= 1, got 0"),
    ("--stage prefill --tokens -1", "--tokens must be an integer >= 1, got -1"),
    ("--context -1", "--context must be an integer >= 0, got -1"),
    ("--stage decode --tokens 5", "--tokens: only with --stage prefill or moe"),
    ("--tokens 5", "--tokens: only with --stage prefill or moe"),
    ("--stage moe --context 3", "--context: not with --stage moe"),
    ("--ep 2 --rank 2", "--rank must be a rank of --ep 2 (0 .. 1), got 2"),
])
def test_cli_model_options_checked(capsys, argv, msg):
    assert main(["graph", "--model", "tiny", *argv.split()]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: pto graph --model ") and msg in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("opt", ["--tokens 5", "--context 3", "--stage moe", "--layers", "--rank 1"])
def test_cli_model_options_rejected_for_a_kernel(capsys, opt):
    assert main(["graph", "rms_norm", "--preset", "tiny", *opt.split()]) == 2
    err = capsys.readouterr().err
    assert f"error: pto graph {opt.split()[0]}: only with --model PRESET" in err


def test_cli_moe_stage_takes_tokens(capsys):
    assert main(["graph", "--model", "tiny", "--stage", "moe", "--tokens", "4", "--json"]) == 0
    assert '"tokens": 4' in capsys.readouterr().out
    g = moe_graph("tiny", layer_id=5)
    assert g.stages[0].name == "L5 moe"
