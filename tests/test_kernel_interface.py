"""Both kernel backends provide gcodec.kernels.interface's contract, and callers use only it.

The CUDA backend is imported in a child process with ``NUMBA_ENABLE_CUDASIM=1`` (Numba reads the
variable once, at import; see tests/gpu_sim_worker.py), which reports every module's functions and
their parameters as JSON."""

from __future__ import annotations

import ast
import inspect
import json
import os
import sys
from pathlib import Path

import pytest

from gcodec.kernels import interface
from tests.procs import run

ROOT = Path(__file__).resolve().parents[1]

_REPORT = r"""
import importlib, inspect, json, sys
out = {}
for backend in ("cpu", "cuda"):
    for m in sys.argv[1].split(","):
        mod = importlib.import_module(f"gcodec.kernels.{backend}.{m}")
        fns = {}
        for name in dir(mod):
            f = getattr(mod, name)
            if name.startswith("_") or not callable(f) or isinstance(f, type):
                continue
            f = getattr(f, "py_func", f)
            try:
                sig = inspect.signature(f)
            except (TypeError, ValueError):
                continue
            fns[name] = [[p.name, str(p.kind), None if p.default is p.empty else repr(p.default)]
                         for p in sig.parameters.values()]
        fns.update({n: "attribute" for n in dir(mod) if not n.startswith("_") and n not in fns})
        out[f"{backend}.{m}"] = fns
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def backends() -> dict:
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=str(ROOT), PYTHONFAULTHANDLER="1")
    p = run([sys.executable, "-c", _REPORT, ",".join(interface.MODULES)], 300, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _contract(proto: type) -> dict[str, list]:
    out = {}
    for name, fn in vars(proto).items():
        if name.startswith("_") or not callable(fn):
            continue
        params = list(inspect.signature(fn).parameters.values())[1:]  # without self
        out[name] = [[p.name, str(p.kind), None if p.default is p.empty else repr(p.default)] for p in params]
    return out


@pytest.mark.parametrize("module", sorted(interface.MODULES))
@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_every_backend_provides_the_contract_with_its_parameters(backends: dict, module: str, backend: str) -> None:
    got = backends[f"{backend}.{module}"]
    for name, params in _contract(interface.MODULES[module]).items():
        assert name in got, f"gcodec.kernels.{backend}.{module} lacks {name}"
        assert got[name] == params, f"gcodec.kernels.{backend}.{module}.{name}: {got[name]} != contract {params}"
    for name in getattr(interface.MODULES[module], "__annotations__", {}):
        assert name in got, f"gcodec.kernels.{backend}.{module} lacks {name}"
    for name in interface.BACKEND_SPECIFIC.get(module, {}).get(backend, ()):
        assert name in got, f"gcodec.kernels.{backend}.{module} lacks its own {name}"


def _kernel_calls() -> set[tuple[str, str, str]]:
    """Every ``<K>.<module>.<function>`` outside gcodec/kernels where ``<module>`` is a contract
    module and ``<K>`` is a name bound to ``kernels.of(...)``/``kernels.get(...)`` or such a call
    itself: (file, module, function)."""
    calls = set()
    for path in (ROOT / "gcodec").rglob("*.py"):
        if "kernels" in path.relative_to(ROOT / "gcodec").parts[:1]:
            continue
        tree = ast.parse(path.read_text())
        bound = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                f = node.value.func
                if isinstance(f, ast.Attribute) and f.attr in ("of", "get") and getattr(f.value, "id", "") == "kernels":
                    bound |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)):
                continue
            mod, base = node.value.attr, node.value.value
            if mod not in interface.MODULES:
                continue
            is_k = isinstance(base, ast.Name) and base.id in bound
            is_call = (
                isinstance(base, ast.Call)
                and isinstance(base.func, ast.Attribute)
                and base.func.attr in ("of", "get")
                and getattr(base.func.value, "id", "") == "kernels"
            )
            if is_k or is_call:
                calls.add((str(path.relative_to(ROOT)), mod, node.attr))
    return calls


def test_callers_use_only_the_contract() -> None:
    calls = _kernel_calls()
    assert len(calls) >= 20  # the scan sees the codecs' kernel calls (it would pass vacuously otherwise)
    allowed = {m: set(_contract(p)) | set(getattr(p, "__annotations__", {})) for m, p in interface.MODULES.items()}
    for m, per in interface.BACKEND_SPECIFIC.items():
        for names in per.values():
            allowed[m] |= set(names)
    bad = sorted(c for c in calls if c[2] not in allowed[c[1]])
    assert not bad, f"kernel calls outside gcodec.kernels.interface: {bad}"


def test_shared_scalar_bodies_are_compiled_not_copied() -> None:
    """The CPU backend's scalar conversions and Philox are gcodec.kernels.scalar's functions."""
    from gcodec.kernels import scalar
    from gcodec.kernels.cpu import cast, philox

    for mod, name in [
        (cast, "f32_to_f16_bits"),
        (cast, "f16_bits_to_f32"),
        (cast, "f32_to_bf16_bits"),
        (cast, "bf16_bits_to_f32"),
        (philox, "philox4x32"),
        (philox, "u32_to_uniform01"),
        (philox, "u16_to_open01"),
    ]:
        assert getattr(mod, name).py_func is getattr(scalar, name)
    cuda_src = (ROOT / "gcodec/kernels/cuda/cast.py").read_text() + (ROOT / "gcodec/kernels/cuda/philox.py").read_text()
    for name in ("f32_to_f16_bits", "f16_bits_to_f32", "philox4x32", "u16_to_open01", "u32_to_uniform01"):
        assert f"cuda.jit(device=True)(scalar.{name})" in cuda_src
