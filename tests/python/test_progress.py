"""Progress bars of long transfers (genie.progress): shown under a terminal, never in a pipe or
with GENIE_PROGRESS=0, and a large read in slices returns the same values and bytes as one read.

Each case runs a real program against an embedded genie-node: a module of 32 MiB moved to the
device and back, and a 76 MiB tensor read. The program sets progress.DELAY_S to 0 so that the
bars do not depend on how fast this machine moves 32 MiB."""
import fcntl
import os
import pathlib
import struct
import subprocess
import sys
import termios

PROGRAM = r'''
import torch, genie
from genie import progress
progress.DELAY_S = 0.0
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)])
expected = model[3].weight.detach().clone()
model.to("remote_accelerator:0")
x = torch.arange(20_000_000, dtype=torch.float32)
y = x.to("remote_accelerator:0") * 2
before = genie.client_stats()["bytes_received"]
z = y.cpu()
received = genie.client_stats()["bytes_received"] - before
assert torch.equal(z, x * 2), "the read in slices differs"
assert z.shape == x.shape and z.is_contiguous()
assert x.nbytes <= received < x.nbytes * 1.01, f"{received} bytes received for a {x.nbytes}-byte read"
model.cpu()
assert model[3].weight.device.type == "cpu" and torch.equal(model[3].weight, expected)
print("program ok", flush=True)
'''

BARS = ("genie: Sequential to remote_accelerator:0", "genie: reading (20000000,) from remote_accelerator:0",
        "genie: Sequential from remote_accelerator:0")


def _run(tmp_path: pathlib.Path, terminal: bool, **env) -> str:
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    environment = dict(os.environ, **env)
    if not terminal:
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=environment,
                              timeout=180)
        output = done.stdout + done.stderr
        assert done.returncode == 0, output
        return output
    controller, terminal_end = os.openpty()
    fcntl.ioctl(terminal_end, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # 24 rows, 120 columns
    process = subprocess.Popen([sys.executable, str(script)], stdin=terminal_end, stdout=terminal_end,
                               stderr=terminal_end, env=environment)
    os.close(terminal_end)
    chunks = []
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # EIO: the program closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(controller)
    assert process.wait(timeout=180) == 0, b"".join(chunks).decode(errors="replace")
    return b"".join(chunks).decode(errors="replace")


def test_a_terminal_shows_the_bars_of_module_moves_and_large_reads(tmp_path):
    output = _run(tmp_path, terminal=True)
    assert "program ok" in output
    for bar in BARS:
        assert bar in output, f"no bar {bar!r} in:\n{output}"
    assert "32.0M" in output and "76.3M" in output  # totals in bytes (MiB)


def test_a_pipe_shows_no_bar(tmp_path):
    output = _run(tmp_path, terminal=False)
    assert "program ok" in output
    assert "genie:" not in output and "%|" not in output, output


def test_genie_progress_off_shows_no_bar_on_a_terminal(tmp_path):
    output = _run(tmp_path, terminal=True, GENIE_PROGRESS="0")
    assert "program ok" in output
    assert "genie:" not in output and "%|" not in output, output
