"""python -m genie.compile.worker, run as genie-node runs it: a wire graph and a spec in, an AOT
Inductor package out, loaded here and compared with eager. One package is compiled for the
whole file (tens of seconds on a small machine); the failures stop before compiling."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import genie._C as C

aten = torch.ops.aten
ref = C.TensorRef
PREFIX = "genie.compile.worker: "

# Inputs x (0), w (1), b (2), idx (3). Value ids of the node outputs in the comments.
NODES = [
    ("aten::t", "", [("", ref(1))], 1),                                                   # 4
    ("aten::addmm", "", [("", ref(2)), ("", ref(0)), ("", ref(4))], 1),                   # 5
    ("aten::relu", "", [("", ref(5))], 1),                                                # 6
    ("aten::mul", "Tensor", [("", ref(6)), ("", 2)], 1),                                  # 7: wrapped number
    ("aten::var_mean", "correction", [("", ref(7)), ("", [1]), ("keepdim", True)], 2),    # 8, 9
    ("aten::split_with_sizes", "", [("", ref(7)), ("", [2, 3]), ("dim", 1)], 2),          # 10, 11
    ("aten::ones", "", [("", [4, 5]), ("dtype", torch.float32),
                        ("device", torch.device("cuda", 3))], 1),                         # 12: device rewritten
    ("aten::add", "Tensor", [("", ref(9)), ("", ref(12))], 1),                            # 13
    ("aten::mul", "Tensor", [("", ref(3)), ("", 0.5)], 1),                                # 14: int64 * 0.5
]
OUTPUTS = [6, 8, 10, 11, 13, 14]
INPUTS = [  # x transposed, b at storage offset 3
    {"dtype": "float32", "sizes": [4, 8], "strides": [1, 4], "storage_offset": 0},
    {"dtype": "float32", "sizes": [5, 8], "strides": [8, 1], "storage_offset": 0},
    {"dtype": "float32", "sizes": [5], "strides": [1], "storage_offset": 3},
    {"dtype": "int64", "sizes": [4], "strides": [1], "storage_offset": 0},
]


def eager(x, w, b, idx):
    """The graph's outputs, op by op, as eager computes them."""
    h = aten.relu(aten.addmm(b, x, aten.t(w)))
    m = aten.mul.Tensor(h, 2)
    var, mean = aten.var_mean.correction(m, [1], keepdim=True)
    first, second = aten.split_with_sizes(m, [2, 3], dim=1)
    return [h, var, first, second, aten.add.Tensor(mean, aten.ones([4, 5], dtype=torch.float32)),
            aten.mul.Tensor(idx, 0.5)]


def random_inputs():
    x = torch.randn(8, 4).t()
    w = torch.randn(5, 8)
    b = torch.randn(8).as_strided([5], [1], 3)
    idx = torch.randint(-10, 10, (4,))
    return x, w, b, idx


def run_worker(tmp_path, graph: bytes, spec: dict, *extra):
    (tmp_path / "graph.bin").write_bytes(graph)
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    out = tmp_path / "package.pt2"
    done = subprocess.run([sys.executable, "-m", "genie.compile.worker", "--graph", str(tmp_path / "graph.bin"),
                           "--spec", str(tmp_path / "spec.json"), "--out", str(out), *extra],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    return done, out


def spec_of(inputs=INPUTS, outputs=OUTPUTS):
    return {"device": "cpu", "inputs": inputs, "outputs": outputs, "mode": "default"}


def reason(done) -> str:
    """The worker's failure line (torch may log warnings before it)."""
    lines = [line for line in done.stderr.splitlines() if line.startswith(PREFIX)]
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return lines[0][len(PREFIX):]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """(result line, package path) of the one compile of this file."""
    tmp_path = tmp_path_factory.mktemp("worker")
    graph = C.encode_graph([(torch.float32, None)] * 3 + [(torch.int64, None)], 0, NODES)
    done, out = run_worker(tmp_path, graph, spec_of())
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout  # the compilers' output went to stderr
    return json.loads(lines[0]), out


def test_help_prints_and_does_nothing_else(tmp_path):
    done = subprocess.run([sys.executable, "-m", "genie.compile.worker", "--help"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "--graph" in done.stdout and "--spec" in done.stdout, done.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_package_computes_what_eager_computes(compiled):
    result, package = compiled
    assert result["package"] == str(package) and result["nodes"] == len(NODES) and result["compile_s"] > 0
    assert [p.name for p in package.parent.iterdir() if p.suffix == ".pt2"] == ["package.pt2"]  # no temporaries
    model = torch._inductor.aoti_load_package(str(package))
    for _ in range(2):
        inputs = random_inputs()
        got, want = model(*inputs), eager(*inputs)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)


def test_the_package_metadata_gives_the_eager_outputs(compiled):
    _, package = compiled
    metadata = torch._inductor.aoti_load_package(str(package)).get_metadata()
    want = ";".join(f"{str(t.dtype).removeprefix('torch.')}:{','.join(map(str, t.shape))}:{','.join(map(str, t.stride()))}"
                    for t in eager(*random_inputs()))
    assert metadata["genie.outputs"] == want
    assert want.endswith(";float32:4:1")  # int64 * 0.5 is float32: 0.5 was a wrapped number


def test_an_unknown_op_fails_naming_it(tmp_path):
    graph = C.encode_graph([(torch.float32, None)], 0, [("aten::no_such_op", "", [("", ref(0))], 1)])
    done, out = run_worker(tmp_path, graph, spec_of(INPUTS[:1], [1]))
    assert reason(done) == "nodes[0] (aten::no_such_op.default): no such operator or overload is registered"
    assert not out.exists()


def test_a_spec_with_another_input_count_fails(tmp_path):
    graph = C.encode_graph([(torch.float32, None)] * 3 + [(torch.int64, None)], 0, NODES)
    done, out = run_worker(tmp_path, graph, spec_of(INPUTS[:3]))
    assert reason(done).endswith("gives 3 inputs, the graph takes 4")
    assert not out.exists()


@pytest.mark.parametrize("inputs,num_scalar_inputs,expected", [
    ([(torch.float32, None)], 1, "num_scalar_inputs must be 0"),
    ([(torch.float32, b"h" * 16)], 0, "inputs[0] is bound to resident handle"),
])
def test_graphs_a_package_cannot_take_are_refused(tmp_path, inputs, num_scalar_inputs, expected):
    graph = C.encode_graph(inputs, num_scalar_inputs, [("aten::relu", "", [("", ref(0))], 1)])
    done, _ = run_worker(tmp_path, graph, spec_of(INPUTS[:1], [1]))
    assert expected in reason(done)


def test_a_failing_op_is_named_and_bad_bytes_are_refused(tmp_path):
    graph = C.encode_graph([(torch.float32, None)], 0, [("aten::mm", "", [("", ref(0)), ("", ref(0))], 1)])
    done, _ = run_worker(tmp_path, graph, spec_of(INPUTS[:1], [1]))
    assert reason(done).startswith("nodes[0] (aten::mm.default): RuntimeError: ")
    done, _ = run_worker(tmp_path, b"not a graph", spec_of(INPUTS[:1], [1]), "--verbose")
    assert done.returncode == 1 and "Traceback" in done.stderr
    assert done.stderr.splitlines()[-1].startswith(PREFIX + "graph ") and "decode_graph: Graph" in done.stderr
