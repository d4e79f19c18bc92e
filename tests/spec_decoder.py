"""A second decoder, written from specs/ alone (no gcodec import), as a check that the spec is complete.

It implements the container (specs/format.md, with its own msgpack reader and a table CRC32C), the
codecs fp16, bf16 and uniform (nearest rounding, float32 scales), the low-precision float codecs
fp8, mx and nvfp4 (element values from the bit fields of mx.md §3, not from a library),
powersgd with raw or nested (hybrid.md) factors, chunktopk (both index codings, raw or nested
values), dct (its basis table from dct.md §3, its reconstruction from §6), and the header rules (not
the decoding) of topk.
tests/test_spec_decoder.py runs it over the golden vectors: it must decode every valid one bit for bit and refuse every
invalid container vector with the error class the manifest names. It is deliberately plain and
slow; nothing in gcodec may import it.
"""

import struct

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)


class E(Exception):
    def __init__(self, cls, msg=""):
        super().__init__(f"{cls}: {msg}")
        self.cls = cls


POLY = 0x82F63B78
TABLE = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ POLY if c & 1 else c >> 1
    TABLE.append(c)


def crc32c(data, crc=0):
    c = crc ^ 0xFFFFFFFF
    for b in data:
        c = TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283

LIM = dict(
    max_header_bytes=1 << 20,
    max_tensors=65536,
    max_sections=1 << 18,
    max_ndim=32,
    max_elements=1 << 34,
    max_output_bytes=1 << 36,
    max_payload_bytes=1 << 37,
    max_nesting=8,
    max_decode_work=1 << 32,
    max_scratch_bytes=1 << 31,
)


def lim(v, name):
    if v > LIM[name]:
        raise E("LimitExceededError", name)


# ---- msgpack (F8)
class P:
    def __init__(self, b):
        self.b, self.i = b, 0

    def take(self, n):
        if self.i + n > len(self.b):
            raise E("HeaderError", "truncated")
        r = self.b[self.i : self.i + n]
        self.i += n
        return r

    def u(self, n):
        return int.from_bytes(self.take(n), "big")

    def s(self, n):
        try:
            return self.take(n).decode("utf-8")
        except UnicodeDecodeError:
            raise E("HeaderError", "utf8") from None

    def obj(self, depth):
        if depth > LIM["max_nesting"]:
            raise E("LimitExceededError", "nesting")
        t = self.u(1)
        if t <= 0x7F:
            return t
        if t >= 0xE0:
            return t - 256
        if 0x80 <= t <= 0x8F:
            return self.map(t & 15, depth)
        if 0x90 <= t <= 0x9F:
            return self.arr(t & 15, depth)
        if 0xA0 <= t <= 0xBF:
            return self.s(t & 31)
        if t == 0xC0:
            return None
        if t == 0xC2:
            return False
        if t == 0xC3:
            return True
        if t in (0xC4, 0xC5, 0xC6, 0xC7, 0xC8, 0xC9, 0xD4, 0xD5, 0xD6, 0xD7, 0xD8, 0xC1):
            raise E("HeaderError", "bin/ext/c1")
        if t == 0xCA:
            return struct.unpack(">f", self.take(4))[0]
        if t == 0xCB:
            return struct.unpack(">d", self.take(8))[0]
        if t == 0xCC:
            return self.u(1)
        if t == 0xCD:
            return self.u(2)
        if t == 0xCE:
            return self.u(4)
        if t == 0xCF:
            return self.u(8)
        if t == 0xD0:
            return struct.unpack(">b", self.take(1))[0]
        if t == 0xD1:
            return struct.unpack(">h", self.take(2))[0]
        if t == 0xD2:
            return struct.unpack(">i", self.take(4))[0]
        if t == 0xD3:
            return struct.unpack(">q", self.take(8))[0]
        if t == 0xD9:
            return self.s(self.u(1))
        if t == 0xDA:
            return self.s(self.u(2))
        if t == 0xDB:
            return self.s(self.u(4))
        if t == 0xDC:
            return self.arr(self.u(2), depth)
        if t == 0xDD:
            return self.arr(self.u(4), depth)
        if t == 0xDE:
            return self.map(self.u(2), depth)
        if t == 0xDF:
            return self.map(self.u(4), depth)
        raise E("HeaderError", f"type {t:x}")

    def arr(self, n, depth):
        if n > len(self.b) - self.i:
            raise E("HeaderError", "len")
        return [self.obj(depth + 1) for _ in range(n)]

    def map(self, n, depth):
        if n > len(self.b) - self.i:
            raise E("HeaderError", "len")
        d = {}
        for _ in range(n):
            k = self.obj(depth + 1)
            if not isinstance(k, str):
                raise E("HeaderError", "key")
            if k in d:
                raise E("HeaderError", "dup")
            d[k] = self.obj(depth + 1)
        return d


def enc(o):
    if isinstance(o, bool):
        return b"\xc3" if o else b"\xc2"
    if o is None:
        return b"\xc0"
    if isinstance(o, int):
        if 0 <= o <= 127:
            return bytes([o])
        if o >= 0:
            for t, n in ((0xCC, 1), (0xCD, 2), (0xCE, 4), (0xCF, 8)):
                if o < 1 << (8 * n):
                    return bytes([t]) + o.to_bytes(n, "big")
        if o >= -32:
            return bytes([o + 256])
        for t, n in ((0xD0, 1), (0xD1, 2), (0xD2, 4), (0xD3, 8)):
            if o >= -(1 << (8 * n - 1)):
                return bytes([t]) + o.to_bytes(n, "big", signed=True)
    if isinstance(o, float):
        return b"\xcb" + struct.pack(">d", o)
    if isinstance(o, str):
        b = o.encode()
        n = len(b)
        if n < 32:
            return bytes([0xA0 | n]) + b
        if n < 256:
            return b"\xd9" + bytes([n]) + b
        if n < 65536:
            return b"\xda" + n.to_bytes(2, "big") + b
        return b"\xdb" + n.to_bytes(4, "big") + b
    if isinstance(o, list):
        n = len(o)
        h = (
            bytes([0x90 | n])
            if n < 16
            else (b"\xdc" + n.to_bytes(2, "big") if n < 65536 else b"\xdd" + n.to_bytes(4, "big"))
        )
        return h + b"".join(enc(v) for v in o)
    if isinstance(o, dict):
        n = len(o)
        h = (
            bytes([0x80 | n])
            if n < 16
            else (b"\xde" + n.to_bytes(2, "big") if n < 65536 else b"\xdf" + n.to_bytes(4, "big"))
        )
        return h + b"".join(enc(k) + enc(o[k]) for k in sorted(o, key=lambda k: k.encode()))
    raise TypeError(o)


def a8(n):
    return (n + 7) // 8 * 8


def uint(v):
    return type(v) is int and v >= 0


ET = {"u1": 1, "i1": 1, "u2": 2, "i2": 2, "f2": 2, "u4": 4, "i4": 4, "f4": 4, "u8": 8, "i8": 8, "f8": 8}
DT = {"float32": np.float32, "float16": np.float16, "bfloat16": BF16, "float64": np.float64}


def H(c, msg=""):
    if not c:
        raise E("HeaderError", msg)


def read(p, READER_MINOR=0):
    N = len(p)
    lim(N, "max_payload_bytes")
    if N < 16:
        raise E("FormatError", "F1")
    magic, major, minor, flags, hl, hc = struct.unpack_from("<4sBBHII", p)
    if magic != b"GCDC":
        raise E("FormatError", "F2")
    if major != 1:
        raise E("UnsupportedVersionError", "F3")
    if flags & 0xFFFE:
        raise E("UnsupportedFeatureError", "F4")
    if hl == 0:
        raise E("HeaderError", "F5")
    lim(hl, "max_header_bytes")
    if 16 + hl > N:
        raise E("LayoutError", "F6")
    hb = p[16 : 16 + hl]
    if crc32c(p[:12] + hb) != hc:
        raise E("ChecksumError", "F7")
    pr = P(hb)
    h = pr.obj(0)
    if pr.i != len(hb):
        raise E("HeaderError", "trailing")
    strict = minor <= READER_MINOR
    # F9
    H(isinstance(h, dict), "F9a")
    if strict:
        H(set(h) <= {"data_length", "tensors", "features", "meta"}, "F9b")
    H("tensors" in h and "data_length" in h, "F9c")
    H(uint(h["data_length"]), "F9d")
    lim(h["data_length"], "max_payload_bytes")
    if "features" in h:
        f = h["features"]
        H(isinstance(f, list) and f and all(isinstance(x, str) for x in f), "F9e")
    if "meta" in h:
        m = h["meta"]
        H(isinstance(m, dict) and m and all(isinstance(x, str) for x in m.values()), "F9f")
    ts = h["tensors"]
    H(isinstance(ts, list) and ts, "F9g")
    lim(len(ts), "max_tensors")
    for t in ts:
        H(isinstance(t, dict))
        if strict:
            H(set(t) <= {"codec", "version", "dtype", "shape", "params", "sections", "name"}, "keys")
        for k in ("codec", "version", "dtype", "shape", "params", "sections"):
            H(k in t, k)
        H(isinstance(t["codec"], str) and t["codec"], "codec")
        H(uint(t["version"]))
        H(t["dtype"] in DT)
        H(isinstance(t["shape"], list))
        lim(len(t["shape"]), "max_ndim")
        n = 1
        for d in t["shape"]:
            H(uint(d))
            lim(d, "max_elements")
            n *= d
        lim(n, "max_elements")
        t["numel"] = n
        H(isinstance(t["params"], dict))
        H("name" not in t or isinstance(t["name"], str))
        H(isinstance(t["sections"], list))
        lim(len(t["sections"]), "max_sections")
        seen = set()
        for s in t["sections"]:
            H(isinstance(s, list) and len(s) == 4)
            H(isinstance(s[0], str) and s[0] and s[0] not in seen)
            seen.add(s[0])
            H(isinstance(s[1], str) and s[1] in ET)
            H(uint(s[2]))
            H(uint(s[3]))
            if s[3] % ET[s[1]]:
                raise E("LayoutError", "F12 size")
    named = ["name" in t for t in ts]
    H(all(named) or (not any(named) and len(ts) == 1), "names")
    if all(named):
        H(len({t["name"] for t in ts}) == len(ts))
    lim(sum(len(t["sections"]) for t in ts), "max_sections")
    lim(sum(t["numel"] * np.dtype(DT[t["dtype"]]).itemsize for t in ts), "max_output_bytes")
    if h.get("features"):
        raise E("UnsupportedFeatureError", "F10")
    if strict:
        hh = {k: v for k, v in h.items()}
        hh["tensors"] = [{k: v for k, v in t.items() if k != "numel"} for t in ts]
        if enc(hh) != hb:
            raise E("HeaderError", "F11")
    end = 0
    for t in ts:
        for s in t["sections"]:
            if s[2] != a8(end):
                raise E("LayoutError", "F12")
            end = s[2] + s[3]
    if h["data_length"] != a8(end):
        raise E("LayoutError", "F12 dl")
    D = a8(16 + hl)
    L = h["data_length"]
    if N != D + L + 4 * (flags & 1):
        raise E("LayoutError", "F13")
    if flags & 1 and struct.unpack_from("<I", p, N - 4)[0] != crc32c(p[16 + hl : N - 4]):
        raise E("ChecksumError", "F14")
    pad = [(16 + hl, D)]
    end = 0
    for t in ts:
        for s in t["sections"]:
            pad.append((D + end, D + s[2]))
            end = s[2] + s[3]
    pad.append((D + end, D + L))
    for lo, hi in pad:
        if any(p[lo:hi]):
            raise E("LayoutError", "F15")
    # C rules + decode, record by record (format.md §7 "Order")
    out = {}
    work = 0
    for t in ts:
        c = t["codec"]
        if c not in KNOWN:
            raise E("UnknownCodecError", "C0")
        if not 1 <= t["version"] <= 1:
            raise E("UnsupportedVersionError", "C0")
        pm = t["params"]
        n = t["numel"]
        if c == "powersgd":
            want, nest = psgd_header(pm, t["shape"], n, strict)
        elif c == "topk":
            want, nest = topk_header(pm, n, t["dtype"], strict)
        elif c == "chunktopk":
            want, nest = ck_header(pm, n, t["dtype"], strict)
        elif c == "dct":
            want, nest = dct_header(pm, t["shape"], n, strict)
        elif c in LOWP:
            want = lowp_header(c, pm, n, strict)
        else:
            c1_simple(c, pm, strict, "C1")
            want = simple_sections(c, pm, n, "")
        got = t["sections"]
        if [(w[0], w[1]) for w in want] != [(g[0], g[1]) for g in got]:
            raise E("SizeMismatchError", "C2")
        if [w[2] for w in want] != [g[3] for g in got]:
            raise E("SizeMismatchError", "C3")
        lim(scratch_bytes(t), "max_scratch_bytes")  # format.md §9.1: after C3, scratch, then the work sum
        work += decode_work(t)
        lim(work, "max_decode_work")
        sec = {g[0]: p[D + g[2] : D + g[2] + g[3]] for g in got}
        if c == "powersgd":
            y = psgd_decode(pm, nest, t["shape"], n, t["dtype"], sec)
        elif c == "topk":
            raise E("NotImplemented", "topk: only its header rules are implemented here")
        elif c == "chunktopk":
            y = ck_decode(pm, nest, n, t["dtype"], sec)
        elif c == "dct":
            y = dct_decode(pm, nest, t["shape"], n, sec)
        elif c in LOWP:
            y = lowp_decode(c, pm, n, sec)
        else:
            y = simple_decode(c, pm, n, sec, "")
        out[t.get("name")] = y.astype(DT[t["dtype"]]).reshape(t["shape"])
    return out if all(named) else out[None]


def dct_nchunks(pm, shape, n):
    """dct.md §1: chunks (dims 1) or tiles (dims 2) of the coefficient array."""
    C = pm["chunk"]
    if pm["dims"] == 1:
        return -(-n // C)
    s = round(C**0.5)
    rows, cols = dct_view(shape)
    return -(-rows // s) * -(-cols // s)


def decode_work(t):
    """format.md §9.1: numel, numel k for dct, numel rank for a lowrank powersgd record."""
    n, pm = t["numel"], t["params"]
    if t["codec"] == "dct":
        return n * pm["k"]
    if t["codec"] == "powersgd" and pm["mode"] == "lowrank":
        return n * pm["rank"]
    return n


def scratch_bytes(t):
    """format.md §9.1: the codec's part plus the binary32 staging buffer of a 16-bit record."""
    c, n, pm, dt = t["codec"], t["numel"], t["params"], t["dtype"]
    w = 8 if dt == "float64" else 4
    staging = 4 * n if dt in ("float16", "bfloat16") else 0

    def V(cnt):
        if pm.get("values") is not None:
            return w * cnt
        return 4 * cnt if dt in ("float16", "bfloat16") else 0

    if c in ("topk", "threshold"):
        own = 8 * pm["k"] + V(pm["k"])
    elif c == "randomk":
        k = pm["k"]
        own = 8 * k + V(k) + (8 * k + 8 * -(-n // 64) if 0 < k < n else 0)
    elif c == "chunktopk":
        total = sum(kc for _, kc in ck_chunks(pm, n))
        own = 8 * total + V(total)
    elif c == "dct":
        total = dct_nchunks(pm, t["shape"], n) * pm["k"]
        own = (12 if pm["values"] is not None else 8) * total
    elif c == "powersgd" and pm["mode"] == "lowrank":
        m = t["shape"][0]
        q, r = n // m, pm["rank"]
        own = 16 * (m + q) * r + 8 * max(q, 65536)
        own += sum(w * rows * r for role, rows in (("p", m), ("q", q)) if pm[role] is not None)
    else:
        own = 0
    return own + staging


SIMPLE = ("fp16", "bf16", "uniform")
HOSTS = ("topk", "chunktopk", "dct", "threshold", "randomk", "powersgd")
LOWP = ("fp8", "mx", "nvfp4")
KNOWN = (*SIMPLE, "powersgd", "topk", "chunktopk", "dct", *LOWP)
UNIFORM = {
    "bits": lambda v: type(v) is int and v in (8, 4, 2),
    "group_size": lambda v: type(v) is int and 1 <= v <= 1 << 24,
    "rounding": lambda v: v == "nearest",
    "scale_dtype": lambda v: v == "float32",
    "seed": lambda v: type(v) is int,
}


def c1_simple(c, pm, strict, rule):
    """C1 of fp16, bf16 and (deterministic) uniform; ``rule`` is "C1", or "H1" for nested params."""
    if c in ("fp16", "bf16"):
        if strict and pm:
            raise E("HeaderError", rule)
        return
    for k, f in UNIFORM.items():
        if k not in pm or not f(pm[k]):
            raise E("HeaderError", rule + " " + k)
    if strict and set(pm) - set(UNIFORM):
        raise E("HeaderError", rule + " unknown")


def simple_sections(c, pm, n, prefix):
    if c in ("fp16", "bf16"):
        return [(prefix + "data", "u2", 2 * n)]
    G, bits = pm["group_size"], pm["bits"]
    return [(prefix + "scales", "f4", 4 * (-(-n // G))), (prefix + "codes", "u1", -(-n * bits // 8))]


def f16_to_f32(data):
    h16 = np.frombuffer(data, "<u2")
    y = np.empty(len(h16), np.float32)
    for i, hv in enumerate(h16.tolist()):
        sign = -1.0 if hv & 0x8000 else 1.0
        em = hv & 0x7FFF
        if em >= 0x7C00:
            y[i] = np.uint32(((em << 13) + 0x70000000) | ((hv & 0x8000) << 16)).view(np.float32)
        elif em < 0x400:
            y[i] = sign * em * 2.0**-24
        else:
            y[i] = np.uint32(((em << 13) + 0x38000000) | ((hv & 0x8000) << 16)).view(np.float32)
    return y


def simple_decode(c, pm, n, sec, prefix):
    """fp16, bf16 or uniform: n float32 values, value rules (U1, U3, U2) checked."""
    if c == "fp16":
        return f16_to_f32(sec[prefix + "data"])
    if c == "bf16":
        return (np.frombuffer(sec[prefix + "data"], "<u2").astype(np.uint32) << 16).view(np.float32)
    G, bits = pm["group_size"], pm["bits"]
    sc = np.frombuffer(sec[prefix + "scales"], "<f4")
    qmax = (1 << (bits - 1)) - 1
    for s_ in sc:
        if not np.isfinite(s_) or np.signbit(s_) or s_ < 0:
            raise E("PayloadValueError", "U1")
        with np.errstate(over="ignore"):
            if not np.isfinite(np.float32(qmax) * s_):  # U1: the largest code must stay finite
                raise E("PayloadValueError", "U1")
    cb = sec[prefix + "codes"]
    used = n * bits % 8
    if used and cb[-1] >> used:
        raise E("PayloadValueError", "U3")
    y = np.empty(n, np.float32)
    for i in range(n):
        cc = (cb[i * bits // 8] >> ((i % (8 // bits)) * bits)) & ((1 << bits) - 1)
        if cc == 1 << (bits - 1):
            raise E("PayloadValueError", "U2")
        q = cc - (1 << bits) if cc >= 1 << (bits - 1) else cc
        y[i] = np.float32(q) * sc[i // G]
    return y


def nested_decl(raw, strict):
    """hybrid.md §3: H1 (with the nested C0) for one role's declaration."""
    H(isinstance(raw, dict), "H1 map")
    H({"codec", "params", "version"} <= set(raw), "H1 keys")
    if strict:
        H(set(raw) <= {"codec", "params", "version"}, "H1 extra")
    c = raw["codec"]
    H(isinstance(c, str), "H1 codec")
    if c not in (*SIMPLE, *HOSTS):
        raise E("UnknownCodecError", "H1")
    H(c not in HOSTS, "H1 composite")
    H(type(raw["version"]) is int and raw["version"] >= 1, "H1 version")
    if raw["version"] > 1:
        raise E("UnsupportedVersionError", "C0 nested")
    H(isinstance(raw["params"], dict), "H1 params")
    c1_simple(c, raw["params"], strict, "H1")
    return c, raw["params"]


def psgd_header(pm, shape, n, strict):
    """powersgd.md §1-§4, in format.md §7.3's order: H1 (p, then q), C1, P2 / P1; the section list."""
    nest = {role: nested_decl(pm[role], strict) for role in ("p", "q") if pm.get(role) is not None}
    for k in ("mode", "rank", "p", "q"):
        H(k in pm, "C1 " + k)
    if strict:
        H(set(pm) <= {"mode", "rank", "p", "q"}, "C1 unknown")
    H(pm["mode"] in ("lowrank", "fp32", "fp16"), "C1 mode")
    H(type(pm["rank"]) is int and pm["rank"] >= 0, "C1 rank")
    r = pm["rank"]
    if pm["mode"] != "lowrank":
        H(r == 0 and pm["p"] is None and pm["q"] is None, "P2")
        return [("data", "f4" if pm["mode"] == "fp32" else "f2", (4 if pm["mode"] == "fp32" else 2) * n)], nest
    H(len(shape) >= 2 and n > 0, "P1")
    m = shape[0]
    H(1 <= r <= min(m, n // m), "P1 rank")
    want = []
    for role, rows in (("p", m), ("q", n // m)):
        if role in nest:
            want += simple_sections(nest[role][0], nest[role][1], rows * r, role + ".")
        else:
            want.append((role, "f4", 4 * rows * r))
    return want, nest


def topk_header(pm, n, dtype, strict):
    """topk.md §1, §3-§5 and T1, in format.md §7.3's order: H1 (values), C1, T1; the section list."""
    nest = {"values": nested_decl(pm["values"], strict)} if pm.get("values") is not None else {}
    for k in ("k", "index_coding", "index_bytes", "values"):
        H(k in pm, "C1 " + k)
    if strict:
        H(set(pm) <= {"k", "index_coding", "index_bytes", "values"}, "C1 unknown")
    H(type(pm["k"]) is int and pm["k"] >= 0, "C1 k")
    H(pm["index_coding"] in ("delta", "raw"), "C1 index_coding")
    H(type(pm["index_bytes"]) is int and pm["index_bytes"] >= 0, "C1 index_bytes")
    k, ib = pm["k"], pm["index_bytes"]
    H(k <= n, "T1 k")
    if pm["index_coding"] == "raw":
        H(ib == 4 * k and n <= 1 << 32, "T1 raw")
        want = [("indices", "u4", ib)]
    else:
        H(ib <= -(-56 * k // 8) + k // 64 + 1, "T1 delta")
        want = [("index_widths", "u1", -(-k // 64)), ("indices", "u1", ib)]
    if nest:
        want += simple_sections(nest["values"][0], nest["values"][1], k, "values.")
    else:
        et, size = {"float32": ("f4", 4), "float64": ("f8", 8), "float16": ("f2", 2), "bfloat16": ("u2", 2)}[dtype]
        want.append(("values", et, k * size))
    return want, nest


RAW_VALUES = {"float32": ("f4", 4), "float64": ("f8", 8), "float16": ("f2", 2), "bfloat16": ("u2", 2)}


def ck_chunks(pm, n):
    """chunktopk.md §1: (L_c, k_c) of every chunk."""
    C, k = pm["chunk"], pm["k"]
    return [(min(C, n - s), min(k, min(C, n - s))) for s in range(0, n, C)]


def ck_header(pm, n, dtype, strict):
    """chunktopk.md §1, §3-§5 and CK1, in format.md §7.3's order: H1 (values), C1, CK1; the sections."""
    nest = {"values": nested_decl(pm["values"], strict)} if pm.get("values") is not None else {}
    names = ("chunk", "k", "index_coding", "index_bytes", "values")
    for key in names:
        H(key in pm, "C1 " + key)
    if strict:
        H(set(pm) <= set(names), "C1 unknown")
    H(type(pm["chunk"]) is int and 1 <= pm["chunk"] <= 1 << 24, "C1 chunk")
    H(type(pm["k"]) is int and 1 <= pm["k"] <= 1 << 24, "C1 k")
    H(pm["index_coding"] in ("gap", "packed"), "C1 index_coding")
    H(type(pm["index_bytes"]) is int and pm["index_bytes"] >= 0, "C1 index_bytes")
    C, k, ib = pm["chunk"], pm["k"], pm["index_bytes"]
    H(k <= C, "CK1 k")
    ch = ck_chunks(pm, n)
    total = sum(kc for _, kc in ch)
    if pm["index_coding"] == "packed":
        H(ib == -(-total * (C - 1).bit_length() // 8), "CK1 packed")
        want = [("indices", "u1", ib)]
    else:
        H(ib <= sum(-(-kc * (L - 1).bit_length() // 8) for L, kc in ch), "CK1 gap")
        want = [("index_widths", "u1", len(ch)), ("indices", "u1", ib)]
    if nest:
        want += simple_sections(nest["values"][0], nest["values"][1], total, "values.")
    else:
        et, size = RAW_VALUES[dtype]
        want.append(("values", et, total * size))
    return want, nest


def ck_indices(pm, n, sec):
    """chunktopk.md §3 / §4 with CK2 and CK3: the kept elements' tensor indices, chunk after chunk."""
    C, ch = pm["chunk"], ck_chunks(pm, n)
    out = []
    if pm["index_coding"] == "packed":
        W = (C - 1).bit_length()
        data = sec["indices"]
        acc = int.from_bytes(data, "little")
        e = 0
        for c, (L, kc) in enumerate(ch):
            prev = -1
            for _ in range(kc):
                i = (acc >> (e * W)) & ((1 << W) - 1)
                e += 1
                if i >= L or i <= prev:
                    raise E("PayloadValueError", "CK3")
                prev = i
                out.append(c * C + i)
        if acc >> (e * W):
            raise E("PayloadValueError", "CK2 pad")
        return out
    widths, data = sec["index_widths"], sec["indices"]
    for c, (L, _kc) in enumerate(ch):
        if widths[c] > (L - 1).bit_length():
            raise E("PayloadValueError", "CK2 width")
    if sum(-(-kc * widths[c] // 8) for c, (L, kc) in enumerate(ch)) != pm["index_bytes"]:
        raise E("PayloadValueError", "CK2 bytes")
    o = 0
    for c, (L, kc) in enumerate(ch):
        w = widths[c]
        nb = -(-kc * w // 8)
        acc = int.from_bytes(data[o : o + nb], "little")
        o += nb
        gaps = [(acc >> (j * w)) & ((1 << w) - 1) for j in range(kc)]
        if acc >> (kc * w):
            raise E("PayloadValueError", "CK2 pad")
        if max(gaps).bit_length() != w:
            raise E("PayloadValueError", "CK2 minimal")
        i = -1
        for d in gaps:
            i += 1 + d
            if i >= L:
                raise E("PayloadValueError", "CK3")
            out.append(c * C + i)
    return out


def ck_decode(pm, nest, n, dtype, sec):
    """chunktopk.md §5-§6: zeros, then each kept value at its index; CK4 on the values."""
    idx = ck_indices(pm, n, sec)
    if nest:
        v = simple_decode(nest["values"][0], nest["values"][1], len(idx), sec, "values.")
    else:
        et = RAW_VALUES[dtype][0]
        raw = np.frombuffer(sec["values"], "<" + et)
        v = raw.view(BF16) if et == "u2" else raw
    if not np.all(np.isfinite(v.astype(np.float64))):
        raise E("PayloadValueError", "CK4")
    y = np.zeros(n, DT[dtype])
    y[idx] = v.astype(DT[dtype])
    return y


def dct_view(shape):
    """dct.md §1: the matrix view of 2-D tiles, (shape[0], the rest), one row for 0-d and 1-d."""
    if len(shape) < 2:
        return 1, int(np.prod(shape, dtype=np.int64))
    return shape[0], int(np.prod(shape[1:], dtype=np.int64))


def dct_header(pm, shape, n, strict):
    """dct.md §1 and DC1: chunktopk's header over the coefficients (m = nchunks C), C a power of two
    up to 256 (dims 1) or s^2 with s = 2 .. 64 (dims 2), k <= 256, values binary32 for any dtype."""
    H(type(pm.get("dims")) is int and pm["dims"] in (1, 2), "C1 dims")
    sizes = [1 << j for j in range(9)] if pm["dims"] == 1 else [1 << (2 * j) for j in range(1, 7)]
    H(type(pm.get("chunk")) is int and pm["chunk"] in sizes, "C1 chunk")
    H(type(pm.get("k")) is int and 1 <= pm["k"] <= 256, "C1 k")
    C = pm["chunk"]
    if pm["dims"] == 1:
        m = -(-n // C) * C
    else:
        s = round(C**0.5)
        rows, cols = dct_view(shape)
        m = -(-rows // s) * -(-cols // s) * C
    rest = {key: v for key, v in pm.items() if key != "dims"}
    return ck_header(rest, m, "float32", strict)


def dct_basis(C):
    """dct.md §3: a_u cos(pi (2i + 1) u / (2C)) in binary64, rounded once to binary32."""
    import math

    B = np.empty((C, C), np.float32)
    for u in range(C):
        a = math.sqrt((1.0 if u == 0 else 2.0) / C)
        for i in range(C):
            B[u, i] = np.float32(a * math.cos(math.pi * (2 * i + 1) * u / (2 * C)))
    return B


def dct_decode(pm, nest, shape, n, sec):
    """dct.md §6: for each chunk and position, the binary64 sum in increasing coefficient order of the
    exact products B[u][i] v (2-D: the binary32 product B[p][i] B[q][j] times v), rounded once to
    binary32; DC4 and DC5 on the values first."""
    C, k = pm["chunk"], pm["k"]
    if pm["dims"] == 1:
        m = -(-n // C) * C
    else:
        s = round(C**0.5)
        rows, cols = dct_view(shape)
        ntr, ntc = -(-rows // s), -(-cols // s)
        m = ntr * ntc * C
    idx = ck_indices(pm, m, sec)
    if nest:
        v = simple_decode(nest["values"][0], nest["values"][1], len(idx), sec, "values.")
    else:
        v = np.frombuffer(sec["values"], "<f4")
    if not np.all(np.isfinite(v)):
        raise E("PayloadValueError", "DC4")
    if np.any(np.abs(v.astype(np.float64)) >= 2.0**118):
        raise E("PayloadValueError", "DC5")
    if pm["dims"] == 2:
        B = dct_basis(s)
        y = np.zeros(n, np.float32)
        for t in range(ntr * ntc):
            r0, c0 = (t // ntc) * s, (t % ntc) * s
            pqs = [(idx[t * k + j] - t * C) for j in range(k)]
            vs = [float(v[t * k + j]) for j in range(k)]
            for i in range(min(s, rows - r0)):
                for jj in range(min(s, cols - c0)):
                    acc = 0.0
                    for pq, vv in zip(pqs, vs):
                        b = np.float32(B[pq // s, i]) * np.float32(B[pq % s, jj])  # one binary32 rounding
                        acc += float(b) * vv
                    y[(r0 + i) * cols + c0 + jj] = np.float32(acc)
        return y
    B = dct_basis(C)
    y = np.zeros(n, np.float32)
    for c in range(m // C):
        us = [idx[c * k + j] - c * C for j in range(k)]
        vs = [float(v[c * k + j]) for j in range(k)]
        for i in range(min(C, n - c * C)):
            acc = 0.0
            for u, vv in zip(us, vs):
                acc += float(B[u, i]) * vv  # exact: two binary32 factors
            y[c * C + i] = np.float32(acc)
    return y


def psgd_decode(pm, nest, shape, n, dtype, sec):
    if pm["mode"] != "lowrank":
        y = np.frombuffer(sec["data"], "<f4") if pm["mode"] == "fp32" else f16_to_f32(sec["data"])
        if not np.isfinite(y).all():
            raise E("PayloadValueError", "P3")
        return y
    m, r = shape[0], pm["rank"]
    f = {}
    for role, rows in (("p", m), ("q", n // m)):  # the nested codecs' value rules first
        if role in nest:
            f[role] = simple_decode(nest[role][0], nest[role][1], rows * r, sec, role + ".").reshape(rows, r)
    for role, rows in (("p", m), ("q", n // m)):  # then P3: every factor finite, raw or nested
        if role not in nest:
            f[role] = np.frombuffer(sec[role], "<f4").reshape(rows, r)
        if not np.isfinite(f[role]).all():
            raise E("PayloadValueError", "P3")
    if dtype != "float64" and f["p"].size and f["q"].size:  # P4: no entry of P Q^T can overflow binary32
        bound = float(r) * float(np.abs(f["p"]).max()) * float(np.abs(f["q"]).max())
        if bound > 2.0**127:
            raise E("PayloadValueError", "P4")
    # §6: s = +0; s = s + W(P[i,c]) * W(Q[j,c]) for c = 0..r-1 in order (NumPy: no fused operations)
    W = np.float64 if dtype == "float64" else np.float32
    s = np.zeros((m, n // m), W)
    for c in range(r):
        s = s + f["p"][:, c, None].astype(W) * f["q"][None, :, c].astype(W)
    return s.reshape(-1)


# ---- fp8, mx, nvfp4 (specs/codecs/fp8.md, mx.md, nvfp4.md)

# element: (width w, mantissa bits M, emin, emax); mx.md §3
ELEM = {
    "e4m3": (8, 3, -6, 8),
    "e5m2": (8, 2, -14, 15),
    "e3m2": (6, 2, -2, 4),
    "e2m3": (6, 3, 0, 2),
    "e2m1": (4, 1, 0, 2),
    "int8": (8, 0, 0, 0),
}
U64 = lambda v: type(v) is int and 0 <= v < 1 << 64  # noqa: E731
ROUNDING = lambda v: type(v) is str and v in ("nearest", "stochastic")  # noqa: E731
LOWP_PARAMS = {
    "fp8": {
        "element": lambda v: type(v) is str and v in ("e4m3", "e5m2"),
        "group_size": lambda v: type(v) is int and 1 <= v <= 1 << 24,
        "scale_dtype": lambda v: type(v) is str and v in ("float32", "e8m0"),
        "rounding": ROUNDING,
        "seed": U64,
    },
    "mx": {"element": lambda v: type(v) is str and v in ELEM, "rounding": ROUNDING, "seed": U64},
    "nvfp4": {"rounding": ROUNDING, "seed": U64},
}


def lowp_header(c, pm, n, strict):
    """C1 (stream in a stochastic payload's table only: in a nearest one an unknown key, refused under a
    known minor and ignored under a newer one; fp8.md §1) and the section list (§2 of each page)."""
    schema = dict(LOWP_PARAMS[c])
    if pm.get("rounding") == "stochastic":
        schema["stream"] = U64
    for k, f in schema.items():
        if k not in pm or not f(pm[k]):
            raise E("HeaderError", "C1 " + k)
    if strict and set(pm) - set(schema):
        raise E("HeaderError", "C1 unknown")
    if c == "fp8":
        ng = -(-n // pm["group_size"])
        sc = ("scales", "f4", 4 * ng) if pm["scale_dtype"] == "float32" else ("scales", "u1", ng)
        return [sc, ("elements", "u1", n)]
    if c == "mx":
        return [("scales", "u1", -(-n // 32)), ("elements", "u1", -(-n * ELEM[pm["element"]][0] // 8))]
    return [("tensor_scale", "f4", 4), ("scales", "u1", -(-n // 16)), ("elements", "u1", -(-n // 2))]


def elem_value(el, code):
    """mx.md §3: the value of an element code, or None for the codes listed as not finite."""
    w, M, emin, _ = ELEM[el]
    if el == "int8":
        q = code - 256 if code >= 128 else code
        return None if q == -128 else q * 2.0**-6
    sign, c = code >> (w - 1), code & ((1 << (w - 1)) - 1)
    if (el == "e4m3" and c == 0x7F) or (el == "e5m2" and c >= 0x7C):
        return None
    e, f = c >> M, c & ((1 << M) - 1)
    v = f * 2.0 ** (emin - M) if e == 0 else ((1 << M) + f) * 2.0 ** (e - 1 + emin - M)
    return -v if sign else v


def largest(el):
    w = ELEM[el][0]
    return max(v for v in (elem_value(el, c) for c in range(1 << (w - 1))) if v is not None)


def read_elements(b, n, w):
    """mx.md §4: the little-endian bit stream; element i at stream bits i*w .. i*w+w-1."""
    out = []
    for i in range(n):
        p = i * w
        B = b[p // 8] | (b[p // 8 + 1] << 8 if p // 8 + 1 < len(b) else 0)
        out.append((B >> (p % 8)) & ((1 << w) - 1))
    return out


def f32(v):
    return np.float32(v)


def mul32(a, b):
    with np.errstate(over="ignore", under="ignore"):
        return np.float32(np.float32(a) * np.float32(b))


def lowp_decode(c, pm, n, sec):
    el = pm.get("element", "e2m1")
    w, _, _, emax = ELEM[el]
    top = largest(el)
    P = {"fp8": "E", "mx": "MX", "nvfp4": "NV"}[c]
    raw = sec["scales"]
    if c == "nvfp4":  # NV1, NV2
        G = 16
        S = np.frombuffer(sec["tensor_scale"], "<f4")[0]
        if not np.isfinite(S) or np.signbit(S):
            raise E("PayloadValueError", "NV1")
        if n == 0 and S != 0:  # NV4 (NV2 and NV3 hold for 0 elements)
            raise E("PayloadValueError", "NV4")
        scales = []
        for code in raw:
            if code & 0x80 or code == 0x7F:
                raise E("PayloadValueError", "NV2")
            d = mul32(elem_value("e4m3", code), S)
            if not np.isfinite(mul32(6.0, d)):
                raise E("PayloadValueError", "NV2")
            scales.append(d)
    elif c == "fp8" and pm["scale_dtype"] == "float32":  # E1
        G = pm["group_size"]
        scales = list(np.frombuffer(raw, "<f4"))
        for s_ in scales:
            if not np.isfinite(s_) or np.signbit(s_) or not np.isfinite(mul32(top, s_)):
                raise E("PayloadValueError", "E1")
    else:  # E8M0 codes: E1 (fp8) or MX1
        G = 32 if c == "mx" else pm["group_size"]
        scales = []
        for code in raw:
            if code > 254 - emax:
                raise E("PayloadValueError", P + "1")
            scales.append(f32(2.0 ** (code - 127)))
    b = sec["elements"]
    used = n * w % 8
    if used and b[-1] >> used:  # MX2, NV3 (8-bit elements have no padding)
        raise E("PayloadValueError", "MX2" if c == "mx" else "NV3")
    y = np.empty(n, np.float32)
    for i, code in enumerate(read_elements(b, n, w)):
        v = elem_value(el, code)
        if v is None:
            raise E("PayloadValueError", "E2" if c == "fp8" else "MX3")
        y[i] = mul32(v, scales[i // G])
    return y


def same(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    ut = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    fa, fb = a.astype(np.float64), b.astype(np.float64)
    return bool(((a.view(ut) == b.view(ut)) | (np.isnan(fa) & np.isnan(fb) & (np.signbit(fa) == np.signbit(fb)))).all())


def load(root, path, desc):
    if path.endswith(".npz"):
        z = np.load(root + path)
        return {k: (z[k].view(BF16) if v["dtype"] == "bfloat16" else z[k]) for k, v in desc["arrays"].items()}
    a = np.load(root + path)
    return a.view(BF16) if desc["dtype"] == "bfloat16" else a
