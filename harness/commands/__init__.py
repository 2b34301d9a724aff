"""The subcommands that join launching and reporting (the top layer: they may import every package)."""
