"""Relational graph attention network ("SemanticRgat") classifying synthetic graphs.

A realistic, deliberately un-optimised research model: every node carries a short text that
a small transformer encodes, edges have learned type embeddings, and each graph-attention
layer scores (start node, edge, end node) triples with an MLP and normalises the scores over
each end node's incoming edges. Graphs vary in size, so ``collate_fn`` pads nodes, texts and
edges on the CPU and builds the masks (DataLoader workers matter), shapes change from batch to
batch (hard for torch.compile), and the attention is scatter/gather-heavy rather than a few
big matmuls. Batches are tuples and the loss comes from ``loss_fn``.

Batch layout (B graphs, N nodes, E edges, L tokens, each padded to the batch maximum)::

    (node_tokens LongTensor[B, N, L], text_mask BoolTensor[B, N, L],
     node_mask BoolTensor[B, N], edge_index LongTensor[B, E, 2] (start, end),
     edge_type LongTensor[B, E], edge_mask BoolTensor[B, E], labels LongTensor[B])

Masks are True for real entries. Padding tokens, edge indices and edge types are 0.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

BASELINE = {
    "micro_batch_size": 32,
    "grad_accum_steps": 1,
    "precision": "fp32",
    "optimizer_impl": "for_loop",
    "num_workers": 0,
}


class Graph(NamedTuple):
    """One unpadded sample; node texts are stored flat, split by ``text_lens``."""

    tokens: torch.Tensor  # LongTensor[sum(text_lens)], ids >= 1 (0 is padding)
    text_lens: torch.Tensor  # LongTensor[num_nodes], each >= 1
    edge_index: torch.Tensor  # LongTensor[num_edges, 2], (start, end)
    edge_type: torch.Tensor  # LongTensor[num_edges]
    label: int


class TextEncoder(nn.Module):
    """Encodes each node's token text and mean-pools it into one vector per node."""

    def __init__(
        self, vocab_size: int, max_text_len: int, hidden: int, heads: int, layers: int
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab_size, hidden, padding_idx=0)
        self.pos = nn.Embedding(max_text_len, hidden)
        layer = nn.TransformerEncoderLayer(
            hidden, heads, 4 * hidden, dropout=0.0, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def forward(self, tokens: torch.Tensor, text_mask: torch.Tensor) -> torch.Tensor:
        b, n, length = tokens.shape
        tokens = tokens.reshape(b * n, length)
        mask = text_mask.reshape(b * n, length)
        x = self.tok(tokens) + self.pos(torch.arange(length, device=tokens.device))
        # Pad nodes have no tokens at all; letting them attend to their padding keeps the
        # softmax finite. Their vectors are zeroed by the node mask afterwards.
        attend = mask | ~mask.any(dim=1, keepdim=True)
        x = self.encoder(x, src_key_padding_mask=~attend)
        weights = mask.unsqueeze(-1).to(x.dtype)
        pooled = (x * weights).sum(1) / weights.sum(1).clamp_min(1.0)
        return pooled.reshape(b, n, -1)


class RelationalAttentionLayer(nn.Module):
    """Multi-head attention over each end node's incoming edges, then residual FFN.

    The logit of edge (s -> t) with type r is MLP([h_s, e_r, h_t]); the message is a linear
    map of [h_s, e_r]. Softmax runs over the real edges ending at t.
    """

    def __init__(self, hidden: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.score = nn.Sequential(
            nn.Linear(3 * hidden, hidden), nn.GELU(), nn.Linear(hidden, heads)
        )
        self.message = nn.Linear(2 * hidden, hidden)
        self.out = nn.Linear(hidden, hidden)
        self.norm1 = nn.LayerNorm(hidden)
        self.ffn = nn.Sequential(
            nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden)
        )
        self.norm2 = nn.LayerNorm(hidden)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        h: torch.Tensor,
        node_mask: torch.Tensor,
        edge_emb: torch.Tensor,
        edge_index: torch.Tensor,
        edge_mask: torch.Tensor,
    ) -> torch.Tensor:
        b, n, d = h.shape
        e = edge_index.shape[1]
        start, end = edge_index[..., 0], edge_index[..., 1]
        h_start = h.gather(1, start.unsqueeze(-1).expand(b, e, d))
        h_end = h.gather(1, end.unsqueeze(-1).expand(b, e, d))

        logits = self.score(torch.cat([h_start, edge_emb, h_end], dim=-1))  # [B, E, heads]
        logits = logits.masked_fill(~edge_mask.unsqueeze(-1), float("-inf"))

        # Softmax grouped by end node: subtract each group's max (for stability only, so no
        # gradient), exponentiate, divide by the group's sum. Pad edges get exp(-inf) = 0.
        end_h = end.unsqueeze(-1).expand(b, e, self.heads)
        group_max = logits.new_full((b, n, self.heads), float("-inf"))
        group_max = group_max.scatter_reduce(1, end_h, logits.detach(), "amax")
        group_max = group_max.nan_to_num(neginf=0.0)  # nodes without incoming edges
        weights = torch.exp(logits - group_max.gather(1, end_h))
        denom = weights.new_zeros(b, n, self.heads).scatter_add(1, end_h, weights)
        alpha = weights / denom.gather(1, end_h).clamp_min(1e-6)

        msg = self.message(torch.cat([h_start, edge_emb], dim=-1))
        msg = (msg.view(b, e, self.heads, d // self.heads) * alpha.unsqueeze(-1)).view(b, e, d)
        agg = msg.new_zeros(b, n, d).scatter_add(1, end.unsqueeze(-1).expand(b, e, d), msg)

        h = self.norm1(h + self.dropout(self.out(agg)))
        h = self.norm2(h + self.dropout(self.ffn(h)))
        return h * node_mask.unsqueeze(-1).to(h.dtype)


class SemanticRgat(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        max_text_len: int,
        num_edge_types: int,
        num_classes: int,
        hidden: int,
        heads: int,
        text_layers: int,
        graph_layers: int,
        dropout: float,
    ) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden={hidden} is not divisible by heads={heads}")
        self.text_encoder = TextEncoder(vocab_size, max_text_len, hidden, heads, text_layers)
        self.edge_emb = nn.Embedding(num_edge_types, hidden)
        self.graph_layers = nn.ModuleList(
            RelationalAttentionLayer(hidden, heads, dropout) for _ in range(graph_layers)
        )
        self.head = nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, num_classes))

    def forward(
        self,
        node_tokens: torch.Tensor,
        text_mask: torch.Tensor,
        node_mask: torch.Tensor,
        edge_index: torch.Tensor,
        edge_type: torch.Tensor,
        edge_mask: torch.Tensor,
    ) -> torch.Tensor:
        """Returns graph-level class logits [B, num_classes]."""
        h = self.text_encoder(node_tokens, text_mask)
        h = h * node_mask.unsqueeze(-1).to(h.dtype)
        edge_emb = self.edge_emb(edge_type)
        for layer in self.graph_layers:
            h = layer(h, node_mask, edge_emb, edge_index, edge_mask)
        node_weights = node_mask.unsqueeze(-1).to(h.dtype)
        pooled = (h * node_weights).sum(1) / node_weights.sum(1).clamp_min(1.0)
        return self.head(pooled)


class RandomGraphDataset(Dataset):
    """Random graphs of varying size whose label is their most frequent edge type.

    Each graph has a dominant edge type that about half its edges carry, so the label is
    recoverable by aggregating edge-type information over the graph (mod ``num_classes``).
    """

    def __init__(
        self,
        num_samples: int,
        min_nodes: int,
        max_nodes: int,
        edges_per_node: int,
        max_text_len: int,
        vocab_size: int,
        num_edge_types: int,
        num_classes: int,
        seed: int,
    ) -> None:
        if not 1 <= min_nodes <= max_nodes:
            raise ValueError(f"need 1 <= min_nodes ({min_nodes}) <= max_nodes ({max_nodes})")
        self.num_samples = num_samples
        self.min_nodes = min_nodes
        self.max_nodes = max_nodes
        self.edges_per_node = edges_per_node
        self.max_text_len = max_text_len
        self.vocab_size = vocab_size
        self.num_edge_types = num_edge_types
        self.num_classes = num_classes
        self.seed = seed

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, idx: int) -> Graph:
        g = torch.Generator().manual_seed(self.seed + idx)
        n = int(torch.randint(self.min_nodes, self.max_nodes + 1, (), generator=g))
        text_lens = torch.randint(1, self.max_text_len + 1, (n,), generator=g)
        tokens = torch.randint(1, self.vocab_size, (int(text_lens.sum()),), generator=g)

        e = self.edges_per_node * n
        start = torch.randint(n, (e,), generator=g)
        # A nonzero offset avoids self-loops (a single-node graph keeps them).
        end = (start + torch.randint(1, max(n, 2), (e,), generator=g)) % n
        dominant = torch.randint(self.num_edge_types, (), generator=g)
        random_type = torch.randint(self.num_edge_types, (e,), generator=g)
        edge_type = torch.where(torch.rand(e, generator=g) < 0.5, dominant, random_type)
        label = int(torch.bincount(edge_type, minlength=self.num_edge_types).argmax())
        return Graph(
            tokens, text_lens, torch.stack([start, end], dim=1), edge_type, label % self.num_classes
        )


def collate_fn(samples: list[Graph]) -> tuple[torch.Tensor, ...]:
    """Pads a list of graphs to the batch's largest node count, text length and edge count."""
    b = len(samples)
    n = max(len(s.text_lens) for s in samples)
    length = max(int(s.text_lens.max()) for s in samples)
    e = max(len(s.edge_type) for s in samples)

    node_tokens = torch.zeros(b, n, length, dtype=torch.long)
    text_mask = torch.zeros(b, n, length, dtype=torch.bool)
    node_mask = torch.zeros(b, n, dtype=torch.bool)
    edge_index = torch.zeros(b, e, 2, dtype=torch.long)
    edge_type = torch.zeros(b, e, dtype=torch.long)
    edge_mask = torch.zeros(b, e, dtype=torch.bool)
    positions = torch.arange(length)
    for i, s in enumerate(samples):
        num_nodes, num_edges = len(s.text_lens), len(s.edge_type)
        mask = positions < s.text_lens.unsqueeze(1)  # [num_nodes, length]
        text_mask[i, :num_nodes] = mask
        node_tokens[i, :num_nodes][mask] = s.tokens  # row-major fill matches the flat order
        node_mask[i, :num_nodes] = True
        edge_index[i, :num_edges] = s.edge_index
        edge_type[i, :num_edges] = s.edge_type
        edge_mask[i, :num_edges] = True
    labels = torch.tensor([s.label for s in samples], dtype=torch.long)
    return node_tokens, text_mask, node_mask, edge_index, edge_type, edge_mask, labels


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    *inputs, labels = batch
    return F.cross_entropy(model(*inputs), labels)


def checkpoint_modules(model: nn.Module) -> list[nn.Module]:
    """The graph layers: the text encoder's layers are fewer and cheaper to keep."""
    return list(model.graph_layers)


def build_model(
    hidden: int = 256,
    heads: int = 4,
    text_layers: int = 2,
    graph_layers: int = 4,
    vocab_size: int = 8192,
    max_text_len: int = 16,
    num_edge_types: int = 16,
    num_classes: int = 10,
    dropout: float = 0.0,
) -> nn.Module:
    return SemanticRgat(
        vocab_size,
        max_text_len,
        num_edge_types,
        num_classes,
        hidden,
        heads,
        text_layers,
        graph_layers,
        dropout,
    )


def build_dataset(
    num_samples: int = 50_000,
    min_nodes: int = 2,
    max_nodes: int = 64,
    edges_per_node: int = 3,
    max_text_len: int = 16,
    vocab_size: int = 8192,
    num_edge_types: int = 16,
    num_classes: int = 10,
    seed: int = 0,
) -> Dataset:
    return RandomGraphDataset(
        num_samples,
        min_nodes,
        max_nodes,
        edges_per_node,
        max_text_len,
        vocab_size,
        num_edge_types,
        num_classes,
        seed,
    )
