"""Launch: prepare run directories (config, plan, engine files) and start them locally or on Slurm."""
