# OPTIONAL compatibility shim -- NOT part of upstream; run_clm_no_trainer.py itself is unchanged.
#
# run_clm_no_trainer.py (transformers v5.1.0, like every upstream version we could obtain) does
#     if accelerator.distributed_type == DistributedType.TPU:
# but accelerate 1.15.0 (installed in /work/venv-214) no longer has the `TPU` member
# (it was renamed `XLA`), so the unchanged script dies with `AttributeError: TPU` right after
# accelerator.prepare().  Putting this folder on PYTHONPATH makes Python import this file at
# start-up, which re-adds `DistributedType.TPU` as an alias of `DistributedType.XLA`.
# Usage:  PYTHONPATH=compat /work/venv-214/bin/python run_clm_no_trainer.py ...
try:
    from accelerate.utils import DistributedType

    if "TPU" not in DistributedType.__members__ and not hasattr(DistributedType, "TPU"):
        DistributedType.TPU = DistributedType.XLA
except Exception:  # never break interpreter start-up
    pass
