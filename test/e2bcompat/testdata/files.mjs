// Files through the e2b SDK's public API: write, read, list, exists,
// info, makeDir, rename, remove, and watchDir.
import { Sandbox, FileNotFoundError } from 'e2b'
import { check, rejects, until } from './check.mjs'

const sbx = await Sandbox.create('base')
try {
  const w = await sbx.files.write('/home/test/hello.txt', 'Hello, Corral!')
  check(w.path === '/home/test/hello.txt' && w.name === 'hello.txt', `write info ${JSON.stringify(w)}`)
  check((await sbx.files.read('/home/test/hello.txt')) === 'Hello, Corral!', 'read text')

  const bin = new Uint8Array([0, 1, 2, 254, 255])
  const many = await sbx.files.write([
    { path: '/data/a.txt', data: 'A' },
    { path: '/data/sub/b.bin', data: bin },
  ])
  check(many.length === 2, 'write two files')
  const back = await sbx.files.read('/data/sub/b.bin', { format: 'bytes' })
  check(back.length === bin.length && back.every((v, i) => v === bin[i]), 'read bytes')

  const rel = await sbx.files.write('relative.txt', 'R')
  check(rel.path.endsWith('/relative.txt') && rel.path.startsWith('/'), `relative path resolved to ${rel.path}`)
  check((await sbx.files.read('relative.txt')) === 'R', 'read relative path')

  const entries = await sbx.files.list('/data')
  check(JSON.stringify(entries.map((e) => [e.name, e.type])) === '[["a.txt","file"],["sub","dir"]]', `list ${JSON.stringify(entries)}`)
  const deep = await sbx.files.list('/data', { depth: 2 })
  check(deep.some((e) => e.path === '/data/sub/b.bin' && e.size === 5), 'list depth 2')

  check(await sbx.files.exists('/data/a.txt'), 'exists')
  check(!(await sbx.files.exists('/data/none')), 'not exists')
  const info = await sbx.files.getInfo('/data/a.txt')
  check(info.type === 'file' && info.size === 1 && info.permissions === '-rw-r--r--' && info.modifiedTime instanceof Date, `getInfo ${JSON.stringify(info)}`)

  check((await sbx.files.makeDir('/data/newdir')) === true, 'makeDir')
  check((await sbx.files.makeDir('/data/newdir')) === false, 'makeDir of an existing directory')
  const moved = await sbx.files.rename('/data/a.txt', '/data/c.txt')
  check(moved.name === 'c.txt', 'rename')
  await sbx.files.remove('/data/c.txt')
  check(!(await sbx.files.exists('/data/c.txt')), 'removed')
  await rejects(sbx.files.read('/data/nope.txt'), FileNotFoundError, 'read a missing file')

  const events = []
  const handle = await sbx.files.watchDir('/data', (e) => events.push(e), { recursive: true })
  await sbx.files.write('/data/watched.txt', 'x')
  await sbx.commands.run('echo y > /data/sub/deep.txt')
  await until(() => events.some((e) => e.name === 'watched.txt' && e.type === 'create'), 5000, `watch event for watched.txt: ${JSON.stringify(events)}`)
  await until(() => events.some((e) => e.name === 'sub/deep.txt'), 5000, `recursive watch event: ${JSON.stringify(events)}`)
  await handle.stop()
} finally {
  await sbx.kill()
}
console.log('ok files')
