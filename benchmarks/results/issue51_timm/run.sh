#!/bin/bash
# timm's own train.py (upstream aa4b5850), unchanged, tuned from its folder: the issue 51 case.
cd /work/timmcheck
/work/venv-214/bin/python make_data.py
/work/venv-214/bin/python -m autotune run --script train.py --device cpu --trials 5 --studies-dir studies \
  --arg micro_batch_size=--batch-size --arg grad_accum_steps=--grad-accum-steps -- \
  --data-dir data --model resnet18 --num-classes 10 --img-size 64 -b 32 --epochs 50 --workers 2 \
  --device cpu --no-prefetcher --output out
echo "rc $?"
