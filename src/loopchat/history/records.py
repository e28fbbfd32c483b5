"""What the conversation store holds and hands out: a conversation's line of the list, its
message tree (nodes, a reply's with its events), the store's one error, and where the
file lives by default. Plain data: no SQLite here (store.py writes and reads it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

#: Finish.error of the Finish `load` makes up for a reply marked cut.
CUT = "cut short: loopchat stopped before this reply finished (the steps written until then are kept)"


class StoreError(Exception):
    """One line that says what to do (e.g. "the history file ~/.local/share/loopchat/history.sqlite3 is
    damaged (file is not a database): move it away to start a new one; loopchat runs with history off")."""


def default_store_path() -> Path:
    from loopchat.paths import data_dir

    return data_dir() / "history.sqlite3"


@dataclass(frozen=True)
class ConversationSummary:
    id: int
    title: str
    model_name: str
    created: float  # Unix seconds
    updated: float
    replies: int  # assistant replies stored (all branches)
    cut: int  # replies marked cut (the app was killed mid-reply)


@dataclass
class StoredNode:
    """One message of the tree."""

    id: int
    parent_id: int | None
    role: str  # "system" | "user" | "assistant" | "document"
    content: str  # the message text (for a reply: Finish.text, or the text so far if cut)
    created: float
    mode: str | None = None  # a reply's delivery: "stream" | "blocking"
    #: a reply's events in order: Start, [ContextTrimmed], Prefill, Step..., Finish. A cut
    #: reply ends with a made-up Finish (reason ERROR, error CUT); a reply another process
    #: is still writing ("generating") has no Finish yet.
    events: list = field(default_factory=list)
    status: str = "complete"  # "complete" | "cut" | "generating"


@dataclass
class StoredConversation:
    summary: ConversationSummary
    model_path: str
    model_size: int
    system_prompt: str | None
    nodes: list[StoredNode]  # every node, parents before children

    def node(self, node_id: int) -> StoredNode:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise KeyError(node_id)

    def children(self, node_id: int | None) -> list[StoredNode]:
        return [n for n in self.nodes if n.parent_id == node_id]

    def latest_leaf(self, under: int | None = None) -> int | None:
        """The most recent leaf (the last node written that has no child) of the whole
        tree, or of the nodes below node `under` (None: no node, or none below it)."""
        parents = {n.parent_id for n in self.nodes}
        by_id = {n.id: n for n in self.nodes}

        def below(node_id: int) -> bool:
            at = by_id[node_id].parent_id
            while at is not None and at != under:
                at = by_id[at].parent_id
            return at == under

        leaves = (n.id for n in self.nodes if n.id not in parents)
        return max((leaf for leaf in leaves if under is None or below(leaf)), default=None)

    def path(self, leaf_id: int | None = None) -> list[StoredNode]:
        """Root -> leaf; by default the most recent leaf (the last node written that has no child)."""
        if leaf_id is None:
            leaf_id = self.latest_leaf()
            if leaf_id is None:
                return []
        by_id = {n.id: n for n in self.nodes}
        out: list[StoredNode] = []
        at: int | None = leaf_id
        while at is not None:
            node = by_id[at]
            out.append(node)
            at = node.parent_id
        return out[::-1]
