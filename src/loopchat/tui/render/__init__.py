"""Textual's (and rich's) private API, in one place, behind one version guard.

The app draws a frame for a fraction of what Textual's stock paths cost (README,
Performance) by reaching into them. Every such use is in this package:

- `compositor.py`: `LoopScreen`, whose `RowCroppingCompositor` repaints only the dirty
  rows of each widget (subclasses `textual._compositor.Compositor`, uses its privates).
- `lines.py`: `plain_box` (reads rich's `Style._link_id` / `_meta`) and `ScreenLines`,
  the transcript's lines padded and filtered as Textual's styles cache would do it
  (`textual._segment_tools.line_pad`).
- `scrolling.py`: a transcript that grows without a layout of the screen
  (`Widget._scroll_update`, `_anchor_released`).
- `scrollbar.py`: the transcript's scrollbar, repainted from rows it has painted before
  (made in place of Textual's through `_vertical_scrollbar` and `App._start_widget`).

- `paste.py`: `PasteDriver`, Textual's Linux driver with an input parser that reads a
  bracketed paste whole, in order, whatever it holds (an ESC inside a paste broke
  Textual's: `textual._xterm_parser`, `textual._parser`). On the tested Textual only,
  whatever LOOPCHAT_STOCK_RENDER says (it is not a drawing path); elsewhere Textual's
  own driver (`driver_class()` None).

Nothing else in loopchat uses a private Textual or rich name (tests/test_render_guard.py
checks the source).

The fast paths are on only on the Textual release they were written and tested against
(`TESTED_TEXTUAL`, pinned in pyproject.toml), and when the environment variable
LOOPCHAT_STOCK_RENDER is not 1 (for A/B benchmarks and tests). Otherwise, and whenever
importing them fails (a release without `textual._compositor` or
`_segment_tools.line_pad`), every widget takes Textual's stock path: the stock
`Screen`, `render_line` through the styles cache, Textual's own scrollbar,
`virtual_size` assigned, and the app shows a one-line notice saying why
(`fallback_reason()`). A widget decides when it is made (`fast()`), so the environment
variable can be set before an app is created.
"""

from __future__ import annotations

import os
from typing import Any

import textual
from textual.screen import Screen

TESTED_TEXTUAL = "8.2.8"
STOCK_ENV = "LOOPCHAT_STOCK_RENDER"

try:
    from loopchat.tui.render import compositor, lines, scrollbar, scrolling
except Exception as exc:  # a Textual or rich without these privates (ImportError, AttributeError...)
    # never a crash: the stock paths need none of it. (On the pinned release the tests
    # check that this import succeeds: test_the_tested_textual_is_the_pinned_one.)
    compositor = lines = scrollbar = scrolling = None  # type: ignore[assignment]
    _IMPORT_ERROR: str | None = f"{type(exc).__name__}: {str(exc).split(' (')[0]}"  # (no path)
else:
    _IMPORT_ERROR = None

try:  # apart: a Textual without these privates keeps the fast drawing paths
    from loopchat.tui.render import paste
except Exception:  # (and on Windows: no Linux driver)
    paste = None  # type: ignore[assignment]


def textual_version() -> str:
    try:
        return str(textual.__version__)
    except Exception:  # no package metadata (a vendored copy)
        return "unknown"


def fallback_reason() -> str | None:
    """Why the app uses Textual's stock rendering, in one line; None when it does not."""
    stock = "using Textual's stock rendering (slower)"
    if os.environ.get(STOCK_ENV) == "1":
        return f"{STOCK_ENV}=1: {stock}"
    version = textual_version()
    if version != TESTED_TEXTUAL:
        return f"Textual {version} is not the tested {TESTED_TEXTUAL}: {stock}"
    if _IMPORT_ERROR is not None:
        return f"Textual {version} lacks the private API loopchat draws with ({_IMPORT_ERROR}): {stock}"
    return None


def fast() -> bool:
    """Whether a widget made now uses the fast paths."""
    return fallback_reason() is None


#: the decision when this module was imported (widgets ask `fast()` when they are made)
FAST: bool = fast()


def default_screen(**kwargs: Any) -> Screen:
    """The app's main screen: a `LoopScreen` on the fast paths, else Textual's own."""
    if fast():
        return compositor.LoopScreen(**kwargs)
    return Screen(**kwargs)


def driver_class() -> type | None:
    """The app's terminal driver: `paste.PasteDriver` on the tested Textual (None:
    Textual's own, also when TEXTUAL_DRIVER names one)."""
    if paste is None or textual_version() != TESTED_TEXTUAL or os.environ.get("TEXTUAL_DRIVER"):
        return None
    return paste.PasteDriver
