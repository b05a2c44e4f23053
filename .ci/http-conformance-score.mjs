// Scores results of the HTTP cache test suite (http-tests/cache-tests) the
// way cache-tests.fyi's table counts them for a reverse proxy: every test
// that is not browser_only applies (cdn_only ones included: the suite runs
// them on reverse proxies too); a test is passed when its result is true
// (a passed "check" included), whatever its dependencies say; "required"
// is kind required, or no kind.
//
//   node http-conformance-score.mjs SUITE_DIR RESULTS.json [NAME]
//   node http-conformance-score.mjs SUITE_DIR --published
//   node http-conformance-score.mjs SUITE_DIR --failures RESULTS.json
//
// SUITE_DIR is the suite's package or checkout. --published scores the
// result files the suite publishes (its results directory), with the same
// counting, so the figures can be checked against cache-tests.fyi.
// --failures lists each test that applies and did not pass, with its
// kind, suite and the result's message.
import fs from 'fs'
import path from 'path'
import { pathToFileURL } from 'url'

const [suiteDir, arg, third] = process.argv.slice(2)
if (!suiteDir || !arg) {
  console.error('usage: node http-conformance-score.mjs SUITE_DIR (RESULTS.json [NAME] | --published | --failures RESULTS.json)')
  process.exit(2)
}
const index = path.join(suiteDir, 'tests', 'index.mjs')
const suites = (await import(pathToFileURL(index))).default
if (!fs.existsSync(path.join(suiteDir, 'test-engine'))) {
  // Older packages run surrogate-control tests beside index.mjs's.
  const sc = path.join(suiteDir, 'tests', 'surrogate-control.mjs')
  if (fs.existsSync(sc)) suites.push((await import(pathToFileURL(sc))).default)
}

const applies = []
for (const s of suites) {
  for (const t of s.tests) {
    if (t.browser_only !== true) applies.push({ ...t, suite: s.id })
  }
}
const isRequired = t => t.kind === undefined || t.kind === 'required'
const requiredCount = applies.filter(isRequired).length

function score (results) {
  let passed = 0
  let required = 0
  for (const t of applies) {
    if (results[t.id] === true) {
      passed++
      if (isRequired(t)) required++
    }
  }
  return { passed, applies: applies.length, required, requiredApplies: requiredCount }
}

function line (name, s) {
  return `${name.padEnd(24)} ${String(s.passed).padStart(3)} / ${s.applies}   required ${String(s.required).padStart(3)} / ${s.requiredApplies}`
}

const read = f => JSON.parse(fs.readFileSync(f, 'utf8'))

if (arg === '--published') {
  const dir = path.join(suiteDir, 'results')
  const list = (await import(pathToFileURL(path.join(dir, 'index.mjs')))).default
  for (const item of list) {
    if (item.type === 'browser') continue
    console.log(line(`${item.name} (${item.type})`, score(read(path.join(dir, item.file)))))
  }
} else if (arg === '--failures') {
  const results = read(third)
  for (const t of applies) {
    const r = results[t.id]
    if (r === true) continue
    const why = r === undefined ? 'not run' : Array.isArray(r) ? r.join(': ') : String(r)
    console.log(`${t.id}\t${t.kind || 'required'}\t${t.suite}\t${why}`)
  }
} else {
  console.log(line(third || 'herd', score(read(arg))))
}
