"""rms_norm DSL kernel vs its golden (pypto-lib `models/deepseek/v4-flash/rmsnorm.py`): tiny preset at every tail
shape, the task graph, the returned task id, tiling and shape errors; FLASH twins slow."""

import pytest
import torch

import pto
import pto.language as pl
from pto.golden import run_jit
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.rms_norm import RMS_T_TILE, build_rms_norm, rms_norm, rms_norm_entry, rms_norm_tiling

TINY = get_config("tiny")
T_DYN = pl.dynamic("T")


def _run(preset="tiny", mode="prefill", **opts):
    cr = build_rms_norm(preset, mode, **opts)
    return run_jit(cr.fn, cr.specs, cr.golden, cr.compare, rtol=cr.rtol, atol=cr.atol)


@pytest.mark.parametrize("T", [1, 7, 8, 16, 24, 128])
def test_rms_norm_matches_golden(T):
    res = _run(T=T)
    assert res.passed, res.error
    assert res.outputs["x_normed"].label.startswith("ratio_allclose(atol=0.0001, rtol=0.0078125")
    g = res.program.graph
    assert [(t.name, t.n_blocks) for t in g.tasks] == [("rms_norm", -(-T // RMS_T_TILE))]
    assert g.edges() == set()
    assert res.program.stats.scratch_tensors == 0


def test_rms_norm_returns_its_task_id_for_late_dep_gates():
    D = TINY.hidden_size

    @pl.jit
    def entry(x: pl.Tensor[[T_DYN, D], pl.BF16], w: pl.Tensor[[D], pl.BF16],
              y: pl.Out[pl.Tensor[[T_DYN, D], pl.BF16]]):
        tid = rms_norm(x, w, y, TINY)
        gate = pl.system.task_dummy(deps=[tid])
        return tid, gate

    x, w = torch.randn(12, D).bfloat16(), torch.ones(D).bfloat16()
    prog = entry.run(x, w, torch.zeros(12, D, dtype=torch.bfloat16))
    tid, gate = prog.result
    assert prog.graph[tid].name == "rms_norm"
    assert prog.graph[gate].kind == "dummy" and prog.graph[gate].preds == {tid}


def test_rms_norm_config_and_shape_errors():
    with pytest.raises(pto.ConfigError, match="hidden_size=100"):
        rms_norm_tiling(TINY.replace(hidden_size=100))
    with pytest.raises(pto.ConfigError, match="no seed variant"):
        build_rms_norm("tiny", "decode", seed_scopes=True)
    entry = rms_norm_entry(TINY)
    with pytest.raises(pto.BindError, match="'w'"):
        entry.run(torch.zeros(4, TINY.hidden_size, dtype=torch.bfloat16), torch.zeros(64, dtype=torch.bfloat16),
                  torch.zeros(4, TINY.hidden_size, dtype=torch.bfloat16))


def test_rms_norm_modes_tokens():
    assert build_rms_norm("flash", "decode").specs[0].shape == [8, 4096]
    assert build_rms_norm("flash", "prefill").specs[0].shape == [128, 4096]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_rms_norm_flash(mode):
    res = _run("flash", mode)
    assert res.passed, res.error


def test_rms_norm_token_tile_does_not_change_values(monkeypatch):
    """The CPU-sized token tile is value-neutral: the reference's 8-row blocks give the
    same bits (and 16 blocks at T=128)."""
    import pto.models.deepseek_v4.rms_norm as mod
    big = _run(T=128)
    monkeypatch.setattr(mod, "RMS_T_TILE", 8)
    ref = _run(T=128)
    assert ref.passed and ref.program.graph.tasks[0].n_blocks == 16
    assert torch.equal(big.actual["x_normed"], ref.actual["x_normed"])


@pytest.mark.slow
def test_rms_norm_every_token_count_up_to_capacity():
    failed = [T for T in range(1, 129) if not _run(T=T).passed]
    assert failed == []
