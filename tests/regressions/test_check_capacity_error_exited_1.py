"""Regression: a size above a kernel's declared capacity is bad input (exit 2, docs/cli.md), and
``pto run`` said so, but ``pto check`` printed it as a kernel FAIL and exited 1:
``pto check prefill_compressor_ratio128 --opt T=129 --opt max_cmp_writes=1``. Both now exit 2
with one ``error: CapacityError:`` line.

(T=129 itself is inside the kernel's contract: the generalised kernel takes any chunk whose
``ceil(T / 128)`` windows fit ``max_cmp_writes``, 4 by default at tiny and FLASH, and its golden
agrees; the reference kernel's fixed T=128 is its own limit, not this one's.)
"""

import pytest

from pto.cli import main

CASE = ["prefill_compressor_ratio128", "--preset", "tiny", "--opt", "T=129"]


@pytest.mark.parametrize("command", ["run", "check"])
def test_a_chunk_above_the_write_capacity_exits_2(capsys, command):
    assert main([command, *CASE, "--opt", "max_cmp_writes=1"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: CapacityError: ")
    assert lines[0].endswith("a chunk of T=129 tokens can close 2 windows, but write_pos_map / write_dst_map / "
                             "pooled_kv_pad hold max_cmp_writes=1 (declared capacity); split the chunk or declare more")


def test_t_129_within_the_default_capacity_passes_its_golden(capsys):
    assert main(["check", *CASE, "--opt", "start_pos=127"]) == 0  # closes two windows: 127 and 255
    assert capsys.readouterr().out.startswith("PASS prefill_compressor_ratio128 prefill: max error ")
