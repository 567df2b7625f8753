// The usage console: forms in a dialog. A form is described by its fields; what it sends is
// checked by the API, and the API's error message is shown beside the field it names (its
// messages quote the field, as in "'monthly_cap' must be a whole number…"), or above the
// buttons when it names none. Nothing is sent twice: the submit button waits for the answer.
"use strict";

const UNITS = [["60", "minutes"], ["3600", "hours"], ["86400", "days"], ["1", "seconds"]];

// One input of a form. Kinds: text, email, int (a whole number), limit (blank: null, i.e.
// unlimited or the plan's), money (a decimal string, blank: null), select, bool, checks (a list),
// duration (a number and a unit: seconds, blank: null).
function fieldNode(f) {
  const id = "f-" + f.name, hintID = id + "-hint", errorID = id + "-error";
  const describedBy = (f.hint ? hintID + " " : "") + errorID;
  const box = el("div", { class: "field", "data-name": f.name });
  const attrs = { id, name: f.name, "aria-describedby": describedBy, autocomplete: "off", spellcheck: "false" };
  if (f.kind === "bool") {
    const input = el("input", Object.assign(attrs, { type: "checkbox" }));
    input.checked = !!f.value;
    box.append(el("label", { class: "check", for: id }, input, document.createTextNode(" " + f.label)));
  } else if (f.kind === "checks") {
    const set = el("fieldset", { id, "aria-describedby": describedBy }, el("legend", { text: f.label }));
    for (const [value, label] of f.options) {
      const input = el("input", { type: "checkbox", id: id + "-" + value, value });
      input.checked = (f.value || []).includes(value);
      set.append(el("label", { class: "check", for: id + "-" + value }, input, document.createTextNode(" " + label)));
    }
    if (!f.options.length) set.append(el("p", { class: "empty", text: f.none || "None to choose from." }));
    box.append(set);
  } else {
    box.append(el("label", { for: id, text: f.label }));
    let input;
    if (f.kind === "select") {
      input = el("select", attrs, ...f.options.map(([value, label]) => el("option", { value, text: label })));
      input.value = f.value === null || f.value === undefined ? f.options[0][0] : String(f.value);
    } else {
      const type = f.kind === "email" ? "email" : "text";
      const mode = f.kind === "int" || f.kind === "limit" || f.kind === "duration" ? "numeric" : f.kind === "money" ? "decimal" : null;
      input = el("input", Object.assign(attrs, { type, inputmode: mode }));
      input.value = f.value === null || f.value === undefined ? "" : String(f.value);
    }
    if (f.kind === "duration") {
      const unit = el("select", { id: id + "-unit", "aria-label": f.label + ": unit" }, ...UNITS.map(([v, l]) => el("option", { value: v, text: l })));
      unit.value = f.unit || "86400";
      box.append(el("span", { class: "duration" }, input, unit));
    } else box.append(input);
  }
  if (f.hint) box.append(el("p", { class: "hint", id: hintID, text: f.hint }));
  box.append(el("p", { class: "error", id: errorID }));
  return box;
}

// A field's value as the API wants it; `undefined`: leave it out of the body.
function fieldValue(form, f) {
  const input = form.querySelector("#f-" + f.name);
  if (f.kind === "bool") return input.checked;
  if (f.kind === "checks") return [...input.querySelectorAll("input:checked")].map((i) => i.value);
  const text = input.value.trim();
  if (f.kind === "select") return text === "" ? null : text;
  if (!text) {
    if (f.blank === "omit") return undefined;
    if (f.blank === "null") return null;
    return f.kind === "text" || f.kind === "email" ? undefined : null;
  }
  if (f.kind === "int" || f.kind === "limit") return /^-?\d{1,15}$/.test(text) ? Number(text) : text;
  if (f.kind === "duration") {
    if (!/^\d{1,9}$/.test(text)) throw new FieldError(f.name, "Type a whole number (or leave it blank).");
    return Number(text) * Number(form.querySelector("#f-" + f.name + "-unit").value);
  }
  return text;
}

class FieldError extends Error {
  constructor(field, message) { super(message); this.field = field; }
}

// Where an API error goes: the first quoted name in its message that is a field of the form.
function errorField(message, fields) {
  for (const match of message.matchAll(/'([A-Za-z0-9_.]+)'/g)) {
    const field = fields.find((f) => f.name === match[1] || (f.aliases || []).includes(match[1]));
    if (field) return field.name;
  }
  return null;
}

function clearErrors(form) {
  form.querySelectorAll(".field .error").forEach((p) => { p.textContent = ""; });
  form.querySelectorAll("[aria-invalid]").forEach((i) => i.removeAttribute("aria-invalid"));
  form.querySelector(".form-error").textContent = "";
}

function showError(form, fields, name, message) {
  const target = name || errorField(message, fields);
  if (!target) {
    form.querySelector(".form-error").textContent = message;
    return;
  }
  form.querySelector("#f-" + target + "-error").textContent = message;
  const input = form.querySelector("#f-" + target);
  input.setAttribute("aria-invalid", "true");
  (input.matches("fieldset") ? input.querySelector("input") || input : input).focus();
}

// Opens the editor dialog with a form. `send(body)` calls the API; `done(result)` runs after a
// success and may return a node to show in the dialog instead of closing it (a new key, once).
function openForm({ title, intro, fields, submit, send, done, danger }) {
  const dialog = $("editor");
  $("editor-title").textContent = title;
  const form = el("form", { class: "form", novalidate: true });
  if (intro) form.append(el("p", { text: intro }));
  for (const f of fields) form.append(fieldNode(f));
  const save = el("button", { type: "submit", class: danger ? "danger" : null, text: submit });
  form.append(el("p", { class: "error form-error", role: "alert" }),
    el("p", { class: "actions" }, save, button("Cancel", () => dialog.close(), { class: "secondary" })));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors(form);
    const body = {};
    try {
      for (const f of fields) {
        const value = fieldValue(form, f);
        if (value !== undefined && !f.local) body[f.name] = value;
      }
    } catch (e) { return showError(form, fields, e.field, e.message); }
    save.disabled = true;
    let result;
    try {
      result = await send(body, (name) => fieldValue(form, fields.find((f) => f.name === name)));
    } catch (e) {
      save.disabled = false;
      if (e instanceof FieldError) return showError(form, fields, e.field, e.message);
      if (e.status === 401) { dialog.close(); return signOut(e.message); }
      return showError(form, fields, null, e.message);
    }
    const next = done ? await done(result) : null;
    if (next instanceof Node) {
      $("editor-body").replaceChildren(next);
      const focus = next.querySelector("[data-autofocus]") || next.querySelector("button");
      if (focus) focus.focus();
    } else dialog.close();
  });
  $("editor-body").replaceChildren(form);
  if (!dialog.open) dialog.showModal();
  const first = form.querySelector("input, select, button");
  if (first) first.focus();
}

// A new API key, shown once: a read-only field, a copy button, and a way to close.
function keyOnce(record, words) {
  const value = el("input", { id: "new-key", type: "text", readonly: true, "aria-describedby": "new-key-hint", spellcheck: "false" });
  value.value = record.key;
  const copied = el("p", { id: "copy-status", role: "status" });
  const copy = button("Copy the key", async () => {
    value.select();
    try {
      await navigator.clipboard.writeText(value.value);
      copied.textContent = "Copied to the clipboard.";
    } catch (e) {
      copied.textContent = "The browser did not allow copying; the key is selected: press Ctrl+C (⌘C on a Mac).";
    }
  }, { id: "copy-key", "data-autofocus": true });
  const close = button("Done", () => { value.value = ""; $("editor").close(); }, { class: "secondary" });
  return el("div", { class: "once" }, el("p", { text: words }), el("label", { for: "new-key", text: "The new key" }), value,
    el("p", { class: "hint", id: "new-key-hint", text: "This is the only time it is shown: only its hash is kept. Copy it now." }),
    el("p", { class: "actions" }, copy, close), copied);
}

// Asks before something that cannot be undone; `action()` runs on yes.
function confirmThen(title, words, yes, action) {
  openForm({ title, intro: words, fields: [], submit: yes, danger: true, send: action });
}
