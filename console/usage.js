// The usage console: a company's usage view (SPEC §10): plan and period, spend, users, features,
// cost per model, the latest calls with their CSV, the threshold notifications.
"use strict";

async function openCompany(id, own) {
  setStatus("Loading the company…");
  let usage;
  try {
    usage = await api(companyPath(id, "/usage"));
  } catch (e) {
    if (isOutage(e)) return offline(e.message);
    if (own || e.status === 401) return signOut(e.message);
    setStatus(e.message);
    return;
  }
  enterCompany(usage);
  show("company");
  renderSummary(usage);
  renderSpend(usage.cost);
  renderUsers();
  renderFeatures(usage.usage.features || []);
  const base = companyPath(id);
  const period = usage.usage.period;
  const from = period ? period.start : null;
  const results = await Promise.allSettled([
    api(base + "/usage/daily" + (period ? periodDays(period) : "")), api(base + "/usage/history?periods=12"),
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

// The company whose views are open now: its heading, its tabs, the header's names.
function enterCompany(usage) {
  state.company = usage;
  state.companyID = usage.company.id;
  state.users = usage.users || [];
  $("back").hidden = state.me.role !== "operator";
  $("company-title").textContent = usage.company.name;
  companyTabs();
  nameSelf(usage);
}

// The company's usage read again, for views other than usage that need its users and plan.
async function companyUsage() {
  let usage;
  try {
    usage = await api(companyPath(state.companyID, "/usage"));
  } catch (e) {
    if (state.company) state.companyID = state.company.company.id;
    throw e;
  }
  enterCompany(usage);
  return usage;
}

// `from`/`to` of every day of the period: the chart spans the whole period, days to come empty.
function periodDays(period) {
  const last = new Date(Date.parse(period.end) - 1000).toISOString().replace(/\.\d{3}Z$/, "Z");
  return "?from=" + encodeURIComponent(period.start) + "&to=" + encodeURIComponent(last);
}

function card(label, value, id) {
  return el("div", { class: "card" }, el("span", { class: "label", text: label }), el("span", { class: "value", text: value, "data-field": id }));
}

function renderSummary(data) {
  const company = data.company, usage = data.usage, counter = usage.company;
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
    const blob = await api(companyPath(usage.company.id, "/events" + from), { accept: "text/csv" });
    const link = el("a", { href: URL.createObjectURL(blob), download: "capgate-events-" + usage.company.id + ".csv" });
    document.body.append(link);
    link.click();
    link.remove();
    setStatus("CSV downloaded.");
  } catch (e) {
    setStatus(e.message);
  }
}

