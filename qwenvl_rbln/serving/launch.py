"""Starting the hand-off: the ``vllm`` executable the child will run, or why there is none.

Kept apart from building the command: only ``commands/serve_cmd.py`` needs it, when it execs the command instead
of printing it (``--dry-run``).
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping

from qwenvl_rbln.errors import DependencyMissing

VLLM_INSTALL_HINT = (
    "install vllm-rbln on the RBLN host (it brings vllm; optimum-rbln 0.12.0 beside it), or put the directory "
    "holding the `vllm` executable first on PATH (`make install` puts vLLM and vllm-rbln 0.11.1a1 in .venv/bin for "
    "`--emulate`); `--dry-run` prints the command without it"
)


def find_vllm(env: Mapping[str, str]) -> str:
    """The ``vllm`` executable on the PATH the child will see; DependencyMissing (exit 3) when there is none."""
    found = shutil.which("vllm", path=env.get("PATH", ""))
    if found is None:
        raise DependencyMissing("`vllm` is not on PATH, so nothing was started", VLLM_INSTALL_HINT)
    return found
