"""Reports: read run directories into one table, and render it (terminal, CSV, HTML, W&B)."""
