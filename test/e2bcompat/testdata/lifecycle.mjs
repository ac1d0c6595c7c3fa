// Sandbox lifecycle through the e2b SDK's public API: create, info, list,
// timeouts, connect, pause and resume, metrics, kill, and the errors of what
// Corral cannot do.
import { Sandbox, SandboxNotFoundError } from 'e2b'
import { check, rejects, sleep } from './check.mjs'

const run = `r${Date.now()}`
const sbx = await Sandbox.create('base', { timeoutMs: 120_000, metadata: { suite: 'e2bcompat', run } })
try {
  check(typeof sbx.sandboxId === 'string' && sbx.sandboxId.length > 0, 'sandbox ID')
  check(await sbx.isRunning(), 'isRunning after create')

  const info = await sbx.getInfo()
  check(info.sandboxId === sbx.sandboxId, 'getInfo sandboxId')
  check(info.templateId === 'base', `getInfo templateId ${info.templateId}`)
  check(info.metadata.run === run, 'getInfo metadata')
  check(info.state === 'running', `getInfo state ${info.state}`)
  const life = info.endAt.getTime() - info.startedAt.getTime()
  check(life > 110_000 && life <= 121_000, `timeout 120 s gave a life of ${life} ms`)

  await sbx.setTimeout(600_000)
  const later = await sbx.getInfo()
  check(later.endAt.getTime() - Date.now() > 590_000, 'setTimeout extended the deadline')

  const page = await Sandbox.list({ query: { metadata: { run }, state: ['running'] } }).nextItems()
  check(page.length === 1 && page[0].sandboxId === sbx.sandboxId, `list by metadata: ${JSON.stringify(page)}`)
  const none = await Sandbox.list({ query: { metadata: { run: 'other' } } }).nextItems()
  check(none.length === 0, 'list by other metadata is empty')

  const again = await Sandbox.connect(sbx.sandboxId)
  check((await again.commands.run('echo connected')).stdout === 'connected\n', 'command through a connected handle')

  const metrics = await sbx.getMetrics()
  check(Array.isArray(metrics) && metrics.length >= 1 && metrics[0].memTotal > 0, `metrics ${JSON.stringify(metrics)}`)

  // E2B's default template is "base": Sandbox.create() with no name.
  const dflt = await Sandbox.create()
  check((await dflt.getInfo()).templateId === 'base', 'default template')
  await dflt.kill()

  // What Corral does not do fails with a message naming the limit.
  await rejects(Sandbox.create('no-such-template'), /template "no-such-template" not found/, 'unknown template')
  await rejects(Sandbox.create('base', { network: { denyOut: ['10.0.0.0/8'] } }), /denyOut/, 'denyOut of one range')

  // Network options map onto Corral's policies: no internet at all here.
  const closed = await Sandbox.create('base', { allowInternetAccess: false })
  const lo = await closed.commands.run('ip -o link | grep -c -v " lo:" || true')
  check(lo.stdout.trim() === '0', `allowInternetAccess false leaves loopback only: ${lo.stdout}`)
  await closed.kill()

  // An allowlist, changed live; a change the policy cannot express fails.
  const listed = await Sandbox.create('base', { network: { denyOut: ['0.0.0.0/0'], allowOut: ['example.test'] } })
  await listed.updateNetwork({ denyOut: ['0.0.0.0/0'], allowOut: ['other.test', '10.9.0.0/16'] })
  await rejects(listed.updateNetwork({ denyOut: ['10.0.0.0/8'] }), /denyOut/, 'update denying one range')
  const resolv = await listed.commands.run('cat /etc/resolv.conf')
  check(resolv.stdout.includes('nameserver'), `resolv.conf of an allowlisted sandbox: ${resolv.stdout}`)
  await listed.kill()

  // onTimeout 'pause' pauses at the deadline; connect resumes.
  const napper = await Sandbox.create('base', { timeoutMs: 2_000, lifecycle: { onTimeout: 'pause' } })
  await napper.files.write('/root/kept', 'yes')
  let state = ''
  for (let i = 0; i < 40 && state !== 'paused'; i++) {
    await sleep(250)
    state = (await napper.getInfo()).state
  }
  check(state === 'paused', `state after the deadline with onTimeout pause: ${state}`)
  const woken = await Sandbox.connect(napper.sandboxId, { timeoutMs: 60_000 })
  check((await woken.files.read('/root/kept')) === 'yes', 'files kept across the pause')
  await woken.kill()

  // Pause, then connect resumes: the sandbox runs commands again.
  await sbx.pause()
  check((await sbx.getInfo()).state === 'paused', 'getInfo state after pause')
  await rejects(sbx.commands.run('echo'), /paused|not running/i, 'command in a paused sandbox')
  const resumed = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 300_000 })
  check((await sbx.getInfo()).state === 'running', 'getInfo state after connect')
  check((await resumed.commands.run('echo resumed')).stdout === 'resumed\n', 'command after resume')
} finally {
  await sbx.kill()
}
check(!(await sbx.isRunning()), 'isRunning after kill')
check((await Sandbox.kill(sbx.sandboxId)) === false, 'Sandbox.kill of a killed sandbox is false')
await rejects(Sandbox.connect(sbx.sandboxId), SandboxNotFoundError, 'connect to a killed sandbox')
await rejects(sbx.commands.run('echo'), /not running|not found|killed|timeout/i, 'command in a killed sandbox')
console.log('ok lifecycle')
