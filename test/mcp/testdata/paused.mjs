// The session's sandbox, paused, comes back on the next call as the same
// sandbox with its files, and still without a deadline: it ends with the
// session or its idle timeout, never by the daemon's default timeout.
import { check, connect, disconnect, succeeded } from './client.mjs'

const conn = await connect()
const call = (name, args = {}) => conn.client.callTool({ name, arguments: args })
const read = async (id) => JSON.parse((await conn.client.readResource({ uri: `corral://sandboxes/${id}` })).contents[0].text)
let session
try {
  let res = succeeded(await call('exec', { command: 'echo kept > /tmp/kept' }), 'exec')
  session = res.structuredContent.sandbox_id
  let sb = await read(session)
  check(sb.state === 'running' && sb.deadline === undefined && sb.idle_timeout > 0, `a new session sandbox: ${JSON.stringify(sb)}`)
  res = succeeded(await call('sandbox_pause', { sandbox_id: session }), 'sandbox_pause')
  check(res.structuredContent.state === 'paused', `sandbox_pause: ${JSON.stringify(res.structuredContent)}`)
  res = succeeded(await call('exec', { command: 'cat /tmp/kept' }), 'exec after the pause')
  check(res.structuredContent.sandbox_id === session && res.structuredContent.stdout === 'kept\n', `exec after the pause: ${JSON.stringify(res.structuredContent)}`)
  sb = await read(session)
  check(sb.state === 'running' && sb.deadline === undefined,
    `the session sandbox, resumed by a call, is to be destroyed at ${sb.deadline} (on_deadline ${sb.on_deadline})`)
} finally {
  await disconnect(conn)
}
console.log(JSON.stringify({ session }))
