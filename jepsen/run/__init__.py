"""One test run and many: the runner, the worker processes, the leader monitor, the checker hand-off, the campaign and their commands."""
