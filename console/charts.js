// The usage console: SVG charts and meters (the daily chart, past periods, usage bars).
"use strict";

function meter(used, limit, label) {
  const span = el("span");
  const share = limit ? Math.min(1, used / limit) : 0;
  span.style.width = (limit ? share * 100 : 0) + "%";
  const bar = el("span", { class: "meter" + (limit && used >= limit ? " full" : ""), role: "img", "aria-label": label }, span);
  return bar;
}

// A meter of spent + held against the budget.
function costMeter(counter, label) {
  const limit = Number(micros(counter.limit)), committed = Number(micros(counter.used) + micros(counter.held));
  return meter(committed, limit, label);
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
  // A bar is at most 40 units wide: a short range is narrow bars, not one band across the page.
  const bar = Math.max(1, Math.min(40, slot * 0.8));
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
      group.append(svg("rect", { x: pad + i * slot + (slot - bar) / 2, y, width: bar, height: h, fill: COLORS[s % COLORS.length] }));
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

