"""The name server: brokers register here, producers and consumers look up topic routes.

Start one with ``namesrv --listen-port 9876`` (or ``python -m namesrv``); embed one with
``NamesrvController(load_config(...))``.
"""
