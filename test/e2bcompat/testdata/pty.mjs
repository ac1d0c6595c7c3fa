// A terminal through the e2b SDK's public API: create, input, resize, kill.
import { Sandbox } from 'e2b'
import { check, until } from './check.mjs'

const sbx = await Sandbox.create('base')
try {
  let out = ''
  const dec = new TextDecoder()
  const term = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += dec.decode(d) } })
  check(term.pid > 0, 'pty pid')
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode('echo pty-$((6*7))\n'))
  await until(() => out.includes('pty-42'), 5000, `pty output ${JSON.stringify(out)}`)
  await sbx.pty.resize(term.pid, { cols: 100, rows: 30 })
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode('stty size\n'))
  await until(() => out.includes('30 100'), 5000, `size after resize ${JSON.stringify(out)}`)
  check(await sbx.pty.kill(term.pid), 'pty kill')
} finally {
  await sbx.kill()
}
console.log('ok pty')
