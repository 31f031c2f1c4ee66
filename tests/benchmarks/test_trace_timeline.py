"""benchmarks/trace_timeline.py against timelines worked out by hand."""

from __future__ import annotations

import gzip
import json

import pytest

import trace_timeline

# A step as the traces show one (microseconds, origin 1000): two weight gathers overlapping the forward's matmuls,
# a gap, a gradient all-to-all beside the backward, an optimizer kernel and the loss's all-reduce after it.
KERNELS = [
    ("ncclDevKernel_AllGather_RING_LL(x)", 1000, 5000),
    ("nvjet_sm90_tst_256x128 (matmul)", 4000, 6000),
    ("ncclDevKernel_AllGather_RING_LL(x)", 5000, 9000),
    ("_decode_kernel", 9000, 9500),  # a codec kernel is compute: the GPU works, not the network
    ("nvjet_sm90_tst_128x256 (matmul)", 9500, 13000),
    ("ncclDevKernel_SendRecv(args)", 13000, 16000),
    ("nvjet_sm90_tst_128x256 (matmul)", 12000, 14000),  # overlaps the matmul before it: counted once
    ("multi_tensor_apply_kernel (adamw)", 16000, 17000),
    ("ncclDevKernel_AllReduce_Sum_f32_TREE_LL(x)", 17000, 18000),
]


def test_kinds_follow_the_nccl_kernel_names():
    assert [trace_timeline.kind(name) for name, _, _ in KERNELS] == [
        "weights", "compute", "weights", "compute", "compute", "grads", "compute", "compute", "other_comm"]
    assert trace_timeline.kind("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(x)") == "grads"


def test_phases_cut_the_step_at_each_collective_kinds_first_and_last_kernel():
    result = trace_timeline.timeline(KERNELS, bin_us=5000)
    assert result["span"] == [0.0, 17.0]
    phases = [(p["phase"], p["start"], p["end"], p["compute"], p["weights"], p["grads"]) for p in result["phases"]]
    assert phases == [
        ("weight gathers", 0.0, 8.0, 2.0, 8.0, 0.0),  # matmul 3-5 ms
        ("no weight or gradient collective", 8.0, 12.0, 4.0, 0.0, 0.0),  # decode 8-8.5, matmuls 8.5-12
        ("gradient collectives", 12.0, 15.0, 1.0, 0.0, 3.0),  # the overlapping matmuls end at 13
        ("no weight or gradient collective", 15.0, 17.0, 1.0, 0.0, 0.0),  # the optimizer; the all-reduce is apart
    ]


def test_bins_count_each_kind_once_where_its_kernels_overlap():
    result = trace_timeline.timeline(KERNELS, bin_us=5000)
    bins = [(b["start"], b["compute"], b["weights"], b["grads"], b["other_comm"]) for b in result["bins"]]
    assert bins == [  # (ms) compute 3-5, 8-13, 15-16; weights 0-8; gradients 12-15; the all-reduce 16-17
        (0.0, 2.0, 5.0, 0.0, 0.0),
        (5.0, 2.0, 3.0, 0.0, 0.0),
        (10.0, 3.0, 0.0, 3.0, 0.0),
        (15.0, 1.0, 0.0, 0.0, 1.0),  # the last bin stops at the step's end
    ]


def test_reads_a_gzipped_chrome_trace_and_renders_markdown(tmp_path, capsys):
    events = [{"ph": "X", "cat": "kernel", "name": n, "ts": s, "dur": e - s, "args": {"stream": 7}}
              for n, s, e in KERNELS]
    events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 50000})  # host: not a kernel
    path = tmp_path / "step_profile-rank0.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    assert trace_timeline.read_kernels(path) == [(n, float(s), float(e)) for n, s, e in KERNELS]
    trace_timeline.main([str(path), "--bin-ms", "5"])
    out = capsys.readouterr().out
    assert "GPU time of the traced step: 17.0 ms" in out
    assert "| weight gathers | 0.0 | 8.0 | 2.0 | 8.0 | 0.0 |" in out


def test_bad_input_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no GPU kernel"):
        trace_timeline.timeline([], bin_us=1000)
    with pytest.raises(SystemExit):
        trace_timeline.main([str(tmp_path / "t.json"), "--bin-ms", "0"])
