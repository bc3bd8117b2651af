"""hc_post / hc_post_prefill DSL kernels against their goldens (pypto-lib `models/deepseek/v4-flash/hc_post.py`).

The kernel computes ``post*x`` then adds the input streams in order, exactly as the golden,
so results are compared bit for bit (the registered tolerance is allclose 1e-3).
"""

import pytest
import torch

import pto
from pto.errors import BindError
from pto.golden import get_case, run_jit
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.hc_post import (HC_POST_PAD_TILE, HC_POST_TOKEN_TILE, golden_hc_post_prefill,
                                            hc_post_kernels, make_hc_post_inputs)

TINY = get_config("tiny")


def _run_case(preset, mode, **opts):
    cr = get_case("hc_post").build(preset, mode, **opts)
    res = run_jit(cr.fn, cr.specs, cr.golden, cr.compare, cr.rtol, cr.atol)
    assert res.passed, res.error
    return res


@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_hc_post_matches_golden_bit_for_bit(mode):
    res = _run_case("tiny", mode)
    assert torch.equal(res.actual["y"], res.expected["y"])
    names = [t.name for t in res.program.graph.tasks]
    assert names == (["hc_post"] if mode == "decode" else ["hc_post_prefill"])


def test_prefill_tail_rows_exactly_zero_and_graph():
    T, nt = 23, 5  # ragged: the active 16-token tile has 5 rows, the last pad tile 2 rows
    res = _run_case("tiny", "prefill", T=T, num_tokens=nt)
    y = res.actual["y"]
    assert torch.equal(y[:nt], res.expected["y"][:nt])
    assert torch.count_nonzero(y[nt:]) == 0
    g = res.program.graph
    assert [(t.name, t.n_blocks) for t in g.tasks] == [
        ("hc_post_prefill", -(-nt // HC_POST_TOKEN_TILE)),
        ("hc_post_inactive_pad", -(-(T - nt) // HC_POST_PAD_TILE))]
    assert res.program.stats.edges == 0  # disjoint rows of y, no scratch


@pytest.mark.parametrize("num_tokens,tasks", [(0, ["hc_post_inactive_pad"]), (40, ["hc_post_prefill"]),
                                              (-3, ["hc_post_inactive_pad"])])
def test_num_tokens_is_clamped(num_tokens, tasks):
    T = 16
    k = hc_post_kernels(TINY)
    d = make_hc_post_inputs(TINY, T, seed=3)
    y = torch.full((T, TINY.hc_mult, TINY.hidden_size), 7.0)
    prog = k.hc_post_prefill_test.run(d["x"], d["residual"], d["post"], d["comb"], y, num_tokens,
                                      config=pto.RunConfig(check=True))
    assert [t.name for t in prog.graph.tasks] == tasks
    assert torch.equal(y, golden_hc_post_prefill(d["x"], d["residual"], d["post"], d["comb"], num_tokens))


def test_bad_shape_raises_bind_error():
    k = hc_post_kernels(TINY)
    d = make_hc_post_inputs(TINY, 8, seed=0)
    y = torch.zeros(8, TINY.hc_mult, TINY.hidden_size)
    with pytest.raises(BindError, match="comb"):
        k.hc_post_test(d["x"], d["residual"], d["post"], d["comb"][:, :15].contiguous(), y)
    with pytest.raises(BindError, match="dynamic dim T"):
        k.hc_post_test(d["x"][:7].contiguous(), d["residual"], d["post"], d["comb"], y)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_hc_post_flash(mode):
    res = _run_case("flash", mode, **({"num_tokens": 100} if mode == "prefill" else {}))
    assert torch.equal(res.actual["y"], res.expected["y"])


def test_stable_inline_signatures():
    from pto.models.deepseek_v4.hc_post import hc_post, hc_post_prefill, golden_hc_post
    import pto.language as pl

    @pl.jit
    def entry(x: pl.Tensor, residual: pl.Tensor, post: pl.Tensor, comb: pl.Tensor, y: pl.Out[pl.Tensor],
              y2: pl.Out[pl.Tensor]):
        hc_post(x, residual, post, comb, y, TINY)
        hc_post_prefill(x, residual, post, comb, y2, 6, TINY)
        return y, y2

    d = make_hc_post_inputs(TINY, 10, seed=9)
    y, y2 = torch.zeros(10, TINY.hc_mult, TINY.hidden_size), torch.zeros(10, TINY.hc_mult, TINY.hidden_size)
    entry(d["x"], d["residual"], d["post"], d["comb"], y, y2)
    assert torch.equal(y, golden_hc_post(d["x"], d["residual"], d["post"], d["comb"]))
    assert torch.equal(y2, golden_hc_post_prefill(d["x"], d["residual"], d["post"], d["comb"], 6))
