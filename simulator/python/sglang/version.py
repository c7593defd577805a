"""Version of the emulated SGLang release (``SGLANG_SIM_VERSION``, default 0.5.23)."""
from sglang.srt.sim_config import DEFAULT_VERSION, VERSION_NAMES

import os as _os

__version__ = VERSION_NAMES.get((_os.environ.get("SGLANG_SIM_VERSION") or DEFAULT_VERSION).strip(),
                                DEFAULT_VERSION)
