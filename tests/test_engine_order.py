"""gcodec's collectives never interleave with the engine's or the user's on the same process group
(docs/transports.md, "One order of collectives"): DDP with ``find_unused_parameters=True``,
``static_graph=True``, a SyncBatchNorm-style layer and the user's own collectives while a
compressed all-reduce is in flight, every codec family, real gloo ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

from .procs import checks_of, run_ranks

pytestmark = [pytest.mark.torch]
pytest.importorskip("torch")

SETTINGS = "unused,static,syncnorm,user"


@pytest.mark.parametrize("world", [2, 3])
def test_hook_collectives_never_meet_the_engines(tmp_path: Path, world: int) -> None:
    codes = run_ranks("tests.transport_ranks.engine_order", [str(tmp_path), SETTINGS], world, 420, tmp_path)
    assert codes == [0] * world
    checks = checks_of(tmp_path, range(world))
    # every setting, every codec family, on every rank
    for setting in SETTINGS.split(","):
        for name in ("fp16", "uniform4", "topk", "powersgd"):
            got = [c for c in checks if c["name"].startswith(f"{setting} {name}:")]
            assert len(got) == 4 * world, (setting, name, len(got))


def test_own_group_is_distinct_and_cached_per_group() -> None:
    """Unit check in one process: gcodec's group for a group is another group over the same ranks,
    made once, and made anew after the groups are destroyed."""
    import datetime

    import torch.distributed as dist

    import gcodec.torch.comm as tcomm

    from .procs import free_port

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{free_port()}",
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=37),
    )
    try:
        own = tcomm.own_group(None)
        assert own is not dist.group.WORLD and own is not None
        assert dist.get_process_group_ranks(own) == [0]
        assert tcomm.own_group(None) is own
        assert tcomm.comm_for(None).group is own
        assert own._get_backend(__import__("torch").device("cpu")).options._timeout == datetime.timedelta(seconds=37)
        sub = dist.new_group(ranks=[0])
        assert tcomm.own_group(sub) is not own and tcomm.own_group(sub) is not sub
    finally:
        dist.destroy_process_group()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        again = tcomm.own_group(None)
        assert again is not own and tcomm._alive(again)
    finally:
        dist.destroy_process_group()
