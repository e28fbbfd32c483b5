"""The Textual chat app that shows the generation loop live (`loopchat.tui.app.run_tui`)."""
