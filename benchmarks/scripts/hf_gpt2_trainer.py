"""The model of `models/hf_gpt2.py` (transformers' GPT-2 from a config, padded synthetic
sequences, its BatchEncoding collator) trained the way a Hugging Face user trains it: sizes and
TrainingArguments parsed by HfArgumentParser, `Trainer.train()`, then the run's metrics as the
Trainer reports them (`train_samples_per_second` among them) logged and printed.

    python benchmarks/scripts/hf_gpt2_trainer.py --output_dir /tmp/gpt2 --n_layer 2 \\
        --n_embd 64 --block_size 64 --vocab_size 512 --per_device_train_batch_size 8 \\
        --gradient_accumulation_steps 4 --max_steps 200 --report_to none
"""

import sys
from dataclasses import dataclass, field
from pathlib import Path

from transformers import HfArgumentParser, Trainer, TrainingArguments

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models"))
from hf_gpt2 import build_dataset, build_model, collate_fn  # noqa: E402


@dataclass
class ModelArguments:
    n_layer: int = field(default=12, metadata={"help": "transformer blocks"})
    n_embd: int = field(default=768, metadata={"help": "hidden size"})
    n_head: int = field(default=12, metadata={"help": "attention heads"})
    block_size: int = field(default=1024, metadata={"help": "tokens per sequence"})
    vocab_size: int = field(default=50257)
    num_samples: int = field(default=100_000, metadata={"help": "sequences in the dataset"})


def main() -> None:
    model_args, training_args = HfArgumentParser(
        (ModelArguments, TrainingArguments)).parse_args_into_dataclasses()
    model = build_model(n_layer=model_args.n_layer, n_embd=model_args.n_embd,
                        n_head=model_args.n_head, block_size=model_args.block_size,
                        vocab_size=model_args.vocab_size)
    dataset = build_dataset(block_size=model_args.block_size,
                            vocab_size=model_args.vocab_size,
                            num_samples=model_args.num_samples)
    trainer = Trainer(model=model, args=training_args, train_dataset=dataset,
                      data_collator=collate_fn)
    metrics = trainer.train().metrics
    trainer.log_metrics("train", metrics)


if __name__ == "__main__":
    main()
