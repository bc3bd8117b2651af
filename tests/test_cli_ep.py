"""``pto generate --ep N`` and ``torchrun -m pto generate``: ranks started, same tokens as one
rank; world sizes the deployment rejects are exit 2 before any process starts."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from pto.cli import main
from pto.models.deepseek_v4.checkpoint import write_tiny_checkpoint
from pto.runtime import distributed as dist

ARGS = ["--input-ids", "5 17 300", "--weights", "int8", "--max-new-tokens", "3", "--max-context", "64", "--json"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return str(write_tiny_checkpoint(tmp_path_factory.mktemp("ep") / "tiny", seed=3))


@pytest.mark.parametrize("extra, needle", [
    (["--ep", "3"], "--ep 3: the deployment allows world sizes [1, 2, 4, 8]"),
    (["--ep", "8"], "--ep 8: 2 experts per rank is fewer than num_experts_per_tok=4"),
    (["--ep", "0"], "--ep must be a positive integer, got 0"),
])
def test_rejected_world_sizes_start_no_process(ckpt, capsys, monkeypatch, extra, needle):
    def no_spawn(*a, **k):
        raise AssertionError("a rank was started")
    monkeypatch.setattr(dist, "spawn", no_spawn)
    assert main(["generate", ckpt, *ARGS, *extra]) == 2
    assert needle in capsys.readouterr().err


def test_ep_needs_the_kernel_path(ckpt, capsys):
    assert main(["generate", ckpt, "--input-ids", "5 17", "--ep", "2"]) == 2
    assert "--ep 2: expert parallelism runs on the kernel path (--weights int8)" in capsys.readouterr().err


def test_ep_rejects_mtp(ckpt, capsys):
    assert main(["generate", ckpt, *ARGS, "--ep", "2", "--mtp"]) == 2
    assert "--ep 2: --mtp (self-speculative decoding) runs on one rank only" in capsys.readouterr().err


def _tokens(out: str) -> list:
    return json.loads(out.strip().splitlines()[-1])["tokens"]


def test_generate_ep2_check_mode_same_tokens_as_one_rank(ckpt, capfd):
    assert main(["generate", ckpt, *ARGS]) == 0
    one = _tokens(capfd.readouterr().out)
    # both ranks in check mode (cross-rank race check included); rank 0 prints, rank 1 is quiet
    assert main(["generate", ckpt, *ARGS, "--ep", "2", "--check"]) == 0
    out = capfd.readouterr().out
    assert len(out.strip().splitlines()) == 1 and _tokens(out) == one


@pytest.mark.slow
def test_torchrun_module_entry(ckpt):
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    one = subprocess.run([sys.executable, "-m", "pto", "generate", ckpt, *ARGS], capture_output=True, text=True,
                         timeout=300, check=True)
    two = subprocess.run([torchrun, "--nproc-per-node", "2", "--master-port", str(dist._free_port()), "-m", "pto",
                          "generate", ckpt, *ARGS], capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-2000:]
    assert _tokens(two.stdout) == _tokens(one.stdout)
