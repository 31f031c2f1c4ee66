"""The two-level reduce-scatter (ZeRO++ qgZ, SDP4Bit TLq-HS) on real process groups, against references.

References, all computed here in one process from the definition of the algorithm: the two hops with the same
codecs and seeds (the collective must reproduce them bit for bit), the same with the Hadamard transform applied
and undone around every hop (SDP4Bit's unsimplified Algorithm 3: equal within float tolerance), the plain
``reduce_scatter_tensor`` (passthrough codecs must give its result and chunk order) and the flat quantized
collective (a single-hop split must give it bit for bit). One spawn per (backend, world size): gloo at 4 and (slow)
8 ranks, where world 8 checks 2 nodes x 4, 4 nodes x 2 and per-rank subgroups; NCCL (marked ``gpu``) at 2 ranks,
which have single-hop splits only, and at 4 (2 virtual nodes x 2). On CUDA the codecs run their Triton kernels,
whose results equal the torch reference's bit for bit, so the references are computed on the CPU.
"""

from __future__ import annotations

import zlib

import pytest
import torch
import torch.distributed as dist
from dist_spawn import RankInfo, run_ranks, skip_unless_backend

from composer_qsdp.comm import (NodeGroups, Topology, mix_seed, node_groups, quantized_reduce_scatter,
                                two_level_reduce_scatter)
from composer_qsdp.comm.node_groups import chunk_table
from composer_qsdp.comm.two_level import INTER_HOP
from composer_qsdp.quant import hadamard_rows, make_codec

SEED = 99
N = 100  # elements per chunk: not a multiple of the buckets or of the rotation block
OPS = {"SUM": dist.ReduceOp.SUM, "AVG": dist.ReduceOp.AVG}
# name -> (intra codec, inter codec, rotation block, dtype, op). Stochastic min-max checks the hops' noise keys.
CASES = {
    "qgz_sum": (("symmetric", 4, 64), ("symmetric", 4, 64), None, torch.float32, "SUM"),
    "mixed_avg": (("symmetric", 8, 64), ("minmax", 4, 32), None, torch.float32, "AVG"),
    "tlq_hs_bf16": (("symmetric", 8, 64), ("symmetric", 4, 64), 32, torch.bfloat16, "AVG"),
    "stochastic_both": (("minmax", 8, 64), ("minmax", 2, 16), 16, torch.float32, "SUM"),
}


def _codec(spec):
    if spec is None:
        return None
    name, bits, bucket = spec
    return make_codec(name, bits=bits, bucket_size=bucket)


def _input(name: str, rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(zlib.crc32(f"{name}/{rank}".encode()))
    return (torch.randn(numel, generator=gen, dtype=torch.float64) * (1 + rank)).to(dtype)


def _int_input(rank: int, world: int, n: int) -> torch.Tensor:
    """Integer-valued fp32 rows that name their source rank and chunk: any sum of them is exact in fp32."""
    return (1000 * rank + torch.arange(world * n, dtype=torch.float32) % 97).float()


# ---------------------------------------------------------------------------------------------- references
def _rotate(rows: torch.Tensor, block: int | None, cols: int) -> torch.Tensor:
    return rows.float() if block is None else hadamard_rows(rows, block, cols, torch.float32)


def reference_two_level(inputs, nodes, per_node, intra, inter, block, average, ranks=None, per_hop_rotation=False,
                        errors=None):  # fmt: skip
    """Both hops in one process. Group rank ``g = a * per_node + l`` sits at ``(node a, local l)``; ``ranks[g]``
    is its global rank (the noise key; default ``g``). ``per_hop_rotation`` undoes the rotation after each hop's
    reduction and redoes it before the next quantization (SDP4Bit's Algorithm 3 before its simplifications).
    ``errors``, a list, receives each rank's relative error over the values it encoded in both hops."""
    world = nodes * per_node
    ranks = list(range(world)) if ranks is None else ranks
    n = inputs[0].numel() // world
    m = n if block is None else -(-n // block) * block
    rows = [_rotate(x.view(world, n), block, m) for x in inputs]
    wires = [intra.encode_rows(rows[g], seed=mix_seed(SEED, ranks[g])) for g in range(world)]
    partial = {}
    for a in range(nodes):
        for l in range(per_node):
            sums = [intra.decode_sum(torch.stack([wires[a * per_node + s][b * per_node + l] for s in range(per_node)]),
                                     m) for b in range(nodes)]  # fmt: skip
            partial[a, l] = torch.stack(sums)
            if per_hop_rotation:  # back to the gradient domain for the reduction, forward again for hop 2
                partial[a, l] = _rotate(_rotate(partial[a, l], block, m), block, m)
    wires2 = {(a, l): inter.encode_rows(p, seed=mix_seed(SEED, ranks[a * per_node + l], INTER_HOP))
              for (a, l), p in partial.items()}  # fmt: skip
    if errors is not None:
        for g in range(world):
            a, l = divmod(g, per_node)
            exact = torch.cat([rows[g].flatten(), partial[a, l].flatten()]).double()
            decoded = torch.cat([intra.decode_rows(wires[g], m).flatten(),
                                 inter.decode_rows(wires2[a, l], m).flatten()])  # fmt: skip
            errors.append(((decoded.double() - exact).norm() / exact.norm()).item())
    results = []
    for b in range(nodes):
        for l in range(per_node):
            total = inter.decode_sum(torch.stack([wires2[a, l][b] for a in range(nodes)]), m)
            total = total / world if average else total
            results.append(_rotate(total.view(1, -1), block, n)[0].to(inputs[0].dtype))
    return results


def reference_flat(inputs, codec, average, block=None):
    """The flat quantized reduce-scatter in one process (as tests/comm/test_collectives.py defines it), optionally
    on Hadamard-rotated chunks."""
    world = len(inputs)
    n = inputs[0].numel() // world
    m = n if block is None else -(-n // block) * block
    wires = [codec.encode_rows(_rotate(x.view(world, n), block, m) if block else x.view(world, n),
                               seed=mix_seed(SEED, r)) for r, x in enumerate(inputs)]  # fmt: skip
    totals = [codec.decode_sum(torch.stack([w[d] for w in wires]), m) for d in range(world)]
    totals = [t / world if average else t for t in totals]
    return [_rotate(t.view(1, -1), block, n)[0].to(inputs[0].dtype) for t in totals]


# ---------------------------------------------------------------------------------------------- rank side
def _run_cases(rank: int, world: int, group: dist.ProcessGroup, split: NodeGroups, prefix: str,
               dev: torch.device) -> dict:  # fmt: skip
    out = {}
    for name, (intra, inter, block, dtype, op) in CASES.items():
        inp = _input(f"{prefix}/{name}", rank, world * N, dtype).to(dev)
        output = torch.empty(N, dtype=dtype, device=dev)
        traffic = two_level_reduce_scatter(output, inp, _codec(intra), _codec(inter), group, split, OPS[op], SEED,
                                           rotation_block=block, measure_error=True)  # fmt: skip
        out[name] = (output, traffic)
    inp = _int_input(rank, world, N).to(dev)
    passthrough, plain = torch.empty(N, device=dev), torch.empty(N, device=dev)
    out["passthrough"] = (passthrough, two_level_reduce_scatter(passthrough, inp, None, None, group, split,
                                                                dist.ReduceOp.SUM, SEED))  # fmt: skip
    dist.reduce_scatter_tensor(plain, inp.clone(), group=group)
    out["plain"] = plain
    inp = _input(f"{prefix}/nonfinite", rank, world * N, torch.float32).to(dev)
    if rank == 1:
        inp[3], inp[N + 7] = float("nan"), float("inf")  # chunk 0 and chunk 1
    output = torch.empty(N, device=dev)
    two_level_reduce_scatter(output, inp, _codec(CASES["qgz_sum"][0]), _codec(CASES["qgz_sum"][1]), group, split,
                             dist.ReduceOp.SUM, SEED, rotation_block=32)  # fmt: skip
    out["nonfinite"] = output
    out["overwrite"] = _overwrite_cases(rank, world, group, split, prefix, dev)
    return out


def _overwrite_cases(rank: int, world: int, group: dist.ProcessGroup, split: NodeGroups, prefix: str,
                     dev: torch.device) -> dict:  # fmt: skip
    """TLq-HS with ``overwrite_input`` against the same call on a copy: an fp32 input of whole rotation blocks
    (rotated in place) and one that is not (bf16: it takes the copy and keeps its input)."""
    intra, inter = _codec(("symmetric", 8, 64)), _codec(("minmax", 4, 32))
    out = {}
    for name, n, dtype in (("fp32_whole_blocks", 4 * 32, torch.float32), ("bf16", 4 * 32, torch.bfloat16)):
        inp = _input(f"{prefix}/overwrite/{name}", rank, world * n, dtype).to(dev)
        kept = inp.clone()
        copy_out, in_place_out = torch.empty(n, dtype=dtype, device=dev), torch.empty(n, dtype=dtype, device=dev)
        copy = two_level_reduce_scatter(copy_out, kept.clone(), intra, inter, group, split, dist.ReduceOp.AVG, SEED,
                                        rotation_block=32, measure_error=True)  # fmt: skip
        in_place = two_level_reduce_scatter(in_place_out, inp, intra, inter, group, split, dist.ReduceOp.AVG, SEED,
                                            rotation_block=32, measure_error=True, overwrite_input=True)  # fmt: skip
        out[name] = (copy_out, in_place_out, copy.rel_error, in_place.rel_error, kept, inp)
    return out


def _degenerate(rank: int, world: int, dev: torch.device) -> dict:
    """One node, and one rank per node: the flat collective with the hop's codec."""
    out = {}
    group = dist.group.WORLD
    intra, inter = _codec(CASES["mixed_avg"][0]), _codec(CASES["mixed_avg"][1])
    inp = _input("degenerate", rank, world * N, torch.float32).to(dev)
    for label, topology, codec in (("one_node", Topology(world), intra), ("one_rank_per_node", Topology(1), inter)):
        split = node_groups(topology, group)
        ours, flat = torch.empty(N, device=dev), torch.empty(N, device=dev)
        traffic = two_level_reduce_scatter(ours, inp, intra, inter, group, split, dist.ReduceOp.AVG, SEED)
        flat_traffic = quantized_reduce_scatter(flat, inp, codec, group, dist.ReduceOp.AVG, SEED,
                                                off_node_peers=topology.off_node_peers(group))  # fmt: skip
        rotated = torch.empty(N, device=dev)
        two_level_reduce_scatter(rotated, inp, intra, inter, group, split, dist.ReduceOp.AVG, SEED, rotation_block=32)
        out[label] = (ours, flat, traffic, flat_traffic, rotated, (split.nodes, split.ranks_per_node))
    return out


def _errors(info: RankInfo) -> dict:
    """Invalid topologies and splits: the same ValueError on every rank, nobody left waiting."""
    errors = {}
    world, dev = info.world_size, info.device
    calls = {
        "differs": lambda: node_groups(Topology(2 if info.rank == 0 else 1), dist.group.WORLD),
        "not_divisor": lambda: node_groups(Topology(3), dist.group.WORLD),
        "split_of_other_group": lambda: two_level_reduce_scatter(
            torch.empty(N, device=dev), torch.zeros(world * N, device=dev), None, None, dist.group.WORLD,
            NodeGroups(1, world + 1, 0, 0, (tuple(range(world + 1)),), None, None), dist.ReduceOp.SUM, SEED),
        "rotation": lambda: two_level_reduce_scatter(
            torch.empty(N, device=dev), torch.zeros(world * N, device=dev), None, None, dist.group.WORLD,
            node_groups(Topology(1), dist.group.WORLD), dist.ReduceOp.SUM, SEED, rotation_block=48),
    }
    if world >= 4:
        # 3 ranks on 2 nodes of 2 (and the other ranks in a group of their own): every rank must raise, rank 3 too
        uneven = [dist.new_group([0, 1, 2]), dist.new_group(list(range(3, world)))]
        calls["uneven"] = lambda: node_groups(Topology(2), uneven[info.rank >= 3])
        calls["max_op"] = lambda: two_level_reduce_scatter(
            torch.empty(N, device=dev), torch.zeros(world * N, device=dev), None, None, dist.group.WORLD,
            node_groups(Topology(2), dist.group.WORLD), dist.ReduceOp.MAX, SEED)
    for label, call in calls.items():
        try:
            call()
            errors[label] = None
        except ValueError as err:
            errors[label] = str(err)
    dist.barrier()
    return errors


def _worker(info: RankInfo) -> dict:
    rank, world, dev = info.rank, info.world_size, info.device
    out = {"errors": _errors(info), "degenerate": _degenerate(rank, world, dev)}
    group = dist.group.WORLD
    for per_node in {2: (), 4: (2,), 8: (4, 2)}[world]:
        topology = Topology(per_node)
        split = node_groups(topology, group)
        assert node_groups(topology, group) is split  # created once, reused
        out[f"split{per_node}"] = (split.nodes, split.ranks_per_node, split.node, split.local,
                                    dist.get_process_group_ranks(split.intra),
                                    dist.get_process_group_ranks(split.inter))  # fmt: skip
        out[f"rpn{per_node}"] = _run_cases(rank, world, group, split, f"rpn{per_node}", dev)
    if world == 8:  # HSDP-like: every rank in a group of 2 nodes x 2, ranks differ in their group
        subgroups = [dist.new_group([0, 1, 4, 5]), dist.new_group([2, 3, 6, 7])]
        mine = subgroups[(rank // 2) % 2]
        split = node_groups(Topology(4), mine)
        out["subgroup"] = _run_cases(dist.get_rank(mine), 4, mine, split, "subgroup", dev)
    return out


RUNS = pytest.mark.parametrize("run", [
    pytest.param(("gloo", 4), id="gloo-w4"),
    pytest.param(("gloo", 8), id="gloo-w8", marks=pytest.mark.slow),
    pytest.param(("nccl", 2), id="nccl-w2", marks=pytest.mark.gpu),
    pytest.param(("nccl", 4), id="nccl-w4", marks=pytest.mark.gpu),
], indirect=True, scope="module")


@pytest.fixture(scope="module")
def run(request):
    backend, world = request.param
    skip_unless_backend(backend, world)
    return world, run_ranks(_worker, world, backend=backend)


def _runs(world: int) -> list[tuple[str, int, int, list[int]]]:
    """(result key, nodes, ranks per node, global ranks in group order) of every two-level run of a world; skips
    the calling test where there is none."""
    if world == 2:
        pytest.skip("no split of 2 ranks has two hops (the single-hop test covers 2 ranks)")
    return {
        4: [("rpn2", 2, 2, list(range(4)))],
        8: [("rpn4", 2, 4, list(range(8))), ("rpn2", 4, 2, list(range(8))), ("subgroup", 2, 2, [0, 1, 4, 5]),
            ("subgroup", 2, 2, [2, 3, 6, 7])],
    }[world]


# ---------------------------------------------------------------------------------------------- tests
def test_send_order_is_zeropp_slice_reordering():
    split = NodeGroups(2, 4, 0, 0, ((0, 1, 2, 3), (4, 5, 6, 7)), None, None)
    assert split.send_order == (0, 4, 1, 5, 2, 6, 3, 7)  # ZeRO++'s example, 2 nodes x 4 GPUs
    assert NodeGroups(3, 2, 0, 0, ((0, 1), (2, 3), (4, 5)), None, None).send_order == (0, 2, 4, 1, 3, 5)


def test_chunk_table_follows_group_ranks_not_global_ranks():
    # A group listing node 1's ranks first: group rank 0 is global rank 6, on node 1.
    assert chunk_table([6, 7, 0, 1], Topology(4)) == ((2, 3), (0, 1))
    with pytest.raises(ValueError, match=r"holds \{0: 2, 1: 1\} ranks per node .* equally many ranks"):
        chunk_table([0, 1, 4], Topology(4))


@RUNS
def test_splits_and_subgroups(run):
    world, results = run
    for key, nodes, per_node, members in _runs(world):
        if key == "subgroup":
            continue
        for rank in members:
            a, l = divmod(rank, per_node)
            intra = [a * per_node + j for j in range(per_node)]
            inter = [b * per_node + l for b in range(nodes)]
            assert results[rank][f"split{per_node}"] == (nodes, per_node, a, l, intra, inter)


@RUNS
def test_two_hops_match_the_single_process_reference_bit_for_bit(run):
    world, results = run
    for key, nodes, per_node, members in _runs(world):
        for name, (intra, inter, block, dtype, op) in CASES.items():
            inputs = [_input(f"{key}/{name}", g, len(members) * N, dtype) for g in range(len(members))]
            expected = reference_two_level(inputs, nodes, per_node, _codec(intra), _codec(inter), block, op == "AVG",
                                           ranks=members)  # fmt: skip
            for g, rank in enumerate(members):
                torch.testing.assert_close(results[rank][key][name][0], expected[g], rtol=0, atol=0,
                                           msg=f"{key}/{name} rank {rank}")  # fmt: skip


@RUNS
def test_overwriting_the_input_rotates_it_in_place_with_the_same_result(run):
    world, results = run
    for key, _, _, members in _runs(world):
        for rank in members:
            cases = results[rank][key]["overwrite"]
            copy_out, in_place_out, copy_err, in_place_err, kept, inp = cases["fp32_whole_blocks"]
            assert torch.equal(in_place_out, copy_out) and in_place_err == copy_err, f"{key} rank {rank}"
            rotated = hadamard_rows(kept.view(len(members), -1), 32, kept.numel() // len(members), torch.float32)
            assert torch.equal(inp, rotated.view(-1)), f"{key} rank {rank}: the input was not rotated in place"
            copy_out, in_place_out, copy_err, in_place_err, kept, inp = cases["bf16"]
            assert torch.equal(in_place_out, copy_out) and in_place_err == copy_err, f"{key} rank {rank}"
            assert torch.equal(inp, kept), f"{key} rank {rank}: a bf16 input cannot be rotated in place"


@RUNS
def test_hadamard_domain_reduction_equals_transform_per_hop(run):
    world, results = run
    for key, nodes, per_node, members in _runs(world)[:1 if world == 4 else 2]:
        for name, (intra, inter, block, dtype, op) in CASES.items():
            if block is None:
                continue
            inputs = [_input(f"{key}/{name}", g, world * N, dtype) for g in range(world)]
            per_hop = reference_two_level(inputs, nodes, per_node, _codec(intra), _codec(inter), block, op == "AVG",
                                          per_hop_rotation=True)  # fmt: skip
            for rank in range(world):
                # fp32 rounding of the extra transforms (log2(block) butterfly stages each), relative to the largest
                # element; a codec decision flipped by it would cost a whole quantization step
                ours = results[rank][key][name][0].double()
                scale = ours.abs().max()
                torch.testing.assert_close(ours / scale, per_hop[rank].double() / scale, rtol=0,
                                           atol=8 * torch.finfo(dtype).eps)  # fmt: skip


@RUNS
def test_passthrough_codecs_give_the_plain_reduce_scatter_in_its_chunk_order(run):
    world, results = run
    for key, nodes, per_node, members in _runs(world):
        for rank in members:
            output, traffic = results[rank][key]["passthrough"]
            assert torch.equal(output, results[rank][key]["plain"])
            expected = sum(_int_input(g, len(members), N).view(len(members), N) for g in range(len(members)))
            assert torch.equal(output, expected[members.index(rank)])
            # raw fp32 per hop: (L-1) * M chunks inside the node, M-1 chunks across nodes
            assert (traffic.sent, traffic.inter_node) == (((per_node - 1) * nodes + nodes - 1) * N * 4,
                                                          (nodes - 1) * N * 4)  # fmt: skip


@RUNS
def test_bytes_per_hop(run):
    world, results = run
    for key, nodes, per_node, members in _runs(world):
        for name, (intra, inter, block, dtype, op) in CASES.items():
            m = N if block is None else -(-N // block) * block
            intra_bytes = (per_node - 1) * nodes * _codec(intra).wire_bytes(m)
            inter_bytes = (nodes - 1) * _codec(inter).wire_bytes(m)
            traffic = results[members[0]][key][name][1]
            size = torch.empty((), dtype=dtype).element_size()
            assert (traffic.sent, traffic.inter_node) == (intra_bytes + inter_bytes, inter_bytes)
            assert (traffic.bf16, traffic.native) == ((len(members) - 1) * N * 2, (len(members) - 1) * N * size)
            # a flat collective would send (M-1) * L chunks across nodes with the inter codec
            assert traffic.inter_node * per_node == (nodes - 1) * per_node * _codec(inter).wire_bytes(m)


@RUNS
def test_measured_error_covers_both_hops(run):
    world, results = run
    key, nodes, per_node, members = _runs(world)[0]
    for name, (intra, inter, block, dtype, op) in CASES.items():
        inputs = [_input(f"{key}/{name}", g, world * N, dtype) for g in range(world)]
        expected: list[float] = []
        reference_two_level(inputs, nodes, per_node, _codec(intra), _codec(inter), block, op == "AVG", errors=expected)
        for rank in range(world):
            assert results[rank][key][name][1].rel_error.item() == pytest.approx(expected[rank], rel=1e-4)
    # 2-bit inter codes are far coarser than 4-bit ones: the error reflects the inter hop too
    assert results[0][key]["stochastic_both"][1].rel_error > results[0][key]["mixed_avg"][1].rel_error


@RUNS
def test_non_finite_values_stay_non_finite(run):
    world, results = run
    for key, nodes, per_node, members in _runs(world):
        first, second = members[0], members[1]
        assert not torch.isfinite(results[first][key]["nonfinite"][3])
        assert not torch.isfinite(results[second][key]["nonfinite"][7])
        assert torch.isfinite(results[first][key]["nonfinite"][64:]).all()  # other buckets unaffected


@RUNS
def test_single_hop_splits_are_the_flat_collective_bit_for_bit(run):
    world, results = run
    inputs = [_input("degenerate", r, world * N, torch.float32) for r in range(world)]
    for label, codec_spec, shape in (("one_node", CASES["mixed_avg"][0], (1, world)),
                                     ("one_rank_per_node", CASES["mixed_avg"][1], (world, 1))):  # fmt: skip
        expected = reference_flat(inputs, _codec(codec_spec), average=True)
        rotated = reference_flat(inputs, _codec(codec_spec), average=True, block=32)
        for rank in range(world):
            ours, flat, traffic, flat_traffic, ours_rotated, split_shape = results[rank]["degenerate"][label]
            assert split_shape == shape
            assert torch.equal(ours, flat) and torch.equal(ours, expected[rank])
            assert traffic == flat_traffic
            assert torch.equal(ours_rotated, rotated[rank])  # the one hop in the Hadamard domain
            assert not torch.equal(ours_rotated, ours)


@RUNS
def test_invalid_topologies_are_clear_errors_on_every_rank(run):
    world, results = run
    for rank in range(world):
        errors = results[rank]["errors"]
        assert "ranks_per_node differs between ranks ({0: 2, 1: 1" in errors["differs"]
        assert f"ranks_per_node=3 does not divide the world size {world}" in errors["not_divisor"]
        assert f"the node split has 1 nodes x {world + 1} ranks" in errors["split_of_other_group"]
        assert "rotation_block=48 is invalid; allowed: a power of two" in errors["rotation"]
        if world >= 4:  # groups of 3 ranks, and a two-hop split, need 4 ranks
            assert "equally many ranks of the group" in errors["uneven"]
            assert "supports ReduceOp SUM and AVG, got MAX" in errors["max_op"]
