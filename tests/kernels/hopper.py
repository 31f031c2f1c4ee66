"""Compile Triton kernels for Hopper (sm_90) on a machine without a GPU and report their resource usage.

The interpreter accepts code the compiler rejects, and cannot show register spills, so kernel tests also
compile their launch configurations through Triton's bundled ptxas. The test process has the kernels
decorated for the interpreter (``TRITON_INTERPRET=1`` is set before they are imported), so compilation runs
in a fresh subprocess without it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

__all__ = ["assert_no_spills_and_exact", "compile_report", "resource_usage"]

_SCRIPT = """
import collections, importlib, inspect, json, os, re, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

report, histograms = {}, {}
for v in json.loads(sys.stdin.read()):
    kernel = getattr(importlib.import_module(v["module"]), v["kernel"])
    for name, value in v["constants"].items():  # "jit:<module>:<function>": a jit function passed as a constexpr
        if isinstance(value, str) and value.startswith("jit:"):
            module, function = value[4:].split(":")
            v["constants"][name] = getattr(importlib.import_module(module), function)
    for p in kernel.params:  # a constexpr the variant leaves out takes its default, as at a launch
        if p.is_constexpr and p.name not in v["constants"] and p.default is not inspect.Parameter.empty:
            v["constants"][p.name] = p.default
    sig = {p.name: "constexpr" if p.is_constexpr else v["types"].get(p.name, "i32") for p in kernel.params}
    divisible = set(v.get("divisible", ()))
    aligned = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(kernel.params)
               if p.name.endswith("ptr") or p.name in divisible}
    compiled = triton.compile(ASTSource(kernel, sig, v["constants"], aligned), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": v["num_warps"], "enable_fp_fusion": False})
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(compiled.asm["cubin"])
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    os.unlink(f.name)
    # One SASS instruction per "/*<address>*/ <opcode> ...;" line; the NOPs padding the end never run.
    opcodes = [op for op in re.findall(r"/\\*[0-9a-f]{4,}\\*/\\s+(?:@!?U?P\\w+\\s+)?([A-Z][A-Z0-9_.]*)", sass)
               if op != "NOP"]
    histograms[v["name"]] = dict(collections.Counter(op.split(".")[0] for op in opcodes))
    counts = {kind: histograms[v["name"]].get(kind, 0) for kind in ("SHFL", "LDS", "STS", "BAR")}
    # fp32 instructions that are not exactly rounded: approximate division, reciprocal, root, ...; contracted fma.
    inexact = sorted(set(re.findall(
        r"\\b(?:div[.](?:full|approx)|(?:rcp|sqrt|rsqrt|ex2|lg2|sin|cos|tanh)[.]approx"
        r"|(?:fma|mad)[.][\\w.]*f32)[\\w.]*",
        compiled.asm["ptx"])))
    # Triton's shared memory is dynamic, which cuobjdump's SHARED (static) leaves out.
    report[v["name"]] = " ".join(line.strip() for line in usage.splitlines() if "REG:" in line) + (
        f" SMEM:{compiled.metadata.shared} SASS:{len(opcodes)} "
        + " ".join(f"{kind}:{count}" for kind, count in counts.items())
        + f" CONVERT_LAYOUT:{compiled.asm['ttgir'].count('ttg.convert_layout')}"
        + " INEXACT:" + (",".join(inexact) or "none"))
print(json.dumps({"usage": report, "opcodes": histograms}))
"""


def resource_usage(variants: list[dict]) -> dict[str, str]:
    """Compile each variant for sm_90; return ``{name: "REG:<n> STACK:<bytes> ... LOCAL:<bytes> ... SMEM:<bytes>
    SASS:<n> SHFL:<n> LDS:<n> STS:<n> BAR:<n> CONVERT_LAYOUT:<n> INEXACT:<ops>"}``, ``SMEM`` the shared memory
    Triton allocates at launch (layout conversions, reductions), ``SASS`` the kernel's SASS instructions
    (``cuobjdump -sass``, end padding ``NOP`` excluded; the kernels have no loops, so this is also what one thread
    issues, predicated-off instructions included), then the shuffles, shared loads and stores and barriers among them,
    ``CONVERT_LAYOUT`` the layout conversions in the TTGIR,
    ``<ops>`` the PTX instructions that are not exactly rounded fp32 operations (``div.full``, ``rcp.approx``,
    ``sqrt.approx``, a contracted ``fma.rn.f32``, ...) or ``none``: the kernels must match their torch references
    bit for bit.

    Args:
        variants: dicts with ``name``, ``module`` (importable path), ``kernel`` (a ``@triton.jit`` function's
            name in it), ``types`` (Triton types of the pointer and float arguments, e.g. ``{"x_ptr": "*bf16"}``;
            the others are ``i32``), ``constants`` (the constexpr arguments; a jit function as the string
            ``"jit:<module>:<function>"``), ``num_warps`` and optionally
            ``divisible`` (names of integer arguments known to be multiples of 16, as Triton specializes them at a
            launch). Pointers are compiled as 16-byte aligned, as torch allocations are.
    """
    return compile_report(variants)["usage"]


def compile_report(variants: list[dict]) -> dict[str, dict]:
    """Compile each variant (as :func:`resource_usage` takes them) for sm_90 once; return ``{"usage": {name:
    <resource_usage's string>}, "opcodes": {name: {opcode: count}}}``, the latter the kernel's SASS instructions by
    opcode without its modifiers (``FADD``, ``LOP3``, ``SHFL``, ...; end padding ``NOP`` excluded): what one thread
    issues, the kernels having no loops."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", _SCRIPT], input=json.dumps(variants), capture_output=True,
                         text=True, env=env, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def assert_no_spills_and_exact(variants: list[dict]) -> None:
    """Compile ``variants`` (as :func:`resource_usage` takes them) and assert that every one compiled, uses no
    stack or local memory (no register spills) and has no inexact PTX, so it stays bit-exact against the torch
    reference."""
    report = resource_usage(variants)
    assert len(report) == len(variants)
    for variant, usage in report.items():
        assert "REG:" in usage and "STACK:0" in usage and "LOCAL:0" in usage, f"{variant}: {usage}"
        assert usage.endswith("INEXACT:none"), f"{variant}: {usage}"
