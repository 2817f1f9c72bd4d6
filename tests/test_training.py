"""`training`: every knob of a `TrainConfig` really takes effect on the model, optimizer, loader
and train step (on CPU; the GPU-only knobs are refused there)."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import subprocess
import sys
from collections import OrderedDict, defaultdict, namedtuple
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset, default_collate

from autotune.config import PRECISIONS, ConfigError, TrainConfig
from autotune.training import (
    BatchTransferError,
    Unsupported,
    apply_activation_checkpointing,
    make_loader,
    make_optimizer,
    move_to_device,
    set_matmul_precision,
    setup_from_workload,
    setup_training,
)
from autotune.workload import ContractError, load_workload

TEST_MODELS = Path(__file__).resolve().parent / "models"
CPU = torch.device("cpu")
DIM = 16


# --- small models and data -------------------------------------------------------------------

class Blocks(nn.Module):
    """Residual MLP blocks in an nn.ModuleList: what activation checkpointing applies to."""

    def __init__(self, dim: int = DIM, layers: int = 4) -> None:
        super().__init__()
        self.embed = nn.Linear(dim, dim)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
            for _ in range(layers))
        self.head = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = x + block(x)
        return nn.functional.mse_loss(self.head(x).squeeze(-1), y)


class NoList(nn.Module):
    """The same kind of model without any nn.ModuleList."""

    def __init__(self, dim: int = DIM) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim),
                                  nn.GELU())
        self.head = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(self.head(self.body(x)).squeeze(-1), y)


def regression_data(size: int = 64, dim: int = DIM) -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(size, dim, generator=g)
    return TensorDataset(x, x[:, :4].sum(dim=1))


def fixed_batch(dataset, n: int = 8):
    return default_collate([dataset[i] for i in range(n)])


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(DIM, 32), nn.ReLU(), nn.Linear(32, 1))


def mlp_loss(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.mse_loss(model(x).squeeze(-1).float(), y)


def saved_bytes(fn):
    """Bytes autograd saves for backward while `fn` runs its forward, and what `fn` returned."""
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return total, out


# --- precision -------------------------------------------------------------------------------

@pytest.mark.parametrize(("precision", "dtype"),
                         [("bf16", torch.bfloat16), ("fp32", torch.float32)])
def test_precision_sets_autocast_dtype_in_step(precision, dtype):
    torch.manual_seed(0)
    model = mlp()
    seen = []
    model[0].register_forward_hook(lambda m, args, out: seen.append(out.dtype))
    setup = setup_training(model, regression_data(), TrainConfig(micro_batch_size=8,
                                                                 precision=precision),
                           "cpu", loss_fn=mlp_loss)
    batches = setup.batches()
    result = setup.step(batches)
    assert seen == [dtype]
    assert torch.isfinite(result.loss)
    # autocast computes in low precision but the weights (and their updates) stay fp32
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_fp16_on_cpu_is_unsupported():
    with pytest.raises(Unsupported, match="fp16"):
        setup_training(mlp(), regression_data(), TrainConfig(precision="fp16"), "cpu",
                       loss_fn=mlp_loss)


def tf32_flags(new_api: bool = True) -> dict[str, object]:
    """Every reader of the TF32 settings, old API and new, as inductor and users read them."""
    flags = {"matmul precision": torch.get_float32_matmul_precision(),
             "matmul allow_tf32": torch.backends.cuda.matmul.allow_tf32,
             "cudnn allow_tf32": torch.backends.cudnn.allow_tf32}
    if new_api and hasattr(torch.backends, "fp32_precision"):  # torch 2.9 and later
        flags.update({"matmul fp32_precision": torch.backends.cuda.matmul.fp32_precision,
                      "cudnn conv fp32_precision": torch.backends.cudnn.conv.fp32_precision})
    return flags


# What a fresh process runs. (The new API says "none", not set, where the old one says what
# that means; the consistency test above checks both APIs agree.)
DEFAULT_FLAGS_SCRIPT = """
import json, torch
from tests.test_training import tf32_flags
print(json.dumps(tf32_flags(new_api=False)))
"""


@pytest.fixture
def restore_tf32():
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


@pytest.mark.parametrize("precision", PRECISIONS)
def test_tf32_settings_stay_readable_and_consistent(precision, restore_tf32):
    """Setting only the new API left the old readers raising "mix of the legacy and new
    APIs" (inductor's max-autotune reads them); on torch before 2.9 it did not exist."""
    for earlier in PRECISIONS:  # whatever was set before
        set_matmul_precision(earlier, torch.device("cuda"))
        set_matmul_precision(precision, torch.device("cuda"))
        flags = tf32_flags()
        tf32 = precision == "tf32"
        assert flags["matmul allow_tf32"] is tf32
        assert flags["matmul precision"] == ("high" if tf32 else "highest")
        assert flags["cudnn allow_tf32"] is True  # PyTorch's default for convolutions
        if "matmul fp32_precision" in flags:
            assert flags["matmul fp32_precision"] == ("tf32" if tf32 else "ieee")
            assert flags["cudnn conv fp32_precision"] == "tf32"


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_every_precision_but_tf32_runs_pytorchs_own_defaults(precision, restore_tf32):
    """The baseline must run what the user's own code runs: a fresh process's settings."""
    fresh = subprocess.run([sys.executable, "-c", DEFAULT_FLAGS_SCRIPT], capture_output=True,
                           text=True, check=True, cwd=Path(__file__).resolve().parent.parent)
    set_matmul_precision("tf32", torch.device("cuda"))
    set_matmul_precision(precision, torch.device("cuda"))
    assert tf32_flags(new_api=False) == json.loads(fresh.stdout)


def test_pin_memory_on_cpu_is_unsupported():
    with pytest.raises(Unsupported, match="pin_memory"):
        setup_training(mlp(), regression_data(), TrainConfig(pin_memory=True), "cpu",
                       loss_fn=mlp_loss)


# --- activation checkpointing ----------------------------------------------------------------

def test_activation_checkpointing_saves_memory_and_keeps_gradients():
    torch.manual_seed(0)
    reference = Blocks(layers=4)
    data = regression_data()
    batch = fixed_batch(data, 16)
    measured, grads = {}, {}
    for mode in ("none", "selective", "full"):
        model = copy.deepcopy(reference)
        setup = setup_training(model, data, TrainConfig(micro_batch_size=16,
                                                        activation_checkpointing=mode), "cpu")
        measured[mode], loss = saved_bytes(lambda s=setup: s.loss_fn(s.model, batch))
        loss.backward()
        grads[mode] = {n: p.grad.clone() for n, p in model.named_parameters()}
    assert measured["none"] > measured["selective"] > measured["full"] > 0
    for mode in ("selective", "full"):
        for name, grad in grads["none"].items():
            torch.testing.assert_close(grads[mode][name], grad, rtol=1e-5, atol=1e-7,
                                       msg=f"{mode}: gradient of {name} changed")


def checkpointed_saves(mode: str, checkpoint_modules=None) -> int:
    torch.manual_seed(0)
    model = Blocks(layers=4)
    apply_activation_checkpointing(model, mode, checkpoint_modules)
    saved, _ = saved_bytes(lambda: model(*fixed_batch(regression_data(), 8)))
    return saved


def test_selective_checkpoints_every_other_block():
    none, full = checkpointed_saves("none"), checkpointed_saves("full")
    # the four blocks are alike, so checkpointing two of them saves half of what all four save
    assert 2 * (none - checkpointed_saves("selective")) == none - full
    assert checkpointed_saves("selective") == checkpointed_saves(
        "full", lambda m: [m.blocks[0], m.blocks[2]])


def test_checkpoint_modules_hook_is_honoured():
    torch.manual_seed(0)
    model = NoList()
    batch = fixed_batch(regression_data(), 8)
    before, _ = saved_bytes(lambda: model(*batch))
    named = []

    def checkpoint_modules(m: nn.Module) -> list[nn.Module]:
        named.append(m)
        return [m.body]

    setup = setup_training(model, regression_data(),
                           TrainConfig(micro_batch_size=8, activation_checkpointing="full"),
                           "cpu", checkpoint_modules=checkpoint_modules)
    after, loss = saved_bytes(lambda: setup.loss_fn(setup.model, batch))
    assert named == [model]
    assert after < before
    loss.backward()
    assert model.body[0].weight.grad is not None


def test_checkpoint_modules_hook_overrides_the_largest_module_list():
    none, full = checkpointed_saves("none"), checkpointed_saves("full")
    only_last = checkpointed_saves("full", lambda m: [m.blocks[3]])
    assert 4 * (none - only_last) == none - full  # the one named block, not all four


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_model_without_module_list_is_unsupported(mode):
    with pytest.raises(Unsupported) as info:
        setup_training(NoList(), regression_data(),
                       TrainConfig(activation_checkpointing=mode), "cpu")
    message = str(info.value)
    assert "not applicable" in message
    assert "checkpoint_modules" in message


def test_checkpoint_modules_hook_returning_nothing_is_unsupported():
    with pytest.raises(Unsupported, match="not applicable"):
        apply_activation_checkpointing(Blocks(), "full", lambda m: [])


def test_huggingface_style_gradient_checkpointing_enable_is_used_for_full():
    class HFModel(Blocks):
        def __init__(self) -> None:
            super().__init__()
            self.calls = []

        def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
            self.calls.append(gradient_checkpointing_kwargs)

    model = HFModel()
    apply_activation_checkpointing(model, "full")
    assert model.calls == [{"use_reentrant": False}]
    # the model's own mechanism is used, so autotune does not wrap the blocks itself
    assert all("forward" not in vars(block) for block in model.blocks)

    # selective is autotune's own (every other block); the model's method is not called
    other = HFModel()
    apply_activation_checkpointing(other, "selective")
    assert other.calls == []
    assert ["forward" in vars(block) for block in other.blocks] == [True, False, True, False]


def test_gradient_checkpointing_enable_without_kwargs_is_still_called():
    class OldHFModel(Blocks):
        enabled = 0

        def gradient_checkpointing_enable(self):
            self.enabled += 1

    model = OldHFModel()
    apply_activation_checkpointing(model, "full")
    assert model.enabled == 1


# --- optimizer implementation ----------------------------------------------------------------

@pytest.mark.parametrize(("impl", "foreach", "fused"),
                         [("for_loop", False, False), ("foreach", True, False),
                          ("fused", False, True)])
def test_optimizer_impl_reaches_the_optimizer(impl, foreach, fused):
    torch.manual_seed(0)
    model = mlp()
    setup = setup_training(model, regression_data(),
                           TrainConfig(micro_batch_size=8, optimizer_impl=impl), "cpu",
                           loss_fn=mlp_loss)
    assert isinstance(setup.optimizer, torch.optim.AdamW)
    assert bool(setup.optimizer.defaults["foreach"]) is foreach
    assert bool(setup.optimizer.defaults["fused"]) is fused
    before = [p.detach().clone() for p in model.parameters()]
    setup.step(setup.batches())  # the implementation really runs here (fused on CPU too)
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


@pytest.mark.parametrize("impl", ["for_loop", "foreach", "fused"])
def test_build_optimizer_hook_receives_exactly_the_impl_flags(impl):
    received = []

    def build_optimizer(params, **impl_kw):
        received.append((list(params), impl_kw))
        return torch.optim.SGD(received[-1][0], lr=0.1, **impl_kw)

    model = mlp()
    model[2].requires_grad_(False)
    optimizer = make_optimizer(model, impl, build_optimizer)
    assert isinstance(optimizer, torch.optim.SGD)
    [(params, flags)] = received
    assert flags == {"foreach": impl == "foreach", "fused": impl == "fused"}
    # only trainable parameters are handed over
    assert [id(p) for p in params] == [id(p) for p in model[0].parameters()]


# --- DataLoader workers ----------------------------------------------------------------------

class PidDataset(torch.utils.data.Dataset):
    """Each sample says which process loaded it."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int):
        return torch.full((DIM,), float(i)), torch.tensor(os.getpid())


def pid_setup(num_workers: int):
    pids = []

    def loss_fn(model: nn.Module, batch) -> torch.Tensor:
        x, pid = batch
        pids.extend(pid.tolist())
        return model(x).pow(2).mean()

    config = TrainConfig(micro_batch_size=2, num_workers=num_workers)
    setup = setup_training(mlp(), PidDataset(), config, "cpu", loss_fn=loss_fn)
    return setup, pids


def test_workers_load_batches_in_other_processes():
    setup, pids = pid_setup(num_workers=2)
    batches = setup.batches()
    try:
        for _ in range(4):
            setup.step(batches)
    finally:
        batches.close()
    assert len(pids) == 8
    assert os.getpid() not in pids
    assert len(set(pids)) == 2  # two workers, batches handed out in turn


def test_no_workers_load_batches_in_this_process():
    setup, pids = pid_setup(num_workers=0)
    batches = setup.batches()
    for _ in range(2):
        setup.step(batches)
    assert pids == [os.getpid()] * 4


def test_prefetch_and_persistent_workers_reach_the_loader():
    config = TrainConfig(micro_batch_size=2, num_workers=1, prefetch_factor=3,
                         persistent_workers=True)
    setup = setup_training(mlp(), regression_data(), config, "cpu", loss_fn=mlp_loss)
    assert setup.loader.num_workers == 1
    assert setup.loader.prefetch_factor == 3
    assert setup.loader.persistent_workers is True

    plain = make_loader(regression_data(), TrainConfig(micro_batch_size=2), CPU)
    assert plain.num_workers == 0
    assert plain.prefetch_factor is None
    assert plain.persistent_workers is False


def test_loader_shuffles_full_batches_of_micro_batch_size():
    data = regression_data(size=20)
    loader = make_loader(data, TrainConfig(micro_batch_size=8), CPU)
    batches = list(loader)
    assert [len(x) for x, _ in batches] == [8, 8]  # the partial batch is dropped
    seen = torch.cat([x for x, _ in batches])
    assert not torch.equal(seen, data.tensors[0][:16])  # shuffled
    # the same seed gives the same order, so trials and reruns see the same data
    again = torch.cat([x for x, _ in make_loader(data, TrainConfig(micro_batch_size=8), CPU)])
    assert torch.equal(seen, again)


def test_micro_batch_larger_than_dataset_is_config_error():
    with pytest.raises(ConfigError) as info:
        make_loader(regression_data(size=10), TrainConfig(micro_batch_size=16), CPU)
    message = str(info.value)
    assert "micro_batch_size=16" in message
    assert "10 samples" in message


# --- gradient accumulation -------------------------------------------------------------------

def accumulation_run(state, micro_batch_size: int, accum: int, steps: int):
    model = Blocks(layers=2)
    model.load_state_dict(state)
    forwards = []

    def loss_fn(m: nn.Module, batch) -> torch.Tensor:
        forwards.append(len(batch[0]))
        return m(*batch)

    setup = setup_training(
        model, regression_data(), TrainConfig(micro_batch_size=micro_batch_size,
                                              grad_accum_steps=accum), "cpu",
        loss_fn=loss_fn, build_optimizer=lambda params, **kw: torch.optim.SGD(params, lr=0.05,
                                                                               **kw))
    grads = []
    setup.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: grads.append([p.grad.clone() for p in model.parameters()]))
    batches = setup.batches()
    results = [setup.step(batches) for _ in range(steps)]
    return grads, results, forwards


def test_grad_accumulation_matches_one_big_batch():
    torch.manual_seed(0)
    state = copy.deepcopy(Blocks(layers=2).state_dict())
    big_grads, big_results, _ = accumulation_run(state, 8, 1, steps=2)
    acc_grads, acc_results, forwards = accumulation_run(state, 4, 2, steps=2)
    assert forwards == [4, 4, 4, 4]
    for step in range(2):  # step 2 also shows grads are zeroed after each optimizer step
        for big, acc in zip(big_grads[step], acc_grads[step]):
            torch.testing.assert_close(acc, big, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(acc_results[step].loss, big_results[step].loss,
                                   rtol=1e-5, atol=1e-6)
    assert [r.samples for r in big_results] == [8, 8]
    assert [r.samples for r in acc_results] == [8, 8]


def test_one_optimizer_step_per_accumulation_group():
    torch.manual_seed(0)
    state = Blocks(layers=2).state_dict()
    grads, results, forwards = accumulation_run(state, micro_batch_size=2, accum=3, steps=5)
    assert len(grads) == 5
    assert forwards == [2] * 15
    assert [r.samples for r in results] == [6] * 5
    assert all(r.data_wait_s >= 0 for r in results)
    assert all(r.loss.requires_grad is False and r.loss.ndim == 0 for r in results)


def test_each_step_uses_only_its_own_gradients():
    torch.manual_seed(0)
    model = Blocks(layers=2)
    reference = copy.deepcopy(model)
    seen = []

    def loss_fn(m: nn.Module, batch) -> torch.Tensor:
        seen.append(batch)
        return m(*batch)

    # lr=0 keeps the weights fixed, so each step's gradient can be recomputed afterwards
    setup = setup_training(model, regression_data(),
                           TrainConfig(micro_batch_size=4, grad_accum_steps=2), "cpu",
                           loss_fn=loss_fn,
                           build_optimizer=lambda params, **kw: torch.optim.SGD(params, lr=0.0))
    grads = []
    setup.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: grads.append([p.grad.clone() for p in model.parameters()]))
    batches = setup.batches()
    for _ in range(3):
        setup.step(batches)
    assert len(seen) == 6
    for step in range(3):
        reference.zero_grad()
        for batch in seen[2 * step:2 * step + 2]:
            (reference(*batch) / 2).backward()
        for got, want in zip(grads[step], (p.grad for p in reference.parameters())):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_accumulation_under_cuda_graphs_keeps_gradients_outside_the_graphs():
    """Under CUDA graphs (reduce-overhead, max-autotune) a compiled backward writes gradients
    into graph memory that the next micro-batch's replay overwrites; `.grad` must then be
    allocated before the first backward and kept, so autograd adds into it in place. CPU has
    no CUDA graphs: this checks that the step does so, and learns exactly the same."""
    torch.manual_seed(0)
    state = copy.deepcopy(Blocks(layers=2).state_dict())
    plain_grads, plain_results, _ = accumulation_run(state, 4, 3, steps=3)

    model = Blocks(layers=2)
    model.load_state_dict(state)
    setup = setup_training(model, regression_data(),
                           TrainConfig(micro_batch_size=4, grad_accum_steps=3), "cpu",
                           loss_fn=lambda m, batch: m(*batch),
                           build_optimizer=lambda params, **kw: torch.optim.SGD(params, lr=0.05,
                                                                                  **kw))
    setup = dataclasses.replace(setup, cuda_graphs=True)
    storage_before_backward = []
    model.blocks[0][0].register_full_backward_pre_hook(
        lambda m, grad_out: storage_before_backward.append(
            None if m.weight.grad is None else m.weight.grad.data_ptr()))
    grads = []
    setup.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: grads.append([p.grad.clone() for p in model.parameters()]))
    batches = setup.batches()
    results = [setup.step(batches) for _ in range(3)]

    assert None not in storage_before_backward  # allocated before the first backward
    assert len(set(storage_before_backward)) == 1  # and the same storage for 9 micro-batches
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())  # zeroed
    for step in range(3):
        for got, want in zip(grads[step], plain_grads[step]):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(results[step].loss, plain_results[step].loss)


def test_cuda_graphs_are_only_on_cuda():
    setup = setup_training(mlp(), regression_data(), TrainConfig(micro_batch_size=4), "cpu",
                           loss_fn=mlp_loss)
    assert setup.cuda_graphs is False


# --- moving batches to the device ------------------------------------------------------------

Pair = namedtuple("Pair", ["left", "right"])


@dataclasses.dataclass
class Output:
    loss: torch.Tensor
    logits: torch.Tensor


@dataclasses.dataclass
class Sample:
    ids: torch.Tensor
    extra: dict
    name: str = "s"


def test_move_to_device_moves_nested_tensors_and_keeps_types():
    batch = {
        "x": torch.ones(2, 3),
        "pair": Pair(torch.zeros(2), [torch.arange(3), "label", 7]),
        "tuple": (torch.ones(1), 2.5, None),
        "sample": Sample(ids=torch.arange(4), extra={"mask": torch.ones(4, dtype=torch.bool)}),
        "text": "hello",
        "count": 3,
    }
    moved = move_to_device(batch, torch.device("meta"))
    assert type(moved) is dict and list(moved) == list(batch)
    assert moved["x"].device.type == "meta" and moved["x"].shape == (2, 3)
    assert type(moved["pair"]) is Pair
    assert moved["pair"].left.device.type == "meta"
    assert type(moved["pair"].right) is list
    assert moved["pair"].right[0].device.type == "meta"
    assert moved["pair"].right[1:] == ["label", 7]
    assert type(moved["tuple"]) is tuple
    assert moved["tuple"][0].device.type == "meta" and moved["tuple"][1:] == (2.5, None)
    assert type(moved["sample"]) is Sample
    assert moved["sample"].ids.device.type == "meta"
    assert moved["sample"].extra["mask"].device.type == "meta"
    assert moved["sample"].extra["mask"].dtype == torch.bool
    assert moved["sample"].name == "s"
    assert moved["text"] == "hello" and moved["count"] == 3
    # the original batch is untouched
    assert batch["x"].device.type == "cpu"


def test_move_to_device_keeps_mapping_types():
    ordered = move_to_device(OrderedDict(b=torch.ones(1), a=torch.ones(2)), torch.device("meta"))
    assert type(ordered) is OrderedDict and list(ordered) == ["b", "a"]
    assert ordered["a"].device.type == "meta"
    # a defaultdict's constructor takes its factory first; the batch must still move
    batch = defaultdict(list, {"x": torch.ones(3)})
    moved = move_to_device(batch, torch.device("meta"))
    assert type(moved) is defaultdict and moved.default_factory is list
    assert moved["x"].device.type == "meta"
    assert batch["x"].device.type == "cpu"


@pytest.mark.parametrize(
    ("batch", "where"),
    [
        ({"x": torch.ones(1), "meta": object()}, "batch['meta']"),
        ({"inputs": [torch.ones(1), {"ids": object()}]}, "batch['inputs'][1]['ids']"),
        (Pair(torch.ones(1), object()), "batch.right"),
        ((torch.ones(1), Sample(ids=object(), extra={})), "batch[1].ids"),
    ],
)
def test_move_to_device_names_what_cannot_be_moved(batch, where):
    with pytest.raises(BatchTransferError) as info:
        move_to_device(batch, CPU)
    message = str(info.value)
    assert where in message
    assert "object" in message
    assert isinstance(info.value, ContractError)


def test_step_with_unmovable_batch_raises_batch_transfer_error():
    def collate(samples):
        return {"x": torch.stack([s[0] for s in samples]), "meta": object()}

    setup = setup_training(mlp(), regression_data(), TrainConfig(micro_batch_size=4), "cpu",
                           loss_fn=lambda m, b: m(b["x"]).mean(), collate_fn=collate)
    with pytest.raises(BatchTransferError, match=r"batch\['meta'\]"):
        setup.step(setup.batches())


# --- the loss paths --------------------------------------------------------------------------

def train_and_eval(setup, eval_batch, steps: int = 30) -> tuple[float, float]:
    with torch.no_grad():
        before = setup.loss_fn(setup.model, eval_batch).item()
    batches = setup.batches()
    for _ in range(steps):
        setup.step(batches)
    with torch.no_grad():
        after = setup.loss_fn(setup.model, eval_batch).item()
    return before, after


@pytest.mark.parametrize("name", ["tiny_dict", "tiny_tuple"])
def test_model_files_train(name):
    torch.manual_seed(0)
    workload = load_workload(TEST_MODELS / f"{name}.py")
    config = TrainConfig.from_dict(workload.baseline)
    setup = setup_from_workload(workload, config, CPU)
    assert setup.loss_source == str(workload.path)
    dataset = setup.loader.dataset
    eval_batch = default_collate([dataset[i] for i in range(256)])
    before, after = train_and_eval(setup, eval_batch)
    assert after < before


@pytest.mark.parametrize("output", ["scalar", "dict", "attribute"])
def test_default_loss_path_reads_each_output_kind(output):
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(DIM, 1)

        def forward(self, x, y):
            loss = nn.functional.mse_loss(self.lin(x).squeeze(-1), y)
            if output == "dict":
                return {"loss": loss, "logits": x}
            if output == "attribute":
                return Output(loss=loss, logits=x)
            return loss

    torch.manual_seed(0)
    setup = setup_training(Net(), regression_data(), TrainConfig(micro_batch_size=16), "cpu")
    before, after = train_and_eval(setup, fixed_batch(regression_data(), 64))
    assert after < before


def test_default_loss_path_without_a_loss_says_to_define_loss_fn():
    class Logits(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(DIM, 3)

        def forward(self, x, y):
            return self.lin(x)

    setup = setup_training(Logits(), regression_data(), TrainConfig(micro_batch_size=4), "cpu")
    with pytest.raises(ContractError, match="loss_fn") as info:
        setup.step(setup.batches())
    assert "(4, 3)" in str(info.value)  # says what the model returned instead


# --- compile ---------------------------------------------------------------------------------

def test_compile_default_wraps_the_model_without_compiling_yet():
    model = mlp()
    setup = setup_training(model, regression_data(),
                           TrainConfig(micro_batch_size=4, compile_mode="default"), "cpu",
                           loss_fn=mlp_loss)
    assert isinstance(setup.model, torch._dynamo.eval_frame.OptimizedModule)
    assert setup.model._orig_mod is model
    # the optimizer still updates the user's own parameters
    assert {id(p) for g in setup.optimizer.param_groups for p in g["params"]} == \
        {id(p) for p in model.parameters()}


def test_no_compile_keeps_the_model():
    model = mlp()
    setup = setup_training(model, regression_data(), TrainConfig(micro_batch_size=4), "cpu",
                           loss_fn=mlp_loss)
    assert setup.model is model
