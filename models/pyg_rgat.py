"""A relational graph attention network as PyTorch Geometric users write it: ``RGATConv``
layers over synthetic relational graphs, collated by PyG's own ``Batch.from_data_list``.

A user's real-library model next to the project's own ``rgat.py``: samples are PyG ``Data``
objects (node features ``x``, ``edge_index``, ``edge_type``, a graph label ``y``) of varying
size, a batch is one big disconnected graph (``torch_geometric.data.Batch``, moved to the
device by its own ``.to()``), and the layers gather and scatter over edges instead of padding.
``RGATConv`` selects one weight matrix per edge by its relation, so activations grow with the
edge count: memory-hungry, where activation checkpointing matters. The loss comes from
``loss_fn``.

Needs the ``examples`` extra (``pip install -e ".[examples]"``; PyG's optional compiled
extensions are not needed).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset
from torch_geometric.data import Batch, Data
from torch_geometric.nn import RGATConv, global_mean_pool

BASELINE = {
    "micro_batch_size": 32,
    "grad_accum_steps": 1,
    "precision": "fp32",
    "optimizer_impl": "for_loop",
    "num_workers": 0,
}


class RGATBlock(nn.Module):
    """``RGATConv`` (multi-head, heads concatenated), then a residual and a layer norm."""

    def __init__(self, hidden: int, heads: int, num_relations: int, dropout: float) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden={hidden} is not divisible by heads={heads}")
        self.conv = RGATConv(hidden, hidden // heads, num_relations, heads=heads, dropout=dropout)
        self.norm = nn.LayerNorm(hidden)

    def forward(
        self, h: torch.Tensor, edge_index: torch.Tensor, edge_type: torch.Tensor
    ) -> torch.Tensor:
        return self.norm(h + F.gelu(self.conv(h, edge_index, edge_type)))


class RelationalGAT(nn.Module):
    def __init__(
        self,
        feature_dim: int,
        hidden: int,
        heads: int,
        layers: int,
        num_relations: int,
        num_classes: int,
        dropout: float,
    ) -> None:
        super().__init__()
        self.embed = nn.Linear(feature_dim, hidden)
        self.layers = nn.ModuleList(
            RGATBlock(hidden, heads, num_relations, dropout) for _ in range(layers)
        )
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, batch: Batch) -> torch.Tensor:
        """Graph-level class logits [num_graphs, num_classes]."""
        h = self.embed(batch.x)
        for layer in self.layers:
            h = layer(h, batch.edge_index, batch.edge_type)
        return self.head(global_mean_pool(h, batch.batch, size=batch.num_graphs))


class RandomRelationalGraphs(Dataset):
    """Random graphs of varying size whose label is their most frequent edge type.

    About half of each graph's edges carry its dominant relation, so the label is recoverable
    by aggregating relation information over the graph (mod ``num_classes``).
    """

    def __init__(
        self,
        num_samples: int,
        min_nodes: int,
        max_nodes: int,
        edges_per_node: int,
        feature_dim: int,
        num_relations: int,
        num_classes: int,
        seed: int,
    ) -> None:
        if not 1 <= min_nodes <= max_nodes:
            raise ValueError(f"need 1 <= min_nodes ({min_nodes}) <= max_nodes ({max_nodes})")
        self.num_samples = num_samples
        self.min_nodes = min_nodes
        self.max_nodes = max_nodes
        self.edges_per_node = edges_per_node
        self.feature_dim = feature_dim
        self.num_relations = num_relations
        self.num_classes = num_classes
        self.seed = seed

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, idx: int) -> Data:
        g = torch.Generator().manual_seed(self.seed + idx)
        n = int(torch.randint(self.min_nodes, self.max_nodes + 1, (), generator=g))
        e = self.edges_per_node * n
        start = torch.randint(n, (e,), generator=g)
        # A nonzero offset avoids self-loops (a single-node graph keeps them).
        end = (start + torch.randint(1, max(n, 2), (e,), generator=g)) % n
        dominant = torch.randint(self.num_relations, (), generator=g)
        random_type = torch.randint(self.num_relations, (e,), generator=g)
        edge_type = torch.where(torch.rand(e, generator=g) < 0.5, dominant, random_type)
        label = int(torch.bincount(edge_type, minlength=self.num_relations).argmax())
        return Data(
            x=torch.randn(n, self.feature_dim, generator=g),
            edge_index=torch.stack([start, end]),
            edge_type=edge_type,
            y=torch.tensor([label % self.num_classes]),
        )


collate_fn = Batch.from_data_list


def loss_fn(model: nn.Module, batch: Batch) -> torch.Tensor:
    return F.cross_entropy(model(batch), batch.y)


def build_model(
    feature_dim: int = 64,
    hidden: int = 128,
    heads: int = 4,
    layers: int = 3,
    num_relations: int = 16,
    num_classes: int = 10,
    dropout: float = 0.0,
) -> nn.Module:
    return RelationalGAT(feature_dim, hidden, heads, layers, num_relations, num_classes, dropout)


def build_dataset(
    num_samples: int = 50_000,
    min_nodes: int = 2,
    max_nodes: int = 64,
    edges_per_node: int = 3,
    feature_dim: int = 64,
    num_relations: int = 16,
    num_classes: int = 10,
    seed: int = 0,
) -> Dataset:
    return RandomRelationalGraphs(
        num_samples,
        min_nodes,
        max_nodes,
        edges_per_node,
        feature_dim,
        num_relations,
        num_classes,
        seed,
    )
