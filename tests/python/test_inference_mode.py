"""torch.inference_mode() on remote_accelerator: the same results and the same inference-tensor
semantics as on the CPU.

Inside inference mode tensors carry no autograd keys, so PyTorch's composite ops
(`aten::to.dtype_layout`, `aten::linear`, `aten::layer_norm`, ...) are not decomposed before
`__torch_dispatch__`: the recorder decomposes them itself. Views of normal tensors taken there
stay normal tensors (PyTorch shares the base's version counter with them).
sentence-transformers' `encode` runs its model under inference mode.
"""
import copy

import pytest
import torch

import genie  # noqa: F401 - registers remote_accelerator

DEV = "remote_accelerator:0"


class Block(torch.nn.Module):
    """Linear, LayerNorm, GELU, dropout, a slice of a buffer: composite ops and a buffer view."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.drop = torch.nn.Dropout(0.1)
        self.register_buffer("positions", torch.arange(16).expand(1, -1), persistent=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        positions = self.positions[:, : x.shape[0]]  # a view of a normal tensor
        h = self.drop(torch.nn.functional.gelu(self.norm(self.linear(x))))
        return h.reshape(-1).to(torch.float64), positions


def run(block: torch.nn.Module, x: torch.Tensor):
    with torch.inference_mode():
        h, positions = block(x)
        y = torch.ones(3, device=x.device)  # a new tensor: an inference tensor
        y.add_(2)  # in place, inside inference mode: allowed
        return h, positions, y


def run_on_both():
    """`run` of one Block on the CPU and on the device: ((h, positions, y), (the same on the device))."""
    torch.manual_seed(0)
    block = Block().eval()
    x = torch.randn(5, 8)
    return run(block, x), run(copy.deepcopy(block).to(DEV), x.to(DEV))


def test_a_module_forward_matches_the_cpu():
    (h, positions, y), (hd, positions_d, yd) = run_on_both()
    assert torch.equal(h, hd.cpu())
    assert torch.equal(positions, positions_d.cpu())
    assert torch.equal(y, yd.cpu())
    assert hd.dtype == torch.float64 and hd.device == torch.device(DEV)


def test_inference_tensors_are_the_same_as_on_the_cpu():
    (h, positions, y), (hd, positions_d, yd) = run_on_both()
    assert (torch.is_inference(h), torch.is_inference(positions), torch.is_inference(y)) == (True, False, True)
    assert (torch.is_inference(hd), torch.is_inference(positions_d), torch.is_inference(yd)) == (True, False, True)
    # A view of an inference tensor is one too, inside or outside inference mode.
    assert torch.is_inference(yd[1:]) and torch.is_inference(yd.view(3, 1))


def test_an_inference_tensor_cannot_be_updated_outside_inference_mode():
    with torch.inference_mode():
        local = torch.ones(3)
        remote = torch.ones(3, device=DEV)
    for t in (local, remote):
        with pytest.raises(RuntimeError, match="Inplace update to inference tensor outside InferenceMode"):
            t.add_(1)
    # Reading it outside inference mode is allowed and gives its values.
    assert torch.equal((remote * 2).cpu(), local * 2)


def test_multi_head_attention_matches_the_cpu():
    # Separate query, key and value: the in-projection chunks a parameter into three views.
    torch.manual_seed(0)
    attention = torch.nn.MultiheadAttention(16, 2, batch_first=True).eval()
    remote = copy.deepcopy(attention).to(DEV)
    q, k, v = (torch.randn(2, 5, 16) for _ in range(3))
    with torch.inference_mode():
        local_out, local_weights = attention(q, k, v)
        out, weights = remote(q.to(DEV), k.to(DEV), v.to(DEV))
    torch.testing.assert_close(out.cpu(), local_out)
    torch.testing.assert_close(weights.cpu(), local_weights)


def test_sentence_transformers_encode_matches_the_cpu():
    sentence_transformers = pytest.importorskip("sentence_transformers")
    from genie.demo.models import SENTENCES, minilm_model_dir

    sentences = list(SENTENCES[:4])
    local = sentence_transformers.SentenceTransformer(minilm_model_dir(), device="cpu")
    remote = sentence_transformers.SentenceTransformer(minilm_model_dir(), device=DEV)
    a = local.encode(sentences, convert_to_tensor=True)
    b = remote.encode(sentences, convert_to_tensor=True)
    assert b.device == torch.device(DEV)
    cosine = torch.nn.functional.cosine_similarity(a, b.cpu())
    assert cosine.min().item() >= 0.9999, cosine
