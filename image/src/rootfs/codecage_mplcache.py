"""codecage: seed matplotlib's font cache from the copy built into the image.

The image's root filesystem is read-only at run time and HOME (/work) starts
empty, so matplotlib would rebuild its font list (fontlist-v*.json in
~/.cache/matplotlib) on every run. This module, imported at start-up by
codecage-mplcache.pth, waits for the first `import matplotlib` and then copies
the list built into the image (/usr/local/share/codecage/matplotlib) into the
cache directory matplotlib is about to use ($MPLCONFIGDIR, else
$XDG_CACHE_HOME/matplotlib, else ~/.cache/matplotlib), unless it has one.
Until then it costs one string comparison per import; any error is ignored
(matplotlib then simply builds the list itself).
"""

import os
import sys

_PREBUILT = "/usr/local/share/codecage/matplotlib"


def _cache_dir():
    configured = os.environ.get("MPLCONFIGDIR")
    if configured:
        return configured
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache"
    )
    return os.path.join(base, "matplotlib")


def _seed():
    names = [n for n in os.listdir(_PREBUILT) if n.startswith("fontlist-")]
    target = _cache_dir()
    for name in names:
        dst = os.path.join(target, name)
        if os.path.exists(dst):
            continue
        os.makedirs(target, exist_ok=True)
        with open(os.path.join(_PREBUILT, name), "rb") as f:
            data = f.read()
        tmp = "%s.%d.tmp" % (dst, os.getpid())
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, dst)


class _SeedOnFirstImport:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "matplotlib":
            try:
                sys.meta_path.remove(_SeedOnFirstImport)
            except ValueError:
                pass
            try:
                _seed()
            except Exception:
                pass
        return None


sys.meta_path.insert(0, _SeedOnFirstImport)
