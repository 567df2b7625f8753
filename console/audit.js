// The usage console: the audit log (SPEC §13), newest first, a page at a time, filtered by
// action: a company's (`…/companies/{id}/audit`, its admins and the operator) or, for the
// operator, the whole gateway's (`/admin/v1/audit`).
"use strict";

const auditState = { company: null, action: "", cursor: null, rows: [] };

async function openAudit(companyID) {
  auditState.company = companyID;
  if (!companyID) { state.companyID = null; state.company = null; }
  auditState.action = "";
  $("audit-action").value = "";
  $("audit-title").textContent = companyID ? "Audit log" : "Audit log of every company";
  await loadAudit(false);
}

async function loadAudit(more) {
  setStatus("Loading the audit log…");
  $("audit-error").textContent = "";
  $("audit-action").removeAttribute("aria-invalid");
  const query = new URLSearchParams({ limit: "50" });
  if (auditState.action) query.set("action", auditState.action);
  if (more && auditState.cursor) query.set("cursor", auditState.cursor);
  const path = (auditState.company ? companyPath(auditState.company, "/audit") : "/admin/v1/audit") + "?" + query;
  let page;
  try {
    page = await api(path);
  } catch (e) {
    if (e.status === 400) {
      $("audit-error").textContent = e.message;
      $("audit-action").setAttribute("aria-invalid", "true");
      $("audit-action").focus();
      return setStatus("");
    }
    return failed(e);
  }
  auditState.rows = more ? auditState.rows.concat(page.data) : page.data;
  auditState.cursor = page.has_more ? page.next_cursor : null;
  show("audit");
  if (!auditState.company) $("company-head").hidden = true;
  renderAudit();
  setStatus(plural(auditState.rows.length, "entry", "entries") + (page.has_more ? ", more are older." : "."));
}

// Who acted, in words: a user of the open company by email, else the id or the token's name.
function actorText(actor) {
  const known = (state.company && state.company.users) || [];
  const user = known.find((u) => u.id === actor);
  if (user && user.email) return user.email;
  if (/^[0-9a-f-]{36}$/.test(actor)) return "user " + actor.slice(0, 8);
  return actor === "operator" ? "the operator" : "operator (" + actor + ")";
}

// What was acted on, by a name where the entry has one (a user's email, a key's name or prefix).
function targetText(row) {
  const shown = row.after || row.before || {};
  const named = shown.email || shown.name || (shown.new && (shown.new.name || shown.new.prefix)) || shown.prefix;
  return typeof named === "string" ? named : row.target_id || "—";
}

// What changed: the fields whose values differ between before and after.
function changeText(row) {
  if (!row.before && !row.after) return "—";
  if (!row.before) return "created";
  if (!row.after) return "removed";
  const keys = [...new Set(Object.keys(row.before).concat(Object.keys(row.after)))];
  const changed = keys.filter((k) => JSON.stringify(row.before[k]) !== JSON.stringify(row.after[k]));
  return changed.length ? changed.map((k) => k + ": " + short(row.before[k]) + " → " + short(row.after[k])).join("; ") : "no change";
}

function short(value) {
  const text = value === undefined ? "—" : JSON.stringify(value);
  return text.length > 40 ? text.slice(0, 39) + "…" : text;
}

function companyName(id) {
  const company = id && state.companies.find((c) => c.id === id);
  return company ? company.name : id || "—";
}

function renderAudit() {
  const columns = [["Time", (r) => r.time.replace("T", " ").slice(0, 19)], ["Who", (r) => actorText(r.actor)], ["Action", (r) => r.action],
    ["Target", targetText], ["Change", changeText], ["Request", (r) => r.request_id || "—"]];
  if (!auditState.company) columns.splice(2, 0, ["Company", (r) => companyName(r.company_id)]);
  $("audit-rows").replaceChildren(table("Audit entries, newest first", columns, auditState.rows,
    (r) => ({ "data-audit": r.id, "data-action": r.action }), "No entries."));
  $("audit-more").hidden = !auditState.cursor;
}
