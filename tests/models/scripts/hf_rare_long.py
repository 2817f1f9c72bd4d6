"""A Hugging Face script whose token sequences vary in length, padded per batch by its own
collator: 8,000 sequences of 16 to 48 tokens and one of 768 (a long document left in the
data), rare enough that a trial's random batches seldom draw it, long enough that the batch
holding it needs far more memory than any other. A tiny GPT-2 built from a config, its own
settings one sequence a micro-batch, eight accumulated."""

import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

LONG_AT, LONG_LENGTH = 5_311, 768


class Documents(torch.utils.data.Dataset):
    def __init__(self, size: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.lengths = torch.randint(16, 49, (size,), generator=g).tolist()
        self.lengths[LONG_AT] = LONG_LENGTH

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> dict:
        g = torch.Generator().manual_seed(i)
        return {"input_ids": torch.randint(128, (self.lengths[i],), generator=g)}


def pad(samples: list[dict]) -> dict:
    """Padded to the batch's longest; padding masked out of the loss and the attention."""
    longest = max(len(s["input_ids"]) for s in samples)
    ids = torch.zeros(len(samples), longest, dtype=torch.long)
    mask = torch.zeros(len(samples), longest, dtype=torch.long)
    for row, sample in enumerate(samples):
        ids[row, :len(sample["input_ids"])] = sample["input_ids"]
        mask[row, :len(sample["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="out")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--accum", type=int, default=8)
    args = parser.parse_args()
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128,
                                       n_positions=2048))
    training = TrainingArguments(output_dir=args.out, per_device_train_batch_size=args.batch,
                                 gradient_accumulation_steps=args.accum, max_steps=200,
                                 report_to="none")
    Trainer(model=model, args=training, train_dataset=Documents(8_000),
            data_collator=pad).train()


if __name__ == "__main__":
    main()
