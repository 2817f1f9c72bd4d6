"""`training`: every knob of a `TrainConfig` really takes effect on the model, optimizer, loader
and train step (on CPU; the GPU-only knobs are refused there)."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import math
import os
import subprocess
import sys
from collections import OrderedDict, defaultdict, namedtuple

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset, default_collate

from autotune.config import PRECISIONS, TrainConfig
from autotune.errors import ConfigError, ContractError
from autotune.trial.optimizers import make_optimizer
from autotune.trial.training import (
    BatchTransferError,
    Unsupported,
    apply_activation_checkpointing,
    apply_verified_checkpointing,
    calls_attention,
    checkpointing_problem,
    has_convolutions,
    make_loader,
    move_to_device,
    nonfinite_problem,
    sample_batch,
    set_matmul_precision,
    setup_from_workload,
    setup_training,
)
from autotune.trial.workload import load_workload

from ..conftest import FAST, ROOT, TEST_MODELS, TINY_SOURCE, need, run_cli
from ..test_models import TINY

MODELS = ROOT / "models"
CPU = torch.device("cpu")
META = torch.device("meta")
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


# What a fresh process runs, torch its only import. (The new API says "none", not set, where
# the old one says what that means; the consistency test above checks both APIs agree.)
DEFAULT_FLAGS_SCRIPT = f"""
import json, torch
{inspect.getsource(tf32_flags)}
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


@pytest.fixture(scope="module")
def fresh_process_flags() -> dict:
    fresh = subprocess.run([sys.executable, "-c", DEFAULT_FLAGS_SCRIPT], capture_output=True,
                           text=True, check=True, cwd=ROOT)
    return json.loads(fresh.stdout)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_every_precision_but_tf32_runs_pytorchs_own_defaults(precision, fresh_process_flags,
                                                             restore_tf32):
    """The baseline must run what the user's own code runs: a fresh process's settings."""
    set_matmul_precision("tf32", torch.device("cuda"))
    set_matmul_precision(precision, torch.device("cuda"))
    assert tf32_flags(new_api=False) == fresh_process_flags


def test_pin_memory_on_cpu_is_unsupported():
    with pytest.raises(Unsupported, match="pin_memory"):
        setup_training(mlp(), regression_data(), TrainConfig(pin_memory=True), "cpu",
                       loss_fn=mlp_loss)


# --- memory format ---------------------------------------------------------------------------

def test_channels_last_stores_weights_and_images_channels_last_and_trains_the_same():
    data = TensorDataset(torch.randn(16, 3, 8, 8), torch.randn(16, 1))
    batch = fixed_batch(data, 8)
    losses, formats = {}, {}
    for fmt in ("contiguous", "channels_last"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(1))
        seen = []

        def loss_fn(m, b, seen=seen):
            seen.append(b[0].is_contiguous(memory_format=torch.channels_last))
            return nn.functional.mse_loss(m(b[0]), b[1])

        setup = setup_training(model, data, TrainConfig(micro_batch_size=8, memory_format=fmt),
                               "cpu", loss_fn=loss_fn)
        losses[fmt] = float(setup.step(iter([batch])).loss)
        formats[fmt] = (model[0].weight.is_contiguous(memory_format=torch.channels_last),
                        seen[-1])
    assert formats == {"contiguous": (False, False), "channels_last": (True, True)}
    assert losses["channels_last"] == pytest.approx(losses["contiguous"], rel=1e-5)


class FiveDimAttention(nn.Module):
    """Attention with a groups dimension before the heads: the math kernel takes it, CPU's
    flash kernel refuses it on every torch (it wants 4-D; 2.14 takes 3-D too)."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.head = nn.Linear(4, 12), nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x[:, None, None]).chunk(3, dim=-1)
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.head(out).flatten(1).mean(dim=1, keepdim=True)


def test_the_attention_kernel_holds_in_every_step_and_is_seen_being_called():
    data = TensorDataset(torch.randn(16, 2, 4), torch.randn(16, 1))
    batch = fixed_batch(data, 8)
    losses = {}
    for backend in ("auto", "math", "flash"):
        torch.manual_seed(0)
        setup = setup_training(FiveDimAttention(), data,
                               TrainConfig(micro_batch_size=8, attention_backend=backend),
                               "cpu", loss_fn=lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]))
        try:
            losses[backend] = float(setup.step(iter([batch])).loss)
        except RuntimeError as exc:
            losses[backend] = str(exc)
    assert losses["math"] == pytest.approx(losses["auto"], rel=1e-6)
    assert "kernel" in losses["flash"] or "backend" in losses["flash"]
    model, x = FiveDimAttention(), batch[0]
    assert calls_attention(lambda: model(x)) and not calls_attention(lambda: model.head(x))


def test_a_model_has_convolutions_when_it_has_2d_or_3d_ones():
    assert has_convolutions(nn.Sequential(nn.Conv3d(1, 1, 1)))
    assert not has_convolutions(nn.Sequential(nn.Conv1d(1, 1, 1), nn.Linear(2, 2)))


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


class SequentialStack(nn.Module):
    """Repeated blocks in an nn.Sequential (timm's stages, a user's Sequential(*blocks))."""

    def __init__(self, dim: int = DIM, layers: int = 4) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(Residual(dim) for _ in range(layers)))
        self.head = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(self.head(self.blocks(x)).squeeze(-1), y)


class Residual(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(x)


class ContainerBlocks(nn.Module):
    """Blocks that are ModuleLists of parts the parent calls one by one (x-transformers)."""

    def __init__(self, dim: int = DIM, layers: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.ModuleList([nn.LayerNorm(dim), Residual(dim)])
                                    for _ in range(layers))
        self.head = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for norm, block in self.layers:
            x = block(norm(x))
        return nn.functional.mse_loss(self.head(x).squeeze(-1), y)


@pytest.mark.parametrize("build", [SequentialStack, ContainerBlocks])
def test_checkpointing_finds_blocks_in_sequential_stacks_and_inside_containers(build):
    batch = fixed_batch(regression_data(), 8)
    saved = {}
    for mode in ("none", "full"):
        torch.manual_seed(0)
        model = build()
        how = apply_activation_checkpointing(model, mode)
        saved[mode], loss = saved_bytes(lambda m=model: m(*batch))
    assert saved["full"] < saved["none"] / 2
    assert how.startswith("torch.utils.checkpoint around")


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


class TimmStyle(nn.Module):
    """timm's protocol (its ConvNeXt, ViT...): `set_grad_checkpointing(enable)` turns on a flag
    each stage reads to run its blocks through `checkpoint_sequential`. timm itself cannot be
    imported here: it needs torchvision, whose only PyPI wheel for torch 2.13 is CUDA's."""

    class Stage(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.Sequential(*(nn.Sequential(nn.Linear(DIM, DIM), nn.GELU())
                                          for _ in range(3)))
            self.grad_checkpointing = False

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.grad_checkpointing:
                return torch.utils.checkpoint.checkpoint_sequential(self.blocks, 3, x,
                                                                    use_reentrant=False)
            return self.blocks(x)

    def __init__(self) -> None:
        super().__init__()
        self.stages = nn.Sequential(self.Stage(), self.Stage())
        self.head = nn.Linear(DIM, 1)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        for stage in self.stages:
            stage.grad_checkpointing = enable

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(self.head(self.stages(x)).squeeze(-1), y)


def test_timm_style_set_grad_checkpointing_is_used_for_full_and_verified():
    torch.manual_seed(0)
    model = TimmStyle()
    batch = fixed_batch(regression_data(), 8)
    plain, _ = saved_bytes(lambda: model(*batch))
    apply_verified_checkpointing(model, "full", batch, lambda m, b: m(*b))
    assert all(stage.grad_checkpointing for stage in model.stages)
    # the model's own switch, not autotune's wrapper around its blocks
    assert not any("forward" in vars(m) for m in model.modules())
    checkpointed, _ = saved_bytes(lambda: model(*batch))
    assert checkpointed < 0.7 * plain


# --- checkpointing is verified: it trains exactly as without, or it is unsupported ----------

GPT2_SIZE = {"n_layer": 4, "n_embd": 32, "n_head": 2, "n_positions": 32, "vocab_size": 64,
             "bos_token_id": 63, "eos_token_id": 63}


def gpt2(model_class=None) -> nn.Module:
    """A real Hugging Face GPT2LMHeadModel from a tiny config (dropout 0.1, its default)."""
    need("transformers")
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return (model_class or GPT2LMHeadModel)(GPT2Config(**GPT2_SIZE))


class PaddedTokens(torch.utils.data.Dataset):
    """What a tokenizer's padding collator yields: ids, a mask with padding, labels -100 there."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        length = GPT2_SIZE["n_positions"]
        ids = torch.randint(GPT2_SIZE["vocab_size"], (length,),
                            generator=torch.Generator().manual_seed(i))
        mask = (torch.arange(length) < length - i % 8).long()
        return {"input_ids": ids, "attention_mask": mask,
                "labels": ids.masked_fill(mask == 0, -100)}


def gpt2_loss(model: nn.Module, batch) -> torch.Tensor:
    return model(**batch).loss


def one_step_gradients(model: nn.Module, batch) -> dict[str, torch.Tensor]:
    torch.manual_seed(1)  # the same dropout masks in every run
    gpt2_loss(model, batch).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize(("mode", "layers_checkpointed"),
                         [("full", [True] * 4), ("selective", [True, False, True, False])])
def test_gpt2_checkpointing_uses_huggingface_own_layers_and_trains_the_same(
        mode, layers_checkpointed):
    reference = gpt2()
    model = copy.deepcopy(reference)
    batch = fixed_batch(PaddedTokens(), 4)
    enable = getattr(model, "activation_checkpointing_enable", None)
    if mode == "selective" and (enable is None or "every_n_layers" not in
                                inspect.signature(enable).parameters):
        pytest.skip("this transformers checkpoints every layer or none (no every_n_layers)")
    setup = setup_training(model, PaddedTokens(),
                           TrainConfig(micro_batch_size=4, activation_checkpointing=mode), "cpu",
                           loss_fn=gpt2_loss)
    # Hugging Face's own per-layer switch, not autotune's wrapper around the layers
    assert [layer.gradient_checkpointing for layer in model.transformer.h] == layers_checkpointed
    assert all("forward" not in vars(layer) for layer in model.transformer.h)
    saved = {name: saved_bytes(lambda m=m: gpt2_loss(m, batch))[0]
             for name, m in (("none", copy.deepcopy(reference)), (mode, model))}
    assert saved[mode] < saved["none"]
    want = one_step_gradients(reference, batch)
    for name, grad in one_step_gradients(model, batch).items():
        torch.testing.assert_close(grad, want[name], rtol=1e-4, atol=1e-6, msg=name)
    losses = [setup.step(setup.batches()).loss for _ in range(3)]
    assert all(torch.isfinite(loss) for loss in losses)


def test_a_huggingface_model_without_its_own_checkpointing_has_its_blocks_wrapped():
    """HF's ConvNeXt says supports_gradient_checkpointing = False and its
    gradient_checkpointing_enable() raises: autotune wraps its repeated blocks instead."""
    need("transformers")
    from transformers import ConvNextConfig, ConvNextForImageClassification

    torch.manual_seed(0)
    config = ConvNextConfig(num_labels=4, depths=[1, 1, 2, 1], hidden_sizes=[8, 16, 32, 64],
                            image_size=32)
    reference = ConvNextForImageClassification(config)
    model = copy.deepcopy(reference)
    batch = {"pixel_values": torch.randn(4, 3, 32, 32), "labels": torch.tensor([0, 1, 2, 3])}

    def loss(m: nn.Module, b) -> torch.Tensor:
        return m(**b).loss

    apply_verified_checkpointing(model, "full", batch, loss)
    assert any("forward" in vars(m) for m in model.modules())
    assert saved_bytes(lambda: loss(model, batch))[0] < \
        saved_bytes(lambda: loss(reference, batch))[0]


def older_gpt2_class():
    """GPT-2 as a transformers version without `every_n_layers` shows it (5.17, the GPU
    machines'): Hugging Face's own checkpointing does `full` only, so `selective` falls to
    autotune's wrapper, and its key/value cache, on in training, must be turned off for the
    recompute to see the keys the forward saw."""
    need("transformers")
    from transformers import GPT2LMHeadModel

    class OlderGPT2(GPT2LMHeadModel):
        def activation_checkpointing_enable(self, activation_checkpointing_kwargs=None):
            super().activation_checkpointing_enable(activation_checkpointing_kwargs)

    return OlderGPT2


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_selective_checkpointing_of_an_older_gpt2_wraps_its_blocks_and_trains_the_same():
    older = older_gpt2_class()
    reference = gpt2(older)
    model = copy.deepcopy(reference)
    batch = fixed_batch(PaddedTokens(), 4)
    setup_training(model, PaddedTokens(),
                   TrainConfig(micro_batch_size=4, activation_checkpointing="selective"), "cpu",
                   loss_fn=gpt2_loss)
    assert ["forward" in vars(layer) for layer in model.transformer.h] == [True, False] * 2
    want = one_step_gradients(reference, batch)
    for name, grad in one_step_gradients(model, batch).items():
        torch.testing.assert_close(grad, want[name], rtol=1e-4, atol=1e-6, msg=name)


class RememberingBlock(nn.Module):
    """A block that keeps every input of this forward, as a key/value cache does: a recompute
    in backward appends again and sees keys twice as long."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(DIM, DIM)
        self.keys: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.keys.append(x)
        keys = torch.cat(self.keys)
        return x + torch.tanh(self.lin(x)) + (x @ keys.T).softmax(-1) @ keys


class Remembering(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(RememberingBlock() for _ in range(4))
        self.head = nn.Linear(DIM, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            block.keys.clear()
        for block in self.blocks:
            x = block(x)
        return nn.functional.mse_loss(self.head(x).squeeze(-1), y)


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_a_wrapper_that_breaks_a_model_is_unsupported_with_the_reason():
    with pytest.raises(Unsupported) as info:
        setup_training(Remembering(), regression_data(),
                       TrainConfig(micro_batch_size=8, activation_checkpointing="selective"),
                       "cpu")
    message = str(info.value)
    assert message.startswith("activation checkpointing breaks this model (with "
                              "torch.utils.checkpoint around 2 of 4 blocks (blocks.0, "
                              "blocks.2)), which trains without it: "), message
    # an older GPT-2's own mechanism still serves `full`
    setup = setup_training(gpt2(older_gpt2_class()), PaddedTokens(),
                           TrainConfig(micro_batch_size=4, activation_checkpointing="full"),
                           "cpu", loss_fn=gpt2_loss)
    assert torch.isfinite(setup.step(setup.batches()).loss)


class CountingBlock(nn.Module):
    """A block whose output depends on how often it ran in this forward: a recompute in
    backward sees another count, so checkpointing it silently changes the gradients."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(DIM, DIM)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x + torch.tanh(self.lin(x) * self.calls)  # tanh keeps its output for backward


class Recounting(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(CountingBlock() for _ in range(2))
        self.head = nn.Linear(DIM, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            block.calls = 0
        for block in self.blocks:
            x = block(x)
        return nn.functional.mse_loss(self.head(x).squeeze(-1), y)


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_checkpointing_that_changes_the_gradients_is_unsupported(mode):
    with pytest.raises(Unsupported, match=r"activation checkpointing changes what this model "
                                          r"learns .*: the gradient of blocks\.0\.lin"):
        setup_training(Recounting(), regression_data(),
                       TrainConfig(micro_batch_size=8, activation_checkpointing=mode), "cpu")


RECOUNTING_SOURCE = """
import torch
from torch import nn

BASELINE = {"micro_batch_size": 8}


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.calls = 0

    def forward(self, x):
        self.calls += 1  # a recompute in backward sees another count
        return x + torch.tanh(self.lin(x) * self.calls)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(2))

    def forward(self, x, y):
        for block in self.blocks:
            block.calls = 0
        for block in self.blocks:
            x = block(x)
        return nn.functional.mse_loss(x.sum(dim=1), y)


def build_model():
    return Net()


def build_dataset():
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(64, 8, generator=g),
                                          torch.randn(64, generator=g))
"""


@pytest.mark.slow
def test_a_trial_whose_checkpointing_changes_the_model_is_unsupported_not_an_error(
        write_model):
    path = write_model(RECOUNTING_SOURCE)
    done = run_cli("bench", "--model", str(path), "--device", "cpu", "--set",
                   "activation_checkpointing=selective", "--json", *FAST)
    assert done.returncode == 2, done.stdout + done.stderr
    record = json.loads(done.stdout)
    assert record["status"] == "unsupported"
    assert "activation checkpointing changes what this model learns" in \
        record["message"]
    workload = load_workload(str(path), {})  # without checkpointing it trains
    setup = setup_from_workload(workload, workload.train_config({}, "cpu"), CPU)
    assert math.isfinite(setup.step(setup.batches()).loss.item())


class NormBlocks(Blocks):
    """Blocks with batch-norm statistics and dropout: state the verification must not touch."""

    def __init__(self) -> None:
        super().__init__()
        for block in self.blocks:
            block.append(nn.BatchNorm1d(DIM))
            block.append(nn.Dropout(0.2))


def test_verification_leaves_weights_buffers_gradients_and_randomness_as_they_were():
    torch.manual_seed(0)
    model = NormBlocks()
    before = copy.deepcopy(model.state_dict())
    rng = torch.get_rng_state()
    setup_training(model, regression_data(),
                   TrainConfig(micro_batch_size=8, activation_checkpointing="full"), "cpu")
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.grad is None for p in model.parameters())
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_a_model_that_fails_without_checkpointing_fails_as_itself():
    def loss_fn(model: nn.Module, batch) -> torch.Tensor:
        raise ValueError("a bug in the user's loss")

    setup = setup_training(Blocks(), regression_data(),
                           TrainConfig(micro_batch_size=8, activation_checkpointing="full"),
                           "cpu", loss_fn=loss_fn)
    with pytest.raises(ValueError, match="a bug in the user's loss"):
        setup.step(setup.batches())


REAL_LIBRARY = {"hf_gpt2": "transformers", "pyg_rgat": "torch_geometric"}


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("mode", ["selective", "full"])
@pytest.mark.parametrize("name", ["gpt", "rgat", "mlp", "hf_gpt2", "pyg_rgat"])
def test_checkpointing_problem_finds_none_in_the_reference_models(name, mode):
    if name in REAL_LIBRARY:
        need(REAL_LIBRARY[name])
    workload = load_workload(MODELS / f"{name}.py", TINY[name])
    batch = sample_batch(workload.build_dataset(), workload.hook("collate_fn"), 4)
    for precision in ("fp32", "bf16"):
        assert checkpointing_problem(workload.build_model, batch, workload.loss_fn(), mode,
                                     workload.hook("checkpoint_modules"),
                                     precision=precision) is None


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_checkpointing_problem_names_what_breaks():
    batch = fixed_batch(PaddedTokens(), 4)
    assert checkpointing_problem(gpt2, batch, gpt2_loss, "selective") is None
    problem = checkpointing_problem(Remembering, fixed_batch(regression_data()),
                                    lambda m, b: m(*b), "selective")
    assert problem.startswith("activation checkpointing breaks this model")
    problem = checkpointing_problem(Recounting, fixed_batch(regression_data()),
                                    lambda m, b: m(*b), "full")
    assert "changes what this model learns" in problem
    assert "not applicable" in checkpointing_problem(NoList, fixed_batch(regression_data()),
                                                     lambda m, b: m(*b), "full")


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
    optimizer = make_optimizer(model, TrainConfig(optimizer_impl=impl), build_optimizer)
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


class MovesItself:
    """A user's own batch type with a `.to()` (as a graph library's batches have)."""

    def __init__(self, x: torch.Tensor) -> None:
        self.x = x
        self.calls: list[tuple[str, bool]] = []

    def to(self, device, non_blocking: bool = False) -> MovesItself:
        self.calls.append((str(device), non_blocking))
        return MovesItself(self.x.to(device, non_blocking=non_blocking))


class MovesWithoutNonBlocking(MovesItself):
    def to(self, device) -> MovesItself:
        self.calls.append((str(device), None))
        return MovesItself(self.x.to(device))


def test_a_batch_with_its_own_to_is_moved_with_it():
    own = MovesItself(torch.ones(2))
    moved = move_to_device({"graph": own, "y": torch.zeros(2)}, META, non_blocking=True)
    assert own.calls == [("meta", True)]
    assert type(moved["graph"]) is MovesItself and moved["graph"].x.device.type == "meta"
    assert moved["y"].device.type == "meta"
    plain = MovesWithoutNonBlocking(torch.ones(2))
    assert move_to_device([plain], META, non_blocking=True)[0].x.device.type == "meta"
    assert plain.calls == [("meta", None)]


def test_pyg_data_batch_and_heterodata_are_moved_with_their_own_to():
    need("torch_geometric")
    from torch_geometric.data import Batch, Data, HeteroData

    graphs = [Data(x=torch.randn(3, 4), edge_index=torch.tensor([[0, 1], [1, 2]]),
                   edge_type=torch.tensor([0, 1]), y=torch.tensor([i])) for i in range(2)]
    batch = Batch.from_data_list(graphs)
    moved = move_to_device(batch, META)
    assert type(moved) is type(batch)
    assert {t.device.type for t in (moved.x, moved.edge_index, moved.edge_type, moved.y,
                                    moved.batch, moved.ptr)} == {"meta"}
    assert move_to_device((graphs[0], 3), META)[0].x.device.type == "meta"
    hetero = HeteroData()
    hetero["paper"].x = torch.randn(3, 2)
    hetero["paper", "cites", "paper"].edge_index = torch.tensor([[0], [1]])
    moved = move_to_device(hetero, META)
    assert moved["paper"].x.device.type == "meta"
    assert moved["paper", "cites", "paper"].edge_index.device.type == "meta"


def test_hf_batch_encoding_is_moved_with_its_own_to_and_keeps_its_type():
    need("transformers")
    from transformers import BatchEncoding

    batch = BatchEncoding({"input_ids": torch.ones(2, 3, dtype=torch.long),
                           "attention_mask": torch.ones(2, 3, dtype=torch.long)})
    moved = move_to_device(batch, META)
    assert type(moved) is BatchEncoding
    assert {v.device.type for v in moved.values()} == {"meta"}


class GraphClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        from torch_geometric.nn import RGATConv

        self.conv = RGATConv(4, 8, num_relations=2)
        self.head = nn.Linear(8, 2)

    def forward(self, batch) -> torch.Tensor:
        from torch_geometric.nn import global_mean_pool

        h = self.conv(batch.x, batch.edge_index, batch.edge_type).relu()
        return self.head(global_mean_pool(h, batch.batch))


def test_pyg_batches_collated_by_pyg_train():
    need("torch_geometric")
    from torch_geometric.data import Batch, Data

    g = torch.Generator().manual_seed(0)
    graphs = [Data(x=torch.randn(5, 4, generator=g),
                   edge_index=torch.randint(5, (2, 8), generator=g),
                   edge_type=torch.randint(2, (8,), generator=g), y=torch.tensor([i % 2]))
              for i in range(16)]
    torch.manual_seed(0)
    setup = setup_training(
        GraphClassifier(), graphs, TrainConfig(micro_batch_size=8, grad_accum_steps=2), "cpu",
        loss_fn=lambda m, b: nn.functional.cross_entropy(m(b), b.y),
        collate_fn=Batch.from_data_list,
        build_optimizer=lambda params, **kw: torch.optim.AdamW(params, lr=1e-2, **kw))
    batches = setup.batches()
    losses = [float(setup.step(batches).loss) for _ in range(30)]
    assert losses[-1] < 0.8 * losses[0]


TO_DEVICE_SOURCE = TINY_SOURCE + """

class Pair:
    \"\"\"A batch type with no .to(): the file moves it itself.\"\"\"

    def __init__(self, x, y):
        self.x, self.y = x, y


def collate_fn(samples):
    return Pair(*torch.utils.data.default_collate(samples))


def loss_fn(model, batch):
    return model(batch.x, batch.y)
"""
TO_DEVICE_HOOK = """
MOVED = []


def to_device(batch, device):
    MOVED.append(str(device))
    return Pair(batch.x.to(device), batch.y.to(device))
"""


def test_a_to_device_hook_moves_what_nothing_else_can(write_model):
    config = TrainConfig(micro_batch_size=8)
    without = load_workload(write_model(TO_DEVICE_SOURCE, "without_hook.py"))
    with pytest.raises(BatchTransferError) as info:
        setup_from_workload(without, config, CPU).step(iter(
            make_loader(without.build_dataset(), config, CPU, without.hook("collate_fn"))))
    message = str(info.value)
    assert message.startswith("batch is a Pair, which cannot be moved to cpu")
    assert "define `def to_device(batch, device):` in the model file" in message

    workload = load_workload(write_model(TO_DEVICE_SOURCE + TO_DEVICE_HOOK, "hooked.py"))
    setup = setup_from_workload(workload, config, CPU)
    batches = setup.batches()
    for _ in range(2):
        assert torch.isfinite(setup.step(batches).loss)
    assert workload.module.MOVED == ["cpu", "cpu"]


class PinsItself(MovesItself):
    pins = 0

    def pin_memory(self) -> PinsItself:
        PinsItself.pins += 1
        return PinsItself(self.x.pin_memory())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs CUDA")
def test_the_loader_pins_batches_that_pin_themselves_once():
    need("torch_geometric")
    need("transformers")
    from torch_geometric.data import Batch, Data
    from transformers import BatchEncoding

    def collate(samples):
        x = torch.stack([s[0] for s in samples])
        return {"pyg": Batch.from_data_list([Data(x=row.unsqueeze(0)) for row in x]),
                "hf": BatchEncoding({"x": x}), "own": PinsItself(x)}

    config = TrainConfig(micro_batch_size=4, pin_memory=True)
    cuda = torch.device("cuda")
    setup = setup_training(mlp(), regression_data(), config, cuda, collate_fn=collate,
                           loss_fn=lambda m, b: m(b["pyg"].x.squeeze(1)).mean())
    batch = next(iter(setup.loader))
    assert batch["pyg"].x.is_pinned() and batch["hf"]["x"].is_pinned()
    assert batch["own"].x.is_pinned() and PinsItself.pins == 1
    moved = setup.to_device(batch, cuda)
    assert moved["own"].x.is_cuda and PinsItself.pins == 1
    assert moved["pyg"].x.is_cuda and moved["hf"]["x"].is_cuda


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
    assert f"{where} is a object, which cannot be moved to cpu" in message
    assert "to_device(batch, device)" in message  # the one-line fix
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


def test_a_precision_whose_first_step_is_not_finite_is_named_with_what_broke() -> None:
    """tests/models/fragile.py loses its small margin in bf16 (log 0): its loss is inf there
    and finite in fp32, on the dataset's first samples."""
    workload = load_workload(TEST_MODELS / "fragile.py")
    batch = sample_batch(workload.build_dataset(), None, 2)
    assert nonfinite_problem(workload.build_model, batch, workload.loss_fn(), "fp32") is None
    assert nonfinite_problem(workload.build_model, batch, workload.loss_fn(), "bf16") == \
        "the loss is inf under bf16 on the dataset's first samples"
