"""The codec registry: ids to classes, with third-party codecs found through entry points.

A package adds codecs by declaring, in its ``pyproject.toml``::

    [project.entry-points."gcodec.codecs"]
    mycodec = "mypkg.codecs:MyCodec"

The entry point's name must equal the class's ``codec_id``. Entry points are loaded the first time
an unknown id is looked up.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from ..errors import ConfigError, UnknownCodecError
from ..excerpt import short
from .base import Codec

__all__ = ["codec_class", "get_codec", "list_codecs", "register_codec"]

_REGISTRY: dict[str, type[Codec]] = {}
_entry_points_loaded = False
ENTRY_POINT_GROUP = "gcodec.codecs"


def register_codec(cls: type[Codec], *, replace: bool = False) -> type[Codec]:
    """Register a codec class under its ``codec_id`` (usable as a decorator)."""
    cid = getattr(cls, "codec_id", None)
    if not isinstance(cid, str) or not cid:
        raise ConfigError(f"{cls.__name__} has no codec_id")
    if cid in _REGISTRY and _REGISTRY[cid] is not cls and not replace:
        raise ConfigError(f"codec id {cid!r} is already registered by {_REGISTRY[cid].__name__}")
    _REGISTRY[cid] = cls
    return cls


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _REGISTRY:
            continue
        try:
            cls = ep.load()
        except Exception as e:  # a broken plug-in must not break decoding of other codecs
            import warnings

            warnings.warn(f"gcodec: could not load codec entry point {ep.name!r}: {e}", stacklevel=2)
            continue
        if getattr(cls, "codec_id", None) != ep.name:
            import warnings

            warnings.warn(f"gcodec: entry point {ep.name!r} does not name its class's codec_id", stacklevel=2)
            continue
        register_codec(cls)


def codec_class(codec_id: str) -> type[Codec]:
    """The class registered for ``codec_id``; UnknownCodecError when there is none."""
    if codec_id not in _REGISTRY:
        _load_entry_points()
    try:
        return _REGISTRY[codec_id]
    except KeyError:
        raise UnknownCodecError(f"unknown codec {short(codec_id)}; registered: {sorted(_REGISTRY)}") from None


def get_codec(codec_id: str | dict[str, Any] | Codec, **params: Any) -> Codec:
    """Build a codec from its id and params, or from a config dict ``{"id": ..., ...}``."""
    if isinstance(codec_id, Codec):
        if params:
            raise ConfigError("params cannot be given with a codec instance")
        return codec_id
    if isinstance(codec_id, dict):
        cfg = dict(codec_id)
        cfg.update(params)
        cid = cfg.pop("id", None)
        if not isinstance(cid, str):
            raise ConfigError("a codec config needs a string 'id'")
        return codec_class(cid)(**cfg)
    return codec_class(codec_id)(**params)


def list_codecs() -> list[str]:
    _load_entry_points()
    return sorted(_REGISTRY)
