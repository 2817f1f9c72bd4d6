"""Find the fastest PyTorch training configuration for a model on this machine, measured."""
