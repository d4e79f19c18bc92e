"""torch tensors in, torch tensors out, without copies: encode, decode(out=), payload tensors, and
error-feedback state that torch's default loader (``weights_only=True``) accepts."""

from __future__ import annotations

import io

import numpy as np
import pytest

import gcodec

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_decode_into_a_tensor_returns_that_tensor(dtype):
    x = torch.randn(37, 5, generator=torch.Generator().manual_seed(0)).to(dtype)
    buf = gcodec.get_codec("uniform", bits=8).encode(x)
    want = gcodec.decode(buf)  # numpy, the tensor's dtype
    out = torch.empty_like(x)
    got = gcodec.decode(buf, out=out)
    assert got is out
    from gcodec.torch import to_numpy

    np.testing.assert_array_equal(to_numpy(out), want)
    # accumulate adds into the tensor's memory
    gcodec.decode(buf, out=out, accumulate=True)
    np.testing.assert_array_equal(to_numpy(out).astype(np.float64), (want.astype(np.float64) * 2).astype(want.dtype))


def test_decode_into_a_strided_tensor_is_refused():
    buf = gcodec.get_codec("fp16").encode(np.ones((4, 4), np.float32))
    out = torch.empty(4, 8)[:, ::2]
    with pytest.raises(gcodec.ConfigError, match="contiguous"):
        gcodec.decode(buf, out=out)


def test_a_uint8_payload_tensor_decodes_and_validates():
    x = np.linspace(-1, 1, 100, dtype=np.float32)
    buf = bytes(gcodec.get_codec("topk", ratio=0.1).encode(x))
    t = torch.frombuffer(bytearray(buf), dtype=torch.uint8)  # what a torch collective delivers
    assert gcodec.validate(t).codec == "topk"
    np.testing.assert_array_equal(gcodec.decode(t), gcodec.decode(buf))


def test_a_decoded_bfloat16_array_reaches_torch():
    from gcodec.torch import to_tensor

    x = torch.randn(10).to(torch.bfloat16)
    y = gcodec.decode(gcodec.get_codec("bf16").encode(x))
    t = to_tensor(y)
    assert t.dtype == torch.bfloat16 and torch.equal(t, x)


def test_error_feedback_state_loads_with_torch_default_loader():
    codec = gcodec.get_codec("uniform", bits=4, rounding="stochastic", seed=3)
    ef = gcodec.ErrorFeedback(codec)
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(64, 8, generator=g) for _ in range(4)]
    for x in xs[:3]:
        ef.encode(x, key="w")
    state = ef.state_dict()
    assert isinstance(state["residuals"]["w"], torch.Tensor)  # tensors in, tensors out
    f = io.BytesIO()
    torch.save(state, f)
    f.seek(0)
    loaded = torch.load(f, weights_only=True)
    ef2 = gcodec.ErrorFeedback(codec)
    ef2.load_state_dict(loaded)
    assert bytes(ef2.encode(xs[3], key="w")) == bytes(ef.encode(xs[3], key="w"))
    assert isinstance(gcodec.ErrorFeedback(codec).state_dict(tensors=False)["residuals"], dict)
