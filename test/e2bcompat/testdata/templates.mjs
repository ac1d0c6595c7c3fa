// Templates built from code through the SDK's Template builder: steps
// from another template, files uploaded for COPY, environment, working
// directory, a start command gated by a ready command, build logs, tags,
// a failing step reported as E2B reports it, and delete.
import { ApiClient, BuildError, ConnectionConfig, Sandbox, Template, waitForFile } from 'e2b'
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { check, rejects } from './check.mjs'

const ctx = mkdtempSync(join(tmpdir(), 'e2b-context-'))
mkdirSync(join(ctx, 'app'))
writeFileSync(join(ctx, 'app', 'hello.txt'), 'hello from the context\n')
writeFileSync(join(ctx, 'serve.sh'), '#!/bin/sh\necho "service in $PWD with $GREETING" > /tmp/service.log\nsleep 1\ntouch /tmp/ready\nexec sleep 100000\n')

const name = `tpl-${Date.now()}`
const api = new ApiClient(new ConnectionConfig())
const made = []
try {
  const template = Template({ fileContextPath: ctx })
    .fromTemplate('base')
    .setEnvs({ GREETING: 'hi "there"', SECOND: 'two' })
    .runCmd(['mkdir -p /opt/data', 'echo built > /opt/data/marker'])
    .copy('app', '/opt/app/')
    .copy('serve.sh', '/usr/local/bin/serve.sh', { mode: 0o755 })
    .setWorkdir('/opt/app')
    .setStartCmd('/usr/local/bin/serve.sh', waitForFile('/tmp/ready'))

  const logs = []
  const built = await Template.build(template, name, { onBuildLogs: (e) => logs.push(e.message) })
  check(built.templateId === name && typeof built.buildId === 'string', `build answer: ${JSON.stringify(built)}`)
  check(logs.some((l) => /step \d+\/\d+: RUN/.test(l)), `build logs name the steps: ${logs.join(' | ')}`)
  check(logs.some((l) => /built template/.test(l)), `build logs end with the result: ${logs.join(' | ')}`)
  check(await Template.exists(name), 'exists after the build')
  check(!(await Template.exists(`${name}-missing`)), 'a name never built does not exist')

  // The service is up when the create returns.
  const sbx = await Sandbox.create(name, { timeoutMs: 60_000 })
  made.push(sbx)
  const r = await sbx.commands.run('cat /opt/data/marker /opt/app/hello.txt /tmp/service.log; echo "$GREETING $SECOND"; pwd; stat -c %a /usr/local/bin/serve.sh')
  const want = 'built\nhello from the context\nservice in /opt/app with hi "there"\nhi "there" two\n/opt/app\n755\n'
  check(r.stdout === want, `sandbox of the template: ${JSON.stringify(r.stdout)}`)

  // An unchanged rebuild under a tag runs no step again; tags move.
  const logs2 = []
  const v2 = await Template.build(template, `${name}:v2`, { onBuildLogs: (e) => logs2.push(e.message) })
  check(logs2.some((l) => /all \d+ steps cached/.test(l)), `rebuild is cached: ${logs2.join(' | ')}`)
  check(await Template.exists(`${name}:v2`), 'the tag exists')
  const assigned = await Template.assignTags(`${name}:v2`, ['prod'])
  check(assigned.buildId === v2.buildId && assigned.tags.includes('prod'), `assignTags: ${JSON.stringify(assigned)}`)
  const tags = (await Template.getTags(name)).map((t) => t.tag).sort()
  check(JSON.stringify(tags) === '["default","prod","v2"]', `getTags: ${tags}`)
  const tagged = await Sandbox.create(`${name}:prod`, { timeoutMs: 60_000 })
  made.push(tagged)
  check((await tagged.commands.run('cat /opt/data/marker')).stdout === 'built\n', 'a sandbox of a tag')
  await Template.removeTags(name, ['prod'])
  check(!(await Template.exists(`${name}:prod`)), 'a removed tag')

  // skipCache runs the steps again.
  const stamp = () => Template().fromTemplate('base').runCmd('echo stamped > /stamp')
  await Template.build(stamp(), `${name}-stamp`)
  const cachedLogs = []
  await Template.build(stamp(), `${name}-stamp`, { onBuildLogs: (e) => cachedLogs.push(e.message) })
  check(cachedLogs.some((l) => /all \d+ steps cached/.test(l)), `an unchanged build is cached: ${cachedLogs.join(' | ')}`)
  const forcedLogs = []
  await Template.build(stamp(), `${name}-stamp`, { skipCache: true, onBuildLogs: (e) => forcedLogs.push(e.message) })
  check(forcedLogs.some((l) => /ran steps 1, 2 of 2/.test(l)), `skipCache runs every step: ${forcedLogs.join(' | ')}`)
  const delStamp = await api.api.DELETE('/templates/{templateID}', { params: { path: { templateID: `${name}-stamp` } } })
  check(delStamp.response.status === 204, `delete of the stamp template: ${delStamp.response.status}`)

  // fromTemplate resolves an E2B name and tag.
  await Template.build(Template().fromTemplate(`${name}:v2`).runCmd('cp /opt/data/marker /child'), `${name}-child`)
  const child = await Sandbox.create(`${name}-child`, { timeoutMs: 60_000 })
  made.push(child)
  check((await child.commands.run('cat /child')).stdout === 'built\n', 'a template built from a tag')

  // A rebuild moves the default tag while a sandbox still uses the first
  // build: that build stays until the sandbox is gone, then goes.
  const corralTemplates = async () => (await api.api.GET('/templates')).data.map((t) => t.templateID)
  check((await corralTemplates()).includes(built.buildId), 'the first build is a template')
  await Template.build(template.runCmd('echo changed > /opt/data/changed'), name)
  check((await sbx.commands.run('cat /opt/data/marker')).stdout === 'built\n', 'the sandbox of the first build still runs')
  check((await corralTemplates()).includes(built.buildId), 'the first build stays while a sandbox uses it')
  await sbx.kill()
  await Template.assignTags(`${name}:v2`, ['again']) // any tag change retries the delete
  check(!(await corralTemplates()).includes(built.buildId), 'the first build goes once unused')
  const rebuilt = await Sandbox.create(name, { timeoutMs: 60_000 })
  made.push(rebuilt)
  check((await rebuilt.commands.run('cat /opt/data/changed')).stdout === 'changed\n', 'the default tag is the rebuild')

  // From an image of a registry, with the image's environment and
  // working directory.
  const image = process.env.CORRAL_TEST_IMAGE
  check(image, 'CORRAL_TEST_IMAGE names the test registry image')
  const fromImage = Template().fromImage(image).runCmd('echo "$FROM_IMAGE" > /from-image').setUser('nobody')
  await Template.build(fromImage, `${name}-img`)
  const imgSbx = await Sandbox.create(`${name}-img`, { timeoutMs: 60_000 })
  made.push(imgSbx)
  const ir = await imgSbx.commands.run('cat /from-image; pwd; id -un')
  check(ir.stdout === 'yes\n/srv/app\nnobody\n', `sandbox of an image template: ${JSON.stringify(ir.stdout)}`)

  // A failing step fails the build with its output and names the step.
  const failing = Template().fromTemplate('base').runCmd('echo to-stdout; exit 3')
  const failLogs = []
  const err = await rejects(Template.build(failing, `${name}-broken`, { onBuildLogs: (e) => failLogs.push(e.message) }), BuildError, 'a failing step')
  check(/status 3/.test(err.message), `the error says how the step ended: ${err.message}`)
  check(failLogs.some((l) => l.includes('to-stdout')), `the step's output is in the logs: ${failLogs.join(' | ')}`)
  await rejects(Template.build(Template().fromTemplate('no-such-template'), `${name}-orphan`), BuildError, 'a missing base template')
  await rejects(Template.build(Template().fromImage('registry.invalid/x', { username: 'u', password: 'p' }), `${name}-creds`),
    /registry credentials/, 'registry credentials are refused, naming them')

  // Delete: every build of the name and its tags.
  for (const s of made.splice(0)) await s.kill()
  const del = await api.api.DELETE('/templates/{templateID}', { params: { path: { templateID: name } } })
  check(del.response.status === 204, `delete: ${del.response.status} ${JSON.stringify(del.error)}`)
  check(!(await Template.exists(name)), 'gone after delete')
  check(!(await Template.exists(`${name}:v2`)), 'its tags are gone too')
  const delChild = await api.api.DELETE('/templates/{templateID}', { params: { path: { templateID: `${name}-child` } } })
  check(delChild.response.status === 204, `delete of the child template: ${delChild.response.status}`)
  const delImg = await api.api.DELETE('/templates/{templateID}', { params: { path: { templateID: `${name}-img` } } })
  check(delImg.response.status === 204, `delete of the image template: ${delImg.response.status}`)
} finally {
  for (const s of made) await s.kill()
  rmSync(ctx, { recursive: true, force: true })
}
console.log('ok templates')
