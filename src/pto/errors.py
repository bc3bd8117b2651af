"""Error hierarchy of pto.

Every error raised on bad user input is a subclass of :class:`PtoError`, and its
message names what was wrong and where (kernel, task, block, buffer, source
line) so that a kernel author never has to read a torch traceback from deep
inside a kernel.
"""


# Installed by pto.runtime: called with every PtoError when it is created, so that one made
# inside a running task block is remembered and fails the program even if kernel code catches it.
_created_hook = None


class PtoError(Exception):
    """Base class of every error pto raises on purpose.

    A PtoError raised inside a task block fails the program even when kernel code catches
    it: the task ends with an error of the same class naming the task, the block and where
    it was raised (see ``pto.runtime.Program``).
    """

    def __init__(self, *args):
        super().__init__(*args)
        if _created_hook is not None:
            _created_hook(self)


class BindError(PtoError):
    """An argument does not match its annotation (rank, static dim, dynamic dim,
    dtype, direction), or an ``init_value`` cannot be represented in the dtype."""


class CapacityError(PtoError):
    """A runtime-sized tensor or a runtime count exceeds its declared ``capacity``."""


class HeapExhaustedError(PtoError):
    """The ring heap cannot satisfy an allocation; names the request and the
    high-water mark."""


class ConfigError(PtoError):
    """A model config or run config a kernel cannot honour (e.g. cannot be tiled)."""


class DslError(PtoError):
    """A DSL construct was used wrongly: shape or dtype mismatch between tiles,
    an out-of-bounds slice, a tile op outside a task, ..."""


class UndefinedValueError(PtoError):
    """Check mode: an undefined scalar was used as an index, loop bound or branch."""


class UndefinedOutputError(PtoError):
    """Check mode: an element of an Out/InOut argument that the program wrote is
    undefined at the end of the program."""


class RaceError(PtoError):
    """Check mode: two blocks whose footprints overlap with a write are not
    ordered by the task graph."""


class DistributedError(PtoError):
    """A multi-rank run failed: a wait not satisfied within the timeout, a peer rank that died,
    or a launch that could not start; names the rank, the window and the counter."""


class GoldenDataError(PtoError):
    """Saved golden data is missing, malformed or does not match the specs."""


class GoldenError(PtoError):
    """The golden (reference) function of a ``run_jit`` call raised an exception that is
    not itself a PtoError; names the golden, the original exception is the ``__cause__``."""


class CheckpointError(PtoError):
    """A model checkpoint directory is malformed: a missing, extra or misshapen tensor, an
    unreadable file or index, or a tensor in a format the loader cannot convert; names the
    tensor (or file) and what was expected."""


class GraphOnlyError(PtoError):
    """Graph-only mode (``RunConfig(execute=False)``): a value computed from shape-only data
    (float weights or activations, which that mode does not compute) was used as an index,
    bound, branch condition or Python number; names the kernel, where it was read and where it
    was used (docs/graph_only.md)."""
