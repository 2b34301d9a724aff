"""Meters: saved-activation bytes, state bytes, device choice."""

import pytest
import torch

from harness.modeling.device import choose_device_kind
from harness.modeling.tensor_bytes import optimizer_state_bytes, sum_tensor_bytes
from harness.runtime.meter import SavedActivationMeter


def test_saved_activation_peak_counts_saved_tensors_not_parameters():
    layer = torch.nn.Linear(64, 32, bias=False)
    x = torch.randn(8, 64)
    meter = SavedActivationMeter()
    with meter.recording():
        y = torch.relu(layer(x))  # linear saves its input x (8*64*4 B); relu saves its output (8*32*4 B)
        loss = y.sum()
    assert meter.peak_bytes == 8 * 64 * 4 + 8 * 32 * 4
    loss.backward()
    del y, loss
    assert meter.live_bytes == 0


def test_saved_activation_peak_is_the_in_flight_maximum():
    layer = torch.nn.Linear(16, 16, bias=False)
    meter = SavedActivationMeter()
    with meter.recording():
        for _ in range(3):  # one micro-batch at a time: backward frees before the next forward
            out = layer(torch.randn(4, 16)).pow(2).sum()
            out.backward()
            del out
    single = 4 * 16 * 4 * 2  # linear input + pow input
    assert meter.peak_bytes == single


def test_a_saved_output_is_released_when_its_graph_is_dropped_unrun():
    """A node that saves its own output (exp, rsqrt, SDPA) and is never run, as a zero-bubble input pass
    leaves the input-only nodes: dropping the graph must release the output's bytes (the meter holding
    the tensor itself, grad_fn included, would keep node and bytes alive in a cycle)."""
    meter = SavedActivationMeter()
    x = torch.randn(1000, requires_grad=True)
    with meter.recording():
        y = x.exp() * 2  # ExpBackward0 saves its output; MulBackward0 saves nothing of it
    assert meter.live_bytes == 4000
    torch.autograd.grad(y.sum(), y, retain_graph=True)  # reaches no node that would free the output
    del y
    assert meter.live_bytes == 0


def test_state_bytes_are_exact_and_deduplicated():
    w = torch.zeros(10, 10)
    assert sum_tensor_bytes([w, w, w[0]]) == 400 + 40  # a view with another size counts separately
    model = torch.nn.Linear(10, 10)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 10)).sum().backward()
    optimizer.step()
    # exp_avg + exp_avg_sq in fp32 for 110 parameters; the 0-d step counters are not counted
    assert optimizer_state_bytes(optimizer) == 2 * 110 * 4


def test_device_kind_choice():
    assert choose_device_kind("cpu", cuda_available=True).backend == "gloo"
    gpu = choose_device_kind("h100_sxm", cuda_available=True)
    assert (gpu.type, gpu.backend, gpu.has_allocator_stats) == ("cuda", "nccl", True)
    with pytest.raises(RuntimeError, match="h100_sxm"):
        choose_device_kind("h100_sxm", cuda_available=False)
