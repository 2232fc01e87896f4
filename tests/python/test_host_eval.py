"""Host evaluation (genie.host_eval): reads the host can answer exactly need no round trip, and
every other read still goes to the node and sees what the node holds."""

import torch

import genie
from genie import host_eval

DEV = "remote_accelerator:0"


def round_trips() -> int:
    genie.synchronize()  # nothing pending is counted against the read under test
    return genie.client_stats()["round_trips"]


def test_mask_checks_on_uploaded_integers_need_no_round_trip():
    mask_cpu = torch.tensor([[1, 1, 0, 1], [1, 1, 1, 1]])
    mask = mask_cpu.to(DEV)
    before = round_trips()
    assert bool(mask.bool().all()) is False  # HuggingFace's "can attention skip the mask?"
    assert bool((mask >= 0).all()) is True
    assert mask.sum(-1).tolist() == [3, 4]
    assert mask[:, 2].cpu().tolist() == [0, 1]
    assert genie.client_stats()["round_trips"] == before
    # The node computes the same values when the program uses them there.
    x = torch.randn(2, 4)
    on_node = (x.to(DEV) * mask.unsqueeze(0).to(torch.float32)).cpu()
    assert torch.equal(on_node, x * mask_cpu.to(torch.float32).unsqueeze(0))


def test_integer_arithmetic_on_the_host():
    positions = torch.arange(10).to(DEV)
    before = round_trips()
    assert ((positions * 3) % 7).tolist() == ((torch.arange(10) * 3) % 7).tolist()
    assert genie.client_stats()["round_trips"] == before


def test_floating_point_reads_go_to_the_node():
    x = torch.tensor([0.1, 0.2, 0.7]).to(DEV)
    genie.synchronize()
    bool((x * 3 > 0.6).any())  # registers the graph's structure (a round trip of its own)
    before = round_trips()
    assert bool((x * 3 > 0.6).any()) is True
    assert genie.client_stats()["round_trips"] == before + 1


def test_a_written_storage_is_read_from_the_node():
    base_cpu = torch.tensor([1, 2, 3, 4])
    base = base_cpu.to(DEV)
    row = base[1:3]
    assert row.sum().item() == 5  # on the host
    base.add_(10)  # an in-place write: copies of views of this storage would be stale
    base_cpu.add_(10)
    before = round_trips()
    assert row.sum().item() == base_cpu[1:3].sum().item() == 25
    assert base.tolist() == base_cpu.tolist()
    assert genie.client_stats()["round_trips"] > before


def test_the_host_copy_is_a_snapshot_and_reads_are_copies():
    source = torch.tensor([1, 2, 3])
    on_device = source.to(DEV)
    source.add_(100)  # the program changes its own tensor after the upload
    assert on_device.sum().item() == 6
    read = on_device.cpu()
    read.add_(1)
    assert on_device.tolist() == [1, 2, 3]


def test_large_and_random_values_go_to_the_node():
    big = torch.arange(host_eval.MAX_BYTES // 8 + 1)  # int64: one element over the bound
    on_device = big.to(DEV)
    on_device.max().item()  # registers the graph's structure (a round trip of its own)
    before = round_trips()
    assert on_device.sum().item() == big.sum().item()
    assert genie.client_stats()["round_trips"] == before + 1
    torch.randint(0, 1000, (8,), device=DEV).sum().item()  # registers the structure
    drawn = torch.randint(0, 1000, (8,), device=DEV)
    before = round_trips()
    total = drawn.sum().item()
    assert genie.client_stats()["round_trips"] == before + 1  # a random op: only the node knows
    assert total == sum(drawn.tolist())


def test_printing_a_tensor_reads_it_whole_once():
    # PyTorch's formatting (torch._tensor_str) runs on the device as on CUDA, reading values
    # element by element through exact ops (masked_select, abs, ceil, comparisons, views): the
    # tensor is read whole once and kept on the host, so those reads need no request each.
    cpu = torch.randn(10, 10, generator=torch.Generator().manual_seed(0)) * 3
    x = cpu.to(DEV) * 2  # computed on the node
    genie.synchronize()
    before = round_trips()
    text = repr(x)
    requests = genie.client_stats()["round_trips"] - before
    expected = repr(cpu * 2)
    assert text.replace("\n       device=", " device=") == expected[:-1] + ", device='remote_accelerator:0')"
    assert requests <= 4, requests  # element by element it would be ~200
    assert str(x[3]) == str((cpu * 2)[3]).replace(")", ", device='remote_accelerator:0')")
