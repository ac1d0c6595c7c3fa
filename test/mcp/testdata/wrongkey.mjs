// A client with a wrong API key cannot open a session at /mcp: the
// daemon refuses it with 401 before the MCP server sees it.
import { StreamableHTTPError } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { check, connect, rejects } from './client.mjs'

for (const key of ['wrong-key', '']) {
  const err = await rejects(connect(key), `connecting with key ${JSON.stringify(key)}`)
  check(err instanceof StreamableHTTPError && err.code === 401, `key ${JSON.stringify(key)}: ${err.name} ${err.code}: ${err.message}`)
}
console.log(JSON.stringify({}))
