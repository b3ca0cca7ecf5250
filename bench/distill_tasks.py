"""bench/distill.py's tasks: train and held-out problems, each with its answer regex and
the warm-up's two references (the answer, or a reply of the same shape that is not taught
to be right).

"repeat": "Repeat this number: 47" (`digits`), correct when the completion names the
number. "classify": a plain-text few-shot list ("frog animal\\nred colour\\n...\\ncat"),
correct when the completion's first word is the query word's class. Its held-out prompts
are new few-shot contexts around words the training prompts also ask about (a tiny student
starts with no knowledge of words, so a word it never saw has no class it could know);
the query word is never among its own prompt's examples.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

REPEAT_PROMPT = "Repeat this number: {number}"
REPEAT_HELD_OUT = 16

WORDS = [
    "apple",
    "river",
    "stone",
    "cloud",
    "table",
    "green",
    "music",
    "paper",
    "garden",
    "window",
    "bottle",
    "planet",
]

CLASSES = {
    "animal": "cat dog horse cow lion tiger rabbit sheep mouse bear wolf fox goat duck frog monkey",
    "colour": "red blue green yellow purple pink black white brown grey violet indigo silver"
    " orange navy beige",
}
ANSWER_REGEX = {"animal": r"(?is)animals?\b.*", "colour": r"(?is)colou?rs?\b.*"}
SHOTS_PER_CLASS = 3
CONTEXTS_PER_WORD = 4


@dataclass(frozen=True)
class Problem:
    """One prompt: its answer regex, the right reply and a random reply of its shape."""

    prompt: str
    answer: str
    reference: str
    shape: str


def problems(task: str, digits: int) -> tuple[list[Problem], list[Problem]]:
    """Train and held-out problems, fixed by seed."""
    return classify_problems() if task == "classify" else repeat_problems(digits)


def repeat_problems(digits: int) -> tuple[list[Problem], list[Problem]]:
    """A fixed shuffle of the numbers, the first REPEAT_HELD_OUT held out. One digit: the
    digit after one of WORDS, so prompts differ beyond the ten digits."""
    if digits == 1:
        pairs = [(w, d) for w in WORDS for d in range(10)]
        every = [(f"{w}: {REPEAT_PROMPT.format(number=d)}", str(d)) for w, d in pairs]
    else:
        span = range(10 ** (digits - 1), 10**digits)
        every = [(REPEAT_PROMPT.format(number=n), str(n)) for n in span]
    random.Random(0).shuffle(every)
    rng = random.Random(1)
    train, held_out = every[REPEAT_HELD_OUT:], every[:REPEAT_HELD_OUT]

    def problem(prompt: str, number: str) -> Problem:
        shape = "".join(rng.choice("0123456789") for _ in number)
        return Problem(prompt, rf"(?s).*\b{number}\b.*", reference=number, shape=shape)

    return [problem(*t) for t in train], [problem(*h) for h in held_out]


def classify_problems() -> tuple[list[Problem], list[Problem]]:
    """CONTEXTS_PER_WORD prompts per word, each with SHOTS_PER_CLASS labelled examples of
    every class drawn from the other words; each word's first context is held out."""
    labelled = [(word, name) for name, words in CLASSES.items() for word in words.split()]
    rng = random.Random(0)
    train, held_out = [], []
    for word, name in labelled:
        others = [item for item in labelled if item[0] != word]
        for context in range(CONTEXTS_PER_WORD):
            shots = [
                shot
                for cls in CLASSES
                for shot in rng.sample([o for o in others if o[1] == cls], SHOTS_PER_CLASS)
            ]
            rng.shuffle(shots)
            prompt = "".join(f"{w} {c}\n" for w, c in shots) + word
            problem = Problem(
                prompt=prompt,
                answer=ANSWER_REGEX[name],
                reference=f" {name}",
                shape=f" {rng.choice(list(CLASSES))}",
            )
            (held_out if context == 0 else train).append(problem)
    return train, held_out
