"""qlift: take a fine-tuned LLM checkpoint from the hub to production traffic."""

__version__ = "0.1.0"
