"""Operator libraries beyond aten on the node: `genie-node --load-library`, and the embedded node
loading what the program loaded (`torch.ops.loaded_libraries`: torchvision's ops)."""
import subprocess
import sys

from conftest import BIN

PROGRAM = r"""
import torch, torchvision, genie
dev = "remote_accelerator:0"
torch.manual_seed(0)
boxes = torch.rand(40, 4) * 50
boxes[:, 2:] += boxes[:, :2]
scores = torch.rand(40)
features = torch.randn(1, 4, 16, 16)
rois = torch.tensor([[0, 1.0, 1.0, 9.0, 9.0], [0, 4.0, 2.0, 15.0, 12.0]])
local = (torchvision.ops.nms(boxes, scores, 0.5), torchvision.ops.roi_align(features, rois, (3, 3), 0.5, 2))
remote = (torchvision.ops.nms(boxes.to(dev), scores.to(dev), 0.5),
          torchvision.ops.roi_align(features.to(dev), rois.to(dev), (3, 3), 0.5, 2))
assert remote[0].device == torch.device(dev)
assert torch.equal(remote[0].cpu(), local[0]), (remote[0].cpu(), local[0])
torch.testing.assert_close(remote[1].cpu(), local[1])
print("ok", len(local[0]))
"""


def test_torchvision_ops_run_on_the_embedded_node():
    # A fresh interpreter: the embedded node must start after torchvision is imported.
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1].startswith("ok "), done.stdout


def test_a_library_that_cannot_be_loaded_stops_the_node_with_its_name():
    done = subprocess.run([str(BIN / "genie-node"), "--listen", "127.0.0.1:0", "--load-library", "/nonexistent/ops.so"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--load-library /nonexistent/ops.so" in done.stderr
