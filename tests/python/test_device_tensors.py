"""Device tensors are plain torch.Tensors, and moving a module keeps its Parameter objects, as on
CUDA (python/csrc/frontend/lazy_tensor.h): tied weights stay tied, an optimizer made before
`.to()` trains the moved model, hooks and state_dict aliasing survive the move, and tied
transformers (GPT-2, T5) train on the device as on the CPU."""

import pytest
import torch

from genie.lazy import is_lazy

DEV = "remote_accelerator:0"


def _is_plain_device_tensor(t) -> bool:
    return type(t) is torch.Tensor and is_lazy(t) and t.device == torch.device(DEV)


def test_every_device_tensor_is_a_plain_tensor():
    x = torch.randn(3, 4).to(DEV)
    made = [x, torch.zeros(2, device=DEV), torch.arange(5, device=DEV), x + 1, x.t(), x[1], x.detach(), x.data,
            x.view(12), torch.empty_like(x), x.clone(), *x.split(2, dim=1), x.to(torch.float64)]
    assert all(_is_plain_device_tensor(t) for t in made), [type(t) for t in made]
    w = torch.randn(4, 2, requires_grad=True, device=DEV)
    (x @ w).sum().backward()
    assert _is_plain_device_tensor(w.grad)
    model = torch.nn.Linear(4, 2).to(DEV)
    assert type(model.weight) is torch.nn.Parameter and _is_plain_device_tensor(model.weight.data)
    assert all(_is_plain_device_tensor(t) for t in model.state_dict().values())


def test_moving_a_module_keeps_its_parameter_objects():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 4))
    params = list(model.parameters())
    assert torch._has_compatible_shallow_copy_type(torch.ones(2), torch.ones(2, device=DEV))
    assert model.to(DEV) is model
    assert all(a is b for a, b in zip(model.parameters(), params))
    assert all(b.device == torch.device(DEV) for b in model.buffers())  # buffers are new tensors, as on CUDA
    assert all(p.device == torch.device(DEV) and type(p) is torch.nn.Parameter for p in params)
    model.cpu()  # and back, still the same objects
    assert all(a is b for a, b in zip(model.parameters(), params)) and all(p.device.type == "cpu" for p in params)


def test_tied_weights_stay_one_parameter():
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.head = torch.nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight

    model = Tied()
    count = len(list(model.parameters()))
    model.to(DEV)
    assert model.head.weight is model.embed.weight and len(list(model.parameters())) == count
    state = model.state_dict()
    assert state["head.weight"].untyped_storage().data_ptr() == state["embed.weight"].untyped_storage().data_ptr()


def test_an_optimizer_made_before_to_trains_the_device_model():
    def train(device, optimizer_first):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3))
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.05) if optimizer_first else None
        model.to(device)
        if optimizer is None:
            optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
        assert all(p.device == torch.device(device) for group in optimizer.param_groups for p in group["params"])
        x = torch.randn(16, 6, generator=torch.Generator().manual_seed(1)).to(device)
        losses = []
        for _ in range(4):
            optimizer.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return losses, [p.detach().cpu() for p in model.parameters()]

    cpu_losses, cpu_weights = train("cpu", optimizer_first=False)
    dev_losses, dev_weights = train(DEV, optimizer_first=True)
    assert cpu_losses[-1] < cpu_losses[0]
    assert dev_losses == pytest.approx(cpu_losses, rel=1e-5)
    for dev, cpu in zip(dev_weights, cpu_weights):
        torch.testing.assert_close(dev, cpu, rtol=1e-5, atol=1e-6)


def test_hooks_and_data_assignment_survive_the_move():
    model = torch.nn.Linear(3, 2)
    weight = model.weight
    seen = []
    weight.register_hook(lambda grad: seen.append(("grad", grad.device)))
    weight.register_post_accumulate_grad_hook(lambda p: seen.append(("accumulated", p.grad.device)))
    model.to(DEV)
    model(torch.ones(1, 3, device=DEV)).sum().backward()
    assert seen == [("grad", torch.device(DEV)), ("accumulated", torch.device(DEV))]
    assert torch.equal(weight.grad.cpu(), torch.ones(2, 3))
    model.half()  # `param.data = param.half()` on the device: still the same Parameter
    assert model.weight is weight and weight.dtype == torch.float16 and weight.device == torch.device(DEV)


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_a_tied_gpt2_trains_as_on_the_cpu(attention):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=32,
                                     attn_implementation=attention, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(1))
    _trains_as_on_the_cpu(lambda: transformers.GPT2LMHeadModel(config),
                          lambda model, device: model(input_ids=ids.to(device), labels=ids.to(device)).loss,
                          tied=("lm_head.weight", "transformer.wte.weight"))


def test_a_t5_trains_as_on_the_cpu():
    transformers = pytest.importorskip("transformers")
    config = transformers.T5Config(vocab_size=100, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2,
                                   dropout_rate=0.0, decoder_start_token_id=0, tie_word_embeddings=True)
    g = torch.Generator().manual_seed(1)
    source, target = torch.randint(0, 100, (2, 12), generator=g), torch.randint(0, 100, (2, 8), generator=g)
    _trains_as_on_the_cpu(lambda: transformers.T5ForConditionalGeneration(config),
                          lambda model, device: model(input_ids=source.to(device), labels=target.to(device)).loss,
                          tied=("shared.weight", "encoder.embed_tokens.weight"))


def _trains_as_on_the_cpu(make, loss_of, tied, steps=5):
    """Five AdamW steps of `make()` on the CPU and on the device: the same parameters, ties
    included, and losses and weights within 1e-5."""

    def train(device):
        torch.manual_seed(0)
        model = make()
        parameters = list(model.parameters())
        model.to(device)
        named = dict(model.named_parameters(remove_duplicate=False))
        assert named[tied[0]] is named[tied[1]]
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses = []
        for _ in range(steps):
            optimizer.zero_grad()
            loss = loss_of(model, device)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return parameters, list(model.parameters()), losses, {k: v.detach().cpu() for k, v in model.state_dict().items()}

    cpu_before, cpu_after, cpu_losses, cpu_state = train("cpu")
    dev_before, dev_after, dev_losses, dev_state = train(DEV)
    assert len(dev_after) == len(cpu_after) == len(dev_before)
    assert all(a is b for a, b in zip(dev_before, dev_after))
    assert cpu_losses[-1] < cpu_losses[0]
    assert max(abs(d - c) for d, c in zip(dev_losses, cpu_losses)) <= 1e-5, (dev_losses, cpu_losses)
    assert dev_state.keys() == cpu_state.keys()
    for name in cpu_state:
        torch.testing.assert_close(dev_state[name], cpu_state[name], rtol=0, atol=1e-5, msg=name)


def test_float_power_out_checks_the_result_dtype_of_plain_tensors():
    # The check PyTorch's test_float_power_exceptions makes: `type(t) == torch.Tensor` picks the
    # promotion of a tensor argument, and an out= of another dtype than it raises.
    for base, exponent in ((torch.tensor([-2, -1, 0, 1, 2], device=DEV), -0.25),
                           (torch.tensor([-1.0j, 0j, 1.0j, 1.0 + 1.0j, -1.0 - 1.5j], device=DEV), 2.0)):
        assert type(base) == torch.Tensor  # noqa: E721 - the test's own comparison
        required = torch.complex128 if base.is_complex() else torch.double
        for dtype in (torch.long, torch.float, torch.double, torch.cdouble):
            out = torch.empty(0, device=DEV, dtype=dtype)
            if dtype == required:
                torch.float_power(base, exponent, out=out)
                torch.testing.assert_close(out.cpu(), torch.float_power(base.cpu(), exponent), equal_nan=True)
            else:
                with pytest.raises(RuntimeError, match="operation's result requires dtype"):
                    torch.float_power(base, exponent, out=out)
