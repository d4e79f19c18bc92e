"""A declarative per-tensor compression policy: which codec for which tensor at which step.

>>> from gcodec.policy import Policy
>>> p = Policy.from_dict({
...     "default": {"id": "uniform", "bits": 8},
...     "warmup_steps": 10, "min_numel": 1024, "dense_1d": True,
...     "rules": [
...         {"name": "*embed*", "codec": "fp16"},
...         {"ndim": 2, "min_numel": 65536, "codec": {"id": "powersgd", "rank": 4}},
...         {"name": "head.*", "codec": None},
...     ],
... })
>>> p.decide("layer1.weight", (512, 512), step=20).codec["id"]
'powersgd'
>>> p.decide("layer1.bias", (512,), step=20).reason
'1-D tensor: dense'

A tensor's codec is decided in this order (the first that applies wins):

1. ``step < warmup_steps``: dense (early gradients are large and change fast);
2. fewer than ``min_numel`` elements: dense (no gain on the wire, a fixed cost per encode);
3. 1-D (biases, norms) while ``dense_1d``: dense;
4. the first rule whose every condition matches (``name`` fnmatch pattern, ``min_numel``/``max_numel``,
   ``ndim``, ``from_step``/``until_step``): its ``codec`` (None: dense);
5. otherwise ``default``.

If the result is PowerSGD and the tensor is not a matrix whose compression rate m·n / ((m+n)·r)
reaches ``powersgd_min_rate`` (or the codec's own ``min_compression_rate``, whichever is higher),
the tensor goes dense, as torch's PowerSGD hook does.

A policy round-trips through :meth:`Policy.to_dict` / :meth:`Policy.from_dict` and JSON files
(:meth:`Policy.save` / :meth:`Policy.load`); every field is checked, and a bad one raises
:class:`gcodec.ConfigError` naming the rule (``policy rule 2 (name '*.bias'): ...``). The DDP hook
(``gcodec.torch.HookState(policy=...)``) and ``gcodec.mpi.allreduce(comm, x, policy, key=name)`` take it.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .codecs import Codec, get_codec
from .errors import ConfigError, GcodecError

__all__ = ["DEFAULTS", "POLICY_VERSION", "Decision", "Defaults", "Policy", "Rule", "Rules", "as_policy", "size_rule"]

#: The ``version`` written by :meth:`Policy.to_dict`.
POLICY_VERSION = 1


@dataclass(frozen=True)
class Defaults:
    """The engines' defaults, each defined here once (docs/guide.md, "Defaults"): the DDP hook,
    FSDP2 and DiLoCo take theirs from :data:`DEFAULTS`, and so do :class:`Policy` and :class:`Rules`.

    Attributes:
        codec: the codec of compressed tensors (DiLoCo's default is None instead: the papers'
            uncompressed outer synchronisation, which a codec must be asked for).
        all_gather: the codec of a standalone FSDP2 ``QuantizedAllGather``.
        start_iter: iterations averaged uncompressed before compression starts: 0, error feedback
            from the first step (docs/convergence.md, "Error feedback from the first step": under
            SGD sign, top-k, PowerSGD and uniform 4 with EF from step 0 end where they end after 10
            dense steps, and under AdamW uniform 4 does, while top-k and PowerSGD lose more without
            them; PowerSGD's first step starts from the spec's random Q, a compressed start). A job
            may still ask for dense steps first; DiLoCo has no such phase.
        min_numel: tensors with fewer elements stay dense (no gain on the wire, a fixed cost each).
        dense_1d: 1-D tensors (biases, norm scales) stay dense unless a rule or pattern names a
            codec for them (a :class:`Policy` keeps them dense whatever its rules say).
        powersgd_min_rate: a low-rank codec compresses a matrix only at this rate m n / ((m+n) r) or above.
    """

    codec: str = "fp16"
    all_gather: str = "uniform"
    start_iter: int = 0
    min_numel: int = 1024
    dense_1d: bool = True
    powersgd_min_rate: float = 2.0


#: The one set of defaults (see :class:`Defaults`).
DEFAULTS = Defaults()


def size_rule(shape: Sequence[int], codec: Codec, *, min_numel: int, dense_1d: bool, named: bool = False) -> str | None:
    """Why the size rules keep a tensor of ``shape`` dense under ``codec`` (None: ``codec`` compresses
    it): fewer than ``min_numel`` elements; 1-D while ``dense_1d`` unless a rule ``named`` the codec
    for it; or a codec that would pass that shape through (PowerSGD on a vector). The one place
    every engine applies them, whatever chose the codec (a policy, a controller's rung, a warm-up
    codec)."""
    numel = 1
    for d in shape:
        numel *= int(d)
    if numel < min_numel:
        return f"{numel} elements < min_numel {min_numel}: dense"
    if dense_1d and len(shape) <= 1 and not named:
        return "1-D tensor: dense"
    if not codec.compresses(tuple(int(d) for d in shape)):
        return f"{codec.codec_id} would pass a {[int(d) for d in shape]} tensor through: dense"
    return None


_RULE_FIELDS = ("name", "min_numel", "max_numel", "ndim", "from_step", "until_step", "codec")
_POLICY_FIELDS = ("version", "default", "warmup_steps", "min_numel", "dense_1d", "powersgd_min_rate", "rules")


def _codec_config(value: Any, where: str) -> dict[str, Any] | None:
    if value is None:
        return None
    try:
        return get_codec(value).get_config()
    except GcodecError as e:
        raise ConfigError(f"{where}: bad codec {value!r}: {e}") from None
    except (TypeError, ValueError, KeyError) as e:
        raise ConfigError(f"{where}: bad codec {value!r}: {e}") from None


def _int(value: Any, where: str, field: str, *, allow_none: bool = True) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{where}: {field} must be an integer >= 0, not {value!r}")
    return int(value)


@dataclass(frozen=True)
class Rule:
    """One line of a policy: conditions (all must hold; None means any) and the codec they select.

    Args:
        codec: codec config (or id) for matching tensors; None keeps them dense.
        name: fnmatch pattern on the tensor's name (``"*.bias"``, ``"encoder.*.weight"``).
        min_numel, max_numel: element-count bounds, inclusive.
        ndim: number of dimensions, an int or a list of accepted ints.
        from_step, until_step: the rule applies for ``from_step <= step < until_step``.
    """

    codec: dict[str, Any] | None
    name: str | None = None
    min_numel: int | None = None
    max_numel: int | None = None
    ndim: tuple[int, ...] | None = None
    from_step: int | None = None
    until_step: int | None = None

    def matches(self, name: str, shape: tuple[int, ...], step: int) -> bool:
        numel = 1
        for d in shape:
            numel *= int(d)
        return (
            (self.name is None or fnmatch.fnmatchcase(name, self.name))
            and (self.min_numel is None or numel >= self.min_numel)
            and (self.max_numel is None or numel <= self.max_numel)
            and (self.ndim is None or len(shape) in self.ndim)
            and (self.from_step is None or step >= self.from_step)
            and (self.until_step is None or step < self.until_step)
        )

    @classmethod
    def from_dict(cls, d: Any, index: int = 0) -> Rule:
        label = f"policy rule {index}"
        if not isinstance(d, Mapping):
            raise ConfigError(f"{label}: must be a dict with fields {list(_RULE_FIELDS)}, not {type(d).__name__}")
        if isinstance(d.get("name"), str):
            label += f" (name {d['name']!r})"
        unknown = sorted(set(d) - set(_RULE_FIELDS))
        if unknown:
            raise ConfigError(f"{label}: unknown field(s) {unknown}; known fields: {list(_RULE_FIELDS)}")
        if "codec" not in d:
            raise ConfigError(f"{label}: no 'codec' (give a codec config, or null to keep matching tensors dense)")
        name = d.get("name")
        if name is not None and not isinstance(name, str):
            raise ConfigError(f"{label}: name must be an fnmatch pattern string, not {name!r}")
        ndim_v = d.get("ndim")
        ndim: tuple[int, ...] | None = None
        if ndim_v is not None:
            vals = ndim_v if isinstance(ndim_v, (list, tuple)) else [ndim_v]
            if not vals:
                raise ConfigError(f"{label}: ndim must not be an empty list")
            ndim = tuple(int(_int(v, label, "ndim", allow_none=False)) for v in vals)  # type: ignore[arg-type]
        r = cls(
            codec=_codec_config(d["codec"], label),
            name=name,
            min_numel=_int(d.get("min_numel"), label, "min_numel"),
            max_numel=_int(d.get("max_numel"), label, "max_numel"),
            ndim=ndim,
            from_step=_int(d.get("from_step"), label, "from_step"),
            until_step=_int(d.get("until_step"), label, "until_step"),
        )
        if r.min_numel is not None and r.max_numel is not None and r.min_numel > r.max_numel:
            raise ConfigError(f"{label}: min_numel {r.min_numel} > max_numel {r.max_numel}: it can never match")
        if r.from_step is not None and r.until_step is not None and r.from_step >= r.until_step:
            raise ConfigError(f"{label}: from_step {r.from_step} >= until_step {r.until_step}: it can never match")
        return r

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        for f in _RULE_FIELDS[:-1]:
            v = getattr(self, f)
            if v is not None:
                d[f] = list(v) if f == "ndim" else v
        d["codec"] = self.codec
        return d


@dataclass(frozen=True)
class Decision:
    """What the policy chose for one tensor at one step, and why (for logs and ``gcodec advise``)."""

    codec: dict[str, Any] | None
    reason: str


class Policy:
    """Per-tensor codec choice by name, size, ndim and step (module docstring has the order).

    Args:
        rules: :class:`Rule` objects or dicts (first match wins).
        default: codec of tensors no rule matches (None: dense). Default fp16.
        warmup_steps: steps at the start where every tensor is dense.
        min_numel: tensors with fewer elements stay dense. 1024 by default.
        dense_1d: keep 1-D tensors (biases, norm scales) dense. On by default.
        powersgd_min_rate: PowerSGD compresses a matrix only when m·n / ((m+n)·r) reaches this rate
            (the codec's own ``min_compression_rate`` applies too); else it goes dense. Default 2.
    """

    def __init__(
        self,
        rules: Sequence[Rule | Mapping[str, Any]] = (),
        *,
        default: Codec | str | Mapping[str, Any] | None = DEFAULTS.codec,
        warmup_steps: int = 0,
        min_numel: int = DEFAULTS.min_numel,
        dense_1d: bool = DEFAULTS.dense_1d,
        powersgd_min_rate: float = DEFAULTS.powersgd_min_rate,
    ) -> None:
        if isinstance(rules, (str, bytes, Mapping)) or not isinstance(rules, Sequence):
            raise ConfigError(f"policy rules must be a list of rules, not {type(rules).__name__}")
        self.rules: tuple[Rule, ...] = tuple(
            r if isinstance(r, Rule) else Rule.from_dict(r, i) for i, r in enumerate(rules)
        )
        self.default = _codec_config(default.get_config() if isinstance(default, Codec) else default, "policy default")
        self.warmup_steps = int(_int(warmup_steps, "policy", "warmup_steps", allow_none=False))  # type: ignore[arg-type]
        self.min_numel = int(_int(min_numel, "policy", "min_numel", allow_none=False))  # type: ignore[arg-type]
        if not isinstance(dense_1d, bool):
            raise ConfigError(f"policy: dense_1d must be true or false, not {dense_1d!r}")
        self.dense_1d = dense_1d
        if (
            isinstance(powersgd_min_rate, bool)
            or not isinstance(powersgd_min_rate, (int, float))
            or powersgd_min_rate < 0
        ):
            raise ConfigError(f"policy: powersgd_min_rate must be a number >= 0, not {powersgd_min_rate!r}")
        self.powersgd_min_rate = float(powersgd_min_rate)
        self._codecs: dict[str, Codec] = {}

    # ---- deciding ----------------------------------------------------------------------------
    def decide(self, name: str, shape: Sequence[int], step: int = 0) -> Decision:
        """The codec config (None: dense) of tensor ``name`` of ``shape`` at ``step``, with the reason."""
        shape = tuple(int(d) for d in shape)
        numel = 1
        for d in shape:
            numel *= d
        if step < self.warmup_steps:
            return Decision(None, f"warm-up (step {step} < {self.warmup_steps}): dense")
        if numel < self.min_numel:
            return Decision(None, f"{numel} elements < min_numel {self.min_numel}: dense")
        if self.dense_1d and len(shape) <= 1:
            return Decision(None, "1-D tensor: dense")
        codec, reason = self.default, "default"
        for i, r in enumerate(self.rules):
            if r.matches(name, shape, step):
                codec, reason = r.codec, f"rule {i}" + (f" ({r.name!r})" if r.name else "")
                break
        if codec is None:
            return Decision(None, f"{reason}: dense")
        c = self._codec(codec)
        rate = c.compression_rate(shape)
        if rate is not None:  # a codec whose gain depends on the shape (low-rank)
            need = max(self.powersgd_min_rate, float(c.params.get("min_compression_rate", 0.0)))
            if rate == 0:
                return Decision(None, f"{reason}: {c.codec_id} needs a matrix: dense")
            if rate < need:
                return Decision(None, f"{reason}: {c.codec_id} rate {rate:.2f} < {need:g}: dense")
        why = size_rule(shape, c, min_numel=0, dense_1d=False)  # the size rules ran above, before the rules
        return Decision(codec, reason) if why is None else Decision(None, f"{reason}: {why}")

    @property
    def settled_step(self) -> int:
        """The step from which :meth:`decide` no longer depends on the step (the warm-up and every
        rule's step range behind it): from there on, a tensor's codec follows from its name and shape."""
        bounds = [r.from_step or 0 for r in self.rules] + [r.until_step or 0 for r in self.rules]
        return max([self.warmup_steps, *bounds])

    def codec_for(self, name: str, shape: Sequence[int], step: int = 0, tensor: Any = None) -> Codec | None:
        """Like :meth:`decide`, as a codec object (one instance per config, so stateful codecs keep
        their state in it) or None for dense. ``tensor`` (the engine's gradient) is not consulted."""
        cfg = self.decide(name, shape, step).codec
        return None if cfg is None else self._codec(cfg)

    def _codec(self, cfg: dict[str, Any]) -> Codec:
        k = json.dumps(cfg, sort_keys=True)
        c = self._codecs.get(k)
        if c is None:
            c = self._codecs[k] = get_codec(cfg)
        return c

    def codecs(self) -> list[dict[str, Any]]:
        """Every codec config this policy can choose (default first), without duplicates."""
        out: list[dict[str, Any]] = []
        for c in [self.default, *(r.codec for r in self.rules)]:
            if c is not None and c not in out:
                out.append(c)
        return out

    # ---- dict / JSON -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "version": POLICY_VERSION,
            "default": self.default,
            "warmup_steps": self.warmup_steps,
            "min_numel": self.min_numel,
            "dense_1d": self.dense_1d,
            "powersgd_min_rate": self.powersgd_min_rate,
            "rules": [r.to_dict() for r in self.rules],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Policy:
        if not isinstance(d, Mapping):
            raise ConfigError(f"a policy must be a dict, not {type(d).__name__}")
        unknown = sorted(set(d) - set(_POLICY_FIELDS))
        if unknown:
            raise ConfigError(f"policy: unknown field(s) {unknown}; known fields: {list(_POLICY_FIELDS)}")
        version = d.get("version", POLICY_VERSION)
        if version != POLICY_VERSION:
            raise ConfigError(f"policy: version {version!r} is not supported (this gcodec reads {POLICY_VERSION})")
        kw = {k: d[k] for k in _POLICY_FIELDS[1:-1] if k in d}
        return cls(d.get("rules", []), **kw)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Policy:
        try:
            d = json.loads(Path(path).read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"policy file {path}: not JSON: {e}") from None
        return cls.from_dict(d)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Policy) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Policy({json.dumps(self.to_dict(), sort_keys=True)})"


class Rules:
    """The engines' shorthand policies, adapted into the policy language: a default codec, a
    callable ``policy(name, tensor) -> codec or None`` or a dict ``{fnmatch pattern: codec or None}``
    (first matching pattern wins; unmatched tensors take ``codec``), with the engine's size rules.

    A tensor is dense when the choice is None, and otherwise by :func:`size_rule`: fewer than
    ``min_numel`` elements, 1-D while ``dense_1d`` holds unless a callable or pattern named its codec
    explicitly, or a codec that would pass a tensor of that shape through (``codec.compresses(shape)``:
    PowerSGD on a thin matrix). Defaults: :data:`DEFAULTS`.
    ``decide``/``codec_for`` answer as :class:`Policy`'s do; ``tensor`` is what a callable is handed
    (the gradient, or a meta tensor of the parameter's shape), the shape when the engine gives none.
    """

    def __init__(
        self,
        policy: Any = None,
        *,
        codec: Codec | str | Mapping[str, Any] | None = DEFAULTS.codec,
        min_numel: int = DEFAULTS.min_numel,
        dense_1d: bool = DEFAULTS.dense_1d,
    ) -> None:
        if policy is not None and not callable(policy) and not isinstance(policy, Mapping):
            raise ConfigError(f"a policy is a gcodec.policy.Policy, a callable or a dict, not {type(policy).__name__}")
        self.policy = policy
        self.default = (
            None
            if codec is None
            else (
                codec if isinstance(codec, Codec) else get_codec(dict(codec) if isinstance(codec, Mapping) else codec)
            )
        )
        self.min_numel = int(_int(min_numel, "policy", "min_numel", allow_none=False))  # type: ignore[arg-type]
        self.dense_1d = bool(dense_1d)
        self._codecs: dict[str, Codec] = {}

    def _choice(self, name: str, shape: tuple[int, ...], tensor: Any) -> tuple[Any, str]:
        if callable(self.policy):
            return self.policy(name, shape if tensor is None else tensor), "policy callable"
        if isinstance(self.policy, Mapping):
            for pattern, c in self.policy.items():
                if fnmatch.fnmatchcase(name, pattern):
                    return c, f"pattern {pattern!r}"
        return self.default, "default"

    def _codec(self, choice: Any, where: str) -> Codec:
        if isinstance(choice, Codec):
            return choice  # the caller's instance: a stateful codec keeps its state in it
        cfg = _codec_config(choice, where)
        k = json.dumps(cfg, sort_keys=True)
        c = self._codecs.get(k)
        if c is None:
            c = self._codecs[k] = get_codec(cfg)  # type: ignore[arg-type]  # not None: the caller checked
        return c

    def _decide(self, name: str, shape: Sequence[int], tensor: Any) -> tuple[Codec | None, str]:
        shape = tuple(int(d) for d in shape)
        choice, reason = self._choice(name, shape, tensor)
        if choice is None:
            return None, f"{reason}: dense"
        codec = self._codec(choice, f"policy for {name!r}")
        why = size_rule(shape, codec, min_numel=self.min_numel, dense_1d=self.dense_1d, named=reason != "default")
        return (codec, reason) if why is None else (None, f"{reason}: {why}" if why.startswith(codec.codec_id) else why)

    @property
    def settled_step(self) -> int | None:
        """0: a pattern dict's or the default codec's choice follows from the name and shape at every
        step; None: a callable's may follow from anything (it is asked every time)."""
        return None if callable(self.policy) else 0

    def decide(self, name: str, shape: Sequence[int], step: int = 0, tensor: Any = None) -> Decision:
        codec, reason = self._decide(name, shape, tensor)
        return Decision(None if codec is None else codec.get_config(), reason)

    def codec_for(self, name: str, shape: Sequence[int], step: int = 0, tensor: Any = None) -> Codec | None:
        return self._decide(name, shape, tensor)[0]


def as_policy(
    policy: Any,
    *,
    codec: Codec | str | Mapping[str, Any] | None = DEFAULTS.codec,
    min_numel: int = DEFAULTS.min_numel,
    dense_1d: bool = DEFAULTS.dense_1d,
) -> Any:
    """The one policy language of the engines: a :class:`Policy` (it decides alone) or any object
    with ``codec_for(name, shape, step)`` as given; a callable, a ``{pattern: codec}`` dict or None
    adapted into :class:`Rules`. (An adaptive controller is no policy: engines take it as
    ``controller=``.)"""
    if isinstance(policy, Policy) or hasattr(policy, "codec_for"):
        return policy
    return Rules(policy, codec=codec, min_numel=min_numel, dense_1d=dense_1d)
