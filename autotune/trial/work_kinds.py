"""Which kind of work each profiled operator is, so a step reads as an engineer reads a profile.

An MFU short of the roofline is explained by where the rest of the step goes: the matmuls and
convolutions that carry the model's FLOPs, attention, the memory-bound elementwise work and norms
that fusion (torch.compile) shrinks, the optimizer's kernels, copies and collectives. The kinds
are told apart by operator and kernel names: aten's on both devices, and the kernels a compiled
graph launches under their own names (Triton's, cuBLAS's, CUTLASS's) on CUDA.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

from autotune.trial.protocol import WorkKind

# Checked in this order: a collective or an attention kernel can name a gemm inside it, a
# compiled graph's range holds kernels of every kind.
_PATTERNS = (
    (WorkKind.COMMUNICATION, re.compile(r"nccl|gloo|c10d|all_?reduce|all_?gather|reduce_scatter")),
    (WorkKind.ATTENTION, re.compile(r"attention|flash|fmha|sdpa|scaled_dot_product")),
    (WorkKind.OPTIMIZER, re.compile(r"_foreach_|_fused_adam|multi_tensor_apply")),
    (WorkKind.MATMUL, re.compile(r"(?:^|::)_?(?:mm|addmm|bmm|baddbmm|scaled_mm|addmv|mv|matmul"
                                 r"|linear|mkldnn_linear|addmm_activation)$"
                                 r"|gemm|cutlass|nvjet|xmma|triton_tem_.*mm|conv")),
    (WorkKind.COPY, re.compile(r"copy|memcpy|memset|contiguous")),
    (WorkKind.GRAPH, re.compile(r"compiledfunction|compiledfxgraph|cudagraph|graph_?launch")),
)


def kind_of(name: str) -> WorkKind:
    """The kind of work an operator or kernel does, from its name."""
    lowered = name.lower()
    return next((kind for kind, pattern in _PATTERNS if pattern.search(lowered)),
                WorkKind.ELEMENTWISE)


def shares_by_kind(times: Iterable[tuple[str, float]]) -> dict[WorkKind, float]:
    """Each kind's share of the summed (name, self time) pairs, the largest first; empty when
    nothing took time."""
    totals: Counter[WorkKind] = Counter()
    for name, seconds in times:
        totals[kind_of(name)] += seconds
    whole = sum(totals.values())
    if whole <= 0:
        return {}
    return {kind: seconds / whole for kind, seconds in totals.most_common() if seconds > 0}
