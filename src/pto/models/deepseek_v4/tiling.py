"""Shared tiling helpers of the DeepSeek-V4 kernels: token geometry, capacity, checks.

The kernels are parametric in a :class:`DeepSeekV4Config`; the helpers here turn the
config and the runtime token count ``T`` into the sizes every kernel agrees on
(pypto-lib `models/deepseek/v4-flash/` (INT8 conventions; pypto-lib `models/deepseek/v4-flash/hc_pre.py`)/`qkv_proj_rope.py`):

* ``VEC_T_TILE = 8`` rows: the token tile of the vector tasks (one block per 8 tokens);
* ``MATMUL_M_TILE = 16`` rows: the cube row granule; split-K scratch is sized
  ``t_pad = round_up(T, 16)`` (``t_linear`` in hc_pre, ``t_matmul`` in qkv_proj_rope);
* ``token_capacity(cfg)``: the declared bound of ``t_pad`` (the reference's former
  static ``T_MAX``: the larger of the decode and prefill token counts, rounded up to 16).
"""

from pto.errors import BindError, CapacityError, ConfigError
from pto.models.deepseek_v4.config import DeepSeekV4Config, get_config

__all__ = ["VEC_T_TILE", "MATMUL_M_TILE", "round_up", "token_tile", "token_capacity", "mode_tokens", "need",
           "expect_tensor", "check_seed_capacity", "check_token_capacity"]

VEC_T_TILE = 8  # token rows per vector block (pypto-lib `models/deepseek/v4-flash/hc_pre.py`; pypto-lib `models/deepseek/v4-flash/qkv_proj_rope.py`; pypto-lib `models/deepseek/v4-flash/rmsnorm.py`)
MATMUL_M_TILE = 16  # cube row granule; runtime-sized matmul scratch rounds T up to this


def round_up(n: int, m: int) -> int:
    """Smallest multiple of ``m`` that is ``>= n`` (``n >= 0``, ``m > 0``). An ``n`` that is an
    int already is used as it is (no ``int(n)``: a count read from data during a parametric
    recording stays a symbol instead of being guarded by its exact value, runtime/symbolic.py)."""
    return -(-(n if isinstance(n, int) else int(n)) // m) * m


def token_tile(t: int, max_rows: int) -> int:
    """Token rows of a vector tile for ``t`` tokens: ``max_rows``, but no more than ``t``
    rounded up to ``VEC_T_TILE`` (a decode step of 8 tokens gets 8-row tiles, as in the
    reference; never below ``VEC_T_TILE``)."""
    return max(VEC_T_TILE, min(max_rows, round_up(t, VEC_T_TILE)))


def token_capacity(cfg: DeepSeekV4Config) -> int:
    """Declared capacity (rows) of runtime-sized token scratch: ``round_up(max(decode
    tokens, prefill_seq), MATMUL_M_TILE)`` -- 128 for every preset. A call whose padded
    token count exceeds it raises ``pto.CapacityError`` before any task runs."""
    return round_up(max(cfg.decode_tokens, cfg.prefill_seq), MATMUL_M_TILE)


def check_seed_capacity(kernel: str, tensor: str, t_pad: int, t: int, cap: int) -> None:
    """Check that the static scratch of a ``seed_scopes`` variant (``cap`` rows, see
    :func:`token_capacity`) holds the ``t_pad = round_up(t, MATMUL_M_TILE)`` rows of a call
    with ``t`` tokens; called before any scratch is created or task submitted.

    Raises:
        CapacityError: ``t_pad > cap``, naming the kernel, the scratch tensor ``tensor``,
            ``t_pad``, ``t`` and ``cap``.
    """
    if t_pad > cap:
        raise CapacityError(f"{kernel} (seed_scopes): create_tensor {tensor!r} needs {t_pad} rows "
                            f"(T={t} rounded up to {MATMUL_M_TILE}), above its static capacity {cap}")


def check_token_capacity(kernel: str, cfg: DeepSeekV4Config, T: int) -> int:
    """Check a case's token count against the token scratch capacity before any input is
    built (KernelCase builders call it first, so that an oversized ``T`` costs nothing).

    Returns:
        ``t_pad = round_up(T, MATMUL_M_TILE)``.

    Raises:
        CapacityError: ``t_pad`` above :func:`token_capacity`, naming the kernel, ``T``,
            ``t_pad`` and the capacity.
    """
    t_pad, cap = round_up(T, MATMUL_M_TILE), token_capacity(cfg)
    if t_pad > cap:
        raise CapacityError(f"kernel {kernel}: T={T} tokens (round_up(T, {MATMUL_M_TILE}) = {t_pad} rows of token "
                            f"scratch) exceed the token capacity {cap} of config {cfg.name!r}; T must be <= {cap}")
    return t_pad


def check_num_tokens(kernel: str, num_tokens, t: int) -> int:
    """The active prefix ``num_tokens`` of a ``t``-token chunk, checked (a plain int).

    Raises:
        BindError: ``num_tokens`` outside ``[0, t]``, naming the kernel.
    """
    n = int(num_tokens)
    if not 0 <= n <= t:
        raise BindError(f"{kernel}: num_tokens={n} outside [0, T={t}]")
    return n


def mode_tokens(preset: str, mode: str, T: int | None = None) -> tuple[DeepSeekV4Config, int]:
    """``(cfg, T)`` of a KernelCase build: ``decode`` = ``decode_batch * decode_seq`` tokens
    (flash: 4 x 2 = 8), ``prefill`` = ``prefill_seq`` (128); an explicit ``T`` wins.

    Raises:
        ConfigError: an unknown preset or mode, or ``T < 1``.
    """
    cfg = get_config(preset)
    if mode not in ("decode", "prefill"):
        raise ConfigError(f"unknown mode {mode!r}; modes are 'decode' and 'prefill'")
    if T is None:
        T = cfg.decode_tokens if mode == "decode" else cfg.prefill_seq
    if not isinstance(T, int) or T < 1:
        raise ConfigError(f"token count T must be a positive int, got {T!r}")
    return cfg, T


def need(cond: bool, kernel: str, cfg: DeepSeekV4Config, msg: str) -> None:
    """Raise ``ConfigError`` naming the kernel and the config unless ``cond``."""
    if not cond:
        raise ConfigError(f"{kernel}: config {cfg.name!r} cannot be tiled: {msg}")


def expect_tensor(kernel: str, name: str, t, shape, dtype) -> None:
    """Check a GM tensor argument of an inline kernel against the config-derived shape.

    Raises:
        BindError: naming the kernel, the parameter, and the expected and actual shape
            and dtype.
    """
    if tuple(t.shape) != tuple(shape) or t.dtype != dtype:
        raise BindError(f"kernel {kernel}: parameter {name!r} must be {list(shape)} {dtype}, "
                        f"got {list(t.shape)} {t.dtype}")
