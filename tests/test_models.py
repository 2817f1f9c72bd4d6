"""The reference model files obey the model-file contract and really train, at tiny sizes.

The files are loaded the way the tool loads them (by path, not as a package), keyword
arguments are filtered by each function's signature, and the loss is computed by the
contract's rules, so a file that passes here should plug into the tool unchanged. The files
built on real libraries (Hugging Face, PyTorch Geometric) need the `examples` extra: without
it they are skipped here, and fail in CI, which installs it.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from .conftest import need

MODELS_DIR = Path(__file__).resolve().parent.parent / "models"

# One dict per file, passed (filtered) to both build_model and build_dataset like --model-arg.
TINY: dict[str, dict[str, Any]] = {
    "gpt": {
        "n_layer": 2,
        "n_embd": 32,
        "n_head": 2,
        "block_size": 16,
        "vocab_size": 64,
        "num_samples": 64,
    },
    "rgat": {
        "hidden": 32,
        "heads": 2,
        "text_layers": 1,
        "graph_layers": 2,
        "vocab_size": 64,
        "max_text_len": 4,
        "max_nodes": 8,
        "num_edge_types": 4,
        "num_classes": 3,
        "num_samples": 64,
    },
    "mlp": {"feature_dim": 32, "hidden": 64, "layers": 2, "num_classes": 4, "num_samples": 256},
    "hf_gpt2": {
        "n_layer": 2,
        "n_embd": 32,
        "n_head": 2,
        "block_size": 16,
        "vocab_size": 64,
        "num_samples": 64,
    },
    "pyg_rgat": {
        "feature_dim": 8,
        "hidden": 16,
        "heads": 2,
        "layers": 2,
        "num_relations": 4,
        "num_classes": 3,
        "max_nodes": 8,
        "num_samples": 64,
    },
}
BATCH_SIZE = {"gpt": 8, "rgat": 8, "mlp": 32, "hf_gpt2": 8, "pyg_rgat": 8}
# The library each real-library file is built on (the `examples` extra).
LIBRARY = {"hf_gpt2": "transformers", "pyg_rgat": "torch_geometric"}
# RGATConv creates parameters that only its other `mod=` variants use: they get no gradient.
UNUSED = {"pyg_rgat": {"conv.w", "conv.l1", "conv.b1", "conv.l2", "conv.b2"}}

BASELINE_CHOICES = {
    "precision": {"fp32", "tf32", "bf16", "fp16"},
    "activation_checkpointing": {"none", "selective", "full"},
    "optimizer_impl": {"for_loop", "foreach", "fused"},
    "compile_mode": {
        "none",
        "default",
        "reduce-overhead",
        "max-autotune",
        "max-autotune-no-cudagraphs",
    },
}
BASELINE_INTS = {"micro_batch_size", "grad_accum_steps", "num_workers", "prefetch_factor"}
BASELINE_BOOLS = {"pin_memory", "persistent_workers"}


def load(name: str) -> ModuleType:
    if name in LIBRARY:
        need(LIBRARY[name])
    spec = importlib.util.spec_from_file_location(f"model_file_{name}", MODELS_DIR / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered like an imported module: torch.compile and pickling look classes up there.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def call(fn: Any, kw: dict[str, Any]) -> Any:
    """Calls fn with only the keywords its signature names (all of them if it takes **kw)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return fn(**kw)
    return fn(**{k: v for k, v in kw.items() if k in params})


def compute_loss(module: ModuleType, model: torch.nn.Module, batch: Any) -> torch.Tensor:
    if hasattr(module, "loss_fn"):
        return module.loss_fn(model, batch)
    if isinstance(batch, Mapping):
        out = model(**batch)
    elif isinstance(batch, (tuple, list)):
        out = model(*batch)
    else:
        out = model(batch)
    if hasattr(out, "loss"):
        return out.loss
    if isinstance(out, dict):
        return out["loss"]
    return out


def first_batch(module: ModuleType, name: str) -> tuple[torch.nn.Module, Any]:
    torch.manual_seed(0)
    model = call(module.build_model, TINY[name])
    dataset = call(module.build_dataset, TINY[name])
    loader = DataLoader(
        dataset, batch_size=BATCH_SIZE[name], collate_fn=getattr(module, "collate_fn", None)
    )
    return model, next(iter(loader))


@pytest.fixture(scope="module", params=sorted(TINY))
def name(request: pytest.FixtureRequest) -> str:
    return request.param


def test_contract_surface(name: str) -> None:
    source = (MODELS_DIR / f"{name}.py").read_text()
    assert "import autotune" not in source and "from autotune" not in source

    module = load(name)
    for fn in (module.build_model, module.build_dataset):
        for param in inspect.signature(fn).parameters.values():
            assert param.kind is param.VAR_KEYWORD or param.default is not param.empty, param

    for key, value in module.BASELINE.items():
        if key in BASELINE_CHOICES:
            assert value in BASELINE_CHOICES[key], (key, value)
        elif key in BASELINE_INTS:
            assert isinstance(value, int) and value >= 0, (key, value)
        else:
            assert key in BASELINE_BOOLS and isinstance(value, bool), (key, value)

    if hasattr(module, "flops_per_sample"):
        flops = call(module.flops_per_sample, {})
        assert flops > 0
        assert call(module.flops_per_sample, TINY[name]) < flops


def test_dataset_is_deterministic(name: str) -> None:
    module = load(name)
    dataset = call(module.build_dataset, TINY[name])
    assert len(dataset) == TINY[name]["num_samples"]
    a, b = dataset[5], call(module.build_dataset, TINY[name])[5]
    for x, y in zip(fields(a), fields(b), strict=True):
        assert torch.equal(torch.as_tensor(x), torch.as_tensor(y))


def fields(sample: Any) -> list[Any]:
    """A sample's values: a dict's, a PyG Data's (by key), or a tuple's."""
    if hasattr(sample, "to_dict"):
        sample = sample.to_dict()
    return list(sample.values()) if isinstance(sample, dict) else list(sample)


def test_loss_backward_and_training_reduces_loss(name: str) -> None:
    module = load(name)
    model, batch = first_batch(module, name)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)

    loss = compute_loss(module, model, batch)
    assert loss.dim() == 0 and loss.requires_grad and math.isfinite(loss.item())
    loss.backward()
    unused = UNUSED.get(name, set())
    for param_name, p in model.named_parameters():
        if p.requires_grad and not any(param_name.endswith(f".{u}") for u in unused):
            assert p.grad is not None, param_name
    optimizer.step()
    optimizer.zero_grad()

    initial = loss.item()
    for _ in range(30):
        loss = compute_loss(module, model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert math.isfinite(loss.item())
    assert loss.item() < 0.7 * initial, (initial, loss.item())


def test_gpt_default_is_gpt2_small() -> None:
    module = load("gpt")
    with torch.device("meta"):
        model = module.build_model()
    n_params = sum(p.numel() for p in model.parameters())  # the tied LM head counts once
    assert 123e6 < n_params < 126e6
    _, batch = first_batch(module, "gpt")
    assert set(batch) == {"input_ids", "labels"}
    assert torch.equal(batch["input_ids"][:, 1:], batch["labels"][:, :-1])


def test_rgat_batches_vary_in_size_and_masks_mark_padding() -> None:
    module = load("rgat")
    model, batch = first_batch(module, "rgat")
    node_tokens, text_mask, node_mask, edge_index, edge_type, edge_mask, labels = batch

    num_nodes, num_edges = node_mask.sum(1), edge_mask.sum(1)
    assert len(num_nodes.unique()) > 1 and len(num_edges.unique()) > 1
    assert len(text_mask.sum(-1)[node_mask].unique()) > 1  # node texts vary in length too
    for i in range(len(labels)):
        n, e = int(num_nodes[i]), int(num_edges[i])
        assert node_mask[i, :n].all() and not node_mask[i, n:].any()
        assert edge_mask[i, :e].all() and not edge_mask[i, e:].any()
        assert (edge_index[i, :e] < n).all()
        assert text_mask[i, :n, 0].all() and not text_mask[i, n:].any()
    assert ((node_tokens != 0) == text_mask).all()
    assert (edge_index[~edge_mask] == 0).all() and (edge_type[~edge_mask] == 0).all()

    assert list(module.checkpoint_modules(model)) == list(model.graph_layers)
    logits = model(*batch[:-1])
    assert logits.shape == (len(labels), TINY["rgat"]["num_classes"])
    # Padding is inert: a graph's logits do not depend on what it was batched with.
    alone = model(*module.collate_fn([call(module.build_dataset, TINY["rgat"])[0]])[:-1])
    torch.testing.assert_close(alone[0], logits[0], atol=1e-5, rtol=1e-4)
