// A website calling the web door through types generated from its OpenAPI document
// (docs/web.md, "The OpenAPI document"):
//
//   npx openapi-typescript@7.13.0 docs/openapi/web.json --default-non-nullable false -o web-api.ts
//
// tests/web/test_typed_client.py generates web-api.ts beside this file and type-checks both
// with `tsc --noEmit` (tsconfig.json): a route, a field or a status the document no longer
// has fails the suite.
import type { components, paths } from "./web-api";

type Json<T> = T extends { content: { "application/json": infer Body } } ? Body : never;
type ErrorBody = components["schemas"]["Error"];

type CreateRun = NonNullable<paths["/runs"]["post"]["requestBody"]>["content"]["application/json"];
type Created = Json<paths["/runs"]["post"]["responses"]["200"]>;
type Console = Json<paths["/runs/{runId}"]["get"]["responses"]["200"]>;
type ConsoleQuery = NonNullable<paths["/runs/{runId}"]["get"]["parameters"]["query"]>;
type Guilds = Json<paths["/shards/{shard}/guilds"]["get"]["responses"]["200"]>;

/** What the door answered: the success's body, or the error's with its status. */
type Answer<T> = { ok: true; body: T } | { ok: false; status: number; error: ErrorBody };

export class Door {
  constructor(private readonly url: string, private readonly token: string) {}

  private async call<T>(method: "GET" | "POST", path: string, body?: unknown): Promise<Answer<T>> {
    const init: RequestInit = {
      method,
      headers: { Authorization: `Bearer ${this.token}`, "Content-Type": "application/json" },
    };
    if (body !== undefined) init.body = JSON.stringify(body);
    const response = await fetch(this.url + path, init);
    const value: unknown = await response.json();
    return response.ok ? { ok: true, body: value as T }
                       : { ok: false, status: response.status, error: value as ErrorBody };
  }

  /** POST /runs: create (or find again) a run. */
  createRun(run: CreateRun): Promise<Answer<Created>> {
    return this.call<Created>("POST", "/runs", run);
  }

  /** GET /runs/{runId}: the run, a page of its resources and their counts. */
  runConsole(runId: string, query: ConsoleQuery = {}): Promise<Answer<Console>> {
    const search = new URLSearchParams();
    if (query.after !== undefined) search.set("after", String(query.after));
    if (query.limit !== undefined) search.set("limit", String(query.limit));
    const tail = search.size ? `?${search}` : "";
    return this.call<Console>("GET", `/runs/${encodeURIComponent(runId)}${tail}`);
  }

  /** GET /shards/{shard}/guilds: the guild board, an array of the shard's frames. */
  guilds(shard: string): Promise<Answer<Guilds>> {
    return this.call<Guilds>("GET", `/shards/${encodeURIComponent(shard)}/guilds`);
  }
}

export async function example(door: Door): Promise<string[]> {
  const lines: string[] = [];
  const created = await door.createRun({ runId: "r42", shard: "uo1", event: "invasion" });
  if (!created.ok) {
    return [`${created.status}: ${created.error.error}`];
  }
  const run = created.body.run;
  lines.push(`${run.runId} on ${run.shard}: ${run.status}, cleanup ${run.cleanupStatus}`);
  const page = await door.runConsole(run.runId, { limit: 100 });
  if (page.ok) {
    lines.push(`${page.body.unresolved} unresolved, next page after ${page.body.next ?? "none"}`);
    for (const row of page.body.resources) lines.push(`  ${row.module} ${row.kind} ${row.ref}: ${row.status}`);
  }
  const guilds = await door.guilds(run.shard);
  if (guilds.ok) lines.push(`${guilds.body.length} guilds on ${run.shard}`);
  return lines;
}
