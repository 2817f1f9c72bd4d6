"""A Trainer script on a `datasets.Dataset`: token sequences of 8 to 32 and one of 600, with a
text column the Trainer drops, padded by its own collator. A new user's check of the answer's
checks on a library no test uses (`datasets` is not installed in CI)."""

import datasets
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

g = torch.Generator().manual_seed(0)
lengths = torch.randint(8, 33, (2000,), generator=g).tolist()
lengths[777] = 600
rows = {"input_ids": [torch.randint(1, 128, (n,), generator=g).tolist() for n in lengths],
        "text": ["x"] * 2000}
ds = datasets.Dataset.from_dict(rows)
ds = ds.map(lambda r: {"labels": r["input_ids"]})


class Pad:
    def __call__(self, feats):
        n = max(len(f["input_ids"]) for f in feats)
        ids = torch.zeros(len(feats), n, dtype=torch.long)
        for i, f in enumerate(feats):
            ids[i, :len(f["input_ids"])] = torch.tensor(f["input_ids"])
        return {"input_ids": ids, "labels": ids.masked_fill(ids == 0, -100)}


model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128,
                                   n_positions=1024))
args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, max_steps=100,
                         report_to="none")
Trainer(model=model, args=args, train_dataset=ds, data_collator=Pad()).train()
