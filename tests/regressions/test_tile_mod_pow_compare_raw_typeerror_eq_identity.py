"""``tile % n``, ``tile ** n``, ``tile < n`` (and ``<= > >=``) raised Python's raw TypeError, and
``tile == n`` / ``tile != n`` answered Python's identity test (a plain False / True, so
``if t == 0:`` silently took one branch). Now the comparisons are ``pl.cmp`` (a BOOL tile, the same
dtype, shape and scalar checks and errors, the same op count), a tile has no truth value (``if``,
``and`` / ``or`` / ``not``, ``assert`` on a tile are a DslError), ``==`` with a non-operand (None)
stays the identity test and tiles still hash by identity; ``%``, ``divmod``, ``**``, ``@`` and
the bitwise operators are a DslError naming the operator, the tile's shape and dtype, the kernel,
task, block and kernel-source line, and the DSL op to use (the recipes named work)."""

import os
import re

import pytest
import torch

import pto.language as pl
from pto.errors import DslError

X = [[-3, -1, 0, 2], [5, 7, 9, 11]]


def _kernel(dtype, body, out_dtype=pl.BOOL):
    @pl.jit
    def k(x: pl.Tensor[[2, 4], dtype], y: pl.Out[pl.Tensor[[2, 4], out_dtype]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="op"):
            y[0:2, 0:4] = body(x[0:2, 0:4])
        return y
    return k


def _run(dtype, body, out_dtype=pl.BOOL, x=X):
    k = _kernel(dtype, body, out_dtype)
    y = torch.zeros(2, 4, dtype=out_dtype.torch)
    prog = k.run(torch.tensor(x, dtype=dtype.torch), y)
    return y.tolist(), prog


T, F = True, False
COMPARISONS = [  # (operator form, the named op it is, expected on X: hand-computed)
    (lambda t: t < 2, lambda t: pl.cmp(t, 2, "lt"), [[T, T, T, F], [F, F, F, F]]),
    (lambda t: t <= 2, lambda t: pl.cmp(t, 2, "le"), [[T, T, T, T], [F, F, F, F]]),
    (lambda t: t > 2, lambda t: pl.cmp(t, 2, "gt"), [[F, F, F, F], [T, T, T, T]]),
    (lambda t: t >= 7, lambda t: pl.cmp(t, 7, "ge"), [[F, F, F, F], [F, T, T, T]]),
    (lambda t: t == 0, lambda t: pl.cmp(t, 0, "eq"), [[F, F, T, F], [F, F, F, F]]),
    (lambda t: t != 0, lambda t: pl.cmp(t, 0, "ne"), [[T, T, F, T], [T, T, T, T]]),
    (lambda t: 2 < t, lambda t: pl.cmp(t, 2, "gt"), [[F, F, F, F], [T, T, T, T]]),  # reflected
    (lambda t: 0 == t, lambda t: pl.cmp(t, 0, "eq"), [[F, F, T, F], [F, F, F, F]]),
    (lambda t: t == t, lambda t: pl.cmp(t, t, "eq"), [[T] * 4, [T] * 4]),
    (lambda t: t < pl.add(t, 1), lambda t: pl.cmp(t, pl.add(t, 1), "lt"), [[T] * 4, [T] * 4]),
]


@pytest.mark.parametrize("dtype", [pl.INT32, pl.INT8, pl.FP32, pl.BF16])
@pytest.mark.parametrize("i", range(len(COMPARISONS)))
def test_comparison_operators_are_pl_cmp(dtype, i):
    body, named, want = COMPARISONS[i]
    got, prog = _run(dtype, body)
    ref, ref_prog = _run(dtype, named)
    assert got == ref == want
    b, rb = prog.graph.tasks[0].blocks[0], ref_prog.graph.tasks[0].blocks[0]
    assert (b.ops, b.flops, b.vk) == (rb.ops, rb.flops, rb.vk)  # the op counted is pl.cmp's


def test_nan_compares_false_except_ne():
    nan = float("nan")
    x = [[nan, 1.0, nan, 2.0], [0.0, nan, 3.0, nan]]
    assert _run(pl.FP32, lambda t: t == t, x=x)[0] == [[F, T, F, T], [T, F, T, F]]
    assert _run(pl.FP32, lambda t: t != t, x=x)[0] == [[T, F, T, F], [F, T, F, T]]
    assert _run(pl.FP32, lambda t: t < 5.0, x=x)[0] == [[F, T, F, T], [T, F, T, F]]


def test_comparison_result_feeds_select():
    got, _ = _run(pl.INT32, lambda t: pl.select(t < 0, pl.neg(t), t), out_dtype=pl.INT32)
    assert got == [[3, 1, 0, 2], [5, 7, 9, 11]]


@pytest.mark.parametrize("body,match", [
    (lambda t: t < pl.cast(t, pl.FP32), r"pl\.cmp: operands must match in shape and dtype"),
    (lambda t: t == t[0:1, 0:4], r"pl\.cmp: operands must match in shape and dtype"),
    (lambda t: t < 300, r"pl\.cmp: value 300 out of range of pl\.INT8"),
    (lambda t: t >= 0.5, r"pl\.cmp: fractional scalar 0\.5 with a pl\.INT8 tile"),
    (lambda t: t < "a", r"pl\.cmp: expected a tile or a number, got str"),
])
def test_comparisons_raise_the_errors_of_pl_cmp(body, match):
    with pytest.raises(DslError, match=rf"task 'op' .*{match}"):
        _run(pl.INT8, body)


def _site(fn) -> str:
    """``file:line`` the runtime names for an error raised in the lambda ``fn``."""
    return re.escape(f"{os.path.basename(__file__)}:{fn.__code__.co_firstlineno}")


TRUTH = [lambda t: 1 if t == 0 else 0, lambda t: 1 if t else 0, lambda t: t < 0 or t,
         lambda t: not (t > 1), lambda t: [t for _ in range(1) if t != 3]]


@pytest.mark.parametrize("body", TRUTH)
def test_tile_has_no_truth_value(body):
    with pytest.raises(DslError, match=rf"kernel k, task 'op' \(#0\) block 0, at \S*{_site(body)}: the truth "
                                       r"value of a tile \(Tile\(\[2, 4\], pl\.\w+\)\) is undefined.*"
                                       r"use pl\.select\(mask, a, b\)"):
        _run(pl.INT32, body)


def test_eq_with_a_non_operand_is_identity_and_tiles_hash_by_identity():
    t = pl.Tile(torch.tensor(X, dtype=torch.int32))
    u = pl.Tile(torch.tensor(X, dtype=torch.int32))
    assert (t == None) is False and (t != None) is True  # noqa: E711 - the point of the test
    assert (t == "x") is False
    assert t in [t] and t in {t} and {t: 1, u: 2}[u] == 2 and len({t, u, t}) == 2
    assert hash(t) == object.__hash__(t)
    with pytest.raises(DslError, match="truth value of a tile"):
        u in [t]  # noqa: B015 - `in` compares t == u elementwise, whose truth value is undefined


NO_OP = [  # (body, operator, shown operands, hint)
    (lambda t: t % 3, "%", r"Tile\(\[2, 4\], pl\.INT32\) % 3", r"no DSL op computes a remainder"),
    (lambda t: 7 % t, "%", r"7 % Tile\(\[2, 4\], pl\.INT32\)", r"a - \(a / b\) \* b"),
    (lambda t: divmod(t, 3), "divmod", r"divmod\(Tile\(\[2, 4\], pl\.INT32\), 3\)", r"the quotient is a / b"),
    (lambda t: t ** 2, r"\*\*", r"Tile\(\[2, 4\], pl\.INT32\) \*\* 2", r"use pl\.mul\(x, x\) for a square"),
    (lambda t: 2 ** t, r"\*\*", r"2 \*\* Tile\(\[2, 4\], pl\.INT32\)", r"no DSL op raises to a power"),
    (lambda t: t @ t, "@", r"Tile\(\[2, 4\], pl\.INT32\) @ Tile\(\[2, 4\], pl\.INT32\)", r"use pl\.matmul"),
    (lambda t: t & t, "&", r"Tile\(\[2, 4\], pl\.INT32\) & Tile\(\[2, 4\], pl\.INT32\)", r"no bitwise tile ops"),
    (lambda t: 1 | t, r"\|", r"1 \| Tile\(\[2, 4\], pl\.INT32\)", r"a \| b is pl\.select\(a, a, b\)"),
    (lambda t: t ^ 1, r"\^", r"Tile\(\[2, 4\], pl\.INT32\) \^ 1", r"no bitwise tile ops"),
    (lambda t: ~t, "~", r"~Tile\(\[2, 4\], pl\.INT32\)", r"~a is pl\.cmp\(a, False, 'eq'\)"),
    (lambda t: t << 1, "<<", r"Tile\(\[2, 4\], pl\.INT32\) << 1", r"no bitwise tile ops"),
    (lambda t: t >> 1, ">>", r"Tile\(\[2, 4\], pl\.INT32\) >> 1", r"no bitwise tile ops"),
]


@pytest.mark.parametrize("i", range(len(NO_OP)))
def test_operators_without_a_dsl_op_are_dsl_errors(i):
    body, sym, shown, hint = NO_OP[i]
    with pytest.raises(DslError, match=rf"kernel k, task 'op' \(#0\) block 0, at \S*{_site(body)}: "
                                       rf"'{sym}' on a tile \({shown}\): .*{hint}"):
        _run(pl.INT32, body, out_dtype=pl.INT32)


def test_orchestration_tile_operator_names_the_line():
    @pl.jit
    def k(x: pl.Tensor[[2, 4], pl.INT32]):
        t = pl.full([2, 4], pl.INT32, 1)
        return t % 2  # the line named
    with open(__file__) as f:
        line = next(n for n, s in enumerate(f, 1) if s.endswith("t % 2  # the line named\n"))
    site = re.escape(f"{os.path.basename(__file__)}:{line}")
    with pytest.raises(DslError, match=rf"kernel k, at \S*{site}: '%' on a tile \(Tile\(\[2, 4\], pl\.INT32\) % 2\)"):
        k.run(torch.zeros(2, 4, dtype=torch.int32))


def test_named_recipes_compute_what_they_say():
    a = torch.tensor([[-7, -7, 7, 7], [-8, 9, 0, -1]], dtype=torch.int32)
    b = torch.tensor([[2, -2, 2, -2], [3, -4, 5, 1]], dtype=torch.int32)
    ta, tb = pl.Tile(a), pl.Tile(b)
    assert (ta - (ta / tb) * tb).data.tolist() == [[-1, -1, 1, 1], [-2, 1, 0, 0]]  # C's %: sign of a
    assert (ta - (ta / tb) * tb).data.tolist() == torch.fmod(a, b).tolist()
    fa, fb = pl.Tile(a.float() + 0.5), pl.Tile(b.float())
    rem = fa - fb * pl.cast(pl.cast(fa / fb, pl.INT32, mode="trunc"), fa.dtype)
    assert rem.data.tolist() == torch.fmod(a.float() + 0.5, b.float()).tolist()
    m1 = pl.Tile(torch.tensor([[T, T, F, F]]))
    m2 = pl.Tile(torch.tensor([[T, F, T, F]]))
    assert pl.select(m1, m2, False).data.tolist() == [[T, F, F, F]]  # a & b
    assert pl.select(m1, m1, m2).data.tolist() == [[T, T, T, F]]  # a | b
    assert pl.cmp(m1, False, "eq").data.tolist() == [[F, F, T, T]]  # ~a
    x = pl.Tile(torch.tensor([[1.5, 4.0]]))
    assert pl.mul(x, x).data.tolist() == [[2.25, 16.0]] and abs(pl.Tile(torch.tensor([[-2, 3]]))).data.tolist() == [[2, 3]]
