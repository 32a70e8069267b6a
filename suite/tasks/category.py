"""An embedded task with many valid answers and a vocabulary of thousands of words (hypothesis H3).

H3 ("a fat low-probability tail"): the per-token training-inference mismatch grows with 1 - p, so
it matters where sampled tokens are often unlikely. On the arith tasks they are not: a 17-token
alphabet and one correct trace per prompt leave < 1% of sampled tokens below p = 0.5, and fewer as
entropy falls. The published failures sample from a 150k vocabulary at temperature 1, with entropy
that stays high at "forking" tokens. This task has both, at a size the small tier trains on 2 cores:

* ``classes`` x ``class_size`` words (the numbers 0 .. n-1, one token each through the word-level
  tokenizer of suite/rl/policy.py), split into ``classes`` categories by a seeded shuffle; every
  response position is a softmax over all of them and the labels (2,048 + 128 + 1 + 3 specials
  shipped);
* the prompt is ``labels`` category labels (``c0`` .. ``c<classes-1>``) and '='; the response is one
  word of each label's category, in order, then EOS. Any member will do, so even a perfect policy
  forks at every word: probability 1 / class_size each (1/16 shipped), entropy log(class_size).

What did not learn (measured with the small tier's policy and warm-start recipe, 1,500 steps on one
core): "3 numbers below 2,048 that sum to N" (the forced last number is an exact subtraction over
thousands of tokens; sampled accuracy 0.01, loss 5.0 -> 4.7) and "any 4 distinct words of the 8 in
the prompt" (copying with exclusion over 2,048 tokens; accuracy 0.00, loss 6.6 -> 5.5). A label ->
category lookup at a fixed offset is what a 2-layer policy learns within the warm-start budget (~950
steps). 32 categories of 64 words and 8 labels learned too, but RL then moved slowly (0.79 -> 0.83
in 100 fp32 steps at lr 1e-4); 128 x 16 and 4 labels is the shipped, cheaper size (regime ``tail``
in suite/rl/schema.py sets the lr and steps fp32 needs to pass).

The supervised warm start sees a fresh valid answer each time it draws an item (``sample_trace``,
uniform over the category's words, from the builder's seeded stream), so the base policy learns
their spread rather than one answer per prompt; ``trace`` is one fixed valid answer (each category's
smallest word), the interface's deterministic reference.
"""

from __future__ import annotations

import random

from suite.tasks.item import Item

SEP = "="  # ends the prompt: the response starts after it


class CategoryTask:
    """One word of each prompt label's category (``tasks/category.yaml``)."""

    def __init__(self, spec: dict):
        self.spec = spec
        self.name = str(spec["name"])
        self.version = int(spec["version"])
        self.classes, self.class_size = int(spec["classes"]), int(spec["class_size"])
        self.labels = int(spec["labels"])
        self._test_n = int(spec["n_test"])
        n = self._test_n + int(spec["n_train_max"])
        if n > self.classes**self.labels // 2:
            raise ValueError(f"task {self.name}: cannot draw {n} distinct prompts of {self.labels} "
                             "labels")
        rng = random.Random(int(spec["seed"]))
        words = list(range(self.classes * self.class_size))
        rng.shuffle(words)  # arbitrary categories: nothing about a word's number tells its category
        self.members = [sorted(words[c * self.class_size:(c + 1) * self.class_size])
                        for c in range(self.classes)]
        self._category = {str(w): c for c, ws in enumerate(self.members) for w in ws}
        # The tokenizer's words (suite/rl/policy.py build_word_tokenizer): the numbers, the labels,
        # the separator.
        self.vocab = [str(w) for w in range(len(words))] + [f"c{c}"
                                                            for c in range(self.classes)] + [SEP]
        self._pool = self._draw(rng, n)

    def _draw(self, rng: random.Random, n: int) -> list[tuple[int, ...]]:
        seen, out = set(), []
        while len(out) < n:
            labels = tuple(rng.randrange(self.classes) for _ in range(self.labels))
            if labels not in seen:
                seen.add(labels)
                out.append(labels)
        return out

    @property
    def context(self) -> int:
        """Positions a prompt and its response budget take: BOS, the labels and '=', and
        ``sampling.max_new_tokens`` (category.yaml). Sizes the policy (policy.max_positions)."""
        return 1 + self.labels + 1 + int(self.spec["sampling"]["max_new_tokens"])

    def _item(self, labels: tuple[int, ...]) -> Item:
        text = " ".join(f"c{c}" for c in labels)
        return Item(id=text.replace(" ", "-"), prompt=f"{text} {SEP}",
                    answer=" ".join(str(self.members[c][0]) for c in labels))

    def split(self, name: str, n: int | None = None) -> list[Item]:
        """The first ``n`` items of split ``train`` or ``test`` (deterministic, disjoint)."""
        if name == "test":
            pool = self._pool[: self._test_n]
        elif name == "train":
            pool = self._pool[self._test_n :]
        else:
            raise ValueError(f"task {self.name}: unknown split '{name}' (train, test)")
        if n is not None and n > len(pool):
            raise ValueError(f"task {self.name}: split '{name}' has {len(pool)} items, {n} "
                             "requested")
        return [self._item(p) for p in pool[:n]]

    @staticmethod
    def _labels(item: Item) -> list[int]:
        return [int(t[1:]) for t in item.prompt.split()[:-1]]  # "c12" -> 12, the separator dropped

    def trace(self, item: Item) -> str:
        """One fixed valid answer: the smallest word of each label's category."""
        return " ".join(str(self.members[c][0]) for c in self._labels(item))

    def sample_trace(self, item: Item, rng: random.Random) -> str:
        """A valid answer drawn uniformly with ``rng`` (any word of each category): what the warm
        start trains on (suite/rl/policy.py), so the base policy spreads its mass over the
        answers."""
        return " ".join(str(rng.choice(self.members[c])) for c in self._labels(item))

    def reward(self, item: Item, response: str, truncated: bool) -> float:
        """1.0 iff the response finished (EOS) and is one word of each label's category, in
        order."""
        if truncated:
            return 0.0
        words, labels = response.split(), self._labels(item)
        ok = len(words) == len(labels) and all(self._category.get(w) == c
                                               for w, c in zip(words, labels))
        return 1.0 if ok else 0.0
