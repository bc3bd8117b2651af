"""Regression: ``pto run|sim|graph KERNEL --graph-only`` built every input of the kernel case at
full size (the case builder's seeded weights, then ``TensorSpec.create_tensor`` for every
spec), so ``pto sim moe --opt weight_format=bf16 --graph-only`` at flash was OOM-killed and
``pto run prefill_attention_csa --graph-only`` used 1 GB. Graph-only runs now build the case
with its float / INT8 inputs shape-only (torch ``meta``) and its integer index inputs real.
"""

import resource
import subprocess
import sys

import torch

from pto.cli import resolve_target
from pto.runtime import RunConfig


def test_moe_graph_only_at_flash_builds_small():
    # the child may address at most 6 GiB: FLASH's routed experts alone are 6 GiB of INT8, so
    # the old full-size build fails here instead of exhausting the machine
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))

    # the child prints its own peak RSS: VmHWM of its own address space (ru_maxrss would count
    # the forked pytest process's pages before the exec, and RUSAGE_CHILDREN other tests' children)
    code = ("import re, sys\n"
            "from pto.cli import main\n"
            "rc = main(['run', 'moe', '--preset', 'flash', '--graph-only'])\n"
            "hwm = re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read()).group(1)\n"
            "print('peak_rss_kib', hwm)\n"
            "sys.exit(rc)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, preexec_fn=limit,
                       env={"OMP_NUM_THREADS": "1", "PTO_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    assert "graph-only" in r.stdout
    rss_kib = int(r.stdout.rsplit("peak_rss_kib", 1)[1].split()[0])  # KiB on Linux
    assert rss_kib < 1.5 * (1 << 20), f"peak RSS {rss_kib} KiB"

def test_graph_only_case_inputs_shape_only_index_inputs_real():
    t = resolve_target("moe", "tiny", "decode", {}, shape_only=True)
    specs = {s.name: s for s in t.case_run.specs if hasattr(s, "init_value")}
    assert specs["w1"].init_value.is_meta and specs["w1"].init_value.dtype == torch.int8
    assert specs["x_hc"].init_value.is_meta
    assert not specs["tid2eid"].init_value.is_meta and not specs["input_ids"].init_value.is_meta


def test_graph_only_tasks_and_edges_equal_the_real_run_at_tiny():
    for kernel, mode in (("moe", "decode"), ("moe", "prefill"), ("expert_routed", "decode")):
        real = resolve_target(kernel, "tiny", mode, {}).run_program()
        go = resolve_target(kernel, "tiny", mode, {}, shape_only=True).run_program(execute=False)
        assert go.stats.graph_only and not real.stats.graph_only
        assert (go.stats.tasks, go.stats.edges, go.stats.heap_peak_bytes) == \
            (real.stats.tasks, real.stats.edges, real.stats.heap_peak_bytes), (kernel, mode)
    assert RunConfig(execute=False).execute is False
