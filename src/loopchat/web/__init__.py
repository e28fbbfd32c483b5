"""`loopchat web`: the chat served to a browser, a process per tab (textual-serve)."""
