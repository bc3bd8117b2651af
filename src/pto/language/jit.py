"""``@pl.jit`` (program entry) and ``@pl.jit.inline`` (composable body), and argument binding.

Calling a ``@pl.jit`` function with torch tensors runs one ``Program``
(docs/dsl.md): arguments are bound to their annotations, orchestration
runs as plain Python, tasks execute eagerly. ``fn.run(*args, config=...)``
returns the Program (statistics, task graph); a plain call returns what the
function returns, with GM tensors mapped back to the caller's torch tensors.

A ``@pl.jit.inline`` function called inside a running program is spliced in
(its annotations are checked against the GM tensors it receives); called
outside a program it runs as its own entry program; ``pl.jit.entry(body, name=...)``
makes a named ``@pl.jit`` entry out of such a body.
"""

from __future__ import annotations

import functools
import inspect
import math

import torch

from pto.errors import BindError, DslError
from pto.language import _ctx
from pto.language.dtypes import from_torch, no_pto_dtype
from pto.language.typing import IN, DynVar, ScalarType, ScalarValue, Tensor, TensorType

__all__ = ["jit", "JitFunction", "bind_arguments", "Param"]


class Param:
    """One bound parameter: name, annotation (TensorType / ScalarType / None), value."""

    __slots__ = ("name", "ann", "value")

    def __init__(self, name, ann, value):
        self.name = name
        self.ann = ann
        self.value = value

    @property
    def direction(self) -> str:
        """``in``, ``out`` or ``inout`` (scalars and unannotated parameters are ``in``)."""
        return self.ann.direction if isinstance(self.ann, TensorType) else IN


class JitFunction:
    """A kernel entry or inline body; see the module docstring."""

    def __init__(self, fn, inline: bool = False, auto_scope: bool = True):
        self.fn = fn
        self.inline = inline
        self.__name__ = fn.__name__
        self.__qualname__ = getattr(fn, "__qualname__", fn.__name__)
        self.__doc__ = fn.__doc__
        self.__module__ = fn.__module__
        self.__wrapped__ = fn
        self._sig = None
        self._anns = None
        self._positional = None  # [(name, default)] when every parameter is plain positional-or-keyword
        self._spec = None  # the fast binding plan of entry calls (_bind_spec; False: none)
        # the tensor shapes of the latest entry call that bound by the fast path, per parameter
        # (None for a non-tensor): a call with the same shapes needs no dims check (_bind_fast)
        self._seen = [None]
        # the same for calls inside a program (GM tensor arguments): _bind_gm_fast's plan and shapes
        self._gspec = None
        self._gseen = [None]

    def signature(self):
        """(inspect.Signature, {name: annotation}) with annotations evaluated.

        Raises:
            DslError: an annotation string that cannot be evaluated (use eager
                annotations in kernel modules, no ``from __future__ import annotations``).
        """
        if self._sig is None:
            try:
                anns = inspect.get_annotations(self.fn, eval_str=True)
            except Exception as e:  # noqa: BLE001 - user annotation code
                raise DslError(f"kernel {self.__name__}: cannot evaluate its annotations ({e}); "
                               "kernel modules must not use postponed annotations") from None
            self._sig = inspect.signature(self.fn)
            params = self._sig.parameters.values()
            if all(q.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for q in params):
                self._positional = [(q.name, q.default) for q in params]
            # a bare ``pl.Tensor`` is a GM tensor of any shape and dtype
            self._anns = {k: (TensorType(None, None) if v is Tensor else v) for k, v in anns.items()}
        return self._sig, self._anns

    def __call__(self, *args, **kwargs):
        if _ctx.state.program is not None:
            if not kwargs:
                values = _bind_gm_fast(self, args)
                if values is not None:
                    return self.fn(*values)
            params = bind_arguments(self, args, kwargs, gm=True)
            return self.fn(*[p.value for p in params])
        return self.run(*args, **kwargs).result

    def run(self, *args, config=None, **kwargs):
        """Run as an entry program and return the ``pto.runtime.Program``. The program runs with
        autograd off: an In tensor that requires grad does not pull the Out/InOut tensors the
        program writes into its autograd graph."""
        factory = _ctx.state.program_factory
        if factory is None:
            raise DslError("no runtime installed; import pto")
        if _ctx.state.program is not None:
            raise DslError(f"{self.__name__}.run() called inside a running program")
        if not torch.is_grad_enabled():
            return factory(self, args, kwargs, config)
        # the C switch, not ``with torch.no_grad()``: its exit allocates Python objects after the
        # run has turned the GC back on, which would start a collection inside the call
        # (Program.execute resumes the GC as its very last step; see program._gc_resume)
        _set_grad_enabled(False)
        try:
            return factory(self, args, kwargs, config)
        finally:
            _set_grad_enabled(True)

    def __repr__(self) -> str:
        return f"<pl.jit{'.inline' if self.inline else ''} {self.__qualname__}>"


_set_grad_enabled = torch._C._set_grad_enabled  # autograd on/off without a Python object


def _dtype_name(tdtype) -> str:
    """``pl.BF16`` for a torch dtype that stores a DSL dtype, else the torch name (``torch.float64``)."""
    try:
        dt = from_torch(tdtype)
    except DslError:
        return str(tdtype)
    return repr(dt) if dt.torch == tdtype else str(tdtype)


def _check_tensor(kernel: str, name: str, ann: TensorType, shape, dtype, dyn: dict) -> None:
    if ann.dtype is None:
        try:
            from_torch(dtype)
        except DslError:
            raise BindError(f"kernel {kernel}: parameter {name!r}: {no_pto_dtype(dtype)}") from None
    elif dtype != ann.dtype.torch:
        raise BindError(f"kernel {kernel}: parameter {name!r}: dtype {_dtype_name(dtype)} does not match "
                        f"annotation {ann.dtype}")
    if ann.dims is None:
        return
    if len(shape) != len(ann.dims):
        raise BindError(f"kernel {kernel}: parameter {name!r}: rank {len(shape)} (shape {list(shape)}) does not "
                        f"match annotation rank {len(ann.dims)} {ann}")
    for d, (want, got) in enumerate(zip(ann.dims, shape)):
        if isinstance(want, DynVar):
            seen = dyn.get(want.name)  # by name: two pl.dynamic("N") annotations tie
            if seen is None:
                dyn[want.name] = (got, name, d)
            elif seen[0] != got:
                raise BindError(f"kernel {kernel}: parameter {name!r}: dynamic dim {want.name} (dim {d}) is {got}, "
                                f"but parameter {seen[1]!r} bound it to {seen[0]} (dim {seen[2]})")
        elif want != got:
            raise BindError(f"kernel {kernel}: parameter {name!r}: dim {d} is {got}, annotation requires {want}")


def bind_arguments(jf: JitFunction, args, kwargs, gm: bool) -> list[Param]:
    """Match call arguments to the kernel's annotations.

    Args:
        gm: True when the arguments are GM tensors (inline call inside a
            program), False for torch tensors at a program entry.

    Returns:
        list[Param] in signature order (defaults applied).

    Raises:
        BindError: a missing or extra argument, a tensor whose rank, static
            dim, dynamic dim or dtype does not match, a non-tensor for a
            tensor parameter, a tensor not on the CPU, an Out/InOut tensor that
            requires grad or is an inference tensor outside inference mode, or a
            bad scalar — naming the parameter.
    """
    sig, anns = jf.signature()
    if not gm and not kwargs:
        spec = jf._spec
        if spec is None:
            spec = jf._spec = _bind_spec(jf, anns)
        if spec and len(args) == len(spec):
            out = _bind_fast(spec, args, jf._seen)
            if out is not None:
                return out
    plain = jf._positional
    if (plain is not None and not kwargs and len(args) <= len(plain)
            and all(d is not inspect.Parameter.empty for _, d in plain[len(args):])):
        # positional arguments only: what sig.bind + apply_defaults gives, without their cost
        items = [(name, value) for (name, _), value in zip(plain, args)] + plain[len(args):]
    else:
        try:
            ba = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise BindError(f"kernel {jf.__name__}: {e}") from None
        ba.apply_defaults()
        items = ba.arguments.items()
    dyn: dict = {}
    out = []
    for name, value in items:
        ann = anns.get(name)
        if isinstance(ann, TensorType):
            if gm:
                data = getattr(value, "data", None)
                if not isinstance(data, torch.Tensor) or not hasattr(value, "buf"):
                    raise BindError(f"kernel {jf.__name__}: parameter {name!r} expects a GM tensor, "
                                    f"got {type(value).__name__}")
            else:
                if not isinstance(value, torch.Tensor):
                    raise BindError(f"kernel {jf.__name__}: parameter {name!r} expects a torch tensor, "
                                    f"got {type(value).__name__}")
                if not (value.is_cpu or value.is_meta):  # meta: graph-only mode
                    raise BindError(f"kernel {jf.__name__}: parameter {name!r} is on device {value.device}; "
                                    "the CPU runtime needs CPU tensors (.cpu())")
                if value.requires_grad and ann.direction != IN:
                    raise BindError(f"kernel {jf.__name__}: parameter {name!r} ({ann}) requires grad; the program "
                                    "writes its results into it in place, which autograd forbids for such a "
                                    "tensor: pass a tensor without requires_grad (e.g. .detach())")
                if ann.direction != IN and value.is_inference() and not torch.is_inference_mode_enabled():
                    raise BindError(f"kernel {jf.__name__}: parameter {name!r} ({ann}) is an inference tensor "
                                    "(made under torch.inference_mode()) and the call is outside inference mode; "
                                    "the program writes its results into it in place, which torch forbids there: "
                                    "call the kernel under torch.inference_mode() or pass a normal tensor (.clone() "
                                    "outside inference mode)")
                data = value
            _check_tensor(jf.__name__, name, ann, tuple(data.shape), data.dtype, dyn)
        elif isinstance(ann, ScalarType):
            value = _bind_scalar(jf.__name__, name, ann, value)
        out.append(Param(name, ann, value))
    return out


def _bind_spec(jf: JitFunction, anns: dict):
    """The fast binding plan of ``jf``'s entry calls with every argument given positionally:
    per parameter ``(name, annotation, kind, torch dtype, dims, written)``, kind 0 for a tensor
    with a dtype, 1 for a scalar, 2 for a pass-through; False when a parameter is not plain
    positional-or-keyword or is a bare ``pl.Tensor`` (those bind by the general path)."""
    if jf._positional is None:
        return False
    spec = []
    for name, _ in jf._positional:
        ann = anns.get(name)
        if isinstance(ann, TensorType):
            if ann.dtype is None:
                return False
            spec.append((name, ann, 0, ann.dtype.torch, ann.dims, ann.direction != IN))
        elif isinstance(ann, ScalarType):
            spec.append((name, ann, 1, None, None, False))
        else:
            spec.append((name, ann, 2, None, None, False))
    return spec


def _bind_fast(spec: list, args, seen: list) -> list | None:
    """:func:`bind_arguments` of an entry call whose arguments are all given positionally, when
    every one of them binds (plain CPU tensors of the annotated dtype and dims, valid scalars):
    the same Params. None when anything is off: the general path then binds or raises.

    ``seen``: a one-element list holding the tensor shapes (``torch.Size``, None for other
    parameters) of the latest call that bound here, or None: when every tensor has the shape it
    had then, its dims are not checked again (they passed for those shapes, and whether the
    ``pl.dynamic`` dims agree depends on the shapes only); otherwise they are, and on success
    ``seen[0]`` becomes this call's shapes."""
    last = seen[0]
    if last is not None:
        out = []
        for (name, ann, kind, tdtype, dims, written), value, shape in zip(spec, args, last):
            if kind == 0:
                if not _fast_tensor(value, tdtype, written):
                    return None
                if value.shape != shape:
                    break  # another shape: the full check below
            elif kind == 1:
                value = _fast_scalar(name, ann, value)
                if value is _NO:
                    return None
            out.append(Param(name, ann, value))
        else:
            return out
    out = []
    dyn = None
    shapes = []
    for (name, ann, kind, tdtype, dims, written), value in zip(spec, args):
        shapes.append(None)
        if kind == 0:
            if not _fast_tensor(value, tdtype, written):
                return None
            shape = shapes[-1] = value.shape
            if dims is not None:
                if len(shape) != len(dims):
                    return None
                for want, got in zip(dims, shape):
                    if type(want) is int:
                        if want != got:
                            return None
                    else:  # a pl.dynamic dim: the same extent wherever it appears
                        if dyn is None:
                            dyn = {}
                        prev = dyn.setdefault(want.name, got)
                        if prev != got:
                            return None
        elif kind == 1:
            value = _fast_scalar(name, ann, value)
            if value is _NO:
                return None
        out.append(Param(name, ann, value))
    seen[0] = shapes
    return out


_NO = object()  # _fast_scalar: the value does not bind
_GM = []  # [GMTensor], imported on first use (tensor_ops is imported after this module)


def _bind_gm_fast(jf: JitFunction, args) -> list | None:
    """The argument values of a call of ``jf`` inside a program with every argument given
    positionally (the missing trailing ones taking their defaults), when each binds (GM tensors of
    the annotated dtype and dims, valid scalars): ``[p.value for p in bind_arguments(jf, args, {},
    gm=True)]`` without the Params. None when anything is off (a bare ``pl.Tensor`` parameter,
    another type, a mismatch): the general path then binds or raises its error.

    As for entry calls (:func:`_bind_fast`), a call whose GM tensors all have the shapes of the
    latest call that bound here has its dims checked already; ``jf._gseen[0]`` holds those."""
    spec = jf._gspec
    if spec is None:
        jf.signature()
        spec = jf._gspec = _bind_spec(jf, jf._anns)
    if not spec:
        return None
    if len(args) != len(spec):
        plain = jf._positional
        if len(args) > len(spec) or any(d is inspect.Parameter.empty for _, d in plain[len(args):]):
            return None
        args = (*args, *[d for _, d in plain[len(args):]])  # the defaults, as the general path applies them
    if not _GM:
        from pto.language.tensor_ops import GMTensor
        _GM.append(GMTensor)
    gm = _GM[0]
    last = jf._gseen[0]
    values = list(args)
    if last is not None:
        for i, ((name, ann, kind, tdtype, dims, _w), value, shape) in enumerate(zip(spec, args, last)):
            if kind == 0:
                if type(value) is not gm or value.data.dtype != tdtype:
                    return None
                if value._shape != shape:
                    break  # another shape: the full check below
            elif kind == 1:
                v = _fast_scalar(name, ann, value)
                if v is _NO:
                    return None
                values[i] = v
        else:
            return values
    dyn = None
    shapes = []
    for i, ((name, ann, kind, tdtype, dims, _w), value) in enumerate(zip(spec, args)):
        shapes.append(None)
        if kind == 0:
            if type(value) is not gm or value.data.dtype != tdtype:
                return None
            shape = shapes[-1] = value._shape
            if dims is not None:
                if len(shape) != len(dims):
                    return None
                for want, got in zip(dims, shape):
                    if isinstance(want, DynVar):  # the same extent wherever it appears
                        if dyn is None:
                            dyn = {}
                        if dyn.setdefault(want.name, got) != got:
                            return None
                    elif want != got:
                        return None
        elif kind == 1:
            v = _fast_scalar(name, ann, value)
            if v is _NO:
                return None
            values[i] = v
    jf._gseen[0] = shapes
    return values


def _fast_tensor(value, tdtype, written: bool) -> bool:
    """True when ``value`` is a plain CPU tensor of dtype ``tdtype`` that may be bound (an
    Out/InOut parameter, ``written``, takes no tensor requiring grad, and an inference tensor
    only under inference mode)."""
    return (type(value) is torch.Tensor and value.is_cpu and value.dtype == tdtype
            and not (written and (value.requires_grad or value.is_inference() and not torch.is_inference_mode_enabled())))


def _fast_scalar(name: str, ann, value):
    """``value`` bound to scalar parameter ``name`` (an in-range int as it is), or ``_NO`` when it
    does not bind (the general path then raises its error)."""
    if type(value) is int and ann.dtype.is_int and ann.dtype.min <= value <= ann.dtype.max:
        return value
    try:
        return _bind_scalar("", name, ann, value)
    except BindError:
        return _NO


def _bind_scalar(kernel: str, name: str, ann: ScalarType, value):
    if isinstance(value, ScalarValue):
        return value
    if isinstance(value, torch.Tensor):
        if value.dim() != 0:
            raise BindError(f"kernel {kernel}: scalar parameter {name!r} got a tensor of shape {list(value.shape)}")
        value = value.item()
    dt = ann.dtype
    if dt.is_int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise BindError(f"kernel {kernel}: scalar parameter {name!r} ({dt}) expects an int, got {value!r}")
        if not dt.min <= value <= dt.max:
            raise BindError(f"kernel {kernel}: scalar parameter {name!r} value {value} out of range of {dt}")
    elif dt.is_float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise BindError(f"kernel {kernel}: scalar parameter {name!r} ({dt}) expects a number, got {value!r}")
        value = float(value)
        top = torch.finfo(dt.torch).max
        if math.isfinite(value) and abs(value) > top:  # a finite number past the dtype (inf and nan bind)
            raise BindError(f"kernel {kernel}: scalar parameter {name!r} value {value} out of range of {dt} "
                            f"(largest finite {top:.6g})")
    else:
        if not isinstance(value, bool):
            raise BindError(f"kernel {kernel}: scalar parameter {name!r} ({dt}) expects a bool, got {value!r}")
    return value


class _Jit:
    """``@pl.jit`` / ``@pl.jit(auto_scope=False)`` / ``@pl.jit.inline`` / ``pl.jit.entry(body)``."""

    def __call__(self, fn=None, **opts):
        if fn is None:
            return functools.partial(self.__call__, **opts)
        return JitFunction(fn, inline=False, **opts)

    def inline(self, fn=None, **opts):
        """``@pl.jit.inline``: a body spliced into the calling program (an entry program when called outside one)."""
        if fn is None:
            return functools.partial(self.inline, **opts)
        return JitFunction(fn, inline=True, **opts)

    incore = inline

    def host(self, fn=None, **opts):
        """``@pl.jit.host``: the host-level entry; on one device plain Python calling ``@pl.jit``
        programs (see ``compat_ops.HostFunction``)."""
        from pto.language.compat_ops import HostFunction
        if fn is None:
            return functools.partial(self.host, **opts)
        return HostFunction(fn)

    def entry(self, body: JitFunction, name: str | None = None) -> JitFunction:
        """A ``@pl.jit`` program entry whose body is the ``@pl.jit.inline`` function ``body``.

        The entry has ``body``'s parameters and annotations and returns what ``body``
        returns; it stands for a ``@pl.jit`` function that only forwards all its arguments
        to ``body`` (same tasks, graph and results, without the second argument binding).

        Args:
            body: a ``@pl.jit.inline`` JitFunction.
            name: the entry's (and so the program's) name, used in error messages and
                traces; ``body``'s name when omitted.

        Returns:
            A new non-inline JitFunction.

        Raises:
            DslError: ``body`` is not a ``@pl.jit.inline`` function.
        """
        if not isinstance(body, JitFunction) or not body.inline:
            raise DslError(f"pl.jit.entry expects a @pl.jit.inline function, got {body!r}")
        jf = JitFunction(body.fn, inline=False)
        if name is not None:
            jf.__name__ = name
            jf.__qualname__ = f"{jf.__qualname__.rpartition('.')[0]}.{name}".lstrip(".")
        return jf


jit = _Jit()
