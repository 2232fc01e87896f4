"""The demo's loaders and harness on the local CPU: offline, deterministic, checks that pass and fail.

The remote device is not involved (``--device cpu``); small inputs keep this under a minute on
two cores.
"""
import importlib.util
import json
import os
import pathlib
import socket
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
try:
    import genie.demo  # noqa: F401 - installed with `pip install -e .`
    PYTHONPATH = os.environ.get("PYTHONPATH", "")
except ImportError:
    sys.path.insert(0, str(ROOT / "python"))
    PYTHONPATH = os.pathsep.join(p for p in (str(ROOT / "python"), os.environ.get("PYTHONPATH")) if p)

from genie.demo import harness, models  # noqa: E402

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@pytest.fixture
def no_network(monkeypatch):
    """Any connection attempt fails: the loaders must not download anything."""
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)

    def refuse(self, address):
        raise OSError(f"test: network access to {address} refused")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    harness.quiet_libraries()


def test_minilm_embedding_matches_sentence_transformers(no_network):
    workload = models.load_minilm(4)
    assert (pathlib.Path(models.minilm_model_dir()) / "model.safetensors").is_file()
    embeddings = workload.run(workload.model, "cpu")
    assert embeddings.shape == (4, 384) and embeddings.dtype == torch.float32
    torch.testing.assert_close(embeddings.norm(dim=1), torch.ones(4))
    reference = models.minilm_reference(workload.sentences)
    assert torch.nn.functional.cosine_similarity(embeddings, reference).min() > 0.99999
    # Paraphrases are closer than unrelated sentences (real weights, not random ones).
    similarity = embeddings @ embeddings.T
    assert similarity[0, 1] > 0.4 and similarity[2, 3] > 0.4 and similarity[0, 2] < 0.2


def test_resnet50_photos_are_offline_and_normalized(no_network):
    workload = models.load_resnet50(2)
    assert workload.photos == ("astronaut", "coffee")
    assert workload.images.shape == (2, 3, 224, 224)
    assert -1.0 < workload.images.mean().item() < 1.0
    for name in models.PHOTOS:  # every photograph ships with scikit-image
        image = models.load_photo(name)
        assert image.ndim == 3 and image.shape[2] == 3 and image.dtype.name == "uint8"
    assert len(models.imagenet_categories()) == 1000


def test_resnet50_is_deterministic(no_network):
    first, second = models.load_resnet50(1), models.load_resnet50(1)
    assert torch.equal(first.model.fc.weight, second.model.fc.weight)


def test_gpt2_step_recorder_sees_every_token(no_network):
    workload = models.load_gpt2(max_new_tokens=3, n_layer=1)
    steps = []
    ids = workload.run(workload.model, "cpu", hook=steps.append)
    assert ids.shape == (1, 3) and ids.dtype == torch.long
    assert steps == [0, 1, 2]
    assert len(workload.recorders[-1].step_seconds()) == 2
    assert torch.equal(ids, workload.run(workload.model, "cpu"))   # greedy: the same ids again


def test_checks_detect_differences(no_network):
    gpt2 = models.load_gpt2(max_new_tokens=3, n_layer=1)
    ids = gpt2.run(gpt2.model, "cpu")
    assert harness.check_gpt2(gpt2, ids, ids.clone()).passed
    other = ids.clone()
    other[0, 1] += 1
    failed = harness.check_gpt2(gpt2, ids, other)
    assert not failed.passed and failed.details["first_difference"] == 1

    class Photos:
        photos = ("a", "b")
    logits = torch.arange(2000, dtype=torch.float32).reshape(2, 1000)
    assert harness.check_resnet50(Photos, logits, logits.clone()).passed
    assert not harness.check_resnet50(Photos, logits, logits.flip(1)).passed

    class Sentences:
        sentences = ("x", "y", "z")
    embeddings = torch.nn.functional.normalize(torch.randn(3, 384), dim=1)
    assert harness.check_minilm(Sentences, embeddings, embeddings.clone()).passed
    noisy = torch.nn.functional.normalize(embeddings + 0.05 * torch.randn(3, 384), dim=1)
    assert not harness.check_minilm(Sentences, embeddings, noisy).passed


def test_demo_cli_on_cpu(tmp_path):
    """`python -m genie.demo --device cpu` as a user runs it, with small inputs: every check passes."""
    out = tmp_path / "demo.json"
    env = dict(os.environ, **OFFLINE, PYTHONPATH=PYTHONPATH)
    proc = subprocess.run(
        [sys.executable, "-m", "genie.demo", "--device", "cpu", "--models", "minilm,gpt2,resnet50", "--quick",
         "--max-new-tokens", "3", "--rounds", "2", "--json", str(out)],
        env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all checks passed" in proc.stdout
    report = json.loads(out.read_text())
    assert report["passed"] and not report["counters_available"]
    assert [m["model"] for m in report["models"]] == ["minilm", "gpt2", "resnet50"]
    gpt2 = report["models"][1]
    # Two rounds of 3 new tokens: 2 decode steps each, pooled.
    assert gpt2["rounds"] == 2 and gpt2["device"]["step"]["steps"] == 4 and gpt2["device"]["counters"] is None


def test_demo_flags():
    from genie.demo.__main__ import parse_args

    args = parse_args(["--device", "cpu", "--models", "gpt2, resnet50", "--quick"])
    assert args.models == ["gpt2", "resnet50"] and args.quick and args.device == "cpu"
    assert parse_args([]).device == "remote_accelerator:0" and parse_args([]).rounds == 3
    with pytest.raises(SystemExit):
        parse_args(["--rounds", "0"])
    with pytest.raises(SystemExit):
        parse_args(["--models", "bert"])


def test_bench_models_smoke(no_network, capsys):
    """perf/bench_models.py's library path, in process: one round of MiniLM on the CPU."""
    spec = importlib.util.spec_from_file_location("bench_models", ROOT / "perf" / "bench_models.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--device", "cpu", "--models", "minilm", "--quick", "--repeat", "1", "--json", "-"]) == 0
    report = json.loads(capsys.readouterr().out)
    (minilm,) = report["models"]
    assert minilm["passed"] and len(minilm["ratio"]) == 1 and minilm["device_counters"] is None
    assert report["machine"]["cpu_count"] == os.cpu_count()
