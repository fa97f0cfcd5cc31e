# Smoke test of the finished image, run by the build (step "smoke test") as
# uid 1000 with the image read-only, tmpfs on /tmp and /work, HOME=/work and
# only PATH, HOME and LANG=C.UTF-8 set: MPLBACKEND is deliberately unset here,
# so the image's own default (Agg) is what is tested. Any stderr output from
# Python (a font-cache rebuild notice, a "not writable" warning) fails it.

python3 - 2>/work/python.err <<'PY'
import time
t0 = time.perf_counter()
import sys
import numpy, pandas, matplotlib, requests
import matplotlib.pyplot as plt
assert matplotlib.get_backend().lower() == "agg", matplotlib.get_backend()
df = pandas.DataFrame({"x": numpy.arange(5), "y": numpy.arange(5) ** 2})
ax = df.plot(x="x", y="y")
plt.plot([1, 2])
plt.savefig("/work/x.png")
print(f"python {sys.version.split()[0]}: numpy {numpy.__version__}, pandas {pandas.__version__}, "
      f"matplotlib {matplotlib.__version__} ({matplotlib.get_backend()}), requests {requests.__version__}; "
      f"imports and a saved plot in {time.perf_counter() - t0:.2f}s")
PY
if [ -s /work/python.err ]; then
    echo "python wrote to stderr:" >&2
    cat /work/python.err >&2
    exit 1
fi
head -c 8 /work/x.png | od -An -c | grep -q 'P   N   G' || { echo "x.png is not a PNG" >&2; exit 1; }
echo "matplotlib wrote /work/x.png ($(wc -c < /work/x.png) bytes); cache: $(ls /work/.cache/matplotlib)"

node -e 'console.log(`node ${process.version}`)'
cat > /work/check.ts <<'TS'
interface Point { x: number; y: number }
const norm = (p: Point): number => Math.hypot(p.x, p.y);
const p: Point = { x: 3, y: 4 };
console.log(`tsx: |(${p.x}, ${p.y})| = ${norm(p)}`);
TS
out=$(tsx /work/check.ts)
echo "$out"
[ "$out" = "tsx: |(3, 4)| = 5" ] || { echo "unexpected tsx output" >&2; exit 1; }
