"""Composition: a sparse or low-rank codec whose values (or factors) are encoded by another codec.

A *host* codec (``topk``, ``randomk``, ``threshold``, ``powersgd``) produces a small dense array
per *role*: the kept values of a sparse codec (role ``values``), the factors of PowerSGD (roles
``p`` and ``q``). By default the host stores that array raw; given a nested codec config, e.g.
``get_codec("topk", ratio=0.01, values={"id": "uniform", "bits": 8})``, it hands the array to the
nested codec instead.

On the wire (specs/codecs/hybrid.md) the nested codec is declared inside the host's params and
its sections follow the host's own, with the role as a prefix::

    params.values = {"codec": "uniform", "params": {"bits": 8, ...}, "version": 1}
    sections: ..., ["values.scales", "f4", ...], ["values.codes", "u1", ...]

The nested codec sees a one-dimensional tensor of ``count`` elements (``count`` follows from the
host's params and shape: k for a sparse codec, m*r and n*r for PowerSGD's factors) of dtype
float32 (float64 when the host tensor is float64), and its params and sections are checked by its
own rules. Only elementwise codecs nest: a host codec cannot be nested (no recursion).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import alloc
from ..errors import ConfigError, HeaderError, UnknownCodecError, UnsupportedVersionError
from ..excerpt import short
from ..sections import SectionInfo, SectionSpec, TensorEntry
from .base import Aggregation, Codec, EncodeContext, check_params
from .registry import codec_class, get_codec

__all__ = [
    "NestedSpec",
    "check_role_values",
    "combined_aggregation",
    "decode_nested",
    "nested_codec_from_config",
    "nested_dtype",
    "nested_entry",
    "nested_expected_sections",
    "parse_nested",
    "plan_nested",
]

_NESTED_KEYS = frozenset({"codec", "params", "version"})


def _is_host(cls: type[Codec]) -> bool:
    return bool(getattr(cls, "NESTED_ROLES", ()))


def nested_codec_from_config(role: str, cfg: Any, host: str) -> Codec | None:
    """Build the nested codec of ``role`` from a config (dict with ``id``, an id string, or None)."""
    if cfg is None:
        return None
    if isinstance(cfg, str):
        cfg = {"id": cfg}
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"{host}: {role}= must be a codec config dict like {{'id': 'fp16'}}, got {cfg!r}")
    codec = get_codec(dict(cfg))
    if _is_host(type(codec)):
        raise ConfigError(f"{host}: {role}= codec {codec.codec_id!r} is itself composite; only elementwise codecs nest")
    if math.isinf(codec.magnitude_bound(0.0, 1)):
        # the host could not tell, on encode, which values its decoder would refuse (hybrid.md §3.1)
        raise ConfigError(
            f"{host}: {role}= codec {codec.codec_id!r} does not bound what it decodes (Codec.magnitude_bound), "
            "so it cannot be nested"
        )
    return codec


def nested_dtype(host_dtype: str) -> str:
    """The dtype a nested codec sees: float64 for float64 hosts, float32 otherwise."""
    return "float64" if host_dtype == "float64" else "float32"


@dataclasses.dataclass(frozen=True)
class NestedSpec:
    """A parsed nested declaration: the codec class and its (checked) wire params."""

    cls: type[Codec]
    params: dict[str, Any]
    version: int

    def wire(self) -> dict[str, Any]:
        return {"codec": self.cls.codec_id, "params": self.params, "version": self.version}


def plan_nested(
    role: str, codec: Codec, arr: np.ndarray, ctx: EncodeContext
) -> tuple[dict[str, Any], list[SectionSpec], Any]:
    """Plan the nested encoding of ``arr`` (1-D). Returns (header map, prefixed sections, fill(views))."""
    flat = arr.reshape(-1)
    if isinstance(flat, np.ndarray):  # device arrays are contiguous already (and stay on the device)
        flat = np.ascontiguousarray(flat)
    plan = codec.plan(flat, ctx.nested(role))
    sections = [SectionSpec(f"{role}.{s.name}", s.dtype, s.nbytes) for s in plan.sections]
    wire = {"codec": codec.codec_id, "params": plan.params, "version": codec.version}
    prefix = role + "."

    def fill(views: Mapping[str, np.ndarray]) -> None:
        plan.fill({name[len(prefix) :]: v for name, v in views.items() if name.startswith(prefix)})

    return wire, sections, fill


def parse_nested(raw: Any, where: str, *, strict: bool = True) -> NestedSpec:
    """Check a nested declaration from a header (rule H1); raise HeaderError naming ``where``."""
    if not isinstance(raw, dict):
        raise HeaderError(f"H1: {where} must be a map {{codec, params, version}} or nil, got {type(raw).__name__}")
    keys = set(raw)
    missing = sorted(_NESTED_KEYS - keys)
    if missing:
        raise HeaderError(f"H1: {where} lacks {missing}")
    extra = sorted(keys - _NESTED_KEYS)
    if extra and strict:
        raise HeaderError(f"H1: {where} has unknown key(s) {short(extra)}")
    cid, version, params = raw["codec"], raw["version"], raw["params"]
    if not isinstance(cid, str):
        raise HeaderError(f"H1: {where}.codec must be a string")
    try:
        cls = codec_class(cid)
    except UnknownCodecError as e:
        raise UnknownCodecError(f"H1: {where}.codec: {e}") from None
    if _is_host(cls):
        raise HeaderError(f"H1: {where}.codec {cid!r} is composite; only elementwise codecs nest")
    if type(version) is not int or version < 1:
        raise HeaderError(f"H1: {where}.version must be a positive integer, got {short(version)}")
    if version > cls.version:
        raise UnsupportedVersionError(
            f"C0: {where} uses {cid!r} version {version}; this reader knows up to {cls.version}"
        )
    if not isinstance(params, dict):
        raise HeaderError(f"H1: {where}.params must be a map")
    schema = cls.wire_schema_for(params) if hasattr(cls, "wire_schema_for") else cls.wire_schema()
    checked = check_params(
        schema, params, HeaderError, f"H1: {where}.params: ", fill_defaults=False, allow_unknown=not strict
    )
    cls._check_config(checked, HeaderError, f"H1: {where}.params: ")
    return NestedSpec(cls, checked, version)


def nested_expected_sections(role: str, spec: NestedSpec, count: int) -> list[tuple[str, str, int]]:
    return [(f"{role}.{n}", dt, nb) for n, dt, nb in spec.cls.expected_sections(spec.params, (count,))]


def nested_entry(role: str, spec: NestedSpec, host: TensorEntry, count: int) -> TensorEntry:
    """A stand-alone TensorEntry for the nested codec (its sections with the role prefix removed)."""
    prefix = role + "."
    secs = tuple(
        SectionInfo(s.name[len(prefix) :], s.dtype, s.offset, s.nbytes)
        for s in host.sections
        if s.name.startswith(prefix)
    )
    return TensorEntry(spec.cls.codec_id, spec.version, nested_dtype(host.dtype), (count,), spec.params, secs)


def nested_views(role: str, views: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    prefix = role + "."
    return {n[len(prefix) :]: v for n, v in views.items() if n.startswith(prefix)}


def check_nested_entry(role: str, spec: NestedSpec, host: TensorEntry, count: int, where: str, strict: bool) -> None:
    """Run the nested codec's own header checks on its stand-alone entry."""
    spec.cls.check_entry(nested_entry(role, spec, host, count), f"{where}.params.{role}", strict=strict)


def check_role_values(
    params: Mapping[str, Any], role: str, host: TensorEntry, views: Mapping[str, np.ndarray], count: int
) -> None:
    """The nested codec's value checks on ``role`` when ``params[role]`` names one (else nothing)."""
    if params[role] is not None:
        spec = parse_nested(params[role], role, strict=False)
        spec.cls.check_values(spec.params, nested_entry(role, spec, host, count), nested_views(role, views))


def nested_scratch_bytes(raw: Any, host: TensorEntry, count: int) -> int:
    """Temporaries of :func:`decode_nested` for the declaration ``raw`` (checked already): the
    ``count``-element result (binary64 for a float64 host, binary32 otherwise; a host whose values are
    binary32 whatever its dtype, ``dct``, passes its binary32 value entry) and the nested codec's own
    scratch (specs/format.md §9.1)."""
    spec = parse_nested(raw, "nested", strict=False)
    wd = 8 if host.dtype == "float64" else 4
    sub = TensorEntry(spec.cls.codec_id, spec.version, nested_dtype(host.dtype), (count,), spec.params, ())
    return count * wd + spec.cls.decode_scratch_bytes(spec.params, sub)


def decode_nested(
    role: str, spec: NestedSpec, host: TensorEntry, views: Mapping[str, np.ndarray], count: int, dtype: Any
) -> np.ndarray:
    """Decode the nested array (``count`` elements of float32/float64) into a fresh small array."""
    out = alloc.empty(f"the values of the nested codec in role {role!r}", count, dtype)
    spec.cls.decode_into(spec.params, nested_entry(role, spec, host, count), nested_views(role, views), out, False)
    return out


def combined_aggregation(host: Aggregation, nested: Codec | None) -> Aggregation:
    """A summable host stays summable only with a summable (or no) nested codec."""
    if nested is None or host is Aggregation.GATHER:
        return host
    return nested.aggregation
