#!/usr/bin/env python3
"""safetensors_check.py OUT REFDIR [--bf16] [--duplicate-tied]

An independent reader of a consolidated checkpoint (only json and struct):
parses the safetensors layout (8-byte little-endian header length, JSON
header, data) and checks every tensor against the reference the test wrote
(REFDIR/NAME.f32: the gathered fp32 master weights, raw little-endian;
REFDIR/tensors.txt: "NAME OWNER|- DIM..." per tensor). fp32 output must be
the reference's bytes; bf16 output its round-to-nearest-even top half,
computed here from the fp32 bits. Without --duplicate-tied a tied tensor
must be absent and named in __metadata__ as "tied:ALIAS" -> owner; with it,
a copy of the owner. Exits 1 with a message on the first difference.
"""
import json
import struct
import sys


def fail(msg):
    print("safetensors_check: " + msg, file=sys.stderr)
    sys.exit(1)


def bf16_rne(f32_bytes):
    out = bytearray()
    for (u,) in struct.iter_unpack("<I", f32_bytes):
        if (u & 0x7F800000) == 0x7F800000 and (u & 0x007FFFFF):
            h = (u >> 16) | 0x0040  # NaN stays NaN (quiet)
        else:
            h = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        out += struct.pack("<H", h & 0xFFFF)
    return bytes(out)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    bf16 = "--bf16" in sys.argv
    dup = "--duplicate-tied" in sys.argv
    out, ref = args
    blob = open(out, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    if n % 8 != 0:
        fail("header length %d is not a multiple of 8" % n)
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    meta = header.pop("__metadata__", {})
    spans = []
    for name, t in header.items():
        b, e = t["data_offsets"]
        spans.append((b, e, name))
    spans.sort()
    pos = 0
    for b, e, name in spans:
        if b != pos:
            fail("tensor %s starts at %d, expected %d (gap or overlap)" % (name, b, pos))
        pos = e
    if pos != len(data):
        fail("data is %d bytes, tensors cover %d" % (len(data), pos))
    checked = 0
    for line in open(ref + "/tensors.txt"):
        parts = line.split()
        name, owner, shape = parts[0], parts[1], [int(x) for x in parts[2:]]
        want = open(ref + "/" + name + ".f32", "rb").read()
        if bf16:
            want = bf16_rne(want)
        if owner != "-" and not dup:
            if name in header:
                fail("tied tensor %s is stored (should be once, as %s)" % (name, owner))
            if meta.get("tied:" + name) != owner:
                fail("__metadata__ does not map tied:%s to %s: %r" % (name, owner, meta))
            continue
        if name not in header:
            fail("tensor %s is missing" % name)
        t = header[name]
        if t["dtype"] != ("BF16" if bf16 else "F32"):
            fail("tensor %s has dtype %s" % (name, t["dtype"]))
        if t["shape"] != shape:
            fail("tensor %s has shape %s, expected %s" % (name, t["shape"], shape))
        b, e = t["data_offsets"]
        if data[b:e] != want:
            fail("tensor %s differs from the gathered master weights" % name)
        checked += 1
    extra = set(header) - {l.split()[0] for l in open(ref + "/tensors.txt")}
    if extra:
        fail("unexpected tensors %s" % sorted(extra))
    print("safetensors_check: %s: %d tensors equal the reference%s" %
          (out, checked, " (bf16 rounding)" if bf16 else ""))


main()
