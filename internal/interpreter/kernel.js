// The JavaScript kernel of Corral's code interpreter: one Node.js process
// per context. Requests arrive as JSON lines on fd 3 ({code, env}); events
// leave as JSON lines on fd 4 (result, error, done). Output is the
// process's own stdout and stderr, so that what child processes write is
// captured too; after each execution the kernel writes the marker it was
// given to both, so that the service knows when an execution's output has
// all arrived. Code runs in this process's global context: variables,
// functions and imports stay between executions.
'use strict';
const fs = require('fs');
const path = require('path');
const readline = require('readline');
const util = require('util');
const vm = require('vm');
const { createRequire } = require('module');

const mark = process.env.CORRAL_KERNEL_MARK;
delete process.env.CORRAL_KERNEL_MARK;

globalThis.require = createRequire(path.join(process.cwd(), '[corral]'));
globalThis.module = { exports: {} };
globalThis.exports = globalThis.module.exports;
globalThis.__filename = path.join(process.cwd(), '[corral]');
globalThis.__dirname = process.cwd();

let count = 0;
// interrupted rejects the promise an execution awaits; a SIGINT during
// synchronous code is vm's (breakOnSigint).
let interrupt = null;
process.on('SIGINT', () => {
  if (interrupt) interrupt(new Error('Execution interrupted'));
});
// An exception thrown later by a timer or callback must not end the
// kernel and its variables; it is reported on stderr.
process.on('uncaughtException', (err) => {
  process.stderr.write(String(err && err.stack ? err.stack : err) + '\n');
});
process.on('unhandledRejection', (err) => {
  process.stderr.write('Unhandled promise rejection: ' + String(err && err.stack ? err.stack : err) + '\n');
});

function emit(ev) {
  fs.writeSync(4, JSON.stringify(ev) + '\n');
}

function compile(code) {
  try {
    return new vm.Script(code, { filename: `<cell ${count}>` });
  } catch (err) {
    // Top-level await is not valid in a script: such code runs inside an
    // async function, as an expression whose value is the result when it
    // is one, else as statements whose declarations do not outlive the
    // execution.
    if (!(err instanceof SyntaxError) || !/await/.test(err.message)) throw err;
    try {
      return new vm.Script(`(async () => (\n${code}\n))()`, { filename: `<cell ${count}>` });
    } catch (_) {
      return new vm.Script(`(async () => {\n${code}\n})()`, { filename: `<cell ${count}>` });
    }
  }
}

function setEnv(env) {
  const saved = {};
  for (const [k, v] of Object.entries(env || {})) {
    saved[k] = Object.prototype.hasOwnProperty.call(process.env, k) ? process.env[k] : undefined;
    process.env[k] = v;
  }
  return saved;
}

function restoreEnv(saved) {
  for (const [k, v] of Object.entries(saved)) {
    if (v === undefined) delete process.env[k];
    else process.env[k] = v;
  }
}

function result(value) {
  const ev = { type: 'result', text: typeof value === 'string' ? value : util.inspect(value, { depth: 6 }) };
  if (value !== null && typeof value === 'object') {
    try {
      ev.json = JSON.parse(JSON.stringify(value));
    } catch (_) {
      // Cycles and BigInts have no JSON form; the text stays.
    }
  }
  return ev;
}

async function execute(req) {
  count++;
  const saved = setEnv(req.env);
  try {
    let value = compile(req.code).runInThisContext({ breakOnSigint: true, displayErrors: false });
    if (value !== null && typeof value === 'object' && typeof value.then === 'function') {
      value = await new Promise((resolve, reject) => {
        interrupt = reject;
        value.then(resolve, reject);
      });
    }
    if (value !== undefined) emit(result(value));
  } catch (err) {
    const e = err instanceof Error ? err : new Error(String(err));
    emit({ type: 'error', name: e.name, value: e.message, traceback: e.stack || String(e) });
  } finally {
    interrupt = null;
    restoreEnv(saved);
  }
  // Through the streams, after what the code wrote to them, and only once
  // it has all reached the pipes.
  await flushed(process.stdout, mark);
  await flushed(process.stderr, mark);
  emit({ type: 'done', execution_count: count });
}

function flushed(stream, data) {
  return new Promise((resolve) => stream.write(data, () => resolve()));
}

(async () => {
  const lines = readline.createInterface({ input: fs.createReadStream(null, { fd: 3 }), crlfDelay: Infinity });
  emit({ type: 'ready' });
  for await (const line of lines) {
    try {
      await execute(JSON.parse(line));
    } catch (err) {
      // The kernel must keep answering; the service sees the execution
      // end without a result.
      process.stderr.write(String(err && err.stack ? err.stack : err) + '\n');
      await flushed(process.stdout, mark);
      await flushed(process.stderr, mark);
      emit({ type: 'done', execution_count: count });
    }
  }
  process.exit(0);
})();
