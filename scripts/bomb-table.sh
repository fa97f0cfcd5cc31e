#!/bin/bash
# Runs each bomb of the bomb suite once through `codecage run --json` and prints a markdown
# table row per bomb (error, exit, peak memory, duration, CPU, pids limit hit): the figures
# of the issue notes. Native: scripts/bomb-table.sh; cgroup v2: cargo xtask vm-run --env
# T=120 --env T2=120 -- bash scripts/bomb-table.sh (T, T2, T3: timeouts in seconds).
B=${B:-$(dirname "$0")/../target/release/codecage}
row() {
  name=$1; shift
  "$B" run --json --rootfs host "$@" | python3 -c "
import json, sys
d = json.load(sys.stdin)
peak = d['peak_memory_bytes'] or 0
print(f\"| $name | {d['error']} | {d['exit_code'] if d['exit_code'] is not None else 'signal ' + str(d['signal'])} | {peak/2**20:.1f} MiB | {d['duration_ms']:.0f} ms | {d['cpu_ms']:.0f} ms | {d['pids_limit_hit']} |\")"
}
echo "| bomb | error | exit | peak memory | duration | cpu | pids limit hit |"
echo "|---|---|---|---|---|---|---|"
row "bash fork bomb (--pids 32)" --pids 32 --timeout ${T:-20} -- bash -c ':(){ :|:& };:; sleep 2'
row "python os.fork loop (--pids 16)" --pids 16 --timeout ${T:-20} -- python3 -c '
import os, time
for i in range(1000):
    try:
        if os.fork() == 0: time.sleep(30); os._exit(0)
    except OSError: break'
row "node spawn loop (--pids 40)" --pids 40 --memory 512M --timeout ${T2:-60} -- node -e 'const {spawn}=require("child_process"); let n=0; function go(){const c=spawn("sleep",["30"]); c.on("error",e=>{console.log(e.code); process.exit(0)}); c.on("spawn",()=>{n++; go()})} go()'
row "thread bomb (--pids 24)" --pids 24 --timeout ${T:-20} -- python3 -c '
import threading, time
try:
    while True: threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
except RuntimeError: pass'
row "python bytearray bomb (--memory 64M)" --memory 64M --timeout ${T:-20} -- python3 -c '
x=[]
while True: x.append(bytearray(8<<20))'
row "node Buffer bomb (--memory 160M)" --memory 160M --timeout ${T2:-60} -- node -e 'const b=[]; for(;;) b.push(Buffer.alloc(16<<20, 1))'
row "memory bomb across 8 threads (--memory 64M)" --memory 64M --timeout ${T:-20} -- python3 -c '
import threading, time
hold=[]
def eat():
    for _ in range(64): hold.append(bytearray(4<<20)); time.sleep(0.001)
ts=[threading.Thread(target=eat) for _ in range(8)]; [t.start() for t in ts]; [t.join() for t in ts]'
row "memory bomb across 8 forked children (--memory 96M)" --memory 96M --timeout ${T:-20} -- python3 -c '
import os, time
kids=[]
for i in range(8):
    pid=os.fork()
    if pid==0:
        x=bytearray(24<<20); time.sleep(3); os._exit(0)
    kids.append(pid)
[os.waitpid(k,0) for k in kids]'
row "cpu spin, 2 processes (--cpus 0.5, 3 s)" --cpus 0.5 --timeout ${T3:-3} -- bash -c 'while :; do :; done & while :; do :; done'
row "disk bomb /tmp (--tmp-size 8M)" --tmp-size 8M --timeout ${T:-20} -- bash -c 'head -c 100M /dev/zero > /tmp/big'
row "disk bomb /work (--work-size 8M)" --work-size 8M --timeout ${T:-20} -- bash -c 'head -c 100M /dev/zero > /work/big'
row "stdout+stderr flood (--output-limit 256K)" --output-limit 256K --timeout ${T:-20} -- bash -c 'cat /dev/urandom >&2 & yes'
row "fd exhaustion" --timeout ${T:-20} -- python3 -c '
fs=[]
try:
    while True: fs.append(open("/dev/null"))
except OSError: pass'
row "zombie pile-up (--pids 16)" --pids 16 --timeout ${T:-20} -- python3 -c '
import os
try:
    while True:
        if os.fork()==0: os._exit(0)
except OSError: pass'
