"""A new user's Accelerate script (issue 40's bar), in the style of accelerate's
examples/nlp_example.py: BERT for sequence classification built from a config (no download), a
local paraphrase-like dataset of variable-length token sequences padded per batch,
hyper-parameters in a dict, mixed precision from its own --mixed_precision flag, accumulation
by hand when the batch is larger than fits, an evaluation at each epoch's end, and its state
saved in --output_dir."""
import argparse
import os

import torch
from accelerate import Accelerator, DistributedType
from torch.utils.data import DataLoader, Dataset
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    get_linear_schedule_with_warmup,
    set_seed,
)

MAX_GPU_BATCH_SIZE = 16
EVAL_BATCH_SIZE = 32


class Pairs(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for _ in range(n):
            length = int(torch.randint(16, 64, (1,), generator=g))
            ids = torch.randint(5, 1000, (length,), generator=g)
            self.items.append({"input_ids": ids, "labels": int(ids[:4].sum()) % 2})

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def collate_fn(examples):
    longest = max(len(e["input_ids"]) for e in examples)
    ids = torch.zeros(len(examples), longest, dtype=torch.long)
    mask = torch.zeros(len(examples), longest, dtype=torch.long)
    for i, e in enumerate(examples):
        ids[i, :len(e["input_ids"])] = e["input_ids"]
        mask[i, :len(e["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask,
            "labels": torch.tensor([e["labels"] for e in examples])}


def get_dataloaders(accelerator, batch_size=16):
    train_dataloader = DataLoader(Pairs(3668, 0), shuffle=True, collate_fn=collate_fn,
                                  batch_size=batch_size)
    eval_dataloader = DataLoader(Pairs(408, 1), shuffle=False, collate_fn=collate_fn,
                                 batch_size=EVAL_BATCH_SIZE)
    return train_dataloader, eval_dataloader


def training_function(config, args):
    accelerator = Accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision)
    lr = config["lr"]
    num_epochs = int(config["num_epochs"])
    seed = int(config["seed"])
    batch_size = int(config["batch_size"])

    gradient_accumulation_steps = 1
    if batch_size > MAX_GPU_BATCH_SIZE and accelerator.distributed_type != DistributedType.XLA:
        gradient_accumulation_steps = batch_size // MAX_GPU_BATCH_SIZE
        batch_size = MAX_GPU_BATCH_SIZE

    set_seed(seed)
    train_dataloader, eval_dataloader = get_dataloaders(accelerator, batch_size)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=1000, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
        intermediate_size=512))
    model = model.to(accelerator.device)
    optimizer = torch.optim.AdamW(params=model.parameters(), lr=lr)
    lr_scheduler = get_linear_schedule_with_warmup(
        optimizer=optimizer,
        num_warmup_steps=100,
        num_training_steps=(len(train_dataloader) * num_epochs) // gradient_accumulation_steps,
    )
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler
    )

    for epoch in range(num_epochs):
        model.train()
        for step, batch in enumerate(train_dataloader):
            batch.to(accelerator.device) if hasattr(batch, "to") else None
            outputs = model(**batch)
            loss = outputs.loss
            loss = loss / gradient_accumulation_steps
            accelerator.backward(loss)
            if step % gradient_accumulation_steps == 0:
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()

        model.eval()
        correct = total = 0
        for batch in eval_dataloader:
            with torch.no_grad():
                outputs = model(**batch)
            predictions, references = accelerator.gather_for_metrics(
                (outputs.logits.argmax(dim=-1), batch["labels"]))
            correct += int((predictions == references).sum())
            total += len(references)
        accelerator.print(f"epoch {epoch}: accuracy {correct / total:.3f}")
        if args.output_dir:
            accelerator.save_state(os.path.join(args.output_dir, f"epoch_{epoch}"))


def main():
    parser = argparse.ArgumentParser(description="Simple example of training script.")
    parser.add_argument("--mixed_precision", type=str, default=None,
                        choices=["no", "fp16", "bf16", "fp8"],
                        help="Whether to use mixed precision.")
    parser.add_argument("--cpu", action="store_true", help="If passed, will train on the CPU.")
    parser.add_argument("--output_dir", type=str, default=None)
    args = parser.parse_args()
    config = {"lr": 2e-5, "num_epochs": 3, "seed": 42, "batch_size": 16}
    training_function(config, args)


if __name__ == "__main__":
    main()
