"""pywgtrain's one cache directory (the main job's tokenized corpus, measured
GEMM plans)."""

import os


def cache_dir() -> str:
    """``$PYWGTRAIN_CACHE``, else ``$XDG_CACHE_HOME/pywgtrain``, else
    ``~/.cache/pywgtrain``. Not created here: its writers create it when they
    first write (opening a Device writes nothing)."""
    return os.environ.get("PYWGTRAIN_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "pywgtrain"
    )
