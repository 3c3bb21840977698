// dstune dashboard: draws the study page's charts (Chart.js, served from /static) and sorts tables by header click.
(function () {
  "use strict";

  const COLORS = { ok: "#2563eb", front: "#dc2626", best: "#16a34a", oom: "#dc2626", diverged: "#ea580c", other: "#9333ea", grey: "#6b7280" };

  function axis(title, extra) {
    return Object.assign({ type: "linear", title: { display: true, text: title } }, extra || {});
  }

  function trialLabel(ctx) {
    const p = ctx.raw;
    const name = ctx.dataset.label;
    if (p && p.n !== undefined) {
      return name + " · trial " + p.n + ": (" + ctx.formattedValue + ")";
    }
    return name + ": " + ctx.formattedValue;
  }

  const common = {
    animation: false,
    responsive: true,
    maintainAspectRatio: false,
    plugins: { tooltip: { callbacks: { label: trialLabel } }, legend: { position: "bottom" } },
  };

  function scatter(id, datasets, xTitle, yTitle, xExtra, yExtra) {
    const y = axis(yTitle, Object.assign({ beginAtZero: true }, yExtra || {}));
    return makeChart(id, {
      type: "scatter",
      data: { datasets: datasets },
      options: Object.assign({}, common, { scales: { x: axis(xTitle, xExtra), y: y } }),
    });
  }

  // One range for both axes of a measured-against-predicted chart, so that its diagonal is the 45-degree line
  // from corner to corner: the values' span padded by 2 %, widened to whole ticks of a round step (1, 2 or 5 times a
  // power of ten, at most 8 steps over the span: 500 for a span of 1,960), so that both ends are ticks like the
  // others instead of 634.04 and 6,485.09 (never below zero).
  function sameRange(values) {
    if (!values.length) return {};
    const lo = Math.min.apply(null, values), hi = Math.max.apply(null, values);
    const span = (hi - lo) || Math.abs(hi) || 1;
    const power = Math.pow(10, Math.floor(Math.log10(span)));
    const step = [power / 5, power / 2, power, power * 2].find(function (s) { return span / s <= 8; });
    const round = function (v) { return Number(v.toPrecision(12)); };
    const min = round(Math.max(0, Math.floor((lo - span * 0.02) / step) * step));
    const max = round(Math.ceil((hi + span * 0.02) / step) * step);
    return { min: min, max: max, beginAtZero: false, ticks: { stepSize: round(step) } };
  }

  // The dashed line y = x from corner to corner of a chart whose axes share ``range`` (sameRange's).
  function diagonal(range, label) {
    const lo = range.min, hi = range.max;
    return { label: label, data: [{ x: lo, y: lo }, { x: hi, y: hi }], showLine: true,
      pointRadius: 0, borderDash: [6, 4], borderColor: COLORS.grey, backgroundColor: COLORS.grey, borderWidth: 1 };
  }

  function makeChart(id, config) {
    const canvas = document.getElementById(id);
    if (!canvas) return null;
    const empty = config.type === "bar" ? config.data.labels.length === 0
      : config.data.datasets.every(function (d) { return d.data.length === 0; });
    if (empty) {
      const note = document.createElement("p");
      note.className = "muted empty-chart";
      note.textContent = "Nothing to show yet.";
      canvas.parentNode.replaceChild(note, canvas);
      return null;
    }
    return new Chart(canvas, config);
  }

  function drawCharts() {
    const source = document.getElementById("chart-data");
    if (!source || typeof Chart === "undefined") return;
    const data = JSON.parse(source.textContent);
    const drawn = {};

    drawn.progress = scatter("chart-progress", [
      { label: "Measured trial", data: data.progress.trials, backgroundColor: COLORS.ok, borderColor: COLORS.ok },
      { label: "Best so far", data: data.progress.best, showLine: true, stepped: "after", pointRadius: 0,
        borderColor: COLORS.best, backgroundColor: COLORS.best, borderWidth: 2 },
    ], "Trial number", "Tokens/s", { ticks: { precision: 0 }, min: 0 });  // trials are whole numbers, from 0

    drawn.pareto = scatter("chart-pareto", [
      { label: "Measured trial", data: data.pareto.trials, backgroundColor: COLORS.ok, borderColor: COLORS.ok },
      { label: "Pareto front", data: data.pareto.front, showLine: true, pointRadius: 5, pointStyle: "rectRot",
        borderColor: COLORS.front, backgroundColor: COLORS.front, borderWidth: 2 },
    ], "Peak memory per GPU (" + data.memory_unit + ")", "Tokens/s");

    const byStatus = {};
    data.estimate.trials.forEach(function (p) { (byStatus[p.status] = byStatus[p.status] || []).push(p); });
    const values = data.estimate.trials.flatMap(function (p) { return [p.x, p.y]; });
    const datasets = Object.keys(byStatus).sort().map(function (status) {
      const color = COLORS[status] || (status === "ok" ? COLORS.ok : COLORS.other);
      return { label: status, data: byStatus[status], backgroundColor: color, borderColor: color };
    });
    const memory = sameRange(values);
    if (values.length) datasets.push(diagonal(memory, "measured = estimated"));
    const unit = " (" + data.memory_unit + ")";  // MiB under a budget below 1 GiB, as the tables' sizes read
    drawn.estimate = scatter("chart-estimate", datasets, "Estimated peak per GPU" + unit, "Measured peak per GPU" + unit,
      memory, memory);

    const measured = data.throughput.trials.filter(function (p) { return !p.stopped_early; });
    const stopped = data.throughput.trials.filter(function (p) { return p.stopped_early; });
    const rates = data.throughput.trials.flatMap(function (p) { return [p.x, p.y]; });
    const throughput = [
      { label: "Measured trial", data: measured, backgroundColor: COLORS.ok, borderColor: COLORS.ok },
      { label: "Stopped early (partial)", data: stopped, pointStyle: "triangle", pointRadius: 5,
        backgroundColor: COLORS.other, borderColor: COLORS.other },
    ];
    const speeds = sameRange(rates);
    if (rates.length) throughput.push(diagonal(speeds, "measured = predicted"));
    drawn.throughput = scatter("chart-throughput", throughput, "Predicted tokens/s", "Measured tokens/s",
      speeds, speeds);

    drawn.reasons = makeChart("chart-reasons", {
      type: "bar",
      data: { labels: data.reasons.labels,
              datasets: [{ label: "Pruned trials", data: data.reasons.counts, backgroundColor: COLORS.other }] },
      options: Object.assign({}, common, {
        indexAxis: "y",
        plugins: { legend: { display: false } },
        scales: { x: { beginAtZero: true, ticks: { precision: 0 }, title: { display: true, text: "Trials" } },
                  y: { ticks: { autoSkip: false, font: { size: 11 } } } },
      }),
    });
    window.dstuneCharts = drawn;
  }

  function cellKey(row, index) {
    const cell = row.cells[index];
    return cell.dataset.value !== undefined ? cell.dataset.value : cell.textContent.trim();
  }

  function sortTable(table, th, index) {
    const ascending = th.getAttribute("aria-sort") !== "ascending";
    table.querySelectorAll("thead th").forEach(function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
    const numeric = th.dataset.type === "num";
    const body = table.tBodies[0];
    const rows = Array.from(body.rows);
    rows.sort(function (a, b) {
      const x = cellKey(a, index), y = cellKey(b, index);
      if (x === "" || y === "") return (x === "") - (y === "");  // blanks last either way
      const order = numeric ? Number(x) - Number(y) : x.localeCompare(y);
      return ascending ? order : -order;
    });
    rows.forEach(function (row) { body.appendChild(row); });
  }

  function makeSortable() {
    document.querySelectorAll("table.sortable").forEach(function (table) {
      table.querySelectorAll("thead th").forEach(function (th, index) {
        if (!th.dataset.type) return;
        th.tabIndex = 0;
        th.title = "Sort by " + th.textContent.trim();
        th.addEventListener("click", function () { sortTable(table, th, index); });
        th.addEventListener("keydown", function (event) {
          if (event.key === "Enter" || event.key === " ") { event.preventDefault(); sortTable(table, th, index); }
        });
      });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    makeSortable();
    drawCharts();
  });
})();
