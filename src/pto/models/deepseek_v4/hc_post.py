"""Hyper-connection post-mix (mHC ``hc_post``): write the sublayer output back into the streams.

Math (pypto-lib `models/deepseek/v4-flash/hc_post.py`; transformers `models/deepseek_v4/modeling_deepseek_v4.py`), FP32, ``N = hc_mult``:

    y[:, j, :] = post[:, j] * x + sum_i comb[:, i*N + j] * residual[:, i, :]

Output stream ``j`` uses column ``j`` of the ``N x N`` comb matrix (``i`` = input stream);
in matrix form ``Y = post (x) x + C^T R``. The prefill variant computes only the first
``num_tokens`` rows and writes exact zeros into the static tail.
"""

import functools
from types import SimpleNamespace

import torch

import pto.language as pl
from pto.errors import BindError, ConfigError
from pto.golden import CaseRun, KernelCase, ScalarSpec, TensorSpec, ratio_allclose, register
from pto.models.deepseek_v4.config import DeepSeekV4Config, get_config

__all__ = ["TOLERANCES", "HC_POST_TOKEN_TILE", "HC_POST_PAD_TILE", "hc_post_kernels", "hc_post", "hc_post_prefill",
           "golden_hc_post",
           "golden_hc_post_prefill", "make_hc_post_inputs", "build_case"]

# Compare functions per output as ratio_allclose (atol, rtol, max_error_ratio). The
# reference uses the default allclose with rtol = atol = 1e-3 (pypto-lib `models/deepseek/v4-flash/hc_post.py`; the pypto-lib tests' tolerances),
# i.e. no element may be out of tolerance: max_error_ratio 0.
TOLERANCES: dict[str, tuple[float, float, float]] = {
    "y": (1e-3, 1e-3, 0.0),
}

# ---- kernel ----
# Tokens per hc_post block. deviation: the reference's block is (4-token tile, output stream j)
# (pypto-lib `models/deepseek/v4-flash/hc_post.py`); here one block is a 16-token tile and all
# hc_mult output streams, so each residual stream is loaded once, not hc_mult times, and the
# tile's [rows, hc_mult, D] rows are one store (the values are elementwise: any tiling is exact).
HC_POST_TOKEN_TILE = 16
# Rows per block of the prefill tail zero-fill ("hc_post_inactive_pad", pypto-lib `hc_post.py`).
HC_POST_PAD_TILE = 16
# Elements (rows * hc_mult * hidden) up to which a block computes all output streams in one
# pass over hc_mult-fold repeated tiles (few tile ops; per-op overhead dominates small tiles).
HC_POST_VEC_ELEMS = 32768

T_DYN = pl.dynamic("T")


def _gm_views(residual, post, comb, y, N: int, D: int) -> SimpleNamespace:
    """The GM views :func:`_hc_post_block` loads from and stores into (made once per call, in
    the orchestration): ``res2 [T, N*D]`` and ``y2 [T, N*D]`` (stream ``j`` of token ``t`` is
    columns ``j*D .. (j+1)*D`` of row ``t``), ``res_rows [T*N, D]`` (row ``t*N + i``: input
    stream ``i`` of token ``t``), ``post [T, N]`` and ``post_col [T*N, 1]``, ``comb [T, N*N]``
    and ``comb_col [T*N*N, 1]``."""
    t = pl.tensor.dim(residual, 0)
    return SimpleNamespace(res2=pl.reshape(residual, [t, N * D]), y2=pl.reshape(y, [t, N * D]),
                           res_rows=pl.reshape(residual, [t * N, D]), post=post,
                           post_col=pl.reshape(post, [t * N, 1]), comb=comb,
                           comb_col=pl.reshape(comb, [t * N * N, 1]))


def _hc_post_block(x2, g: SimpleNamespace, t0: int, rows: int, N: int, D: int) -> None:
    """One hc_post block body: rows ``t0 .. t0+rows`` of every output stream, all FP32.

    ``x2 [T, D]`` BF16, ``g`` the residual, post, comb and output views of :func:`_gm_views`.
    Op order is the golden's: ``post*x`` first, then the
    input streams ``i = 0..N-1`` added in order (bit-identical to :func:`golden_hc_post`).

    Small tiles (at most :data:`HC_POST_VEC_ELEMS` elements per stream set, e.g. a tiny
    decode step): all output streams at once. ``post*x`` is one row-broadcast multiply on a
    ``[rows*N, D]`` tile whose row ``t*N + j`` is (token ``t``, output stream ``j``) (``x``
    repeated ``N`` times along the columns, ``post`` loaded as a ``[rows*N, 1]`` column of its
    ``[T*N, 1]`` view); every product ``comb[t, i*N + j] * residual[t, i]`` is one
    row-broadcast multiply on a ``[rows*N*N, D]`` tile whose row ``(t*N + i)*N + j`` is input
    stream ``i`` of token ``t`` (the ``[rows*N, D]`` stream rows, loaded from the residual's
    ``[T*N, D]`` view, repeated ``N`` times along the columns), scaled by the ``[rows*N*N, 1]``
    column of comb's ``[T*N*N, 1]`` view; then the ``N`` adds, input stream ``i`` being the
    ``[rows, N*D]`` sub-tile ``(t, i, all j)`` of the products (3 + N tile ops of math instead
    of N*(2N+1)). Larger tiles go stream by stream, where the N-fold copies would cost more
    than the ops save. Both are
    elementwise with the same ops in the same order per element: bit-identical.
    """
    xf = pl.cast(pl.slice(x2, [rows, D], [t0, 0]), pl.FP32)
    if rows * N * D > HC_POST_VEC_ELEMS:  # large tiles: stream by stream (no N-fold copies)
        post_t = pl.slice(g.post, [rows, N], [t0, 0])
        comb_t = pl.slice(g.comb, [rows, N * N], [t0, 0])
        res_t = pl.slice(g.res2, [rows, N * D], [t0, 0])
        # sub-tiles by pl.slice (one copying call each) rather than tile subscripts
        res = [pl.slice(res_t, [rows, D], [0, i * D]) for i in range(N)]
        streams = []
        for j in range(N):
            acc = pl.row_expand_mul(xf, pl.slice(post_t, [rows, 1], [0, j]))
            for i in range(N):
                acc = pl.add(acc, pl.row_expand_mul(res[i], pl.slice(comb_t, [rows, 1], [0, i * N + j])))
            streams.append(acc)
        pl.assemble(g.y2, pl.concat(streams), [t0, 0])
        return
    # the [T*N, D] / [T*N, 1] / [T*N*N, 1] GM views give the tiles in the shapes the math takes
    # (a reshape of a loaded tile may copy it)
    acc = pl.row_expand_mul(pl.reshape(pl.concat([xf] * N), [rows * N, D]),
                            pl.slice(g.post_col, [rows * N, 1], [t0 * N, 0]))
    acc = pl.reshape(acc, [rows, N * D])
    res_rep = pl.reshape(pl.concat([pl.slice(g.res_rows, [rows * N, D], [t0 * N, 0])] * N), [rows * N * N, D])
    prod = pl.row_expand_mul(res_rep, pl.slice(g.comb_col, [rows * N * N, 1], [t0 * N * N, 0]))
    prod = pl.reshape(prod, [rows, N * N * D])
    for i in range(N):
        acc = pl.add(acc, prod[:, i * N * D:(i + 1) * N * D])
    pl.assemble(g.y2, acc, [t0, 0])


@functools.lru_cache(maxsize=None)
def hc_post_kernels(cfg: DeepSeekV4Config) -> SimpleNamespace:
    """Build the hc_post DSL kernels for ``cfg`` (cached per config).

    Tiling: ``spmd(ceil(T / HC_POST_TOKEN_TILE))`` blocks, block ``b`` = token tile ``b`` and
    all ``hc_mult`` output streams, whole ``hidden_size`` rows (the reference's blocks are
    (4-token tile, stream), pypto-lib `models/deepseek/v4-flash/hc_post.py`; see
    :data:`HC_POST_TOKEN_TILE`); the prefill tail is zeroed by ``spmd(ceil(inactive/16))``
    blocks of :data:`HC_POST_PAD_TILE` rows. ``T`` is a dynamic dim; a ragged last tile has
    fewer rows.

    Returns:
        namespace with the inline bodies ``hc_post(x, residual, post, comb, y)`` and
        ``hc_post_prefill(x, residual, post, comb, y, num_tokens)`` and the ``@pl.jit``
        entries ``hc_post_test`` / ``hc_post_prefill_test`` (``pl.jit.entry`` of each body,
        same parameters). Shapes:
        ``x [T, D] BF16``, ``residual [T, N, D] FP32``, ``post [T, N] FP32``,
        ``comb [T, N*N] FP32``, ``y [T, N, D] FP32`` (Out), ``num_tokens`` INT32 scalar,
        with ``N = hc_mult``, ``D = hidden_size``.

    Raises:
        ConfigError: ``hc_mult`` or ``hidden_size`` not positive.
    """
    N, D = cfg.hc_mult, cfg.hidden_size
    if N <= 0 or D <= 0:
        raise ConfigError(f"hc_post_kernels: config {cfg.name!r} needs hc_mult > 0 and hidden_size > 0, "
                          f"got hc_mult={N}, hidden_size={D}")
    TT, PT = HC_POST_TOKEN_TILE, HC_POST_PAD_TILE


    @pl.jit.inline
    def hc_post(x: pl.Tensor[[T_DYN, D], pl.BF16],
                residual: pl.Tensor[[T_DYN, N, D], pl.FP32],
                post: pl.Tensor[[T_DYN, N], pl.FP32],
                comb: pl.Tensor[[T_DYN, N * N], pl.FP32],
                y: pl.Out[pl.Tensor[[T_DYN, N, D], pl.FP32]]):
        """hc_post over every row: ``y[:, j] = post[:, j]*x + sum_i comb[:, i*N+j]*residual[:, i]``."""
        t = pl.tensor.dim(x, 0)
        g = _gm_views(residual, post, comb, y, N, D)
        for b in pl.spmd(-(-t // TT), name_hint="hc_post"):
            t0 = b * TT
            _hc_post_block(x, g, t0, min(TT, t - t0), N, D)
        return y

    @pl.jit.inline
    def hc_post_prefill(x: pl.Tensor[[T_DYN, D], pl.BF16],
                        residual: pl.Tensor[[T_DYN, N, D], pl.FP32],
                        post: pl.Tensor[[T_DYN, N], pl.FP32],
                        comb: pl.Tensor[[T_DYN, N * N], pl.FP32],
                        y: pl.Out[pl.Tensor[[T_DYN, N, D], pl.FP32]],
                        num_tokens: pl.Scalar[pl.INT32]):
        """hc_post on rows ``< num_tokens`` (clamped into ``[0, T]``); rows past it are zero."""
        t = pl.tensor.dim(x, 0)
        g = _gm_views(residual, post, comb, y, N, D)
        active = pl.min(pl.max(num_tokens, 0), t)
        if active > 0:  # orchestration-level conditional submission (pypto-lib `hc_post.py`)
            for b in pl.spmd(-(-active // TT), name_hint="hc_post_prefill"):
                t0 = b * TT
                _hc_post_block(x, g, t0, min(TT, active - t0), N, D)
        inactive = t - active
        if inactive > 0:
            for b in pl.spmd(-(-inactive // PT), name_hint="hc_post_inactive_pad"):
                t0 = active + b * PT
                g.y2[t0:min(t0 + PT, t), 0:N * D] = pl.full([min(PT, t - t0), N * D], pl.FP32, 0.0)
        return y

    hc_post_test = pl.jit.entry(hc_post, name="hc_post_test")
    hc_post_prefill_test = pl.jit.entry(hc_post_prefill, name="hc_post_prefill_test")

    return SimpleNamespace(hc_post=hc_post, hc_post_prefill=hc_post_prefill, hc_post_test=hc_post_test,
                           hc_post_prefill_test=hc_post_prefill_test)


@pl.jit.inline
def hc_post(x: pl.Tensor, residual: pl.Tensor, post: pl.Tensor, comb: pl.Tensor, y: pl.Out[pl.Tensor], cfg):
    """Stable inline signature ``hc_post(x, residual, post, comb, y, cfg) -> y``: the body of
    :func:`hc_post_kernels` for ``cfg`` (shapes checked there: ``x [T, D] BF16``,
    ``residual [T, N, D]``, ``post [T, N]``, ``comb [T, N*N]``, ``y [T, N, D]`` FP32).

    Raises:
        ConfigError: ``cfg`` cannot be tiled. BindError: a shape or dtype off the config.
    """
    return hc_post_kernels(cfg).hc_post(x, residual, post, comb, y)


@pl.jit.inline
def hc_post_prefill(x: pl.Tensor, residual: pl.Tensor, post: pl.Tensor, comb: pl.Tensor, y: pl.Out[pl.Tensor],
                    num_tokens: pl.Scalar[pl.INT32], cfg):
    """Stable inline signature ``hc_post_prefill(x, residual, post, comb, y, num_tokens, cfg)
    -> y``: rows ``< num_tokens`` mixed, the rest exactly zero (see :func:`hc_post_kernels`).

    Raises:
        ConfigError: ``cfg`` cannot be tiled. BindError: a shape or dtype off the config.
    """
    return hc_post_kernels(cfg).hc_post_prefill(x, residual, post, comb, y, num_tokens)
# ---- end kernel ----


def _check_args(fn: str, x, residual, post, comb) -> tuple[int, int, int]:
    """Validate shapes; returns ``(T, N, D)`` or raises BindError."""
    if residual.dim() != 3 or not residual.is_floating_point():
        raise BindError(f"{fn}: residual must be a float [T, hc_mult, D] tensor, "
                        f"got {residual.dtype} {list(residual.shape)}")
    T, N, D = residual.shape
    for name, t, shape in (("x", x, (T, D)), ("post", post, (T, N)), ("comb", comb, (T, N * N))):
        if tuple(t.shape) != shape or not t.is_floating_point():
            raise BindError(f"{fn}: {name} must be a float tensor of shape {list(shape)}, "
                            f"got {t.dtype} {list(t.shape)}")
    return T, N, D


def golden_hc_post(
    x: torch.Tensor,  # [T, D] bf16 sublayer output
    residual: torch.Tensor,  # [T, hc_mult, D] fp32
    post: torch.Tensor,  # [T, hc_mult] fp32
    comb: torch.Tensor,  # [T, hc_mult*hc_mult] fp32, comb[t, i*hc_mult + j]
) -> torch.Tensor:  # [T, hc_mult, D] fp32
    """Hyper-connection post-mix golden (pypto-lib `models/deepseek/v4-flash/hc_post.py`, transformers `models/deepseek_v4/modeling_deepseek_v4.py`).

    ``y[:, j, :] = post[:, j] * x + sum_i comb[:, i*N + j] * residual[:, i, :]`` in FP32;
    the sum starts from the ``post * x`` term and adds input streams ``i = 0..N-1`` in
    order.

    Args:
        x: ``[T, D]`` sublayer output, BF16 (FP32 allowed).
        residual: ``[T, N, D]`` FP32 residual streams (``N = hc_mult``).
        post: ``[T, N]`` FP32 write-back weights (from hc_pre).
        comb: ``[T, N*N]`` FP32 stream mixing, ``i`` = input stream, ``j`` = output stream.

    Returns:
        ``[T, N, D]`` FP32 new residual streams.

    Raises:
        BindError: inconsistent shapes or non-float dtypes.
    """
    T, N, D = _check_args("golden_hc_post", x, residual, post, comb)
    c = comb.float().reshape(T, N, N)
    res = residual.float()
    y = post.float()[:, :, None] * x.float()[:, None, :]  # [T, N(j), D]
    for i in range(N):
        y = y + c[:, i, :, None] * res[:, i, None, :]
    return y


def golden_hc_post_prefill(
    x: torch.Tensor,  # [T, D] bf16
    residual: torch.Tensor,  # [T, hc_mult, D] fp32
    post: torch.Tensor,  # [T, hc_mult] fp32
    comb: torch.Tensor,  # [T, hc_mult*hc_mult] fp32
    num_tokens: int,
) -> torch.Tensor:  # [T, hc_mult, D] fp32
    """Prefill hc_post golden: :func:`golden_hc_post`, rows ``>= num_tokens`` exactly zero.

    ``num_tokens`` is clamped into ``[0, T]`` as the kernel does (pypto-lib `models/deepseek/v4-flash/hc_post.py`),
    so a negative count zeroes everything and a count above ``T`` keeps every row.

    Args:
        x, residual, post, comb: as for :func:`golden_hc_post`.
        num_tokens: active token rows (int).

    Returns:
        ``[T, hc_mult, D]`` FP32; rows ``>= clamp(num_tokens, 0, T)`` are ``0.0``.

    Raises:
        BindError: inconsistent shapes, non-float dtypes, or a non-integer ``num_tokens``.
    """
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int):
        raise BindError(f"golden_hc_post_prefill: num_tokens must be an int, got {num_tokens!r}")
    y = golden_hc_post(x, residual, post, comb)
    active = min(max(num_tokens, 0), y.shape[0])
    y[active:] = 0.0
    return y


def make_hc_post_inputs(cfg: DeepSeekV4Config, T: int, seed: int) -> dict[str, torch.Tensor]:
    """Seeded fixture for :func:`golden_hc_post` (the reference states no distribution).

    Drawn from one ``torch.Generator`` seeded with ``seed``, in this order:
    ``x = randn`` (BF16), ``residual = randn`` (FP32), ``post = 2 * sigmoid(randn)`` in
    (0, 2), ``comb = rand`` with every output column ``j`` normalised to sum 1 over the
    input streams ``i`` (the shape of hc_pre's Sinkhorn output).

    Args:
        cfg: model config (``hidden_size``, ``hc_mult``).
        T: number of tokens (> 0).
        seed: generator seed.

    Returns:
        ``{"x": [T, D] bf16, "residual": [T, hc_mult, D] fp32, "post": [T, hc_mult] fp32,
        "comb": [T, hc_mult*hc_mult] fp32}``.

    Raises:
        BindError: ``T`` not positive.
    """
    if T <= 0:
        raise BindError(f"make_hc_post_inputs: T must be positive, got {T}")
    N, D = cfg.hc_mult, cfg.hidden_size
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(T, D, generator=gen).to(torch.bfloat16)
    residual = torch.randn(T, N, D, generator=gen)
    post = 2.0 * torch.sigmoid(torch.randn(T, N, generator=gen))
    comb = torch.rand(T, N, N, generator=gen) + 0.01
    comb = comb / comb.sum(dim=1, keepdim=True)
    return {"x": x, "residual": residual, "post": post, "comb": comb.reshape(T, N * N)}


def build_case(preset: str, mode: str, **options) -> CaseRun:
    """Registry builder of the ``hc_post`` case (pypto-lib `models/deepseek/v4-flash/hc_post.py`).

    Modes: ``"decode"`` runs ``hc_post`` on ``T = decode_batch * decode_seq`` rows;
    ``"prefill"`` runs ``hc_post_prefill`` on ``T = prefill_seq`` rows with
    ``num_tokens`` active (default ``T``). Options: ``T``, ``num_tokens`` (prefill only),
    ``seed`` (fixture seed, default 0). Inputs come from :func:`make_hc_post_inputs`; ``y`` is
    compared with ``ratio_allclose`` at :data:`TOLERANCES`.

    Raises:
        ConfigError: unknown preset, mode or option.
        BindError: a non-positive ``T``.
    """
    cfg = get_config(preset)
    opts = dict(options)
    if mode not in ("decode", "prefill"):
        raise ConfigError(f"hc_post: unknown mode {mode!r}; modes: decode, prefill")
    T = int(opts.pop("T", cfg.decode_tokens if mode == "decode" else cfg.prefill_seq))
    num_tokens = int(opts.pop("num_tokens", T)) if mode == "prefill" else None
    seed = int(opts.pop("seed", 0))
    if opts:
        raise ConfigError(f"hc_post: unknown options {sorted(opts)} for mode {mode!r}")
    k = hc_post_kernels(cfg)
    d = make_hc_post_inputs(cfg, T, seed)
    N, D = cfg.hc_mult, cfg.hidden_size
    specs = [TensorSpec("x", [T, D], torch.bfloat16, d["x"]),
             TensorSpec("residual", [T, N, D], torch.float32, d["residual"]),
             TensorSpec("post", [T, N], torch.float32, d["post"]),
             TensorSpec("comb", [T, N * N], torch.float32, d["comb"]),
             TensorSpec("y", [T, N, D], torch.float32, is_output=True)]
    if mode == "prefill":
        specs.append(ScalarSpec("num_tokens", torch.int32, num_tokens))

    def golden(v: dict) -> None:
        if mode == "prefill":
            v["y"] = golden_hc_post_prefill(v["x"], v["residual"], v["post"], v["comb"], v["num_tokens"])
        else:
            v["y"] = golden_hc_post(v["x"], v["residual"], v["post"], v["comb"])

    label = f"{mode} T={T}" + (f" num_tokens={num_tokens}" if mode == "prefill" else "")
    return CaseRun(fn=k.hc_post_prefill_test if mode == "prefill" else k.hc_post_test, specs=specs,
                   golden=golden, compare={"y": ratio_allclose(*TOLERANCES["y"])}, rtol=1e-3, atol=1e-3,
                   label=label)


register(KernelCase("hc_post", build_case, modes=("decode", "prefill"),
                    description="hyper-connection post-mix (hc_post / hc_post_prefill), pypto-lib's hc_post.py"))
