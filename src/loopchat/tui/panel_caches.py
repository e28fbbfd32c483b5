"""The loop panel's caches (the reply's index, the fitted settings block) live with the
panel's model, in chat/views/reply_index.py; named here too, for code that imports them
from here."""

from __future__ import annotations

from loopchat.chat.views.reply_index import _SPARK_BLOCKS, PanelCaches, ReplyIndex, Series, surprisal

__all__ = ["_SPARK_BLOCKS", "PanelCaches", "ReplyIndex", "Series", "surprisal"]
