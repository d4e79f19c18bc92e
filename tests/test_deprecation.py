"""Renamed public names still work for a while, warn, and name their replacement.

``gcodec.mpi.allreduce(ef=)`` (now ``state=``) is checked inside real MPI ranks
(tests/transport_ranks/mpi_program.py, scenario ``matrix``)."""

from __future__ import annotations

import importlib

import pytest

import gcodec
from gcodec.deprecation import REMOVED_IN, renamed_kwarg


@pytest.mark.torch
@pytest.mark.parametrize("module", ["gcodec.torch", "gcodec.torch.hook", "gcodec.torch.fsdp"])
def test_the_callable_policy_type_answers_to_its_old_name_with_a_warning(module: str) -> None:
    pytest.importorskip("torch")
    mod = importlib.import_module(module)
    from gcodec.torch import TensorChooser

    with pytest.warns(DeprecationWarning, match=rf"{module}\.Policy is renamed {module}\.TensorChooser.*{REMOVED_IN}"):
        old = mod.Policy
    assert old is TensorChooser
    with pytest.raises(AttributeError, match="NoSuchName"):
        mod.NoSuchName  # noqa: B018  (other names are still an AttributeError)


def test_a_renamed_keyword_takes_the_old_one_warns_and_refuses_both() -> None:
    unset = object()
    assert renamed_kwarg("f", "old", "new", unset, 3, unset=unset) == 3
    assert renamed_kwarg("f", "old", "new", unset, None, unset=unset) is None
    with pytest.warns(DeprecationWarning, match=r"f\(old=\) is renamed f\(new=\)"):
        assert renamed_kwarg("f", "old", "new", 5, None, unset=unset) == 5
    with pytest.warns(DeprecationWarning):
        assert renamed_kwarg("f", "old", "new", None, None, unset=unset) is None  # old=None is given
    with pytest.raises(TypeError, match="both new= and its old name old="):
        renamed_kwarg("f", "old", "new", 5, 3, unset=unset)


@pytest.mark.mpi
@pytest.mark.parametrize("module", ["gcodec.mpi", "gcodec.transports"])
def test_the_router_answers_to_its_old_name_policystate_with_a_warning(module: str) -> None:
    if module == "gcodec.mpi":
        pytest.importorskip("mpi4py")
    mod = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=rf"{module}\.PolicyState is renamed {module}\.Router.*{REMOVED_IN}"):
        old = mod.PolicyState
    assert old is mod.Router


def test_a_controller_given_as_the_policy_is_taken_as_the_controller_with_a_warning() -> None:
    """The controller is an explicit stage (controller=); the old form still works, warns, and a
    setter never takes (nor calibrates) one."""
    from gcodec.adaptive import AdaptiveController
    from gcodec.transports import Router

    calls = []

    class Ctl(AdaptiveController):
        def calibrate(self, **kw: object) -> None:
            calls.append(kw)

    ctl = Ctl(probe=False)
    with pytest.warns(DeprecationWarning, match="pass it as controller="):
        old = Router(ctl, error_feedback=True)
    assert old.controller is ctl and old.policy is None and old.adaptive
    assert calls == [{"error_feedback": True, "mode": "auto"}]
    new = Router(controller=ctl, mode="gather")
    assert new.controller is ctl and calls[-1] == {"error_feedback": True, "mode": "gather"}
    with pytest.raises(gcodec.ConfigError, match="controller="):
        new.policy = ctl
    new.policy = {"*": None}  # a policy change adapts the chooser and runs nothing
    assert len(calls) == 2 and not Router({"*": None}).adaptive


@pytest.mark.torch
def test_assigning_an_engine_setting_warns_and_still_reconfigures_the_router() -> None:
    """``state.codec = ...`` reconfigured the router behind an assignment; ``configure`` says so.
    The assignment still works, with a DeprecationWarning naming the method."""
    pytest.importorskip("torch")
    from gcodec.torch import FSDPState, HookState

    for st in (HookState("fp16", warm=False), FSDPState("fp16")):
        st.configure(codec={"id": "uniform", "bits": 4}, min_numel=7)
        assert st.codec == gcodec.get_codec("uniform", bits=4) and st.min_numel == 7
        assert st.router.choose("w", (8, 8), 0) == st.codec and st.router.choose("w", (2, 3), 0) is None
        with pytest.warns(DeprecationWarning, match=rf"call configure\(codec=...\).*{REMOVED_IN}"):
            st.codec = "bf16"
        assert st.router.choose("w", (8, 8), 0) == gcodec.get_codec("bf16")
        with pytest.warns(DeprecationWarning, match=r"configure\(policy=...\)"):
            st.policy = {"w": None}
        assert st.policy == {"w": None} and st.router.choose("w", (8, 8), 0) is None
