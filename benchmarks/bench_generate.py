"""Generation side by side: pto (golden forward, kernel path) and transformers eager.

One seeded checkpoint written as ``pto checkpoint tiny`` writes it (seed 0; ``--preset demo``:
the same at the ``demo`` preset's sizes, hidden 1024, 16 heads, 32 experts, vocab 8192, and
pto's ``demo`` deployment), one prompt of ``--prompt`` random tokens (default 509), ``--new``
greedy tokens (default 8). Each engine runs in its own spawned process (so peak RSS is its
own), one warm-up generate (pto: of another prompt of the same length; its wall is printed as
the process's first generate) then ``--repeat`` timed ones; the best run is reported (the
machine is shared). pto's program cache is cleared before every run, as for a new prompt (its
keys hold the token ids and positions), so no timed run replays programs recorded on the same
prompt:

* ``transformers``: ``DeepseekV4ForCausalLM.from_pretrained(dtype=float32, eager attention and
  experts)``, ``generate(do_sample=False)``; prefill = the first forward over the prompt,
  decode = the rest (timed with a forward pre-hook);
* ``pto golden``: :class:`GoldenModel`, ``--weights bf16`` (the FP32 parity forward);
* ``pto kernels``: :class:`KernelModel` (``int8``), the DSL kernels through the CPU runtime
  (block templates on, as :class:`KernelModel` runs by default; ``PTO_BLOCK_TEMPLATES=0`` in the
  environment runs every block plainly), with the per-kernel wall split (where the time goes: runtime vs the kernels' tile math is
  in ``benchmarks/bench_overhead.py``);
* ``pto kernels-bf16``: :class:`KernelModel` with ``bf16`` weights (the unquantised kernels:
  BF16 weights and activations into BF16 x BF16 -> FP32 matmuls).

* ``kernels+mtp``: the kernel path with self-speculative decoding by the checkpoint's MTP
  layer (``generate(mtp=True)``; each decode step verifies a draft and drafts the next);
  ``kernels+mtp-accept``: the same with every draft taken from a plain greedy run (all
  accepted: two tokens per step, the upper bound of MTP on this machine);
  ``kernels+mtp-none``: plain greedy through the same per-layer programs and ``S = 2`` decode
  steps with the second token inactive (what MTP costs before any draft is accepted).

Columns: prefill wall (ms), decode ms per token, tokens/s, peak RSS (MiB), decode steps and
the MTP acceptance rate, and each pto engine's ratios to transformers (wall = prefill +
decode). Target of issue 15: the kernel path within 3x of transformers' wall.

    python benchmarks/bench_generate.py [--preset tiny|demo] [--prompt 509] [--new 8] [--repeat 2] [--chunk 128]
        [--engines transformers,golden,kernels,kernels-bf16,kernels+mtp-none,kernels+mtp,kernels+mtp-accept]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import tempfile
import time

import torch
from rich.console import Console
from rich.table import Table


def _hf(ckpt: str, ids: list[int], new: int, repeat: int) -> dict:
    from transformers import DeepseekV4ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    model = DeepseekV4ForCausalLM.from_pretrained(ckpt, dtype=torch.float32, attn_implementation="eager",
                                                  experts_implementation="eager").eval()
    marks: list[float] = []
    model.register_forward_pre_hook(lambda *_: marks.append(time.perf_counter()))
    best = None
    for _ in range(repeat + 1):
        marks.clear()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=new, do_sample=False, eos_token_id=None)
        end = time.perf_counter()
        prefill = marks[1] - t0 if len(marks) > 1 else end - t0
        run = {"prefill_s": prefill, "decode_s": end - t0 - prefill, "steps": new - 1,
               "tokens": out[0, len(ids):].tolist()}
        if best is None or run["prefill_s"] + run["decode_s"] < best["prefill_s"] + best["decode_s"]:
            best = run
    return best


def _pto(ckpt: str, ids: list[int], new: int, repeat: int, engine: str, chunk: int, preset: str) -> dict:
    from pto.models.deepseek_v4.config import get_deployment
    from pto.models.deepseek_v4.generate import generate
    from pto.models.deepseek_v4.layer import KernelModel
    from pto.models.deepseek_v4.model import GoldenModel
    from pto.models.deepseek_v4.weights import open_checkpoint

    dep = get_deployment(preset)
    kernels = engine.startswith("kernels")
    if kernels:
        model = KernelModel(open_checkpoint(ckpt, "bf16" if engine == "kernels-bf16" else "int8"), dep)
    else:
        model = GoldenModel(open_checkpoint(ckpt, "bf16"), dep)
    mtp = {}
    if engine.startswith("kernels+mtp"):
        mtp = {"mtp": True}
        if engine.endswith("-accept"):  # drafts from a plain greedy run: every one accepted
            plain = generate(model, [ids], max_new_tokens=new, chunk=chunk, eos_token_id=None)
            mtp.update(drafts="accept", reference=plain.tokens)
        elif engine.endswith("-none"):  # no drafts: plain greedy through the MTP path's S = 2 steps
            mtp.update(drafts="none")
    from pto.runtime import clear_program_cache

    best = None
    # the warm-up generates another prompt of the same length: what a timed run may reuse from it
    # (block templates, keyed by the kernels' shapes and Python state, not by token values) a
    # server has from its earlier requests, and nothing of the timed prompt's own data
    warm = torch.randint(0, 512, (len(ids),), generator=torch.Generator().manual_seed(1)).tolist()
    cold = None
    for k in range(repeat + 1):
        # every run as a new prompt's: the program cache keys on the token ids and positions, so
        # a repeated identical prompt would replay programs no real request can replay
        clear_program_cache()
        if kernels and k == 1:
            model.stats.__init__()  # count the timed runs only
        res = generate(model, [warm if k == 0 and repeat and not mtp else ids], max_new_tokens=new,
                       chunk=chunk, eos_token_id=None, **mtp)
        if k == 0:
            cold = {"prefill_s": res.prefill_s, "decode_s": res.decode_s}
            if repeat:
                continue
        run = {"prefill_s": res.prefill_s, "decode_s": res.decode_s, "steps": res.decode_steps,
               "tokens": res.tokens[0], "accept": res.acceptance_rate if mtp else None}
        if best is None or run["prefill_s"] + run["decode_s"] < best["prefill_s"] + best["decode_s"]:
            best = run
    if engine == "kernels":
        n = max(repeat, 1)
        best["split"] = {k: v / n for k, v in sorted(model.stats.wall_s.items(), key=lambda kv: -kv[1])}
        best["cold"] = cold if repeat else None  # with no timed run the warm-up is the run shown
    return best


def _worker(engine: str, ckpt: str, ids: list[int], new: int, repeat: int, chunk: int, preset: str, q) -> None:
    torch.set_num_threads(1)
    run = (_hf(ckpt, ids, new, repeat) if engine == "transformers" else
           _pto(ckpt, ids, new, repeat, engine, chunk, preset))
    run["rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    q.put(run)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompt", type=int, default=509)
    ap.add_argument("--new", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--engines", default="transformers,golden,kernels,kernels-bf16")
    ap.add_argument("--preset", choices=("tiny", "demo"), default="tiny",
                    help="model size of the seeded checkpoint (and pto's deployment): tiny (default) or demo "
                         "(hidden 1024, 16 heads, 32 experts, vocab 8192: tile math outweighs per-op costs)")
    args = ap.parse_args()

    from pto.models.deepseek_v4.checkpoint import write_tiny_checkpoint
    from pto.models.deepseek_v4.config import get_config

    cfg = get_config(args.preset)  # both presets' vocabularies hold the prompt's ids [0, 512)
    ids = torch.randint(0, 512, (args.prompt,), generator=torch.Generator().manual_seed(0)).tolist()
    ctx = mp.get_context("spawn")
    results = {}
    with tempfile.TemporaryDirectory(prefix="pto_bench_gen_") as tmp:
        ckpt = str(write_tiny_checkpoint(f"{tmp}/{args.preset}", seed=0, mtp=True, cfg=cfg))
        for engine in args.engines.split(","):
            q = ctx.Queue()
            p = ctx.Process(target=_worker,
                            args=(engine, ckpt, ids, args.new, args.repeat, args.chunk, args.preset, q))
            p.start()
            results[engine] = q.get()
            p.join()

    con = Console(width=180)
    table = Table(title=f"generate: {args.preset} checkpoint, {args.prompt}-token prompt, {args.new} new tokens, "
                        f"1 thread, best of {args.repeat}")
    for col in ("engine", "prefill ms", "decode ms/token", "tokens/s", "peak RSS MiB", "decode steps",
                "MTP accept", "wall / HF", "prefill / HF", "decode / HF", "tokens = HF"):
        table.add_column(col, justify="left" if col == "engine" else "right")
    ref = results.get("transformers")
    for engine, r in results.items():
        wall = r["prefill_s"] + r["decode_s"]
        dec = 1e3 * r["decode_s"] / max(args.new - 1, 1)  # per decoded token (MTP: fewer steps)
        acc = r.get("accept")
        cells = [engine, f"{1e3 * r['prefill_s']:.0f}", f"{dec:.1f}", f"{args.new / wall:.1f}", f"{r['rss_mib']:.0f}",
                 str(r["steps"]), "-" if acc is None else f"{100 * acc:.0f}%"]
        if ref is not None:
            ref_wall = ref["prefill_s"] + ref["decode_s"]
            ref_dec = ref["decode_s"] / max(args.new - 1, 1)
            cells += [f"{wall / ref_wall:.2f}x", f"{r['prefill_s'] / ref['prefill_s']:.2f}x",
                      f"{(r['decode_s'] / max(args.new - 1, 1)) / ref_dec:.2f}x",
                      "yes" if r["tokens"] == ref["tokens"] else f"no ({r['tokens']})"]
        else:
            cells += ["-"] * 4
        table.add_row(*cells)
    con.print(table)
    cold = results.get("kernels", {}).get("cold")
    if cold:
        con.print(f"kernel path, the process's first generate (the warm-up, another prompt; block templates "
                  f"recorded): prefill {1e3 * cold['prefill_s']:.0f} ms, decode "
                  f"{1e3 * cold['decode_s'] / max(args.new - 1, 1):.1f} ms/token", highlight=False)
    split = results.get("kernels", {}).get("split")
    if split:
        total = sum(split.values())
        con.print("kernel path, wall per program kind (one generate): " + ", ".join(
            f"{k} {1e3 * v:.0f} ms ({100 * v / total:.0f}%)" for k, v in split.items()), highlight=False)


if __name__ == "__main__":
    main()
