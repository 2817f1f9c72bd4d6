"""Tests for autotune.trial.profiling on CPU: small steps, so the whole file runs in seconds."""

import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType

from autotune.trial.profiling import _host_syncs, _union_within, memory_categories, profile_steps
from autotune.trial.protocol import WorkKind

CPU = torch.device("cpu")


def make_step(optimizer_cls=torch.optim.AdamW, items: int = 0):
    """A tiny Linear model's training step that reads the loss back `items` times."""
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 8)
    opt = optimizer_cls(model.parameters(), lr=1e-3)
    x, y = torch.randn(16, 32), torch.randn(16, 8)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        for _ in range(items):
            loss.item()

    return step


def test_profile_summary_and_trace(tmp_path):
    trace = tmp_path / "nested" / "trace.json"
    summary = profile_steps(make_step(), steps=3, device=CPU, trace_path=trace, top=5)

    assert summary.steps == 3
    assert summary.window_s > 0
    assert summary.device_idle_fraction is None
    assert summary.self_device_total_s is None
    assert summary.self_cpu_total_s > 0
    ops = summary.top_operators
    assert 0 < len(ops) <= 5
    assert all(not op.name.startswith("ProfilerStep") for op in ops)
    assert [op.self_time_s for op in ops] == sorted((op.self_time_s for op in ops), reverse=True)
    assert all(op.total_time_s >= op.self_time_s > 0 for op in ops)
    assert 0 < sum(op.share for op in ops) <= 1 + 1e-9
    json.dumps(dataclasses.asdict(summary))

    assert summary.trace_path == str(trace)
    events = json.loads(trace.read_text())["traceEvents"]
    assert events
    # named as torch.profiler's schedule names steps, which TensorBoard's plugin splits on
    steps = sorted(ev["name"] for ev in events if ev.get("name", "").startswith("ProfilerStep#"))
    assert steps == ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"]


def test_a_profiled_step_says_where_its_operator_time_goes_by_kind_of_work() -> None:
    """An attention block's step: its matmuls, its attention and the rest each have a share,
    the shares whole; no kernels counted on a CPU."""
    torch.manual_seed(0)
    qkv, out = torch.nn.Linear(64, 192), torch.nn.Linear(64, 64)
    opt = torch.optim.SGD([*qkv.parameters(), *out.parameters()], lr=1e-3)
    x = torch.randn(8, 4, 128, 64)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        q, k, v = qkv(x).chunk(3, dim=-1)
        attended = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        out(torch.nn.functional.gelu(attended)).pow(2).mean().backward()
        opt.step()

    summary = profile_steps(step, steps=2, device=CPU)
    shares = summary.work_shares
    assert {WorkKind.MATMUL, WorkKind.ATTENTION, WorkKind.ELEMENTWISE} <= set(shares)
    assert sum(shares.values()) == pytest.approx(1.0)
    assert list(shares.values()) == sorted(shares.values(), reverse=True)
    assert summary.kernels_per_step is None


@pytest.mark.parametrize("items", [0, 2])
def test_host_syncs_count_scalar_reads_once(items):
    # SGD: AdamW reads its step counters with .item() inside step() on CPU.
    summary = profile_steps(make_step(torch.optim.SGD, items=items), steps=3, device=CPU)
    assert summary.host_syncs_per_step == items
    assert (summary.host_sync_s_per_step > 0) == (items > 0)


def test_a_step_run_as_the_optimizers_closure_is_the_models_time_and_syncs() -> None:
    """Lightning runs the forward and backward inside `optimizer.step(closure)`: that time and
    a loss read before the backward are the model's, as when the same step is written out
    (the optimizer's share 0.99 and no sync when the whole step counted; 0.01-0.1 here, by
    the machine's load)."""
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(512, 256)

    def closure() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = model(x).pow(2).mean()
        loss.item()
        loss.backward()
        return loss

    def written_out() -> None:
        closure()
        opt.step()

    closed = profile_steps(lambda: opt.step(closure), steps=3, device=CPU)
    plain = profile_steps(written_out, steps=3, device=CPU)
    assert closed.host_syncs_per_step == plain.host_syncs_per_step == 1
    assert closed.optimizer_fraction < 0.5 and plain.optimizer_fraction < 0.5


def test_rejects_zero_steps():
    with pytest.raises(ValueError):
        profile_steps(make_step(), steps=0, device=CPU)


def test_union_within_merges_overlaps_and_clips():
    intervals = [(0, 4), (2, 6), (3, 5), (8, 12), (20, 30)]
    # [1, 10] holds [1, 6] and [8, 10]: overlapping streams count once.
    assert _union_within(intervals, 1, 10) == 7
    assert _union_within([], 0, 10) == 0


def _event(name, start, end, parent=None):
    evt = SimpleNamespace(
        name=name,
        device_type=DeviceType.CPU,
        time_range=SimpleNamespace(start=start, end=end, elapsed_us=lambda: end - start),
        cpu_parent=parent,
        cpu_children=[],
    )
    if parent is not None:
        parent.cpu_children.append(evt)
    return evt


def test_host_syncs_cuda_rules():
    """CUDA nesting (can't be profiled on this CPU-only machine): aten::item >
    aten::_local_scalar_dense > cudaStreamSynchronize counts once; a scalar read of a CPU
    tensor (an optimizer's step counter) does not wait on the device and does not count."""
    real = _event("aten::item", 10, 20)
    dense = _event("aten::_local_scalar_dense", 11, 19, real)
    _event("cudaMemcpyAsync", 12, 13, dense)
    _event("cudaStreamSynchronize", 13, 18, dense)
    cpu_read = _event("aten::item", 30, 31)
    _event("aten::_local_scalar_dense", 30, 31, cpu_read)
    bare = _event("cudaDeviceSynchronize", 40, 44)
    outside = _event("cudaDeviceSynchronize", 60, 70)  # the profiler's closing sync
    events = [real, *real.cpu_children, *dense.cpu_children, cpu_read, bare, outside]
    events += cpu_read.cpu_children
    steps = [(0, 50)]

    assert _host_syncs(events, steps, on_cuda=True) == (2, 14)
    # On CPU every scalar read counts, still once per nest.
    assert _host_syncs(events, steps, on_cuda=False) == (3, 15)


def test_memory_categories_hold_parameters_and_optimizer_state() -> None:
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(8, 64)
    with torch.profiler.profile(record_shapes=True, profile_memory=True,
                                with_stack=True) as prof:
        for _ in range(2):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
    times, series = memory_categories(prof, torch.device("cpu"))
    assert times[0] == 0 and times == sorted(times)
    weights = 64 * 64 * 4 + 64 * 4
    assert series["parameter"][0] == weights  # held from the start
    assert max(series["optimizer_state"]) >= 2 * weights  # AdamW's two moments
