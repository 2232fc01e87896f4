"""Common ops through perf/op_coverage.py's OpInfo harness: CPU reference vs remote_accelerator.

The full sweep over op_db is `perf/op_coverage.py` (report: docs/perf/op_coverage.md); this
runs ~40 ops every model uses, 4 float32 samples each, and fails naming each op's reason.
"""

import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

COMMON_OPS = [
    "add", "mul", "matmul", "mm", "bmm", "addmm", "nn.functional.relu", "nn.functional.gelu", "softmax",
    "log_softmax", "nn.functional.layer_norm", "nn.functional.conv2d", "nn.functional.max_pool2d",
    "nn.functional.avg_pool2d", "nn.functional.batch_norm", "nn.functional.embedding", "cat", "stack",
    "transpose", "permute", "reshape", "view", "sum", "mean", "amax", "argmax", "where", "masked_fill",
    "index_select", "gather", "cumsum", "topk", "sort", "tril", "triu", "clamp", "pow", "exp", "tanh",
    "sigmoid", "nn.functional.scaled_dot_product_attention",
    # Once failures: a conjugate view's bytes (fft.ifft), meta vs CPU kernel shapes (native_batch_norm eval),
    # complex32 on the wire (chalf), a Python custom op inside a function (its .chunked variants).
    "fft.ifft", "native_batch_norm", "chalf", "nn.functional.linear_cross_entropy",
]
SAMPLES = 4


def _load_harness():
    spec = importlib.util.spec_from_file_location("genie_op_coverage", ROOT / "perf" / "op_coverage.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def harness():
    return _load_harness()


@pytest.fixture(scope="module")
def rows(harness):
    op_db = harness.load_op_db()
    return harness.select_ops(op_db, COMMON_OPS)


def test_every_common_op_is_in_op_db(harness, rows):
    names = {r.name for r in rows}
    assert set(COMMON_OPS) <= names, f"not in op_db: {sorted(set(COMMON_OPS) - names)}"


def test_common_ops_match_the_cpu(harness, rows):
    results = [harness.run_opinfo(r, max_samples=SAMPLES) for r in rows]
    # A variant without float32 on the CPU (batch_norm.without_cudnn) is not a failure; any other
    # row that does not pass is, and so is an op none of whose rows passes.
    failed = [r for r in results if r["status"] not in ("pass", "n/a (no float32)")]
    passing = {r["op"] for r in results if r["status"] == "pass"}
    failed += [{"name": op, "status": "no row of this op passes"} for op in COMMON_OPS if op not in passing]
    report = "\n".join(
        f"  {r['name']}: {r['status']}"
        + (f" (sample {r['sample']}, {r['stage']}, {r['category']}): {r['reason']}" if r["status"] == "fail" else "")
        for r in failed)
    print(f"{sum(r['status'] == 'pass' for r in results)}/{len(results)} common op_db rows pass" + (":\n" + report if report else ""))
    assert not failed, f"{len(failed)} of {len(results)} common op_db rows do not pass:\n{report}"
