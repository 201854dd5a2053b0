"""Moved below the harness: ``broker.localgroup`` (broker groups) and ``common.localgroup``.

Only re-exports, kept while modules with uncommitted edits still import this name; it goes
once they have moved (new code imports the modules above).
"""

from broker.localgroup import GROUP_SIZE, PORTS_PER_BROKER, LocalBrokerGroup, LocalBrokerGroups
from common.localgroup import free_port_pair

__all__ = ["GROUP_SIZE", "PORTS_PER_BROKER", "LocalBrokerGroup", "LocalBrokerGroups", "free_port_pair"]
