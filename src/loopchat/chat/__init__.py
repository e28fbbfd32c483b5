"""The chat core without Textual: the session that drives one conversation, its replies and steps
(conversation.py), the history recorder, stored replies, the wire feed, plots and prefs.

The TUI draws it; nothing here imports Textual."""
