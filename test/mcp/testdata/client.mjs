// The connection to Corral's MCP server and small assertions, shared by
// the scripts. Everything here uses the SDK's public API only.
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'

// connect returns a client of one new session over the transport
// MCP_TRANSPORT names: "stdio" spawns `$CORRAL_BIN mcp $MCP_STDIO_ARGS`
// against the daemon at CORRAL_HOST, as a desktop agent would; "http"
// reaches the streamable HTTP endpoint MCP_URL with key as a bearer token.
export async function connect(key = process.env.MCP_API_KEY) {
  let transport
  switch (process.env.MCP_TRANSPORT) {
    case 'stdio':
      transport = new StdioClientTransport({
        command: process.env.CORRAL_BIN,
        args: ['mcp', ...JSON.parse(process.env.MCP_STDIO_ARGS ?? '[]')],
        env: { CORRAL_HOST: process.env.CORRAL_HOST },
      })
      break
    case 'http':
      transport = new StreamableHTTPClientTransport(new URL(process.env.MCP_URL), {
        requestInit: { headers: { Authorization: `Bearer ${key}` } },
      })
      break
    default:
      throw new Error(`MCP_TRANSPORT is ${JSON.stringify(process.env.MCP_TRANSPORT)}, not stdio or http`)
  }
  const client = new Client({ name: 'corral-test', version: '1.0.0' })
  await client.connect(transport)
  return { client, transport }
}

// disconnect ends the session the way each transport's client does: over
// HTTP with a DELETE of the session (the spec's explicit end), over stdio
// by closing the server's stdin.
export async function disconnect({ client, transport }) {
  if (transport instanceof StreamableHTTPClientTransport) await transport.terminateSession()
  await client.close()
}

// text joins the text content of a tool result.
export function text(res) {
  return res.content.filter((c) => c.type === 'text').map((c) => c.text).join('')
}

export function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`)
}

// succeeded checks that a tool result is no error and returns it.
export function succeeded(res, what) {
  check(res.isError !== true, `${what}: ${text(res)}`)
  return res
}

// failed checks that a tool result is the error code, as text and as
// structured content.
export function failed(res, code, what) {
  check(res.isError === true, `${what}: no error: ${text(res)}`)
  check(text(res).startsWith(`error ${code}: `), `${what}: ${JSON.stringify(text(res))}, want "error ${code}: ..."`)
  const e = res.structuredContent?.error
  check(e?.code === code && e.message !== '', `${what}: structured content ${JSON.stringify(res.structuredContent)}`)
  return res
}

// rejects awaits p and checks that it fails; it returns the error.
export async function rejects(p, what) {
  try {
    await p
  } catch (err) {
    return err
  }
  throw new Error(`check failed: ${what}: no error`)
}
