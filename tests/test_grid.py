"""The ServerApp's grid wrapper polls for replies promptly and otherwise behaves as Flower's
``Grid.send_and_receive``: every reply returned once, the timeout respected.  (End to end,
through a real SuperLink and SuperNodes, in tests/test_deployment.py.)"""

from __future__ import annotations

import time
from types import SimpleNamespace

from flwr.serverapp import Grid

from strategies.runtime.grid import PromptGrid


class _Replies(Grid):
    """A grid whose node answers message ``k`` at the ``after[k]``-th pull (replies carry
    only what the wrapper reads: ``metadata.reply_to_message_id``)."""

    def __init__(self, after):
        self.after = list(after)
        self.pulls = 0
        self.pull_times = []

    def set_run(self, run):
        pass

    @property
    def run(self):
        return None

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        raise NotImplementedError

    def get_node_ids(self):
        return [1]

    def push_messages(self, messages):
        return [str(k) for k, _ in enumerate(messages)]

    def send_and_receive(self, messages, *, timeout=None):
        raise AssertionError("the wrapper polls itself")

    def pull_messages(self, message_ids):
        self.pulls += 1
        self.pull_times.append(time.monotonic())
        out = []
        for mid in sorted(message_ids):
            if self.after[int(mid)] <= self.pulls:
                out.append(SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=mid)))
        return out


def _messages(n):
    return [object() for _ in range(n)]  # only their number matters to the fake grid


def test_every_reply_once_and_soon():
    inner = _Replies(after=[1, 3, 4])
    t0 = time.monotonic()
    replies = list(PromptGrid(inner).send_and_receive(_messages(3)))
    elapsed = time.monotonic() - t0
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["0", "1", "2"]
    assert inner.pulls == 4
    # waits of 20, 40 and 80 ms between the four pulls (Flower's own: 3 s each)
    assert elapsed < 1.0
    gaps = [b - a for a, b in zip(inner.pull_times, inner.pull_times[1:], strict=False)]
    assert all(g >= 0.015 for g in gaps)


def test_timeout_returns_what_came():
    inner = _Replies(after=[1, 10**9])
    t0 = time.monotonic()
    replies = list(PromptGrid(inner, longest=0.05).send_and_receive(_messages(2), timeout=0.4))
    elapsed = time.monotonic() - t0
    assert [r.metadata.reply_to_message_id for r in replies] == ["0"]
    assert 0.35 <= elapsed < 1.0
