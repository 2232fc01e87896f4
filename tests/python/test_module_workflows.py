"""What PyTorch programs do with a module once it is on the device: convert its dtype, copy it,
save its state, run it under autocast. Each compared with the same on CPU."""

import copy
import io

import pytest
import torch

import genie  # noqa: F401 - registers remote_accelerator

DEV = "remote_accelerator:0"


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


X = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("convert", [lambda m: m.half(), lambda m: m.to(torch.bfloat16)], ids=["half", "bfloat16"])
def test_dtype_conversion_on_the_device(convert):
    # Module.half() after .to(device) sets each parameter's .data to the converted tensor.
    cpu = convert(_mlp())
    dev = convert(_mlp().to(DEV))
    p = next(dev.parameters())
    assert p.dtype == next(cpu.parameters()).dtype and p.device.type == "remote_accelerator"
    x = X.to(p.dtype)
    assert torch.equal(dev(x.to(DEV)).cpu(), cpu(x))
    dev.float()  # and back
    assert torch.equal(dev(X.to(DEV)).cpu(), cpu.float()(X))


def test_data_assignment_takes_the_other_value():
    a = torch.arange(4.0).to(DEV)
    b = torch.ones(2, 3, dtype=torch.float64).to(DEV)
    a.data = b
    assert a.shape == (2, 3) and a.dtype == torch.float64
    assert torch.equal(a.cpu(), torch.ones(2, 3, dtype=torch.float64))
    assert torch.equal(a.data.cpu(), a.cpu())
    a.data = torch.zeros(2)  # a host tensor's data, as a CUDA tensor may take it: `a` is on the host now
    assert a.device.type == "cpu" and torch.equal(a, torch.zeros(2))


def test_deepcopy_of_a_module_is_independent():
    model = _mlp().to(DEV)
    twin = copy.deepcopy(model)
    assert all(p.device.type == "remote_accelerator" for p in twin.parameters())
    assert all(a is not b for a, b in zip(model.parameters(), twin.parameters()))
    assert torch.equal(twin(X.to(DEV)).cpu(), model(X.to(DEV)).cpu())
    with torch.no_grad():
        next(twin.parameters()).add_(1.0)
    assert torch.equal(model(X.to(DEV)).cpu(), _mlp()(X))  # the original did not change


def test_state_dict_saves_and_loads_on_the_device():
    # As on CUDA: the storages are saved with their device's location tag and loaded back onto it.
    model = _mlp().to(DEV)
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    expected = _mlp().state_dict()
    assert loaded.keys() == expected.keys()
    for name, tensor in loaded.items():
        assert tensor.device.type == "remote_accelerator" and torch.equal(tensor.cpu(), expected[name])
    buffer.seek(0)
    on_cpu = torch.load(buffer, map_location="cpu")
    assert all(t.device.type == "cpu" and torch.equal(t, expected[k]) for k, t in on_cpu.items())
    fresh = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(DEV)
    fresh.load_state_dict(loaded)
    assert torch.equal(fresh(X.to(DEV)).cpu(), _mlp()(X))


def test_loading_straight_onto_the_device():
    # torch.load(map_location=device) allocates each storage on the device from the host, copies
    # the bytes in (storage.copy_) and rebuilds the tensors with set_ onto the storages.
    buffer = io.BytesIO()
    torch.save(_mlp().state_dict(), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, map_location=DEV)
    expected = _mlp().state_dict()
    for name, tensor in loaded.items():
        assert tensor.device.type == "remote_accelerator" and torch.equal(tensor.cpu(), expected[name])
    fresh = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    fresh.load_state_dict(loaded)  # copies device tensors into CPU parameters
    assert torch.equal(fresh(X), _mlp()(X))


def test_storages_allocated_from_the_host():
    storage = torch.UntypedStorage(8, device=DEV)
    storage.copy_(torch.UntypedStorage(list(range(1, 9))))
    assert storage.tolist() == list(range(1, 9))
    assert storage[2:6].tolist() == [3, 4, 5, 6]  # a slice views the same bytes
    viewed = torch.empty(0, device=DEV, dtype=torch.int32).set_(storage, 1, (1,), (1,))
    assert viewed.cpu().tolist() == [int.from_bytes(bytes([5, 6, 7, 8]), "little")]
    viewed.fill_(0)  # written through the tensor, read through the storage
    assert storage.tolist() == [1, 2, 3, 4, 0, 0, 0, 0]
    assert torch.UntypedStorage(0, device=DEV).nbytes() == 0
    typed = torch.TypedStorage([1.5, 2.5], dtype=torch.float32, device=DEV)
    assert typed.tolist() == [1.5, 2.5] and typed.device.type == "remote_accelerator"


def test_storage_of_a_dead_tensor_keeps_its_value():
    storage = (torch.arange(4, dtype=torch.float32) * 2).to(DEV).untyped_storage()  # the tensor dies here
    again = torch.tensor(storage, dtype=torch.float32, device=DEV)
    assert again.cpu().tolist() == [0.0, 2.0, 4.0, 6.0]


def test_swapping_storages_swaps_what_their_tensors_read():
    x, y = torch.arange(4.0).to(DEV), (torch.arange(4.0) + 10).to(DEV)
    x_view = x[1:3]
    x.untyped_storage()._swap_data_ptr_(y.untyped_storage())
    assert x.cpu().tolist() == [10.0, 11.0, 12.0, 13.0] and y.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    assert x_view.cpu().tolist() == [11.0, 12.0]
    with pytest.raises(RuntimeError, match="storages must have the same nbytes"):  # PyTorch's own check
        x.untyped_storage()._swap_data_ptr_(torch.ones(5, device=DEV).untyped_storage())
    with pytest.raises(NotImplementedError, match="swapping with an empty storage is not supported"):
        x.untyped_storage()._swap_data_ptr_(torch.UntypedStorage(0, device=DEV))


def test_lazy_clone_is_copy_on_write():
    t = torch.tensor([[0.0, 1.0], [2.0, 3.0]], device=DEV)
    address = torch._C._data_address(t)
    clone = t._lazy_clone()
    assert torch._C._is_cow_tensor(t) and torch._C._is_cow_tensor(clone)
    assert torch._C._data_address(clone) == address
    t + clone  # reading materializes nothing
    assert torch._C._is_cow_tensor(t)
    t.view(4).add_(1)  # a write gives t its own address range; the clone keeps the old one
    assert not torch._C._is_cow_tensor(t) and torch._C._data_address(t) != address
    assert torch._C._is_cow_tensor(clone) and torch._C._data_address(clone) == address
    assert clone.cpu().tolist() == [[0.0, 1.0], [2.0, 3.0]] and t.cpu().tolist() == [[1.0, 2.0], [3.0, 4.0]]
    with pytest.raises(RuntimeError, match="Materializing a storage"):
        torch._test_parallel_materialize(clone, 2, False)


def test_the_last_copy_on_write_reference_takes_the_storage_back():
    # c10 materializes the last reference of a COW storage by taking its original DataPtr back
    # (COW.cpp checks that the DataPtr's context is its data address): the clone written after
    # the source has its own range keeps the source's old address, and both read their values.
    # Which value that address's bytes are is then not known to the storage (COW moved it).
    t = torch.tensor([[0.0, 1.0], [2.0, 3.0]], device=DEV)
    address = torch._C._data_address(t)
    clone = t._lazy_clone()
    t.view(4).add_(1)
    clone.view(4).mul_(10)
    assert not torch._C._is_cow_tensor(clone) and torch._C._data_address(clone) == address
    assert clone.cpu().tolist() == [[0.0, 10.0], [20.0, 30.0]] and t.cpu().tolist() == [[1.0, 2.0], [3.0, 4.0]]
    storage = clone.untyped_storage()
    with pytest.raises(NotImplementedError, match="copy-on-write"):
        torch.tensor((), device=DEV).set_(storage)


def test_autocast_runs_matmuls_in_the_autocast_dtype():
    model = torch.nn.Sequential(_mlp(), torch.nn.Softmax(-1)).to(DEV)
    with torch.autocast("remote_accelerator", dtype=torch.bfloat16):
        hidden = model[0][0](X.to(DEV))
        out = model(X.to(DEV))
        out.sum().backward()
    assert hidden.dtype == torch.bfloat16  # linear: lower precision
    assert out.dtype == torch.float32  # softmax: float32 (CUDA's policy)
    reference = torch.nn.Sequential(_mlp(), torch.nn.Softmax(-1))(X)
    torch.testing.assert_close(out.cpu(), reference, atol=2e-2, rtol=2e-2)  # bfloat16 matmuls
    grad = model[0][0].weight.grad
    assert grad.dtype == torch.float32 and grad.cpu().abs().sum() > 0


def test_a_new_model_is_not_mistaken_for_a_freed_one():
    # Tied weights are uploaded once, recognized by their host storage. A model made after
    # another was freed often gets the same host addresses: its weights must still be uploaded
    # (before, the freed model's resident weights, changed on the node, were reused).
    torch.manual_seed(0)
    reference = [p.detach().clone() for p in _mlp().parameters()]
    for attempt in range(12):
        model = _mlp().to(DEV)
        for got, expected in zip(model.parameters(), reference):
            assert torch.equal(got.cpu(), expected), f"model {attempt}"
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)  # the node's copy now differs from any host bytes
        model(X.to(DEV)).sum().item()


def test_a_pinned_memory_data_loader_feeds_the_device():
    # With genie's hooks registered, remote_accelerator is PyTorch's current accelerator, so
    # DataLoader(pin_memory=True) pins its batches for it (ordinary host memory here).
    assert torch.accelerator.current_accelerator().type == "remote_accelerator"
    data = torch.utils.data.TensorDataset(X, torch.arange(8))
    model = _mlp().to(DEV)
    outputs = []
    for x, _ in torch.utils.data.DataLoader(data, batch_size=4, pin_memory=True):
        outputs.append(model(x.to(DEV, non_blocking=True)).cpu())
    assert torch.equal(torch.cat(outputs), _mlp()(X))


def test_batch_norm_statistics_update_when_the_output_is_discarded():
    # torch.optim.swa_utils.update_bn runs forwards in training mode and discards their
    # outputs: only the running statistics (written by aten::native_batch_norm, whose schema
    # does not say so) must change.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    remote = copy.deepcopy(model).to(DEV)
    batches = [torch.randn(8, 4) for _ in range(3)]
    torch.optim.swa_utils.update_bn(batches, model)
    torch.optim.swa_utils.update_bn(batches, remote, device=torch.device(DEV))
    for name, buffer in model.named_buffers():
        assert torch.allclose(dict(remote.named_buffers())[name].cpu(), buffer), name


@pytest.mark.parametrize("layer", ["RNN", "LSTM", "GRU"])
def test_recurrent_layers_match_the_cpu(layer):
    # PyTorch's composite LSTM/GRU choose CUDA-only fused cells for any non-CPU device; on
    # remote_accelerator they are recorded whole (inference) or decomposed (training).
    torch.manual_seed(0)
    local = getattr(torch.nn, layer)(6, 5, num_layers=2, batch_first=True, bidirectional=True)
    remote = copy.deepcopy(local).to(DEV)
    x = torch.randn(3, 4, 6)
    for mode in (torch.no_grad, torch.inference_mode):
        with mode():
            torch.testing.assert_close(remote(x.to(DEV))[0].cpu(), local(x)[0])
    local(x)[0].square().sum().backward()
    remote(x.to(DEV))[0].square().sum().backward()
    for (name, p), q in zip(local.named_parameters(), remote.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, msg=name)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_ctc_loss_takes_lengths_on_the_host(reduction):
    # As on CUDA, F.ctc_loss's lengths may be CPU tensors beside device log-probabilities.
    torch.manual_seed(0)
    logits = torch.randn(12, 2, 6)
    targets = torch.tensor([[1, 2, 2, 3], [4, 1, 0, 0]])
    input_lengths, target_lengths = torch.tensor([12, 9]), torch.tensor([4, 2])
    results = []
    for device in ("cpu", DEV):
        x = logits.to(device).detach().requires_grad_()
        loss = torch.nn.functional.ctc_loss(x.log_softmax(2), targets.to(device), input_lengths, target_lengths,
                                            reduction=reduction)
        loss.sum().backward()
        results.append((loss.detach().cpu(), x.grad.cpu()))
    torch.testing.assert_close(results[1][0], results[0][0])
    torch.testing.assert_close(results[1][1], results[0][1])
    with torch.inference_mode():  # below autograd: the recorder moves the lengths
        loss = torch.nn.functional.ctc_loss(logits.to(DEV).log_softmax(2), targets.to(DEV), input_lengths,
                                            target_lengths, reduction=reduction)
    torch.testing.assert_close(loss.cpu(), results[0][0])


def _packed_run(rnn, x, lengths):
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
    packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    out, hidden = rnn(packed)
    padded, out_lengths = pad_packed_sequence(out, batch_first=True)
    return padded, hidden[0] if isinstance(hidden, tuple) else hidden, out_lengths


@pytest.mark.parametrize("layer", ["LSTM", "GRU"])
def test_packed_sequences_match_the_cpu(layer):
    # Packed sequences keep their lengths and batch_sizes on the host, as on CUDA: the data is
    # packed on the device (compat._pack_padded_sequence) and the RNN over it recorded whole.
    torch.manual_seed(0)
    local = getattr(torch.nn, layer)(4, 5, num_layers=2, batch_first=True, bidirectional=True)
    remote = copy.deepcopy(local).to(DEV)
    x, lengths = torch.randn(3, 6, 4), torch.tensor([6, 2, 4])
    for mode in (torch.no_grad, torch.inference_mode):
        with mode():
            expected, got = _packed_run(local, x, lengths), _packed_run(remote, x.to(DEV), lengths)
        torch.testing.assert_close(got[0].cpu(), expected[0])
        torch.testing.assert_close(got[1].cpu(), expected[1])
        assert torch.equal(got[2], expected[2]) and got[2].device.type == "cpu"
    expected, got = _packed_run(local, x, lengths), _packed_run(remote, x.to(DEV), lengths)
    (expected[0].square().sum() + expected[1].sum()).backward()
    (got[0].square().sum() + got[1].sum()).backward()
    for (name, p), q in zip(local.named_parameters(), remote.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, msg=name)
    with pytest.raises(RuntimeError, match="sorted in decreasing order"):
        torch.nn.utils.rnn.pack_padded_sequence(x.to(DEV), lengths, batch_first=True)


def test_storages_have_device_addresses_shared_by_views():
    # As on CUDA: a storage's data_ptr identifies it (views share their base's), element
    # pointers step by the item size, and distinct values never overlap.
    x = torch.arange(8.0).to(DEV)
    y = torch.arange(8.0).to(DEV)
    view = x[2:]
    assert x.untyped_storage().data_ptr() != 0
    assert view.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert view.data_ptr() - x.data_ptr() == 2 * x.element_size()
    ends = sorted([(t.data_ptr(), t.data_ptr() + t.untyped_storage().nbytes()) for t in (x, y)])
    assert ends[0][1] <= ends[1][0]
    # Reading the storage itself views its value on the node (aten::set_ onto the storage)
    assert x.untyped_storage().tolist() == torch.arange(8.0).untyped_storage().tolist()
    assert view.untyped_storage().cpu().tolist() == torch.arange(8.0).untyped_storage().tolist()
    assert view.tolist() == list(range(2, 8))  # the pending work is intact


def test_set_onto_a_storage_views_its_value():
    """`x.set_(y.untyped_storage(), offset, size, stride)` makes x a view of y's value: reads
    match eager, writes through x reach y, and both name one storage."""
    def run(d):
        reference = torch.arange(10.0).to(d)
        strided = torch.tensor((), device=d)
        strided.set_(reference.untyped_storage(), 0, torch.Size([4]), [2])
        picked = strided[[1, 2]].cpu()
        strided.set_(reference.untyped_storage(), storage_offset=4, size=torch.Size([2]), stride=[4])
        strided.mul_(10)
        same = strided.untyped_storage().data_ptr() == reference.untyped_storage().data_ptr()
        whole = torch.tensor((), device=d).set_(reference.untyped_storage())
        return picked, reference.cpu(), same, whole.cpu()

    got, want = run(DEV), run("cpu")
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and torch.equal(got[3], want[3])
    assert got[2] and want[2]
    cow = torch.ones(3, device=DEV)._lazy_clone().untyped_storage()  # its value is not known
    with pytest.raises(NotImplementedError, match="copy-on-write"):
        torch.tensor((), device=DEV).set_(cow)


def test_save_pretrained_from_the_device(tmp_path):
    # transformers tells tied weights apart by storage pointer (safetensors' storage_ptr);
    # an invalid python storage (a null pointer) made it raise.
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50)).eval()
    ids = torch.tensor([[1, 2, 3]])
    expected = model(ids).logits
    model.to(DEV).save_pretrained(tmp_path)
    loaded = GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(loaded(ids).logits, expected)


def _encoder(**kwargs) -> torch.nn.TransformerEncoder:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
    return torch.nn.TransformerEncoder(layer, 2, **kwargs).eval()


def test_transformer_encoder_inference_with_a_padding_mask():
    # In eval mode under no_grad, nn.TransformerEncoder converts a padded batch to a nested
    # tensor, which remote_accelerator does not have: it stays dense (the mask check answers
    # False), so its outputs equal the CPU's without nested tensors, and the CPU's default at
    # every non-padded position.
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(2))
    mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    with torch.no_grad():
        nested = _encoder()(x, src_key_padding_mask=mask)
        dense = _encoder(enable_nested_tensor=False)(x, src_key_padding_mask=mask)
        out = _encoder().to(DEV)(x.to(DEV), src_key_padding_mask=mask.to(DEV)).cpu()
    torch.testing.assert_close(out, dense, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[~mask], nested[~mask], atol=1e-5, rtol=1e-5)
    with torch.no_grad(), pytest.raises(NotImplementedError, match="enable_nested_tensor=False"):
        _encoder(mask_check=False).to(DEV)(x.to(DEV), src_key_padding_mask=mask.to(DEV))
