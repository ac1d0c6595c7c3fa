// run_code in the session's own sandbox, whose template (the server's
// default) has the code interpreter: state between calls, contexts and a
// chart as an image. It prints {"session": ID}.
import { check, connect, disconnect, succeeded, text } from './client.mjs'

const conn = await connect()
const call = (name, args = {}) => conn.client.callTool({ name, arguments: args })
let session
try {
  let res = succeeded(await call('run_code', { code: 'x = 6*7\nx' }), 'run_code')
  session = res.structuredContent.sandbox_id
  check(text(res).includes('result:\n42\n') && res.structuredContent.results[0]?.text === '42', `run_code: ${text(res)}`)
  res = succeeded(await call('run_code', { code: 'x + 1' }), 'run_code again')
  check(text(res).includes('result:\n43\n') && res.structuredContent.sandbox_id === session, `variables stay: ${text(res)}`)

  res = succeeded(await call('run_code', { code: 'print("out")\n1/0' }), 'run_code raising')
  check(res.structuredContent.error?.name === 'ZeroDivisionError' && text(res).includes('stdout:\nout\n'), `an exception: ${text(res)}`)

  res = succeeded(await call('code_context_create', {}), 'code_context_create')
  const context = res.structuredContent.context_id
  res = succeeded(await call('run_code', { code: '"x" in globals()', context_id: context }), 'run_code in a new context')
  check(res.structuredContent.results[0]?.text === 'False', `a new context has its own variables: ${text(res)}`)

  res = succeeded(await call('run_code', { code: 'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [2, 4, 8])\nplt.title("growth")\nplt.show()' }), 'a chart')
  const images = res.content.filter((c) => c.type === 'image')
  check(images.length === 1 && images[0].mimeType === 'image/png', `a chart: ${JSON.stringify(res.content.map((c) => [c.type, c.mimeType]))}`)
  const png = Buffer.from(images[0].data, 'base64')
  check(png.length > 1000 && png.subarray(0, 8).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])), `a chart is no PNG: ${png.length} bytes`)
  check(text(res).includes('image/png'), `the text tells of the image: ${text(res)}`)
} finally {
  await disconnect(conn)
}
console.log(JSON.stringify({ session }))
