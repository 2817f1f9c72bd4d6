"""A Hugging Face training script with its TrainingArguments written in the code (only the
output directory comes from the command line): a tiny GPT-2 from a config, generated tokens,
many epochs asked for, and the usual post-training work after Trainer.train()."""

import argparse
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

parser = argparse.ArgumentParser()
parser.add_argument("--output-dir", required=True)
options = parser.parse_args()

g = torch.Generator().manual_seed(0)
ids = torch.randint(128, (64, 16), generator=g)
dataset = [{"input_ids": row, "labels": row} for row in ids]

model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128,
                                   n_positions=16))
args = TrainingArguments(
    output_dir=options.output_dir,
    per_device_train_batch_size=4,
    gradient_accumulation_steps=2,
    num_train_epochs=100,
    learning_rate=1e-3,
    max_grad_norm=1e-3,
    logging_steps=1,
    save_steps=1,
)
trainer = Trainer(model=model, args=args, train_dataset=dataset)
trainer.train()
trainer.save_model()
trainer.evaluate(dataset)
Path(options.output_dir, "post_training_ran").write_text("yes")
