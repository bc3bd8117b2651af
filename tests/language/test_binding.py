"""Argument binding (docs/dsl.md; language/jit.py): each mismatch is a
BindError naming the kernel, the parameter and both values."""

import pytest
import torch

import pto
import pto.language as pl
from pto.errors import BindError, DslError

T = pl.dynamic("T")


@pl.jit
def kern(x: pl.Tensor[[T, 8], pl.BF16], w: pl.Tensor[[8, 4], pl.FP32], y: pl.Out[pl.Tensor[[T, 4], pl.FP32]],
         n: pl.Scalar[pl.INT32], eps: pl.Scalar[pl.FP32] = 1e-6, cfg=None):
    return y


def args(**over):
    a = dict(x=torch.zeros(5, 8, dtype=torch.bfloat16), w=torch.zeros(8, 4), y=torch.zeros(5, 4), n=3)
    a.update(over)
    return a


def test_good_arguments_bind_and_defaults_apply():
    p = kern.run(**args())
    assert p.stats.tasks == 0
    assert kern(**args(cfg=object())) is not None


@pytest.mark.parametrize("over, match", [
    (dict(x=torch.zeros(5, 8, 1, dtype=torch.bfloat16)), r"parameter 'x': rank 3 .* annotation rank 2"),
    (dict(w=torch.zeros(8, 5)), r"parameter 'w': dim 1 is 5, annotation requires 4"),
    (dict(y=torch.zeros(6, 4)), r"parameter 'y': dynamic dim T \(dim 0\) is 6, but parameter 'x' bound it to 5"),
    (dict(x=torch.zeros(5, 8)), r"parameter 'x': dtype pl.FP32 does not match annotation pl.BF16"),
    (dict(w=[[0.0] * 4] * 8), r"parameter 'w' expects a torch tensor, got list"),
    (dict(n=1.5), r"scalar parameter 'n' \(pl.INT32\) expects an int"),
    (dict(n=True), r"scalar parameter 'n' \(pl.INT32\) expects an int"),
    (dict(n=2 ** 31), r"scalar parameter 'n' value 2147483648 out of range of pl.INT32"),
    (dict(eps="small"), r"scalar parameter 'eps' \(pl.FP32\) expects a number"),
    (dict(n=torch.zeros(2, dtype=torch.int32)), r"scalar parameter 'n' got a tensor of shape \[2\]"),
])
def test_bind_errors_name_the_parameter(over, match):
    with pytest.raises(BindError, match=match) as e:
        kern.run(**args(**over))
    assert "kernel kern" in str(e.value)


def test_missing_and_extra_arguments():
    a = args()
    del a["n"]
    with pytest.raises(BindError, match="kernel kern: missing a required argument: 'n'"):
        kern.run(**a)
    with pytest.raises(BindError, match="unexpected keyword argument 'zzz'"):
        kern.run(**args(zzz=1))


def test_zero_dim_tensor_scalar_is_accepted():
    assert kern.run(**args(n=torch.tensor(4, dtype=torch.int32))).stats.tasks == 0


def test_non_contiguous_tensor_is_a_bind_error():
    with pytest.raises(BindError, match="'w' must be contiguous"):
        kern.run(**args(w=torch.zeros(4, 8).t()))


def test_dynamic_dims_bind_per_call():
    for t in (3, 9):  # T binds afresh per call: 3, then 9, each consistent across x and y
        y = torch.zeros(t, 4)
        prog = kern.run(**args(x=torch.zeros(t, 8, dtype=torch.bfloat16), y=y))
        assert prog.result is y
        assert [tuple(g.shape) for _, _, g in prog.args[:3]] == [(t, 8), (8, 4), (t, 4)]


def test_bare_tensor_annotation_accepts_any_shape_and_dtype():
    @pl.jit
    def k(x: pl.Tensor, y: pl.Out[pl.Tensor]):
        with pl.at(name_hint="copy"):
            y[0, 0, 0:3] = pl.cast(x[0:3], pl.FP32)
        return y

    y = torch.zeros(2, 2, 3)
    k.run(torch.tensor([1, 2, 3], dtype=torch.int8), y)
    assert y[0, 0].tolist() == [1.0, 2.0, 3.0] and (y[1] == 0).all()


def test_inline_function_checks_its_annotations_against_gm_tensors():
    @pl.jit.inline
    def helper(a: pl.Tensor[[4, 4], pl.FP32], out: pl.Out[pl.Tensor[[4, 4], pl.FP32]]):
        with pl.at(name_hint="helper"):
            out[:, :] = a[:, :] * 2.0
        return out

    @pl.jit
    def outer(x: pl.Tensor[[4, 4], pl.FP32], y: pl.Out[pl.Tensor[[4, 4], pl.FP32]]):
        return helper(x, y)

    @pl.jit
    def wrong(x: pl.Tensor[[4, 8], pl.FP32], y: pl.Out[pl.Tensor[[4, 4], pl.FP32]]):
        return helper(x, y)

    x, y = torch.randn(4, 4), torch.zeros(4, 4)
    assert outer(x, y) is y and torch.equal(y, 2 * x)
    with pytest.raises(BindError, match="kernel helper: parameter 'a': dim 1 is 8"):
        wrong(torch.zeros(4, 8), torch.zeros(4, 4))
    with pytest.raises(BindError, match="expects a GM tensor"):
        @pl.jit
        def raw(x: pl.Tensor[[4, 4], pl.FP32], y: pl.Out[pl.Tensor[[4, 4], pl.FP32]]):
            return helper(torch.zeros(4, 4), y)
        raw(x, y)
    # called outside a program, an inline function is its own entry program
    y2 = torch.zeros(4, 4)
    helper(x, y2)
    assert torch.equal(y2, 2 * x)


def test_jit_entry_runs_an_inline_body_as_a_named_program():
    @pl.jit.inline
    def body(a: pl.Tensor[[4, 4], pl.FP32], out: pl.Out[pl.Tensor[[4, 4], pl.FP32]]):
        with pl.at(name_hint="body"):
            out[:, :] = a[:, :] * 2.0
        return out

    @pl.jit
    def forward(a: pl.Tensor[[4, 4], pl.FP32], out: pl.Out[pl.Tensor[[4, 4], pl.FP32]]):
        return body(a, out)

    entry = pl.jit.entry(body, name="body_test")
    assert not entry.inline and entry.__name__ == "body_test"
    assert entry.__qualname__.endswith(".body_test") and entry.fn is body.fn
    x = torch.randn(4, 4)
    y1, y2 = torch.zeros(4, 4), torch.zeros(4, 4)
    p1, p2 = forward.run(x, y1), entry.run(x, y2)
    assert p2.name == "body_test" and torch.equal(y2, 2 * x) and torch.equal(y1, y2)
    assert [t.name for t in p2.graph.tasks] == [t.name for t in p1.graph.tasks] == ["body"]
    assert entry(x, y2) is y2
    with pytest.raises(BindError, match="kernel body_test: parameter 'a': dim 1 is 8"):
        entry(torch.zeros(4, 8), y2)
    assert pl.jit.entry(body).__name__ == "body"
    with pytest.raises(DslError, match="expects a @pl.jit.inline function"):
        pl.jit.entry(forward)
    with pytest.raises(DslError, match="expects a @pl.jit.inline function"):
        pl.jit.entry(lambda a: a)


def test_writing_an_in_parameter_is_a_dsl_error():
    @pl.jit
    def k(x: pl.Tensor[[4, 4], pl.FP32]):
        with pl.at(name_hint="bad"):
            x[:, :] = pl.full([4, 4], pl.FP32, 0.0)

    x = torch.ones(4, 4)
    with pytest.raises(DslError, match="declared In"):
        k.run(x)
    assert (x == 1).all()


def test_postponed_annotations_are_a_dsl_error():
    def f(x: "NoSuchType"):  # noqa: F821 - deliberately unresolvable
        pass

    with pytest.raises(DslError, match="cannot evaluate its annotations"):
        pl.jit(f).run(torch.zeros(1))


def test_a_program_cannot_start_inside_another():
    @pl.jit
    def inner(x: pl.Tensor[[2], pl.FP32]):
        pass

    @pl.jit
    def outer(x: pl.Tensor[[2], pl.FP32]):
        inner.run(x)

    with pytest.raises(DslError, match="called inside a running program"):
        outer.run(torch.zeros(2))


def test_dtype_errors_name_torch_dtypes_that_have_no_exact_pto_dtype():
    with pytest.raises(BindError, match="parameter 'w': dtype torch.float64 does not match annotation pl.FP32"):
        kern.run(**args(w=torch.zeros(8, 4, dtype=torch.float64)))

    @pl.jit
    def bare(x: pl.Tensor):
        pass

    with pytest.raises(BindError, match="parameter 'x': dtype torch.complex64 has no pto dtype"):
        bare.run(torch.zeros(2, dtype=torch.complex64))
