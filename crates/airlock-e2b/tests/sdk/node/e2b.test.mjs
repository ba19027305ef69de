// The unmodified E2B TypeScript SDKs (e2b 2.51.0, @e2b/code-interpreter 2.8.0) under Node
// against a live `airlock serve` this test starts (AIRLOCK_BIN): two tenants' keys from
// `airlock token new --e2b`, a policy with sessions on (kernel mode) and a short wall time.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { spawn, execFileSync } from 'node:child_process'
import { mkdtempSync, readFileSync, writeFileSync, rmSync, existsSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, dirname } from 'node:path'
import { fileURLToPath } from 'node:url'

const here = dirname(fileURLToPath(import.meta.url))
const repo = join(here, '..', '..', '..', '..', '..')
const WALL_TIME_S = 4
let server, root, keyB, url

function policy() {
  let text = readFileSync(join(repo, 'policy', 'default.toml'), 'utf8')
  for (const [from, to] of [
    ['timeout = "5s"', `timeout = "${WALL_TIME_S}s"`],
    ['allow = []                     # variable names', 'allow = ["GREETING"] # variable names'],
  ]) {
    assert.ok(text.includes(from), `policy/default.toml changed: ${from}`)
    text = text.replace(from, to)
  }
  return text
}

function mint(binary, tenant, tokens) {
  const key = execFileSync(binary, ['token', 'new', '--tenant', tenant, '--e2b', '--tokens-file', tokens], {
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'ignore'],
  }).trim()
  assert.match(key, /^e2b_[0-9a-f]{64}$/)
  return key
}

before(async () => {
  const binary = process.env.AIRLOCK_BIN
  assert.ok(binary && existsSync(binary), 'AIRLOCK_BIN must name the airlock binary')
  root = mkdtempSync(join(tmpdir(), 'airlock-e2b-node-'))
  const tokens = join(root, 'tokens.toml')
  const keyA = mint(binary, 'alice', tokens)
  keyB = mint(binary, 'bob', tokens)
  writeFileSync(join(root, 'policy.toml'), policy())
  server = spawn(binary, ['serve', '--listen', '127.0.0.1:0', '--tokens', tokens, '--policy', join(root, 'policy.toml')], {
    env: { ...process.env, AIRLOCK_STATE_DIR: join(root, 'state') },
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  let log = ''
  url = await new Promise((resolve, reject) => {
    const look = (chunk) => {
      log += chunk
      const found = log.match(/listening on (http:\/\/127\.0\.0\.1:\d+)/)
      if (found) resolve(found[1])
    }
    server.stdout.on('data', look)
    server.stderr.on('data', look)
    server.on('exit', (code) => reject(new Error(`airlock serve exited (${code}):\n${log}`)))
  })
  process.env.E2B_API_URL = url
  process.env.E2B_SANDBOX_URL = url
  process.env.E2B_API_KEY = keyA
})

after(() => {
  server?.kill('SIGTERM')
  if (root) rmSync(root, { recursive: true, force: true })
})

test('lifecycle, streamed commands, exits, timeouts, kills, binary files, tenants', async () => {
  const { Sandbox, CommandExitError, TimeoutError } = await import('e2b')
  const sbx = await Sandbox.create({ timeoutMs: 120_000, envs: { GREETING: 'hello' }, metadata: { who: 'node' } })
  try {
    assert.equal(await sbx.isRunning(), true)
    const info = await sbx.getInfo()
    assert.equal(info.templateId, 'base')
    assert.deepEqual(info.metadata, { who: 'node' })

    // Output arrives while the command still runs.
    const whileRunning = []
    const chunks = []
    const handle = await sbx.commands.run('echo $GREETING; sleep 2; echo last', {
      background: true,
      onStdout: (data) => {
        chunks.push(data)
        if (data === 'hello\n') whileRunning.push(sbx.commands.list().then((ps) => ps.some((p) => p.pid === handle.pid)))
      },
    })
    const done = await handle.wait()
    assert.equal(done.exitCode, 0)
    assert.equal(done.stdout, 'hello\nlast\n')
    assert.deepEqual(await Promise.all(whileRunning), [true])
    assert.deepEqual(chunks, ['hello\n', 'last\n'])

    await assert.rejects(sbx.commands.run('echo oops >&2; exit 3'), (e) => {
      assert.ok(e instanceof CommandExitError)
      assert.equal(e.exitCode, 3)
      assert.equal(e.stderr, 'oops\n')
      return true
    })
    await assert.rejects(sbx.commands.run('sleep 60', { timeoutMs: 1000 }), TimeoutError)
    assert.equal((await sbx.commands.run('echo alive')).stdout, 'alive\n')

    const bg = await sbx.commands.run('sleep 60', { background: true })
    assert.equal(await bg.kill(), true)
    await assert.rejects(bg.wait(), CommandExitError)

    const all = new Uint8Array(256).map((_, i) => i)
    await sbx.files.write('/home/user/all.bin', all.buffer)
    const back = await sbx.files.read('/home/user/all.bin', { format: 'bytes' })
    assert.deepEqual(Buffer.from(back), Buffer.from(all))
    const made = await sbx.commands.run("printf '\\x00\\xff\\x80' > made.bin && sha256sum all.bin | cut -c1-64")
    assert.equal(made.stdout.trim().length, 64)
    assert.deepEqual(Buffer.from(await sbx.files.read('made.bin', { format: 'bytes' })), Buffer.from([0, 255, 128]))
    await assert.rejects(sbx.files.read('/etc/passwd'))
    assert.ok((await sbx.files.list('/home/user')).some((e) => e.name === 'all.bin'))

    // Another tenant's key sees nothing.
    await assert.rejects(Sandbox.connect(sbx.sandboxId, { apiKey: keyB }))
    const theirs = await Sandbox.list({ apiKey: keyB }).nextItems()
    assert.ok(!theirs.some((s) => s.sandboxId === sbx.sandboxId))
  } finally {
    await sbx.kill()
  }
  assert.equal(await sbx.isRunning(), false)
})

test('runCode on the kernel', async () => {
  const { Sandbox } = await import('@e2b/code-interpreter')
  const sbx = await Sandbox.create({ timeoutMs: 120_000 })
  try {
    assert.equal((await sbx.runCode('1+1')).text, '2')
    const out = []
    const execution = await sbx.runCode("print('hi')", { onStdout: (m) => out.push(m.line) })
    assert.deepEqual(execution.logs.stdout, ['hi\n'])
    assert.deepEqual(out, ['hi\n'])
    const failed = await sbx.runCode('1/0')
    assert.equal(failed.error?.name, 'ZeroDivisionError')
  } finally {
    await sbx.kill()
  }
})
