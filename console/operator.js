// The usage console: the operator's views. Every company (the billing overview, sortable and
// searchable, each opening its company views), a new company, and the operator's navigation.
"use strict";

// The operator's views: companies, the catalog (plans, features, routes, prices), the App Store's
// unmatched notifications, the whole audit log.
function operatorNav() {
  const items = [["operator", "Companies", () => openOperator()], ["catalog:plans", "Plans", () => openCatalog("plans")],
    ["catalog:features", "Features", () => openCatalog("features")], ["catalog:routes", "Routes", () => openCatalog("routes")],
    ["catalog:prices", "Price book", () => openCatalog("prices")], ["catalog:apple", "App Store", () => openCatalog("apple")],
    ["audit-all", "Audit log", () => openAudit(null)]];
  $("nav").replaceChildren(...items.map(([id, label, open]) => {
    return button(label, open, { "data-nav": id });
  }));
}

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
  } catch (e) { return failed(e); }
  state.company = null;
  state.companyID = null;
  show("operator");
  renderCompanies();
  setStatus(plural(state.companies.length, "company", "companies") + ".");
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


async function newCompany() {
  let plans;
  try { plans = await planOptions(); } catch (e) { return failed(e); }
  openForm({
    title: "New company",
    fields: [
      { name: "name", label: "Name", kind: "text" },
      { name: "plan", label: "Plan", kind: "select", options: [["", "No plan yet"], ...plans] },
      { name: "time_zone", label: "Time zone (IANA, such as Europe/Berlin)", kind: "text", value: "UTC",
        hint: "Days of daily limits run midnight to midnight here." },
      { name: "auto_renew", label: "The plan renews every period", kind: "bool", value: true },
    ],
    submit: "Create company",
    send: (body) => api("/admin/v1/companies", { method: "POST", body }),
    done: async (company) => { await openCompany(company.id, false); setStatus("Created " + company.name + "."); },
  });
}
