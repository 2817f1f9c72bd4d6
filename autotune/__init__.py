"""autotune: find the fastest training configuration for a PyTorch model on this machine,
measured.

The command line (`autotune run`, `bench`, `profile`, `show`, `export`, `report`, `studies`) is
the way in. In your own training loop, a configuration a study exported applies with the same
code the trials ran:

    from autotune import TrainConfig, setup_training
    setup = setup_training(model, dataset, TrainConfig.load("best.yaml"), "cuda", loss_fn=loss)

The scripts `autotune export` writes import from here alone, so what a process group's own
loop needs is here too: `make_optimizer`, `convert_to_float8`, `repeated_blocks`,
`callable_blocks`.

Inside, four packages follow the process boundary: `trial` runs in a trial's own process,
`search` in the tuner's, `study` is the storage and its read side, `show` what people see.
"""

from autotune.config import TrainConfig
from autotune.errors import AutotuneError
from autotune.trial.distributed import callable_blocks
from autotune.trial.float8 import convert_to_float8
from autotune.trial.optimizers import make_optimizer
from autotune.trial.training import (
           apply_activation_checkpointing,
           repeated_blocks,
           setup_from_workload,
           setup_training,
)
from autotune.trial.workload import load_workload

# What a user's code (and every script `autotune export` writes) imports; the modules inside
# the package are not its interface.
__all__ = ["AutotuneError", "TrainConfig", "apply_activation_checkpointing", "callable_blocks",
           "convert_to_float8", "load_workload", "make_optimizer", "repeated_blocks",
           "setup_from_workload", "setup_training"]
