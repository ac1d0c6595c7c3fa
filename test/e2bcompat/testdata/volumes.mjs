// Volumes through the e2b SDK's public API: a volume made with
// Volume.create is written with the volume file API, mounted by sandboxes
// (volumeMounts, by Volume and by name), shared by them and changed from
// inside; it is listed, read and destroyed by ID, which a mounted volume
// refuses. "corral-made" is a volume the test made with Corral's CLI.
import { Sandbox, Volume, VolumeError, VolumeNotFoundError, VolumePathNotFoundError } from 'e2b'
import { check, rejects } from './check.mjs'

const vol = await Volume.create('e2b-made')
check(vol.volumeId === 'e2b-made' && vol.name === 'e2b-made' && vol.token, `created ${JSON.stringify(vol)}`)
const sandboxes = []
try {
  const w = await vol.writeFile('/seed/hello.txt', 'from the volume API')
  check(w.type === 'file' && w.path === '/seed/hello.txt' && w.size === 19, `writeFile: ${JSON.stringify(w)}`)
  check(w.mtime instanceof Date && !isNaN(w.mtime), 'writeFile mtime')

  const sbx = await Sandbox.create('base', { timeoutMs: 120_000, volumeMounts: { '/mnt/data': vol } })
  sandboxes.push(sbx)
  const info = await sbx.getInfo()
  check(info.volumeMounts.length === 1 && info.volumeMounts[0].name === 'e2b-made' && info.volumeMounts[0].path === '/mnt/data',
    `getInfo volumeMounts: ${JSON.stringify(info.volumeMounts)}`)
  const listed = (await Sandbox.list().nextItems()).find((s) => s.sandboxId === sbx.sandboxId)
  check(listed?.volumeMounts?.[0]?.name === 'e2b-made', `list volumeMounts: ${JSON.stringify(listed)}`)

  const cat = await sbx.commands.run('cat /mnt/data/seed/hello.txt')
  check(cat.stdout === 'from the volume API', `the sandbox reads the volume: ${JSON.stringify(cat)}`)
  await sbx.commands.run("mkdir -p /mnt/data/out && printf 'from the sandbox' > /mnt/data/out/result.txt")
  check((await vol.readFile('/out/result.txt')) === 'from the sandbox', 'the volume API reads what the sandbox wrote')
  const bytes = await vol.readFile('/out/result.txt', { format: 'bytes' })
  check(bytes instanceof Uint8Array && bytes.length === 16, 'readFile bytes')

  // A second sandbox names the volume by name and sees the first one's files.
  const other = await Sandbox.create('base', { timeoutMs: 120_000, volumeMounts: { '/data': 'e2b-made' } })
  sandboxes.push(other)
  const seen = await other.commands.run('cat /data/out/result.txt')
  check(seen.stdout === 'from the sandbox', `a second sandbox shares the volume: ${JSON.stringify(seen)}`)

  const entries = await vol.list('/', { depth: 2 })
  const paths = entries.map((e) => e.path)
  for (const p of ['/seed', '/seed/hello.txt', '/out', '/out/result.txt']) check(paths.includes(p), `list depth 2 has ${p}: ${paths}`)
  check(entries.find((e) => e.path === '/out').type === 'directory', 'a directory entry')
  const top = await vol.list('/')
  check(top.every((e) => !e.path.slice(1).includes('/')), `list depth 1: ${top.map((e) => e.path)}`)
  const st = await vol.getInfo('/out/result.txt')
  check(st.type === 'file' && st.size === 16 && st.name === 'result.txt', `getInfo: ${JSON.stringify(st)}`)
  check(await vol.exists('/out/result.txt'), 'exists')
  check(!(await vol.exists('/nope')), 'exists of a missing path')
  await rejects(vol.readFile('/nope.txt'), VolumePathNotFoundError, 'readFile of a missing file')

  const dir = await vol.makeDir('/made/deep', { force: true })
  check(dir.type === 'directory' && dir.path === '/made/deep', `makeDir: ${JSON.stringify(dir)}`)
  check((await other.commands.run('ls -d /data/made/deep')).exitCode === 0, 'the sandbox sees a new directory')
  await vol.remove('/made')
  await rejects(vol.getInfo('/made'), VolumePathNotFoundError, 'getInfo of a removed directory')

  const all = await Volume.list()
  for (const name of ['e2b-made', 'corral-made']) {
    check(all.some((v) => v.volumeId === name && v.name === name), `Volume.list has ${name}: ${JSON.stringify(all)}`)
  }
  const got = await Volume.getInfo('e2b-made')
  check(got.volumeId === 'e2b-made' && got.name === 'e2b-made' && got.token === vol.token, `Volume.getInfo: ${JSON.stringify(got)}`)
  const again = await Volume.connect('e2b-made')
  check((await again.readFile('/seed/hello.txt')) === 'from the volume API', 'a connected volume reads the same files')
  await rejects(Volume.create('e2b-made'), VolumeError, 'create of a name in use')
  await rejects(Volume.getInfo('no-such-volume'), VolumeNotFoundError, 'getInfo of a missing volume')

  await rejects(Volume.destroy('e2b-made'), VolumeError, 'destroy of a mounted volume')
  check((await vol.readFile('/seed/hello.txt')) === 'from the volume API', 'a refused destroy keeps the volume')
  while (sandboxes.length > 0) await sandboxes.pop().kill()
  check((await vol.readFile('/out/result.txt')) === 'from the sandbox', 'the volume outlives its sandboxes')
  check(await Volume.destroy('e2b-made'), 'destroy after the sandboxes are killed')
  check(!(await Volume.destroy('e2b-made')), 'destroy of a destroyed volume')
  await rejects(Volume.getInfo('e2b-made'), VolumeNotFoundError, 'getInfo of a destroyed volume')

  // A volume made with Corral's CLI is an E2B volume of the same name.
  const corral = await Volume.connect('corral-made')
  await corral.writeFile('/note.txt', 'written through E2B')
  check(await Volume.destroy('corral-made'), 'destroy of a Corral-made volume')

  // Left for the test to find with Corral's CLI.
  const kept = await Volume.create('e2b-kept')
  await kept.writeFile('/kept.txt', 'kept')
} finally {
  for (const s of sandboxes) await s.kill()
}
console.log('ok volumes')
