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
   where the block's operations allow it, each run of consecutive blocks whose guards on the
   index hold for one of the task's templates (block 0's or a variant recorded later: at least
   8 blocks, footprints not overlapping where one writes) runs *batched* (:class:`_Batch`,
   ``PTO_BLOCK_BATCH=0`` turns it off): each operation once for all blocks, with a leading
   block dimension: GM loads and stores as ``as_strided`` views with a block stride (offsets
   affine in the index), elementwise ops broadcast, reductions along a dim (or over a block's
   whole tile: ``any``, ``all``, ``aminmax``), sorts, gathers, concatenations and matmuls
   batched, each new (op, per-block shapes, dtypes) checked once against its per-block results
   bit for bit (never batched again if they differ). A number argument computed from the index
   in another way (``(k + c) // 4``) or from values read from data takes its value per block:
   one number for the whole batch, or affine in the index, or (a comparison's bound) a column
   of numbers exact in the tile's dtype; anything else stops the batch. Values read from data
   may decide guards there (each block's outcome from the batched read; a tensor's truth
   value too) and give footprints (computed per block after the batch ran; the stores undone
   if they overlap); a block whose guard fails has its stores undone (the batch saves every
   store's window first) and runs on its own afterwards, its run of such blocks batched again
   where another template holds (the program reruns plainly if such a block touched a window a
   later block of the batch touched, one of them writing). A batch that cannot run (an
   operation it cannot batch) turns batching off for the task site; one whose every block
   failed a guard on data does not (the data of a later task may take block 0's path);
3. runs the last block plainly (so that the loop variable and whatever the body left in the
   kernel's variables are those of a plain run).

Block 0's template is kept when its index guards hold for few blocks (the first tokens of a
chunk that see nothing): the blocks past it record their own paths. A block whose guard fails
(another path: a partial last tile, a masked key block, an index past a table) is undone and
run plainly: the stores the template made into GM before the guard
are saved first (a clone of each window) and written back. Such a block is recorded as another
variant of the template (up to ``MAX_VARIANTS``); a task whose blocks keep diverging stops
using templates and its site is remembered for later programs (``_SITE_OFF``). A task none
of whose blocks ran batched (no variant with a batched form), or whose recordings times
``RECORD_BLOCKS`` (``PTO_BLOCK_TEMPLATES_RECORD_BLOCKS``, 50: what a recording costs in plain
blocks) exceed its batched blocks, makes later tasks of its site and block count, and a batch
that gave up makes later tasks of its site, use templates only with at least ``MIN_UNBATCHED``
blocks (``PTO_BLOCK_TEMPLATES_MIN_UNBATCHED``, 256): block by block, a template does not pay for
its recordings on fewer.

What stays as in a plain run: the results (the same torch operations on the same values in
the same order), the task graph (per-block footprints, grouped and coalesced by
``Program.end_task``), the statistics and the simulator's inputs (per-block counters), and the
errors (a block that raises plainly diverges from its template and runs plainly). Where the
recording itself cannot go on (the block's Python raised, or code that could tell a symbol from
a number by ``type``/``id``/``is`` was about to run), the whole program is rerun plainly with
templates off for that task site (only private copies of Out/InOut arguments, the heap, and
Out/InOut arguments written in place with the program's undo log were written; :func:`execute`).
The identity watch (a trace hook on calls, which slows every Python call of the block several
times) runs on every recording: a later recording (a diverged block's variant, block 0 of a
later program) may reach code the first one did not. Each code object is examined once per
process (replay's cache).

Across tasks: a kernel runs the same task site once per call (each layer of a forward, each
prefill chunk, each generate). At the start of a task, the variables of the frame that iterates
``pl.spmd`` are keyed (:class:`_TaskEnv`): numbers by value, type and sign, strings, dtypes,
containers of them, frozen dataclasses, modules and classes, functions by code and closure;
GM tensors, tiles and tensors (also inside a tuple, list or dict) by shape, strides, storage
offset and dtype, with their Buffer's facts (kind, direction, heap offset, undo log) and which
variables share an object; plus the site, the block count, the pypto compatibility mode and
the RunConfig. A task whose key an earlier task of the site kept runs from that task's
templates (all its variants), each constant that was a tensor, Buffer or tile of a kernel
variable replaced by the same variable's object of this task: no recording, and block 0 runs
like the others (batched where the index guards hold). A task whose variables include
anything else (a mutable object, a tensor inside an object, a closure over a tensor), whose
loop runs in pto's own code (the decorator form ``@pl.spmd(n)``), or whose templates hold a
constant that is neither portable (numbers, shape lists, torch's functions, the DSL's cached
FP32 scalars) nor an object of a kernel variable records its own and keeps none. The module
globals the kernel function's own code names are keyed too where their values are keyable;
what the body reaches otherwise (the globals of the helpers it calls, a mutable global, a loop
value carried from block to block) is taken as the first task of the key saw it.
``PTO_BLOCK_TEMPLATES_REUSE=0`` turns this off; the latest ``_REUSE_MAX`` (512) keys are kept.

Not used (plain blocks): check mode, graph-only mode, ``drop_init``, a ``block_order`` other
than ``"program"``, a phased (syncall) body, a distributed world of more than one rank, while
the program cache records a run, under a trace function (a debugger, coverage), and a block
that allocates (``pl.create_tensor``) or opens a heap scope. A block body's Python side effects
outside the block (appending to a list defined outside the task) happen only for the blocks
that run plainly (the first and the last, and any that diverged): kernels keep their effects in
GM, as on the device.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import sys
import types
from collections import OrderedDict

import torch

from pto.errors import PtoError
from pto.language import _ctx
from pto.language import compat_ops as _compat
from pto.language.control import spmd as _spmd
from pto.language.dtypes import DType
from pto.language.tensor_ops import GMTensor
from pto.language.tile_ops import Tile
from pto.runtime import replay as _replay
from pto.runtime.graph import Block
from pto.runtime.heap import Buffer
from pto.runtime.symbolic import NAMESPACE as _SYM_NS
from pto.runtime.symbolic import _UN_SRC as _SYM_UN
from pto.runtime.symbolic import Sym, concrete_of, evaluate
from pto.runtime.symbolic import trusted as _sym_trusted

__all__ = ["set_block_templates", "block_templates", "block_templates_enabled", "template_info"]

_ON = [os.environ.get("PTO_BLOCK_TEMPLATES", "0").strip().lower() not in ("0", "", "false", "off", "no")]
MIN_BLOCKS = int(os.environ.get("PTO_BLOCK_TEMPLATES_MIN", "24"))  # fewer blocks: plain (a recording costs ~10 plain blocks)
# a task site whose blocks did not run batched (no batched form, or the batch gave up): later tasks
# there use templates only with at least this many blocks. Block by block, a template saves a
# fraction of a plain block (the DSL's checks), while a recording (under the identity watch's trace
# hook) costs ~50 plain blocks and each diverging path records again: at 64 blocks
# (prefill_c4_softmax_pool, tiny) such a task took ~3x its plain time
MIN_UNBATCHED = int(os.environ.get("PTO_BLOCK_TEMPLATES_MIN_UNBATCHED", "256"))
# a recording costs about this many plain blocks (recorder and identity watch; tiny prefill, 2-core
# machine: prefill_idx_score ~20 ms against a ~0.36 ms plain block), a batched block a small
# fraction of one: a task whose recordings times this exceed its batched blocks did not pay for them
RECORD_BLOCKS = int(os.environ.get("PTO_BLOCK_TEMPLATES_RECORD_BLOCKS", "50"))
MAX_VARIANTS = 4  # templates per task (paths through the block)
_SITE_OFF: set = set()  # task sites whose blocks could not be templated (later programs run them plainly)
_CODE: dict = {}  # generated source -> compiled factory
_INFO = {"tasks": 0, "recorded": 0, "reused": 0, "templated": 0, "batched": 0, "plain": 0, "diverged": 0,
         "restarts": 0}
_DEBUG = os.environ.get("PTO_BLOCKS_DEBUG", "0") not in ("0", "")
_DIVERGED_AT: list = []  # (task, block, template line) of the latest divergences (PTO_BLOCKS_DEBUG=1)
_BATCH_LOG: list = []  # (task, blocks, what batching did) per templated task (PTO_BLOCKS_DEBUG=1)
_COUNTERS = ("ops", "flops", "bytes", "ld", "st", "mm", "cube")


def _log(entry: tuple) -> None:
    """Keep ``entry`` (task, blocks or block, what happened) in ``_BATCH_LOG`` (the latest 2000)."""
    _BATCH_LOG.append(entry)
    del _BATCH_LOG[:-2000]


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


class block_templates(_replay._Switch):  # noqa: N801 - used like a function: ``with block_templates():``
    """``with pto.runtime.block_templates():`` turns block templates on (``enabled=False``: off)
    inside the block and restores the previous setting after it.

    Raises:
        TypeError: ``enabled`` is not a bool.
    """

    _flag, _what = _ON, "block_templates"


def template_info() -> dict:
    """Counters since import (or the last :func:`reset_templates`): ``tasks`` run with templates,
    ``recorded`` (block recordings), ``reused`` (tasks that took an earlier task's templates),
    ``templated`` (blocks run from a template), ``plain``
    (blocks of those tasks run plainly: first/last, diverged, after giving up), ``diverged``,
    ``restarts`` (programs rerun plainly), ``sites_off``."""
    return dict(_INFO, sites_off=len(_SITE_OFF))


def reset_templates() -> None:
    """Forget the task sites turned off (and those not batched) and the templates kept across
    tasks, and zero the counters (tests)."""
    _SITE_OFF.clear()
    _NO_BATCH.clear()
    _KEPT.clear()
    _UNBATCHED.clear()
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
        if not isinstance(e, (Exception, Restart)):
            raise  # KeyboardInterrupt, SystemExit: stop (the program undid its stores), no rerun
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
    if n < MIN_UNBATCHED and ((task.site, n) in _UNBATCHED or task.site in _NO_BATCH):
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
    env = _TaskEnv.of(prog, task, n) if _REUSE[0] else None
    variants = env.bind() if env is not None else None
    if variants is not None:  # an earlier task of this site and kernel state: its templates, no recording
        _INFO["reused"] += 1
        st = {"hits": 0, "misses": 0, "plain": 0, "variants": variants}
        k1, recorded0 = 0, _INFO["recorded"]
    else:
        variants = []
        tpl = yield from _record(prog, task, 0, variants)
        if _worth(tpl, 1, n):
            variants.append(tpl)
        elif tpl is not None and (tpl.ok(1) or tpl.batch is not None):
            # block 0's path holds for a few blocks only (the first tokens of a chunk see nothing):
            # kept, the blocks past it record their own paths (a later run of them may batch)
            if _DEBUG:
                _log((task.name, n, "index guards hold for a few blocks"))
            variants.append(tpl)
        else:
            if _DEBUG and tpl is not None:
                _log((task.name, n, "index guards hold for too few blocks"))
            _SITE_OFF.add(task.site)  # the blocks' paths differ by their index: plain (and plain next time)
        st = {"hits": 0, "misses": 0, "plain": 1, "variants": variants}
        k1, recorded0 = 1, _INFO["recorded"] - 1
    if _DEBUG and variants:
        _log((task.name, n, "no batched form: " + str(variants[0].why) if variants[0].batch is None
                           else "site not batched" if task.site in _NO_BATCH else "batched"))
    batched0 = _INFO["batched"]
    sort = yield from _run_range(prog, task, k1, n - 1, n, st)
    batched, recorded = _INFO["batched"] - batched0, _INFO["recorded"] - recorded0
    if variants and ((variants[0].batch is None and not batched) or recorded * RECORD_BLOCKS > batched):
        # no block of the task ran batched (block 0's template has no batched form, nor had any
        # variant recorded later), or its recordings cost more than the batches saved (a path per
        # visible page count: prefill_idx_score's three recordings per task for ~122 batched
        # blocks): tasks of this site and block count run plainly from here on (below
        # MIN_UNBATCHED blocks). A task of another block count (a prompt's last, shorter chunk)
        # does not mark the full chunks' tasks
        _UNBATCHED.add((task.site, n))
    if env is not None and recorded and st["variants"] and task.site not in _SITE_OFF:
        env.keep(st["variants"])  # recorded here (not only bound): kept for the next task of this key
    if sort:
        task.blocks.sort(key=lambda b: b.idx)
    if n > 1:
        prog.begin_block(task, n - 1)
        yield n - 1
        prog.end_block()
        st["plain"] += 1
    _INFO["templated"] += st["hits"]
    _INFO["plain"] += st["plain"]


def _run_range(prog, task, k: int, stop: int, n: int, st: dict, avoid=None):
    """Run blocks ``k .. stop - 1`` of ``task`` (``n`` blocks; a generator, as :func:`_blocks`):
    each run of blocks whose index guards of a variant with a batched form hold, at once; the
    others on their own (:func:`_one`); ``avoid``: a variant not to batch with (these blocks just
    failed its guards on data). Returns True when blocks ran out of index order (the task's
    blocks must be sorted)."""
    sort = False
    while k < stop:
        # a variant with a batched form whose index guards hold from block k: the run of such
        # blocks at once (a path other than block 0's may start anywhere: a later run of tokens)
        v = None
        if task.site not in _NO_BATCH:
            for w in st["variants"]:
                if w.batch is not None and w is not avoid and w.ok(k):
                    v = w
                    break
        if v is not None:
            m, failed, batch_fp = _batched(prog, task, v, k, stop)
            if _DEBUG:
                _log((task.name, n, f"ran {m} blocks batched from {k}, {len(failed)} failed"))
            if m:
                st["hits"] += m - len(failed)
                if failed:  # blocks of the batch that took another path: now, by runs of consecutive ones
                    sort = True
                    i = 0
                    while i < len(failed):
                        j = i + 1
                        while j < len(failed) and failed[j] == failed[i] + (j - i):
                            j += 1
                        yield from _run_range(prog, task, failed[i], failed[j - 1] + 1, n, st, v)
                        i = j
                    _after_batch(task, batch_fp, failed)
                k += m
                continue
        yield from _one(prog, task, k, n, st)
        k += 1
    return sort


def _one(prog, task, k: int, n: int, st: dict):
    """Run block ``k`` of ``n`` on its own (a generator, as :func:`_blocks`): from the first of
    ``st["variants"]`` whose guards hold, else recorded as a new variant (when enough blocks are
    left to pay for it), else plainly. ``st`` holds the task's variants and counters."""
    variants = st["variants"]
    if variants:
        prog.begin_block(task, k)
        blk = prog.cur_block
        for j, v in enumerate(variants):
            if v.run(k, blk):
                if j:  # blocks come in runs of one path: the variant that served this one goes first
                    variants.insert(0, variants.pop(j))
                st["hits"] += 1
                _ctx.state.block = prog.cur_block = None
                return
        st["misses"] += 1
        _INFO["diverged"] += 1
        task.blocks.pop()
        _ctx.state.block = prog.cur_block = None
        if st["misses"] > 2 * st["hits"] + 8:  # the blocks keep taking other paths: plain from here on
            variants = st["variants"] = []
            _SITE_OFF.add(task.site)
    if variants and len(variants) < MAX_VARIANTS and n - 1 - k >= MIN_BLOCKS:  # enough blocks left to pay
        tpl = yield from _record(prog, task, k, variants)
        if _worth(tpl, k + 1, n):
            variants.append(tpl)
        st["plain"] += 1
        return
    prog.begin_block(task, k)
    yield k
    prog.end_block()
    st["plain"] += 1


# ---- templates across tasks --------------------------------------------------------------------------
# A kernel runs the same task site once per call (one per layer of a forward, one per prefill chunk):
# its block body is the same code over the same shapes, only the GM tensors differ. A task whose
# kernel state matches an earlier task's of the same site takes that task's templates with the new
# tensors in place of the old ones, and records nothing.
_REUSE = [os.environ.get("PTO_BLOCK_TEMPLATES_REUSE", "1").strip().lower() not in ("0", "", "false", "off", "no")]
_REUSE_MAX = 512  # kept (site, state) entries; the least recently used goes beyond that
_KEPT: OrderedDict = OrderedDict()  # env key -> list of template recipes
_SIMPLE = (type(None), bool, int, str, bytes, torch.dtype, DType, type(Ellipsis))
_CALLABLE = (types.BuiltinFunctionType, types.MethodDescriptorType, types.WrapperDescriptorType,
             types.MethodWrapperType, types.ClassMethodDescriptorType)
_HELD = (GMTensor, Tile, torch.Tensor, torch.nn.Parameter)
_BUF_FACTS = ("kind", "direction", "readonly", "untracked", "partial", "offset", "base_off", "no_copy", "freed")
_HOLDERS = (types.ModuleType, type, types.GetSetDescriptorType, types.MemberDescriptorType)


class _Unkeyable(Exception):
    """A kernel variable whose value cannot be part of a task's reuse key (internal)."""


class _Slot:
    """Where a template constant comes from: object ``i`` of kernel variable ``name`` (its GM
    tensor's view, Buffer or the Buffer's tensor; a tile's values or mask; a tensor)."""

    __slots__ = ("name", "i")

    def __init__(self, name: str, i: int):
        self.name, self.i = name, i


class _RecView:
    """What a batched form reads of its recorder: the constants and the recorded tensor metadata."""

    __slots__ = ("consts", "meta")

    def __init__(self, consts: dict, meta: dict):
        self.consts, self.meta = consts, meta


def _value_key(v, depth: int = 0):
    """A hashable key equal for two values a block body cannot tell apart (numbers with their
    type and sign, strings, dtypes, containers of them, frozen dataclasses, modules, classes,
    functions by code and closure). Raises _Unkeyable for anything else (a mutable object, a
    tensor inside a container)."""
    t = type(v)
    if t in _SIMPLE or isinstance(v, enum.Enum):
        return (t, v)
    if t is float:
        return (t, v.hex() if v == v else "nan")
    if depth > 3:
        raise _Unkeyable
    if t is slice or t is range:  # by their parts (range(0, 0) == range(64, 64); slices do not hash)
        return (t, _value_key(v.start, depth + 1), _value_key(v.stop, depth + 1), _value_key(v.step, depth + 1))
    if t is tuple or t is list:
        if len(v) > 256:
            raise _Unkeyable
        return (t, tuple(_value_key(x, depth + 1) for x in v))
    if t is dict:
        if len(v) > 64 or any(type(k) is not str for k in v):
            raise _Unkeyable
        return (t, tuple(sorted((k, _value_key(x, depth + 1)) for k, x in v.items())))
    if t is types.FunctionType:
        try:
            cells = tuple(_value_key(c.cell_contents, depth + 1) for c in (v.__closure__ or ()))
        except ValueError:  # an empty cell
            raise _Unkeyable from None
        # code objects compare equal across modules: the module's globals too (by identity)
        return (t, v.__code__, v.__code__.co_filename, id(v.__globals__), cells, _value_key(v.__defaults__, depth + 1),
                _value_key(v.__kwdefaults__, depth + 1))
    if t is types.ModuleType or isinstance(v, type) and _framework(v) or (
            isinstance(v, _CALLABLE) and isinstance(getattr(v, "__self__", None), _HOLDERS)):
        return ("id", v)
    if dataclasses.is_dataclass(v) and not isinstance(v, type) and v.__dataclass_params__.frozen:
        # field by field (its own == would take 0.0 for -0.0, 4 for 4.0, a mutable field by identity)
        return ("dc", t, tuple(_value_key(getattr(v, f.name), depth + 1) for f in dataclasses.fields(v)))
    raise _Unkeyable


def _framework(cls: type) -> bool:
    """A class of Python, torch or pto's DSL and runtime (whose attributes kernels do not
    change); a kernel's own class may have its attributes changed between tasks: not keyable."""
    mod = getattr(cls, "__module__", "") or ""
    return mod == "builtins" or mod.split(".")[0] == "torch" or mod.startswith(("pto.language", "pto.runtime"))


def _tensor_key(x: torch.Tensor) -> tuple:
    return (tuple(x.shape), x.stride(), x.storage_offset(), x.dtype)


def _portable(x) -> bool:
    """True for a template constant that means the same in any task: numbers, strings, dtypes,
    shape lists, torch's functions and unbound methods, module-level functions."""
    t = type(x)
    if t in _SIMPLE or t is float or t is complex:
        return True
    if t is slice or t is range:
        return _portable(x.start) and _portable(x.stop) and _portable(x.step)
    if t is tuple or t is list:
        return all(_portable(y) for y in x)
    if isinstance(x, _CALLABLE):
        s = getattr(x, "__self__", None)
        return s is None or isinstance(s, _HOLDERS)
    if t is types.FunctionType:
        return x.__closure__ is None
    return isinstance(x, (type, types.ModuleType))


class _TaskEnv:
    """The kernel state a task's block body starts from (the variables of the frame running
    ``for b in pl.spmd(n)``): the reuse key and the objects a template constant may come from."""

    __slots__ = ("key", "objs", "where", "consts")

    @staticmethod
    def of(prog, task, n: int):
        """The env of ``task`` (``n`` blocks) of program ``prog``, or None when some kernel
        variable is not keyable (then the task records its own templates and keeps none)."""
        # frame 2 is pl.spmd's block generator; the frame that iterates it runs the block body. A
        # loop in pto's own code (the decorator form: the body is a function) keys nothing
        f = sys._getframe(2).f_back
        if f is None or _sym_trusted(f.f_code):
            return None
        parts: list = [task.site, n, f.f_code, _compat.mode.pypto, repr(prog.config)]
        env = _TaskEnv()
        env.objs, env.where = {}, {}
        try:
            loc = f.f_locals
            for name, v in loc.items():
                env._add(parts, name, v, 0)
        except _Unkeyable:
            return None
        # the module globals the kernel function's own code names (a global it reads, changed
        # between calls, keys another entry); one whose value is not keyable is left out
        glb = f.f_globals
        for name in f.f_code.co_names:
            if name not in loc and name in glb:
                try:
                    parts.append(("global", name, _value_key(glb[name])))
                except _Unkeyable:
                    pass
        env.key = tuple(parts)
        try:
            hash(env.key)
        except TypeError:  # some value that reached the key does not hash: not keyable
            return None
        return env

    def _add(self, parts: list, name, v, depth: int) -> None:
        """Key kernel variable ``name`` = ``v`` into ``parts``; its tensors, Buffers and tiles
        (also inside a tuple, list or dict) become objects of slot ``name``."""
        t = type(v)
        if t is GMTensor:
            buf = v.buf
            if type(buf) is not Buffer or buf.slow or buf.pending is not None:
                raise _Unkeyable
            got = (v.data, buf, buf.data)
            parts.append((name, "G", _tensor_key(v.data), _tensor_key(buf.data), buf.shape, buf.dtype,
                          tuple(_value_key(getattr(buf, a, None)) for a in _BUF_FACTS),
                          getattr(buf, "undo", None) is not None))
        elif t is Tile:
            vals, ib = getattr(v, "_vals", None), getattr(v, "_ib", None)
            vk = None if vals is None else (vals[0] is v.data, vals[1], _value_key(vals[2]))
            ik = None if ib is None else (ib[0] is v.data, ib[1], ib[2])
            got = (v.data, v.mask)
            parts.append((name, "T", _tensor_key(v.data), v.mask is None, _value_key(v.valid), vk, ik,
                          getattr(v, "_mown", None)))
        elif t is torch.Tensor or t is torch.nn.Parameter:
            got = (v,)
            parts.append((name, "t", _tensor_key(v)))
        elif t is _spmd:  # a task scope (this loop's or an earlier one): its size and name
            parts.append((name, "spmd", v.n, v.name))
            return
        elif (t is tuple or t is list) and depth < 2 and any(type(x) in _HELD for x in v):
            parts.append((name, t, len(v)))
            for i, x in enumerate(v):
                self._add(parts, (name, i), x, depth + 1)
            return
        elif t is dict and depth < 2 and any(type(x) in _HELD for x in v.values()):
            parts.append((name, t, len(v)))
            for k in sorted(v, key=repr):
                parts.append((name, "k", _value_key(k)))
                self._add(parts, (name, k), v[k], depth + 1)
            return
        else:
            parts.append((name, _value_key(v)))
            return
        self.objs[name] = got
        for i, o in enumerate(got):
            if o is None:
                continue
            first = self.where.setdefault(id(o), (name, i))
            if first != (name, i):
                parts.append(("alias", name, i, first))  # two variables share the object

    def bind(self):
        """The templates an earlier task of this key kept, bound to this task's objects (a list), or None."""
        recipes = _KEPT.get(self.key)
        if recipes is None:
            return None
        _KEPT.move_to_end(self.key)
        return [self._bind(r) for r in recipes]

    def _obj(self, x):
        return self.objs[x.name][x.i] if type(x) is _Slot else x

    def _bind(self, r: dict) -> "_Template":
        tpl = _Template.__new__(_Template)
        P = tuple(self._obj(x) for x in r["P"])
        tpl.factory, tpl.P = r["factory"], P
        tpl.fn, tpl.ok, tpl.book, tpl.bookr = r["factory"](P)
        tpl.undo, tpl.unlogged, tpl.src, tpl.why = r["undo"], r["unlogged"], r["src"], r["why"]
        b = r["batch"]
        if b is None:
            tpl.batch = None
        else:
            ops, writes, used, fp_reads, consts, meta = b
            nb = tpl.batch = _Batch()
            nb.rec = _RecView({i: self._obj(c) for i, c in consts.items()}, meta)
            nb.ops, nb.used, nb.fp_reads = ops, used, fp_reads
            nb.writes = {i: (w, self._obj(a)) for i, (w, a) in writes.items()}
        return tpl

    def _slot(self, x):
        """``x`` as a recipe entry: a _Slot for an object of a kernel variable, ``x`` itself when
        portable; raises _Unkeyable otherwise (a tensor made elsewhere, a closure)."""
        hit = self.where.get(id(x))
        if hit is not None and self.objs[hit[0]][hit[1]] is x:
            return _Slot(*hit)
        if type(x) is torch.Tensor and x.dim() == 0 and id(x) in self.consts:
            return x  # the DSL's cached FP32 scalar operand of that value (never written)
        if isinstance(x, torch.Tensor) or not _portable(x):
            raise _Unkeyable
        return x

    def keep(self, variants: list) -> None:
        """Keep ``variants`` (this task's templates) for later tasks of the same key, unless one
        holds a constant that is neither portable nor an object of a kernel variable."""
        from pto.language.tile_ops import _FP32_SCALARS
        self.consts = {id(t) for t in _FP32_SCALARS.values()}
        try:
            recipes = []
            for v in variants:
                batch = None
                if v.batch is not None:
                    b = v.batch
                    for op in b.ops:
                        for x in list(op[1]) + list(op[2].values()):
                            if isinstance(x, torch.Tensor) or type(x) is GMTensor or type(x) is Tile:
                                raise _Unkeyable
                    batch = (b.ops, {i: (w, None if a is None else self._slot(a)) for i, (w, a) in b.writes.items()},
                             b.used, b.fp_reads, {i: self._slot(c) for i, c in b.rec.consts.items()}, b.rec.meta)
                recipes.append({"factory": v.factory, "P": tuple(self._slot(x) for x in v.P), "undo": v.undo,
                                "unlogged": v.unlogged, "src": v.src, "why": v.why, "batch": batch})
        except _Unkeyable:
            return
        _KEPT[self.key] = recipes
        _KEPT.move_to_end(self.key)
        while len(_KEPT) > _REUSE_MAX:
            _KEPT.popitem(last=False)


def _fixed_view(op):
    """``op`` without its result shape/stride guard when that is fixed by constant arguments:
    ``as_strided(x, size, stride, offset)`` with constant ``size`` and ``stride`` (only the offset
    follows from the block index or reads) makes a view of exactly that size and stride."""
    f, a, kw, outs, gk, g, big = op
    if gk == 8 and getattr(f, "__name__", "") in ("as_strided", "as_strided_copy") and len(a) >= 3 and not kw \
            and not any(type(x) in (_replay._X, _replay._Seq, Sym) for x in (a[1], a[2])):
        return (f, a, kw, outs, 0, None, big)
    return op


def _batched(prog, task, tpl, k0: int, stop: int):
    """Run blocks ``k0 .. k0 + m - 1`` of ``task`` at once from ``tpl``'s batched form (the
    longest run of blocks from ``k0`` whose index guards hold, at least 8, before block ``stop``,
    whose footprints do not overlap where one writes); returns ``(m, failed, footprints)``: ``m``
    0 when nothing ran (the blocks run one by one), the blocks of the run whose guards on data
    failed (undone: they still have to run), and ``(index, footprints)`` of the run's blocks."""
    m = k0
    while m < stop and tpl.ok(m):
        m += 1
    nb = m - k0
    if nb < 8:
        return 0, [], None
    blocks = []
    for j in range(k0, m):
        blk = Block(task, j)
        if not tpl.batch.fp_reads:
            tpl.book(j, blk)
        blocks.append(blk)
    if not tpl.batch.fp_reads and _cross_overlap(blocks):
        if _DEBUG:
            _DIVERGED_AT.append((task.name, -1, "batch: footprints overlap"))
        _NO_BATCH.add(task.site)
        return 0, [], None
    try:
        failed, undo, reads = tpl.batch.run(k0, nb)
    except _Abort as e:
        if _DEBUG:
            _DIVERGED_AT.append((task.name, -1, f"batch: {e}"))
        if type(e) is not _AllDiverged:  # the data of another program may take block 0's path
            _NO_BATCH.add(task.site)
        return 0, [], None
    skip = set(failed)
    if tpl.batch.fp_reads:  # footprints from values read from data: known now (the stores undone on overlap)
        for j, blk in enumerate(blocks):
            if j not in skip:
                tpl.bookr(k0 + j, blk, _Reads(reads, j, k0 + j))
        if _cross_overlap([b for j, b in enumerate(blocks) if j not in skip]):
            for dst, saved in reversed(undo):
                dst.copy_(saved)
            if _DEBUG:
                _DIVERGED_AT.append((task.name, -1, "batch: footprints overlap"))
            _NO_BATCH.add(task.site)
            return 0, [], None
    if failed:
        blocks = [b for j, b in enumerate(blocks) if j not in skip]
        failed = [k0 + j for j in failed]
    task.blocks.extend(blocks)
    _INFO["batched"] += len(blocks)
    return nb, failed, [(b.idx, b.fp) for b in blocks]


def _after_batch(task, batch_fp, failed: list) -> None:
    """After the blocks ``failed`` of a batch (whose guards on data failed) ran on their own,
    later than the batch's blocks with higher indices (``batch_fp``: their indices and
    footprints): rerun the program plainly (Restart) if such a block touched a window that a
    later block of the batch touched too, one of them writing (then the order could matter)."""
    late = set(failed)
    for b in task.blocks:
        if b.idx in late:
            probe = [b] + [_FpBlock(i, fp) for i, fp in batch_fp if i > b.idx]
            if _cross_overlap(probe):
                raise Restart(task.site)


class _FpBlock:
    """A block's index and footprints (for :func:`_cross_overlap`)."""

    __slots__ = ("idx", "fp")

    def __init__(self, idx, fp):
        self.idx, self.fp = idx, fp


def _cross_overlap(blocks) -> bool:
    """True when a footprint box of one of ``blocks`` overlaps one of another block and one of
    the two writes (then running them at once could change what a block reads or keeps)."""
    by: dict = {}
    for blk in blocks:
        for buf, box, kind in blk.fp:
            by.setdefault(id(buf), []).append((box, kind, blk.idx))
    for items in by.values():
        if not any(k for _, k, _ in items):
            continue  # read by every block, written by none
        items.sort(key=lambda it: it[0][0])
        if all(items[i][0][1] <= items[i + 1][0][0] for i in range(len(items) - 1)):
            continue  # no two boxes share a row (the usual case: a row range per block): none overlap
        active: list = []
        for box, kind, b in items:
            r0 = box[0]
            active = [it for it in active if it[0][1] > r0]
            for box2, kind2, b2 in active:
                if b2 != b and (kind or kind2) and box[2] < box2[3] and box2[2] < box[3]:
                    return True
            active.append((box, kind, b))
    return False


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
    # the identity watch (a trace hook on calls: every Python call of the block runs several times
    # slower) on every recording: a later recording may take a path into code no earlier one ran
    # (code objects already examined are looked up in replay's cache)
    # a profile hook when none is set (a profiler's takes precedence: then the trace hook): it
    # sees the same call events (a generator's resumption too) at a fraction of the cost, since
    # the interpreter runs no line events (no frame object per traced frame and line)
    hook = sys.setprofile if sys.getprofile() is None else sys.settrace
    rec.unhook = hook
    hook(rec.watch_profile if hook is sys.setprofile else rec.watch)
    try:
        # the frame running the block loop (``for b in pl.spmd(n)``) was called before the hook:
        # examine the first frame up the stack outside pto, torch and the standard library now
        f = sys._getframe(1)
        while f is not None and _sym_trusted(f.f_code):
            f = f.f_back
        if f is not None:
            rec.watch(f, "call", None)  # raises Restart for such code (nothing of the block has run)
        with rec:
            yield b
        rec.flush()
    finally:
        rec.active = False
        hook(None)
    blk.idx = k
    prog._tpl_recording = None
    tpl = None
    if rec.bad is None and len(prog.buffers) == nbufs and len(prog.scopes) == nscopes and not prog.block_errors:
        try:
            tpl = _Template(rec, blk)
        except _Unsupported as e:
            tpl = None
            if _DEBUG:
                _log((task.name, k, f"no template: {e}"))
    elif _DEBUG:
        _log((task.name, k, f"no template: {rec.bad or 'allocates, opens a scope or raised'}"))
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


def _leaves(node) -> list:
    """The read leaves (``("R", k)``, ``("L", k, path)``) of expression ``node``."""
    if type(node) is not tuple:
        return []
    if node[0] == "R" or node[0] == "L":
        return [node]
    return [leaf for x in node[1:] for leaf in _leaves(x)]


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
        self.unhook = sys.settrace  # how the identity watch is removed (_record sets it)
        self.gm = {prog.heap.storage.untyped_storage().data_ptr()}
        for buf in prog.buffers:
            d = buf.data
            if d is not None and not d.is_meta:
                self.gm.add(d.untyped_storage().data_ptr())
        self.gm_writes: dict = {}  # op index -> ("setitem" or "inplace", the argument Buffer written in place or None)
        self.meta: dict = {}  # value number -> (shape, stride, storage offset, dtype) of the recorded tensor
        self.offx: dict = {}  # value number -> storage offset expression of an as_strided view at a symbolic offset
        # Out/InOut arguments written in place (the caller's tensors; Program.undo): their stores save
        # what they overwrite (Buffer.save_view), and so do the template's
        # (storage -> its buffers: disjoint views of one caller tensor may be two such arguments)
        self.in_place: dict = {}
        for buf in prog.buffers:
            if buf.kind == "arg" and getattr(buf, "undo", None) is not None:
                self.in_place.setdefault(buf.data.untyped_storage().data_ptr(), []).append(buf)

    def _in_place_arg(self, ptr: int, dst: torch.Tensor):
        """The argument written in place whose bytes hold the GM write target ``dst`` (storage
        ``ptr``), or None when none is written in place there."""
        bufs = self.in_place.get(ptr)
        if bufs is None:
            return None
        if len(bufs) == 1:
            return bufs[0]
        p = dst.data_ptr()
        for buf in bufs:
            p0 = buf.data.data_ptr()
            if p0 <= p < p0 + buf.nbytes:
                return buf
        self.bad = "a GM write outside every argument that shares its storage"
        return None

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
            self.unhook(None)
            raise Restart(_ctx.state.program.cur_task.site)

    def watch_profile(self, frame, event, arg):
        """:meth:`watch` as a profile hook: only the call events of Python code."""
        if event == "call":
            self.watch(frame, event, arg)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        p = self.pending
        if p is not None:
            f = sys._getframe(1)
            if f is p[2] and f.f_lasti == p[3]:  # torch's parser of this very call (see Sym.__index__)
                self.pending = None
        if self.offx and self.active and self.bad is None and args and getattr(func, "__name__", "") == "storage_offset":
            e = self.ids.get(id(args[0]))
            if e is not None and e[0]() is args[0] and e[1] in self.offx:
                # where an as_strided view at an offset computed from the block index starts: that
                # offset's expression (the replay recorder would guard its value)
                self.flush()
                return Sym(func(*args), self.offx[e[1]], self)
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
                    mark = (mark, self._in_place_arg(ptr, dst))
            n0 = len(self.ops)
        n0 = len(self.ops)
        res = super().__torch_function__(func, types, args, kwargs)
        if len(self.ops) > n0 and self.ops[-1][0] is func:
            if mark is not None:
                self.gm_writes[len(self.ops) - 1] = mark
            outs = self.ops[-1][3]
            if type(outs) is int and isinstance(res, torch.Tensor):
                self.meta[outs] = (tuple(res.shape), res.stride(), res.storage_offset(), res.dtype)
                if getattr(func, "__name__", "") == "as_strided":
                    off = args[3] if len(args) > 3 else kwargs.get("storage_offset")
                    if type(off) is Sym and off.rec is self:
                        self.offx[outs] = off.n
        return res


# ---- the template ----------------------------------------------------------------------------------
class _Template:
    """Straight-line Python of one recorded block: ``run(k, blk)`` runs block ``k`` into the Block
    record ``blk`` (footprints, counters) and returns True, or undoes its GM writes and returns
    False when a guard fails."""

    __slots__ = ("fn", "ok", "book", "bookr", "batch", "undo", "unlogged", "src", "why", "factory", "P")

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
        book = [f"B.fp = [{', '.join(fps)}]"]
        fp_reads = sorted({leaf[1] for _buf, box, _kind in blk.fp for x in box if type(x) is Sym and x.rec is rec
                           for leaf in _leaves(x.n) if leaf[1] != 0})
        for a in _COUNTERS:
            book.append(f"B.{a} = {num(getattr(blk, a))}")
        if blk.vk is not None:
            book.append("B.vk = {" + ", ".join(f"{const(kk)}: {num(vv)}" for kk, vv in blk.vk.items()) + "}")
        lines += book
        body = "\n        ".join(lines)
        book_body = "\n        ".join(book)
        ok = " and ".join(f"({c})" for c in pure_conds) or "True"
        unpack = ", ".join(f"c{j}" for j in range(len(P)))
        src = (f"def make(P):\n    {unpack}{',' if len(P) == 1 else ''} = P\n" if P else "def make(P):\n") + \
              f"    def blk(R0, B, U):\n        {body}\n    def ok(R0):\n        return {ok}\n" \
              f"    def book(R0, B):\n        {book_body}\n" \
              f"    def bookr(R0, B, RD):\n        {''.join(f'R{v} = RD[{v}]; ' for v in fp_reads)}{book_body}\n" \
              "    return blk, ok, book, bookr\n"
        factory = _CODE.get(src)
        if factory is None:
            if len(_CODE) > 4096:
                _CODE.clear()
            ns = {"D": _Diverged, "Z": _replay._same_signed, **_SYM_NS}
            exec(compile(src, "<pto block template>", "exec"), ns)  # noqa: S102 - generated
            factory = _CODE[src] = ns["make"]
        self.factory, self.P = factory, tuple(P)
        self.fn, self.ok, self.book, self.bookr = factory(self.P)
        _WHY[0] = None
        self.batch = _Batch.of(rec, ops[len(pure):], writes, len(pure), blk) if _BATCH[0] else None
        self.why = _WHY[0]
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


# ---- batched blocks ---------------------------------------------------------------------------------
_BATCH = [os.environ.get("PTO_BLOCK_BATCH", "1").strip().lower() not in ("0", "", "false", "off", "no")]
_NO_BATCH: set = set()  # task sites whose batched run failed (their templates run block by block)
_UNBATCHED: set = set()  # (task site, blocks) of tasks none of whose blocks ran batched
_VERIFIED: dict = {}  # (op, per-block shapes, dtypes, arguments) -> batched result equals per-block (bool)
_ELEMENTWISE = frozenset((
    "add", "sub", "mul", "div", "true_divide", "maximum", "minimum", "exp", "neg", "abs", "sqrt", "rsqrt",
    "reciprocal", "where", "clamp", "clamp_min", "clamp_max", "pow", "sigmoid", "tanh", "log", "floor", "ceil",
    "trunc", "round", "sign", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not",
    "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "fmod", "remainder", "clone", "contiguous", "to",
    "float", "int", "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
    "__rtruediv__", "__neg__", "__and__", "__or__", "__xor__", "__invert__", "__lt__", "__le__", "__gt__", "__ge__",
    "__eq__", "__ne__", "masked_fill", "nan_to_num", "erf", "exp2", "log2", "square", "silu", "relu", "bfloat16",
    "half", "double", "long", "bool", "short", "char", "byte", "type_as", "detach"))
_REDUCE = frozenset(("sum", "amax", "amin", "mean", "prod", "argmax", "argmin"))
_MATMUL = frozenset(("matmul", "mm", "__matmul__"))
_CREATE = frozenset(("full", "zeros", "ones", "empty", "arange", "tensor", "full_like", "zeros_like"))
_FILL = frozenset(("fill_", "zero_"))


_WHY = [None]  # why the latest template has no batched form (PTO_BLOCKS_DEBUG=1)


def _why(reason: str) -> None:
    if _DEBUG:
        _WHY[0] = reason


class _Abort(Exception):
    """The batched run cannot go on (internal)."""


class _AllDiverged(_Abort):
    """Every block of a batch failed a guard on data (internal): this task's data took another
    path than block 0's, the site may still batch in later tasks."""


class _TS:
    """A sequence argument of tensors: ``items`` of ``(tensor, batched)``."""

    __slots__ = ("items",)

    def __init__(self, items):
        self.items = items


class _PB:
    """A number argument with a value per block of the batch (``vals``)."""

    __slots__ = ("vals",)

    def __init__(self, vals):
        self.vals = vals


_COMPARE = frozenset(("eq", "ne", "lt", "le", "gt", "ge", "__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__"))


class _A:
    """An integer argument affine in the block index: ``a * k + b``."""

    __slots__ = ("a", "b")

    def __init__(self, a, b):
        self.a, self.b = a, b


class _Batch:
    """The operations of a template run once for a run of blocks ``k0 .. k1``, with a leading
    block dimension: loads and stores as ``as_strided`` views of GM with a block stride (offsets
    affine in the block index), elementwise ops broadcast, reductions and matmuls batched (each
    kind and shape checked once against per-block results: kept only when bit-identical).
    Built only for a template that reads no data and whose guards are on the block index alone."""

    __slots__ = ("rec", "ops", "writes", "used", "fp_reads", "_k0", "_nb", "_reads")

    @staticmethod
    def of(rec, ops, writes, shift, blk):
        """The batched form of the template's operations ``ops`` (guards on the index alone
        removed), or None. Values read from data may decide guards (a block whose guard fails
        is undone after the batch and run on its own), feed an argument (at run time: the same
        value in every block of the batch, else the batch gives up) and a footprint (computed
        per block after the batch ran, ``fp_reads``), not a counter."""
        for f, a, kw, outs, gk, g, big in ops:
            if gk == 1 and getattr(f, "__name__", "") == "__bool__" and type(g) is bool:
                continue  # a tensor's truth value checked (a guard per block)
            if gk not in (0, 5, 6, 7, 8):  # a data-dependent shape, a tracked list, a register
                _why(f"op kind {gk} {getattr(f, '__name__', '')}")
                return None
        fp_reads = any(type(x) is Sym and x.rec is rec and not _index_only(x.n) for _buf, box, _k in blk.fp
                       for x in box)
        for a in _COUNTERS:
            v = getattr(blk, a)
            if type(v) is Sym and v.rec is rec and not _index_only(v.n):
                _why(f"counter {a} computed from a value read from data")
                return None
        b = _Batch()
        b.rec, b.ops, b.fp_reads = rec, ops, fp_reads
        used: list = []
        for op in ops:
            for x in op[1]:
                _replay._uses(x, used)
            for x in op[2].values():
                _replay._uses(x, used)
        b.used = set(used)
        b.writes = {i - shift: w for i, w in writes.items()}
        return b

    def run(self, k0: int, nb: int):
        """Run blocks ``k0 .. k0 + nb - 1``; returns ``(failed, undo, reads)``: the positions (0 ..
        nb-1) of the blocks whose guards on data failed (their stores are undone, they must run on
        their own), the saved windows of the batch's stores (``(view, its old values)``, to undo
        them all) and the values read (read number -> its value per block). Raises _Abort (after
        undoing every store) when an operation cannot be batched."""
        rec = self.rec
        consts = rec.consts
        meta = rec.meta
        self._k0, self._nb = k0, nb
        env: dict = {}  # value number -> (tensor, batched)
        undo: list = []
        reads: dict = {}  # read number -> its value in each block
        self._reads = reads
        failed: set = set()
        try:
            for i, (f, a, kw, outs, gk, g, big) in enumerate(self.ops):
                if gk == 6 or gk == 7:  # a guard on values read from data: per block
                    node, v = g
                    for j in range(nb):
                        if j in failed:
                            continue
                        val = evaluate(node, _Reads(reads, j, k0 + j))
                        if gk == 6:
                            if bool(val) != v:
                                failed.add(j)
                        elif type(val) is not type(v) or not _replay._same_signed(val, v):
                            failed.add(j)
                    if len(failed) == nb:
                        raise _AllDiverged("every block took another path")
                    continue
                name = getattr(f, "__name__", "")
                if gk == 5 or gk == 1:  # a read / a truth value: its value in every block
                    t, bt = self._arg(a[0], env, consts, k0)
                    if len(a) != 1 or kw or name not in ("item", "tolist", "__bool__"):
                        raise _Abort(f"read {name} with arguments")
                    if not bt:
                        t = t.expand((nb,) + tuple(t.shape))
                    if gk == 1:
                        if t[0].numel() != 1:
                            raise _Abort("the truth value of a tile")
                        for j, x in enumerate(t.reshape(nb).tolist()):
                            if bool(x) != g:
                                failed.add(j)
                        if len(failed) == nb:
                            raise _AllDiverged("every block took another path")
                        continue
                    reads[outs] = t.reshape(nb).tolist() if name == "item" else t.tolist()
                    continue
                if name == "__get__":
                    name = getattr(getattr(f, "__self__", None), "__name__", name)
                w = self.writes.get(i)
                if gk == 0 and w is None and name != "__setitem__" and not name.endswith("_") and (
                        outs is None or type(outs) is int and outs not in self.used):
                    continue  # a query whose answer the block did not use
                args = [self._arg(x, env, consts, k0) for x in a]
                kwargs = {k: self._arg(v, env, consts, k0) for k, v in kw.items()}
                res, batched = self._call(f, name, args, kwargs, nb, meta, a, env, w, undo)
                if type(outs) is int:
                    if isinstance(res, torch.Tensor):
                        m = meta.get(outs)
                        if m is not None:
                            shape = tuple(res.shape[1:]) if batched else tuple(res.shape)
                            if shape != m[0] or res.dtype != m[3]:
                                raise _Abort(f"{name}: shape {shape} != recorded {m[0]}")
                    env[outs] = (res, batched)
                elif outs:
                    if not batched or not isinstance(res, tuple) or len(res) != len(outs):
                        raise _Abort(f"{name} with several results")
                    for o, r in zip(outs, res):
                        env[o] = (r, True)
        except Exception as e:  # noqa: BLE001 - whatever failed: undo the stores, run block by block
            for dst, saved in reversed(undo):
                dst.copy_(saved)
            raise (_AllDiverged if type(e) is _AllDiverged else _Abort)(str(e)) from None
        if failed:
            for dst, saved in reversed(undo):
                for j in failed:
                    dst[j].copy_(saved[j])
        return sorted(failed), undo, reads

    def _arg(self, x, env, consts, k0):
        t = type(x)
        if t is _replay._V:
            c = consts.get(x.i)
            if c is not None:
                return (c, False)
            e = env.get(x.i)
            if e is None:
                raise _Abort("a value the batch did not compute")
            return e
        if t is _replay._X:
            lf = _lin(x.n)
            if lf is not None and all(leaf == ("R", 0) for leaf in lf[0]):
                a = lf[0].get(("R", 0), 0)
                return _A(a, lf[1]) if a else lf[1]
            # another expression (of the index, of values read): its value in every block of the
            # batch -- one number, affine in the index (ints), or a value per block (_PB)
            reads, nb = self._reads, self._nb
            vals = [evaluate(x.n, _Reads(reads, j, k0 + j)) for j in range(nb)]
            v0 = vals[0]
            tv = type(v0)
            if tv is not int and tv is not float or any(type(v) is not tv for v in vals):
                raise _Abort("an argument of another type than int or float")
            if all(v == v0 for v in vals) and (tv is int or all(_replay._same_signed(v, v0) for v in vals)):
                return v0
            if tv is int and nb > 1:
                step = vals[1] - v0
                if all(v == v0 + step * j for j, v in enumerate(vals)):
                    return _A(step, v0 - step * k0)
            return _PB(vals)
        if t is _replay._Seq:
            items = [self._arg(y, env, consts, k0) for y in x.items]
            if items and all(type(y) is tuple and len(y) == 2 and isinstance(y[0], torch.Tensor) for y in items):
                return _TS(items)
            if any(type(y) is tuple and len(y) == 2 and isinstance(y[0], torch.Tensor) for y in items) or any(
                    type(y) is _A or type(y) is _PB for y in items):
                raise _Abort("a sequence argument holding tensors or index expressions")
            return x.kind(items)
        if t is _replay._Sl:
            items = [self._arg(y, env, consts, k0) for y in (x.start, x.stop, x.step)]
            if any(type(y) is _PB for y in items):
                raise _Abort("a slice bound per block")
            return slice(*items)
        return x

    def _call(self, f, name, args, kwargs, nb, meta, a, env, w, undo):
        """One operation for all blocks: (result, batched)."""
        tens = [(i, x) for i, x in enumerate(args) if type(x) is tuple and len(x) == 2 and isinstance(x[0], torch.Tensor)]
        plain = [x[0] if type(x) is tuple and len(x) == 2 and isinstance(x[0], torch.Tensor) else x for x in args]
        kw = {k: (v[0] if type(v) is tuple and len(v) == 2 and isinstance(v[0], torch.Tensor) else v)
              for k, v in kwargs.items()}
        for k, v in kwargs.items():
            if type(v) is tuple and len(v) == 2 and isinstance(v[0], torch.Tensor) and v[1]:
                raise _Abort(f"{name}: a batched tensor as keyword argument")
        any_b = any(x[1] for _, x in tens)
        has_a = any(type(x) is _A for x in plain) or any(type(v) is _A for v in kw.values())
        if name in ("as_strided", "as_strided_copy"):
            src, bsrc = args[0]
            size, stride, off = plain[1], plain[2], plain[3] if len(plain) > 3 else kw.get("storage_offset", 0)
            if type(size) not in (list, tuple) or type(stride) not in (list, tuple) or type(off) is _PB:
                raise _Abort("as_strided with computed sizes or an offset per block")
            if not bsrc:
                if type(off) is _A:
                    bs, o0 = off.a, off.a * self._k0 + off.b
                else:
                    bs, o0 = 0, off
            else:
                if type(off) is _A:
                    raise _Abort("as_strided of a block tile at an index offset")
                m = meta.get(a[0].i)
                if m is None or tuple(src.stride()[1:]) != m[1]:
                    raise _Abort("as_strided of a block tile with another layout")
                bs, o0 = src.stride(0), src.storage_offset() + (off - m[2])
            view = torch.as_strided(src, (nb,) + tuple(size), (bs,) + tuple(stride), o0)
            return (view.clone() if name == "as_strided_copy" else view), True
        if name in ("narrow_copy", "narrow") and len(plain) == 4 and not kw:
            return self._narrow(f, name, args[0], plain[1:], nb)
        if len(plain) == 2 and not kw and type(plain[1]) in (_A, _PB) and name in _COMPARE and tens and tens[0][0] == 0:
            return self._compare_per_block(f, name, args[0], plain[1], nb)
        if name in ("cat", "stack") and type(plain[0]) is _TS and len(plain) <= 2 and set(kw) <= {"dim"}:
            dim = kw.get("dim", plain[1] if len(plain) > 1 else 0)
            if type(dim) is not int:
                raise _Abort(f"{name} without an int dim")
            items = [t if bt else t.expand((nb,) + tuple(t.shape)) for t, bt in plain[0].items]
            return f(items, dim=dim + 1 if dim >= 0 else dim), True
        if name == "_int_mm" and len(plain) == 2 and not kw and any_b:
            # int8 x int8 -> int32 sums (exact): as one int32 matmul with a block dimension
            res = torch.matmul(plain[0].to(torch.int32), plain[1].to(torch.int32))
            self._verify(f, name, args, kwargs, res, nb)
            return res, True
        if any(type(x) is _TS for x in plain) or any(type(v) is _TS for v in kw.values()):
            raise _Abort(f"{name} of a sequence of tensors")
        if name == "sort" and len(plain) == 1 and set(kw) <= {"dim", "descending", "stable"} and args[0][1]:
            dim = kw.get("dim", -1)
            if type(dim) is not int:
                raise _Abort("sort without an int dim")
            return f(plain[0], **dict(kw, dim=dim + 1 if dim >= 0 else dim)), True
        if name == "gather" and len(plain) == 3 and not kw and type(plain[1]) is int and args[0][1] and args[2][1]:
            d = plain[1]
            return f(plain[0], d + 1 if d >= 0 else d, plain[2]), True
        if name == "expand" and args[0][1] and not kw and all(type(d) is int for d in plain[1:]):
            return f(plain[0], -1, *plain[1:]), True
        if name == "view" and args[0][1] and len(plain) == 2 and isinstance(plain[1], torch.dtype) and not kw:
            if plain[1].itemsize != plain[0].dtype.itemsize:
                raise _Abort("view as a dtype of another size")
            return f(plain[0], plain[1]), True
        if name == "__getitem__" and args[0][1] and len(plain) == 2 and not kw:
            key = plain[1] if type(plain[1]) is tuple else (plain[1],)
            if not all(k is Ellipsis or type(k) is int or type(k) is slice and all(
                    type(b) is int or b is None for b in (k.start, k.stop, k.step)) for k in key):
                raise _Abort("a subscript of a block tile by tensors or None")
            if Ellipsis not in key:
                key = (slice(None),) + key
            return plain[0][key], True
        if name == "as_strided_scatter" and len(plain) in (4, 5) and not kw and any_b:
            # into a tile of each block: the tiles contiguous one after another (block stride = a tile)
            x, bx = args[0]
            src, bs_ = args[1]
            size, stride = plain[2], plain[3]
            off = plain[4] if len(plain) > 4 else 0
            if type(size) not in (list, tuple) or type(stride) not in (list, tuple) or type(off) is not int:
                raise _Abort("as_strided_scatter with computed sizes")
            per = x.shape[1:] if bx else x.shape
            if bx:
                if not x.is_contiguous() or x.storage_offset():
                    raise _Abort("as_strided_scatter into a strided tile")
            else:
                if not x.is_contiguous() or x.storage_offset():
                    raise _Abort("as_strided_scatter into a strided tile")
                x = x.expand((nb,) + tuple(per)).contiguous()
            if not bs_:
                src = src.expand((nb,) + tuple(src.shape))
            numel = 1
            for d in per:
                numel *= d
            return f(x, src, (nb,) + tuple(size), (numel,) + tuple(stride), off), True
        if name == "linear" and len(plain) == 2 and not kw and any_b:
            # x @ w^T: a shared weight takes the leading block dim of x as is; a weight per block
            # as a batched matmul (each checked once against per-block results, bit for bit)
            x, w = plain
            res = f(x, w) if not args[1][1] else torch.matmul(x, w.transpose(-1, -2))
            self._verify(f, name, args, kwargs, res, nb)
            return res, True
        if name in ("any", "all", "aminmax") and len(plain) == 1 and not kw and args[0][1]:
            return f(plain[0].reshape(nb, -1), dim=1), True  # over each block's whole tile (exact)
        if name in ("full_like", "zeros_like", "ones_like") and args[0][1] and len(plain) <= 2 and \
                set(kw) <= {"dtype"}:
            return f(*plain, **kw), True
        if has_a or any(type(x) is _PB for x in plain) or any(type(v) is _PB for v in kw.values()):
            raise _Abort(f"{name} with an index-dependent argument")
        if not any_b and w is None:
            if name in _FILL or name.endswith("_"):
                raise _Abort(f"in-place {name} on a shared tensor")
            return f(*plain, **kw), False  # the same for every block: computed once
        if w is not None or name.endswith("_") and name not in ("__setitem__",):
            dst, bdst = args[0]
            if not bdst:
                raise _Abort(f"in-place {name} into a tensor without a block dimension")
            if name not in ("copy_", "fill_", "zero_", "add_", "mul_"):
                raise _Abort(f"in-place {name}")
            if w is not None:
                if stride_overlap(dst):
                    raise _Abort("stores of the blocks overlap")
                wk, arg = w
                if arg is not None and arg.undo is not None:
                    arg.save_view(dst)
                undo.append((dst, dst.clone()))
            if len(tens) > 1 and not all(x[1] for _, x in tens[1:]) and name == "copy_":
                pass  # a source without a block dimension broadcasts (the same tile into every block)
            return f(*plain, **kw), True
        if name == "__setitem__":
            raise _Abort("subscript store")
        if name in _ELEMENTWISE:
            return f(*plain, **kw), True
        if name in _REDUCE or name in _MATMUL:
            if name in _REDUCE:
                dim = kw.get("dim", plain[1] if len(plain) > 1 else None)
                if type(dim) is not int:
                    raise _Abort(f"{name} without an int dim")
                d = dim + 1 if dim >= 0 else dim
                if "dim" in kw:
                    kw = dict(kw, dim=d)
                else:
                    plain = [plain[0], d] + plain[2:]
                if not args[0][1]:
                    raise _Abort("reduction of a shared tensor")
            elif name == "mm":
                f = torch.matmul
            res = f(*plain, **kw)
            self._verify(f, name, args, kwargs, res, nb)
            return res, True
        if name in ("t", "transpose", "permute", "unsqueeze", "squeeze") and args[0][1] and not kw:
            x = plain[0]
            if name == "t":
                if x.dim() != 3:
                    raise _Abort("t of a tile that is not 2-D")
                return x.transpose(1, 2), True
            dims = [d + 1 if d >= 0 else d for d in plain[1:]] if name != "permute" else None
            if name == "permute":
                order = plain[1] if len(plain) == 2 and isinstance(plain[1], (list, tuple)) else plain[1:]
                if any(d < 0 for d in order):
                    raise _Abort("permute with negative dims")
                return x.permute(0, *[d + 1 for d in order]), True
            return f(x, *dims), True
        if name in ("reshape", "view") and args[0][1] and not kw:
            shape = plain[1] if len(plain) == 2 and isinstance(plain[1], (list, tuple)) else plain[1:]
            if not all(type(d) is int for d in shape):
                raise _Abort(f"{name} to a computed shape")
            return f(plain[0], (nb,) + tuple(shape)), True
        raise _Abort(f"{name} is not batched")

    def _compare_per_block(self, f, name, src, num, nb):
        """``f(tile, number)`` (a comparison) where the number differs per block (``_A`` or
        ``_PB``): the numbers as a ``[nb, 1, ..]`` tensor of the tile's dtype (each must convert
        exactly, else _Abort), checked once per (op, per-block shape, dtype) against per-block
        results bit for bit (never batched again if they differ)."""
        x, bx = src
        vals = [num.a * (self._k0 + j) + num.b for j in range(nb)] if type(num) is _A else num.vals
        rank = x.dim() - 1 if bx else x.dim()
        col = torch.tensor(vals, dtype=x.dtype)
        if col.tolist() != vals:
            raise _Abort(f"{name}: per-block numbers not exact in {x.dtype}")
        res = f(x, col.view((nb,) + (1,) * rank))
        sig = (name, tuple(x.shape[1:] if bx else x.shape), x.dtype, bx, "per-block number")
        ok = _VERIFIED.get(sig)
        if ok is None:
            ok = all(torch.equal(f(x[j] if bx else x, vals[j]), res[j]) for j in range(nb))
            _VERIFIED[sig] = ok
        if not ok:
            raise _Abort(f"batched {name} with per-block numbers differs from per-block results")
        return res, True

    def _narrow(self, f, name, src, dsl, nb):
        """``narrow`` / ``narrow_copy(src, dim, start, length)`` for all blocks: of a block tile
        along its dim (a constant start), or of a shared tensor (GM) at a start affine in the
        block index (a view with a block stride, cloned for narrow_copy). Raises _Abort for
        computed sizes, an index-dependent start into a block tile, or a window out of bounds."""
        x, bx = src
        dim, start, length = dsl
        if type(dim) is not int or type(length) is not int:
            raise _Abort(f"{name} with computed sizes")
        if bx:
            if type(start) is _A:
                raise _Abort(f"{name} of a block tile at an index offset")
            return f(x, dim + 1 if dim >= 0 else dim, start, length), True
        if type(start) is not _A:
            return f(x, dim, start, length), False  # the same for every block
        d = dim if dim >= 0 else dim + x.dim()
        k0 = self._k0
        for k in (k0, k0 + nb - 1):  # affine: the first and the last block bound them all
            o = start.a * k + start.b
            if o < 0 or o + length > x.shape[d]:
                raise _Abort(f"{name} out of bounds")
        size = list(x.shape)
        size[d] = length
        st = x.stride()
        view = torch.as_strided(x, [nb] + size, (start.a * st[d],) + tuple(st),
                                x.storage_offset() + (start.a * k0 + start.b) * st[d])
        return (view.clone() if name == "narrow_copy" else view), True

    def _verify(self, f, name, args, kwargs, res, nb):
        """Once per (operation, per-block shapes, dtypes, other arguments): the batched result must
        equal the per-block results bit for bit, else _Abort (and never batched again)."""
        sig = (name, tuple((tuple(x[0].shape[1:] if x[1] else x[0].shape), x[0].dtype, x[1]) if type(x) is tuple and len(x) == 2
                           and isinstance(x[0], torch.Tensor) else repr(x) for x in args),
               tuple((k, repr(v)) for k, v in kwargs.items()))
        ok = _VERIFIED.get(sig)
        if ok is None:
            ok = True
            for i in range(nb):
                pa = [x[0][i] if type(x) is tuple and len(x) == 2 and isinstance(x[0], torch.Tensor) and x[1]
                      else x[0] if type(x) is tuple and len(x) == 2 and isinstance(x[0], torch.Tensor) else x for x in args]
                pk = {k: (v[0] if type(v) is tuple and len(v) == 2 and isinstance(v[0], torch.Tensor) else v)
                      for k, v in kwargs.items()}
                one = f(*pa, **pk)
                r = res[i]
                if one.shape != r.shape or one.dtype != r.dtype or not torch.equal(
                        one.contiguous().view(torch.uint8) if one.dtype.is_floating_point and one.numel() else one,
                        r.contiguous().view(torch.uint8) if r.dtype.is_floating_point and r.numel() else r):
                    ok = False
                    break
            _VERIFIED[sig] = ok
        if not ok:
            raise _Abort(f"batched {name} differs from per-block results")


class _Reads(dict):
    """The reads of block ``j`` of a batch for :func:`~pto.runtime.symbolic.evaluate`: read 0 is
    the block index, read ``v`` the block's value of read ``v``."""

    def __init__(self, reads, j, k):
        super().__init__()
        self.reads, self.j, self.k = reads, j, k

    def __missing__(self, v):
        return self.k if v == 0 else self.reads[v][self.j]


def _exprs(x) -> list:
    """The expressions inside an argument template."""
    t = type(x)
    if t is _replay._X:
        return [x.n]
    if t is _replay._Seq:
        return [n for y in x.items for n in _exprs(y)]
    if t is _replay._Sl:
        return [n for y in (x.start, x.stop, x.step) for n in _exprs(y)]
    return []


def _holds_expr(x) -> bool:
    return bool(_exprs(x))


def stride_overlap(view: torch.Tensor) -> bool:
    """True when the blocks' windows of the batched GM view ``view`` (leading block dimension)
    may share elements: the block stride is smaller than one window's extent in storage."""
    if view.shape[0] <= 1:
        return False
    span = 1 + sum((n - 1) * abs(st) for n, st in zip(view.shape[1:], view.stride()[1:]) if n > 0)
    return abs(view.stride(0)) < span
