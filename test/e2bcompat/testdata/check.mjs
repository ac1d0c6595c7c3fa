// Tiny assertions for the compatibility scripts.
export function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`)
}

// rejects awaits p and checks that it fails with an error matching want
// (a RegExp for the message, or an error class).
export async function rejects(p, want, what) {
  try {
    await p
  } catch (err) {
    const ok = want instanceof RegExp ? want.test(String(err?.message)) : err instanceof want
    if (!ok) throw new Error(`check failed: ${what}: unexpected error ${err?.name}: ${err?.message}`)
    return err
  }
  throw new Error(`check failed: ${what}: no error`)
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

// until polls cond every 50 ms for up to ms.
export async function until(cond, ms, what) {
  const end = Date.now() + ms
  while (Date.now() < end) {
    if (await cond()) return
    await sleep(50)
  }
  throw new Error(`check failed: ${what}: timed out after ${ms} ms`)
}
