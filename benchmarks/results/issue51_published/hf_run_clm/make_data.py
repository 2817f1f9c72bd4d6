"""Make local data + tokenizer for Hugging Face examples/pytorch/language-modeling/run_clm*.py.

Writes, next to this file:
  train.txt      4000 lines of generated English-like text (deterministic, seed 0)
  valid.txt       400 lines, same generator, different seed
  tokenizer/     a byte-level BPE (vocab_size <= 1024) trained on train.txt with the
                 `tokenizers` library, wrapped as the GPT-2 tokenizer class of the
                 installed transformers (GPT2TokenizerFast if it exists, else GPT2Tokenizer,
                 which in transformers 5.x *is* the tokenizers-backed class) and saved with
                 save_pretrained(); model_max_length=128, <|endoftext|> = bos/eos/unk (id 0).
  gpt2_config/   (only with --config) a tiny GPT2Config saved with save_pretrained(),
                 for scripts without --config_overrides (run_clm_no_trainer.py).

Nothing is downloaded. Run as a copy in the script's folder: /work/venv-214/bin/python
make_data.py (run_clm.py), make_data.py --config (run_clm_no_trainer.py)
"""

import os
import random
import sys
import tempfile

# run_clm.py uses --model_type gpt2 --config_overrides; run_clm_no_trainer.py needs a config
MAKE_CONFIG = "--config" in sys.argv[1:]

HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB_SIZE = 1024
EOT = "<|endoftext|>"

SUBJECTS = [
    "the cat",
    "a dog",
    "the old man",
    "my sister",
    "the robot",
    "a small bird",
    "the teacher",
    "our neighbour",
    "the farmer",
    "a young girl",
    "the pilot",
    "the baker",
    "every student",
    "the captain",
    "a tired horse",
    "the little fox",
]
VERBS = [
    "sees",
    "likes",
    "builds",
    "finds",
    "carries",
    "paints",
    "watches",
    "follows",
    "cleans",
    "opens",
    "reads",
    "sells",
    "remembers",
    "draws",
    "visits",
    "fixes",
]
ADJS = [
    "red",
    "big",
    "quiet",
    "broken",
    "shiny",
    "heavy",
    "green",
    "strange",
    "tiny",
    "warm",
    "wooden",
    "bright",
    "empty",
    "ancient",
    "soft",
    "blue",
]
OBJECTS = [
    "house",
    "box",
    "river",
    "book",
    "garden",
    "tree",
    "window",
    "boat",
    "letter",
    "bridge",
    "road",
    "lamp",
    "basket",
    "door",
    "hill",
    "clock",
]
PLACES = [
    "in the morning",
    "after lunch",
    "near the station",
    "by the sea",
    "at night",
    "in the forest",
    "before the storm",
    "on sunday",
    "under the bridge",
    "in the city",
]
CONNECT = ["and then", "because", "but", "so", "while", "although"]


def sentence(rng):
    s = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} the {rng.choice(ADJS)} {rng.choice(OBJECTS)}"
    if rng.random() < 0.5:
        s += f" {rng.choice(PLACES)}"
    if rng.random() < 0.4:
        s += f" {rng.choice(CONNECT)} {rng.choice(SUBJECTS)} {rng.choice(VERBS)}"
        s += f" {rng.randint(2, 99)} {rng.choice(OBJECTS)}s"
    return s[0].upper() + s[1:] + "."


def make_lines(n, seed):
    rng = random.Random(seed)
    return [" ".join(sentence(rng) for _ in range(rng.randint(1, 4))) for _ in range(n)]


def main():
    train = make_lines(4000, seed=0)
    valid = make_lines(400, seed=1)
    for name, lines in (("train.txt", train), ("valid.txt", valid)):
        with open(os.path.join(HERE, name), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")

    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(train, vocab_size=VOCAB_SIZE, min_frequency=2, special_tokens=[EOT])
    try:
        from transformers import GPT2TokenizerFast as TokCls
    except ImportError:  # transformers 5.x: GPT2Tokenizer is the tokenizers-backed class
        from transformers import GPT2Tokenizer as TokCls
    with tempfile.TemporaryDirectory() as tmp:
        bpe.save_model(tmp)  # vocab.json + merges.txt (GPT-2 format)
        tok = TokCls.from_pretrained(
            tmp, bos_token=EOT, eos_token=EOT, unk_token=EOT, model_max_length=128
        )
    out = os.path.join(HERE, "tokenizer")
    tok.save_pretrained(out)
    eot_id = tok.convert_tokens_to_ids(EOT)
    print(
        f"tokenizer class {type(tok).__name__}, len={len(tok)}, {EOT} id={eot_id}, saved to {out}"
    )

    if MAKE_CONFIG:
        from transformers import GPT2Config

        cfg = GPT2Config(
            n_layer=2,
            n_head=2,
            n_embd=64,
            n_positions=128,
            vocab_size=VOCAB_SIZE,
            bos_token_id=eot_id,
            eos_token_id=eot_id,
        )
        cfg.save_pretrained(os.path.join(HERE, "gpt2_config"))
        print("saved gpt2_config/")

    ntok = sum(len(tok(line)["input_ids"]) for line in train)
    print(f"train.txt: {len(train)} lines, {ntok} tokens (~{ntok // 64} blocks of 64)")


if __name__ == "__main__":
    main()
