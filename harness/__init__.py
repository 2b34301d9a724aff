"""Plan, render, launch, measure and report distributed training layouts of Hugging Face models."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
