// The usage console: a company's users and API keys (SPEC §13), through the same admin API a
// script would use (`…/users`, `…/api-keys`, `…/api-keys/{id}/rotate`), so the API's checks and
// its tenant rules apply: an admin reaches only their own company.
"use strict";

const ROLES = [["member", "Member"], ["admin", "Admin"]];

async function openPeople() {
  setStatus("Loading users and keys…");
  let users, keys;
  try {
    await companyUsage();
    [users, keys] = await Promise.all([api(companyPath(state.companyID, "/users")), api(companyPath(state.companyID, "/api-keys"))]);
  } catch (e) { return failed(e); }
  state.people = users.data;
  state.keys = keys.data;
  show("people");
  renderPeople();
  renderKeys();
  setStatus(plural(state.people.length, "user") + ", " + plural(state.keys.length, "API key") + ".");
}

const emailOf = (id) => {
  const user = (state.people || []).find((u) => u.id === id);
  return user ? user.email || "(no email) " + id.slice(0, 8) : id;
};

function renderPeople() {
  const columns = [
    ["User", (u) => u.email || "(no email)"], ["Role", (u) => u.role],
    ["Cap", (u) => (u.monthly_cap === null ? "the plan's" : number(u.monthly_cap))],
    ["Budget", (u) => (u.monthly_budget === null ? "the plan's" : dollars(u.monthly_budget))],
    ["Status", (u) => (u.disabled ? "disabled" : "active")],
    ["", (u) => el("span", { class: "row-actions" }, button("Edit", () => editUser(u), { "aria-label": "Edit " + (u.email || u.id) }),
      button("New key", () => createKey(u.id), { class: "secondary", "aria-label": "New key for " + (u.email || u.id), disabled: u.disabled }))],
  ];
  $("people-users").replaceChildren(table("The company's users", columns, state.people, (u) => ({ "data-user": u.id }), "No users yet."));
}

function userFields(u) {
  return [
    { name: "email", label: "Email", kind: "email", value: u ? u.email : "", blank: u ? "null" : "omit" },
    { name: "role", label: "Role", kind: "select", options: ROLES, value: u ? u.role : "member" },
    { name: "monthly_cap", label: "Monthly cap in units", kind: "limit", value: u ? u.monthly_cap : null,
      hint: "Blank: the plan's per-user cap. A number overrides it for this user." },
    { name: "monthly_budget", label: "Monthly budget in US dollars", kind: "money", value: u ? u.monthly_budget : null,
      hint: "Blank: the plan's per-user budget. Such as 12.50." },
  ];
}

function addUser() {
  openForm({
    title: "Add a user", fields: userFields(null), submit: "Add user",
    send: (body) => api(companyPath(state.companyID, "/users"), { method: "POST", body }),
    done: async (user) => { await openPeople(); setStatus("Added " + (user.email || "the user") + "."); },
  });
}

function editUser(u) {
  const fields = userFields(u).concat([{ name: "disabled", label: "Disabled: every call with this user's keys is refused", kind: "bool", value: u.disabled }]);
  openForm({
    title: "Edit " + (u.email || "user"), fields, submit: "Save",
    send: (body) => api(companyPath(state.companyID, "/users/" + encodeURIComponent(u.id)), { method: "PATCH", body }),
    done: async (user) => { await openPeople(); setStatus("Saved " + (user.email || "the user") + "."); },
  });
}

// ---------------------------------------------------------------- keys

function keyState(k) {
  if (k.revoked_at) return "revoked " + minute(k.revoked_at);
  if (k.expires_at && Date.parse(k.expires_at) <= Date.now()) return "expired " + minute(k.expires_at);
  if (k.expires_at) return "active, expires " + minute(k.expires_at);
  return "active";
}

const keyLive = (k) => !k.revoked_at && !(k.expires_at && Date.parse(k.expires_at) <= Date.now());

function renderKeys() {
  const columns = [
    ["Name", (k) => k.name || "—"], ["User", (k) => emailOf(k.user_id)], ["Key", (k) => k.prefix + "…"],
    ["Created", (k) => minute(k.created_at)], ["Last used", (k) => (k.last_used_at ? minute(k.last_used_at) : "never")],
    ["Features", (k) => (k.features === null ? "any" : k.features.join(", ") || "none")], ["State", keyState],
    ["", (k) => (keyLive(k) ? el("span", { class: "row-actions" },
      button("Rotate", () => rotateKey(k), { class: "secondary", "aria-label": "Rotate " + (k.name || k.prefix) }),
      button("Revoke", () => revokeKey(k), { class: "danger", "aria-label": "Revoke " + (k.name || k.prefix) })) : "")],
  ];
  const rows = state.keys.slice().sort((a, b) => keyLive(b) - keyLive(a) || b.created_at.localeCompare(a.created_at));
  $("people-keys").replaceChildren(table("The company's API keys", columns, rows, (k) => ({ "data-key": k.id, "data-live": String(keyLive(k)) }),
    "No API keys yet."));
}

// The plan's features, for binding a key to some of them (SPEC §8).
const planFeatures = () => ((state.company && state.company.usage.features) || []).map((f) => [f.id, f.name]);

function createKey(userID) {
  const users = state.people.filter((u) => !u.disabled).map((u) => [u.id, u.email || u.id]);
  if (!users.length) return setStatus("Add a user first: a key belongs to a user.");
  openForm({
    title: "Create an API key",
    fields: [
      { name: "user_id", label: "For user", kind: "select", options: users, value: userID },
      { name: "name", label: "Name", kind: "text", hint: "So people know what it is for, such as 'iOS app build server'." },
      { name: "expires_at", label: "Expires after", kind: "duration", unit: "86400", local: true,
        hint: "Blank: the key does not expire." },
      { name: "features", label: "Charged only to these features", kind: "checks", options: planFeatures(),
        hint: "None ticked: the key may be charged to any feature. Ticked: calls for other features are refused (403).",
        none: "The plan sells no features." },
    ],
    submit: "Create key",
    send: (body, value) => {
      const seconds = value("expires_at");
      // The API takes a past expiry (the key is created expired); here that is a slip.
      if (seconds === 0) throw new FieldError("expires_at", "Type a number above 0, or leave it blank: a key that expires at once cannot be used.");
      if (seconds !== null) body.expires_at = new Date(Date.now() + seconds * 1000).toISOString().replace(/\.\d{3}Z$/, "Z");
      if (!body.features.length) delete body.features;
      return api(companyPath(state.companyID, "/api-keys"), { method: "POST", body });
    },
    done: async (record) => {
      await openPeople();
      setStatus("Created the key " + record.prefix + "… for " + emailOf(record.user_id) + ".");
      return keyOnce(record, "The key for " + emailOf(record.user_id) + " is ready.");
    },
  });
}

function rotateKey(k) {
  openForm({
    title: "Rotate " + (k.name || k.prefix + "…"),
    intro: "A new key is made for the same user, name, expiry and features. The old key keeps working for the grace period, then stops.",
    fields: [{ name: "grace_seconds", label: "Grace period of the old key", kind: "duration", unit: "86400", value: 1,
      hint: "0: the old key stops at once." }],
    submit: "Rotate key",
    send: (body) => api(companyPath(state.companyID, "/api-keys/" + encodeURIComponent(k.id) + "/rotate"), { method: "POST", body }),
    done: async (record) => {
      await openPeople();
      setStatus("Rotated " + (k.name || k.prefix + "…") + ": the new key is " + record.prefix + "….");
      return keyOnce(record, "The new key for " + emailOf(record.user_id) + " is ready.");
    },
  });
}

function revokeKey(k) {
  confirmThen("Revoke " + (k.name || k.prefix + "…") + "?",
    "Every call with this key is refused from now on (401). This cannot be undone; a new key can be created.", "Revoke key",
    async () => {
      await api(companyPath(state.companyID, "/api-keys/" + encodeURIComponent(k.id)), { method: "DELETE" });
      await openPeople();
      setStatus("Revoked " + (k.name || k.prefix + "…") + ".");
    });
}
