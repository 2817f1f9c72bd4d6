"""An Accelerate training script in the style of Hugging Face's `run_clm_no_trainer.py`: its
own argparse flags, an Accelerator built with the script's accumulation (trackers when asked),
a tiny GPT-2 built from a config (nothing downloaded), generated token sequences, a DataLoader
and an AdamW over two parameter groups, a learning-rate schedule, `accelerator.prepare`, a loop
under `accelerator.accumulate` with `accelerator.backward` and clipping when the gradients
sync, checkpoints every `--checkpointing_steps`, and the model saved to `--output_dir` at the
end. `--output_dir` is made at start, as the examples make it."""

import argparse
import math
import os

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, Dataset
from transformers import GPT2Config, GPT2LMHeadModel, get_scheduler


def parse_args():
    parser = argparse.ArgumentParser(description="Train a causal LM with Accelerate")
    parser.add_argument("--output_dir", type=str, default=None)
    parser.add_argument("--per_device_train_batch_size", type=int, default=4)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=2)
    parser.add_argument("--learning_rate", type=float, default=5e-4)
    parser.add_argument("--weight_decay", type=float, default=0.01)
    parser.add_argument("--num_train_epochs", type=int, default=100)
    parser.add_argument("--max_train_steps", type=int, default=None)
    parser.add_argument("--num_samples", type=int, default=512)
    parser.add_argument("--block_size", type=int, default=32)
    parser.add_argument("--checkpointing_steps", type=str, default=None)
    parser.add_argument("--with_tracking", action="store_true")
    parser.add_argument("--report_to", type=str, default="all")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


class Sequences(Dataset):
    def __init__(self, num_samples, block_size):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(256, (num_samples, block_size), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main():
    args = parse_args()
    accelerator_log_kwargs = {}
    if args.with_tracking:
        accelerator_log_kwargs["log_with"] = args.report_to
        accelerator_log_kwargs["project_dir"] = args.output_dir
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps,
                              **accelerator_log_kwargs)
    torch.manual_seed(args.seed)
    if accelerator.is_main_process and args.output_dir is not None:
        os.makedirs(args.output_dir, exist_ok=True)
    accelerator.wait_for_everyone()

    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=256,
                        n_positions=args.block_size)
    model = GPT2LMHeadModel(config)
    train_dataset = Sequences(args.num_samples, args.block_size)
    train_dataloader = DataLoader(train_dataset, shuffle=True,
                                  batch_size=args.per_device_train_batch_size)

    no_decay = ["bias", "ln_1.weight", "ln_2.weight", "ln_f.weight"]
    optimizer_grouped_parameters = [
        {"params": [p for n, p in model.named_parameters()
                    if not any(nd in n for nd in no_decay)],
         "weight_decay": args.weight_decay},
        {"params": [p for n, p in model.named_parameters()
                    if any(nd in n for nd in no_decay)],
         "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(optimizer_grouped_parameters, lr=args.learning_rate)

    num_update_steps_per_epoch = math.ceil(len(train_dataloader) /
                                           args.gradient_accumulation_steps)
    if args.max_train_steps is None:
        args.max_train_steps = args.num_train_epochs * num_update_steps_per_epoch
    lr_scheduler = get_scheduler(name="linear", optimizer=optimizer, num_warmup_steps=10,
                                 num_training_steps=args.max_train_steps)
    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, lr_scheduler)

    checkpointing_steps = args.checkpointing_steps
    if checkpointing_steps is not None and checkpointing_steps.isdigit():
        checkpointing_steps = int(checkpointing_steps)
    if args.with_tracking:
        accelerator.init_trackers("clm_no_trainer", vars(args))

    completed_steps = 0
    for _epoch in range(args.num_train_epochs):
        model.train()
        for batch in train_dataloader:
            with accelerator.accumulate(model):
                outputs = model(**batch)
                loss = outputs.loss
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                completed_steps += 1
                if isinstance(checkpointing_steps, int) and \
                        completed_steps % checkpointing_steps == 0:
                    output_dir = f"step_{completed_steps}"
                    if args.output_dir is not None:
                        output_dir = os.path.join(args.output_dir, output_dir)
                    accelerator.save_state(output_dir)
            if completed_steps >= args.max_train_steps:
                break
        if completed_steps >= args.max_train_steps:
            break

    accelerator.wait_for_everyone()
    if args.output_dir is not None:
        unwrapped_model = accelerator.unwrap_model(model)
        unwrapped_model.save_pretrained(args.output_dir,
                                        is_main_process=accelerator.is_main_process,
                                        save_function=accelerator.save)
    accelerator.end_training()


if __name__ == "__main__":
    main()
