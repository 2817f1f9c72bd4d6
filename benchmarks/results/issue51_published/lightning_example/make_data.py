"""Make the local text file that Lightning's examples/pytorch/basics/transformer.py reads.

transformer.py builds `lightning.pytorch.demos.WikiText2()` with its defaults:
data_dir=Path("./data"), download=True.  WikiText2.download() returns early when
./data/wikitext-2.txt already exists, so placing that file in the working directory means
nothing is downloaded (the URL it would otherwise fetch is pytorch/examples' wikitext-2
train.txt).  This script writes a generated stand-in with the same shape: one paragraph
per line, words separated by spaces, tokenized by the demo as line.split() + ["<eos>"].

transformer.py does random_split(dataset, [n - 4000, 2000, 2000]) with
n = tokens // 35 - 1, so the file must hold well over 4000 * 35 = 140k tokens; this one
has about 210k (about 6k blocks -> ~2k train / 2k val / 2k test samples,
100 train + 100 val batches of 20 per epoch).

Deterministic (seed 0). Run from this folder:  /work/venv-214/bin/python make_data.py
"""

import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET_TOKENS = 210_000

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
    "the king",
    "a soldier",
    "the company",
    "the river",
    "the council",
    "a writer",
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
    "describes",
    "defends",
    "releases",
    "records",
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
    "northern",
    "famous",
    "second",
    "final",
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
    "album",
    "song",
    "castle",
    "army",
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
    "in 1998",
    "during the war",
    "in the north",
    "at the end of the season",
]
CONNECT = ["and then", "because", "but", "so", "while", "although", ", and"]


def sentence(rng):
    s = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} the {rng.choice(ADJS)} {rng.choice(OBJECTS)}"
    if rng.random() < 0.5:
        s += f" {rng.choice(PLACES)}"
    if rng.random() < 0.4:
        s += f" {rng.choice(CONNECT)} {rng.choice(SUBJECTS)} {rng.choice(VERBS)}"
        s += f" {rng.randint(2, 99)} {rng.choice(OBJECTS)}s"
    return s + " ."


def main():
    rng = random.Random(0)
    out_dir = os.path.join(HERE, "data")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "wikitext-2.txt")
    n_tokens = 0
    lines = []
    while n_tokens < TARGET_TOKENS:
        if rng.random() < 0.1:
            line = f" = {rng.choice(ADJS).title()} {rng.choice(OBJECTS).title()} = "
        else:
            line = " " + " ".join(sentence(rng) for _ in range(rng.randint(2, 8))) + " "
        lines.append(line)
        n_tokens += len(line.split()) + 1  # + <eos>
    with open(path, "w", encoding="utf8") as f:
        f.write("\n".join(lines) + "\n")
    print(
        f"wrote {path}: {len(lines)} lines, ~{n_tokens} tokens, ~{n_tokens // 35 - 1} blocks of 35"
    )


if __name__ == "__main__":
    main()
