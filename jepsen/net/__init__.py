"""Peer links the harness can break: local link proxies (``proxy``) and the in-container delay relay (``relay``).

Systems wire their nodes through these; faults cut and shape them through the systems.
"""
