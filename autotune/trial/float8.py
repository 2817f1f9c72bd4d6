"""float8 training through torchao: the large linear layers compute in float8, the rest in bf16.

torchao's `convert_to_float8_training` swaps each chosen `nn.Linear` for a `Float8Linear`
(tensorwise or rowwise scales, the two `precision` values). Which layers: float8 matmuls need
both sides divisible by 16, and a small matmul loses more to the casts and scales than float8
gains (pytorch/ao #1297; torchtitan filters the same way), so layers below `MIN_FEATURES` on
either side stay in bf16. torchao's kernels are Triton's: float8 runs only compiled, which
`hardware.unsupported_reason` holds to.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from torch import nn

from autotune.config import FP8_PRECISIONS

# Below this many input or output features a linear layer stays in bf16.
MIN_FEATURES = 1024
# float8 matmuls (cuBLASLt's, and torch._scaled_mm) need both dimensions divisible by this.
FP8_MULTIPLE = 16

LayerFilter = Callable[[nn.Module, str], bool]


def large_linears(min_features: int = MIN_FEATURES) -> LayerFilter:
    """The layers worth float8: `nn.Linear`s with both sides >= `min_features` and divisible
    by 16."""
    def chosen(module: nn.Module, name: str) -> bool:
        if not isinstance(module, nn.Linear):
            return False
        sides = (module.in_features, module.out_features)
        return all(s >= min_features and s % FP8_MULTIPLE == 0 for s in sides)

    return chosen


def convert_to_float8(model: nn.Module, precision: str, *, emulate: bool = False,
                      min_features: int = MIN_FEATURES) -> int:
    """Swap `model`'s large linear layers for torchao's `Float8Linear` under `precision`'s
    scaling; how many were swapped (0: none is large enough, nothing changed). `emulate` runs
    the float8 casts without float8 matmuls, as torchao's own CPU tests do."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    if precision not in FP8_PRECISIONS:
        raise ValueError(f"{precision} is not a float8 precision ({', '.join(FP8_PRECISIONS)})")
    chosen = large_linears(min_features)
    count = sum(chosen(m, name) for name, m in model.named_modules())
    if count:
        config = Float8LinearConfig.from_recipe_name(precision.removeprefix("fp8_"))
        if emulate:
            config = dataclasses.replace(config, emulate=True)
        convert_to_float8_training(model, config=config, module_filter_fn=chosen)
    return count
