"""What every layer shares (RocketMQ's ``common``): settings, logging, processes, the CLI runner.

It imports no other package of ours, so common -> ledger -> remoting -> namesrv/broker ->
client -> jepsen stays a strict order.
"""
