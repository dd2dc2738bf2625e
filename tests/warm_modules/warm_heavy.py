"""The module a warm worker preloads in the warm-start tests: it records which process imported it."""

import os

IMPORTED_BY = os.getpid()
os.environ.setdefault("WARM_HEAVY_SET", "by the import")  # as torch sets TORCHINDUCTOR_CACHE_DIR
