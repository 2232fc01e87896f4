"""Training on remote_accelerator: forward, backward (the autograd engine runs the backward ops
for this device: genie._C registers the PrivateUse1 hooks it asks for), optimizer steps and
gradient clipping record like any other ops, and the results equal the same training on CPU,
dropout included (torch.manual_seed reaches the node's generator)."""

import math

import pytest
import torch

from genie.lazy import operation
from genie.runtime import runtime_for

DEV = "remote_accelerator:0"


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Dropout(0.25), torch.nn.Linear(8 * 4 * 4, 10))


def _batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 10, (4,), generator=g)


def _train(device: str, make_optimizer, steps: int = 4):
    model = _model().to(device)
    optimizer = make_optimizer(model.parameters())
    torch.manual_seed(2)  # the generator dropout draws from (the node's for the device) starts here
    x, y = (t.to(device) for t in _batch())
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    return losses, {k: v.detach().cpu() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("make_optimizer", [
    lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9, nesterov=True),
    lambda p: torch.optim.Adam(p, lr=0.01),
    lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1),
], ids=["sgd-nesterov", "adam", "adamw"])
def test_training_equals_cpu(make_optimizer):
    cpu_losses, cpu_state = _train("cpu", make_optimizer)
    dev_losses, dev_state = _train(DEV, make_optimizer)
    assert dev_losses == pytest.approx(cpu_losses, rel=1e-5)
    assert cpu_losses[-1] < cpu_losses[0]  # it trained
    assert dev_state.keys() == cpu_state.keys()  # weights, BatchNorm running statistics, counters
    for name in cpu_state:
        torch.testing.assert_close(dev_state[name], cpu_state[name], rtol=1e-5, atol=1e-6, msg=name)


def test_a_training_step_after_warm_up_is_one_round_trip():
    # Adam's bias corrections and step size are Python floats that change every step: they
    # travel as scalars of the registered graph, not as a new graph per step.
    model = _model().to(DEV)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = (t.to(DEV) for t in _batch())
    runtime = runtime_for(torch.device(DEV))
    for step in range(6):
        before, graphs = runtime.counters(), runtime.recording.graph_count
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        loss.item()
        after = runtime.counters()
    assert runtime.recording.graph_count == graphs  # nothing registered in the last step
    assert after["round_trips"] - before["round_trips"] == 1
    assert after["bytes_sent"] - before["bytes_sent"] < 4096


def test_changed_floats_are_bound_not_baked():
    x = torch.ones(2).to(DEV)
    x.cpu()  # resident: every run below has the same structure
    runtime = runtime_for(torch.device(DEV))
    seen = []
    for s in (0.5, 2.5, 0.0, -0.0, float("nan"), 3.0):
        out = (x * s).reciprocal().cpu()
        torch.testing.assert_close(out, (torch.ones(2) * s).reciprocal(), equal_nan=True)
        if s == 0.0:  # 0.0 and -0.0 are equal as numbers, not as reciprocals
            assert torch.equal(out, torch.full((2,), math.copysign(math.inf, s)))
        seen.append(runtime.recording.graph_count)
    assert seen[-1] == seen[1]  # registered with the float lifted once it changed, then reused


def test_attention_gradients_equal_cpu():
    # aten::scaled_dot_product_attention is recorded whole for inference; when gradients flow
    # through it, its math decomposition is recorded instead (a kernel registered for a
    # composite op has no derivative: the gradients were silently missing).
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 5, 8) for _ in range(3))
    mask = torch.randn(5, 5)

    def grads(device):
        leaves = [t.clone().to(device).requires_grad_() for t in (q, k, v)]
        out = torch.nn.functional.scaled_dot_product_attention(*leaves, attn_mask=mask.to(device))
        (out * out).sum().backward()
        return [out.detach().cpu()] + [t.grad.cpu() for t in leaves]

    for expected, got in zip(grads("cpu"), grads(DEV)):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    with torch.no_grad():  # inference: the whole op is what the node runs
        out = torch.nn.functional.scaled_dot_product_attention(q.to(DEV), k.to(DEV), v.to(DEV))
        assert operation(out) == "aten::scaled_dot_product_attention"


def test_gpt2_fine_tuning_equals_cpu():
    # A transformer (GPT-2 built from a small config: embeddings, attention, MLP, layer norm,
    # tied input/output embeddings) trained a few AdamW steps on each device.
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=32,
                                     attn_implementation="sdpa", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(1))

    def fine_tune(device):
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(config).to(device)
        assert model.lm_head.weight is model.transformer.wte.weight  # module.to kept the tie, as on CUDA
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses = []
        for _ in range(3):
            optimizer.zero_grad()
            loss = model(input_ids=ids.to(device), labels=ids.to(device)).loss
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return losses, {k: v.detach().cpu() for k, v in model.state_dict().items()}

    cpu_losses, cpu_state = fine_tune("cpu")
    dev_losses, dev_state = fine_tune(DEV)
    assert dev_losses == pytest.approx(cpu_losses, rel=1e-5)
    assert cpu_losses[-1] < cpu_losses[0]
    for name in cpu_state:  # attention's math path against the CPU's flash kernel: float rounding
        torch.testing.assert_close(dev_state[name], cpu_state[name], rtol=1e-4, atol=1e-5, msg=name)


def _mlp_step(device, make_optimizer, *, scaler=None, checkpoint=False, scheduler=False, steps=3):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(device)
    optimizer = make_optimizer(model.parameters())
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, 1, 0.5) if scheduler else None
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 16, generator=g).to(device), torch.randint(0, 4, (8,), generator=g).to(device)
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=False)  # in-place zeroing (aten::_foreach_zero_ or zero_)
        hidden = (torch.utils.checkpoint.checkpoint(model[0], x, use_reentrant=False) if checkpoint
                  else model[0](x))
        loss = torch.nn.functional.cross_entropy(model[2](model[1](hidden)), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        if schedule is not None:
            schedule.step()
    return [p.detach().cpu() for p in model.parameters()]


@pytest.mark.parametrize("case", [
    dict(make_optimizer=lambda p: torch.optim.Adam(p, lr=0.01, fused=True)),
    dict(make_optimizer=lambda p: torch.optim.Adam(p, lr=0.01, foreach=True)),
    dict(make_optimizer=lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9, fused=True)),
    dict(make_optimizer=lambda p: torch.optim.AdamW(p, lr=0.01, amsgrad=True)),
    dict(make_optimizer=lambda p: torch.optim.RMSprop(p, lr=0.01)),
    dict(make_optimizer=lambda p: torch.optim.Adagrad(p, lr=0.01)),
    dict(make_optimizer=lambda p: torch.optim.SGD(p, lr=0.1), scheduler=True),
    dict(make_optimizer=lambda p: torch.optim.SGD(p, lr=0.1), checkpoint=True),
    dict(make_optimizer=lambda p: torch.optim.SGD(p, lr=0.1), scaler=True),
], ids=["adam-fused", "adam-foreach", "sgd-fused", "adamw-amsgrad", "rmsprop", "adagrad", "sgd-steplr", "checkpointing", "gradscaler"])
def test_optimizers_schedulers_checkpointing_and_grad_scaling_equal_cpu(case):
    # In-place foreach ops return nothing (`-> ()`: _foreach_zero_, _foreach_add_,
    # _amp_foreach_non_finite_check_and_unscale_): recorded with no outputs, without shape
    # inference (aten::_fused_sgd_ has no meta kernel). Adam's foreach step divides by a
    # Scalar[] (aten::_foreach_div_.ScalarList), an argument type the executor binds.
    case = dict(case)
    if case.pop("scaler", False):
        cpu = _mlp_step("cpu", scaler=torch.amp.GradScaler("cpu", init_scale=1024.0), **case)
        dev = _mlp_step(DEV, scaler=torch.amp.GradScaler("remote_accelerator", init_scale=1024.0), **case)
    else:
        cpu, dev = _mlp_step("cpu", **case), _mlp_step(DEV, **case)
    for expected, got in zip(cpu, dev):
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)


def test_checkpointing_replays_dropout_with_the_node_generator_state():
    # torch.utils.checkpoint saves the device's RNG state before the forward and restores it
    # for the recomputation (genie::get_rng_state / set_rng_state), so dropout draws the same
    # mask twice and the gradients equal CPU's.
    def grads(device):
        torch.manual_seed(0)
        layer = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Dropout(0.5), torch.nn.Linear(64, 4)).to(device)
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1)).to(device)
        torch.manual_seed(5)
        out = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False)
        out.square().sum().backward()
        return [p.grad.cpu() for p in layer.parameters()]

    for expected, got in zip(grads("cpu"), grads(DEV)):
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)


def test_rng_state_round_trip():
    torch.manual_seed(3)
    state = torch.remote_accelerator.get_rng_state()  # recorded: nothing comes back
    first = torch.rand(5, device=DEV)
    torch.remote_accelerator.set_rng_state(state)
    again = torch.rand(5, device=DEV)
    assert torch.equal(first.cpu(), again.cpu())
    host_state = state.cpu()  # a host copy of the state works too
    assert host_state.dtype == torch.uint8 and host_state.numel() > 0
    torch.remote_accelerator.set_rng_state(host_state)
    assert torch.equal(torch.rand(5, device=DEV).cpu(), first.cpu())


def test_gradients_are_resident_as_gradients_on_the_node():
    # The backward region's values travel with residency Gradient (genie.semantics' residency,
    # once per graph structure): the node counts exactly the parameters' gradients under that
    # class, the weights (updated in place by the optimizer) stay weights.
    import genie

    def resident() -> dict:
        return genie.memory_stats(DEV)["resident"]

    before = resident()
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(DEV)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 16).to(DEV), torch.randint(0, 4, (8,)).to(DEV)
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    for _ in range(3):
        optimizer.zero_grad(set_to_none=False)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        loss.item()
        now = resident()
        assert now["Gradient"] - before["Gradient"] == nbytes  # every .grad, nothing else
        assert now["PersistentWeight"] - before["PersistentWeight"] == nbytes
    del model, optimizer, loss
    torch.remote_accelerator.synchronize()
    assert resident()["Gradient"] == before["Gradient"]
    assert resident()["PersistentWeight"] == before["PersistentWeight"]
