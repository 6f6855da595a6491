"""Ready-made models built from pywgtrain ops."""

from .gpt import CONFIGS, GPT, GPTConfig  # noqa: F401

__all__ = ["GPT", "GPTConfig", "CONFIGS"]
