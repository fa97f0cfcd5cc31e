# Build step: the recipe's npm packages, exactly as package-lock.json pins
# them (npm ci), into /opt/codecage/node; the executables of the direct
# dependencies are linked into /usr/local/bin. Runs as root inside the image
# (chroot.sh build), with network. --ignore-scripts: no package code runs at
# install time (esbuild's postinstall only re-checks its platform binary,
# which npm installs as an optional dependency anyway).
recipe=/tmp/codecage/recipe
dest=/opt/codecage/node
echo "node $(node --version), npm $(npm --version)"
rm -rf "$dest"
mkdir -p "$dest"
cp "$recipe/package.json" "$recipe/package-lock.json" "$dest/"
cd "$dest"
npm ci --omit=dev --ignore-scripts --no-audit --no-fund --no-update-notifier \
    --cache /tmp/npm-cache --userconfig /dev/null
bins=$(node -e '
const p = require("./package.json");
for (const dep of Object.keys(p.dependencies || {})) {
  const q = require("./node_modules/" + dep + "/package.json");
  const bin = typeof q.bin === "string" ? { [q.name.split("/").pop()]: q.bin } : (q.bin || {});
  for (const name of Object.keys(bin)) console.log(name);
}')
for b in $bins; do
    [ -e "$dest/node_modules/.bin/$b" ] || { echo "missing node_modules/.bin/$b" >&2; exit 1; }
    ln -sfn "$dest/node_modules/.bin/$b" "/usr/local/bin/$b"
    echo "linked /usr/local/bin/$b -> $dest/node_modules/.bin/$b"
done
