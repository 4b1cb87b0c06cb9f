// cpuaccel dashboard: the runs list (/) and one run's live page (/run/<id>).
// Plain JS, no build step, no request outside this server. Everything the server
// sends is set with textContent (log lines are hostile text), never as HTML.
"use strict";
(function () {
  const TOKEN_KEY = "cpuaccel-token";
  const POLL_MS = 1000;
  const LIST_POLL_MS = 3000;
  const TAIL = 5; // log lines per rank
  const ENDED = new Set(["succeeded", "failed", "stopped", "timeout", "lost", "interrupted"]);

  const $ = (id) => document.getElementById(id);
  const Charts = window.cpuaccelCharts; // charts.js
  let token = takeToken();

  // The token comes once in the query string (the URL the server printed): kept in
  // localStorage, then taken out of the address bar so it is not bookmarked or shared.
  function takeToken() {
    const params = new URLSearchParams(location.search);
    const given = params.get("token");
    if (given) {
      try { localStorage.setItem(TOKEN_KEY, given); } catch (e) { /* private mode: memory only */ }
      params.delete("token");
      const query = params.toString();
      history.replaceState(null, "", location.pathname + (query ? "?" + query : "") + location.hash);
      return given;
    }
    try { return localStorage.getItem(TOKEN_KEY) || ""; } catch (e) { return ""; }
  }

  class ApiError extends Error {
    constructor(status, message, fix) {
      super(message);
      this.status = status;
      this.fix = fix || "";
    }
  }

  async function api(path, method) {
    let answer;
    try {
      answer = await fetch(path, {
        method: method || "GET",
        headers: { "X-Cpuaccel-Token": token },
        cache: "no-store",
        credentials: "omit",
      });
    } catch (e) {
      throw new ApiError(0, "the dashboard server does not answer", "is cpuaccel dashboard still running?");
    }
    let doc = null;
    try { doc = await answer.json(); } catch (e) { doc = null; }
    if (answer.status === 403) {
      throw new ApiError(403, "open the URL cpuaccel dashboard printed", "this page has no valid token for this server");
    }
    if (!answer.ok) {
      const what = doc && typeof doc.error === "string" ? doc.error : "HTTP " + answer.status;
      throw new ApiError(answer.status, what, doc && typeof doc.fix === "string" ? doc.fix : "");
    }
    return doc;
  }

  function showMessage(err) {
    const box = $("message");
    if (err.status === 403) {
      // Nothing of the run can be shown without the token: the message alone.
      $("list-view").hidden = true;
      $("run-view").hidden = true;
    }
    box.textContent = err.fix ? err.message + " (" + err.fix + ")" : err.message;
    box.dataset.status = String(err.status);
    box.hidden = false;
  }

  function clearMessage() {
    const box = $("message");
    if (!box.hidden) { box.hidden = true; box.textContent = ""; }
  }

  function setLive(what) {
    const live = $("live");
    if (live.dataset.live === what) return;
    live.dataset.live = what;
    live.textContent = what === "polling" ? "live" : what === "ended" ? "ended" : what === "error" ? "offline" : "";
  }

  // Text setters that touch the DOM only when the text changed (polled every second).
  function setText(node, text) {
    if (node.textContent !== text) node.textContent = text;
  }

  function fmtNumber(value, digits) {
    if (value === null || value === undefined || !isFinite(value)) return "–";
    const abs = Math.abs(value);
    if (abs !== 0 && (abs < 1e-3 || abs >= 1e6)) return value.toExponential(2);
    return Number(value.toFixed(digits)).toString();
  }

  function fmtDuration(seconds) {
    if (seconds === null || seconds === undefined || !isFinite(seconds)) return "–";
    const s = Math.max(0, Math.round(seconds));
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
    if (h) return h + "h " + String(m).padStart(2, "0") + "m";
    if (m) return m + "m " + String(r).padStart(2, "0") + "s";
    return r + "s";
  }

  function fmtTime(epoch) {
    if (!epoch) return "–";
    const d = new Date(epoch * 1000);
    const pad = (n) => String(n).padStart(2, "0");
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
      pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
  }

  function shape(row) {
    return (row.nodes ?? "?") + " × " + (row.ppn ?? "?");
  }

  function cell(tag, text, className) {
    const node = document.createElement(tag);
    if (text !== undefined) node.textContent = text;
    if (className) node.className = className;
    return node;
  }

  // ---- runs list ------------------------------------------------------------------

  async function listView() {
    $("list-view").hidden = false;
    setText($("where"), "runs");
    document.title = "runs · cpuaccel";
    const body = $("runs").tBodies[0];
    for (;;) {
      try {
        const doc = await api("/api/runs");
        clearMessage();
        setLive("polling");
        fillRuns(body, Array.isArray(doc.runs) ? doc.runs : []);
      } catch (err) {
        showMessage(err);
        setLive("error");
        if (err.status === 403) return;
      }
      await sleep(LIST_POLL_MS);
    }
  }

  function fillRuns(body, rows) {
    $("runs-empty").hidden = rows.length > 0;
    $("runs").hidden = rows.length === 0;
    const fresh = document.createDocumentFragment();
    for (const row of rows) {
      const tr = document.createElement("tr");
      tr.dataset.run = String(row.id);
      // A record left out (too large, nested too deep, not JSON): the row says why.
      if (Array.isArray(row.problems) && row.problems.length) tr.title = row.problems.join("\n");
      const first = document.createElement("td");
      const link = cell("a", String(row.id));
      link.href = "/run/" + encodeURIComponent(String(row.id));
      first.appendChild(link);
      tr.appendChild(first);
      tr.appendChild(cell("td", String(row.script ?? "?")));
      const state = cell("td", String(row.state ?? "?"), "state");
      state.dataset.state = String(row.state ?? "");
      tr.appendChild(state);
      tr.appendChild(cell("td", shape(row)));
      tr.appendChild(cell("td", fmtTime(row.started)));
      tr.appendChild(cell("td", fmtDuration(row.seconds), "num"));
      tr.appendChild(cell("td", row.step === null || row.step === undefined ? "–" : String(row.step), "num"));
      tr.appendChild(cell("td", fmtNumber(row.loss, 4), "num"));
      fresh.appendChild(tr);
    }
    body.replaceChildren(fresh); // a few dozen rows every 3 s: cheap
  }

  function sleep(ms) {
    return new Promise((done) => setTimeout(done, ms));
  }

  // ---- one run --------------------------------------------------------------------

  const Grid = {
    built: "", // the layout (hosts and their ranks) the cells were made for
    cells: new Map(), // rank -> element
    logs: new Map(), // rank -> {pre, text}

    layout(doc) {
      const key = JSON.stringify(doc.nodes.map((n) => [n.host, n.ranks]));
      if (key === this.built) return;
      this.built = key;
      this.cells.clear();
      this.logs.clear();
      const grid = document.createDocumentFragment();
      const logs = document.createDocumentFragment();
      const hostOf = new Map();
      for (const node of doc.nodes) {
        const card = cell("div", undefined, "node");
        card.dataset.host = String(node.host);
        const title = cell("div", undefined, "node-title");
        title.appendChild(cell("span", String(node.host), "host"));
        title.appendChild(cell("span", node.ranks.length + " ranks", "muted"));
        card.appendChild(title);
        const cells = cell("div", undefined, "cells");
        for (const rank of node.ranks) {
          const c = cell("div", String(rank), "cell");
          c.dataset.rank = String(rank);
          c.dataset.state = "";
          cells.appendChild(c);
          this.cells.set(rank, c);
          hostOf.set(rank, String(node.host));
        }
        card.appendChild(cells);
        grid.appendChild(card);
      }
      for (const r of doc.ranks) {
        const box = cell("section", undefined, "log");
        box.dataset.logRank = String(r.rank);
        const head = cell("div", undefined, "log-head");
        head.appendChild(cell("span", "rank " + r.rank, "log-rank"));
        head.appendChild(cell("span", hostOf.get(r.rank) ?? String(r.host ?? ""), "muted"));
        const age = cell("span", "", "muted age");
        head.appendChild(age);
        const pre = cell("pre", "");
        box.appendChild(head);
        box.appendChild(pre);
        logs.appendChild(box);
        this.logs.set(r.rank, { pre: pre, age: age, text: null, box: box });
      }
      $("ranks").replaceChildren(grid);
      $("logs").replaceChildren(logs);
    },

    // Cells and log boxes updated in place, and only where something changed.
    update(doc) {
      this.layout(doc);
      const now = doc.updated || Date.now() / 1000;
      const scrolled = []; // boxes whose text changed: shown from their last line
      for (const r of doc.ranks) {
        const c = this.cells.get(r.rank);
        if (c) {
          const state = String(r.state ?? "");
          if (c.dataset.state !== state) c.dataset.state = state;
          const title = "rank " + r.rank + " on " + r.host + ": " + state +
            (r.exit_code === null || r.exit_code === undefined ? "" : " (exit " + r.exit_code + ")");
          if (c.title !== title) c.title = title;
        }
        const log = this.logs.get(r.rank);
        if (!log) continue;
        const lines = Array.isArray(r.log_tail) ? r.log_tail : [];
        const text = lines.join("\n");
        if (log.text !== text) {
          log.text = text;
          log.pre.textContent = text || "(no output yet)";
          log.box.classList.toggle("empty", !text);
          scrolled.push(log.pre);
        }
        const age = r.last_output ? "output " + fmtDuration(now - r.last_output) + " ago" : "";
        setText(log.age, age);
        if (log.box.dataset.state !== r.state) log.box.dataset.state = String(r.state ?? "");
      }
      // Scrolled after all the writes: one layout for every box, not one per box.
      for (const pre of scrolled) pre.scrollTop = pre.scrollHeight;
    },
  };

  function fillHeader(doc) {
    const row = doc.run || {};
    const state = String(row.state ?? "?");
    const st = $("state");
    setText(st, state);
    if (st.dataset.state !== state) st.dataset.state = state;
    setText($("f-script"), String(row.script ?? "?"));
    setText($("f-shape"), shape(row));
    setText($("f-duration"), fmtDuration(row.seconds));
    setText($("f-step"), row.step === null || row.step === undefined ? "–" : String(row.step));
    setText($("f-loss"), fmtNumber(row.loss, 4));
    const rate = Charts.data.rate;
    setText($("f-rate"), fmtNumber(rate.length ? rate[rate.length - 1] : null, 1));
    setText($("f-precision"), doc.precision ? String(doc.precision) : "–");
    setText($("f-code"), row.exit_code === null || row.exit_code === undefined ? "–" : String(row.exit_code));
    document.title = state + " · " + String(row.id ?? "") + " · cpuaccel";
    const ended = Boolean(doc.ended) || ENDED.has(state);
    $("stop").hidden = ended;
  }

  // A detached run whose head is another machine: its folder is copied home while the
  // page looks; say when that last worked, or why it does not.
  function fillRemote(doc) {
    const line = $("remote");
    const remote = doc.remote;
    if (!remote || typeof remote !== "object") { line.hidden = true; return; }
    line.hidden = false;
    const now = doc.updated || Date.now() / 1000;
    if (remote.error) {
      line.dataset.error = "1";
      setText(line, "copying from the run's head failed: " + String(remote.error) +
        " (shown as last copied" + (remote.fetched ? ", " + fmtDuration(now - remote.fetched) + " ago)" : ")"));
    } else {
      delete line.dataset.error;
      setText(line, remote.fetched ? "copied from the run's head " + fmtDuration(now - remote.fetched) + " ago"
        : "copying from the run's head…");
    }
  }

  async function stopRun(runId) {
    const button = $("stop");
    const out = $("stop-result");
    if (!window.confirm("Stop run " + runId + "? Every rank on every node is ended (as cpuaccel stop).")) {
      return;
    }
    button.disabled = true;
    out.hidden = false;
    out.className = "stop-result";
    out.textContent = "stopping…";
    try {
      const done = await api("/api/runs/" + encodeURIComponent(runId) + "/stop", "POST");
      const left = done && done.left && typeof done.left === "object" ? Object.entries(done.left) : [];
      const stuck = left.filter(([, procs]) => Array.isArray(procs) ? procs.length : procs);
      const state = String(done && done.state);
      let text = done && done.already ? "the run had already ended (" + state + ")" : state;
      if (stuck.length) {
        text += "; processes left on " + stuck.map(([host, p]) => host + " (" + (Array.isArray(p) ? p.length : p) + ")").join(", ");
        out.classList.add("error");
      } else if (!(done && done.already)) {
        text += ": nothing left on any node";
      }
      out.textContent = text;
      out.dataset.result = "ok";
    } catch (err) {
      out.textContent = "stop failed: " + err.message + (err.fix ? " (" + err.fix + ")" : "");
      out.classList.add("error");
      out.dataset.result = "error";
    } finally {
      button.disabled = false;
    }
  }

  async function runView(runId) {
    $("run-view").hidden = false;
    setText($("where"), "run");
    setText($("run-id"), runId);
    $("stop").addEventListener("click", () => stopRun(runId));
    Charts.make();
    const path = "/api/runs/" + encodeURIComponent(runId) + "?tail=" + TAIL + "&since=";
    let since = 0;
    let endedSeen = false;
    let thinned = false; // the first load was decimated: said under the charts' title
    for (;;) {
      let doc;
      try {
        doc = await api(path + since);
      } catch (err) {
        showMessage(err);
        setLive("error");
        if (err.status === 403 || err.status === 404) return;
        await sleep(POLL_MS * 2);
        continue;
      }
      clearMessage();
      const m = doc.metrics || {};
      if (m.reset) Charts.drop();
      const grew = Charts.add(m);
      if (grew || m.reset) Charts.draw();
      if (m.reset) thinned = false;
      thinned = thinned || Boolean(m.decimated);
      setText($("points-note"), thinned ? "(long run: every k-th step of the first load shown)" : "");
      since = Number.isInteger(m.next) ? m.next : since;
      fillHeader(doc);
      fillRemote(doc);
      Grid.update(doc);
      if (doc.ended) {
        if (endedSeen) { setLive("ended"); return; } // the last poll after the end
        endedSeen = true;
        await sleep(POLL_MS);
        continue;
      }
      setLive("polling");
      await sleep(POLL_MS);
    }
  }

  function route() {
    const match = /^\/run\/([^/]+)\/?$/.exec(location.pathname);
    if (match) return runView(decodeURIComponent(match[1]));
    return listView();
  }

  document.addEventListener("DOMContentLoaded", route);
})();
