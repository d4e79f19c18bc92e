"""One gloo rank in the test's own process, for tests of what an engine does on its own rank
(its plan, its set-up, its warnings): ``from .gloo import one_rank`` and take ``one_rank`` as a
fixture."""

from __future__ import annotations

import datetime
import gc
from collections.abc import Iterator

import pytest

from .procs import free_port


@pytest.fixture()
def one_rank() -> Iterator[None]:
    import torch.distributed as dist

    import gcodec.torch

    gc.collect()  # hook states other tests left behind watch optimizers until collected
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{free_port()}",
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=60),  # one rank waits for no peer: only a hang reaches it
    )
    try:
        yield
    finally:
        gcodec.torch.synchronize()  # the gcodec queue's work on this group ends before the group
        dist.destroy_process_group()
