"""Where a decode step's time goes: torch calls per step, pto's kernel path vs transformers eager.

On the tiny checkpoint (``pto checkpoint tiny``, seed 0), one request: a ``--prompt``-token
prefill (default 128, one chunk), then ``--steps`` decode steps (default 3). For the best of
``--steps`` prefill chunks (pto: after a warm-up chunk, the program cache cleared before each, as
for a new prompt) and of ``--steps`` decode steps (process CPU time, 1 thread) of each engine
(``KernelModel`` int8 through the CPU runtime; ``DeepseekV4ForCausalLM`` float32, eager
attention and experts, its KV cache), a ``TorchFunctionMode`` counts the torch calls made
from Python in one more run of the same step: tensor ops (``torch.*`` functions and tensor
methods that compute or move data) and metadata reads (``shape``, ``dim``, ``numel``, ...).
CPU time divided by the op count is the cost per op including everything around it (the DSL's
Python, the runtime's records). The pto kernels work tile by tile at the reference's task
granularity, so they issue many more, smaller torch ops than the whole-tensor model code.

    python benchmarks/bench_torch_calls.py [--prompt 128] [--steps 3]
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import time

import torch
from rich.console import Console
from rich.table import Table
from torch.overrides import TorchFunctionMode

# calls that read metadata only (no tensor data is touched)
METADATA = frozenset({"__get__", "dim", "numel", "size", "element_size", "is_contiguous", "data_ptr",
                      "storage_offset", "stride", "is_floating_point", "requires_grad", "device", "dtype",
                      "shape", "is_inference", "_version"})


class CallCount(TorchFunctionMode):
    """Counts the torch calls made from Python while active, by function name."""

    def __init__(self):
        super().__init__()
        self.calls: collections.Counter = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls[getattr(func, "__name__", str(func))] += 1
        return func(*args, **(kwargs or {}))

    def split(self) -> tuple[int, int]:
        """(tensor ops, metadata reads)."""
        meta = sum(n for k, n in self.calls.items() if k in METADATA)
        return sum(self.calls.values()) - meta, meta


def _measure(step, steps: int, before=None) -> dict:
    """Best CPU time (ms) of ``step()`` over ``steps`` runs, then the calls of one more run;
    ``before()`` (untimed) runs before each of them."""
    cpu = []
    for _ in range(steps):
        if before is not None:
            before()
        t0 = time.process_time()
        step()
        cpu.append((time.process_time() - t0) * 1e3)
    if before is not None:
        before()
    with CallCount() as c:
        step()
    ops, meta = c.split()
    return {"cpu_ms": min(cpu), "ops": ops, "meta": meta, "top": c.calls.most_common(6)}


def _pto(ckpt: str, ids: list[int], steps: int) -> dict:
    from pto.models.deepseek_v4.config import get_deployment
    from pto.models.deepseek_v4.layer import KernelModel
    from pto.models.deepseek_v4.weights import open_checkpoint
    from pto.runtime import clear_program_cache

    model = KernelModel(open_checkpoint(ckpt, "int8"), get_deployment("tiny"))
    x = torch.tensor(ids)
    res = {}

    def prefill():
        st = model.new_state()
        model.forward(x, st)
        model.release_state(st)

    prefill()  # warm-up: block templates recorded, weights converted
    # the program cache forgets the chunk before every run: its key holds the token ids, so a
    # repeated prompt would time the cache's recording (second call) or a replay (later calls)
    # instead of a new prompt's prefill (bench_generate does the same)
    res["prefill"] = _measure(prefill, steps, before=clear_program_cache)
    state = model.new_state()
    tok = int(model.forward(x, state)[-1].argmax())
    res["decode"] = _measure(lambda: model.decode([tok], [state]), steps)
    return res


def _hf(ckpt: str, ids: list[int], steps: int) -> dict:
    from transformers import DeepseekV4ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    model = DeepseekV4ForCausalLM.from_pretrained(ckpt, dtype=torch.float32, attn_implementation="eager",
                                                  experts_implementation="eager").eval()
    x = torch.tensor([ids])
    res = {}
    with torch.no_grad():
        model(x, use_cache=True)  # warm-up
        res["prefill"] = _measure(lambda: model(x, use_cache=True), steps)
        out = model(x, use_cache=True)
        pkv, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        # each measured step decodes the same next token on top of the prompt's cache (the cache grows)
        res["decode"] = _measure(lambda: model(nxt, past_key_values=pkv, use_cache=True), steps)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from pto.models.deepseek_v4.checkpoint import write_tiny_checkpoint

    ids = torch.randint(0, 512, (args.prompt,), generator=torch.Generator().manual_seed(0)).tolist()
    with tempfile.TemporaryDirectory(prefix="pto_bench_calls_") as tmp:
        ckpt = str(write_tiny_checkpoint(f"{tmp}/tiny", seed=0))
        results = {"transformers": _hf(ckpt, ids, args.steps), "pto kernels": _pto(ckpt, ids, args.steps)}
    table = Table(title=f"torch calls per step: tiny checkpoint, {args.prompt}-token prompt, 1 thread, CPU time")
    for col in ("engine", "step", "CPU ms", "tensor ops", "metadata reads", "CPU µs per op", "ops / HF",
                "most called"):
        table.add_column(col, justify="left" if col in ("engine", "step", "most called") else "right")
    ref = results["transformers"]
    for engine, res in results.items():
        for step, r in res.items():
            table.add_row(engine, step, f"{r['cpu_ms']:.1f}", str(r["ops"]), str(r["meta"]),
                          f"{1e3 * r['cpu_ms'] / max(r['ops'], 1):.2f}", f"{r['ops'] / max(ref[step]['ops'], 1):.1f}x",
                          ", ".join(f"{k} {n}" for k, n in r["top"]))
    Console(width=160).print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
