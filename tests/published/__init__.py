"""Published GPU training runs (tests/data/*.csv) as harness configs, and the error of the time model on them."""
