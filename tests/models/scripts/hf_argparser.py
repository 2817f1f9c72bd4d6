"""A Hugging Face training script as people write it: its settings parsed from the command line
by HfArgumentParser into TrainingArguments (plus its own dataclass), a tiny GPT-2 built from a
config (nothing downloaded), generated token sequences, Trainer.train(), then the usual
post-training work: saving the model and a marker that says it ran."""

from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, HfArgumentParser, Trainer, TrainingArguments


@dataclass
class DataArguments:
    num_samples: int = field(default=64, metadata={"help": "sequences in the dataset"})
    block_size: int = field(default=16, metadata={"help": "tokens per sequence"})


class Sequences(torch.utils.data.Dataset):
    def __init__(self, num_samples: int, block_size: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(128, (num_samples, block_size), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    data_args, training_args = HfArgumentParser(
        (DataArguments, TrainingArguments)).parse_args_into_dataclasses()
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128,
                                       n_positions=data_args.block_size))
    trainer = Trainer(model=model, args=training_args,
                      train_dataset=Sequences(data_args.num_samples, data_args.block_size))
    trainer.train()
    trainer.save_model()
    Path(training_args.output_dir, "post_training_ran").write_text("yes")


if __name__ == "__main__":
    main()
