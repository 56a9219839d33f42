"""simcore: a discrete-event simulator of LLM serving at cluster scale."""

__version__ = "0.1.0"
