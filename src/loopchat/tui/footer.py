"""The footer, showing only keys that fit whole: Textual's cuts the last one that runs
under the palette's key ("f5 Regener" at 80 columns); this one leaves it and those after
it out (F1 lists every key) and shows them again when the terminal widens."""

from __future__ import annotations

from weakref import WeakKeyDictionary

from textual.widget import Widget
from textual.widgets import Footer


class WholeKeysFooter(Footer):
    """Footer whose keys are each shown whole or not at all."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._widths: WeakKeyDictionary[Widget, int] = WeakKeyDictionary()  # measured while shown
        self._retries = 0  # fits put off until the keys are laid out, in a row

    def on_mount(self) -> None:
        self.call_after_refresh(self.fit_keys)

    def on_resize(self) -> None:
        self.call_after_refresh(self.fit_keys)

    async def recompose(self) -> None:  # the keys change with the focus and the screen
        await super().recompose()
        self.call_after_refresh(self.fit_keys)

    def fit_keys(self) -> None:
        """Show the keys, in order, while each fits before the palette's key; hide the rest."""
        if not self.is_attached:
            return
        items: list[Widget] = []
        palette: Widget | None = None
        for child in self.children:
            if child.has_class("-command-palette"):
                palette = child
            else:
                items.append(child)
        limit = (palette.region.x - self.region.x) if palette is not None and palette.display else self.size.width
        x, fits = 0, True
        if all(item in self._widths or (item.display and item.outer_size.width) for item in items):
            self._retries = 0
        for item in items:
            if item.display and item.outer_size.width:
                self._widths[item] = item.outer_size.width
            width = self._widths.get(item)
            if width is None:  # not laid out yet: measured again a frame later (a busy
                # machine can take many refreshes to lay out the keys a recompose made)
                if self._retries < 200:  # 10 s
                    self._retries += 1
                    self.set_timer(0.05, self.fit_keys)
                return
            fits = fits and x + width <= limit
            if item.display != fits:
                item.display = fits
            x += width + item.styles.margin.right
