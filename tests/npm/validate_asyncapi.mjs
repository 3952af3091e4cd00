// Validates AsyncAPI documents with the official parser (@asyncapi/parser, installed by
// `make npm-tools` into .npm-tools/): node tests/npm/validate_asyncapi.mjs TOOLS_DIR FILE...
// Prints one JSON line per file: {file, parsed, diagnostics: [{severity, code, message, path}]}
// (severity 0 error, 1 warning, 2 information, 3 hint). Exits 1 when a file does not parse or
// has an error or a warning; 2 when the parser cannot be loaded.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";

const [tools, ...files] = process.argv.slice(2);
let Parser;
try {
  const resolved = createRequire(join(resolve(tools), "package.json")).resolve("@asyncapi/parser");
  ({ Parser } = await import(pathToFileURL(resolved).href));
} catch (error) {
  console.error(`cannot load @asyncapi/parser from ${tools} (run make npm-tools): ${error.message}`);
  process.exit(2);
}

const parser = new Parser();
let failed = false;
for (const file of files) {
  const { document, diagnostics } = await parser.parse(readFileSync(file, "utf8"), { source: file });
  const found = diagnostics.map((d) => ({ severity: d.severity, code: String(d.code), message: d.message,
                                         path: d.path.join(".") }));
  if (!document || found.some((d) => d.severity <= 1)) failed = true;
  console.log(JSON.stringify({ file, parsed: Boolean(document), diagnostics: found }));
}
process.exit(failed ? 1 : 0);
