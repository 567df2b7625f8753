// The usage console: the operator's catalog (SPEC §5, §8, §13): plans and their entitlements,
// features and routes, each listed, created and edited through the operator API; the App
// Store's unmatched notifications (read only). The price book is in prices.js.
"use strict";

const yesNo = (b) => (b ? "yes" : "no");
const limitField = (name, label, value) => ({ name, label, kind: "limit", value, hint: "Blank: unlimited." });

const CATALOG = {
  plans: {
    title: "Plans", path: "/admin/v1/plans", noun: "plan",
    columns: [["Id", (p) => p.id], ["Name", (p) => p.name], ["Company cap", (p) => limitText(p.monthly_company_cap)],
      ["User cap", (p) => limitText(p.monthly_user_cap)], ["Price", (p) => p.price + " " + p.currency],
      ["Default", (p) => yesNo(p.is_default)], ["Active", (p) => yesNo(p.is_active)], ["Order", (p) => p.sort_order]],
    fields: (p) => [
      { name: "name", label: "Name", kind: "text", value: p && p.name },
      limitField("monthly_company_cap", "Company cap per period (units)", p && p.monthly_company_cap),
      limitField("monthly_user_cap", "Per-user cap per period (units)", p && p.monthly_user_cap),
      { name: "monthly_company_budget", label: "Company budget per period (US dollars)", kind: "money", value: p && p.monthly_company_budget,
        hint: "Blank: unlimited." },
      { name: "monthly_user_budget", label: "Per-user budget per period (US dollars)", kind: "money", value: p && p.monthly_user_budget,
        hint: "Blank: unlimited." },
      limitField("company_rpm", "Company calls per minute", p && p.company_rpm),
      limitField("user_rpm", "Calls per minute for each user", p && p.user_rpm),
      limitField("company_tpm", "Company tokens per minute", p && p.company_tpm),
      limitField("user_tpm", "Tokens per minute for each user", p && p.user_tpm),
      limitField("user_concurrency", "Calls in flight at once for each user", p && p.user_concurrency),
      { name: "price", label: "Price", kind: "money", value: p ? p.price : "0", blank: "omit" },
      { name: "currency", label: "Currency (ISO 4217)", kind: "text", value: p ? p.currency : "USD" },
      { name: "sort_order", label: "Sort order (upgrades go up this order)", kind: "int", value: p ? p.sort_order : 0, blank: "omit" },
      { name: "is_default", label: "Default plan (after a cancelled or expired one)", kind: "bool", value: p && p.is_default },
      { name: "is_active", label: "Active (offered as an upgrade)", kind: "bool", value: p ? p.is_active : true },
    ],
    extra: (p) => [button("Entitlements", () => openEntitlements(p), { class: "secondary", "aria-label": "Entitlements of " + p.name })],
  },
  features: {
    title: "Features", path: "/admin/v1/features", noun: "feature",
    columns: [["Id", (f) => f.id], ["Name", (f) => f.name], ["Active", (f) => yesNo(f.is_active)], ["Order", (f) => f.sort_order]],
    fields: (f) => [
      { name: "name", label: "Name", kind: "text", value: f && f.name },
      { name: "sort_order", label: "Sort order", kind: "int", value: f ? f.sort_order : 0, blank: "omit" },
      { name: "is_active", label: "Active (an inactive one cannot be named in CapGate-Feature)", kind: "bool", value: f ? f.is_active : true },
    ],
  },
  routes: {
    title: "Routes", path: "/admin/v1/routes", noun: "route", optionalID: true, removable: true,
    columns: [["Method", (r) => r.method], ["Path", (r) => r.path], ["Units", (r) => r.units], ["Items field", (r) => r.items_field],
      ["Feature", (r) => r.feature], ["Header names it", (r) => (r.feature_header ? (r.header_features || ["any"]).join(", ") : "no")],
      ["Allowed", (r) => yesNo(r.allowed)]],
    fields: (r) => [
      { name: "method", label: "Method (* for any)", kind: "text", value: r ? r.method : "*" },
      { name: "path", label: "Path (exact, or a prefix ending in *)", kind: "text", value: r && r.path },
      { name: "units", label: "Units per call", kind: "int", value: r ? r.units : 1 },
      { name: "items_field", label: "Items field (units × the items of this array)", kind: "text", value: r && r.items_field, blank: "null" },
      { name: "feature", label: "Feature", kind: "select", options: [["", "None"], ...state.featureOptions], value: r && r.feature },
      { name: "feature_header", label: "The client may name the feature with CapGate-Feature", kind: "bool", value: r && r.feature_header },
      { name: "allowed", label: "Allowed (unticked: refused with 403)", kind: "bool", value: r ? r.allowed : true },
    ],
  },
};

async function openCatalog(kind) {
  state.catalog = kind;
  if (kind === "prices") return openPrices();
  if (kind === "apple") return openApple();
  const spec = CATALOG[kind];
  setStatus("Loading " + spec.title.toLowerCase() + "…");
  let list;
  try {
    list = await api(spec.path);
    if (kind === "routes") state.featureOptions = (await api("/admin/v1/features")).data.map((f) => [f.id, f.name]);
  } catch (e) { return failed(e); }
  $("catalog-title").textContent = spec.title;
  const columns = spec.columns.concat([["", (row) => el("span", { class: "row-actions" },
    button("Edit", () => editEntry(spec, row, kind), { "aria-label": "Edit " + (row.name || row.path || row.id) }),
    ...(spec.extra ? spec.extra(row) : []),
    ...(spec.removable ? [button("Delete", () => removeEntry(spec, row, kind), { class: "danger", "aria-label": "Delete " + row.id })] : []))]]);
  $("catalog-body").replaceChildren(el("p", {}, button("New " + spec.noun, () => editEntry(spec, null, kind), { id: "catalog-new" })),
    table(spec.title, columns, list.data, (row) => ({ "data-id": row.id }), "None yet."));
  show("catalog");
  setStatus(plural(list.data.length, spec.noun) + ".");
}

function editEntry(spec, row, kind) {
  const idField = { name: "id", label: "Id" + (spec.optionalID ? " (blank: one is made)" : " (lowercase letters, digits, -, _ or .)"),
    kind: "text" };
  const fields = (row ? [] : [idField]).concat(spec.fields(row));
  openForm({
    title: row ? "Edit " + spec.noun + " " + row.id : "New " + spec.noun, fields, submit: row ? "Save" : "Create " + spec.noun,
    send: (body) => api(row ? spec.path + "/" + encodeURIComponent(row.id) : spec.path, { method: row ? "PUT" : "POST", body }),
    done: async (saved) => { await openCatalog(kind); setStatus((row ? "Saved " : "Created ") + spec.noun + " " + saved.id + "."); },
  });
}

function removeEntry(spec, row, kind) {
  confirmThen("Delete " + spec.noun + " " + row.id + "?", "Calls stop matching it on their next request.", "Delete " + spec.noun, async () => {
    await api(spec.path + "/" + encodeURIComponent(row.id), { method: "DELETE" });
    await openCatalog(kind);
    setStatus("Deleted " + spec.noun + " " + row.id + ".");
  });
}

// ---------------------------------------------------------------- entitlements

async function openEntitlements(plan) {
  let list, features;
  try {
    [list, features] = await Promise.all([api("/admin/v1/plans/" + encodeURIComponent(plan.id) + "/entitlements"), api("/admin/v1/features")]);
  } catch (e) { return failed(e); }
  const path = (feature) => "/admin/v1/plans/" + encodeURIComponent(plan.id) + "/entitlements/" + encodeURIComponent(feature);
  const reopen = () => openEntitlements(plan);
  const edit = (e) => openForm({
    title: e ? "Edit " + e.feature_id + " in " + plan.name : "Add a feature to " + plan.name,
    fields: (e ? [] : [{ name: "feature_id", label: "Feature", kind: "select", local: true, options: features.data.map((f) => [f.id, f.name]) }])
      .concat(entitlementFields(e)),
    submit: e ? "Save" : "Add feature",
    send: (body, value) => api(path(e ? e.feature_id : value("feature_id")), { method: "PUT", body }),
    done: async (saved) => { await reopen(); setStatus("Saved " + saved.feature_id + " in " + plan.name + "."); },
  });
  const remove = (e) => confirmThen("Take " + e.feature_id + " out of " + plan.name + "?", "Calls for it are refused with 402 feature_not_in_plan.",
    "Remove feature", async () => { await api(path(e.feature_id), { method: "DELETE" }); await reopen(); });
  const columns = [["Feature", (e) => e.feature_id], ["Enabled", (e) => yesNo(e.enabled)], ["Per day", (e) => limitText(e.daily_limit)],
    ["Per period", (e) => limitText(e.period_limit)], ["User per day", (e) => limitText(e.user_daily_limit)],
    ["User per period", (e) => limitText(e.user_period_limit)], ["Message", (e) => e.message || "—"],
    ["", (e) => el("span", { class: "row-actions" }, button("Edit", () => edit(e), { "aria-label": "Edit " + e.feature_id }),
      button("Remove", () => remove(e), { class: "danger", "aria-label": "Remove " + e.feature_id }))]];
  $("catalog-title").textContent = "Entitlements of " + plan.name;
  $("catalog-body").replaceChildren(el("p", { class: "row-actions" }, button("All plans", () => openCatalog("plans"), { class: "secondary" }),
    button("Add a feature", () => edit(null), { id: "entitlement-new" })),
  table("Entitlements of " + plan.name, columns, list.data, (e) => ({ "data-id": e.feature_id }), "This plan sells no feature yet."));
  show("catalog");
  setStatus(plural(list.data.length, "entitlement") + ".");
}

function entitlementFields(e) {
  return [
    { name: "enabled", label: "Enabled (unticked: in the plan but refused)", kind: "bool", value: e ? e.enabled : true },
    limitField("daily_limit", "Company limit per day", e && e.daily_limit),
    limitField("period_limit", "Company limit per period", e && e.period_limit),
    limitField("user_daily_limit", "Each user's limit per day", e && e.user_daily_limit),
    limitField("user_period_limit", "Each user's limit per period", e && e.user_period_limit),
    { name: "message", label: "Message shown when it refuses", kind: "text", value: e && e.message, blank: "null" },
    limitField("company_rpm", "Company calls of it per minute", e && e.company_rpm),
    limitField("user_rpm", "Calls of it per minute for each user", e && e.user_rpm),
    limitField("company_tpm", "Company tokens of it per minute", e && e.company_tpm),
    limitField("user_tpm", "Tokens of it per minute for each user", e && e.user_tpm),
    limitField("user_concurrency", "Calls of it in flight at once for each user", e && e.user_concurrency),
  ];
}

// ---------------------------------------------------------------- App Store

async function openApple() {
  let list;
  try { list = await api("/admin/v1/billing/apple/unmatched"); } catch (e) { return failed(e); }
  const columns = [["Received", (n) => minute(n.received_at)], ["Type", (n) => n.notification_type + (n.subtype ? " / " + n.subtype : "")],
    ["Environment", (n) => n.environment], ["Product", (n) => n.product_id], ["Original transaction", (n) => n.original_transaction_id],
    ["Company", (n) => n.company_id || ""], ["Why", (n) => n.outcome === "refused" ? n.reason || "refused" : "no company"]];
  $("catalog-title").textContent = "App Store purchases not applied";
  $("catalog-body").replaceChildren(el("p", { class: "hint", text: "Signed notifications whose transaction names no company here (no " +
    "appAccountToken, or one that is no company's current purchase token), and store purchases kept off a company's plan " +
    "(a plan the operator assigned, a subscription of another company). They are kept; nothing was applied." }),
  table("Unmatched App Store notifications", columns, list.data, (n) => ({ "data-id": n.notification_uuid }), "None: every notification matched a company."));
  show("catalog");
  setStatus(plural(list.data.length, "unmatched notification") + ".");
}
