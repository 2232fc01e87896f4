"""genie-node on a GPU (`--device cuda:0`): results equal to local CUDA eager on the same GPU, a
CUDA out-of-memory that fails only its request, the default memory limit taken from the
device, one session's upload overlapping another session's kernels (a CUDA stream per
session), and torch.compile(backend="genie") run by the node's GPU package, replayed as a CUDA
graph in mode "reduce-overhead". Every test needs a CUDA device and is skipped without one (tools/gpu-check.sh runs
them on a machine with a GPU; CI has none)."""
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import genie

from conftest import BIN, NodeProcess

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (tools/gpu-check.sh)")

REMOTE = "remote_accelerator:0"


@pytest.fixture
def cuda_node():
    node = NodeProcess(extra_args=["--device", "cuda:0"])
    genie.init(server=node.address)
    try:
        yield node
    finally:
        genie.shutdown()
        node.stop()


def _close(remote, local, atol=1e-4, rtol=1e-4):
    remote, local = remote.cpu(), local.cpu()
    torch.testing.assert_close(remote, local, atol=atol, rtol=rtol)


def test_the_node_runs_on_the_gpu(cuda_node):
    assert genie.get_device(0).device == "cuda:0"  # the node's own device (its Welcome)
    x = torch.randn(64, 64)
    _close((x.to(REMOTE) @ x.to(REMOTE)).sin(), (x.cuda() @ x.cuda()).sin())


def test_gpt2_equals_local_cuda_eager(cuda_node):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=4096)).eval()
    ids = torch.randint(0, 4096, (2, 24))
    local = model.to("cuda")
    with torch.no_grad():
        local_logits = local(ids.cuda()).logits
        local_tokens = local.generate(ids.cuda(), max_new_tokens=12, do_sample=False, pad_token_id=0)
    remote = local.to(REMOTE)
    with torch.no_grad():
        remote_logits = remote(ids.to(REMOTE)).logits
        remote_tokens = remote.generate(ids.to(REMOTE), max_new_tokens=12, do_sample=False, pad_token_id=0)
    _close(remote_logits, local_logits, atol=2e-4, rtol=2e-4)
    assert torch.equal(remote_tokens.cpu(), local_tokens.cpu())


def test_bert_and_resnet_equal_local_cuda_eager(cuda_node):
    import torchvision
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    # MiniLM-L6's shape (sentence-transformers/all-MiniLM-L6-v2), random weights.
    bert = BertModel(BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                                intermediate_size=1536)).eval().cuda()
    ids = torch.randint(0, 30522, (4, 32))
    mask = torch.ones_like(ids)
    mask[1, 20:] = 0
    with torch.no_grad():
        local = bert(input_ids=ids.cuda(), attention_mask=mask.cuda()).last_hidden_state
        bert.to(REMOTE)
        remote = bert(input_ids=ids.to(REMOTE), attention_mask=mask.to(REMOTE)).last_hidden_state
    _close(remote, local, atol=2e-4, rtol=2e-4)

    resnet = torchvision.models.resnet18(weights=None).eval().cuda()
    images = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        local = resnet(images.cuda())
        resnet.to(REMOTE)
        remote = resnet(images.to(REMOTE))
    _close(remote, local, atol=1e-3, rtol=1e-3)


_TRAIN = textwrap.dedent("""
    import sys, torch
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))
    x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
    device = sys.argv[2]
    if device.startswith("remote_accelerator"):
        import genie
        genie.init(server=sys.argv[3])
    net.to(device)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-2)
    for _ in range(3):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(net(x.to(device)), y.to(device)).backward()
        optimizer.step()
    torch.save({k: v.cpu() for k, v in net.state_dict().items()}, sys.argv[1])
""")


def test_training_steps_equal_local_cuda_eager(cuda_node, tmp_path):
    """Three AdamW steps of an MLP on the node and on the local GPU. Each in a process of its
    own: in a process that registered a PrivateUse1 backend (import genie) PyTorch's autograd
    engine fails a CUDA backward (at::getAccelerator() names one accelerator;
    pytorch/pytorch#161129)."""
    trained = {}
    for device in ("cuda", REMOTE):
        out = tmp_path / f"{device.replace(':', '_')}.pt"
        done = subprocess.run([sys.executable, "-c", _TRAIN, str(out), device, cuda_node.address],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        trained[device] = torch.load(out)
    for name, value in trained["cuda"].items():
        torch.testing.assert_close(trained[REMOTE][name], value, atol=1e-5, rtol=1e-5)


def test_direct_uploads_land_in_device_memory():
    """--gpu-upload direct: UCX writes the payloads into device memory (one tensor, and a
    PutTensors of many, through a device staging buffer), values as sent."""
    node = NodeProcess(extra_args=["--device", "cuda:0", "--gpu-upload", "direct"])
    genie.init(server=node.address)
    try:
        torch.manual_seed(0)
        big = torch.randn(1 << 22)  # 16 MiB: rendezvous
        small = torch.randn(7)      # eager
        assert torch.equal(big.to(REMOTE).cpu(), big)
        assert torch.equal((small.to(REMOTE) * 1).cpu(), small)
        model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(8)])  # many small tensors
        expected = model(torch.ones(2, 16))
        model.to(REMOTE)
        torch.testing.assert_close(model(torch.ones(2, 16, device=REMOTE)).cpu(), expected, atol=1e-5, rtol=1e-5)
    finally:
        genie.shutdown()
        node.stop()


def test_the_default_memory_limit_is_the_devices_free_memory(cuda_node):
    free, _ = torch.cuda.mem_get_info(0)
    limit = genie.get_device(0).memory_limit
    # 90 % of what was free when the node started; this process's CUDA context came after.
    assert 0 < limit <= free


def test_cuda_out_of_memory_fails_that_request_only():
    free, _ = torch.cuda.mem_get_info(0)
    node = NodeProcess(extra_args=["--device", "cuda:0", "--memory-limit", "64T"])  # the device's allocator decides
    genie.init(server=node.address)
    try:
        too_big = free // 4 * 2  # elements of float32: twice the free bytes
        with pytest.raises(Exception, match="(?i)out of memory"):
            torch.ones(too_big, device=REMOTE).sum().item()
        x = torch.arange(10.0, device=REMOTE)  # the session goes on
        assert (x * 2).sum().item() == 90.0
    finally:
        genie.shutdown()
        node.stop()


_COMPUTE = textwrap.dedent("""
    import sys, time, torch, genie
    genie.init(server=sys.argv[1])
    x = torch.randn(8192, 8192, device="remote_accelerator:0") / 8192 ** 0.5
    torch.randn(8, device="remote_accelerator:0").sum().item()  # connected, weights there
    for _ in range(int(sys.argv[2])):
        x = torch.tanh(x @ x)
    print("sent", time.time(), flush=True)
    value = x.sum().item()  # the whole chain runs on the node now
    print("done", time.time(), value, flush=True)
""")


def test_one_sessions_upload_overlaps_another_sessions_compute(cuda_node):
    """Session B runs a chain of 8192² fp32 products (seconds of kernels); session A uploads
    256 MiB and reads one value of it back while B's kernels run. On one stream for the whole
    device A's copy would queue behind B's chain; with a stream per session it lands first."""
    probe = torch.randn(8192, 8192, device="cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(5):
        probe = torch.tanh(probe @ probe)
    torch.cuda.synchronize()
    per_product = (time.perf_counter() - start) / 5
    del probe
    torch.cuda.empty_cache()
    products = max(20, int(3.0 / per_product))  # about 3 s of kernels

    payload = torch.full((64 << 20,), 1.5)  # 256 MiB
    # Once before: the node's caching allocator then holds a block of this size for this
    # session's stream. A cudaMalloc, as a first upload of a size needs, waits for the whole
    # device (CUDA's implicit synchronization), whatever the stream.
    warm = payload.to(REMOTE)
    assert warm[0].item() == 1.5
    del warm
    genie.synchronize()

    compute = subprocess.Popen([sys.executable, "-c", _COMPUTE, cuda_node.address, str(products)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "GENIE_NODE_BIN": str(BIN / "genie-node")})
    try:
        line = compute.stdout.readline()
        assert line.startswith("sent"), (line, compute.stderr.read())
        time.sleep(0.5)  # B's graph has reached the node and its kernels are queued
        uploaded = payload.to(REMOTE)
        assert uploaded[-1].item() == 1.5
        upload_done = time.time()
        done = compute.stdout.readline().split()
        assert compute.wait(timeout=120) == 0, compute.stderr.read()
    finally:
        if compute.poll() is None:
            compute.kill()
    assert done[0] == "done"
    compute_done = float(done[1])
    assert upload_done < compute_done, (
        f"the upload finished {upload_done - compute_done:.3f} s after the other session's "
        f"{products} products ({per_product * 1e3:.1f} ms each locally): it waited for them")


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_a_compiled_decode_runs_by_the_gpu_package(cuda_node, tmp_path, mode):
    """GPT-2 decoding with a StaticCache, compiled: the node builds its package for the GPU and
    runs every decode step by it, with the ids of local CUDA eager. In mode "reduce-overhead"
    the package's run is captured as a CUDA graph after two warm-up runs and replayed; the
    token and the position (new tensors each step) are copied into the graph's buffers, and a
    new generation's cache (fixed inputs elsewhere) is captured again."""
    from test_compile import _static_cache_decode, _tiny_gpt2

    prompt = torch.tensor([[5, 17, 42, 8, 33, 1]])
    local = _tiny_gpt2().cuda()
    expected = _static_cache_decode(local, local, "cuda", prompt, 12).cpu()
    remote = _tiny_gpt2().to(REMOTE)
    compiled = torch.compile(remote, backend="genie", dynamic=False, mode=mode)
    deadline = time.monotonic() + 300
    while True:  # whole generations until one ran every decode step by the package
        start = genie.memory_stats(REMOTE)["package_calls"]
        assert torch.equal(_static_cache_decode(remote, compiled, REMOTE, prompt, 12), expected)
        if genie.memory_stats(REMOTE)["package_calls"] - start >= 11:
            break
        assert time.monotonic() < deadline, genie.memory_stats(REMOTE)
        time.sleep(1.0)
    before = genie.memory_stats(REMOTE)
    for _ in range(2):  # two more generations, each with a new StaticCache
        assert torch.equal(_static_cache_decode(remote, compiled, REMOTE, prompt, 12), expected)
    after = genie.memory_stats(REMOTE)
    assert after["package_calls"] - before["package_calls"] == 22, after
    replays = after["cuda_graph_replays"] - before["cuda_graph_replays"]
    if mode == "default":
        assert replays == 0
    else:
        report = genie.explain(lambda: _static_cache_decode(remote, compiled, REMOTE, prompt, 12))
        facts = [f for fn in report.compiled for g in fn["graphs"] for p in g["parts"] for f in p.get("node", [])]
        assert replays == 22, (after, facts)
        assert facts and all(f["cuda_graph_replays"] > 0 and f["reason"] == "" for f in facts), facts
        assert "CUDA graph replays" in str(report)
