"""A view too tall for its screen gives way section by section: `fit(sections, height)`.

A view is a list of sections, top to bottom; each has its full lines and the shorter
forms it can take, each form at a priority. `fit` takes the forms in order of
priority (the lowest first; the forms of one priority together) until the lines fit
the height, then stops: what matters least gives way first, and nothing gives way
that did not have to. A form can be:

- other lines (a short form: the settings on one line), or none (the section goes);
- a function of how many lines are still over the height (a table that keeps as many
  rows as there is room for), called when the form is taken;
- the section's full lines again (`Form(priority, FULL)`): a section that went can come
  back when another takes its short form and there may be room (a form of a later
  priority can send it away again).

Past the last form the lines may still be taller than the height: the screen cuts the
end. A height of 0 (or less) is no limit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from loopchat.chat.views.lines import Line

#: `Form.lines` for "the section's full lines again"
FULL = "full"


@dataclass(slots=True)
class Form:
    """A form a section takes at `priority`: its lines, or a function of the lines still
    over the height giving them, or FULL (its full lines again)."""

    priority: int
    lines: Sequence[Line] | Callable[[int], Sequence[Line]] | str


@dataclass(slots=True)
class Section:
    """Lines of a view that stay together, and the forms they take on a short screen."""

    lines: Sequence[Line]
    forms: tuple[Form, ...] = ()
    name: str = field(default="", compare=False)  # for reading and for tests


def _height(shown: list[Sequence[Line]]) -> int:
    return sum(map(len, shown))


def fit(sections: Sequence[Section], height: int) -> list[Line]:
    """The sections' lines, each section in the form that fits the view into `height`
    lines (see the module's docstring)."""
    shown: list[Sequence[Line]] = [s.lines for s in sections]
    if height > 0 and _height(shown) > height:  # (once per frame: the common case costs a sum)
        for priority in sorted({f.priority for s in sections for f in s.forms}):
            for i, s in enumerate(sections):
                for form in s.forms:
                    if form.priority == priority:
                        shown[i] = _take(form, s, _height(shown) - height)
            if _height(shown) <= height:
                break
    out: list[Line] = []
    for lines in shown:
        out.extend(lines)
    return out


def _take(form: Form, section: Section, over: int) -> Sequence[Line]:
    if isinstance(form.lines, str):
        return section.lines
    if callable(form.lines):
        return form.lines(over)
    return form.lines
