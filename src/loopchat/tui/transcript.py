"""The conversation on the left, as one line-API scroll view (no child widgets).

The turns are blocks (blocks.py) that render themselves to Strips and keep them; the
live reply only appends. Since the transcript has no child widgets, a new line costs
Textual a layout of a handful of widgets, not of every past turn, and while a reply
grows it costs none at all (`render.scrolling`). Only the lines on screen are drawn
(`render_line`, or on the fast paths `render_lines` with the lines padded for the
screen kept per line, `render.lines.ScreenLines`).

A click on a token posts `Transcript.TokenSelected`.
"""

from __future__ import annotations

import bisect
from typing import Any

from rich.style import Style
from textual.cache import LRUCache
from textual.geometry import Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.scrollbar import ScrollBar
from textual.strip import Strip

from loopchat.chat.conversation import Conversation, ReplyRecord
from loopchat.chat.prefs import Prefs
from loopchat.tui import render
from loopchat.tui.blocks import Block, ReplyView, UserBlock
from loopchat.tui.document_block import DocumentBlock
from loopchat.tui.prompt import TypedForTheBox

LIVE_STEP = 6  # lines the view scrolls at once while a reply grows


class Transcript(ScrollView, can_focus=True):
    """Scrolls with the reply while anchored; scrolling up releases it (Textual's anchor)."""

    class TokenSelected(Message):
        """A token of a reply was clicked: step `step` of reply number `reply`."""

        def __init__(self, reply: int, step: int) -> None:
            super().__init__()
            self.reply = reply
            self.step = step

    _fast = False  # the fast paths of tui/render/ (decided in __init__)

    def __init__(self, **kwargs: Any) -> None:
        self._fast = render.fast()
        super().__init__(**kwargs)
        self.blocks: list[Block] = []
        self._starts: list[int] = []  # first line of each block
        self._total = 0
        self._width = 0
        self._line_style = Style()
        # finished lines are the same Strip objects frame after frame: keep them cropped
        # and styled. Keyed by identity (a Strip has no hash); the entry holds the strip,
        # so the id stays valid while it is cached.
        self._strip_cache: LRUCache[tuple, tuple[Strip, Strip]] = LRUCache(2000)
        # on the fast paths, the same lines padded and filtered for the screen
        self._screen_lines = render.lines.ScreenLines() if self._fast else None

    def on_mount(self) -> None:
        self.anchor()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strip_cache.clear()
        if self._screen_lines is not None:
            self._screen_lines.clear()

    @property
    def vertical_scrollbar(self) -> ScrollBar:
        """Textual's own bar, or on the fast paths a row-cached one (render/scrollbar.py)."""
        if self._fast:
            return render.scrollbar.vertical_scrollbar(self)
        return super().vertical_scrollbar

    # ---- content ------------------------------------------------------------------
    @property
    def content_width(self) -> int:
        """The width the blocks are rendered at (0 until the widget has a size)."""
        return self._width

    def _measure_width(self) -> int:
        return max(10, self.scrollable_content_region.width or self.size.width or 80)

    def _add(self, block: Block) -> Block:
        block.transcript = self
        if self._width:
            block.render(self.app.console, self._width)
        self.blocks.append(block)
        start = self._total
        self._starts.append(start)
        self._total += block.height
        self._refresh_lines(start, self._total)
        return block

    def add_user(self, text: str) -> UserBlock:
        return self._add(UserBlock(text))  # type: ignore[return-value]

    def add_reply(self, record: ReplyRecord, prefs: Prefs) -> ReplyView:
        return self._add(ReplyView(record, prefs))  # type: ignore[return-value]

    @staticmethod
    def view_for(record: ReplyRecord, prefs: Prefs, conversation: Conversation) -> ReplyView:
        """The view of a reply: a completion-mode continuation of the conversation shows
        the whole document (document_block.py), any other reply itself."""
        if record.is_document and record.in_history:
            return DocumentBlock(conversation.shown_document(record), prefs)
        return ReplyView(record, prefs)

    def add_turn(
        self, user_text: str | None, record: ReplyRecord, prefs: Prefs, conversation: Conversation
    ) -> ReplyView:
        """A turn: the user's message and its reply, or in completion mode the document
        with its new continuation in the place of the document shown before."""
        view = self.view_for(record, prefs, conversation)
        if view.whole_document:
            old = next((b for b in reversed(self.blocks) if b.whole_document), None)
            if old is not None and self.replace_block(old, view):
                return view
        elif user_text is not None:
            self.add_user(user_text)
        return self._add(view)  # type: ignore[return-value]

    def drop_turn(self, view: Block | None, prefs: Prefs, conversation: Conversation) -> None:
        """A turn whose prompt the engine refused goes: the message and its reply, or in
        completion mode the document with it, replaced by the document as it was."""
        if view is None or not view.whole_document:
            self.remove_last(2)
            return
        if view in self.blocks:
            self.blocks.remove(view)
            self.reflow()
        last = conversation.last_in_history()
        if last is not None and last.is_document:
            self.add_turn(None, last, prefs, conversation)

    def reply_views(self) -> list[ReplyView]:
        return [b for b in self.blocks if isinstance(b, ReplyView)]

    def replace_block(self, old: Block, new: Block) -> bool:
        """`new` in `old`'s place (another version of a reply); False if `old` is not shown."""
        if old not in self.blocks:
            return False
        new.transcript = self
        if self._width:
            new.render(self.app.console, self._width)
        self.blocks[self.blocks.index(old)] = new
        self.reflow()
        return True

    def take_after(self, block: Block) -> list[Block]:
        """Remove and return the blocks shown after `block` (none if it is not shown)."""
        if block not in self.blocks:
            return []
        i = self.blocks.index(block) + 1
        taken = self.blocks[i:]
        del self.blocks[i:]
        self.reflow()
        return taken

    def extend(self, blocks: list[Block]) -> None:
        """Show these blocks after the last (blocks taken before, rendered again at the
        current width)."""
        for block in blocks:
            self._add(block)

    def remove_last(self, n: int) -> None:
        del self.blocks[len(self.blocks) - n :]
        self.reflow()

    def clear(self) -> None:
        self.blocks.clear()
        self.reflow()

    def scroll_to_block(self, block: Block) -> None:
        if block in self.blocks and not block.whole_document:  # (a document: the token is in it)
            self.release_anchor()
            y = self._starts[self.blocks.index(block)]
            self.scroll_to(y=y, animate=False)

    # ---- keeping the geometry current ------------------------------------------------
    def block_changed(self, block: Block) -> None:
        """A block's lines were invalidated: re-render it and everything's offsets."""
        if self._width:
            block.render(self.app.console, self._width)
        self.reflow()

    def block_grew(self, block: Block, first_changed: int) -> None:
        """The last block changed from its line `first_changed` on (the live reply).

        Cheap path: no re-render of other blocks, and only the changed lines are
        repainted unless the view scrolls."""
        if block is not (self.blocks[-1] if self.blocks else None):
            self.reflow()
            return
        total = self._starts[-1] + block.height
        old_total, self._total = self._total, total
        # the changed lines, and those the block gave up if it shrank (not the blank
        # rest of the view below it)
        self._refresh_lines(self._starts[-1] + first_changed, max(total, old_total))

    def _refresh_lines(self, start: int, end: int) -> None:
        """Virtual lines start..end changed (the total may have too): resize the
        virtual area and repaint those lines where they are on screen."""
        scroll_y = self.scroll_offset.y
        self._resize_virtual()
        if self.scroll_offset.y != scroll_y:
            return  # scrolled: Textual repaints the whole view anyway
        view = self.scrollable_content_region
        top = max(0, start - scroll_y)
        bottom = min(end - scroll_y, view.height)
        if bottom > top:
            # the lines only, not the scrollbar beside them (`size` includes it, and the
            # compositor would repaint it with them: docs/performance.md, "Textual's
            # drawing costs")
            self.refresh(Region(0, top, view.width, bottom - top))

    def reflow(self, rerender: bool = False) -> None:
        """Lay the blocks out again (after a block's height changed, or blocks went);
        with `rerender`, each block renders itself again first (a new width)."""
        self._starts, total = [], 0
        for block in self.blocks:
            if rerender and self._width:
                block.render(self.app.console, self._width)
            self._starts.append(total)
            total += block.height
        self._total = total
        self._resize_virtual()
        self.refresh()

    def _virtual_height(self) -> int:
        """While a reply grows, the view scrolls by LIVE_STEP lines at a time (a
        scroll repaints the whole view; growing into blank lines repaints one)."""
        last = self.blocks[-1] if self.blocks else None
        if isinstance(last, ReplyView) and not last.record.done:
            return -(-self._total // LIVE_STEP) * LIVE_STEP
        return self._total

    def _resize_virtual(self) -> None:
        size = Size(self._width, self._virtual_height())
        if size == self.virtual_size:
            return
        # on the fast paths, a height that grows costs no layout of the whole screen
        if not (self._fast and render.scrolling.grow(self, size)):
            self.virtual_size = size

    def on_resize(self, event: Any) -> None:
        width = self._measure_width()
        if width != self._width:
            self._width = width
            self.reflow(rerender=True)

    # ---- drawing: only the lines on screen -------------------------------------------
    def render_lines(self, crop: Region) -> list[Strip]:
        """The screen lines in `crop`. On the fast paths, with a plain box, what
        Textual's styles cache would do (pad, filter) is done once per line and kept
        until the line, its scroll position or the widget's look changes."""
        self._line_style = self.visual_style.rich_style  # cached by Textual until a style changes
        if self._screen_lines is not None:
            strips = self._screen_lines.render(self, crop, self._line_style, self._source_line, self._content_line)
            if strips is not None:
                return strips
        return super().render_lines(crop)

    def _source_line(self, index: int) -> Strip | None:
        """The block line shown at virtual line `index` (None: a blank line)."""
        if 0 <= index < self._total and self.blocks:
            b = bisect.bisect_right(self._starts, index) - 1
            i = index - self._starts[b]
            block = self.blocks[b]
            if 0 <= i < block.height:
                return block.line(i)
        return None

    def _content_line(self, source: Strip | None, scroll_x: int, width: int) -> Strip:
        """`source` (a block line, or None for a blank one) as the view shows it: cut
        to `width` columns from `scroll_x`, in the transcript's style."""
        style = self._line_style
        if source is None:
            return Strip.blank(width, style)
        return source.crop_extend(scroll_x, scroll_x + width, style).apply_style(style)

    def render_line(self, y: int) -> Strip:
        """Line `y` of the view (the styles-cache path; render_lines' fast path keeps
        its own cache of finished lines)."""
        scroll_x, scroll_y = self.scroll_offset
        width = self.scrollable_content_region.width
        strip = self._source_line(scroll_y + y)
        if strip is None:
            return self._content_line(None, scroll_x, width)
        key = (id(strip), scroll_x, width, self._line_style)
        cached = self._strip_cache.get(key)
        if cached is not None and cached[0] is strip:
            return cached[1]
        out = self._content_line(strip, scroll_x, width)
        self._strip_cache[key] = (strip, out)
        return out

    def on_key(self, event: Any) -> None:
        TypedForTheBox.hand_over(event, self)

    def on_click(self, event: Any) -> None:
        token = event.style.meta.get("token") if event.style else None
        if token is not None:
            event.stop()
            self.post_message(self.TokenSelected(*token))
