// Arguments that a tool's input schema refuses are tool errors of the same
// shape as every other (docs/MCP.md: "Arguments that do not match a tool's
// schema are refused the same way"): "error invalid_argument: ..." with
// the code in the structured content, so that a program can tell them.
import { check, connect, disconnect, failed } from './client.mjs'

const conn = await connect()
try {
  const refused = [
    ['files_read', { path: '/etc/hostname', offset: 'abc' }, 'an offset that is no number'],
    ['files_read', {}, 'a missing path'],
    ['exec', { command: 'true', shell: 'bash' }, 'an argument exec does not take'],
  ]
  const problems = []
  for (const [name, args, what] of refused) {
    const res = await conn.client.callTool({ name, arguments: args })
    try {
      failed(res, 'invalid_argument', `${name} with ${what}`)
    } catch (err) {
      problems.push(err.message.replace(/^check failed: /, ''))
    }
  }
  check(problems.length === 0, problems.join('\n'))
} finally {
  await disconnect(conn)
}
console.log(JSON.stringify({}))
