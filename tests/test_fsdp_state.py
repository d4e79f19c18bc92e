"""An FSDP2 state dict says whose it is: the rank and world size that saved it (its residuals are
that rank's own), and a rank refuses another rank's state at the same world size; the states that
reshard_state_dicts makes for another world size name the rank each is for. One gloo rank in this
process; the multi-rank save, reshard and resume run in tests/test_fsdp.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import gcodec  # noqa: E402
from gcodec.torch.fsdp import FSDPState, reshard_state_dicts  # noqa: E402

from .gloo import one_rank  # noqa: E402, F401  (a fixture)

pytestmark = [pytest.mark.torch]


@pytest.mark.usefixtures("one_rank")
def test_a_state_records_its_rank_and_another_ranks_is_refused() -> None:
    st = FSDPState({"id": "uniform", "bits": 4})
    sd = st.state_dict()
    assert (sd["rank"], sd["world_size"]) == (0, 1)
    FSDPState({"id": "uniform", "bits": 4}).load_state_dict(sd)  # its own: accepted
    other = {**sd, "rank": 1, "world_size": 2}
    with pytest.raises(gcodec.ConfigError, match=r"saved by a job of 2 ranks; this job has 1"):
        FSDPState({"id": "uniform", "bits": 4}).load_state_dict(other)
    with pytest.raises(gcodec.ConfigError, match=r"saved by rank 1 of 1; this is rank 0 of 1"):
        FSDPState({"id": "uniform", "bits": 4}).load_state_dict({**sd, "rank": 1})
    old = {k: v for k, v in sd.items() if k not in ("rank", "world_size")}  # saved before the fields
    FSDPState({"id": "uniform", "bits": 4}).load_state_dict(old)


def test_resharded_states_name_their_ranks() -> None:
    saved = [
        {
            "format": "gcodec.fsdp/1",
            "rank": r,
            "world_size": 2,
            "codec": gcodec.get_codec("uniform", bits=4).config_key,
            "error_feedback": True,
            "iters": {"m": 3},
            "shapes": {"w": [4, 2]},
            "residuals": {f"w[{4 * r}:{4 * r + 4}]": torch.full((4,), float(r))},
        }
        for r in range(2)
    ]
    out = reshard_state_dicts(saved, 4)
    assert [(sd["rank"], sd["world_size"]) for sd in out] == [(r, 4) for r in range(4)]
