"""Regression: the CLI's one-line summaries pluralised every count, so a one-task kernel
printed "1 tasks" and a one-edge graph "1 edges" (``pto check``'s PASS line, ``pto graph``'s
title, ``pto sim``'s critical path). They now say "1 task", "1 edge", "1 join node".
"""

from pathlib import Path

from pto import cli

ADD = f"{Path(__file__).resolve().parents[2] / 'examples' / 'add_example.py'}:add_kernel"


def test_count_singular_and_plural():
    assert [cli.count(n, "task") for n in (0, 1, 2)] == ["0 tasks", "1 task", "2 tasks"]
    assert cli.count(1, "join node") == "1 join node" and cli.count(3, "join node") == "3 join nodes"
    assert cli.count(2, "child", "children") == "2 children"


def test_one_task_and_one_edge_are_singular(capsys):
    assert cli.main(["check", ADD, "--dim", "T=100"]) == 0
    out = capsys.readouterr().out
    assert out.endswith("no undefined outputs, no races (1 task; no golden)\n")
    assert cli.main(["graph", ADD, "--dim", "T=100"]) == 0
    assert ": 1 task, 0 join nodes, 0 edges" in capsys.readouterr().out
    assert cli.main(["graph", "example_splitk_matmul"]) == 0
    assert "example_splitk_matmul default: 2 tasks, 0 join nodes, 1 edge\n" in capsys.readouterr().out
    assert cli.main(["check", "example_splitk_matmul"]) == 0
    assert ", 2 tasks, 1 edge, heap peak " in capsys.readouterr().out
    assert cli.main(["sim", ADD, "--dim", "T=100"]) == 0
    assert "1 task, " in next(ln for ln in capsys.readouterr().out.splitlines() if "critical path" in ln)
