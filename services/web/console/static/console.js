// The operator's console: live regions, buttons, the module install's progress bar.
// No build step, no framework. What the server sends is already escaped HTML (a region's
// fragment); anything taken from a JSON answer is written with textContent, never as HTML.
"use strict";
(() => {
  const csrf = (document.querySelector('meta[name="console-csrf"]') || {}).content || "";
  const liveBadge = document.getElementById("live");
  const MARKS = { green: "✓", amber: "!", red: "✗", grey: "…" };

  function setLive(state, word, colour) {
    if (!liveBadge) return;
    liveBadge.className = "badge c-" + colour;
    liveBadge.dataset.liveState = state;
    liveBadge.textContent = "";
    const mark = document.createElement("span");
    mark.className = "mark";
    mark.setAttribute("aria-hidden", "true");
    mark.textContent = MARKS[colour] || "•";
    liveBadge.append(mark, " " + word);
  }

  function toLogin() {
    location.href = "/console/login?next=" + encodeURIComponent(location.pathname + location.search);
  }

  // --- live regions: [data-live-src] is re-fetched (its fragment) when the feed says so ------
  const regions = Array.from(document.querySelectorAll("[data-live-src]"));

  function refresher(region) {
    let timer = null, busy = false, again = false;
    async function load() {
      if (busy) { again = true; return; }
      busy = true;
      try {
        const response = await fetch(region.dataset.liveSrc, { credentials: "same-origin" });
        if (response.status === 401) { toLogin(); return; }
        if (response.ok) {
          region.innerHTML = await response.text();
          region.dataset.refreshed = String(Date.now());
        }
      } catch (error) {
        // the door is away for a moment: the next event or poll tries again
      } finally {
        busy = false;
        if (again) { again = false; schedule(); }
      }
    }
    function schedule() {
      if (!timer) timer = setTimeout(() => { timer = null; load(); }, 400);
    }
    return schedule;
  }

  const schedules = new Map(regions.map((region) => [region, refresher(region)]));
  const refreshAll = () => schedules.forEach((schedule) => schedule());

  for (const region of regions) {
    const every = Number(region.dataset.livePoll || 0);
    if (every > 0) {
      setInterval(() => {  // not while a confirmation is open there: it would vanish
        if (!region.querySelector(".confirm:not([hidden])")) schedules.get(region)();
      }, every);
      setLive("polling", "every " + every / 1000 + " s", "green");
    }
  }

  const fed = regions.filter((region) => region.dataset.liveFeed !== undefined);
  if (fed.length) {
    const query = fed[0].dataset.liveFeed;
    let fallback = null;
    const feed = new EventSource("/console/events" + (query ? "?" + query : ""));
    feed.onopen = () => setLive("live", "live", "green");
    feed.onmessage = (message) => {
      let event;
      try { event = JSON.parse(message.data); } catch (error) { return; }
      if (event.type === "hello") {  // (re)connected: what happened meanwhile is reloaded
        setLive("live", "live", "green");
        refreshAll();
        return;
      }
      for (const region of fed) {
        const run = region.dataset.liveRun;
        if (!run || event.run === run) schedules.get(region)();
      }
    };
    feed.addEventListener("dropped", () => setLive("reconnecting", "reconnecting", "amber"));
    feed.onerror = () => {
      if (feed.readyState === EventSource.CLOSED) {  // refused (401 …): poll instead
        setLive("polling", "feed refused: polling", "amber");
        if (!fallback) fallback = setInterval(refreshAll, 5000);
      } else {
        setLive("reconnecting", "reconnecting", "amber");
      }
    };
  }

  // --- answers ---------------------------------------------------------------------------
  function count(run, key) { return typeof run[key] === "number" ? run[key] : 0; }

  function summary(status, body) {
    if (!body || typeof body !== "object") return status + ": no answer";
    if (typeof body.error === "string") return status + ": " + body.error;
    if (body.run && typeof body.run === "object") {
      const run = body.run;
      return status + ": cleanup " + String(run.cleanupStatus) + " — claimed " + count(run, "claimed") +
        ", given back " + count(run, "reverted") + ", someone else moved " + count(run, "drifted") +
        ", failed " + count(run, "failed") + ", transient " + count(run, "transient") +
        (Array.isArray(run.failures) && run.failures.length ? "; " + JSON.stringify(run.failures).slice(0, 400) : "");
    }
    if (body.action && body.module) return status + ": " + String(body.action) + " " + String(body.module.id) + " " + String(body.module.version);
    if (body.removed) return status + ": removed " + String(body.removed.id) + " " + String(body.removed.version);
    return status + ": " + JSON.stringify(body).slice(0, 600);
  }

  function answer(selector, status, body) {
    const out = document.querySelector(selector || "#answer");
    if (!out) return;
    out.textContent = summary(status, body);
    out.className = status >= 200 && status < 300 ? "succeeded" : "failed";
    out.dataset.status = String(status);
  }

  function waiting(selector) {
    const out = document.querySelector(selector || "#answer");
    if (!out) return;
    out.textContent = "asked; waiting for the answer…";
    out.className = "waiting";
    out.dataset.status = "";
  }

  async function post(url, body) {
    const response = await fetch(url, {
      method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-Console-Csrf": csrf },
      body: JSON.stringify(body || {}),
    });
    if (response.status === 401) { toLogin(); return [401, null]; }
    let data = null;
    try { data = await response.json(); } catch (error) { data = { error: "the answer is not JSON" }; }
    return [response.status, data];
  }

  document.addEventListener("click", async (event) => {
    const button = event.target.closest("[data-action]");
    if (!button) return;
    if (button.dataset.action === "reveal") {
      const target = document.querySelector(button.dataset.target);
      if (target) target.hidden = !target.hidden;
      return;
    }
    if (button.dataset.action !== "post") return;
    button.disabled = true;
    waiting(button.dataset.answer);
    try {
      const [status, body] = await post(button.dataset.url, {});
      answer(button.dataset.answer, status, body);
    } catch (error) {
      answer(button.dataset.answer, 0, { error: "the door did not answer (" + error + ")" });
    } finally {
      button.disabled = false;
      refreshAll();
    }
  });

  // --- the module install, with its progress bar (installer.progress) -------------------
  const STAGES = ["manifest", "download", "inspect", "unpack", "done"];
  const form = document.getElementById("install-form");
  if (form) {
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const url = document.getElementById("manifest-url").value.trim();
      const box = document.getElementById("install-progress");
      const bar = document.getElementById("install-bar");
      const stage = document.getElementById("install-stage");
      const button = document.getElementById("install-button");
      const bytes = new Uint8Array(8);
      crypto.getRandomValues(bytes);
      const requestId = "console-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
      box.hidden = false;
      box.dataset.stages = "";
      bar.value = 0;
      stage.textContent = "starting";
      button.disabled = true;
      waiting("#answer");
      const progress = new EventSource("/console/api/install-progress/" + requestId);
      await new Promise((resolve) => {
        progress.addEventListener("ready", resolve, { once: true });
        progress.onerror = resolve;
        setTimeout(resolve, 3000);
      });
      progress.onmessage = (message) => {
        let p;
        try { p = JSON.parse(message.data); } catch (error) { return; }
        const index = Math.max(0, STAGES.indexOf(p.stage));
        const part = typeof p.total === "number" && p.total > 0 && typeof p.done === "number" ? Math.min(1, p.done / p.total) : 0.5;
        bar.value = p.stage === "done" ? 100 : Math.round(((index + part) / (STAGES.length - 1)) * 100);
        stage.textContent = String(p.stage) + (typeof p.total === "number" ? " " + p.done + " / " + p.total : "");
        if (!box.dataset.stages.split(" ").includes(String(p.stage))) box.dataset.stages = (box.dataset.stages + " " + p.stage).trim();
      };
      try {
        const [status, body] = await post("/console/api/module/install", { url: url, requestId: requestId });
        answer("#answer", status, body);
        if (status >= 200 && status < 300) { bar.value = 100; stage.textContent = "done"; }
        else stage.textContent = "failed";
      } catch (error) {
        answer("#answer", 0, { error: "the door did not answer (" + error + ")" });
      } finally {
        setTimeout(() => progress.close(), 500);
        button.disabled = false;
        refreshAll();
      }
    });
  }
})();
