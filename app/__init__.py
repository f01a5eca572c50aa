"""DART Lab's Gradio app: run plain decoding and DART side by side, and explore every step's draft tree.

Importing this package loads no model and parses no arguments; `app.cli.main()` (what `python app.py` runs)
does both, and `app.ui.build_app(engine)` builds the Blocks around one shared engine.
"""
