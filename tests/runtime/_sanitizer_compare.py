"""One check-mode run with its Sanitizer captured, for the tests that compare a sanitizer fast
path with it switched off (test_sanitizer_clean.py, test_sanitizer_deferred.py)."""

from pto.errors import PtoError
from pto.runtime import RunConfig
from pto.runtime import sanitizer as _san

CHECK = RunConfig(check=True)


def run_checked(kernel, make_args, tweak=None, catch=PtoError):
    """Run ``kernel(*make_args())`` in check mode; ``tweak(sanitizer)``, when given, runs right
    after the run's Sanitizer is built. Returns ``(error type or None, message, clones of the
    arguments after the run, the Sanitizer)``; an error that is not a ``catch`` propagates."""
    seen = {}
    orig = _san.Sanitizer.__init__

    def init(self, program):
        orig(self, program)
        if tweak is not None:
            tweak(self)
        seen["san"] = self

    _san.Sanitizer.__init__ = init
    args = make_args()
    try:
        kernel.run(*args, config=CHECK)
        err, msg = None, ""
    except catch as e:
        err, msg = type(e), str(e)
    finally:
        _san.Sanitizer.__init__ = orig
    return err, msg, [a.clone() for a in args], seen["san"]
