"""Simulator and view defects a break test found:

* ``--opt seed_scopes=Flase`` (any non-boolean word) built the seed variant: a string is truthy;
  ``--opt T=True`` reached torch; an empty ``--preset`` / ``--mode`` / ``--simulate`` meant
  "not given";
* ``pto diff`` reported negative fill / seed costs (a list-scheduling anomaly) and chose its
  verdict from them;
* a task without blocks had no span in the simulated trace, so its dependency arrows vanished;
* a DOT node label kept a backslash unescaped (invalid DOT); rich markup in a task name was
  interpreted in the tables;
* ``simulate()`` with an unusable Machine looped forever or blamed the graph;
* ``cpu_trace`` of a program-cache replay showed the recording's times as this call's;
* ``pto diff`` offered ``--dim`` / ``--scalar``, which no diff can use;
* a closed stdout (``| head -1``) exited 1, the code of a failed kernel.
"""

import dataclasses
import json
import subprocess
import sys
import textwrap

import pytest
import torch

import pto
from pto.cli import main as cli_main
from pto.errors import ConfigError
from pto.runtime.simulate import MACHINES, fill_vs_seed, simulate
from pto.runtime.trace import cpu_trace, sim_trace

KERNELS = textwrap.dedent('''
    import torch
    import pto.language as pl

    @pl.jit
    def named(x: pl.Tensor[[16, 16], pl.FP32], y: pl.Out[pl.Tensor[[16, 16], pl.FP32]]):
        for b in pl.spmd(2, name_hint='we"ird\\\\name [bold]y[/bold]'):
            y[8 * b:8 * b + 8, :] = x[8 * b:8 * b + 8, :] * 2.0

    @pl.jit
    def empty_mid(x: pl.Tensor[[16, 16], pl.FP32], y: pl.Out[pl.Tensor[[16, 16], pl.FP32]]):
        a = pl.spmd(1, name_hint="a")
        for b in a:
            y[:, :] = x[:, :] * 2.0
        e = pl.spmd(0, name_hint="empty", deps=[a])
        for b in e:
            pass
        for b in pl.spmd(1, name_hint="b", deps=[e]):
            y[:, :] = x[:, :] * 3.0

    def run_named():
        return named.run(torch.randn(16, 16), torch.empty(16, 16))

    def run_empty_mid():
        return empty_mid.run(torch.randn(16, 16), torch.empty(16, 16))
''')


@pytest.fixture
def kfile(tmp_path, monkeypatch):
    (tmp_path / "edge.py").write_text(KERNELS)
    monkeypatch.chdir(tmp_path)
    return "edge.py"


@pytest.mark.parametrize("argv, message", [
    (["sim", "example_splitk_matmul", "--opt", "seed_scopes=Flase"], "--opt seed_scopes expects a boolean"),
    (["sim", "hc_pre", "--preset", "tiny", "--opt", "seed_scopes=maybe"], "--opt seed_scopes expects a boolean"),
    (["run", "example_add", "--opt", "T=True"], "--opt T expects an integer, got True"),
    (["sim", "hc_pre", "--preset", ""], "unknown preset ''"),
    (["sim", "hc_pre", "--preset", "tiny", "--mode", ""], "has no mode ''"),
    (["trace", "example_splitk_matmul", "--out", "t.json", "--simulate", ""], "unknown machine ''"),
])
def test_option_values_of_the_wrong_kind_are_errors(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli_main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "t.json").exists()


def test_diff_costs_are_never_negative_and_the_verdict_follows_them(capsys):
    from pto.cli import resolve_target
    base, seed = (resolve_target("decode_attention_csa", "tiny", None, o).run_program()
                  for o in ({}, {"seed_scopes": True}))
    rows = {r.buffer: r for r in fill_vs_seed(seed, base, "a2a3")}
    assert len(rows) == 4
    assert all(r.fill_cost_us >= 0 and r.seed_cost_us >= 0 for r in rows.values())
    sw = rows["score_wide"]  # freeing its 0.63 us fill made the greedy schedule 0.35 us slower
    assert sw.fill_us == pytest.approx(0.632, abs=1e-3)
    assert sw.fill_cost_us == 0.0 and sw.seed_cost_us == 0.0 and sw.cheaper == "equal"


def test_a_task_without_blocks_keeps_its_dependency_arrows(kfile):
    from pto.cli import resolve_target
    prog = resolve_target(f"{kfile}:run_empty_mid", None, None, {}).run_program()
    assert sum(len(t.preds) for t in prog.graph.tasks) == 3
    tr = sim_trace(simulate(prog, "a2a3"), prog)
    starts = [e for e in tr["traceEvents"] if e["ph"] == "s"]
    assert sorted((e["args"]["from"], e["args"]["to"]) for e in starts) == [(0, 1), (0, 2), (1, 2)]
    empty = [e for e in tr["traceEvents"] if e.get("cat") == "empty"]
    assert len(empty) == 1 and empty[0]["name"] == "empty" and empty[0]["dur"] == 0.0


def test_dot_labels_escape_backslashes_and_tables_do_not_read_markup(kfile, capsys):
    assert cli_main(["graph", f"{kfile}:run_named", "--dot"]) == 0
    dot = capsys.readouterr().out
    assert 't0 [label="#0 we\\"ird\\\\name [bold]y[/bold]\\n2 blocks, AIV", shape=box];' in dot
    assert cli_main(["sim", f"{kfile}:run_named", "--tasks"]) == 0
    out = capsys.readouterr().out
    assert out.count('we"ird\\name [bold]y[/bold]') == 4  # the table row, the ids line, twice in the names line
    assert '│ we"ird\\name [bold]y[/bold] │' in out


@pytest.mark.parametrize("field, value, message", [
    ("dispatch_s", float("nan"), "dispatch_s must be a finite non-negative time"),
    ("n_aic", 0, "n_aic must be a positive integer core count"),
    ("submit_s", -1e-6, "submit_s must be a finite non-negative time"),
    ("fill_bw", 0.0, "fill_bw must be a positive rate"),
    ("cube_flops", -1.0, "cube_flops must be a positive rate"),
])
def test_an_unusable_machine_is_a_config_error(field, value, message):
    from pto.cli import resolve_target
    prog = resolve_target("example_splitk_matmul", None, None, {}).run_program()
    with pytest.raises(ConfigError, match=message):
        simulate(prog, dataclasses.replace(MACHINES["a2a3"], **{field: value}))
    free = dataclasses.replace(MACHINES["a2a3"], fill_bw=float("inf"))  # inf: that work is free
    assert simulate(prog, free).effective_us < simulate(prog, "a2a3").effective_us


def test_cpu_trace_of_a_replay_is_refused():
    import pto.language as pl

    @pl.jit
    def scale(x: pl.Tensor[[16, 16], pl.FP32], y: pl.Out[pl.Tensor[[16, 16], pl.FP32]]):
        for b in pl.spmd(2, name_hint="scale"):
            y[8 * b:8 * b + 8, :] = x[8 * b:8 * b + 8, :] * 2.0

    x, y = torch.randn(16, 16), torch.empty(16, 16)
    pto.runtime.clear_program_cache()
    progs = [scale.run(x, y) for _ in range(3)]  # plain, recorded, replayed
    assert [p.replayed for p in progs] == [False, False, True]
    json.dumps(cpu_trace(progs[0]))
    with pytest.raises(ConfigError, match="is a replay of the program cache"):
        cpu_trace(progs[2])


def test_diff_takes_no_function_target_options(capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(["diff", "example_add", "--dim", "T=10"])
    assert e.value.code == 2
    assert "unrecognized arguments: --dim T=10" in capsys.readouterr().err


def test_a_closed_stdout_exits_141_quietly():
    code = ("import sys\nfrom pto.cli import main\n"
            "sys.exit(main(['sim', 'decode_attention_hca', '--preset', 'tiny', '--tasks']))\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.readline()
    p.stdout.close()  # the reader goes away after one line, as `| head -1`
    err = p.stderr.read().decode()
    assert p.wait(timeout=300) == 141, err
    assert "BrokenPipe" not in err and "error" not in err


def test_numpy_numbers_make_a_machine():
    import numpy as np
    from pto.cli import resolve_target
    prog = resolve_target("example_splitk_matmul", None, None, {}).run_program()
    m = dataclasses.replace(MACHINES["a2a3"], n_aiv=np.int64(48), fill_bw=np.float64(MACHINES["a2a3"].fill_bw))
    assert simulate(prog, m).effective_us == pytest.approx(simulate(prog, "a2a3").effective_us)
