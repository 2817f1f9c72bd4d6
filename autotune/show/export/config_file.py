"""The configuration as a file `TrainConfig.load` reads back: YAML with a header naming the
knobs (and what the study checked of them), or JSON (which has no comments: the checks are a key
of their own)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from autotune.config import CHECKS, TrainConfig
from autotune.show.export.common import header


def yaml_file(config: TrainConfig, nproc_per_node: int, checks: Sequence[str] = ()) -> str:
    return "\n".join(header(config, nproc_per_node, checks)) + "\n" + config.to_yaml()


def json_file(config: TrainConfig, checks: Sequence[str] = ()) -> str:
    """The knobs, and what the study checked of them beyond their speed (`checks`, a list of
    lines, which `TrainConfig.load` leaves out)."""
    if not checks:
        return config.to_json()
    return json.dumps({**config.to_dict(), CHECKS: list(checks)}, indent=2) + "\n"
