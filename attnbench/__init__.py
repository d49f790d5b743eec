"""attnbench: measure recurrent networks against self-attention across sequence lengths, honestly."""

__version__ = "0.1.0"
