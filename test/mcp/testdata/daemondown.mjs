// `corral mcp` whose daemon is down answers a tool call at once, with the
// tool error unavailable: not a protocol error, not a hang.
import { check, connect, disconnect, failed, text } from './client.mjs'

const conn = await connect()
try {
  const start = Date.now()
  const res = failed(await conn.client.callTool({ name: 'exec', arguments: { command: 'true' } }), 'unavailable', 'exec without a daemon')
  check(Date.now() - start < 10_000, `exec without a daemon took ${Date.now() - start} ms`)
  check(text(res).includes('CORRAL_HOST'), `the error says what to check: ${text(res)}`)
} finally {
  await disconnect(conn)
}
console.log(JSON.stringify({}))
