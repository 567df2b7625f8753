// CapGate usage console (SPEC §10). Plain JavaScript, no build step, no other origin.
// The pasted credential lives in sessionStorage (this tab only) and is sent as
// `Authorization: Bearer`; it is never put in a URL, a cookie or the page. Every value from the
// API is written with textContent or SVG attributes, never as HTML.
"use strict";

const KEY = "capgate.credential";
const COLORS = ["#0b5cad", "#b35900", "#2e7d32", "#7b1fa2", "#c62828", "#00695c", "#5d4037"];
const $ = (id) => document.getElementById(id);
const state = { me: null, companies: [], companySort: ["percent_used", -1], users: [], userSort: ["used", -1], company: null };

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "text") node.textContent = v;
    else if (k === "class") node.className = v;
    else node.setAttribute(k, v);
  }
  for (const child of children) node.append(child);
  return node;
}

function svg(tag, attrs = {}) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  return node;
}

class ApiError extends Error {
  constructor(status, type, message) { super(message); this.status = status; this.type = type; }
}

async function api(path, accept = "application/json") {
  const credential = sessionStorage.getItem(KEY);
  let response;
  try {
    response = await fetch(path, { headers: { authorization: "Bearer " + credential, accept }, cache: "no-store", credentials: "omit" });
  } catch (e) {
    throw new ApiError(0, "unreachable", "The gateway cannot be reached. Check your connection and try again.");
  }
  if (accept === "text/csv" && response.ok) return response.blob();
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  if (!response.ok) {
    const error = body && body.error ? body.error : {};
    throw new ApiError(response.status, error.type || "api_error", error.message || ("The gateway answered " + response.status + "."));
  }
  return body;
}

const number = (n) => (n === null || n === undefined ? "—" : Number(n).toLocaleString("en-US"));
const limitText = (n) => (n === null || n === undefined ? "unlimited" : number(n));
const day = (iso) => (iso ? iso.slice(0, 10) : "—");
// Money comes as exact decimal strings of US dollars (SPEC §11): shown with every digit it has,
// and at least cents ("$1.50", "$12.345678"), never through a floating-point number.
function dollars(s) {
  const [whole, fraction = ""] = String(s).split(".");
  return "$" + whole + "." + fraction.padEnd(2, "0");
}
const money = (s) => (s === null || s === undefined ? "—" : dollars(s));
const budgetText = (s) => (s === null || s === undefined ? "unlimited" : dollars(s));
// A decimal string as whole micro-dollars, exact (for comparisons and a meter's share).
function micros(s) {
  const [whole, fraction = ""] = String(s).split(".");
  return BigInt(whole) * 1000000n + BigInt((fraction + "000000").slice(0, 6));
}

function meter(used, limit, label) {
  const span = el("span");
  const share = limit ? Math.min(1, used / limit) : 0;
  span.style.width = (limit ? share * 100 : 0) + "%";
  const bar = el("span", { class: "meter" + (limit && used >= limit ? " full" : ""), role: "img", "aria-label": label }, span);
  return bar;
}

function setStatus(text) { $("status").textContent = text; }

function show(section) {
  for (const id of ["sign-in", "offline", "operator", "company"]) $(id).hidden = id !== section;
  $("sign-out").hidden = section === "sign-in";
}

function signOut(message = "") {
  sessionStorage.removeItem(KEY);
  state.me = null;
  $("who").textContent = "";
  $("credential").value = "";
  $("sign-in-error").textContent = message;
  setStatus(message ? "" : "Signed out.");
  show("sign-in");
  $("credential").focus();
}

// The gateway or its database cannot answer now: the credential is kept (it was not refused),
// and the page offers to try again.
function offline(message) {
  $("offline-text").textContent = message;
  setStatus("");
  show("offline");
  $("retry").focus();
}

const isOutage = (e) => e.status === 0 || e.status >= 500;

async function start() {
  if (!sessionStorage.getItem(KEY)) { show("sign-in"); return; }
  setStatus("Loading…");
  try {
    state.me = await api("/admin/v1/me");
  } catch (e) {
    if (isOutage(e)) return offline(e.message);
    signOut(e.message);
    return;
  }
  if (state.me.role === "operator") {
    $("who").textContent = "Signed in as the operator";
    await openOperator();
  } else {
    $("who").textContent = "Signed in as " + (state.me.role === "admin" ? "an admin" : "a " + state.me.role) + " of company " + state.me.company_id;
    await openCompany(state.me.company_id, true);
  }
}

// ---------------------------------------------------------------- operator

async function openOperator() {
  setStatus("Loading every company…");
  try {
    const all = [];
    let cursor = null;
    for (let page = 0; page < 50; page++) {
      const list = await api("/admin/v1/companies?sort=usage&limit=500" + (cursor ? "&cursor=" + encodeURIComponent(cursor) : ""));
      all.push(...list.data);
      if (!list.has_more) break;
      cursor = list.next_cursor;
    }
    state.companies = all;
  } catch (e) {
    if (e.status === 401) return signOut(e.message);
    if (isOutage(e)) return offline(e.message);
    setStatus(e.message);
    return;
  }
  show("operator");
  renderCompanies();
  setStatus(state.companies.length + " companies.");
}

function sortRows(rows, [field, direction]) {
  return rows.slice().sort((a, b) => {
    const x = a[field], y = b[field];
    if (x === y) return 0;
    if (x === null || x === undefined) return 1;
    if (y === null || y === undefined) return -1;
    return (typeof x === "number" ? x - y : String(x).localeCompare(String(y))) * direction;
  });
}

function renderCompanies() {
  const query = $("search").value.trim().toLowerCase();
  const body = $("companies").tBodies[0];
  body.replaceChildren();
  const rows = sortRows(state.companies.filter((c) => !query || (c.name || "").toLowerCase().includes(query) || (c.plan || "").toLowerCase().includes(query)), state.companySort);
  for (const c of rows) {
    const open = el("button", { type: "button", class: "linklike", text: c.name });
    open.addEventListener("click", () => openCompany(c.id, false));
    const row = el("tr", { class: "link", "data-company": c.id },
      el("td", {}, open), el("td", { text: c.plan || "no plan" }), el("td", { text: day(c.period_end) }),
      el("td", { class: "num", text: number(c.used) + " / " + limitText(c.cap) }),
      el("td", { class: "num", text: c.percent_used === null || c.percent_used === undefined ? "—" : c.percent_used + " %" }));
    body.append(row);
  }
  if (!rows.length) body.append(el("tr", {}, el("td", { colspan: "5", class: "empty", text: "No company matches." })));
}

// ---------------------------------------------------------------- company

async function openCompany(id, own) {
  setStatus("Loading the company…");
  let usage;
  try {
    usage = await api("/admin/v1/companies/" + encodeURIComponent(id) + "/usage");
  } catch (e) {
    if (isOutage(e)) return offline(e.message);
    if (own || e.status === 401) return signOut(e.message);
    setStatus(e.message);
    return;
  }
  state.company = usage;
  $("back").hidden = state.me.role !== "operator";
  show("company");
  renderSummary(usage);
  renderSpend(usage.cost);
  state.users = usage.users || [];
  renderUsers();
  renderFeatures(usage.usage.features || []);
  const base = "/admin/v1/companies/" + encodeURIComponent(id);
  const period = usage.usage.period;
  const from = period ? period.start : null;
  const results = await Promise.allSettled([
    api(base + "/usage/daily"), api(base + "/usage/history?periods=12"),
    api(base + "/events?order=desc&limit=20" + (from ? "&from=" + encodeURIComponent(from) : "")), api(base + "/notifications?limit=20"),
    period ? api(base + "/usage/models") : Promise.resolve(null),
  ]);
  const [daily, history, events, notes, models] = results.map((r) => (r.status === "fulfilled" ? r.value : null));
  renderDaily(daily || []);
  renderModels(models ? models.models : []);
  renderHistory(history ? history.data : []);
  renderEvents(events ? events.data : []);
  renderNotifications(notes ? notes.data : []);
  const failed = results.find((r) => r.status === "rejected");
  setStatus(failed ? failed.reason.message : "Up to date at " + new Date().toLocaleTimeString("en-US") + ".");
}

function card(label, value, id) {
  return el("div", { class: "card" }, el("span", { class: "label", text: label }), el("span", { class: "value", text: value, "data-field": id }));
}

function renderSummary(data) {
  const company = data.company, usage = data.usage, counter = usage.company;
  $("company-title").textContent = company.name;
  const summary = $("summary");
  summary.replaceChildren();
  const banner = $("banner");
  banner.hidden = true;
  banner.className = "banner";
  if (!usage.plan) {
    summary.append(card("Plan", "No plan", "plan"));
    banner.textContent = "This company has no plan: every call is refused until the operator assigns one.";
    banner.hidden = false;
    return;
  }
  const end = usage.period ? new Date(usage.period.end) : null;
  const daysLeft = end ? Math.max(0, Math.ceil((end - Date.now()) / 86400000)) : null;
  summary.append(
    card("Plan", usage.plan.name, "plan"),
    card("Used this period", number(counter.used), "used"),
    card("Cap", limitText(counter.limit), "limit"),
    card("Remaining", counter.limit === null ? "unlimited" : number(counter.remaining), "remaining"),
    card("Days left", daysLeft === null ? "—" : String(daysLeft), "days-left"),
    card(company.auto_renew === false ? "Ends" : "Renews", end ? day(usage.period.end) : "—", "renews"));
  if (counter.limit !== null && counter.used >= counter.limit) {
    banner.textContent = "The company's cap is reached: calls are refused with 402 until the period renews or the plan changes.";
    banner.className = "banner bad";
    banner.hidden = false;
  } else if (counter.limit !== null && counter.used >= 0.8 * counter.limit) {
    banner.textContent = "Over 80 % of the cap is used.";
    banner.hidden = false;
  }
}

// The company's cost budget (SPEC §11): spent, held for calls in flight, the budget, what is left.
function renderSpend(cost) {
  const box = $("spend");
  box.replaceChildren();
  const banner = $("spend-banner");
  banner.hidden = true;
  banner.className = "banner";
  if (!cost) return;
  const c = cost.company;
  const spent = card("Spent this period", money(c.used), "cost-used");
  if (c.limit !== null) spent.append(costMeter(c, "Company spend: " + money(c.used) + " of " + budgetText(c.limit)));
  box.append(spent, card("Held for calls in flight", money(c.held), "cost-held"), card("Budget", budgetText(c.limit), "cost-limit"),
    card("Budget left", c.limit === null ? "unlimited" : money(c.remaining), "cost-remaining"));
  if (c.limit === null) return;
  const committed = micros(c.used) + micros(c.held), limit = micros(c.limit);
  if (committed >= limit) {
    banner.textContent = "The company's cost budget is reached: calls are refused with 402 until the period renews or the plan changes.";
    banner.className = "banner bad";
    banner.hidden = false;
  } else if (committed * 10n >= limit * 8n) {
    banner.textContent = "Over 80 % of the cost budget is spent or held.";
    banner.hidden = false;
  }
}

// A meter of spent + held against the budget.
function costMeter(counter, label) {
  const limit = Number(micros(counter.limit)), committed = Number(micros(counter.used) + micros(counter.held));
  return meter(committed, limit, label);
}

function spendCell(cost) {
  const cell = el("td", { class: "num spend" });
  if (!cost) { cell.textContent = "—"; return cell; }
  const held = micros(cost.held) > 0n ? " (+" + money(cost.held) + " held)" : "";
  cell.append(el("span", { text: money(cost.used) + " / " + budgetText(cost.limit) + held }));
  if (cost.limit !== null) cell.append(costMeter(cost, "Spend: " + money(cost.used) + " of " + budgetText(cost.limit)));
  return cell;
}

function renderModels(models) {
  const box = $("models");
  box.replaceChildren();
  if (!models.length) { box.append(el("p", { class: "empty", text: "No calls yet in this period." })); return; }
  const headings = ["Model", "Calls", "Input tokens", "Output tokens", "Cache writes", "Cache reads", "Cost", "Held"];
  const table = el("table", { id: "models-table" }, el("caption", { class: "visually-hidden", text: "Tokens and cost per model this period" }),
    el("thead", {}, el("tr", {}, ...headings.map((h, i) => el("th", { scope: "col", class: i ? "num" : "", text: h })))));
  const body = el("tbody");
  for (const m of models) {
    body.append(el("tr", { "data-model": m.model === null ? "" : m.model }, el("td", { text: m.model === null ? "(no model)" : m.model }),
      el("td", { class: "num", text: number(m.calls) }), el("td", { class: "num", text: number(m.input_tokens) }),
      el("td", { class: "num", text: number(m.output_tokens) }), el("td", { class: "num", text: number(m.cache_write_tokens) }),
      el("td", { class: "num", text: number(m.cache_read_tokens) }), el("td", { class: "num", text: money(m.cost_usd) }),
      el("td", { class: "num", text: money(m.held_usd) })));
  }
  table.append(body);
  box.append(el("div", { class: "scroll" }, table));
}

function renderUsers() {
  const body = $("users").tBodies[0];
  body.replaceChildren();
  for (const u of sortRows(state.users, state.userSort)) {
    const features = (u.features || []).filter((f) => f.user_day || f.user_period)
      .map((f) => f.name + ": " + number((f.user_period || f.user_day).used)).join(", ");
    body.append(el("tr", { "data-user": u.id },
      el("td", { text: u.email || u.id }), el("td", { text: u.role }),
      el("td", { class: "num" }, el("span", { text: number(u.used) + " / " + limitText(u.limit) }),
        meter(u.used, u.limit, (u.email || u.id) + ": " + number(u.used) + " of " + limitText(u.limit))),
      el("td", { class: "num", text: u.limit === null ? "unlimited" : number(u.remaining) }),
      spendCell(u.cost),
      el("td", { text: features || "—" })));
  }
  if (!state.users.length) body.append(el("tr", {}, el("td", { colspan: "6", class: "empty", text: "No users yet." })));
}

function windowText(w) {
  if (!w) return "—";
  return number(w.used) + " / " + limitText(w.limit) + (w.reset_at ? " (resets " + w.reset_at.replace("T", " ").slice(0, 16) + ")" : "");
}

function renderFeatures(features) {
  const box = $("features");
  box.replaceChildren();
  if (!features.length) { box.append(el("p", { class: "empty", text: "This plan sells no features: calls count against the caps only." })); return; }
  const table = el("table", {}, el("thead", {}, el("tr", {},
    el("th", { scope: "col", text: "Feature" }), el("th", { scope: "col", text: "Today" }), el("th", { scope: "col", text: "This period" }))));
  const body = el("tbody");
  for (const f of features) {
    body.append(el("tr", { "data-feature": f.id }, el("td", { text: f.name + (f.enabled === false ? " (not in plan)" : "") }),
      el("td", { text: windowText(f.day) }), el("td", { text: windowText(f.period) })));
  }
  table.append(body);
  box.append(el("div", { class: "scroll" }, table));
}

function legend(names) {
  return el("ul", { class: "legend" }, ...names.map((name, i) => el("li", {}, el("i"), document.createTextNode(name))));
}

function colorLegend(names) {
  const list = legend(names);
  list.querySelectorAll("i").forEach((swatch, i) => { swatch.style.background = COLORS[i % COLORS.length]; });
  return list;
}

// A bar chart in SVG: one bar per entry, stacked by the series given.
function barChart(entries, series, title) {
  const width = 720, height = 220, pad = 28;
  const max = Math.max(1, ...entries.map((e) => e.total));
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height + pad}`, role: "img", "aria-label": title });
  chart.append(svg("line", { x1: pad, y1: height, x2: width, y2: height, stroke: "#4a5360" }));
  const top = svg("text", { x: 0, y: 12, "font-size": 11, fill: "#4a5360" });
  top.textContent = number(max);
  chart.append(top);
  const slot = (width - pad) / Math.max(1, entries.length);
  entries.forEach((e, i) => {
    let y = height;
    const group = svg("g", { class: "bar", "data-label": e.label, "data-total": e.total });
    const tip = svg("title");
    tip.textContent = e.label + ": " + number(e.total);
    group.append(tip);
    series.forEach((name, s) => {
      const value = e.parts[name] || 0;
      if (!value) return;
      const h = (value / max) * (height - 16);
      y -= h;
      group.append(svg("rect", { x: pad + i * slot + slot * 0.1, y, width: Math.max(1, slot * 0.8), height: h, fill: COLORS[s % COLORS.length] }));
    });
    chart.append(group);
    if (entries.length <= 16 || i % Math.ceil(entries.length / 8) === 0) {
      const label = svg("text", { x: pad + i * slot + slot / 2, y: height + 16, "font-size": 10, "text-anchor": "middle", fill: "#4a5360" });
      label.textContent = e.short;
      chart.append(label);
    }
  });
  return chart;
}

function renderDaily(days) {
  const box = $("daily");
  box.replaceChildren();
  const total = days.reduce((n, d) => n + d.units, 0);
  if (!total) { box.append(el("p", { class: "empty", text: "No calls yet in this period." })); return; }
  const names = [...new Set(days.flatMap((d) => Object.keys(d.features || {})))].sort();
  const series = [...names, "other"];
  const entries = days.map((d) => {
    const parts = Object.assign({}, d.features || {});
    parts.other = d.units - names.reduce((n, f) => n + (parts[f] || 0), 0);
    return { label: d.date, short: d.date.slice(5), total: d.units, parts };
  });
  box.append(barChart(entries, series, "Units per day, " + days[0].date + " to " + days[days.length - 1].date),
    colorLegend(names.length ? [...names, "no feature"] : ["units"]));
}

function renderHistory(periods) {
  const box = $("history");
  box.replaceChildren();
  if (!periods.length) { box.append(el("p", { class: "empty", text: "No past period yet." })); return; }
  const entries = periods.slice().reverse().map((p) => ({
    label: day(p.period.start) + " to " + day(p.period.end) + " (" + (p.plan ? p.plan.name : "no plan") + ", cap " + limitText(p.limit) +
      (p.cost ? ", spent " + money(p.cost.company.used) + " of " + budgetText(p.cost.company.limit) : "") + ")",
    short: day(p.period.start).slice(0, 7), total: p.used, parts: { used: p.used },
  }));
  box.append(barChart(entries, ["used"], "Units used per past period"));
}

function renderEvents(events) {
  const body = $("events").tBodies[0];
  body.replaceChildren();
  const emails = new Map(state.users.map((u) => [u.id, u.email]));
  for (const e of events) {
    body.append(el("tr", {}, el("td", { text: e.time.replace("T", " ").slice(0, 19) }), el("td", { text: emails.get(e.user_id) || e.user_id }),
      el("td", { text: e.method + " " + e.route }), el("td", { text: e.feature || "—" }), el("td", { class: "num", text: number(e.units) }),
      el("td", { text: e.outcome }), el("td", { text: e.model || "—" }),
      el("td", { class: "num", text: e.cost_usd ? money(e.cost_usd) : e.hold_usd ? money(e.hold_usd) + " held" : "—" })));
  }
  if (!events.length) body.append(el("tr", {}, el("td", { colspan: "8", class: "empty", text: "No calls yet in this period." })));
}

function renderNotifications(notes) {
  const box = $("notifications");
  box.replaceChildren();
  if (!notes.length) { box.append(el("p", { class: "empty", text: "No threshold reached yet." })); return; }
  const list = el("ul");
  for (const n of notes) {
    const who = n.scope === "user" ? (n.user && n.user.email ? n.user.email : "a user") : "the company";
    const what = (n.feature ? n.feature + " " + (n.window === "day" ? "daily" : "period") + " limit" : "monthly cap");
    list.append(el("li", { "data-status": n.status, text:
      day(n.created_at) + ": " + who + " reached " + n.threshold + " % of the " + what + " (" + number(n.used) + " of " + number(n.limit) + ") — " +
      n.status + (n.attempts ? ", " + n.attempts + " attempt(s)" : "") + (n.last_error ? ", last error: " + n.last_error : "") }));
  }
  box.append(list);
}

async function downloadCSV() {
  const usage = state.company;
  if (!usage) return;
  const from = usage.usage.period ? "?from=" + encodeURIComponent(usage.usage.period.start) : "";
  try {
    const blob = await api("/admin/v1/companies/" + encodeURIComponent(usage.company.id) + "/events" + from, "text/csv");
    const link = el("a", { href: URL.createObjectURL(blob), download: "capgate-events-" + usage.company.id + ".csv" });
    document.body.append(link);
    link.click();
    link.remove();
    setStatus("CSV downloaded.");
  } catch (e) {
    setStatus(e.message);
  }
}

function sortBy(table, key, render) {
  $(table).querySelectorAll("th button[data-sort]").forEach((b) => b.addEventListener("click", () => {
    const field = b.dataset.sort;
    state[key] = [field, state[key][0] === field ? -state[key][1] : (field === "name" || field === "email" || field === "plan" ? 1 : -1)];
    $(table).querySelectorAll("th").forEach((th) => th.removeAttribute("aria-sort"));
    b.parentElement.setAttribute("aria-sort", state[key][1] > 0 ? "ascending" : "descending");
    render();
  }));
}

document.addEventListener("DOMContentLoaded", () => {
  $("sign-in-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const value = $("credential").value.trim();
    $("credential").value = "";
    if (!value) return;
    sessionStorage.setItem(KEY, value);
    $("sign-in-error").textContent = "";
    start();
  });
  $("sign-out").addEventListener("click", () => signOut());
  $("retry").addEventListener("click", () => start());
  $("back").addEventListener("click", () => openOperator());
  $("home").addEventListener("click", (event) => { event.preventDefault(); start(); });
  $("search").addEventListener("input", renderCompanies);
  $("csv").addEventListener("click", downloadCSV);
  sortBy("companies", "companySort", renderCompanies);
  sortBy("users", "userSort", renderUsers);
  start();
});
