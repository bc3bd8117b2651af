"""Block templates: the blocks of an SPMD task run from a recording of its first block.

The kernels work at the device's granularity: a ``pl.spmd(T)`` task runs T blocks, each the
same short sequence of small tile ops, and a plain run executes the DSL's Python (the tile
ops' checks, footprints, counters) again for every block. With block templates on (opt-in:
:func:`set_block_templates`, ``with block_templates():`` or ``PTO_BLOCK_TEMPLATES=1``), a task
of at least ``MIN_BLOCKS`` blocks in a plain run

1. runs block 0 with its block index as a :class:`~pto.runtime.symbolic.Sym` under a recorder
   (runtime/replay.py's, with the index as read number 0): every torch operation it runs, every
   guard (a comparison's outcome, an exact value where the index or a value read from data was
   used as a Python number), every value it reads from data (``pl.read``, ``pl.read_values``,
   tile reads: a register of the template, the outcome of what the block does with it a guard)
   and its bookkeeping: the footprint boxes and the block counters (ops, flops, bytes, loads,
   stores, matmuls, vector op kinds, cube) as expressions of the index and the reads;
2. turns that into straight-line Python (one call per torch operation, guards in place, the
   footprints and counters computed from the expressions) and runs it for blocks 1 .. n-2;
3. runs the last block plainly (so that the loop variable and whatever the body left in the
   kernel's variables are those of a plain run).

A block whose guard fails (another path: a partial last tile, a masked key block, an index
past a table) is undone and run plainly: the stores the template made into GM before the guard
are saved first (a clone of each window) and written back. Such a block is recorded as another
variant of the template (up to ``MAX_VARIANTS``); a task whose blocks keep diverging stops
using templates and its site is remembered for later programs (``_SITE_OFF``).

What stays as in a plain run: the results (the same torch operations on the same values in
the same order), the task graph (per-block footprints, grouped and coalesced by
``Program.end_task``), the statistics and the simulator's inputs (per-block counters), and the
errors (a block that raises plainly diverges from its template and runs plainly). Where the
recording itself cannot go on (the block's Python raised, or code that could tell a symbol from
a number by ``type``/``id``/``is`` was about to run), the whole program is rerun plainly with
templates off for that task site (only private copies of Out/InOut arguments and the heap were
written; :func:`execute`).

Not used (plain blocks): check mode, graph-only mode, ``drop_init``, a ``block_order`` other
than ``"program"``, a phased (syncall) body, a distributed world of more than one rank, while
the program cache records a run, under a trace function (a debugger, coverage), and a block
that allocates (``pl.create_tensor``) or opens a heap scope. A block body's Python side effects
outside the block (appending to a list defined outside the task) happen only for the blocks
that run plainly (the first and the last, and any that diverged): kernels keep their effects in
GM, as on the device.
"""

from __future__ import annotations

import os
import sys

import torch

from pto.errors import PtoError
from pto.language import _ctx
from pto.runtime import replay as _replay
from pto.runtime.symbolic import NAMESPACE as _SYM_NS
from pto.runtime.symbolic import _UN_SRC as _SYM_UN
from pto.runtime.symbolic import Sym, concrete_of

__all__ = ["set_block_templates", "block_templates", "block_templates_enabled", "template_info"]

_ON = [os.environ.get("PTO_BLOCK_TEMPLATES", "0").strip().lower() not in ("0", "", "false", "off", "no")]
MIN_BLOCKS = int(os.environ.get("PTO_BLOCK_TEMPLATES_MIN", "24"))  # fewer blocks: plain (a recording costs ~10 plain blocks)
MAX_VARIANTS = 4  # templates per task (paths through the block)
_SITE_OFF: set = set()  # task sites whose blocks could not be templated (later programs run them plainly)
_CODE: dict = {}  # generated source -> compiled factory
_INFO = {"tasks": 0, "recorded": 0, "templated": 0, "plain": 0, "diverged": 0, "restarts": 0}
_DEBUG = os.environ.get("PTO_BLOCKS_DEBUG", "0") not in ("0", "")
_DIVERGED_AT: list = []  # (task, block, template line) of the latest divergences (PTO_BLOCKS_DEBUG=1)
_COUNTERS = ("ops", "flops", "bytes", "ld", "st", "mm", "cube")


def set_block_templates(enabled: bool) -> None:
    """Turn block templates on or off for later tasks (off by default; on from the start with
    ``PTO_BLOCK_TEMPLATES=1``). See the module docstring.

    Raises:
        TypeError: ``enabled`` is not a bool.
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"set_block_templates(enabled): expected True or False, got {enabled!r}")
    _ON[0] = enabled


def block_templates_enabled() -> bool:
    """True when SPMD tasks of plain runs use block templates."""
    return _ON[0]


class block_templates:  # noqa: N801 - used like a function: ``with block_templates():``
    """``with pto.runtime.block_templates():`` turns block templates on (``enabled=False``: off)
    inside the block and restores the previous setting after it.

    Raises:
        TypeError: ``enabled`` is not a bool.
    """

    def __init__(self, enabled: bool = True):
        if not isinstance(enabled, bool):
            raise TypeError(f"block_templates(enabled): expected True or False, got {enabled!r}")
        self.enabled = enabled
        self.saved = None

    def __enter__(self):
        self.saved = _ON[0]
        _ON[0] = self.enabled
        return self

    def __exit__(self, *exc):
        _ON[0] = self.saved
        return False


def template_info() -> dict:
    """Counters since import (or the last :func:`reset_templates`): ``tasks`` run with templates,
    ``recorded`` (block recordings), ``templated`` (blocks run from a template), ``plain``
    (blocks of those tasks run plainly: first/last, diverged, after giving up), ``diverged``,
    ``restarts`` (programs rerun plainly), ``sites_off``."""
    return dict(_INFO, sites_off=len(_SITE_OFF))


def reset_templates() -> None:
    """Forget the task sites turned off and zero the counters (tests)."""
    _SITE_OFF.clear()
    for k in _INFO:
        _INFO[k] = 0


class Restart(BaseException):
    """The program must rerun plainly with templates off for task site ``args[0]`` (internal; a
    BaseException so that kernel code's ``except Exception`` does not swallow it)."""


class _Diverged(Exception):
    """A template guard saw another value than the recording (internal)."""


# ---- the program hook ----------------------------------------------------------------------------
def install() -> None:
    """Install :func:`execute` as ``Program.execute``'s wrapper (pto.runtime does at import)."""
    from pto.runtime import program
    program._block_execute = execute


def execute(prog, run_once, args, kwargs):
    """``run_once(args, kwargs)`` (the plain ``Program.execute``); when a template recording could
    not go on (:class:`Restart`, or an exception left the program while a block was being
    recorded), the program state is rebuilt and the call runs again with templates off for that
    task site. Returns what ``run_once`` returns; raises what a plain run raises."""
    if not _ON[0]:
        return run_once(args, kwargs)
    try:
        return run_once(args, kwargs)
    except BaseException as e:  # noqa: BLE001 - rerun plainly below, or re-raise
        site = e.args[0] if type(e) is Restart else prog.__dict__.get("_tpl_recording")
        if site is None:
            raise
        gen = prog.__dict__.get("_tpl_gen")
        if gen is not None:
            gen.close()  # a recording still open: its recorder mode and trace hook go now
    _SITE_OFF.add(site)
    _INFO["restarts"] += 1
    jf, config = prog.jf, prog.config
    prog.__dict__.clear()
    type(prog).__init__(prog, jf, config)
    return execute(prog, run_once, args, kwargs)


def _usable(prog, task, n: int) -> bool:
    if not _ON[0] or n < MIN_BLOCKS or prog.check or prog.go is not None or prog.reorder is not None:
        return False
    if prog.config.drop_init or prog._drop_init or task.site in _SITE_OFF:
        return False
    if sys.gettrace() is not None:  # the recording's identity watch needs the trace hook
        return False
    for m in torch.overrides._get_current_function_mode_stack():
        if isinstance(m, _replay._Recorder):  # the program cache records this run
            return False
    if _replay._world_size() > 1:
        return False
    return True


def runner(prog, task, n: int):
    """The block iterator of ``pl.spmd`` (language/control.py) for ``task`` of ``n`` blocks, or
    None when templates do not apply (then the caller runs every block plainly)."""
    if not _usable(prog, task, n):
        return None
    gen = prog._tpl_gen = _blocks(prog, task, n)
    return gen


def _blocks(prog, task, n: int):
    """Yield the block indices the kernel's loop body runs (block 0 as a symbol, recorded; the
    blocks that diverge; the last block) between begin_block and end_block; run the others from
    the templates."""
    _INFO["tasks"] += 1
    variants: list = []
    tpl = yield from _record(prog, task, 0, variants)
    if _worth(tpl, 1, n):
        variants.append(tpl)
    else:
        _SITE_OFF.add(task.site)  # the blocks' paths differ by their index: plain (and plain next time)
    misses = 0
    hits = 0
    plain = 1
    for k in range(1, n - 1):
        done = False
        if variants:
            prog.begin_block(task, k)
            blk = prog.cur_block
            for j, v in enumerate(variants):
                if v.run(k, blk):
                    done = True
                    if j:  # blocks come in runs of one path: the variant that served this one goes first
                        variants.insert(0, variants.pop(j))
                    break
            if done:
                hits += 1
                _ctx.state.block = prog.cur_block = None
                continue
            misses += 1
            _INFO["diverged"] += 1
            task.blocks.pop()
            _ctx.state.block = prog.cur_block = None
            if misses > 2 * hits + 8:  # the blocks keep taking other paths: plain from here on
                variants = []
                _SITE_OFF.add(task.site)
        if variants and len(variants) < MAX_VARIANTS and n - 1 - k >= MIN_BLOCKS:  # enough blocks left to pay
            tpl = yield from _record(prog, task, k, variants)
            if _worth(tpl, k + 1, n):
                variants.append(tpl)
            plain += 1
            continue
        prog.begin_block(task, k)
        yield k
        prog.end_block()
        plain += 1
    if n > 1:
        prog.begin_block(task, n - 1)
        yield n - 1
        prog.end_block()
        plain += 1
    _INFO["templated"] += hits
    _INFO["plain"] += plain


def _fixed_view(op):
    """``op`` without its result shape/stride guard when that is fixed by constant arguments:
    ``as_strided(x, size, stride, offset)`` with constant ``size`` and ``stride`` (only the offset
    follows from the block index or reads) makes a view of exactly that size and stride."""
    f, a, kw, outs, gk, g, big = op
    if gk == 8 and getattr(f, "__name__", "") in ("as_strided", "as_strided_copy") and len(a) >= 3 and not kw \
            and not any(type(x) in (_replay._X, _replay._Seq, Sym) for x in (a[1], a[2])):
        return (f, a, kw, outs, 0, None, big)
    return op


def _worth(tpl, k0: int, n: int) -> bool:
    """True when template ``tpl`` (None: none) passes its block-index guards for enough of the
    blocks ``k0 .. n-2`` to pay for its recording."""
    if tpl is None:
        return False
    need = min(8, n - 1 - k0)
    hits = 0
    for k in range(k0, n - 1):
        if tpl.ok(k):
            hits += 1
            if hits >= need:
                return True
    return False


def _record(prog, task, k: int, variants: list):
    """Run block ``k`` with its index as a symbol under a recorder (a generator: yields the symbol
    to the loop body); returns its :class:`_Template` or None."""
    _INFO["recorded"] += 1
    rec = _BlockRecorder(prog)
    b = Sym(k, ("R", 0), rec)
    rec.nvals = 1
    rec.reads.append(0)
    nbufs, nscopes = len(prog.buffers), len(prog.scopes)
    prog.begin_block(task, k)
    blk = prog.cur_block
    blk.idx = b
    prog._tpl_recording = task.site
    rec.active = True
    sys.settrace(rec.watch)
    try:
        with rec:
            yield b
        rec.flush()
    finally:
        rec.active = False
        sys.settrace(None)
    blk.idx = k
    prog._tpl_recording = None
    tpl = None
    if rec.bad is None and len(prog.buffers) == nbufs and len(prog.scopes) == nscopes and not prog.block_errors:
        try:
            tpl = _Template(rec, blk)
        except _Unsupported:
            tpl = None
    blk.fp = concrete_of(blk.fp)
    for a in _COUNTERS:
        v = getattr(blk, a)
        if type(v) is Sym:
            setattr(blk, a, v.v)
    if blk.vk is not None:
        blk.vk = {kk: concrete_of(vv) for kk, vv in blk.vk.items()}
    prog.end_block()
    return tpl


def _lin(node):
    """The linear form ``({leaf: coefficient}, constant)`` of an integer expression over read
    leaves (``+``, ``-``, ``*`` by a constant), or None."""
    if type(node) is not tuple:
        return ({}, node) if type(node) is int else None
    op = node[0]
    if op == "R" or op == "L":
        return ({node: 1}, 0)
    if len(node) != 3 or op not in ("+", "-", "*"):
        return None
    a, b = _lin(node[1]), _lin(node[2])
    if a is None or b is None:
        return None
    if op == "*":
        if a[0] and b[0]:
            return None
        if not a[0]:
            a, b = b, a
        k = b[1]
        return ({x: c * k for x, c in a[0].items() if c * k}, a[1] * k)
    sign = 1 if op == "+" else -1
    out = dict(a[0])
    for x, c in b[0].items():
        c = out.get(x, 0) + sign * c
        if c:
            out[x] = c
        else:
            out.pop(x, None)
    return (out, a[1] + sign * b[1])


def _src(node, sub) -> str:
    """Python source of the operator node ``node``, its operands written by ``sub``."""
    op = node[0]
    if len(node) == 2:
        return _SYM_UN[op].format(sub(node[1]))
    return f"({sub(node[1])} {op} {sub(node[2])})"


def _index_only(node) -> bool:
    """True when expression ``node`` reads nothing but the block index (leaf ``("R", 0)``)."""
    if type(node) is not tuple:
        return True
    if node[0] == "R":
        return node[1] == 0
    if node[0] == "L":
        return False
    return all(_index_only(x) for x in node[1:])


class _Unsupported(Exception):
    """The recorded block holds something a template cannot reproduce (internal)."""


class _BlockRecorder(_replay._Recorder):
    """runtime/replay.py's recorder, for one block: tensors made before the block (GM data, module
    constants) are constants of the template; in-place operations on GM storage are marked (the
    template saves their windows when a guard follows them); guard budgets end the template, not
    the block."""

    def __init__(self, prog):
        super().__init__(param=True)
        self.gm = {prog.heap.storage.untyped_storage().data_ptr()}
        for buf in prog.buffers:
            d = buf.data
            if d is not None and not d.is_meta:
                self.gm.add(d.untyped_storage().data_ptr())
        self.gm_writes: dict = {}  # op index -> ("setitem" or "inplace", the argument Buffer written in place or None)
        # Out/InOut arguments written in place (the caller's tensors; Program.undo): their stores save
        # what they overwrite (Buffer.save_view), and so do the template's
        self.in_place = {buf.data.untyped_storage().data_ptr(): buf for buf in prog.buffers
                         if buf.kind == "arg" and getattr(buf, "undo", None) is not None}

    def _val(self, t):
        e = self.ids.get(id(t))
        if e is not None and e[0]() is t:
            return _replay._V(e[1])
        i = self._new(t)
        self.consts[i] = t
        return _replay._V(i)

    def _budget(self, exact: bool) -> None:
        self.nguards += 1
        if self.nguards > 4000 and self.bad is None:
            self.bad = "more than 4000 guards in one block"
            self.active = False

    def watch(self, frame, event, arg):
        """The identity watch of runtime/replay.py: code that could tell the block index (or a
        read) from its number stops the recording; the program reruns plainly (:func:`execute`)."""
        code = frame.f_code
        why = _replay._OBSERVES.get(code, 0)
        if why == 0:
            why = _replay._OBSERVES[code] = _replay.observes_identity(frame)
        if why is not None:
            self.bad = why
            self.active = False
            sys.settrace(None)
            raise Restart(_ctx.state.program.cur_task.site)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        p = self.pending
        if p is not None:
            f = sys._getframe(1)
            if f is p[2] and f.f_lasti == p[3]:  # torch's parser of this very call (see Sym.__index__)
                self.pending = None
        mark = None
        if self.bad is None and self.active:
            name, kind = _replay._func_kind(func)
            if kind == 2 or "out" in kwargs:
                dst = kwargs.get("out", args[0] if args else None)
                ptr = dst.untyped_storage().data_ptr() if isinstance(dst, torch.Tensor) else None
                if ptr in self.gm:
                    mark = "setitem" if name == "__setitem__" else "inplace" if "out" not in kwargs else None
                    if mark is None:
                        self.bad = f"{name} with out= into GM"
                    mark = (mark, self.in_place.get(ptr))
            n0 = len(self.ops)
        res = super().__torch_function__(func, types, args, kwargs)
        if mark is not None and len(self.ops) > n0 and self.ops[-1][0] is func:
            self.gm_writes[len(self.ops) - 1] = mark
        return res


# ---- the template ----------------------------------------------------------------------------------
class _Template:
    """Straight-line Python of one recorded block: ``run(k, blk)`` runs block ``k`` into the Block
    record ``blk`` (footprints, counters) and returns True, or undoes its GM writes and returns
    False when a guard fails."""

    __slots__ = ("fn", "ok", "undo", "unlogged", "src")

    def __init__(self, rec: _BlockRecorder, blk):
        P: list = []
        pidx: dict = {}

        def par(obj) -> str:
            key = id(obj)
            j = pidx.get(key)
            if j is None or P[j] is not obj:
                j = pidx[key] = len(P)
                P.append(obj)
            return f"c{j}"

        def leaf(node) -> str:
            out = f"R{node[1]}"
            if node[0] == "L":
                out += "".join(f"[{k}]" for k in node[2])
            return out

        memo: dict = {}

        def src_of(node) -> str:
            """Python source of expression ``node``; integer sums of reads written as linear forms."""
            if type(node) is not tuple:
                return const(node)
            hit = memo.get(id(node))
            if hit is not None and hit[0] is node:
                return hit[1]
            lf = _lin(node)
            if lf is not None:
                terms = [f"{c} * {leaf(x)}" if c != 1 else leaf(x) for x, c in lf[0].items()]
                if lf[1] or not terms:
                    terms.append(str(lf[1]))
                out = "(" + " + ".join(terms) + ")"
            elif node[0] == "R" or node[0] == "L":
                out = leaf(node)
            else:
                out = _src(node, src_of)
            memo[id(node)] = (node, out)
            return out

        def num(x) -> str:
            t = type(x)
            if t is Sym:
                return src_of(x.n) if x.rec is rec else const(x.v)
            return const(x)

        def const(x) -> str:
            t = type(x)
            if t is int or t is bool or x is None or t is str:
                return repr(x)
            if t is float and x == x and x not in (float("inf"), float("-inf")) and x != 0.0:
                return repr(x)
            return par(x)

        def expr(x) -> str:
            t = type(x)
            if t is _replay._V:
                c = rec.consts.get(x.i)
                return par(c) if c is not None else f"v{x.i}"
            if t is _replay._Seq:
                inner = ", ".join(expr(y) for y in x.items)
                return f"({inner},)" if x.kind is tuple else f"[{inner}]"
            if t is _replay._X:
                return src_of(x.n)
            if t is _replay._Sl:
                return f"slice({expr(x.start)}, {expr(x.stop)}, {expr(x.step)})"
            if t is Sym:
                return num(x)
            return const(x)

        ops = rec.ops
        # guards on the block index alone go first (no data decides them: the same outcome at any
        # point of the block); the others stay where the recording took them
        pure = [i for i, op in enumerate(ops) if op[4] in (6, 7) and _index_only(op[5][0])]
        hoisted = set(pure)
        ops = [ops[i] for i in pure] + [_fixed_view(op) for i, op in enumerate(ops) if i not in hoisted]
        writes = {}
        pos = {i: j for j, i in enumerate(pure + [i for i in range(len(rec.ops)) if i not in hoisted])}
        for i, w in rec.gm_writes.items():
            writes[pos[i]] = w
        last_guard = max((i for i, op in enumerate(ops) if op[4] in (1, 2, 4, 6, 7, 8) and i >= len(pure)),
                         default=-1)
        self.unlogged = any(i >= last_guard for i in writes)
        self.undo = False
        lines: list = []
        seen: set = set()
        pure_conds: list = []
        for i, (f, a, kw, outs, gk, g, _big) in enumerate(ops):
            if gk == 9:
                lines.append(f"R{outs} = {src_of(g)}")
                continue
            if gk == 6 or gk == 7:
                node, v = g
                e = src_of(node)
                if gk == 6:
                    cond = e if v else f"not {e}"
                elif type(v) is float:
                    cond = f"(type({e}) is float and Z({e}, {par(v)}))"
                else:
                    cond = f"({e} == {const(v)} and type({e}) is {par(type(v))})"
                if cond in seen:  # the same guard again (its reads are the same registers): it holds
                    continue
                seen.add(cond)
                if i < len(pure):
                    pure_conds.append(cond)
                else:
                    lines.append(f"if not ({cond}): raise D")
                continue
            call = par(f) + "(" + ", ".join([expr(x) for x in a] + [f"{k}={expr(v)}" for k, v in kw.items()]) + ")"
            if gk == 5:
                lines.append(f"R{outs} = {call}")
                continue
            if gk == 1:
                if type(g) is float and g != g:
                    lines.append(f"_ = {call}")
                    lines.append("if _ == _: raise D")
                elif type(g) in (int, bool, str) or g is None:
                    lines.append(f"if {call} != {const(g)}: raise D")
                else:
                    lines.append(f"if not Z({call}, {par(g)}): raise D")
                continue
            if gk == 4:
                lines.append(f"_ = {call}")
                if g.whole:
                    lines.append(f"if not Z(_, {par(g.value)}): raise D")
                else:
                    conds = [f"not Z(_{''.join(f'[{k}]' for k in path)}, {par(v)})" for path, v in g.seen.items()]
                    if conds:
                        lines.append(f"if {' or '.join(conds)}: raise D")
                continue
            w = writes.get(i)
            if w is not None:
                w, arg = w
                dst = expr(a[0])
                if w == "setitem":
                    lines.append(f"_k = {expr(a[1])}")
                    call = f"{par(f)}({dst}, _k, {', '.join(expr(x) for x in a[2:])})"
                    view = f"{dst}[_k]"
                else:
                    view = dst
                if arg is not None:  # an argument written in place: the program's undo log keeps the window
                    c = par(arg)
                    lines.append(f"if {c}.undo is not None: {c}.save_view({view})")
                if i < last_guard:  # a GM write a later guard may have to undo
                    self.undo = True
                    lines.append(f"U.append(({dst}, {'_k' if w == 'setitem' else 'None'}, {view}.clone()))")
            if type(outs) is int:
                tgt = f"v{outs}"
            elif outs is None:
                tgt = None
            else:
                tgt = ", ".join(f"v{o}" for o in outs) + ("," if len(outs) == 1 else "")
            if gk in (2, 8):
                lines.append(f"_ = {call}")
                if type(outs) is int:
                    if gk == 2:
                        lines.append(f"if tuple(_.shape) != {par(g)}: raise D")
                    else:
                        lines.append(f"if tuple(_.shape) != {par(g[0])} or _.stride() != {par(g[1])}: raise D")
                else:
                    lines.append(f"if tuple(tuple(y.shape) for y in _) != {par(g)}: raise D")
                if tgt is not None:
                    lines.append(f"{tgt} = _")
            elif tgt is None:
                lines.append(call)
            else:
                lines.append(f"{tgt} = {call}")
        # the bookkeeping: footprints and counters from their expressions
        fps = []
        for buf, box, kind in blk.fp:
            if type(box) is not tuple or len(box) != 4:
                raise _Unsupported("a footprint that is not one box")
            fps.append(f"({par(buf)}, ({', '.join(num(x) for x in box)}), {kind})")
        lines.append(f"B.fp = [{', '.join(fps)}]")
        for a in _COUNTERS:
            lines.append(f"B.{a} = {num(getattr(blk, a))}")
        if blk.vk is not None:
            lines.append("B.vk = {" + ", ".join(f"{const(kk)}: {num(vv)}" for kk, vv in blk.vk.items()) + "}")
        body = "\n        ".join(lines)
        ok = " and ".join(f"({c})" for c in pure_conds) or "True"
        unpack = ", ".join(f"c{j}" for j in range(len(P)))
        src = (f"def make(P):\n    {unpack}{',' if len(P) == 1 else ''} = P\n" if P else "def make(P):\n") + \
              f"    def blk(R0, B, U):\n        {body}\n    def ok(R0):\n        return {ok}\n    return blk, ok\n"
        factory = _CODE.get(src)
        if factory is None:
            if len(_CODE) > 4096:
                _CODE.clear()
            ns = {"D": _Diverged, "Z": _replay._same_signed, **_SYM_NS}
            exec(compile(src, "<pto block template>", "exec"), ns)  # noqa: S102 - generated
            factory = _CODE[src] = ns["make"]
        self.fn, self.ok = factory(tuple(P))
        self.src = src if _DEBUG else None

    def run(self, k: int, blk) -> bool:
        """Run block ``k`` into ``blk``; False (nothing left written) when a guard fails.

        Raises:
            Restart: an operation raised after GM writes that were not saved (the program reruns
                plainly).
        """
        if not self.ok(k):  # a guard on the block index alone fails: nothing ran
            return False
        undo = [] if self.undo else None
        try:
            self.fn(k, blk, undo)
            return True
        except _Diverged as e:
            if _DEBUG:
                tb = e.__traceback__
                while tb.tb_next is not None:
                    tb = tb.tb_next
                _DIVERGED_AT.append((blk.task.name, k, self.src.split("\n")[tb.tb_lineno - 1].strip()))
                del _DIVERGED_AT[:-200]
        except Exception:  # noqa: BLE001 - the block runs plainly and raises it with its context
            if self.unlogged:  # GM writes that cannot be undone: the program reruns plainly
                raise Restart(blk.task.site) from None
        if undo:
            for dst, key, saved in reversed(undo):
                if key is None:
                    dst.copy_(saved)
                else:
                    dst[key] = saved
        blk.fp = []
        return False
