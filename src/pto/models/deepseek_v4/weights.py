"""Checkpoint loading: a DeepSeek-V4 checkpoint directory onto kernel inputs.

A directory holds ``config.json`` and either one ``model.safetensors``, several
``*.safetensors`` files with a ``model.safetensors.index.json`` (``weight_map``: tensor
name -> file), or several files without an index. Files are opened with
``safetensors.safe_open`` (memory mapped); a tensor is read only when a layer asks for it.

On open every stored tensor name is mapped to its canonical name
(:func:`pto.models.deepseek_v4.checkpoint.canonical_name`) and the set is checked against
:func:`expected_tensors` of the config (plus :func:`expected_mtp_tensors` when the directory
holds ``mtp.*`` and ``num_nextn_predict_layers > 0``; otherwise ``mtp.*`` is ignored, as
transformers ignores it): a missing tensor, an extra tensor or a tensor of the wrong shape or dtype kind is a
:class:`CheckpointError` naming it, before anything is returned.

Stored formats converted at load (transformers `models/deepseek_v4/` and the published DeepSeek-V4-Flash checkpoint): float (F32 / BF16 /
F16) as is; F8_E4M3 + F8_E8M0 ``.scale`` (128 x 128 blocks, also accepted under
transformers' ``.weight_scale_inv`` name); FP4 experts (int8 bytes of two e2m1 values +
E8M0 per 32 inputs). Every float weight comes out FP32 (``tid2eid`` int64).

Weight formats of the loaded model (``weight_format``):

* ``"bf16"``: unquantised: the fp32 golden forward uses the FP32 values as they are, the bf16
  kernels (``KernelModel``) BF16 copies of the same matrices with unit scales
  (:func:`attention_inputs` with ``weight_format="bf16"``, ``KernelModel.ffn_weights``);
* ``"int8"``: W8A8 as the kernels deploy it (PPT ``weights_flash.py``): ``wq_b``, ``wo_b``,
  ``indexer.wq_b``, the shared and every routed expert matrix get per-output-row INT8
  codes with an FP32 scale ``max(amax, 1e-4) / 127`` (the kernels' rule); the rest stays
  float.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from pto.errors import CheckpointError, ConfigError
from pto.models.deepseek_v4.checkpoint import (canonical_name, dequantize_fp4,
                                               dequantize_fp8_block, expected_mtp_tensors,
                                               expected_tensors, FP4_GROUP, FP8_BLOCK,
                                               MTP_FP8_WEIGHTS)
from pto.models.deepseek_v4.config import DeepSeekV4Config
from pto.models.deepseek_v4.qkv_proj_rope import quantize_weight_per_column

__all__ = ["Checkpoint", "GlobalTensors", "QuantWeight", "open_checkpoint", "WEIGHT_FORMATS", "INT8_WEIGHTS",
           "quantize_rows_int8", "attention_inputs", "moe_inputs", "orthonormal_hadamard"]

WEIGHT_FORMATS = ("bf16", "int8")
# canonical leaves quantised to INT8 per output row in the "int8" format (PPT weights_flash.py)
INT8_WEIGHTS = ("attn.wq_b.weight", "attn.wo_b.weight", "attn.indexer.wq_b.weight",
                "ffn.shared_experts.w1.weight", "ffn.shared_experts.w2.weight",
                "ffn.shared_experts.w3.weight")
_FLOAT_DTYPES = ("F32", "BF16", "F16")
_IGNORED_PREFIXES = ("mtp.", "model.mtp.")


@dataclass(frozen=True)
class QuantWeight:
    """An INT8 W8A8 weight: ``codes [out, in]`` int8 and ``scale [out]`` FP32 with
    ``w ~= codes * scale[:, None]`` (per output row, ``scale = amax / 127``)."""

    codes: torch.Tensor
    scale: torch.Tensor

    def dequantize(self) -> torch.Tensor:
        """``codes * scale[:, None]`` in FP32, ``[out, in]``."""
        return self.codes.float() * self.scale[:, None]


def quantize_rows_int8(w: torch.Tensor) -> QuantWeight:
    """Per-output-row symmetric INT8 of ``w [out, in]`` by the kernels' rule
    (``qkv_proj_rope.quantize_weight_per_column`` on ``w^T``): ``scale = max(amax, 1e-4) /
    127``, ``codes = clamp(round_half_even(w / scale), -127, 127)``."""
    codes_t, scale = quantize_weight_per_column(w.float().T.contiguous())
    return QuantWeight(codes_t.T.contiguous(), scale)


def _is_int8_weight(name: str) -> bool:
    rest = name.split(".", 2)[-1] if name.startswith(("layers.", "mtp.")) else name
    if name.startswith("mtp.") and rest in MTP_FP8_WEIGHTS:  # the MTP projections are W8A8 (pypto-lib `mtp_projection.py`)
        return True
    return rest in INT8_WEIGHTS or (".ffn.experts." in name and name.endswith(
        ("w1.weight", "w2.weight", "w3.weight")))


class Checkpoint:
    """An opened checkpoint directory (see the module docstring).

    Attributes:
        path: the directory.
        config: :class:`DeepSeekV4Config` from ``config.json`` (``DeepSeekV4Config.from_hf``).
        weight_format: ``"bf16"`` or ``"int8"``.
        layout: ``"hf"`` (float tensors only) or ``"fp8"`` (some FP8/FP4 tensors).
        has_mtp: the checkpoint holds the multi-token-prediction layers (``mtp.*``) and
            its config has ``num_nextn_predict_layers > 0``; they are then checked like
            every other tensor (:func:`expected_mtp_tensors`) and layer ``num_hidden_layers
            + k`` of :meth:`layer` is ``mtp.{k}.``. Otherwise ``mtp.*`` is ignored.

    Raises:
        CheckpointError: (from the constructor) no config.json, no safetensors file, an
            unreadable index or file, a tensor the index names but no file holds, a tensor
            stored in two files without an index to choose or under two names, or any missing /
            extra / misshapen tensor.
        ConfigError: an unknown ``weight_format`` or an unsupported config.json.
    """

    def __init__(self, path, weight_format: str = "bf16", config: DeepSeekV4Config | None = None):
        from safetensors import safe_open

        if weight_format not in WEIGHT_FORMATS:
            raise ConfigError(f"weights: weight_format must be one of {WEIGHT_FORMATS}, "
                              f"got {weight_format!r}")
        self.path = Path(path)
        self.weight_format = weight_format
        if not self.path.is_dir():
            raise CheckpointError(f"checkpoint {self.path}: not a directory")
        if not (self.path / "config.json").is_file():
            raise CheckpointError(f"checkpoint {self.path}: no config.json")
        self.config = config if config is not None else DeepSeekV4Config.from_hf(
            self.path, name=self.path.name or "checkpoint")

        index = self.path / "model.safetensors.index.json"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise CheckpointError(f"checkpoint {self.path}: unreadable "
                                      f"model.safetensors.index.json ({exc})") from None
            if not isinstance(weight_map, dict):
                raise CheckpointError(f"checkpoint {self.path}: model.safetensors.index.json: weight_map must be "
                                      f"an object of tensor name -> file name, got {weight_map!r:.80}")
            bad = next((k for k, v in weight_map.items() if not isinstance(v, str) or not v), None)
            if bad is not None:
                raise CheckpointError(f"checkpoint {self.path}: model.safetensors.index.json: weight_map[{bad!r}] "
                                      f"must be a file name, got {weight_map[bad]!r}")
            files = sorted(set(weight_map.values()))
        else:
            weight_map = None
            files = sorted(p.name for p in self.path.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"checkpoint {self.path}: no *.safetensors file")
        self._handles = {}
        stored: dict[str, tuple[str, tuple[int, ...], str]] = {}  # name -> (file, shape, dtype)
        for fname in files:
            fpath = self.path / fname
            try:
                h = safe_open(str(fpath), framework="pt")
            except FileNotFoundError:
                what = (f"{fname} is a symlink to {os.readlink(fpath)!r}, which does not exist"
                        if fpath.is_symlink() else f"the index names {fname}, which does not exist")
                raise CheckpointError(f"checkpoint {self.path}: {what}") from None
            except Exception as exc:  # safetensors raises its own error types
                if fpath.is_dir():
                    raise CheckpointError(f"checkpoint {self.path}: {fname} is a directory, not a safetensors "
                                          "file") from None
                raise CheckpointError(f"checkpoint {self.path}: cannot read {fname} ({exc})") from None
            self._handles[fname] = h
            for k in h.keys():
                if weight_map is not None and weight_map.get(k) != fname:
                    continue
                if k in stored:  # no index to say which copy counts: which file wins must not be luck
                    raise CheckpointError(f"checkpoint {self.path}: tensor {k!r} is stored in both {stored[k][0]} "
                                          f"and {fname}")
                sl = h.get_slice(k)
                stored[k] = (fname, tuple(sl.get_shape()), sl.get_dtype())
        if weight_map is not None:
            absent = sorted(k for k in weight_map if k not in stored)
            if absent:
                raise CheckpointError(f"checkpoint {self.path}: tensor {absent[0]!r} is in the "
                                      f"index ({weight_map[absent[0]]}) but not in that file")
        self._stored = stored
        self._canon = self._check(stored)
        self.experts = range(self.config.n_routed_experts)  # the routed experts moe_inputs stacks
        self.vocab_rows: slice | None = None  # head rows of globals() (None: all)
        self._finite: set[str] = set()  # global tensors checked finite
        self.layout = "fp8" if any(d.startswith("F8") for _, _, d in stored.values()) else "hf"

    # ---- checking ----------------------------------------------------------------------------
    def _check(self, stored) -> dict[str, dict[str, str]]:
        """Map canonical names to their stored parts and check every tensor (see class doc)."""
        want = expected_tensors(self.config)
        self.has_mtp = self.config.num_nextn_predict_layers > 0 and any(
            k.startswith(_IGNORED_PREFIXES) for k in stored)
        if self.has_mtp:
            want.update(expected_mtp_tensors(self.config))
        parts: dict[str, dict[str, str]] = {}
        for k in stored:
            if k.startswith(_IGNORED_PREFIXES) and not self.has_mtp:
                continue
            c = canonical_name(k)
            for suffix in (".weight_scale_inv", ".scale"):  # FP8/FP4 block scales
                if c.endswith(suffix):
                    c, role = c[:-len(suffix)] + ".weight", "scale"
                    break
            else:
                role = "value"
            p = parts.setdefault(c, {})
            if role in p:  # two stored names for one tensor: which one wins must not be luck
                what = "the scale of " if role == "scale" else ""
                raise CheckpointError(f"checkpoint {self.path}: {what}tensor {c!r} is stored twice, as "
                                      f"{min(p[role], k)!r} and {max(p[role], k)!r}")
            p[role] = k
        for c in sorted(parts):
            if c not in want:
                raise CheckpointError(f"checkpoint {self.path}: unexpected tensor "
                                      f"{self._first(parts[c])!r} (not a DeepSeek-V4 tensor "
                                      f"of this config)")
            if "value" not in parts[c]:
                raise CheckpointError(f"checkpoint {self.path}: scale {parts[c]['scale']!r} has "
                                      f"no weight {c!r}")
        missing = sorted(set(want) - set(parts))
        if missing:  # the canonical name, and the name this checkpoint's layout would store it under
            from pto.models.deepseek_v4.checkpoint import stored_name
            layout = "fp8" if any(d.startswith("F8") for _, _, d in stored.values()) else "hf"
            on_disk = stored_name(missing[0], layout)
            as_stored = f"stored as {on_disk!r}, " if on_disk != missing[0] else ""
            raise CheckpointError(f"checkpoint {self.path}: missing tensor {missing[0]!r} "
                                  f"({as_stored}shape {list(want[missing[0]][0])}; {len(missing)} missing)")
        for c, (shape, kind) in want.items():
            self._check_one(c, shape, kind, parts[c], stored)
        return parts

    def _first(self, p: dict[str, str]) -> str:
        return p.get("value") or p["scale"]

    def _check_one(self, c: str, shape, kind: str, p: dict[str, str], stored) -> None:
        name = p["value"]
        _, got, dtype = stored[name]

        def bad(msg: str) -> CheckpointError:
            return CheckpointError(f"checkpoint {self.path}: tensor {name!r} {msg}")

        if kind == "index":
            if dtype not in ("I64", "I32"):
                raise bad(f"has dtype {dtype}; expected an integer table (I64 or I32)")
            if got != shape:
                raise bad(f"has shape {list(got)}; expected {list(shape)}")
            return
        if "scale" in p:
            sname = p["scale"]
            _, sshape, sdtype = stored[sname]
            if dtype == "F8_E4M3":
                want_s = tuple(-(-n // FP8_BLOCK) for n in shape)
                if got != shape:
                    raise bad(f"has shape {list(got)}; expected {list(shape)}")
            elif dtype in ("I8", "U8"):  # FP4: two e2m1 per byte along the input axis
                want_s = (shape[0], shape[1] // FP4_GROUP)
                if got != (shape[0], shape[1] // 2):
                    raise bad(f"(packed FP4) has shape {list(got)}; expected "
                              f"{[shape[0], shape[1] // 2]}")
            else:
                raise bad(f"has a scale {sname!r} but dtype {dtype}; expected F8_E4M3 or "
                          "I8 (packed FP4)")
            if sdtype not in ("F8_E8M0", "F32", "BF16") or sshape != want_s:
                raise CheckpointError(f"checkpoint {self.path}: scale {sname!r} is {sdtype} "
                                      f"{list(sshape)}; expected F8_E8M0, F32 or BF16 {list(want_s)}")
            return
        if dtype not in _FLOAT_DTYPES:
            raise bad(f"has dtype {dtype} without a scale; expected one of {_FLOAT_DTYPES}")
        if got != shape:
            raise bad(f"has shape {list(got)}; expected {list(shape)}")

    # ---- reading -----------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        """Canonical names of every tensor, sorted."""
        return sorted(self._canon)

    def _read(self, name: str, rows: tuple[int, int] | None = None) -> torch.Tensor:
        fname = self._stored[name][0]
        if rows is None:
            return self._handles[fname].get_tensor(name)
        return self._handles[fname].get_slice(name)[rows[0]:rows[1]]  # only these rows leave the file

    def tensor(self, canonical: str, rows: slice | None = None) -> torch.Tensor:
        """One tensor by canonical name, FP32 (``tid2eid`` int64), FP8/FP4 dequantised.

        ``rows`` (a ``slice(a, b)`` of the first dim, step 1) reads only those rows from the file
        (an FP8 tensor: the 128-row blocks covering them); the result is ``tensor[a:b]`` exactly.

        Raises:
            CheckpointError: unknown name; a tensor (the rows read) holding NaN or infinite values
                (a corrupt file: the model would silently emit token 0), naming the stored tensor;
                an FP8/FP4 block scale <= 0;
                a ``tid2eid`` entry outside ``[0, n_routed_experts)``, or a row naming an expert twice;
                a ``rows`` slice outside the first dim or with a step.
        """
        p = self._canon.get(canonical)
        if p is None:
            raise CheckpointError(f"checkpoint {self.path}: no tensor {canonical!r}")
        span = cut = None
        fp8 = self._stored[p["value"]][2] == "F8_E4M3"
        if rows is not None:
            n = self._stored[p["value"]][1][0]
            a, b = (0 if rows.start is None else rows.start), (n if rows.stop is None else rows.stop)
            if rows.step not in (None, 1) or not 0 <= a <= b <= n:
                raise CheckpointError(f"checkpoint {self.path}: rows {rows} outside {canonical!r} (first dim {n})")
            span, cut = (a, b), slice(0, b - a)
            if "scale" in p and fp8:  # FP8 blocks: whole 128-row blocks, then the rows asked for
                a0 = a // FP8_BLOCK * FP8_BLOCK
                span, cut = (a0, min(n, -(-b // FP8_BLOCK) * FP8_BLOCK)), slice(a - a0, b - a0)
        t = self._read(p["value"], span)
        if "scale" in p:  # FP8: one scale row per 128 rows; FP4: one per row
            blk = FP8_BLOCK if fp8 else 1
            srows = None if span is None else (span[0] // blk, -(-span[1] // blk))
            s = self._read(p["scale"], srows).float()
            if not bool((s > 0).all()):  # an E8M0 power of two is positive; NaN is caught below
                bad_s = s[~(s > 0) & ~torch.isnan(s)]
                if bad_s.numel():
                    raise CheckpointError(f"checkpoint {self.path}: scale {p['scale']!r} holds {bad_s.numel()} "
                                          f"value(s) <= 0 (e.g. {float(bad_s[0]):g}); a block scale is positive")
            if t.dtype == torch.float8_e4m3fn:
                out = dequantize_fp8_block(t, s)
            else:
                out = dequantize_fp4(t.view(torch.int8), s)
        elif not t.is_floating_point():
            t = t.to(torch.int64)
            if canonical.endswith("tid2eid"):  # hash routing: every entry an expert of this model
                E = self.config.n_routed_experts
                bad = (t < 0) | (t >= E)
                if bool(bad.any()):
                    v = int(t[bad][0])
                    raise CheckpointError(f"checkpoint {self.path}: tensor {p['value']!r} holds expert id {v} "
                                          f"({int(bad.sum())} entries) outside [0, n_routed_experts={E})")
                if t.dim() == 2 and t.shape[1] > 1:  # a token's K experts are distinct (as a top-k is)
                    srt = t.sort(dim=1).values
                    dup = (srt[:, 1:] == srt[:, :-1]).any(dim=1)
                    if bool(dup.any()):
                        r, n = int(dup.nonzero()[0]), int(dup.sum())
                        raise CheckpointError(f"checkpoint {self.path}: tensor {p['value']!r} row {r} "
                                              f"{t[r].tolist()} names an expert twice ({n} row{'s' if n != 1 else ''}); "
                                              "a token's hash-routed experts are distinct")
            return t
        else:
            out = t.float()
        if cut is not None:
            out = out[cut]
        bad = out.numel() - int(torch.isfinite(out).sum())
        if bad:
            raise CheckpointError(f"checkpoint {self.path}: tensor {p['value']!r} holds {bad} NaN or infinite "
                                  f"value(s){' after dequantisation' if 'scale' in p else ''}")
        return out

    def weight(self, canonical: str):
        """A tensor in the model's weight format: a :class:`QuantWeight` for the INT8
        matrices of ``weight_format="int8"``, else :meth:`tensor`."""
        t = self.tensor(canonical)
        if self.weight_format == "int8" and _is_int8_weight(canonical):
            return quantize_rows_int8(t)
        return t

    def layer_prefix(self, i: int) -> str:
        """Canonical prefix of layer ``i``: ``layers.{i}.`` for ``i < num_hidden_layers``,
        ``mtp.{i - num_hidden_layers}.`` for the MTP layers (when :attr:`has_mtp`).

        Raises:
            CheckpointError: ``i`` is not a layer of this checkpoint.
        """
        L = self.config.num_hidden_layers
        n = L + (self.config.num_nextn_predict_layers if self.has_mtp else 0)
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
            raise CheckpointError(f"checkpoint {self.path}: no layer {i!r} (num_hidden_layers={L}"
                                  + (f", MTP layers {L}..{n - 1}" if n > L else ", no MTP layers") + ")")
        return f"layers.{i}." if i < L else f"mtp.{i - L}."

    def layer_ratio(self, i: int) -> int:
        """Compress ratio of layer ``i`` (0 for an MTP layer: sliding-window only,
        transformers `models/deepseek_v4/` and the published DeepSeek-V4-Flash checkpoint)."""
        return self.config.compress_ratios[i] if i < self.config.num_hidden_layers else 0

    def layer(self, i: int) -> dict[str, object]:
        """Every tensor of layer ``i`` (leaf names relative to :meth:`layer_prefix`), loaded now.

        Raises:
            CheckpointError: ``i`` is not a layer (:meth:`layer_prefix`).
        """
        p = self.layer_prefix(i)
        return {c[len(p):]: self.weight(c) for c in self.names if c.startswith(p)}

    def globals(self) -> "GlobalTensors":
        """The non-layer tensors: ``embed.weight``, ``head.weight``, ``norm.weight``,
        ``hc_head_{fn,base,scale}`` (FP32), as a mapping that reads a tensor when it is first
        asked for (a model that never uses one, such as the golden inside the kernel model,
        holds no copy). ``head.weight`` is :attr:`vocab_rows` of it in a :meth:`shard`.

        Raises:
            CheckpointError: (now, not on first use) one of them holds NaN or infinite values;
                each is checked once per checkpoint (read, checked, dropped).
        """
        names = [c for c in self.names if not c.startswith(("layers.", "mtp."))]
        for c in names:
            if c not in self._finite:
                self._global(c)
                self._finite.add(c)
        return GlobalTensors(self, names)

    def _global(self, c: str) -> torch.Tensor:
        return self.tensor(c, self.vocab_rows if c == "head.weight" else None)

    # ---- expert parallelism ------------------------------------------------------------------
    def shard(self, experts: slice, vocab_rows: slice) -> "Checkpoint":
        """A view of this checkpoint for one expert-parallel rank (same files, nothing read):
        :func:`moe_inputs` stacks only the routed experts ``experts`` (``[E_local, ...]``) and
        :meth:`globals`' ``head.weight`` is the rows ``vocab_rows`` of the head (the rank's
        vocabulary shard, ``[V / N, D]``). Every other tensor is the whole one.

        Raises:
            CheckpointError: a range outside ``[0, n_routed_experts)`` / ``[0, vocab_size)``.
        """
        import copy

        E, V = self.config.n_routed_experts, self.config.vocab_size
        e, v = range(E)[experts], range(V)[vocab_rows]
        if len(e) == 0 or e.step != 1 or len(v) == 0 or v.step != 1 or experts.stop > E or vocab_rows.stop > V:
            raise CheckpointError(f"checkpoint {self.path}: shard experts {experts} / vocabulary rows {vocab_rows} "
                                  f"outside {E} experts / {V} rows")
        view = copy.copy(self)
        view.experts = e
        view.vocab_rows = slice(v.start, v.stop)
        view._finite = set()
        return view


class GlobalTensors(Mapping):
    """:meth:`Checkpoint.globals`: canonical name -> FP32 tensor, read on first access, then kept."""

    def __init__(self, ckpt: Checkpoint, names: list[str]):
        self._ckpt, self._names, self._got = ckpt, names, {}

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._names:
            raise KeyError(name)
        if name not in self._got:
            self._got[name] = self._ckpt._global(name)
        return self._got[name]

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def open_checkpoint(path, weight_format: str = "bf16") -> Checkpoint:
    """Open and check a checkpoint directory; see :class:`Checkpoint` (same errors)."""
    return Checkpoint(path, weight_format)


# ---- kernel inputs ------------------------------------------------------------------------------

def orthonormal_hadamard(n: int) -> torch.Tensor:
    """``[n, n]`` FP32 Sylvester Hadamard matrix divided by ``sqrt(n)`` (``n`` a power of two).

    The indexer rotates its queries and keys by one orthonormal matrix before the INT8
    quantisation (pypto-lib `models/deepseek/v4-flash/decode_indexer_compressor.py`; pypto-lib `models/deepseek/v4-flash/prefill_indexer.py`); an orthonormal rotation of both leaves
    every dot product unchanged, so the result matches transformers (which has none) up to
    the quantisation (transformers `models/deepseek_v4/modeling_deepseek_v4.py`).

    Raises:
        ConfigError: ``n`` not a power of two.
    """
    if n < 1 or n & (n - 1):
        raise ConfigError(f"orthonormal_hadamard: n={n} is not a power of two")
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / n ** 0.5


def attention_inputs(ckpt: Checkpoint, i: int, weight_format: str = "int8") -> dict[str, torch.Tensor]:
    """Layer ``i``'s attention-block inputs in the kernels' layout (pypto-lib `models/deepseek/v4-flash/prefill_attention_swa.py`,
    pypto-lib `decode_attention_swa.py`, pypto-lib `decode_attention_hca.py`, pypto-lib `prefill_attention_hca.py`, pypto-lib `prefill_attention_csa.py`; parameter names of ``prefill_attention_*`` / ``CSA_ARGS``).

    BF16 ``[in, out]`` ``wq_a`` / ``wkv``; INT8 ``wq_b`` per output column and ``wo_b`` per
    output row with FP32 scales (the kernels' rules); ``wo_a [G, o_lora, (H/G)*d]`` BF16;
    BF16 norms; FP32 HC parameters and sinks. CSA / HCA layers add the compressor's
    ``cmp_wkv / cmp_wgate [c*d, D]`` BF16, ``cmp_ape`` FP32, ``cmp_norm_w`` BF16; CSA layers
    the indexer's ``idx_*`` compressor, an orthonormal ``hadamard``, INT8 ``idx_wq_b`` per
    column with ``idx_wq_b_scale`` and ``idx_weights_proj [D, HI]`` BF16.
    ``weight_format="bf16"`` (the unquantised kernels): ``wq_b``, ``wo_b`` and ``idx_wq_b`` in
    BF16 (same layouts) with unit scales.

    Raises:
        CheckpointError: ``i`` outside the layers. ConfigError: an unknown format.
    """
    from pto.models.deepseek_v4.prefill_sparse_attn import quantize_wo_b

    if weight_format not in WEIGHT_FORMATS:
        raise ConfigError(f"attention_inputs: weight_format must be one of {WEIGHT_FORMATS}, got {weight_format!r}")
    cfg, bf16, t, p = ckpt.config, torch.bfloat16, ckpt.tensor, ckpt.layer_prefix(i)

    def per_column(w):  # [in, out]: INT8 codes per output column and scales, or BF16 and ones
        if weight_format == "bf16":
            return w.to(bf16), torch.ones(w.shape[1])
        return quantize_weight_per_column(w)

    wq_b, wq_b_scale = per_column(t(p + "attn.wq_b.weight").T.contiguous())
    wo_b_f = t(p + "attn.wo_b.weight")
    wo_b, wo_b_scale = (wo_b_f.to(bf16), torch.ones(wo_b_f.shape[0])) if weight_format == "bf16" \
        else quantize_wo_b(wo_b_f)
    out = {
        "hc_attn_fn": t(p + "hc_attn_fn"), "hc_attn_scale": t(p + "hc_attn_scale"),
        "hc_attn_base": t(p + "hc_attn_base"), "attn_norm_w": t(p + "attn_norm.weight").to(bf16),
        "wq_a": t(p + "attn.wq_a.weight").T.contiguous().to(bf16), "wq_b": wq_b, "wq_b_scale": wq_b_scale,
        "wkv": t(p + "attn.wkv.weight").T.contiguous().to(bf16), "gamma_cq": t(p + "attn.q_norm.weight").to(bf16),
        "gamma_ckv": t(p + "attn.kv_norm.weight").to(bf16), "attn_sink": t(p + "attn.attn_sink"),
        "wo_a": t(p + "attn.wo_a.weight").reshape(cfg.o_groups, cfg.o_lora_rank, -1).to(bf16),
        "wo_b": wo_b, "wo_b_scale": wo_b_scale,
    }
    ratio = ckpt.layer_ratio(i)
    if ratio:
        c = p + "attn.compressor."
        out.update(cmp_wkv=t(c + "wkv.weight").to(bf16), cmp_wgate=t(c + "wgate.weight").to(bf16),
                   cmp_ape=t(c + "ape"), cmp_norm_w=t(c + "norm.weight").to(bf16))
    if ratio == 4:
        x = p + "attn.indexer."
        idx_wq_b, idx_wq_b_scale = per_column(t(x + "wq_b.weight").T.contiguous())
        out.update(idx_wkv=t(x + "compressor.wkv.weight").to(bf16),
                   idx_wgate=t(x + "compressor.wgate.weight").to(bf16), idx_ape=t(x + "compressor.ape"),
                   idx_norm_w=t(x + "compressor.norm.weight").to(bf16),
                   hadamard=orthonormal_hadamard(cfg.index_head_dim).to(bf16), idx_wq_b=idx_wq_b,
                   idx_wq_b_scale=idx_wq_b_scale,
                   idx_weights_proj=t(x + "weights_proj.weight").T.contiguous().to(bf16))
    return out


def moe_inputs(ckpt: Checkpoint, i: int, weight_format: str | None = None) -> dict[str, torch.Tensor | None]:
    """Layer ``i``'s MoE-block inputs keyed by ``moe.MOE_INPUTS`` without ``x_hc`` /
    ``input_ids`` (pypto-lib `models/deepseek/v4-flash/moe.py`): FP32 HC parameters, router weight and bias
    (zeros on hash layers), INT32 ``tid2eid`` (zeros on learned layers), ``ffn_norm`` as
    ``norm_w``; routed ``w1 / w3 [E, F, D]``, ``w2 [E, D, F]`` and shared ``sh_w1 / sh_w3
    [F, D]``, ``sh_w2 [D, F]`` (the routed ones: the checkpoint's :attr:`Checkpoint.experts`, all
    ``E`` unless it is a :meth:`Checkpoint.shard`, ``E_local`` then): for ``"int8"`` (default: the checkpoint's format) INT8 per
    output row with FP32 scales and a BF16 ``norm_w`` (the kernel's inputs), for ``"bf16"``
    the FP32 weights with ``None`` scales and an FP32 ``norm_w`` (``golden_moe``'s parity
    inputs).

    Raises:
        CheckpointError: ``i`` outside the layers. ConfigError: an unknown format.
    """
    fmt = weight_format or ckpt.weight_format
    if fmt not in WEIGHT_FORMATS:
        raise ConfigError(f"moe_inputs: weight_format must be one of {WEIGHT_FORMATS}, got {fmt!r}")
    cfg, t, p = ckpt.config, ckpt.tensor, ckpt.layer_prefix(i)
    E, K, V = cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.vocab_size
    hash_layer = i < cfg.num_hash_layers

    def rows(w):  # (codes, scale) per output row, or (w, None)
        if fmt == "bf16":
            return w, None
        q = quantize_rows_int8(w)
        return q.codes, q.scale

    out: dict[str, torch.Tensor | None] = {
        "hc_ffn_fn": t(p + "hc_ffn_fn"), "hc_ffn_scale": t(p + "hc_ffn_scale"), "hc_ffn_base": t(p + "hc_ffn_base"),
        "norm_w": t(p + "ffn_norm.weight").to(torch.bfloat16 if fmt == "int8" else torch.float32),
        "gate_w": t(p + "ffn.gate.weight"), "gate_bias": torch.zeros(E) if hash_layer else t(p + "ffn.gate.bias"),
        "tid2eid": (t(p + "ffn.gate.tid2eid") if hash_layer else torch.zeros(V, K, dtype=torch.int64)).to(torch.int32),
    }
    for leaf in ("w1", "w3", "w2"):
        per = [rows(t(f"{p}ffn.experts.{e}.{leaf}.weight")) for e in ckpt.experts]
        out[leaf] = torch.stack([c for c, _ in per])
        out[leaf + "_scale"] = None if fmt == "bf16" else torch.stack([s for _, s in per])
        out["sh_" + leaf], out[f"sh_{leaf}_scale"] = rows(t(f"{p}ffn.shared_experts.{leaf}.weight"))
    return out
