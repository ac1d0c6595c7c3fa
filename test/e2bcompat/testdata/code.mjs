// The official @e2b/code-interpreter SDK against Corral's code-interpreter
// template: its default template name, runCode with its callbacks and
// languages, rich results and charts, errors, contexts, per-execution and
// sandbox environment, and a timeout that leaves the context usable.
import { InvalidArgumentError, NotFoundError, Sandbox, TimeoutError } from '@e2b/code-interpreter'
import { check, rejects } from './check.mjs'

// No template named: the SDK's default, code-interpreter-v1.
const sbx = await Sandbox.create({ timeoutMs: 180_000, envs: { SB_VAR: 'from-sandbox' } })
try {
  const seen = { stdout: [], results: [], errors: [] }
  let x = await sbx.runCode('x = 41\nprint("hi")\nx + 1', {
    onStdout: (m) => seen.stdout.push(m.line),
    onResult: (r) => seen.results.push(r),
  })
  check(x.text === '42' && x.logs.stdout.join('') === 'hi\n' && seen.stdout.join('') === 'hi\n', `first run: ${JSON.stringify(x)}`)
  check(seen.results.length === 1 && seen.results[0].isMainResult, `onResult: ${JSON.stringify(seen.results)}`)
  check(x.executionCount === 1, `execution count: ${x.executionCount}`)
  check((await sbx.runCode('x')).text === '41', 'variables stay')

  x = await sbx.runCode('1/0', { onError: (e) => seen.errors.push(e) })
  check(x.error?.name === 'ZeroDivisionError' && x.error.value === 'division by zero' && seen.errors.length === 1, `error: ${JSON.stringify(x.error)}`)
  check(x.error.traceback.includes('1/0'), `traceback: ${x.error.traceback}`)

  x = await sbx.runCode('import matplotlib.pyplot as plt\nplt.bar(["a", "b"], [3, 5])\nplt.title("sales")\nplt.show()')
  const chart = x.results[0]?.chart
  check(x.results.length === 1 && x.results[0].png?.length > 100 && x.results[0].formats().includes('png'), `chart image: ${x.results.length}`)
  check(chart?.type === 'bar' && chart.title === 'sales' && chart.elements.map((e) => e.value).join() === '3,5', `chart: ${JSON.stringify(chart)}`)
  x = await sbx.runCode('import pandas as pd\npd.DataFrame({"n": [1, 2]})')
  check(x.results[0]?.html?.includes('<table') && JSON.stringify(x.results[0].data) === '{"n":[1,2]}', `data frame: ${JSON.stringify(x.results[0]?.data)}`)

  check((await sbx.runCode('[1, 2].map(v => v * 3)', { language: 'javascript' })).text.includes('3, 6'), 'javascript')
  check((await sbx.runCode('echo "$SB_VAR"', { language: 'bash' })).logs.stdout.join('') === 'from-sandbox\n', 'bash and the sandbox env')
  check((await sbx.runCode('import os; os.environ["RUN_VAR"]', { envs: { RUN_VAR: 'r' } })).text === 'r', 'envs of one run')
  check((await sbx.runCode('import os; os.environ.get("RUN_VAR", "gone")')).text === 'gone', 'envs are undone')

  const ctx = await sbx.createCodeContext({ cwd: '/tmp' })
  check(ctx.id && ctx.language === 'python' && ctx.cwd === '/tmp', `context: ${JSON.stringify(ctx)}`)
  check((await sbx.runCode('import os; "x" in globals(), os.getcwd()', { context: ctx })).text === "(False, '/tmp')", 'a context has its own variables and directory')
  check((await sbx.listCodeContexts()).some((c) => c.id === ctx.id), 'listCodeContexts')
  await sbx.runCode('y = 1', { context: ctx })
  await sbx.restartCodeContext(ctx)
  check((await sbx.runCode('"y" in globals()', { context: ctx })).text === 'False', 'restartCodeContext')
  await rejects(sbx.runCode('1', { context: ctx, language: 'python' }), InvalidArgumentError, 'context and language')
  await sbx.removeCodeContext(ctx)
  await rejects(sbx.runCode('1', { context: ctx }), NotFoundError, 'a removed context')

  // The SDK's timeout disconnects; the service interrupts the kernel.
  await rejects(sbx.runCode('import time\nwhile True: time.sleep(0.05)', { timeoutMs: 1500 }), TimeoutError, 'timeoutMs')
  check((await sbx.runCode('x')).text === '41', 'the context after a timeout')
} finally {
  await sbx.kill()
}
console.log('ok code')
// The SDK's keep-alive fetches (one of them aborted by timeoutMs) hold
// sockets in Node's pool for tens of seconds after the last call; the
// checks are done, so do not wait for them.
process.exit(0)
