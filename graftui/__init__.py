"""graftui: find where a fine-tuned model keeps its skill (skill localization by grafting)."""

__version__ = "0.1.0"
