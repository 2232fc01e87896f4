"""Quantized tensors (per-tensor affine) on remote_accelerator: made on the node, their
quantizer known on the client, their values equal to eager's on the CPU (integer
representations compared exactly); what is not supported raises NotImplementedError naming it."""

import io

import pytest
import torch

import genie  # noqa: F401

DEV = "remote_accelerator:0"


def _q(x, scale=0.1, zero_point=5, dtype=torch.quint8):
    return torch.quantize_per_tensor(x, scale, zero_point, dtype)


def assert_same_quantized(remote, eager):
    assert remote.is_quantized and remote.device.type == "remote_accelerator"
    assert (remote.dtype, remote.shape, remote.stride()) == (eager.dtype, eager.shape, eager.stride())
    assert remote.qscheme() == eager.qscheme() == torch.per_tensor_affine
    assert (remote.q_scale(), remote.q_zero_point()) == (eager.q_scale(), eager.q_zero_point())
    host = remote.cpu()
    assert host.is_quantized and (host.q_scale(), host.q_zero_point()) == (eager.q_scale(), eager.q_zero_point())
    assert torch.equal(host.int_repr(), eager.int_repr())


@pytest.mark.parametrize("dtype", [torch.quint8, torch.qint8, torch.qint32])
def test_quantize_per_tensor_on_the_node_equals_eager(dtype):
    x = torch.randn(4, 6) * 3
    eager = _q(x, 0.05, 3 if dtype != torch.qint8 else -2, dtype)
    remote = _q(x.to(DEV), 0.05, 3 if dtype != torch.qint8 else -2, dtype)
    assert_same_quantized(remote, eager)
    assert torch.equal(remote.int_repr().cpu(), eager.int_repr())
    assert torch.equal(remote.dequantize().cpu(), eager.dequantize())  # the node's kernel: the same bits


def test_views_and_shape_ops_keep_the_quantizer():
    x = torch.arange(24, dtype=torch.float32).view(2, 3, 4) / 7
    eager, remote = _q(x), _q(x.to(DEV))
    for op in (lambda t: t.view(-1), lambda t: t.flatten(1), lambda t: t.ravel(), lambda t: t.transpose(0, 2),
               lambda t: t.transpose(0, 2).contiguous(), lambda t: t[1, :, ::2], lambda t: torch.flip(t, [0, 2]),
               lambda t: t.permute(2, 0, 1).reshape(4, 6), lambda t: t.clone()):
        assert_same_quantized(op(remote), op(eager))
    flat = remote.ravel()
    assert flat._base is remote
    assert flat.untyped_storage().data_ptr() == remote.untyped_storage().data_ptr()


def test_empty_affine_quantized_on_the_device():
    t = torch._empty_affine_quantized([5, 5], scale=2, zero_point=3, dtype=torch.quint8, device=DEV)
    assert t.is_quantized and t.device.type == "remote_accelerator"
    assert (t.q_scale(), t.q_zero_point(), t.dtype) == (2.0, 3, torch.quint8)
    flat = t.flatten()
    assert flat.shape == (25,) and flat.q_scale() == 2.0
    assert torch.equal(t.view(-1).int_repr().cpu(), flat.int_repr().cpu())  # one value on the node


def test_upload_and_copy_between_host_and_device():
    eager = _q(torch.randn(3, 5), 0.02, 7)
    remote = eager.to(DEV)  # PyTorch's _to_copy: empty_quantized on the device, then copy_
    assert_same_quantized(remote, eager)
    into = torch._empty_affine_quantized([3, 5], scale=0.02, zero_point=7, dtype=torch.quint8, device=DEV)
    into.copy_(eager)
    assert_same_quantized(into, eager)
    back = torch._empty_affine_quantized([3, 5], scale=0.02, zero_point=7, dtype=torch.quint8)
    back.copy_(remote)
    assert torch.equal(back.int_repr(), eager.int_repr())


def test_a_resident_quantized_tensor_is_used_by_later_requests():
    x = torch.randn(8) * 2
    eager, remote = _q(x, 0.1, 10), _q(x.to(DEV), 0.1, 10)
    assert torch.equal(remote.int_repr().cpu(), eager.int_repr())  # runs; remote stays resident
    assert torch.equal(torch.flip(remote, [0]).dequantize().cpu(), torch.flip(eager, [0]).dequantize())


def test_quantizers_differ_by_their_parameters():
    x = torch.linspace(-1, 1, 9).to(DEV)
    a, b = _q(x, 0.1, 5), _q(x, 0.2, 3)
    assert (a.q_scale(), a.q_zero_point()) == (0.1, 5)
    assert (b.q_scale(), b.q_zero_point()) == (0.2, 3)
    assert (a.view(3, 3).q_scale(), b.view(3, 3).q_scale()) == (0.1, 0.2)


def test_an_op_without_a_quantized_kernel_raises_eagers_error():
    errors = []
    for device in ("cpu", DEV):
        with pytest.raises(NotImplementedError) as info:
            torch.exp(_q(torch.ones(3).to(device)))
        errors.append(str(info.value))
    eager, remote = errors
    assert eager.startswith("Could not run 'aten::exp")
    assert remote.startswith(eager.split(".")[0]) and "remote_accelerator" in remote


def test_unsupported_quantization_raises_naming_the_feature():
    x = torch.randn(2, 3, device=DEV)
    with pytest.raises(NotImplementedError, match="per_channel_affine quantized tensors are not supported on "
                                                  "remote_accelerator"):
        torch.quantize_per_channel(x, torch.tensor([0.1, 0.2]).to(DEV), torch.tensor([0, 1]).to(DEV), 0,
                                   torch.quint8)
    with pytest.raises(NotImplementedError, match="quantization parameters depend on the tensor's values"):
        torch.quantize_per_tensor_dynamic(x, torch.quint8, False)
    with pytest.raises(NotImplementedError, match="per_channel_affine quantized tensors are not supported"):
        torch.quantize_per_channel(torch.randn(2, 3), torch.tensor([0.1, 0.2]), torch.tensor([0, 1]), 0,
                                   torch.quint8).to(DEV)
    assert x.shape == (2, 3) and x.cpu().shape == (2, 3)  # the device still serves


def test_a_view_as_another_dtype_and_saving_raise_and_the_node_serves_on():
    q = _q(torch.randn(4).to(DEV))
    with pytest.raises(NotImplementedError, match="aten::view.dtype: viewing a quantized tensor as a tensor of "
                                                  "another dtype is not supported"):
        q.view(torch.uint8)
    with pytest.raises(NotImplementedError):  # torch.save views the storage's bytes
        torch.save(q, io.BytesIO())
    assert q.int_repr().cpu().shape == (4,)
