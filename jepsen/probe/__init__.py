"""``jepsen probe``: hostile-input probes against a running group, on their own beside the fault-injection harness."""
