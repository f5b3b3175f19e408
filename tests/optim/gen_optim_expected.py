#!/usr/bin/python3
"""gen_optim_expected.py — writes tests/optim/optim_expected.inc, the torch
reference values that tests/optim/optim_ref_test.cc checks optim/optim_ref.c
against.

Regenerate (from the repository root; needs Debian's python3-torch 1.13.1,
i.e. /usr/bin/python3, and nothing else):

    /usr/bin/python3 tests/optim/gen_optim_expected.py > tests/optim/optim_expected.inc

CI never runs this script; the generated .inc is committed. Rerun it only
when the cases or inputs below change, and commit both files together.

What it does: builds one deterministic input set (N = 37 elements, an odd
count, so no vector width divides it; initial params and a different gradient
for each of STEPS = 5 steps, covering +-0, a float32 subnormal, tiny, large
and ordinary magnitudes), runs torch.optim.{AdamW, Adam, SGD} with
foreach=False (the _single_tensor_* code paths) for every case, and records
param and optimizer state after EVERY step as C99 hex-float literals, so the
values are exact.

Each case is run twice, each time in a child process because ATen picks its
CPU kernels once per process:
  - "portable": ATEN_CPU_CAPABILITY=default, ATen's plain scalar kernels.
    These compute `self + alpha * other` with two roundings, as our kernel
    does; the test compares them BITWISE.
  - "native": whatever ATen picks on the generating machine (AVX2 on an
    x86-64 with FMA). There add-with-alpha is vec::fmadd (one rounding), so
    the test compares these within a stated tolerance. The capability used
    is written into the .inc header; on a machine where ATen picks another
    one the native traces may change, and the tolerance still applies.
Run it on x86-64 only: there ATen's "default" kernels are built for the
baseline ISA, which has no FMA, so the portable traces cannot change. (On
aarch64 FMA is baseline and GCC may contract them; the script refuses.)
"""
import json
import os
import platform
import random
import struct
import subprocess
import sys

N = 37
STEPS = 5
SEED = 20240601

# name, optimizer, hyper-parameters (as passed to torch.optim).
CASES = [
    ("adamw_default", "adamw",
     dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)),
    ("adamw_wd01", "adamw",
     dict(lr=0.01, betas=(0.8, 0.99), eps=1e-8, weight_decay=0.1)),
    ("adam_nowd", "adam",
     dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)),
    ("adam_wd005", "adam",
     dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.05)),
    ("sgd_plain", "sgd",
     dict(lr=0.1, momentum=0.0, dampening=0.0, weight_decay=0.0,
          nesterov=False)),
    ("sgd_momentum", "sgd",
     dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01,
          nesterov=False)),
    ("sgd_nesterov", "sgd",
     dict(lr=0.05, momentum=0.9, dampening=0.0, weight_decay=1e-4,
          nesterov=True)),
]


def to_f32(x):
    """Rounds a Python float to the nearest float32 (kept as a Python float)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def random_value(rng, lo_exp, hi_exp):
    sign = -1.0 if rng.random() < 0.5 else 1.0
    return sign * 10.0 ** rng.uniform(lo_exp, hi_exp)


def make_inputs():
    """Initial params (N) and grads (STEPS x N), all exact float32 values.

    Slots 0..9 are fixed special values; the rest are random with magnitudes
    spread over several decades. Large values stay below ~1e12 so that no
    square in exp_avg_sq overflows float32."""
    rng = random.Random(SEED)
    param = [0.0, -0.0, 1e-41, -3e-30, 1.0, -1.0, 1e10, -2.5e9, 0.5, 1e-7]
    param += [random_value(rng, -4, 2) for _ in range(N - len(param))]
    grads = []
    for s in range(STEPS):
        g = [0.0,                                # zero grad on a zero param
             -0.0 if s % 2 else 0.0,             # signed zeros
             1e-40,                              # subnormal: g*g underflows
             random_value(rng, -30, -25),        # tiny
             random_value(rng, -2, 0),
             (-1.0) ** s * 0.25,                 # sign flips every step
             random_value(rng, 10, 12),          # large
             random_value(rng, 3, 5),
             random_value(rng, -8, -6),
             random_value(rng, -1, 1)]
        g += [random_value(rng, -6, 2) for _ in range(N - len(g))]
        g[10 + s] = 0.0                          # a zero in each step
        grads.append(g)
    return ([to_f32(x) for x in param],
            [[to_f32(x) for x in g] for g in grads])


# ---- child: run torch ------------------------------------------------------

def run_case(torch, optimizer, hp, param0, grads):
    p = torch.tensor(param0, dtype=torch.float32, requires_grad=True)
    if optimizer == "adamw":
        opt = torch.optim.AdamW([p], foreach=False, **hp)
        state_keys = ("exp_avg", "exp_avg_sq")
    elif optimizer == "adam":
        opt = torch.optim.Adam([p], foreach=False, **hp)
        state_keys = ("exp_avg", "exp_avg_sq")
    else:
        opt = torch.optim.SGD([p], foreach=False, **hp)
        state_keys = ("momentum_buffer",) if hp["momentum"] != 0 else ()
    trace = {"param": [], "state_a": [], "state_b": []}
    for g in grads:
        p.grad = torch.tensor(g, dtype=torch.float32)
        opt.step()
        trace["param"].append([float(x) for x in p.detach().tolist()])
        for key, slot in zip(state_keys, ("state_a", "state_b")):
            trace[slot].append([float(x) for x in opt.state[p][key].tolist()])
    return trace


def child_main():
    import torch  # imported only here: ATEN_CPU_CAPABILITY is read once
    capability = [line.split(":", 1)[1].strip()
                  for line in torch.__config__.show().splitlines()
                  if "CPU capability usage" in line]
    param0, grads = make_inputs()
    result = {"torch": torch.__version__,
              "capability": capability[0] if capability else "unknown",
              "cases": {}}
    for name, optimizer, hp in CASES:
        result["cases"][name] = run_case(torch, optimizer, hp, param0, grads)
    # JSON writes floats with repr(), which round-trips doubles exactly.
    json.dump(result, sys.stdout)


def run_child(capability):
    env = dict(os.environ)
    env.pop("ATEN_CPU_CAPABILITY", None)
    if capability is not None:
        env["ATEN_CPU_CAPABILITY"] = capability
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child"],
                         env=env, check=True, stdout=subprocess.PIPE).stdout
    return json.loads(out)


# ---- parent: write the .inc -------------------------------------------------

def fhex(x):
    """float32 value -> exact C99 hex-float literal, e.g. 0x1.99999ap-4f."""
    if x != x or x in (float("inf"), float("-inf")):
        raise ValueError("non-finite value %r in a trace" % x)
    assert x == to_f32(x), x
    h = float.hex(x)                 # e.g. '-0x1.99999a0000000p-4'
    mant, exp = h.split("p")
    if "." in mant:
        mant = mant.rstrip("0").rstrip(".")
    return "%sp%sf" % (mant, exp)


def c_array_1d(values, indent):
    lines = []
    for i in range(0, len(values), 4):
        lines.append(indent + ", ".join(fhex(v) for v in values[i:i + 4]) + ",")
    return "\n".join(lines)


def c_array_2d(name, rows, what):
    out = ["static const float %s[ZS_OPTIM_STEPS][ZS_OPTIM_N] = {" % name]
    for s, row in enumerate(rows):
        out.append("  { /* %s after step %d */" % (what, s + 1))
        out.append(c_array_1d(row, "    "))
        out.append("  },")
    out.append("};")
    return "\n".join(out)


def c_double(x):
    return repr(float(x))


def case_row(name, optimizer, hp, have):
    kind = {"adamw": "ZS_OPTIM_ADAMW", "adam": "ZS_OPTIM_ADAM",
            "sgd": "ZS_OPTIM_SGD"}[optimizer]
    if optimizer == "sgd":
        h = (hp["lr"], 0.0, 0.0, 0.0, hp["weight_decay"], hp["momentum"],
             hp["dampening"], int(hp["nesterov"]))
    else:
        h = (hp["lr"], hp["betas"][0], hp["betas"][1], hp["eps"],
             hp["weight_decay"], 0.0, 0.0, 0)

    def trace(kind_):
        ptrs = []
        for slot in ("param", "state_a", "state_b"):
            ptrs.append("%s_%s_%s" % (name, kind_, slot)
                        if (slot in have) else "NULL")
        return "{%s}" % ", ".join(ptrs)

    return ('  {"%s",\n   {%s, %s, %s, %s, %s, %s, %s, %s, %d},\n'
            "   %s,\n   %s},") % (
                name, kind, *(c_double(v) for v in h[:7]), h[7],
                trace("portable"), trace("native"))


def parent_main():
    if platform.machine() != "x86_64":
        sys.exit("run this on x86-64 (see the top of the file)")
    param0, grads = make_inputs()
    portable = run_child("default")
    native = run_child(None)
    if portable["capability"] != "NO AVX":
        sys.exit("ATEN_CPU_CAPABILITY=default was not honoured (got %r)"
                 % portable["capability"])
    out = []
    out.append("/* optim_expected.inc — torch reference values for "
               "tests/optim/optim_ref_test.cc.")
    out.append(" * GENERATED by tests/optim/gen_optim_expected.py; do not edit.")
    out.append(" * Regenerate: /usr/bin/python3 tests/optim/gen_optim_expected.py"
               " > tests/optim/optim_expected.inc")
    out.append(" * (Debian's python3-torch 1.13.1 reports itself as 1.13.0a0.)")
    out.append(" * torch %s; portable traces: CPU capability %s; native "
               "traces: CPU capability %s." % (
                   portable["torch"], portable["capability"],
                   native["capability"]))
    out.append(" * Element counts: every array is ZS_OPTIM_N floats per step.")
    out.append(" * Include <zeroshard.h> first (zs_optimizer_config). */")
    out.append("")
    out.append("#define ZS_OPTIM_N %d" % N)
    out.append("#define ZS_OPTIM_STEPS %d" % STEPS)
    out.append("")
    out.append("/* One optimizer run: values after each step, (STEPS, N). "
               "state_a is exp_avg or")
    out.append(" * the momentum buffer, state_b exp_avg_sq; NULL where the "
               "optimizer has none. */")
    out.append("struct zs_optim_trace {")
    out.append("  const float (*param)[ZS_OPTIM_N];")
    out.append("  const float (*state_a)[ZS_OPTIM_N];")
    out.append("  const float (*state_b)[ZS_OPTIM_N];")
    out.append("};")
    out.append("")
    out.append("/* hp holds the torch.optim arguments (zeroshard.h's "
               "zs_optimizer_config;")
    out.append(" * fields an optimizer does not use are 0). */")
    out.append("struct zs_optim_case {")
    out.append("  const char* name;")
    out.append("  zs_optimizer_config hp;")
    out.append("  struct zs_optim_trace portable; /* ATEN_CPU_CAPABILITY="
               "default */")
    out.append("  struct zs_optim_trace native;   /* ATen's own choice (see "
               "top) */")
    out.append("};")
    out.append("")
    out.append("/* Inputs shared by every case. */")
    out.append("static const float zs_optim_param0[ZS_OPTIM_N] = {")
    out.append(c_array_1d(param0, "  "))
    out.append("};")
    out.append("")
    out.append(c_array_2d("zs_optim_grads", grads, "grad"
                          ).replace("after step", "of step"))
    rows = []
    for name, optimizer, hp in CASES:
        have = set()
        for kind_, res in (("portable", portable), ("native", native)):
            trace = res["cases"][name]
            for slot in ("param", "state_a", "state_b"):
                if not trace[slot]:
                    continue
                have.add(slot)
                out.append("")
                out.append(c_array_2d("%s_%s_%s" % (name, kind_, slot),
                                      trace[slot], slot))
        rows.append(case_row(name, optimizer, hp, have))
    out.append("")
    out.append("static const struct zs_optim_case zs_optim_cases[] = {")
    out.extend(rows)
    out.append("};")
    print("\n".join(out))


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        child_main()
    else:
        parent_main()
