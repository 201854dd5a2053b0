"""Shared test settings: every test that starts processes cleans them up itself (by PID)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"

# Child processes (nodes, nameservers, brokers) must import this checkout, installed or not.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
