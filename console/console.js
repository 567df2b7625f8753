// CapGate usage console (SPEC §10, §13): the shared core. Plain JavaScript, no build step, no other
// origin; the page's other scripts (one per view) use what this file defines.
// The pasted credential lives in sessionStorage (this tab only) and is sent as
// `Authorization: Bearer`; it is never put in a URL, a cookie or the page. Every value from the
// API is written with textContent, input values or SVG attributes, never as HTML.
"use strict";

const KEY = "capgate.credential";
const COLORS = ["#0b5cad", "#b35900", "#2e7d32", "#7b1fa2", "#c62828", "#00695c", "#5d4037"];
const $ = (id) => document.getElementById(id);
const state = {
  me: null, companies: [], companySort: ["percent_used", -1], users: [], userSort: ["used", -1], company: null, companyID: null,
};
const VIEWS = ["sign-in", "offline", "operator", "company", "people", "plan", "audit", "catalog"];
const COMPANY_VIEWS = ["company", "people", "plan", "audit"];

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "text") node.textContent = v;
    else if (k === "class") node.className = v;
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const child of children) if (child !== null && child !== undefined) node.append(child);
  return node;
}

function svg(tag, attrs = {}) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  return node;
}

function button(label, onClick, attrs = {}) {
  const b = el("button", Object.assign({ type: "button", text: label }, attrs));
  b.addEventListener("click", onClick);
  return b;
}

class ApiError extends Error {
  constructor(status, type, message) { super(message); this.status = status; this.type = type; }
}

// One call of the JSON API with the tab's credential; `options.body` is sent as JSON.
async function api(path, options = {}) {
  const accept = options.accept || "application/json";
  const headers = { authorization: "Bearer " + sessionStorage.getItem(KEY), accept };
  const init = { method: options.method || "GET", headers, cache: "no-store", credentials: "omit" };
  if (options.body !== undefined) {
    headers["content-type"] = "application/json";
    init.body = JSON.stringify(options.body);
  }
  let response;
  try {
    response = await fetch(path, init);
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

const companyPath = (id, rest = "") => "/admin/v1/companies/" + encodeURIComponent(id) + rest;
const number = (n) => (n === null || n === undefined ? "—" : Number(n).toLocaleString("en-US"));
const limitText = (n) => (n === null || n === undefined ? "unlimited" : number(n));
const day = (iso) => (iso ? iso.slice(0, 10) : "—");
const minute = (iso) => (iso ? iso.replace("T", " ").slice(0, 16) + " UTC" : "—");
// "1 company", "2 companies": a count and the noun in the right number.
function plural(n, one, many = one + "s") { return number(n) + " " + (Number(n) === 1 ? one : many); }
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

function setStatus(text) { $("status").textContent = text; }

// Shows one view; the company heading and tabs go with the company's views.
function show(section) {
  for (const id of VIEWS) $(id).hidden = id !== section;
  $("sign-out").hidden = section === "sign-in";
  $("company-head").hidden = !COMPANY_VIEWS.includes(section);
  $("nav").hidden = !state.me || state.me.role !== "operator" || section === "sign-in";
  const here = section === "catalog" ? "catalog:" + state.catalog : section === "audit" && !state.companyID ? "audit-all"
    : COMPANY_VIEWS.includes(section) ? "operator" : section;
  const current = (b, on) => (on ? b.setAttribute("aria-current", "page") : b.removeAttribute("aria-current"));
  document.querySelectorAll("#nav button").forEach((b) => current(b, b.dataset.nav === here));
  document.querySelectorAll("#company-tabs button").forEach((b) => current(b, b.dataset.view === section));
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

// What a failed read does to the page: a refused credential signs out, an outage says so,
// anything else is a status line.
function failed(e) {
  if (e.status === 401) return signOut(e.message);
  if (isOutage(e)) return offline(e.message);
  setStatus(e.message);
}

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
    $("who").textContent = "Signed in as " + (state.me.role === "admin" ? "an admin" : "a " + state.me.role);
    await openCompany(state.me.company_id, true);
  }
}

// The header names the admin and their company once the company is read (names, not ids).
function nameSelf(usage) {
  if (!state.me || state.me.role === "operator" || usage.company.id !== state.me.company_id) return;
  const self = (usage.users || []).find((u) => u.id === state.me.user_id);
  const who = self && self.email ? self.email : "an admin";
  $("who").textContent = "Signed in as " + who + ", admin of " + usage.company.name;
}

// Tabs of a company's views: usage, users and keys, plan, audit log (made once).
function companyTabs() {
  if ($("company-tabs")) return;
  const tabs = [["company", "Usage", () => openCompany(state.companyID, false)], ["people", "Users and keys", () => openPeople()],
    ["plan", "Plan", () => openPlan()], ["audit", "Audit log", () => openAudit(state.companyID)]];
  const bar = el("nav", { id: "company-tabs", class: "nav tabs", "aria-label": "This company" });
  for (const [view, label, open] of tabs) bar.append(button(label, open, { "data-view": view }));
  $("company-head").append(bar);
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

function sortBy(table, key, render) {
  $(table).querySelectorAll("th button[data-sort]").forEach((b) => b.addEventListener("click", () => {
    const field = b.dataset.sort;
    state[key] = [field, state[key][0] === field ? -state[key][1] : (field === "name" || field === "email" || field === "plan" ? 1 : -1)];
    $(table).querySelectorAll("th").forEach((th) => th.removeAttribute("aria-sort"));
    b.parentElement.setAttribute("aria-sort", state[key][1] > 0 ? "ascending" : "descending");
    render();
  }));
}

// A table from rows: `columns` are [heading, cell(row) → text or node]; `key` names each row.
function table(caption, columns, rows, key, empty) {
  const head = el("tr", {}, ...columns.map(([h]) => el("th", { scope: "col", text: h })));
  const body = el("tbody");
  for (const row of rows) {
    const tr = el("tr", key(row));
    for (const [, cell] of columns) {
      const value = cell(row);
      tr.append(value instanceof Node ? el("td", {}, value) : el("td", { text: value === null || value === undefined ? "—" : String(value) }));
    }
    body.append(tr);
  }
  if (!rows.length) body.append(el("tr", {}, el("td", { colspan: String(columns.length), class: "empty", text: empty })));
  return el("div", { class: "scroll" }, el("table", {}, el("caption", { class: "visually-hidden", text: caption }), el("thead", {}, head), body));
}
