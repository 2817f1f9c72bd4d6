"""autotune: find the fastest training configuration for a PyTorch model on this machine,
measured.

The command line (`autotune run`, `bench`, `profile`, `show`, `export`, `report`, `studies`) is
the way in. In your own training loop, a configuration a study exported applies with the same
code the trials ran:

    from autotune import TrainConfig, setup_training
    setup = setup_training(model, dataset, TrainConfig.load("best.yaml"), "cuda", loss_fn=loss)

Inside, four packages follow the process boundary: `trial` runs in a trial's own process,
`search` in the tuner's, `study` is the storage and its read side, `show` what people see.
"""

from autotune.config import TrainConfig
from autotune.errors import AutotuneError
from autotune.trial.training import (
           apply_activation_checkpointing,
           setup_from_workload,
           setup_training,
)
from autotune.trial.workload import load_workload

__all__ = ["AutotuneError", "TrainConfig", "apply_activation_checkpointing", "load_workload",
           "setup_from_workload", "setup_training"]
