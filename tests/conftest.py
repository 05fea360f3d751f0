"""Test-wide environment: no hub access, and a private QVL_HOME so tests never touch ~/.cache."""

from __future__ import annotations

import os
import tempfile

os.environ["QVL_HOME"] = tempfile.mkdtemp(prefix="qvl-test-home-")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
