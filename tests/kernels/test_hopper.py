"""``hopper.py``'s sm_90 compile: the opcode histogram accounts for every SASS instruction that the resource report
counts, and for its shuffles, shared-memory accesses and barriers."""

from __future__ import annotations

import re

import torch
from hopper import compile_report

from composer_qsdp.kernels import hadamard as kernels


def test_opcode_histogram_adds_up_to_the_resource_reports_instructions():
    bucket = 1024
    g, warps = kernels._launch_shape(torch.device("cuda"), bucket, 1 << 20, None, None)
    variant = {"name": "hadamard", "module": kernels.__name__, "kernel": "_hadamard_kernel", "num_warps": warps,
               "types": {"x_ptr": "*bf16", "y_ptr": "*fp32", "scale": "fp32"},
               "constants": {"B": bucket, "LOG_B": bucket.bit_length() - 1, "G": g, "EMULATE_BF16_RNE": False}}
    report = compile_report([variant])
    usage = dict(re.findall(r"(\w+):(\d+)", report["usage"]["hadamard"]))
    counts = report["opcodes"]["hadamard"]
    assert "NOP" not in counts and all(op.isupper() and "." not in op for op in counts)
    assert sum(counts.values()) == int(usage["SASS"]) > 0
    for kind in ("SHFL", "LDS", "STS", "BAR"):
        assert counts.get(kind, 0) == int(usage[kind]), kind
    assert counts["FADD"] > 0  # the butterflies' sums and differences
