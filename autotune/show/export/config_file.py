"""The configuration as a file `TrainConfig.load` reads back: YAML with a header naming the
knobs, or JSON (which has no comments)."""

from __future__ import annotations

from autotune.config import TrainConfig
from autotune.show.export.common import header


def yaml_file(config: TrainConfig, nproc_per_node: int) -> str:
    return "\n".join(header(config, nproc_per_node)) + "\n" + config.to_yaml()


def json_file(config: TrainConfig) -> str:
    return config.to_json()
