// One MCP session that uses the tools and resources as an agent would,
// over the transport MCP_TRANSPORT names, in the session's own sandbox.
// It prints {"session": ID}: the Go test checks that the sandbox is gone
// once the session ended.
import { ErrorCode } from '@modelcontextprotocol/sdk/types.js'
import { check, connect, disconnect, failed, rejects, succeeded, text } from './client.mjs'

const conn = await connect()
const call = (name, args = {}) => conn.client.callTool({ name, arguments: args })
let session
try {
  const { tools } = await conn.client.listTools()
  const want = ['code_context_create', 'exec', 'files_list', 'files_read', 'files_remove', 'files_write', 'fork',
    'port_url', 'process_kill', 'process_list', 'process_output', 'process_start', 'run_code', 'sandbox_create',
    'sandbox_kill', 'sandbox_list', 'sandbox_pause', 'sandbox_resume', 'snapshot']
  const names = tools.map((t) => t.name).sort()
  check(names.join() === want.join(), `tools: ${names.join()}`)
  for (const t of tools) {
    check(t.inputSchema?.type === 'object' && t.description, `${t.name}: ${JSON.stringify(t)}`)
  }

  // exec creates the session's sandbox and keeps using it.
  let res = succeeded(await call('exec', { command: 'echo hi; echo err >&2; exit 3' }), 'exec')
  check(text(res).includes('exit_code: 3') && text(res).includes('hi') && text(res).includes('err'), `exec: ${text(res)}`)
  const x = res.structuredContent
  check(x.exit_code === 3 && x.stdout === 'hi\n' && x.stderr === 'err\n', `exec: ${JSON.stringify(x)}`)
  session = x.sandbox_id
  check(session, `exec names no sandbox: ${JSON.stringify(x)}`)
  res = succeeded(await call('exec', { command: 'true' }), 'second exec')
  check(res.structuredContent.sandbox_id === session, `second exec ran in ${res.structuredContent.sandbox_id}, not ${session}`)

  // Files: write, read, list, remove.
  const content = 'line one\nline two\n'
  res = succeeded(await call('files_write', { path: '/tmp/mcp/notes.txt', content }), 'files_write')
  check(res.structuredContent.size === content.length, `files_write: ${text(res)}`)
  res = succeeded(await call('files_read', { path: '/tmp/mcp/notes.txt' }), 'files_read')
  check(text(res) === content && res.structuredContent.content === content, `files_read: ${JSON.stringify(text(res))}`)
  res = succeeded(await call('files_read', { path: '/tmp/mcp/notes.txt', offset: 9, length: 4 }), 'files_read part')
  check(res.structuredContent.content === 'line' && res.structuredContent.end === 13, `files_read part: ${text(res)}`)
  res = succeeded(await call('files_list', { path: '/tmp/mcp' }), 'files_list')
  const entries = res.structuredContent.entries
  check(entries.length === 1 && entries[0].name === 'notes.txt' && entries[0].type === 'file' && entries[0].size === content.length,
    `files_list: ${JSON.stringify(entries)}`)
  check(text(res).includes('notes.txt'), `files_list: ${text(res)}`)
  succeeded(await call('files_remove', { path: '/tmp/mcp/notes.txt' }), 'files_remove')
  failed(await call('files_read', { path: '/tmp/mcp/notes.txt' }), 'not_found', 'files_read of a removed file')
  res = succeeded(await call('files_list', { path: '/tmp/mcp' }), 'files_list after remove')
  check(res.structuredContent.count === 0, `files_list after remove: ${text(res)}`)

  // A background process, read as it runs from where the last read ended.
  res = succeeded(await call('process_start', { command: 'i=0; while true; do i=$((i+1)); echo "tick $i"; sleep 0.1; done' }), 'process_start')
  const pid = res.structuredContent.pid
  check(pid > 0 && res.structuredContent.sandbox_id === session, `process_start: ${JSON.stringify(res.structuredContent)}`)
  let out = ''
  let offset = 0
  for (let reads = 0; reads < 3 || !out.includes('tick 5\n'); reads++) {
    check(reads < 50, `process_output after ${reads} reads: ${JSON.stringify(out)}`)
    res = succeeded(await call('process_output', { pid, offset, wait_seconds: 5 }), 'process_output')
    const o = res.structuredContent
    check(o.running === true && o.next_offset === offset + Buffer.byteLength(o.output), `process_output at ${offset}: ${JSON.stringify(o)}`)
    check(text(res).includes(o.output) && text(res).includes(`next_offset=${o.next_offset}`), `process_output text: ${text(res)}`)
    out += o.output
    offset = o.next_offset
  }
  // Read on from each next_offset, the pieces join up without a gap or a
  // repeat.
  const ticks = out.trimEnd().split('\n')
  check(ticks.every((l, i) => l === `tick ${i + 1}`), `output read on in pieces: ${JSON.stringify(out)}`)
  res = succeeded(await call('process_list'), 'process_list')
  check(res.structuredContent.processes.some((p) => p.pid === pid && p.running), `process_list: ${text(res)}`)
  succeeded(await call('process_kill', { pid }), 'process_kill')
  for (let reads = 0; ; reads++) {
    check(reads < 20, `the process still runs after process_kill: ${text(res)}`)
    res = succeeded(await call('process_output', { pid, offset, wait_seconds: 2 }), 'process_output after kill')
    offset = res.structuredContent.next_offset
    if (res.structuredContent.running === false) break
  }

  // Errors are tool results with the API's code.
  failed(await call('exec', { command: 'true', sandbox_id: 'no-such-sandbox' }), 'not_found', 'exec in an unknown sandbox')
  res = failed(await call('sandbox_create', { runtime: 'gvisor' }), 'permission_denied', 'sandbox_create on a runtime not allowed')
  check(text(res).includes('runc'), `the refusal names the allowed runtime: ${text(res)}`)
  failed(await call('files_read', { path: '/etc/hostname', offset: -1 }), 'invalid_argument', 'files_read at a negative offset')

  // Resources: the caller's sandboxes, each with its state.
  const { resources } = await conn.client.listResources()
  const uris = resources.map((r) => r.uri)
  check(uris.includes('corral://sandboxes') && uris.includes(`corral://sandboxes/${session}`), `resources: ${uris.join()}`)
  const { resourceTemplates } = await conn.client.listResourceTemplates()
  check(resourceTemplates.some((r) => r.uriTemplate === 'corral://sandboxes/{id}'), `resource templates: ${JSON.stringify(resourceTemplates)}`)
  let r = await conn.client.readResource({ uri: `corral://sandboxes/${session}` })
  const sb = JSON.parse(r.contents[0].text)
  check(r.contents[0].mimeType === 'application/json' && sb.sandbox_id === session && sb.state === 'running' && sb.session === true,
    `resource of the session sandbox: ${r.contents[0].text}`)
  r = await conn.client.readResource({ uri: 'corral://sandboxes' })
  check(JSON.parse(r.contents[0].text).some((s) => s.sandbox_id === session), `corral://sandboxes: ${r.contents[0].text}`)
  // An unknown resource is the protocol error of SEP-2164: -32602 (Invalid
  // Params), with the URI in the error's data.
  const unknown = 'corral://sandboxes/no-such-sandbox'
  const err = await rejects(conn.client.readResource({ uri: unknown }), 'reading an unknown sandbox')
  check(err.code === ErrorCode.InvalidParams && err.data?.uri === unknown, `reading an unknown sandbox: ${err.code} ${err.message} ${JSON.stringify(err.data)}`)
} finally {
  await disconnect(conn)
}
console.log(JSON.stringify({ session }))
