"""What runs on every rank: build, wrap, time, measure, write (torch is imported only by the submodules)."""
