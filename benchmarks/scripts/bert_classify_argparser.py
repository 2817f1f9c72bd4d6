"""A Hugging Face sentence-classification script as people write it: three dataclasses parsed by
HfArgumentParser (the model's size, the data, TrainingArguments), a tiny BERT built from a
config, variable-length generated "sentences" padded by its own collator, an eval set, then
evaluation, saving and a results file after Trainer.train()."""

import json
import os
import sys
from dataclasses import dataclass, field

import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
    set_seed,
)


@dataclass
class ModelArguments:
    hidden_size: int = field(default=64, metadata={"help": "BERT hidden size"})
    num_layers: int = field(default=2, metadata={"help": "encoder layers"})
    num_labels: int = field(default=3)


@dataclass
class DataArguments:
    train_size: int = field(default=256)
    eval_size: int = field(default=64)
    max_length: int = field(default=48)
    vocab_size: int = field(default=500)


class Sentences(torch.utils.data.Dataset):
    """Sentences of 8..max_length tokens; the label is which third of the vocabulary the first
    token falls in (learnable, so the loss goes down)."""

    def __init__(self, size: int, max_length: int, vocab_size: int, num_labels: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(8, max_length + 1, (size,), generator=g)
        self.rows = [torch.randint(1, vocab_size, (int(n),), generator=g) for n in lengths]
        self.labels = [int(r[0]) * num_labels // vocab_size for r in self.rows]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.rows[i], "labels": self.labels[i]}


def pad_collator(features: list[dict]) -> dict:
    longest = max(len(f["input_ids"]) for f in features)
    ids = torch.zeros(len(features), longest, dtype=torch.long)
    mask = torch.zeros(len(features), longest, dtype=torch.long)
    for row, f in enumerate(features):
        ids[row, : len(f["input_ids"])] = f["input_ids"]
        mask[row, : len(f["input_ids"])] = 1
    labels = torch.tensor([f["labels"] for f in features])
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def main() -> None:
    parser = HfArgumentParser((ModelArguments, DataArguments, TrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    set_seed(training_args.seed)

    config = BertConfig(
        vocab_size=data_args.vocab_size,
        hidden_size=model_args.hidden_size,
        num_hidden_layers=model_args.num_layers,
        num_attention_heads=4,
        intermediate_size=model_args.hidden_size * 4,
        max_position_embeddings=data_args.max_length,
        num_labels=model_args.num_labels,
    )
    model = BertForSequenceClassification(config)
    train = Sentences(data_args.train_size, data_args.max_length, data_args.vocab_size,
                      model_args.num_labels, seed=1)
    evaluation = Sentences(data_args.eval_size, data_args.max_length, data_args.vocab_size,
                           model_args.num_labels, seed=2)

    trainer = Trainer(model=model, args=training_args, train_dataset=train,
                      eval_dataset=evaluation, data_collator=pad_collator)
    result = trainer.train()
    metrics = trainer.evaluate()
    trainer.save_model()
    with open(os.path.join(training_args.output_dir, "results.json"), "w") as out:
        json.dump({"train": result.metrics, "eval": metrics}, out)
    print("finished", sys.argv[1:], file=sys.stderr)


if __name__ == "__main__":
    main()
