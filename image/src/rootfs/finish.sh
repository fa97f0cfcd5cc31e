# Build step: configuration and clean-up. Runs as root inside the image
# (chroot.sh build), after the package installs.
recipe=/tmp/codecage/recipe

# Matplotlib: the Agg backend by default (the sandbox has no display), and
# its font list pre-built into the image. The root is read-only at run time
# and HOME (/work) starts empty, so matplotlib would rebuild that list on
# every run; _codecage_mplcache.py (imported by a .pth file, it waits for the
# first `import matplotlib`) copies the pre-built one into the cache
# directory matplotlib is about to use.
if python3 -c 'import matplotlib' 2>/dev/null; then
    site=$(python3 -c 'import matplotlib, os; print(os.path.dirname(os.path.dirname(matplotlib.__file__)))')
    rc=$(python3 -c 'import matplotlib, os; print(os.path.join(matplotlib.get_data_path(), "matplotlibrc"))')
    sed -i -e '/^[[:space:]]*backend[[:space:]]*:/d' "$rc"
    # (No comment line: matplotlib 3.11 reads "# word: ..." as a bad key.)
    printf 'backend: Agg\n' >> "$rc"
    echo "backend: Agg in $rc"
    cache=/usr/local/share/codecage/matplotlib
    rm -rf "$cache"
    mkdir -p "$cache"
    MPLCONFIGDIR=$cache python3 -c 'import matplotlib.font_manager as fm; print(len(fm.fontManager.ttflist), "fonts")'
    rm -rf "$cache/tex.cache"
    ls -l "$cache"
    cp /tmp/codecage/codecage_mplcache.py "$site/_codecage_mplcache.py"
    printf 'import _codecage_mplcache\n' > "$site/codecage-mplcache.pth"
    python3 -m compileall -q "$site/_codecage_mplcache.py"
    chmod -R a+rX "$cache"
fi

# Packages needed only to build the image (pip, npm), with whatever they
# alone pulled in.
if [ -f "$recipe/purge-after-build.txt" ]; then
    pkgs=$(sed -e 's/#.*//' "$recipe/purge-after-build.txt" | tr -s ' \t\n' ' ')
    if [ -n "${pkgs# }" ]; then
        # shellcheck disable=SC2086
        DEBIAN_FRONTEND=noninteractive apt-get purge -y -q --auto-remove $pkgs
    fi
fi

# dpkg's build-time speed-up (see DPKG_OPTIONS in build.rs) is not for the image.
sed -i -e '/^force-unsafe-io$/d' /etc/dpkg/dpkg.cfg.d/99mmdebstrap 2>/dev/null || true

# No package manager caches, logs or stray docs.
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/cache/debconf/*-old /var/lib/dpkg/*-old
rm -rf /root/.cache /root/.npm /root/.config /root/.local /root/.wget-hsts /root/.python_history
rm -rf /var/tmp/* /usr/local/share/man /usr/local/share/doc
find /var/log -type f -delete
echo "clean-up done"

