"""Process-tree hygiene shared by the agent and the runtime (no torch here).

The agent launches torchrun, torchrun launches the runtime's workers; if the agent dies (even by
SIGKILL) the tree must die too, or the re-leased attempt trains beside it on the same GPUs.
"""

from __future__ import annotations

import signal
import sys

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send `sig` to this process when its parent dies (Linux prctl
    PR_SET_PDEATHSIG; a no-op elsewhere). The launched torchrun calls it between fork and exec, and
    `runtime.launch` in every worker (agent/launcher.py), so an agent killed with SIGKILL takes its whole tree along
    instead of leaving it training beside the re-leased attempt."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
