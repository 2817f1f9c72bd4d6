"""A Hugging Face sequence-to-sequence script with its settings written in the code: a tiny T5
built from a config, a generated copy-and-reverse task, Seq2SeqTrainingArguments and a
Seq2SeqTrainer (a Trainer subclass) configured in main(); only where to write comes from the
command line. After training it saves the model and writes a sample generation."""

import argparse
from pathlib import Path

import torch
from transformers import (
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    T5Config,
    T5ForConditionalGeneration,
)

VOCAB = 200


def reversal_task(size: int, length: int, seed: int) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    source = torch.randint(3, VOCAB, (size, length), generator=g)
    return [{"input_ids": s, "attention_mask": torch.ones_like(s), "labels": s.flip(0)}
            for s in source]


def main() -> None:
    parser = argparse.ArgumentParser(description="train a tiny T5 to reverse sequences")
    parser.add_argument("--save-to", required=True, help="where checkpoints and the model go")
    options = parser.parse_args()

    model = T5ForConditionalGeneration(T5Config(
        vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2,
        num_heads=4, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1))
    args = Seq2SeqTrainingArguments(
        output_dir=options.save_to,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=4,
        learning_rate=3e-4,
        warmup_steps=10,
        lr_scheduler_type="cosine",
        num_train_epochs=50,
        logging_steps=5,
        save_strategy="epoch",
        save_total_limit=2,
        eval_strategy="epoch",
        predict_with_generate=False,
        seed=7,
    )
    trainer = Seq2SeqTrainer(model=model, args=args,
                             train_dataset=reversal_task(512, 12, seed=1),
                             eval_dataset=reversal_task(64, 12, seed=2))
    trainer.train()
    trainer.save_model()
    sample = reversal_task(1, 12, seed=3)[0]["input_ids"].unsqueeze(0)
    out = model.generate(input_ids=sample, max_new_tokens=13)
    Path(options.save_to, "sample.txt").write_text(f"{sample.tolist()} -> {out.tolist()}\n")


if __name__ == "__main__":
    main()
