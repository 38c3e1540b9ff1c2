"""A pre-training run's machinery: steps, loop, optimizer, resume, data set-up, reporting."""
