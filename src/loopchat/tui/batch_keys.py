"""Shift+F5 and Alt+V (the app's actions call these): N replies to the last message in one batch,
landing as versions of the reply (batch.py, chat/batch_replies.py), and the versions side by
side pass by pass (versions_screen.py)."""

from __future__ import annotations

from typing import Any

from loopchat.batch import CHAT_N


def write_n(app: Any) -> None:
    """Shift+F5: the last reply written again CHAT_N times in one batch."""
    trio = app.ask(lambda: app.session.write_n(app._mode(), CHAT_N))
    if trio is None:
        return
    old, main, extras = trio
    if app.history is not None:
        app.history.regenerated(old, main)
        for rec in extras:  # stored beside it, as versions that are not the conversation's line
            app.history.replayed(old, rec)
    app.notify(
        f"Writing {CHAT_N} replies in one batch: Alt+PgUp/PgDn shows each, Alt+V all of them side by side", timeout=4
    )
    app.show_version(old, main)
    app.run_finished.clear()


def show_versions(app: Any) -> None:
    """Alt+V: the versions of the selected token's reply (else of the last reply), side by side."""
    from loopchat.chat.views.versions import versions_view
    from loopchat.tui.versions_screen import VersionsScreen

    if isinstance(app.screen, VersionsScreen) or app.screen is not app.screen_stack[0]:
        return
    picked = app.conversation.reply(app.selection[0]) if app.selection is not None else None
    rec = picked or app.conversation.last_in_history()
    versions = [r for r in rec.siblings if r.done and r.steps] if rec is not None else []
    if len(versions) < 2:
        app.notify(
            "This reply has one version: Shift+F5 writes 4 in one batch, F5 another, Ctrl+R a branch",
            severity="warning",
        )
        return
    app.push_screen(VersionsScreen(versions_view(versions)))
