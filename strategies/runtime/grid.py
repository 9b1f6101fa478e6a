"""The ServerApp's grid with prompt replies.

Flower's legacy server loop (``start_grid``) reaches each node through
``Grid.send_and_receive``, whose deployment implementation sleeps a fixed 3 seconds between
polls for the reply.  :class:`PromptGrid` wraps the grid Flower hands the ServerApp and polls
after 20 ms, backing off by doubling to 0.5 s; every other call goes to the wrapped grid.
The messages, their order and their content are unchanged, so are the numbers.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

if TYPE_CHECKING:
    from flwr.supercore.run import Run

#: First wait between polls for replies, and the longest (seconds).
FIRST_POLL = 0.02
LONGEST_POLL = 0.5


class PromptGrid(Grid):
    """``grid`` with a backing-off reply poll in :meth:`send_and_receive`."""

    def __init__(self, grid: Grid, first: float = FIRST_POLL, longest: float = LONGEST_POLL):
        self.grid = grid
        self.first = float(first)
        self.longest = float(longest)

    def set_run(self, run: Run) -> None:
        self.grid.set_run(run)

    @property
    def run(self) -> Run:
        return self.grid.run

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        return self.grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        return self.grid.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.grid.pull_messages(message_ids)

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        """Push ``messages`` and pull their replies until all are in or ``timeout``
        seconds have passed (``None``: no limit), as Flower's does, polling sooner."""
        waiting = set(self.push_messages(messages))
        end = None if timeout is None else time.monotonic() + timeout
        replies: list[Message] = []
        pause = self.first
        while end is None or time.monotonic() < end:
            got = list(self.pull_messages(waiting))
            replies.extend(got)
            waiting.difference_update(m.metadata.reply_to_message_id for m in got)
            if not waiting:
                break
            time.sleep(pause if end is None else max(0.0, min(pause, end - time.monotonic())))
            pause = min(2 * pause, self.longest)
        return replies
