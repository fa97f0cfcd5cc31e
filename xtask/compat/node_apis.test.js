// What npm packages and their test suites use at start-up, run by `cargo xtask compat` bare
// and in the sandbox (node --test, JUnit reporter). Nothing is fetched.
'use strict';
const test = require('node:test');
const assert = require('node:assert');
const os = require('node:os');
const fs = require('node:fs');
const path = require('node:path');
const net = require('node:net');
const http = require('node:http');
const dgram = require('node:dgram');
const dns = require('node:dns');
const child = require('node:child_process');
const crypto = require('node:crypto');
const zlib = require('node:zlib');
const { Worker } = require('node:worker_threads');

test('os.networkInterfaces lists the loopback', () => {
  const lo = os.networkInterfaces().lo;
  assert.ok(lo.some((a) => a.address === '127.0.0.1' && a.internal));
});

test('os facts: cpus, memory, user, host name, load', () => {
  assert.ok(os.cpus().length >= 1);
  assert.ok(os.availableParallelism() >= 1);
  assert.ok(os.totalmem() > 0 && os.freemem() > 0);
  assert.strictEqual(typeof os.userInfo().username, 'string');
  assert.ok(os.hostname().length > 0);
  assert.strictEqual(os.loadavg().length, 3);
  assert.ok(os.uptime() >= 0);
  assert.ok(fs.existsSync(os.tmpdir()));
});

test('dns.lookup resolves localhost', async () => {
  const { address } = await dns.promises.lookup('localhost', { family: 4 });
  assert.strictEqual(address, '127.0.0.1');
});

for (const host of ['127.0.0.1', '::1']) {
  test(`a TCP server and client talk on ${host}`, async () => {
    const server = net.createServer((s) => s.end('pong'));
    await new Promise((r) => server.listen(0, host, r));
    const reply = await new Promise((resolve, reject) => {
      const c = net.connect(server.address().port, host);
      let data = '';
      c.on('data', (d) => (data += d)).on('end', () => resolve(data)).on('error', reject);
    });
    server.close();
    assert.strictEqual(reply, 'pong');
  });
}

test('an HTTP server answers a request on the loopback', async () => {
  const server = http.createServer((req, res) => res.end('ok ' + req.url));
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  const body = await new Promise((resolve, reject) => {
    http.get(`http://127.0.0.1:${server.address().port}/x`, (res) => {
      let data = '';
      res.on('data', (d) => (data += d)).on('end', () => resolve(data));
    }).on('error', reject);
  });
  server.close();
  assert.strictEqual(body, 'ok /x');
});

test('a UDP datagram goes round', async () => {
  const s = dgram.createSocket('udp4');
  await new Promise((r) => s.bind(0, '127.0.0.1', r));
  const got = new Promise((r) => s.once('message', (m) => r(m.toString())));
  s.send('ping', s.address().port, '127.0.0.1');
  assert.strictEqual(await got, 'ping');
  s.close();
});

test('child processes: spawn, exec, fork with IPC', async (t) => {
  assert.strictEqual(child.spawnSync('sh', ['-c', 'echo hi']).stdout.toString(), 'hi\n');
  assert.strictEqual(child.execSync('echo $((6 * 7))').toString(), '42\n');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fork-'));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  const script = path.join(dir, 'child.js');
  fs.writeFileSync(script, "process.on('message', (m) => { process.send(m * 2); process.exit(0); });");
  const c = child.fork(script);
  const answer = new Promise((r) => c.on('message', r));
  c.send(21);
  assert.strictEqual(await answer, 42);
});

test('a worker thread runs', async () => {
  const w = new Worker("require('node:worker_threads').parentPort.postMessage(6 * 7)", { eval: true });
  assert.strictEqual(await new Promise((r) => w.once('message', r)), 42);
});

test('fs: temp dirs, symlinks, modes, watch', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fs-'));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  fs.writeFileSync(path.join(dir, 'a'), 'x');
  fs.symlinkSync('a', path.join(dir, 'b'));
  assert.strictEqual(fs.realpathSync(path.join(dir, 'b')), path.join(dir, 'a'));
  fs.chmodSync(path.join(dir, 'a'), 0o600);
  assert.strictEqual(fs.statSync(path.join(dir, 'a')).mode & 0o777, 0o600);
  const changed = new Promise((r) => {
    const w = fs.watch(dir, () => { w.close(); r(true); });
  });
  fs.writeFileSync(path.join(dir, 'c'), 'y');
  assert.ok(await changed);
});

test('crypto and zlib', () => {
  assert.strictEqual(crypto.randomBytes(16).length, 16);
  assert.strictEqual(crypto.scryptSync('pw', 'salt', 16).length, 16);
  assert.strictEqual(zlib.gunzipSync(zlib.gzipSync('z')).toString(), 'z');
});

test('process facts: ids, usage, signals to itself', () => {
  assert.ok(process.getuid() >= 0);
  assert.ok(process.memoryUsage().rss > 0);
  assert.ok(process.resourceUsage().maxRSS > 0);
  assert.ok(process.cpuUsage().user >= 0);
  assert.strictEqual(process.kill(process.pid, 0), true);
  assert.ok(process.hrtime.bigint() > 0n);
});

test('raising priority is refused as to any unprivileged user', () => {
  if (process.getuid() !== 0) assert.throws(() => os.setPriority(-5), /EACCES|EPERM/);
  os.setPriority(5);
  assert.strictEqual(os.getPriority(), 5);
});
