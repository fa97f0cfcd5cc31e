// The Node.js (and TypeScript) REPL driver of a codecage session.
//
// One persistent REPL context: variables, functions and required modules survive between
// calls, and top-level await works (the REPL's own evaluator). TypeScript is stripped per
// call with the esbuild the image ships for tsx. Requests arrive on fd 3, one JSON object
// per line; answers go back the same way ("display" events, then "done"). The cell's own
// output goes to fd 1 and 2. The launcher treats everything on fd 3 as untrusted.
'use strict';

const domain = require('domain');
const net = require('net');
const repl = require('repl');
const util = require('util');
const { PassThrough } = require('stream');

const MAX_TEXT = 64 * 1024;
const ESBUILD = '/opt/codecage/node/node_modules/esbuild';

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

// Errors a cell throws reach the REPL's domain, not the eval callback: the domain is ours,
// and its error listener finishes the call. What the REPL prints itself is discarded.
const errors = domain.create();
const replOutput = new PassThrough();
replOutput.resume();
const server = repl.start({
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

// Ctrl-C from the launcher: the REPL breaks a running evaluation; otherwise nothing to do
// (the default would end the process).
process.on('SIGINT', () => {});

let esbuild = null;
function strip(code) {
  if (!typescript) return code;
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
  executionCount += 1;
  let code;
  try {
    code = strip(String(request.code || ''));
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

function done(result, exception) {
  // What the cell wrote is in the pipes before "done" is: stdout and stderr are
  // synchronous for pipes.
  send({ ev: 'done', id: currentId, execution_count: executionCount, result, exception });
}

// The launcher sends one request at a time and waits for its "done".
let buffered = '';
channel.on('data', (chunk) => {
  buffered += chunk.toString();
  let newline;
  while ((newline = buffered.indexOf('\n')) >= 0) {
    const line = buffered.slice(0, newline);
    buffered = buffered.slice(newline + 1);
    let request;
    try { request = JSON.parse(line); } catch { continue; }
    if (request.op === 'execute') execute(request);
  }
});
channel.on('end', () => process.exit(0));

send({ ev: 'ready' });
