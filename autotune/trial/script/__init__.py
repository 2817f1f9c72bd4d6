"""A user's own training script as a trial: run as `__main__` with its own arguments
(`runner`), the libraries patched when it imports them (`imports`), the trial's knobs applied
through Hugging Face's, Lightning's and Accelerate's own settings (`hf`, `lightning`,
`accelerate`) or, in a hand-written loop, where the script builds its loader, optimizer and
model (`loop`), its own training loop measured through a `StepObserver` (`observer`) and ended
when the measurement is done; the answer where the script says each setting (`sources`)."""
