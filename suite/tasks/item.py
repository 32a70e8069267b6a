"""One prompt with its ground truth: what every task's ``split`` returns (suite/tasks/registry.py
for the embedded tasks, suite/tasks/hub_tasks.py for the dataset ones), in a module of its own so
both import it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Item:
    """One prompt with its ground truth.

    ``prompt`` is the user text. ``messages`` holds the chat messages as ``(role, content)``
    pairs for the dataset tasks, whose prompt the model's chat template renders; it is empty for
    the embedded tasks, whose prompt is plain text fed to the tokenizer as is.
    """

    id: str
    prompt: str
    answer: str
    messages: tuple = ()
