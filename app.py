"""DART Lab's Gradio app (also the Hugging Face Spaces entry point): `python app.py --help`."""

from app.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
