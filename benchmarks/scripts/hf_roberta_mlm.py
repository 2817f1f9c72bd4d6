"""Never run by autotune before issue 39's bar: masked-language-model pretraining of a small
RoBERTa from a config, the way the Hugging Face docs teach it: random token documents (no
download), transformers' `DataCollatorForLanguageModeling` masking 15% of tokens per batch,
`TrainingArguments` written in code from the script's own argparse flags, `Trainer.train()`.

    python benchmarks/scripts/hf_roberta_mlm.py --out /tmp/mlm --batch 16 --accum 1
"""

import argparse

import torch
from tokenizers import Tokenizer, models
from transformers import (
    DataCollatorForLanguageModeling,
    PreTrainedTokenizerFast,
    RobertaConfig,
    RobertaForMaskedLM,
    Trainer,
    TrainingArguments,
)

parser = argparse.ArgumentParser()
parser.add_argument("--out", default="mlm-out")
parser.add_argument("--batch", type=int, default=16)
parser.add_argument("--accum", type=int, default=1)
parser.add_argument("--layers", type=int, default=4)
parser.add_argument("--hidden", type=int, default=256)
parser.add_argument("--seq", type=int, default=128)
parser.add_argument("--docs", type=int, default=20_000)
parser.add_argument("--steps", type=int, default=5_000)
args = parser.parse_args()

VOCAB = 4096
specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
vocab = {tok: i for i, tok in enumerate(specials + [f"t{i}" for i in range(VOCAB - 5)])}
tokenizer = PreTrainedTokenizerFast(
    tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")),
    bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
    mask_token="<mask>")


class RandomDocs(torch.utils.data.Dataset):
    def __len__(self):
        return args.docs

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        length = int(torch.randint(args.seq // 4, args.seq + 1, (1,), generator=g))
        ids = torch.randint(5, VOCAB, (length,), generator=g)
        return {"input_ids": torch.cat([torch.tensor([0]), ids, torch.tensor([2])])}


config = RobertaConfig(vocab_size=VOCAB, hidden_size=args.hidden,
                       num_hidden_layers=args.layers, num_attention_heads=4,
                       intermediate_size=4 * args.hidden, max_position_embeddings=args.seq + 8,
                       pad_token_id=1, bos_token_id=0, eos_token_id=2)
model = RobertaForMaskedLM(config)
training = TrainingArguments(output_dir=args.out, per_device_train_batch_size=args.batch,
                             gradient_accumulation_steps=args.accum, max_steps=args.steps,
                             learning_rate=5e-4, warmup_steps=100, logging_steps=50,
                             save_steps=500, report_to="none")
trainer = Trainer(model=model, args=training, train_dataset=RandomDocs(),
                  data_collator=DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15))
trainer.train()
trainer.save_model(args.out)
