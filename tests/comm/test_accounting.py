"""Byte accounting: NCCL's (W-1)/W convention, running totals, ratios and the report's text."""

from composer_qsdp.comm import CallTraffic, TrafficCounter, TrafficReport, call_traffic


def test_call_traffic_counts_the_peers_chunks_only():
    traffic = call_traffic(world_size=4, chunk_numel=1000, chunk_wire_bytes=1016, element_size=4)
    assert (traffic.sent, traffic.bf16, traffic.native) == (3 * 1016, 3 * 2000, 3 * 4000)
    assert call_traffic(1, 1000, 1016, 4).sent == 0  # a single rank sends nothing
    two_nodes = call_traffic(world_size=4, chunk_numel=1000, chunk_wire_bytes=1016, element_size=4, off_node_peers=2)
    assert (two_nodes.sent, two_nodes.inter_node) == (3 * 1016, 2 * 1016)  # 2 of the 3 peers are off the node


def test_counters_accumulate_subtract_and_round_trip():
    counter = TrafficCounter()
    for _ in range(3):
        counter.add(call_traffic(2, 1024, 1032, 2))
    assert (counter.calls, counter.sent, counter.bf16, counter.native) == (3, 3096, 6144, 6144)
    assert counter.ratio_vs_bf16 == 6144 / 3096
    counter.add(call_traffic(4, 1024, 1032, 2, off_node_peers=2))
    assert (counter.inter_node, counter.intra_node) == (2064, 3096 + 1032)
    assert (counter - counter).sent == 0 and (counter + counter).calls == 8
    restored = TrafficCounter()
    restored.load_state_dict(counter.state_dict())
    assert restored == counter
    restored.load_state_dict({"calls": 1, "sent": 2, "bf16": 3, "native": 4})  # a checkpoint without hops
    assert restored == TrafficCounter(1, 2, 3, 4, 0, 0)
    assert TrafficCounter().ratio_vs_bf16 == 1.0  # nothing sent: no division by zero


def test_report_totals_and_summary():
    weights, grads = TrafficCounter(2, 1000, 2000, 4000), TrafficCounter(1, 3 * 2**20, 6 * 2**20, 12 * 2**20)
    report = TrafficReport(weights, grads)
    assert report.total == TrafficCounter(3, 1000 + 3 * 2**20, 2000 + 6 * 2**20, 4000 + 12 * 2**20)
    assert (report - report).total.calls == 0
    lines = report.summary().splitlines()
    assert lines[0].startswith("weights (all-gather)") and "1000 B" in lines[0] and "2.00x less" in lines[0]
    assert "3.0 MiB" in lines[1] and "4.00x less" in lines[1] and "1 calls" in lines[1]


def test_calls_served_locally_count_no_bytes():
    counter = TrafficCounter()
    counter.add(call_traffic(2, 1024, 520, 4))
    counter.add(CallTraffic(sent=0, bf16=0, native=0, served_locally=True))
    assert (counter.calls, counter.served_locally, counter.sent, counter.bf16) == (2, 1, 520, 2048)
    assert counter.ratio_vs_bf16 == 2048 / 520  # the ratio of the collective that ran
    assert "(1 served from the replica, no collective)" in TrafficReport(counter, TrafficCounter()).summary()


def test_served_calls_count_what_plain_fsdp_would_have_sent():
    # 2 ranks gathering 1,024 fp32 elements: one 4-bit update (512 + 8 bytes), then 3 calls served from the replica.
    counter = TrafficCounter()
    counter.add(call_traffic(2, 1024, 520, 4))
    for _ in range(3):
        counter.add(CallTraffic(sent=0, bf16=0, native=0, served_locally=True, served_native=4096))
    assert (counter.sent, counter.bf16, counter.native, counter.served_native) == (520, 2048, 4096, 3 * 4096)
    assert counter.ratio_vs_native == 4096 / 520  # unchanged: the collective that ran
    assert counter.plain_fsdp == 4 * 4096 and counter.ratio_vs_plain_fsdp == 4 * 4096 / 520
    assert TrafficCounter().ratio_vs_plain_fsdp == 1.0  # nothing sent: no division by zero
    assert (counter - counter).served_native == 0 and (counter + counter).served_native == 6 * 4096
    line = TrafficReport(counter, TrafficCounter()).summary().splitlines()[0]
    assert "plain FSDP   16.0 KiB (31.51x less)" in line


def test_state_dicts_round_trip_with_and_without_served_native():
    counter = TrafficCounter(calls=4, sent=520, bf16=2048, native=4096, served_locally=3, served_native=12288)
    restored = TrafficCounter()
    restored.load_state_dict(counter.state_dict())
    assert restored == counter and restored.state_dict()["served_native"] == 12288
    old = {k: v for k, v in counter.state_dict().items() if k != "served_native"}  # a checkpoint before the field
    restored.load_state_dict(old)
    assert restored.served_native == 0 and restored.served_locally == 3 and restored.ratio_vs_plain_fsdp == 4096 / 520
    report = TrafficReport(counter, TrafficCounter(2, 100, 400, 800))
    assert TrafficReport.from_state_dict(report.state_dict()) == report
    old_report = {side: {k: v for k, v in state.items() if k != "served_native"}
                  for side, state in report.state_dict().items()}
    loaded = TrafficReport.from_state_dict(old_report)
    assert loaded.weights.served_native == 0 and loaded.total.plain_fsdp == 4096 + 800


def test_summary_names_inter_node_bytes_when_there_are_any():
    report = TrafficReport(TrafficCounter(1, 4096, 8192, 8192, 2048), TrafficCounter())
    assert "inter-node 2.0 KiB" in report.summary().splitlines()[0]
    assert "inter-node" not in report.summary().splitlines()[1]


def test_reports_add_per_side_and_undo_a_subtraction():
    # An evaluation of 2 ranks gathering 1,000 elements in 4-bit codes with 8 fp32 scales: 500 + 32 bytes per chunk.
    evaluation = TrafficReport(TrafficCounter(), TrafficCounter())
    evaluation.weights.add(call_traffic(2, 1000, 1000 * 4 // 8 + 8 * 4, 2))
    training = TrafficReport(TrafficCounter(3, 900, 6000, 6000), TrafficCounter(2, 700, 4000, 8000))
    both = training + evaluation
    assert both.weights == TrafficCounter(4, 900 + 532, 6000 + 2000, 6000 + 2000)
    assert both.grads == training.grads and both.total.sent == 900 + 532 + 700
    assert (both - evaluation).weights == training.weights and (both - training).weights == evaluation.weights


def test_a_summary_of_no_traffic_claims_no_compression():
    """Nothing sent (world size 1, every unit excluded): no ratio is printed, which would read "1.00x less"."""
    summary = TrafficReport(TrafficCounter(), TrafficCounter()).summary()
    assert "x less" not in summary and "x more" not in summary, summary
    assert summary.count("no bytes sent") == 9, summary
