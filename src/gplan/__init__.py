"""gplan: plan and launch parallel training of large transformers."""

__version__ = "0.1.0"
