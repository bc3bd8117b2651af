"""Expert parallelism side by side: EP1 (``KernelModel``, one process) vs EP2 (and EP4 with
``--ep 1,2,4``: ``EPModel``, one process per rank over gloo) on one tiny checkpoint.

Batch: 4 prompts of ``--prompt`` random tokens each (default 32), ``--new`` greedy tokens
(default 4); every configuration generates once to warm up, then ``--repeat`` timed runs, the
best kept (the machine is shared). Reported per configuration: wall of the timed generate
(prefill + decode; rank 0's clock, every rank runs in lockstep), prefill wall, decode ms per
step, whether the tokens equal EP1's, and per rank the tasks of one decode step (per program
kind and in all), the routed expert bytes it holds and its peak resident memory (VmHWM: after the
model is built, and at the end; checkpoint pages a rank read count). ``--experts 64 --moe-inter
512`` writes a checkpoint whose experts are most of its 300 MiB, where the per-rank memory of
expert parallelism shows. On a 2-core machine EP2 is expected to
be slower than EP1: two processes share two cores, every MoE and head program adds an
exchange, prefill is not parallel (one request at a time, its owner's attention), and the
tiny model's experts are too small for the split to pay.

    python benchmarks/bench_ep.py [--ep 1,2] [--prompt 32] [--new 4] [--repeat 1] [--experts E --moe-inter F]
    python benchmarks/bench_ep.py --flash-counts 2,8     # FLASH decode step tasks per rank (graph-only)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
from rich.console import Console
from rich.table import Table

PROMPT_SEED = 7


def _prompts(n: int, length: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(PROMPT_SEED)
    return [torch.randint(0, vocab, (length + 3 * i,), generator=g).tolist() for i in range(n)]


def _rss_mib() -> tuple[float, float]:
    """(current, peak) resident set size of this process in MiB (``/proc/self/status`` VmRSS,
    VmHWM: the checkpoint pages a rank touched count, as they are resident)."""
    got = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(("VmRSS:", "VmHWM:")):
                got[line.split(":")[0]] = int(line.split()[1]) / 1024
    return got.get("VmRSS", 0.0), got.get("VmHWM", 0.0)


def _rank(out_dir: str, ckpt: str, length: int, new: int, repeat: int) -> None:
    """One rank (or the EP1 process): generate, write ``rank{r}.json``."""
    from pto.models.deepseek_v4.config import get_deployment
    from pto.models.deepseek_v4.generate import generate
    from pto.models.deepseek_v4.layer import KernelModel
    from pto.models.deepseek_v4.weights import open_checkpoint
    from pto.runtime import distributed as dist

    torch.set_num_threads(1)
    w = dist.init()
    ck = open_checkpoint(ckpt, "int8")
    dep = get_deployment("tiny").replace(max_context=256, rope_max_pos=256)
    if w.size > 1:
        from pto.models.deepseek_v4.ep_model import EPModel
        model = EPModel(ck, dep)
    else:
        model = KernelModel(ck, dep, per_layer=True)
    rss_model = _rss_mib()[1]
    prompts = _prompts(4, length, ck.config.vocab_size)
    step_tasks = _decode_step_tasks(model, prompts)  # also the warm-up
    best = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        res = generate(model, prompts, max_new_tokens=new, eos_token_id=None)
        wall = time.perf_counter() - t0
        if best is None or wall < best["wall_s"]:
            best = {"wall_s": wall, "prefill_s": res.prefill_s, "decode_s": res.decode_s,
                    "decode_steps": res.decode_steps, "tokens": res.tokens}
    f = model.ffn_weights(0)
    expert_bytes = sum(f[k].numel() * f[k].element_size() for k in ("w1", "w1_scale", "w3", "w3_scale", "w2",
                                                                    "w2_scale")) * model.cfg.num_hidden_layers
    best.update(rank=w.rank, ep=w.size, step_tasks=step_tasks, expert_bytes=expert_bytes, rss_model_mib=rss_model,
                rss_peak_mib=_rss_mib()[1])
    with open(os.path.join(out_dir, f"rank{w.rank}.json"), "w") as fh:
        json.dump(best, fh)


def _decode_step_tasks(model, prompts) -> dict:
    """Tasks per program kind of this rank in the first decode step of a generate over the 4
    requests (the stats before and after that ``decode`` call)."""
    from pto.models.deepseek_v4.generate import generate

    seen = {}
    decode = model.decode

    def first_step(tokens, states):
        before = dict(model.stats.tasks)
        logits = decode(tokens, states)
        if not seen:
            seen.update({k: v - before.get(k, 0) for k, v in model.stats.tasks.items() if v - before.get(k, 0)})
        return logits

    model.decode = first_step
    generate(model, prompts, max_new_tokens=2, eos_token_id=None)
    model.decode = decode
    return seen


def flash_counts(sizes: list[int], T: int = 8) -> dict:
    """Per rank, the tasks of one FLASH decode step at each EP size, in graph-only mode
    (``RunConfig(execute=False)``: shape-only weights and activations, no tile math):
    :func:`graph_only.ep_step_graphs`, the step of ``EPModel`` with its ranks as threads.

    Each rank decodes its own batch of ``decode_batch x decode_seq`` (4 x 2 = ``T`` = 8 token
    rows; attention data parallel, so the run's batch is ``N`` times that). Routes are balanced
    over the run's rows: the hash table sends the run's ``j``-th route to expert
    ``j * E // routes``, the learned layers' route ``j`` to expert ``j * E // routes`` too when
    the run has at most ``E`` routes (EP2: 96) and to ``j mod E`` otherwise, so every rank's
    experts receive routes.

    Returns:
        ``{"ep1": {"attention", "moe", "head", "step"}, ep: [{"moe_hash", "moe_learned", "head",
        "attention", "step", "wall_s"} per rank]}``; ``step`` is the rank's programs' tasks and
        ``wall_s`` the build of all the ranks of that size.
    """
    from pto.models.deepseek_v4.config import get_config
    from pto.models.deepseek_v4.graph_only import decode_step_graph, ep_step_graphs

    cfg = get_config("flash")
    one = decode_step_graph(cfg)
    kinds = {st.name: st.tasks for st in one.by_kind()}
    attention = sum(v for k, v in kinds.items() if k.startswith("attention"))
    out = {"ep1": {"attention": attention, "moe": kinds["moe"] // cfg.num_hidden_layers,
                   "head": kinds["hc_head"] + kinds["lm_head"], "step": one.stats.tasks}}
    for ep in sizes:
        ranks = []
        for g in ep_step_graphs(cfg, ep=ep, batch=4, seq=T // 4):
            by = {s.name: s.tasks for s in g.stages}
            ranks.append({"attention": sum(s.tasks for s in g.stages if " attention " in s.name),
                          "moe_hash": by["L0 moe"], "moe_learned": by[f"L{cfg.num_hash_layers} moe"],
                          "head": by["hc_head"] + by["lm_head"], "step": g.stats.tasks, "wall_s": g.wall_s})
        out[ep] = ranks
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ep", default="1,2", help="world sizes, comma separated (default 1,2)")
    ap.add_argument("--prompt", type=int, default=32, help="prompt tokens of the first request (default 32)")
    ap.add_argument("--new", type=int, default=4, help="new tokens per request (default 4)")
    ap.add_argument("--repeat", type=int, default=1, help="timed runs after the warm-up (default 1)")
    ap.add_argument("--experts", type=int, default=None,
                    help="routed experts of the checkpoint (default: the tiny preset's 16)")
    ap.add_argument("--moe-inter", type=int, default=None,
                    help="expert intermediate size (default: the tiny preset's 64); with --experts, a checkpoint "
                         "whose experts dominate its bytes, to see the per-rank memory of expert parallelism")
    ap.add_argument("--flash-counts", metavar="SIZES", default=None,
                    help="instead: per-rank tasks of the FLASH decode step at these EP sizes (e.g. 2,8; "
                         "graph-only mode, ranks as threads)")
    ap.add_argument("--_rank", nargs=2, metavar=("OUT", "CKPT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.flash_counts:
        torch.set_num_threads(1)
        counts = flash_counts([int(x) for x in args.flash_counts.split(",")])
        ep1 = counts.pop("ep1")
        t = Table(title="FLASH decode step, tasks per rank in graph-only mode (each rank: 4 requests x 2 tokens; "
                        "MoE per layer with hash / learned routing; balanced routes)")
        for c in ("EP", "rank", "attention", "MoE per layer (hash)", "MoE per layer (learned)", "head", "step",
                  "wall s"):
            t.add_column(c, justify="right")
        t.add_row("1", "0", str(ep1["attention"]), str(ep1["moe"]), str(ep1["moe"]), str(ep1["head"]),
                  str(ep1["step"]), "")
        for ep, ranks in counts.items():
            for r, c in enumerate(ranks):
                t.add_row(str(ep), str(r), str(c["attention"]), str(c["moe_hash"]), str(c["moe_learned"]),
                          str(c["head"]), str(c["step"]), f"{c['wall_s']:.1f}")
        Console(width=max(140, Console().width)).print(t)
        return 0
    if args._rank:
        _rank(args._rank[0], args._rank[1], args.prompt, args.new, args.repeat)
        return 0

    from pto.models.deepseek_v4.checkpoint import write_tiny_checkpoint
    from pto.runtime import distributed as dist

    sizes = [int(x) for x in args.ep.split(",")]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        import dataclasses

        from pto.models.deepseek_v4.config import get_config
        tiny = get_config("tiny")
        cfg = dataclasses.replace(tiny, n_routed_experts=args.experts or tiny.n_routed_experts,
                                  moe_intermediate_size=args.moe_inter or tiny.moe_intermediate_size)
        ckpt = str(write_tiny_checkpoint(os.path.join(tmp, "tiny"), seed=0, cfg=cfg))
        ck_mib = sum(os.path.getsize(os.path.join(ckpt, f)) for f in os.listdir(ckpt)) / 2**20
        for ep in sizes:
            out = os.path.join(tmp, f"ep{ep}")
            os.makedirs(out)
            argv_r = ["--prompt", str(args.prompt), "--new", str(args.new), "--repeat", str(args.repeat),
                      "--_rank", out, ckpt]
            os.environ["OMP_NUM_THREADS"] = "1"
            if ep == 1:
                subprocess.run([sys.executable, __file__, *argv_r], check=True)
            else:
                code = dist.spawn(argv_r, ep, script=__file__, timeout_s=600)
                if code:
                    print(f"EP{ep}: a rank failed (exit {code})", file=sys.stderr)
                    return 1
            results[ep] = [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(ep)]
    base = results[sizes[0]][0]
    con = Console(width=max(160, Console().width))
    t = Table(title=f"EP on the tiny checkpoint ({cfg.n_routed_experts} experts of {cfg.moe_intermediate_size}, "
                    f"{ck_mib:.0f} MiB on disk): 4 requests, prompts {args.prompt}..{args.prompt + 9} tokens, "
                    f"{args.new} new each (best of {args.repeat})")
    for c in ("config", "wall s", "prefill s", "decode ms/step", "wall / EP1", "same tokens"):
        t.add_column(c, justify="right")
    for ep, ranks in results.items():
        r0 = ranks[0]
        t.add_row(f"EP{ep}", f"{r0['wall_s']:.2f}", f"{r0['prefill_s']:.2f}",
                  f"{1e3 * r0['decode_s'] / max(1, r0['decode_steps']):.0f}", f"{r0['wall_s'] / base['wall_s']:.2f}",
                  str(all(r["tokens"] == base["tokens"] for r in ranks)))
    con.print(t)
    t2 = Table(title="per rank: tasks of one decode step (4 requests) by program, routed expert bytes held")
    for c in ("config", "rank", "tasks", "by program", "expert MiB", "RSS peak MiB (model built)", "RSS peak MiB"):
        t2.add_column(c, justify="right" if c != "by program" else "left")
    for ep, ranks in results.items():
        for r in ranks:
            st = r["step_tasks"]
            t2.add_row(f"EP{ep}", str(r["rank"]), str(sum(st.values())),
                       ", ".join(f"{k} {v}" for k, v in sorted(st.items())), f"{r['expert_bytes'] / 2**20:.2f}", f"{r['rss_model_mib']:.0f}", f"{r['rss_peak_mib']:.0f}")
    con.print(t2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
