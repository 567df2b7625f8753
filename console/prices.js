// The usage console: the price book (SPEC §11), for the operator. The API replaces the book
// whole (`PUT /admin/v1/prices`), so a row is edited here and the whole book is sent with it;
// a bad row is refused with a message naming it and its member, shown beside that field.
"use strict";

const RATES = [["input", "Input"], ["output", "Output"], ["cache_write_5m", "Cache write (5 min)"],
  ["cache_write_1h", "Cache write (1 h)"], ["cache_read", "Cache read"]];

async function openPrices() {
  let book;
  try { book = await api("/admin/v1/prices"); } catch (e) { return failed(e); }
  state.prices = book.prices;
  const columns = [["Model", (r) => r.model], ["From", (r) => minute(r.effective_from)], ["Context", (r) => number(r.context_window)],
    ...RATES.map(([k, label]) => [label, (r) => dollars(r[k])]),
    ["Long prompt", (r) => (r.long_prompt ? "over " + number(r.long_prompt.threshold_tokens) + " tokens" : "—")],
    ["", (r) => el("span", { class: "row-actions" }, button("Edit", () => editPrice(state.prices.indexOf(r)), { "aria-label": "Edit " + r.model }),
      button("Delete", () => removePrice(state.prices.indexOf(r)), { class: "danger", "aria-label": "Delete " + r.model }))]];
  $("catalog-title").textContent = "Price book";
  $("catalog-body").replaceChildren(
    el("p", { class: "hint", text: "US dollars per million tokens. A model's row applies from its time on; * at the end of a model matches a prefix." }),
    el("p", {}, button("New price row", () => editPrice(-1), { id: "catalog-new" })),
    table("The price book", columns, state.prices, (r) => ({ "data-id": r.model + " " + r.effective_from }), "The price book is empty."));
  show("catalog");
  setStatus(plural(state.prices.length, "price row") + ".");
}

function priceFields(r) {
  const long = r && r.long_prompt;
  return [
    { name: "model", label: "Model", kind: "text", value: r && r.model },
    { name: "effective_from", label: "Effective from (ISO-8601)", kind: "text", value: r ? r.effective_from : new Date().toISOString() },
    { name: "context_window", label: "Context window (tokens)", kind: "int", value: r ? r.context_window : 200000 },
    ...RATES.map(([k, label]) => ({ name: k, label: label + " per million tokens", kind: "money", value: r && r[k] })),
    { name: "long_threshold", label: "Long prompt from (tokens)", kind: "int", value: long && long.threshold_tokens, aliases: ["long_prompt.threshold_tokens", "long_prompt"],
      hint: "Blank: no long-prompt tier. Else the rates below apply to prompts over it." },
    ...RATES.map(([k, label]) => ({ name: "long_" + k, label: "Long prompt: " + label.toLowerCase(), kind: "money",
      value: long && long[k], aliases: ["long_prompt." + k] })),
  ];
}

// A row from the form's body: the long-prompt tier only when its threshold is given.
function priceRow(body) {
  const row = { model: body.model, effective_from: body.effective_from, context_window: body.context_window };
  for (const [k] of RATES) row[k] = body[k];
  row.long_prompt = null;
  if (body.long_threshold !== null) {
    row.long_prompt = { threshold_tokens: body.long_threshold };
    for (const [k] of RATES) row.long_prompt[k] = body["long_" + k];
  }
  return row;
}

function editPrice(index) {
  const row = index >= 0 ? state.prices[index] : null;
  openForm({
    title: row ? "Edit the price of " + row.model : "New price row", fields: priceFields(row), submit: "Save the price book",
    send: (body) => {
      const book = state.prices.slice();
      if (index >= 0) book[index] = priceRow(body);
      else book.push(priceRow(body));
      return api("/admin/v1/prices", { method: "PUT", body: { prices: book } });
    },
    done: async () => { await openPrices(); setStatus("Saved the price book."); },
  });
}

function removePrice(index) {
  const row = state.prices[index];
  confirmThen("Delete the price of " + row.model + "?", "Calls with this model are priced by the next matching row, if any.", "Delete row",
    async () => {
      await api("/admin/v1/prices", { method: "PUT", body: { prices: state.prices.filter((_, i) => i !== index) } });
      await openPrices();
      setStatus("Deleted the price of " + row.model + ".");
    });
}
