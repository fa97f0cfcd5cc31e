// The Node.js (and TypeScript) REPL driver of a codecage session.
//
// One persistent REPL context: variables, functions and required modules survive between
// calls, and top-level await works (the REPL's own evaluator). TypeScript is stripped per
// call with the esbuild the image ships for tsx. Requests arrive on fd 3, one JSON object
// per line; answers go back the same way ("display" events, then "done"). The cell's own
// output goes to fd 1 and 2. The launcher treats everything on fd 3 as untrusted.
//
// The driver owns the streams of a call: before each call fds 0, 1 and 2 are the session's
// again (reopened from the driver's own copies if a cell closed or replaced them), and
// process.stdout, process.stderr and `console` (the REPL context's and the global one) are
// fresh writers onto fds 1 and 2: synchronous, so console.log, process.stdout.write and a
// child's inherited output arrive in the order they were written. Should a cell close the
// driver's own copies too, "done" asks the launcher for a new interpreter ("restart").
'use strict';

const { Console } = require('console');
const domain = require('domain');
const fs = require('fs');
const net = require('net');
const repl = require('repl');
const util = require('util');
const { PassThrough, Writable } = require('stream');

const MAX_TEXT = 64 * 1024;
const ESBUILD = '/opt/codecage/node/node_modules/esbuild';

// Copies of the session's stdin (/dev/null), stdout and stderr. Node has no dup(): opening
// /proc/self/fd/N gives a new descriptor of the same pipe (close-on-exec, as every fd
// Node opens).
const SAVED = [0, 1, 2].map((fd) => ({
  fd: fs.openSync(`/proc/self/fd/${fd}`, fd === 0 ? fs.constants.O_RDONLY : fs.constants.O_WRONLY),
  mode: fd === 0 ? fs.constants.O_RDONLY : fs.constants.O_WRONLY,
}));

const channel = new net.Socket({ fd: 3, readable: true, writable: true });
const typescript = process.argv.includes('--typescript');
let executionCount = 0;
let currentId = null;

function send(event) {
  channel.write(JSON.stringify(event) + '\n');
}

function clip(text) {
  return text.length > MAX_TEXT
    ? text.slice(0, MAX_TEXT) + `\n... (${text.length - MAX_TEXT} more characters)`
    : text;
}

function inspect(value) {
  return clip(util.inspect(value, { depth: 4, maxArrayLength: 100, maxStringLength: 10000, breakLength: 100 }));
}

// display(value): shows a value; display(data, 'image/png') shows a MIME type as it is
// (a Buffer is sent as base64).
function display(value, mime) {
  let data;
  if (typeof mime === 'string') {
    data = { [mime]: Buffer.isBuffer(value) ? value.toString('base64') : String(value), 'text/plain': `<${mime}>` };
  } else {
    data = { 'text/plain': inspect(value) };
  }
  send({ ev: 'display', id: currentId, data });
}

const sleeper = new Int32Array(new SharedArrayBuffer(4));

// All of `chunk` onto fd, in order, before returning (a full pipe is waited out).
function writeAll(fd, chunk, encoding) {
  const bytes = typeof chunk === 'string' ? Buffer.from(chunk, encoding) : chunk;
  let offset = 0;
  while (offset < bytes.length) {
    try {
      offset += fs.writeSync(fd, bytes, offset);
    } catch (error) {
      if (error.code !== 'EAGAIN') throw error;
      Atomics.wait(sleeper, 0, 0, 1);
    }
  }
}

function writer(fd) {
  const stream = new Writable({
    write(chunk, encoding, callback) {
      try {
        writeAll(fd, chunk, encoding);
        callback();
      } catch (error) {
        callback(error);
      }
    },
  });
  // A write to a stream the cell broke (EBADF, EPIPE) fails that write, not the driver.
  stream.on('error', () => {});
  stream.fd = fd;
  stream.isTTY = false;
  return stream;
}

function alive(fd) {
  try {
    fs.fstatSync(fd);
    return true;
  } catch {
    return false;
  }
}

function sameFile(a, b) {
  try {
    const x = fs.fstatSync(a);
    const y = fs.fstatSync(b);
    return x.dev === y.dev && x.ino === y.ino;
  } catch {
    return false;
  }
}

// Makes fd the session's pipe again: open() takes the lowest free number, so the ones
// below fd are held meanwhile. False when the driver's copy itself is gone.
function reopen(fd, saved) {
  if (!alive(saved.fd)) return false;
  if (sameFile(fd, saved.fd)) return true;
  try { fs.closeSync(fd); } catch { /* closed already */ }
  const held = [];
  let got;
  while ((got = fs.openSync(`/proc/self/fd/${saved.fd}`, saved.mode)) < fd) held.push(got);
  held.forEach((f) => fs.closeSync(f));
  return got === fd;
}

// Fresh streams for the next call; false when only a new interpreter can have them.
function ownStreams() {
  if (!SAVED.every((saved, fd) => reopen(fd, saved))) return false;
  const stdout = writer(1);
  const stderr = writer(2);
  const define = (name, value) =>
    Object.defineProperty(process, name, { configurable: true, enumerable: true, get: () => value });
  define('stdout', stdout);
  define('stderr', stderr);
  const cellConsole = new Console({ stdout, stderr });
  Object.defineProperty(globalThis, 'console', {
    configurable: true, enumerable: false, writable: true, value: cellConsole,
  });
  if (server) server.context.console = cellConsole;
  return true;
}

// Errors a cell throws reach the REPL's domain, not the eval callback: the domain is ours,
// and its error listener finishes the call. What the REPL prints itself is discarded.
const errors = domain.create();
const replOutput = new PassThrough();
replOutput.resume();
let server = null;
ownStreams();
server = repl.start({
  input: new PassThrough(),
  output: replOutput,
  prompt: '',
  terminal: false,
  useGlobal: false,
  ignoreUndefined: true,
  breakEvalOnSigint: true,
  domain: errors,
});
let finish = null;
errors.on('error', (error) => {
  if (finish) finish(error, undefined);
});
server.context.display = display;
server.context.console = globalThis.console;

// Ctrl-C from the launcher: the REPL breaks a running evaluation; otherwise nothing to do
// (the default would end the process).
process.on('SIGINT', () => {});

let esbuild = null;
// A request says whether its code is TypeScript (one Node context serves node and
// typescript calls); the driver's --typescript flag is the default.
function strip(code, ts) {
  if (!(ts === undefined || ts === null ? typescript : ts)) return code;
  esbuild = esbuild || require(ESBUILD);
  const hasAwait = /\bawait\b/.test(code);
  return esbuild.transformSync(code, { loader: 'ts', format: hasAwait ? undefined : 'cjs' }).code;
}

function exceptionOf(error) {
  if (error instanceof Error || (error && error.stack)) {
    const stack = String(error.stack || error).split('\n')
      .filter((line) => !line.includes('node:repl') && !line.includes('node:internal') && !line.includes(__filename));
    return { name: error.name || 'Error', value: String(error.message), traceback: stack };
  }
  return { name: 'Error', value: inspect(error), traceback: [] };
}

function execute(request) {
  currentId = request.id;
  if (!ownStreams()) return done(null, null, true);
  executionCount += 1;
  let code;
  try {
    code = strip(String(request.code || ''), request.typescript);
  } catch (error) {
    return done(null, exceptionOf(error));
  }
  finish = (error, value) => {
    finish = null;
    if (error !== null && error !== undefined) {
      // The REPL wraps syntax errors it could recover from; the message is what matters.
      return done(null, exceptionOf(error.err || error));
    }
    const result = value === undefined ? null : { 'text/plain': inspect(value) };
    if (value !== undefined) server.context._ = value;
    done(result, null);
  };
  server.eval(code, server.context, `cell-${executionCount}`, (error, value) => {
    if (finish) finish(error, value);
  });
}

function done(result, exception, restart = false) {
  // What the cell wrote is in the pipes before "done" is: the writers are synchronous.
  // A cell that broke the driver's own copies of the streams asks for a new interpreter.
  restart = restart || !SAVED.every((saved) => alive(saved.fd));
  send({ ev: 'done', id: currentId, execution_count: executionCount, result, exception, restart });
}

// The launcher sends one request at a time and waits for its "done". Lines are cut as
// bytes (a chunk may end inside a UTF-8 sequence), and a long one is joined once.
let pending = [];
channel.on('data', (chunk) => {
  let newline;
  while ((newline = chunk.indexOf(0x0a)) >= 0) {
    pending.push(chunk.subarray(0, newline));
    const line = Buffer.concat(pending).toString('utf8');
    pending = [];
    chunk = chunk.subarray(newline + 1);
    let request;
    try { request = JSON.parse(line); } catch { continue; }
    if (request.op === 'execute') execute(request);
  }
  if (chunk.length) pending.push(chunk);
});
channel.on('end', () => process.exit(0));

send({ ev: 'ready' });
