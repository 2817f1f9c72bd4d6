"""Supervised fine-tuning with TRL's SFTTrainer, as its quickstart writes it, on a tiny Llama
built from a config and a word-level tokenizer built in code (nothing downloaded)."""
import argparse

from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--batch", type=int, default=4)
options = parser.parse_args()

words = [f"w{i}" for i in range(200)]
vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{w: i + 4 for i, w in enumerate(words)}}
raw = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
raw.pre_tokenizer = pre_tokenizers.Whitespace()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", bos_token="<s>",
                                    eos_token="</s>", unk_token="<unk>")

texts = [" ".join(words[(i * 7 + j * 3) % 200] for j in range(40)) for i in range(512)]
dataset = Dataset.from_dict({"text": texts})

model = LlamaForCausalLM(LlamaConfig(vocab_size=len(vocab), hidden_size=64,
                                     intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2,
                                     max_position_embeddings=64, pad_token_id=0))
config = SFTConfig(output_dir=options.out, per_device_train_batch_size=options.batch,
                   gradient_accumulation_steps=4, num_train_epochs=3, max_length=48,
                   learning_rate=3e-4, logging_steps=10, save_steps=50, report_to="none",
                   use_cpu=True)
trainer = SFTTrainer(model=model, args=config, train_dataset=dataset,
                     processing_class=tokenizer)
trainer.train()
trainer.save_model(options.out)
