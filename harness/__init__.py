"""Plan, render, launch, measure and report distributed training layouts of Hugging Face models."""

from pathlib import Path

from harness.library_logs import quiet_library_logs

REPO_ROOT = Path(__file__).resolve().parent.parent
quiet_library_logs()
