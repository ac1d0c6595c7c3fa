// Commands through the e2b SDK's public API: streaming callbacks,
// environment, cwd, exit codes, background commands with connect, stdin,
// kill and timeouts.
import { Sandbox, CommandExitError } from 'e2b'
import { check, rejects } from './check.mjs'

const sbx = await Sandbox.create('base', { envs: { SBX_VAR: 'from-create' } })
try {
  const chunks = []
  const errs = []
  const r = await sbx.commands.run('echo one; sleep 0.3; echo two; echo err >&2; echo $SBX_VAR $CMD_VAR', {
    envs: { CMD_VAR: 'from-run' },
    onStdout: (d) => chunks.push(d),
    onStderr: (d) => errs.push(d),
  })
  check(r.exitCode === 0, `exit code ${r.exitCode}`)
  check(r.stdout === 'one\ntwo\nfrom-create from-run\n', `stdout ${JSON.stringify(r.stdout)}`)
  check(r.stderr === 'err\n', `stderr ${JSON.stringify(r.stderr)}`)
  check(chunks.length >= 2 && chunks.join('') === r.stdout, `stdout came in ${chunks.length} chunk(s)`)
  check(errs.join('') === 'err\n', 'onStderr')

  check((await sbx.commands.run('pwd', { cwd: '/tmp' })).stdout === '/tmp\n', 'cwd')

  const failed = await rejects(sbx.commands.run('echo bad >&2; exit 7'), CommandExitError, 'non-zero exit')
  check(failed.exitCode === 7 && failed.stderr === 'bad\n', `CommandExitError ${failed.exitCode} ${failed.stderr}`)

  // Background, disconnect, reconnect: the output is replayed.
  const bg = await sbx.commands.run('for i in 1 2 3; do echo tick $i; sleep 0.3; done', { background: true })
  check(bg.pid > 0, 'background pid')
  const listed = await sbx.commands.list()
  check(listed.some((p) => p.pid === bg.pid), `commands.list has ${bg.pid}: ${JSON.stringify(listed)}`)
  await bg.disconnect()
  const seen = []
  const again = await sbx.commands.connect(bg.pid, { onStdout: (d) => seen.push(d) })
  const res = await again.wait()
  check(res.stdout === 'tick 1\ntick 2\ntick 3\n', `connected stdout ${JSON.stringify(res.stdout)}`)
  check(seen.join('') === res.stdout, 'connect onStdout')

  // stdin
  const cat = await sbx.commands.run('cat', { background: true, stdin: true })
  await sbx.commands.sendStdin(cat.pid, 'hello stdin\n')
  await sbx.commands.closeStdin(cat.pid)
  check((await cat.wait()).stdout === 'hello stdin\n', 'stdin echoed')

  // kill
  const sleeper = await sbx.commands.run('sleep 60', { background: true })
  check((await sbx.commands.kill(sleeper.pid)) === true, 'kill returns true')
  const killed = await rejects(sleeper.wait(), CommandExitError, 'killed command')
  check(killed.exitCode !== 0, 'killed exit code')
  check((await sbx.commands.kill(999999)) === false, 'kill of an unknown pid is false')

  // A command's timeout ends it.
  const t0 = Date.now()
  await rejects(sbx.commands.run('sleep 10', { timeoutMs: 1000 }), Error, 'command timeout')
  check(Date.now() - t0 < 8000, 'command timeout took effect')
} finally {
  await sbx.kill()
}
console.log('ok commands')
