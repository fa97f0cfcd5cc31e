# Build step: the recipe's pinned PyPI packages into bookworm's system Python.
# Runs as root inside the image (chroot.sh build), with network.
#
# Debian's pip, run as root without --prefix, installs into the
# "posix_local" scheme: /usr/local/lib/python3.X/dist-packages, which
# /usr/bin/python3 has on its path (a --prefix would pick site-packages,
# which it has not). --no-deps: every dependency must be pinned in
# requirements.txt itself; `pip check` below proves the set is complete.
recipe=/tmp/codecage/recipe
python3 --version
python3 -m pip --version
python3 -m pip install \
    --no-cache-dir --no-deps --only-binary=:all: \
    --break-system-packages --root-user-action=ignore \
    --disable-pip-version-check --no-input --progress-bar=off \
    --no-warn-script-location \
    -r "$recipe/requirements.txt"
python3 -m pip check
site=$(python3 -c 'import sysconfig; print(sysconfig.get_path("purelib", "posix_local"))')
echo "installed into $site"
case $site in
/usr/local/lib/python3*/dist-packages) ;;
*) echo "unexpected install location $site" >&2; exit 1 ;;
esac
python3 - "$site" <<'PY'
import importlib.metadata as md, os, sys
site = sys.argv[1]
assert site in sys.path, f"{site} is not on sys.path {sys.path}"
dists = [d for d in md.distributions() if os.path.realpath(str(d.locate_file(""))) == site]
print(f"{len(dists)} distributions in {site}")
PY
