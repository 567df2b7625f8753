// The usage console: a company's plan (SPEC §13): what it allows, the upgrade offer, the period;
// for the operator also the plan assignment and the company's settings.
"use strict";

async function openPlan() {
  setStatus("Loading the plan…");
  let usage, company, users;
  try {
    usage = await companyUsage();
    [company, users] = await Promise.all([api(companyPath(state.companyID)), api(companyPath(state.companyID, "/users"))]);
  } catch (e) { return failed(e); }
  // The plan's per-user cap is the limit of any user without an override of their own.
  const plain = users.data.find((u) => u.monthly_cap === null);
  const counted = plain && usage.users.find((u) => u.id === plain.id);
  usage.planUserCap = counted ? counted.limit : undefined;
  const box = $("plan-body");
  box.replaceChildren(...planSummary(usage, company), ...featureLimits(usage.usage.features || []), ...topUps(usage.grants || []));
  if (state.me.role === "operator") box.append(...operatorPlanTools(company));
  show("plan");
  setStatus("");
}

function planSummary(usage, company) {
  const u = usage.usage;
  if (!u.plan) {
    return [el("h3", { text: "Plan" }), el("p", { class: "banner bad", text: "No plan: every call is refused until the operator assigns one." })];
  }
  const cards = el("div", { class: "cards", id: "plan-cards" },
    card("Plan", u.plan.name, "plan-name"), card("Company cap per period", limitText(u.company.limit), "plan-company-cap"),
    card("Per-user cap", usage.planUserCap === undefined ? "—" : limitText(usage.planUserCap), "plan-user-cap"),
    card("Company budget", usage.cost ? budgetText(usage.cost.company.limit) : "—", "plan-budget"),
    card("Period", u.period ? day(u.period.start) + " to " + day(u.period.end) : "—", "plan-period"),
    card("Renewal", company.auto_renew === false ? "ends, does not renew" : "renews", "plan-renew"));
  const offer = u.upgrade
    ? "The next plan up is " + u.upgrade.plan + ": company cap " + limitText(u.upgrade.company_limit) + ", per-user cap " +
      limitText(u.upgrade.user_limit) + ". Ask the operator (or buy it in the app) to move to it."
    : "This is the largest plan on offer.";
  return [el("h3", { text: "Plan" }), cards, el("h3", { text: "Upgrade offer" }), el("p", { id: "upgrade-offer", text: offer })];
}

function featureLimits(features) {
  const w = (x) => (x ? limitText(x.limit) : "—");
  const columns = [["Feature", (f) => f.name + (f.enabled === false ? " (not in plan)" : "")], ["Company per day", (f) => w(f.day)],
    ["Company per period", (f) => w(f.period)], ["Each user per day", (f) => w(f.user_day)], ["Each user per period", (f) => w(f.user_period)]];
  return [el("h3", { text: "Features of the plan" }),
    table("The plan's features and their limits", columns, features, (f) => ({ "data-feature": f.id }), "The plan sells no features.")];
}

// The company's top-up packs (SPEC §12), as the usage read lists them: what each granted, what is
// left of it and until when (a grant pays only what the plan's cap or budget cannot hold).
function topUps(grants) {
  const pair = (p) => [p.units === null ? null : p.units.toLocaleString("en-US"), p.budget === null ? null : "$" + p.budget]
    .filter((x) => x !== null).join(" and ") || "—";
  const columns = [["Pack", (g) => g.product_id], ["Granted", (g) => pair(g.granted)], ["Left", (g) => pair(g.remaining)],
    ["Expires", (g) => day(g.expires_at)], ["Status", (g) => g.status.replace("_", " ")]];
  return [el("h3", { text: "Top-ups" }),
    el("div", { id: "top-ups" }, table("The company's top-up packs", columns, grants, (g) => ({ "data-grant": String(g.id) }),
      "No top-up packs: past the plan's cap, calls are refused."))];
}

// ---------------------------------------------------------------- operator

function operatorPlanTools(company) {
  const assign = button("Assign a plan", () => assignPlan(company), { id: "assign-plan" });
  const edit = button("Edit the company", () => editCompany(company), { id: "edit-company", class: "secondary" });
  return [el("h3", { text: "Operator" }),
    el("p", { text: "Time zone " + company.time_zone + "; threshold webhook " + (company.webhook_url || "the configured one") + "." }),
    el("p", { class: "row-actions" }, assign, edit)];
}

async function planOptions() {
  const plans = await api("/admin/v1/plans");
  return plans.data.map((p) => [p.id, p.name + " (" + p.id + (p.is_active ? "" : ", inactive") + ")"]);
}

async function assignPlan(company) {
  let options;
  try { options = await planOptions(); } catch (e) { return failed(e); }
  if (!options.length) return setStatus("There is no plan yet: create one under Plans.");
  openForm({
    title: "Assign a plan to " + company.name,
    intro: "A period on this plan starts now (or at the time given); a period that was running ends there.",
    fields: [
      { name: "plan", label: "Plan", kind: "select", options, value: company.plan },
      { name: "started_at", label: "Starts at (ISO-8601, such as 2026-11-01T00:00:00Z)", kind: "text", hint: "Blank: now." },
      { name: "auto_renew", label: "Renews every period", kind: "bool", value: company.auto_renew !== false },
    ],
    submit: "Assign plan",
    send: (body) => api(companyPath(company.id, "/plan"), { method: "PUT", body }),
    done: async (c) => { await openPlan(); setStatus(c.name + " is now on " + c.plan + "."); },
  });
}

function editCompany(company) {
  openForm({
    title: "Edit " + company.name,
    fields: [
      { name: "name", label: "Name", kind: "text", value: company.name },
      { name: "time_zone", label: "Time zone (IANA, such as Europe/Berlin)", kind: "text", value: company.time_zone },
      { name: "webhook_url", label: "Threshold webhook URL", kind: "text", value: company.webhook_url, blank: "null",
        hint: "Blank: the gateway's configured URL." },
    ],
    submit: "Save",
    send: (body) => api(companyPath(company.id), { method: "PATCH", body }),
    done: async (c) => { await openPlan(); setStatus("Saved " + c.name + "."); },
  });
}
