"""What the chat's two big views show, without Textual: the loop panel's lines
(panel.py and its sections) and the document view's rows and header (document.py),
as pure functions of the events, the settings and the conversation. The widgets in
tui/ (loop_panel.py, document_view.py) only draw them.

Every line is a `lines.Line`: (text, rich Style) pieces that already fit the width.
A view too tall for its screen gives way section by section (`fit.fit`)."""
