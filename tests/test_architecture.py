"""The backend seam, array intake, caller-owned state and send buffers (docs/architecture.md)."""

from __future__ import annotations

import numpy as np
import pytest

import gcodec
from gcodec import kernels
from gcodec.arrays import backend_of, intake

X = np.linspace(-1, 1, 1000, dtype=np.float32)


class FakeDeviceArray:
    """Looks like a CUDA array to gcodec (``__cuda_array_interface__``) and counts host copies."""

    def __init__(self) -> None:
        self.shape = (4, 3)
        self.dtype = np.dtype(np.float32)
        self.copies = 0
        self.__cuda_array_interface__ = {"shape": self.shape, "typestr": "<f4", "data": (0, False), "version": 3}

    def __array__(self, *a, **k):  # a host copy would go through here
        self.copies += 1
        return np.zeros(self.shape, np.float32)


def test_host_arrays_use_the_cpu_kernels():
    assert backend_of(X) == "cpu" and kernels.of(X) is kernels.get("cpu")
    for name in ("cast", "quant", "sign", "sparse", "lowrank", "philox", "feedback", "threads_for"):
        assert hasattr(kernels.get("cpu"), name), name


def test_intake_keeps_host_arrays_in_place():
    a = np.zeros((8, 8), np.float32)
    got = intake(a)
    assert got.backend == "cpu" and np.shares_memory(got.array, a)
    strided = a[:, ::2]
    got = intake(strided)  # a strided array is the one case that is copied (to C order)
    assert got.array.flags.c_contiguous and not np.shares_memory(got.array, a)


def test_device_arrays_are_recognised_never_copied_and_refused_without_a_backend():
    d = FakeDeviceArray()
    got = intake(d)
    assert got.backend == "cuda" and got.array is d and got.shape == (4, 3) and d.copies == 0
    with pytest.raises(gcodec.ConfigError, match="no kernels for 'cuda'"):
        gcodec.get_codec("fp16").encode(d)
    assert d.copies == 0  # refused, not silently copied to the host


def test_unknown_backend_is_a_config_error():
    with pytest.raises(gcodec.ConfigError, match="backends"):
        kernels.get("tpu")


@pytest.mark.parametrize("cid", ["fp16", "uniform", "topk", "sign"])
def test_encode_into_a_send_buffer_is_byte_identical_and_reusable(cid):
    codec = gcodec.get_codec(cid)
    want = bytes(codec.encode(X))
    buf = bytearray(len(want) + 100)
    for _ in range(2):  # the same buffer, step after step
        got = gcodec.encode(X, codec, out=buf)
        assert bytes(got) == want and len(got) == len(want)
        assert np.shares_memory(np.frombuffer(got, np.uint8), np.frombuffer(buf, np.uint8))
    arr = np.empty(len(want), np.uint8)
    assert bytes(codec.encode(X, out=arr)) == want


def test_encode_into_a_buffer_that_is_too_small_or_read_only():
    codec = gcodec.get_codec("fp16")
    n = len(codec.encode(X))
    with pytest.raises(gcodec.ConfigError, match=f"needs {n}"):
        gcodec.encode(X, codec, out=bytearray(n - 1))
    with pytest.raises(gcodec.ConfigError, match="writable"):
        gcodec.encode(X, codec, out=bytes(n))
    with pytest.raises(gcodec.ConfigError, match="writable"):
        gcodec.encode(X, codec, out=np.zeros(n, np.float32))


def test_codecs_hold_no_state_and_equal_codecs_keep_separate_default_states():
    a = gcodec.get_codec("qsgd", seed=1)
    b = gcodec.get_codec("qsgd", seed=1)
    assert a == b and hash(a) == hash(b)
    a.encode(X)
    assert a.default_state().next_stream() == 1 and b.default_state().next_stream() == 0
    assert a.default_state() is a.default_state()


def test_explicit_state_drives_the_stream_and_the_warm_start():
    st = gcodec.CodecState()
    p = gcodec.get_codec("powersgd", rank=2)
    m = np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32)
    gcodec.encode(m, p, key="w", state=st)
    assert st.get_array("q", "w").shape == (16, 2)  # the warm-start Q went to the caller's state
    assert p.default_state().get_array("q", "w") is None
    first = gcodec.encode(m, p, key="w", state=gcodec.CodecState())
    again = gcodec.encode(m, p, key="w", state=gcodec.CodecState())
    assert bytes(first) == bytes(again)  # same state in, same bytes out


def test_nested_codecs_keep_their_own_state():
    c = gcodec.get_codec("topk", ratio=0.1, values={"id": "uniform", "bits": 4, "rounding": "stochastic"})
    st = gcodec.CodecState()
    for i in range(3):
        info = gcodec.validate(gcodec.encode(X, c, key="w", state=st))
        assert info.params["values"]["params"]["stream"] == i
    assert st.child("values").next_stream("w/values") == 3 and st.next_stream("w") == 0


# ---- codec capabilities: what the transports ask a codec instead of comparing ids ------------------
def test_no_module_outside_the_codecs_compares_codec_ids():
    """Transports, engines, advise and the demo ask a codec's capabilities (``low_rank``,
    ``fixed_size``, ``values_dtype``, ``compresses``, ``compression_rate``); an id comparison there
    would silently leave a new codec with the same capability out."""
    import re
    from pathlib import Path

    pkg = Path(gcodec.__file__).parent
    pattern = re.compile(
        r"""codec_id\s*(==|!=|in\b|not in\b)|\[["']id["']\]\s*(==|!=|in\b)|get\(["']id["']\)\s*(==|!=)"""
    )
    found = [
        f"{p.relative_to(pkg)}:{i}: {line.strip()}"
        for p in sorted(pkg.rglob("*.py"))
        if "codecs" not in p.relative_to(pkg).parts
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("cid", [c for c in gcodec.list_codecs() if gcodec.codec_class(c).fixed_size])
def test_a_fixed_size_codec_writes_the_same_length_whatever_the_values(cid):
    codec = gcodec.get_codec(cid)
    for shape in [(1,), (7,), (33, 5), (1000,)]:
        rng = np.random.default_rng(len(shape))
        inputs = [np.zeros(shape, np.float32), rng.standard_normal(shape).astype(np.float32) * 1e3]
        inputs.append(np.where(rng.random(shape) < 0.5, 0.0, 1e-30).astype(np.float32))
        sizes = {len(codec.encode(x, step=0)) for x in inputs}
        assert len(sizes) == 1, (shape, sizes)


_SHAPED = [{"id": c} for c in gcodec.list_codecs()] + [{"id": "dct", "dims": 2, "chunk": 16, "k": 3}]


@pytest.mark.parametrize("cfg", _SHAPED, ids=lambda c: "-".join(map(str, c.values())))
def test_reads_shape_says_whether_the_shape_changes_what_decodes(cfg):
    """The engines join tensors of one codec into one flat group only when ``reads_shape`` is
    False: then a tensor must decode exactly as its flattening does; a codec that says True must
    decode some tensor differently from its flattening (or it would be kept out of groups for nothing)."""
    codec = gcodec.get_codec(cfg)
    x = np.random.default_rng(5).standard_normal((24, 16)).astype(np.float32)
    shaped = gcodec.decode(codec.encode(x, step=3)).reshape(-1)
    flat = gcodec.decode(codec.encode(x.reshape(-1), step=3))
    same = np.array_equal(shaped.view(np.uint32), flat.view(np.uint32))
    assert same != codec.reads_shape, (cfg, codec.reads_shape)


_UNITS = [{"id": c} for c in gcodec.list_codecs()] + [
    {"id": "uniform", "bits": 4, "rounding": "stochastic"},
    {"id": "fp8", "rounding": "stochastic"},
    {"id": "sign", "group_size": 0},
    {"id": "chunktopk", "chunk": 256, "k": 8},
    {"id": "chunktopk", "chunk": 256, "k": 8, "values": {"id": "uniform", "bits": 2, "group_size": 8}},
    {"id": "chunktopk", "chunk": 256, "k": 8, "values": {"id": "uniform", "bits": 2, "group_size": 3}},
    {"id": "threshold", "threshold": 0.5, "values": "fp16"},
    {"id": "threshold", "threshold": 0.5, "values": {"id": "uniform", "bits": 8}},
    {"id": "topk", "ratio": 0.05, "values": "bf16"},
    {"id": "dct", "dims": 2, "chunk": 16, "k": 3},
]


@pytest.mark.parametrize("cfg", _UNITS, ids=lambda c: "-".join(map(str, c.values())))
def test_encoding_unit_says_which_neighbours_an_encoding_depends_on(cfg):
    """The engines join tensors into one flat group only where ``encoding_unit`` promises that no
    tensor's encoding changes with the tensors beside it (a DDP job resumed with other buckets then
    continues bit for bit). A codec that promises a unit g must decode a tensor of a multiple of g
    elements the same, to the bit, alone and after another such tensor of very different values;
    a built-in codec that promises nothing (None) must have some tensor whose values change with
    a neighbour (or the promise was withheld for nothing). Codecs that read shapes never join."""
    codec = gcodec.get_codec(cfg)
    unit = codec.encoding_unit
    if codec.reads_shape:
        assert unit is None, cfg
        return
    rng = np.random.default_rng(11)
    g = unit or 64
    a = (rng.standard_normal(g * 37) * 100).astype(np.float32)  # larger: a shared scale or selection would show
    b = rng.standard_normal(g * 53).astype(np.float32)
    joined = gcodec.decode(codec.encode(np.concatenate([a, b]), step=3))[a.size :]
    alone = gcodec.decode(codec.encode(b, step=3))
    same = np.array_equal(joined.view(np.uint32), alone.view(np.uint32))
    if unit is not None:
        assert same, (cfg, unit)
        if unit == 1:  # element by element: any neighbour, of any length
            odd = gcodec.decode(codec.encode(np.concatenate([a[:7], b]), step=3))[7:]
            assert np.array_equal(odd.view(np.uint32), alone.view(np.uint32)), cfg
    else:
        assert not same, (cfg, "encoding_unit None, yet b encodes alike beside a")


@pytest.mark.parametrize("cid", [c for c in gcodec.list_codecs() if gcodec.get_codec(c).values_dtype is not None])
def test_a_values_section_encodes_and_decodes_alone_as_in_a_payload(cid):
    from gcodec.aggregate import summable_values

    codec = gcodec.get_codec(cid)
    x = np.random.default_rng(1).standard_normal(301).astype(np.float32)
    vals = np.empty(301, codec.values_dtype)
    codec.encode_values(x, vals)
    payload = codec.encode(x)
    assert vals.tobytes() == summable_values(bytearray(payload)).tobytes()
    out = np.zeros(301, np.float32)
    codec.decode_values(vals, out, False)
    np.testing.assert_array_equal(out, gcodec.decode(payload))
    codec.decode_values(vals, out, True)
    np.testing.assert_array_equal(out, 2 * gcodec.decode(payload))


def test_auto_mode_keeps_a_codec_that_reads_shapes_out_of_two_phase():
    from gcodec.transports.state import resolve_mode

    tiles, flat = gcodec.get_codec(_SHAPED[-1]), gcodec.get_codec("dct")
    assert resolve_mode(tiles, "auto", 8) == "gather"  # two-phase owners would see flat chunks
    assert resolve_mode(flat, "auto", 8) == "two_phase"
    with pytest.raises(gcodec.ConfigError, match="reads the tensor's shape"):
        resolve_mode(tiles, "two_phase", 4)


def test_no_transport_or_engine_module_names_a_codec():
    """The transports and the engine adapters ask a codec what it can do and take their default
    codec from :mod:`gcodec.policy`; a codec id or a protocol named after one (the old mode
    ``powersgd``, now ``lowrank``) written there would tie them to one codec. Every string
    constant of those modules is checked against every registered codec id."""
    import ast
    from pathlib import Path

    pkg = Path(gcodec.__file__).parent
    ids = set(gcodec.list_codecs())
    modules = [*sorted((pkg / "transports").glob("*.py")), pkg / "mpi.py"]
    modules += [pkg / "torch" / n for n in ("__init__.py", "comm.py", "engine.py", "hook.py", "fsdp.py", "diloco.py")]
    found = []
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in ids:
                found.append(f"{path.relative_to(pkg)}:{node.lineno}: {node.value!r}")
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("codecs."):
                if node.module.split(".")[-1] not in ("state", "base", "registry"):
                    found.append(f"{path.relative_to(pkg)}:{node.lineno}: imports {node.module}")
    assert not found, "\n".join(found)


def test_the_old_mode_name_warns_and_means_the_low_rank_protocol():
    from gcodec.transports.state import MODES, TransportState, check_mode, resolve_mode

    assert "powersgd" not in MODES and "lowrank" in MODES
    with pytest.warns(DeprecationWarning, match="mode 'powersgd' is renamed 'lowrank'"):
        assert check_mode("powersgd") == "lowrank"
    with pytest.warns(DeprecationWarning):
        assert TransportState("powersgd", mode="powersgd").mode == "lowrank"
    assert resolve_mode(gcodec.get_codec("powersgd", rank=2), "auto", 4) == "lowrank"
    with pytest.raises(gcodec.ConfigError, match="mode 'lowrank' needs a codec that declares low_rank"):
        resolve_mode(gcodec.get_codec("uniform"), "lowrank", 2)
    with pytest.raises(gcodec.ConfigError, match="is not one of"):
        check_mode("ring")
