"""Views of traces: pure functions from traces to plotly figures, HTML and tables (no Gradio, no model), shared by
the app and the HTML report (`report.py`)."""
