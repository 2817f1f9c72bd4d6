"""A user's own training script as a trial: run as `__main__` with its own arguments
(`runner`), the libraries patched when it imports them (`imports`), the trial's knobs applied
through Hugging Face's and Lightning's own settings (`hf`, `lightning`), their own training loop
measured through a `StepObserver` (`observer`) and ended when the measurement is done."""
