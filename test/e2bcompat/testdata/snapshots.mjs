// Snapshots and forks through the e2b SDK's public API: a snapshot of a
// sandbox's files starts a new sandbox by its ID, is listed and deleted;
// a fork gives copies that start from the source's files and then diverge.
import { Sandbox } from 'e2b'
import { check } from './check.mjs'

const sbx = await Sandbox.create('base', { timeoutMs: 120_000 })
const made = []
try {
  await sbx.files.write('/root/state.txt', 'before')
  const snap = await sbx.createSnapshot({ name: `s${Date.now()}` })
  check(typeof snap.snapshotId === 'string' && snap.snapshotId.length > 0, 'snapshot ID')
  await sbx.files.write('/root/state.txt', 'after')

  const listed = await Sandbox.listSnapshots({ sandboxId: sbx.sandboxId }).nextItems()
  check(listed.some((s) => s.snapshotId === snap.snapshotId), `listSnapshots: ${JSON.stringify(listed)}`)

  const restored = await Sandbox.create(snap.snapshotId, { timeoutMs: 60_000 })
  made.push(restored)
  check((await restored.files.read('/root/state.txt')) === 'before', 'a file written before the snapshot is there')

  const copies = await sbx.fork({ count: 2, timeoutMs: 60_000 })
  check(copies.length === 2 && copies.every((c) => !(c instanceof Error)), `fork: ${copies}`)
  made.push(...copies)
  await copies[0].files.write('/root/state.txt', 'first copy')
  check((await copies[1].files.read('/root/state.txt')) === 'after', 'a copy starts from the source files')
  check((await copies[0].files.read('/root/state.txt')) === 'first copy', 'a copy diverges')

  check(await Sandbox.deleteSnapshot(snap.snapshotId), 'deleteSnapshot')
  check(!(await Sandbox.deleteSnapshot(snap.snapshotId)), 'deleteSnapshot of a deleted snapshot')
} finally {
  for (const s of made) await s.kill()
  await sbx.kill()
}
console.log('ok snapshots')
