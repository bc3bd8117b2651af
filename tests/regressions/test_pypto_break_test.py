"""`pto pypto` defects a pypto-lib user found by running pypto-lib's own kernel style:

* a spec without ``is_output`` (the current harness stamps the direction from the kernel
  signature) was never validated, so a wrong golden printed PASS;
* a ``with pl.spmd`` body with a ``pl.system.syncall()`` shared its variables between blocks
  (every block wrote the last block's rows);
* an uninitialised ``pl.create_tile`` whose poison the tile math discarded (``maximum`` against
  0xAB..., ``cmp`` against NaN) passed check mode;
* a kernel called directly (not through the harness) ran without check mode;
* ``pl.range(init_values=)`` and pypto keywords pto lacks were Python TypeErrors;
* a user checkout whose path contains ``/pto/`` was taken for pto's own code in error sites.
"""

import textwrap

import pytest

from pto.cli import main as cli_main
from pto.compat import run_file

HEAD = """\
import pypto.language as pl
import torch
"""


def _script(tmp_path, body: str, name: str = "k.py", folder: str = ""):
    d = tmp_path / folder if folder else tmp_path
    d.mkdir(parents=True, exist_ok=True)
    p = d / name
    p.write_text(HEAD + textwrap.dedent(body))
    return p


def _run(path, capsys, *argv):
    code = run_file(str(path), list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


HELLO = """
R, C = 64, 32

@pl.jit
def hello(x: pl.Tensor[[R, C], pl.FP32], a: pl.Scalar[pl.FP32], y: pl.Out[pl.Tensor[[R, C], pl.FP32]]):
    for r in pl.parallel(0, R, 16):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="add_scalar"):
            y[r:r + 16, :] = pl.add(x[r:r + 16, :], a)

if __name__ == "__main__":
    from golden import ScalarSpec, TensorSpec, run_jit
    specs = [TensorSpec("x", [R, C], torch.float32, init_value=torch.randn),
             ScalarSpec("a", torch.float32, 1.5),
             TensorSpec("y", [R, C], torch.float32)]     # no is_output: the signature says Out
    def golden(v):
        v["y"][:] = v["x"] + GOLDEN_SCALE * v["a"]
    r = run_jit(hello, specs, golden)
    raise SystemExit(0 if r.passed else 1)
"""


@pytest.mark.parametrize("scale, code, verdict", [(1, 0, "'y' PASS"), (2, 1, "'y' FAIL")])
def test_an_output_named_only_by_the_signature_is_validated(tmp_path, capsys, scale, code, verdict):
    p = _script(tmp_path, HELLO.replace("GOLDEN_SCALE", str(scale)))
    got, out, err = _run(p, capsys)
    assert got == code, out + err
    assert verdict in out


def test_a_golden_with_no_output_to_compare_fails(tmp_path, capsys):
    p = _script(tmp_path, HELLO.replace("GOLDEN_SCALE", "1").replace(
        'TensorSpec("y", [R, C], torch.float32)]', 'TensorSpec("y", [R, C], torch.float32, is_output=False)]'))
    got, out, err = _run(p, capsys)
    assert got == 1, out + err


@pytest.mark.parametrize("op", [
    "acc = pl.maximum(acc, xi)",                                    # 0xAB.. INT32 loses every maximum
    "acc = pl.select(pl.cmp(acc, xi, 'ge'), acc, xi)",              # NaN compares false
    "acc = pl.add(xi, pl.mul(pl.cast(acc, pl.FP32), 0.0))",        # times zero
])
def test_an_uninitialised_on_chip_buffer_reaching_an_output_is_an_error(tmp_path, capsys, op):
    dt = "pl.INT32" if "maximum" in op else "pl.FP32"
    p = _script(tmp_path, f"""
        @pl.jit
        def colmax(x: pl.Tensor[[8, 64], {dt}], y: pl.Out[pl.Tensor[[8, 32], {dt}]]):
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="colmax"):
                acc = pl.create_tile([8, 32], dtype={dt})
                for kb in pl.range(2):
                    xi = x[:, kb * 32:(kb + 1) * 32]
                    {op}
                y[:, :] = pl.cast(acc, {dt})

        x = (torch.randn(8, 64) * 10).to(torch.{'int32' if dt == 'pl.INT32' else 'float32'})
        colmax(x, torch.zeros(8, 32, dtype=x.dtype))
    """)
    got, out, err = _run(p, capsys)
    assert got == 1
    assert "UndefinedOutputError" in err and "output 'y' [8, 32] has 256 undefined" in err
    assert "on-chip buffer [8, 32]" in err and "k.py:7 (pl.create_tile" in err


def test_an_on_chip_buffer_written_before_it_is_read_passes(tmp_path, capsys):
    p = _script(tmp_path, """
        @pl.jit
        def colmax(x: pl.Tensor[[8, 64], pl.FP32], y: pl.Out[pl.Tensor[[8, 32], pl.FP32]]):
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="colmax"):
                acc = pl.create_tile([8, 32], dtype=pl.FP32)
                acc[:, 0:16] = x[:, 0:16]
                acc[:, 16:32] = x[:, 16:32]
                acc = pl.maximum(acc, x[:, 32:64])
                y[:, :] = acc

        x = torch.randn(8, 64); y = torch.zeros(8, 32)
        colmax(x, y)
        assert torch.equal(y, torch.maximum(x[:, :32], x[:, 32:]))
    """)
    got, out, err = _run(p, capsys)
    assert got == 0, out + err


RACY_DIRECT = """
@pl.jit
def racy(x: pl.Tensor[[32, 16], pl.FP32], y: pl.Out[pl.Tensor[[32, 16], pl.FP32]]):
    with pl.spmd(4, name_hint="racy"):
        b = pl.tile.get_block_idx()
        y[0:8, :] = pl.add(x[0:8, :], 1.0 * b)

racy(torch.randn(32, 16), torch.zeros(32, 16))
"""

LOOP_CARRIED = """
@pl.jit
def k(a: pl.Tensor[[16, 64], pl.FP32], y: pl.Out[pl.Tensor[[16, 32], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP):
        acc = pl.full([16, 32], dtype=pl.FP32, value=0.0)
        for i, (acc,) in pl.range(2, init_values=(acc,)):
            acc = pl.yield_(pl.add(acc, a[:, i * 32:(i + 1) * 32]))
        y[:, :] = acc

k(torch.randn(16, 64), torch.zeros(16, 32))
"""

PYPTO_KEYWORD = """
@pl.jit
def k(a: pl.Tensor[[16, 32], pl.FP32], y: pl.Out[pl.Tensor[[16, 32], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP):
        t = pl.load(a, [0, 0], [16, 32], transpose=True)
        y[:, :] = t

k(torch.randn(16, 32), torch.zeros(16, 32))
"""


@pytest.mark.parametrize("body, wants", [
    (RACY_DIRECT, ["RaceError", "blocks 0 and 1 of task 'racy'"]),                  # a direct call: check mode
    (LOOP_CARRIED, ["DslError", "pl.range(init_values=...): loop-carried values", "k.py:8"]),
    (PYPTO_KEYWORD, ["UnsupportedConstructError: pl.load(transpose=...)", "k.py:7"]),
], ids=["direct-call-race", "loop-carried", "pypto-keyword"])
def test_one_error_line_naming_what_and_where(tmp_path, capsys, body, wants):
    got, out, err = _run(_script(tmp_path, body), capsys)
    assert got == 1
    for w in wants:
        assert w in err, err


def test_a_user_checkout_under_a_pto_folder_is_the_users_code(tmp_path, capsys):
    p = _script(tmp_path, """
        @pl.jit
        def k(a: pl.Tensor[[16, 32], pl.FP16, pl.NZ], y: pl.Out[pl.Tensor[[16, 32], pl.FP16]]):
            pass
    """, folder="pto/kern")
    got, out, err = _run(p, capsys)
    assert got == 1
    assert "pl.NZ: not supported by pto at " in err
    assert err.split(" at ", 1)[1].split()[0].endswith("pto/kern/k.py:5"), err


def test_pto_check_on_a_pypto_file_points_to_pto_pypto(tmp_path, capsys, monkeypatch):
    p = _script(tmp_path, HELLO.replace("GOLDEN_SCALE", "1"))
    monkeypatch.chdir(tmp_path)
    assert cli_main(["check", f"{p.name}:hello"]) == 2
    err = capsys.readouterr().err
    assert "No module named 'pypto'" in err and "run it with `pto pypto FILE.py`" in err


# ---- found when the fixes above were re-tested -----------------------------------------------

WRITTEN_IN = """
R, C = 32, 16

@pl.jit
def k(x: pl.Tensor[[R, C], pl.FP32], y: pl.Tensor[[R, C], pl.FP32]):   # y written: pypto infers InOut
    for r in pl.parallel(0, R, 16):
        with pl.at(level=pl.Level.CORE_GROUP):
            y[r:r + 16, :] = pl.add(x[r:r + 16, :], 1.0)

if __name__ == "__main__":
    from golden import TensorSpec, run_jit
    specs = [TensorSpec("x", [R, C], torch.float32, init_value=torch.randn),
             TensorSpec("OUT_NAME", [R, C], torch.float32)]
    def golden(v):
        v["OUT_NAME"][:] = v["x"] + GOLDEN_ADD
    r = run_jit(k, specs, golden)
    raise SystemExit(0 if r.passed else 1)
"""


@pytest.mark.parametrize("add, name, code", [(1, "y", 0), (99, "y", 1), (1, "out", 0), (99, "out", 1)])
def test_a_written_in_parameter_is_compared_and_specs_bind_by_position(tmp_path, capsys, add, name, code):
    p = _script(tmp_path, WRITTEN_IN.replace("GOLDEN_ADD", str(add)).replace("OUT_NAME", name))
    got, out, err = _run(p, capsys)
    assert got == code, out + err
    assert f"'{name}' {'PASS' if code == 0 else 'FAIL'}" in out


def test_writes_through_a_sub_tile_view_and_init_value_in_a_task_define_the_buffer(tmp_path, capsys):
    p = _script(tmp_path, """
        @pl.jit
        def k(x: pl.Tensor[[16, 64], pl.FP32], y: pl.Out[pl.Tensor[[16, 64], pl.FP32]],
              z: pl.Out[pl.Tensor[[16, 64], pl.FP32]]):
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="k"):
                t = pl.create_tile([16, 64], dtype=pl.FP32)
                top = t[0:8, :]
                top[:, :] = x[0:8, :]
                t[8:16, :] = x[8:16, :]
                y[:, :] = t
                u = pl.create_tensor([16, 64], dtype=pl.FP32, init_value=0.0)
                u = pl.assemble(u, x[0:8, :], [0, 0])
                z[:, :] = u

        x = torch.randn(16, 64); y = torch.zeros(16, 64); z = torch.full((16, 64), 7.0)
        k(x, y, z)
        assert torch.equal(y, x)
        assert torch.equal(z[:8], x[:8]) and bool((z[8:] == 0).all())
    """)
    got, out, err = _run(p, capsys)
    assert got == 0, out + err


def test_phased_bodies_keep_per_block_variables_and_leave_names_as_the_loop_form_does(tmp_path, capsys):
    p = _script(tmp_path, """
        R, C, T = 32, 16, 8

        @pl.jit
        def two_phase(x: pl.Tensor[[R, C], pl.FP32], y: pl.Out[pl.Tensor[[R, C], pl.FP32]],
                      z: pl.Out[pl.Tensor[[R, C], pl.FP32]]):
            flag = -1
            with pl.spmd(R // T, name_hint="phase") as tid:     # the with form
                r0 = pl.tile.get_block_idx() * T
                t = pl.add(x[r0:r0 + T, :], 1.0)
                if r0 == T:
                    flag = r0
                pl.system.syncall()
                y[r0:r0 + T, :] = t
            last = r0
            for b in pl.spmd(R // T, name_hint="copy", deps=[tid]):   # the for form
                r0 = b * T
                u = pl.mul(x[r0:r0 + T, :], 2.0)
                pl.system.syncall()
                z[r0:r0 + T, :] = u
            f = lambda: r0
            return last, flag, b, f()

        x = torch.randn(R, C); y = torch.zeros(R, C); z = torch.zeros(R, C)
        print("result", two_phase(x, y, z))
        assert torch.equal(y, x + 1.0), (y - (x + 1)).abs().max()
        assert torch.equal(z, x * 2.0)
    """)
    got, out, err = _run(p, capsys)
    assert got == 0, out + err
    # after a task a name holds the last block's value; one a block left alone keeps the earlier one
    assert "result (24, 8, 3, 24)" in out


def test_a_bad_keyword_to_the_users_own_function_stays_their_type_error(tmp_path, capsys, monkeypatch):
    p = _script(tmp_path, """
        def add(a, b):
            return a + b

        add(1, 2, scale=3)
    """)
    with pytest.raises(TypeError, match="unexpected keyword argument 'scale'"):
        _run(p, capsys)
