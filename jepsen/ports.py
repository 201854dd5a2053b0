"""Moved below the harness: ``common.ports``.

Only re-exports, kept while modules with uncommitted edits still import this name; it goes
once they have moved (new code imports ``common.ports``).
"""

from common.ports import DEFAULT_HOST_BASE, PortPlan, PortPlanError

__all__ = ["DEFAULT_HOST_BASE", "PortPlan", "PortPlanError"]
