"""LoRA fine-tuning of a small causal LM with PEFT and the Hugging Face Trainer.

The base model is built from its config (no weights downloaded); the data are synthetic token
sequences. Usage:

    python train_lora.py --output_dir out --per_device_train_batch_size 8 \
        --gradient_accumulation_steps 2 --max_steps 200
"""

from dataclasses import dataclass, field

import torch
from peft import LoraConfig, get_peft_model
from torch.utils.data import Dataset
from transformers import (
    HfArgumentParser,
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainingArguments,
)


@dataclass
class ModelArguments:
    hidden_size: int = field(default=256)
    num_layers: int = field(default=4)
    seq_len: int = field(default=128)
    lora_r: int = field(default=8)
    num_samples: int = field(default=4096)


class TokenDataset(Dataset):
    def __init__(self, n: int, seq_len: int, vocab: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        base = torch.randint(0, vocab, (64, seq_len), generator=g)
        self.ids = base[torch.randint(0, 64, (n,), generator=g)]

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    model_args, training_args = HfArgumentParser(
        (ModelArguments, TrainingArguments)).parse_args_into_dataclasses()
    config = LlamaConfig(vocab_size=8000, hidden_size=model_args.hidden_size,
                         intermediate_size=4 * model_args.hidden_size,
                         num_hidden_layers=model_args.num_layers, num_attention_heads=4,
                         num_key_value_heads=4, max_position_embeddings=model_args.seq_len)
    torch.manual_seed(training_args.seed)
    model = LlamaForCausalLM(config)
    lora = LoraConfig(r=model_args.lora_r, lora_alpha=16, lora_dropout=0.05,
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                      task_type="CAUSAL_LM")
    model = get_peft_model(model, lora)
    model.print_trainable_parameters()
    data = TokenDataset(model_args.num_samples, model_args.seq_len, config.vocab_size)
    trainer = Trainer(model=model, args=training_args, train_dataset=data)
    trainer.train()


if __name__ == "__main__":
    main()
