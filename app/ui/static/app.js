/* explainq dashboard: live job updates from the public event stream, uPlot curves, small form helpers. */
(function () {
  "use strict";
  // a series without a colour of its own (GET /kinds gives every kind's series theirs: core/kinds/base.py)
  var COLOURS = ["#009E73", "#CC79A7", "#E69F00", "#56B4E9"];
  var STATUSES = ["queued", "running", "succeeded", "failed", "canceled"];
  var TERMINAL = ["succeeded", "failed", "canceled"];
  var plots = new WeakMap();
  var wired = new WeakSet();

  function num(v, digits) {
    if (v === null || v === undefined) return "–";
    if (typeof v !== "number") return String(v);
    if (Number.isInteger(v)) return String(v);
    digits = digits === undefined ? 4 : digits;
    if (v !== 0 && (Math.abs(v) < Math.pow(10, -(digits - 1)) || Math.abs(v) >= 1e6)) return v.toExponential(Math.max(digits - 2, 1));
    return v.toFixed(digits).replace(/0+$/, "").replace(/\.$/, "") || "0";
  }

  function duration(s) {
    if (typeof s !== "number" || !isFinite(s) || s < 0) return "–";
    if (s < 10) return s.toFixed(1) + " s";
    s = Math.round(s);
    var h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
    if (h) return h + " h " + String(m).padStart(2, "0") + " min";
    if (m) return m + " min " + String(r).padStart(2, "0") + " s";
    return r + " s";
  }

  function fmtTime(iso) {
    var t = new Date(iso);
    return isNaN(t) ? "–" : t.toISOString().slice(0, 19).replace("T", " ") + " UTC";
  }

  function chartData(rows, spec) {
    var x = rows.map(function (r) { return r.epoch; });
    var data = [x];
    spec.series.forEach(function (s) {
      data.push(rows.map(function (r) { var v = r[s[0]]; return typeof v === "number" ? v : null; }));
    });
    return data;
  }

  function plotWidth(target) { return Math.max(Math.min(target.clientWidth, 1200), 200); }

  // container._rows: one row per epoch; container._steps: the per-step running-loss curve (x: fractional epoch)
  function drawCharts(container) {
    container.querySelectorAll("figure.chart[data-chart]").forEach(function (fig) {
      var spec = JSON.parse(fig.dataset.chart);
      var rows = (spec.rows === "steps" ? container._steps : container._rows) || [];
      var target = fig.querySelector(".plot");
      var data = chartData(rows, spec);
      var plot = plots.get(fig);
      var steps = spec.rows === "steps";
      if (plot) {
        plot.setData(data);
      } else {
        plot = new uPlot({
          width: plotWidth(target), height: 220,
          scales: { x: { time: false } },
          axes: [{ label: "epoch", incrs: steps ? undefined : [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000] }, {}],
          series: [{ label: "epoch" }].concat(spec.series.map(function (s, i) {
            return { label: s[1], stroke: s[2] || COLOURS[i % COLOURS.length], width: steps ? 1.5 : 2, spanGaps: true,
                     points: { show: !steps, size: 5 } };
          })),
        }, data, target);
        plots.set(fig, plot);
      }
      fig.dataset.points = String(rows.length);
      fig.dataset.lastX = rows.length ? String(rows[rows.length - 1].epoch) : "";
    });
  }

  // the runs overlay: server-aligned data, one colour per run, validation dashed
  function drawOverlays(root) {
    root.querySelectorAll("figure.overlay").forEach(function (fig) {
      if (plots.get(fig)) return;
      var spec = JSON.parse(fig.dataset.overlay);
      var target = fig.querySelector(".plot");
      var data = [spec.x].concat(spec.series.map(function (s) { return s.values; }));
      plots.set(fig, new uPlot({
        width: plotWidth(target), height: 240,
        scales: { x: { time: false } },
        axes: [{ label: "epoch" }, {}],
        series: [{ label: "epoch" }].concat(spec.series.map(function (s) {
          return { label: s.label, stroke: s.colour, width: 2, spanGaps: true, dash: s.dash ? [6, 4] : undefined,
                   points: { show: spec.id !== "steps", size: 4 } };
        })),
      }, data, target));
    });
  }

  function initCharts(root) {
    drawOverlays(root);
    root.querySelectorAll(".charts").forEach(function (c) {
      c._rows = JSON.parse(c.dataset.rows || "[]");
      c._steps = JSON.parse(c.dataset.steps || "[]");
      drawCharts(c);
    });
  }

  // a metrics object as one chart row: nested values flattened with "_" (as the server's rows are)
  function flatRow(obj, prefix, out) {
    Object.keys(obj).forEach(function (k) {
      var v = obj[k];
      if (v && typeof v === "object" && !Array.isArray(v)) flatRow(v, prefix + k + "_", out);
      else if (!Array.isArray(v)) out[prefix + k] = v;
    });
    return out;
  }

  function updateCurves(view) {
    var c = document.getElementById("curves");
    if (!c || !view.metrics) return;
    var m = view.metrics;
    if (Array.isArray(m.steps)) c._steps = m.steps;
    if (c.dataset.source === "history") {
      if (Array.isArray(m.history)) c._rows = m.history.map(function (r) { return flatRow(r, "", {}); });
      var live = document.getElementById("live-metrics");
      if (live && m.epoch && m.batch !== undefined) live.textContent = "epoch " + m.epoch + ", batch " + m.batch + ", running loss " + num(m.running_train_loss) + ", lr " + num(m.lr);
    } else if (typeof m.epoch === "number") {
      var rows = (c._rows || []).filter(function (r) { return r.epoch !== m.epoch; });
      rows.push(flatRow(m, "", {}));
      rows.sort(function (a, b) { return a.epoch - b.epoch; });
      c._rows = rows;
    }
    drawCharts(c);
  }

  function onJobEvent(view) {
    var status = document.getElementById("job-status");
    if (status) status.innerHTML = '<span class="badge st-' + view.status + '">' + view.status + "</span>";
    var wrap = document.getElementById("job-progress");
    var p = view.progress;
    if (wrap && p) {
      var bar = wrap.querySelector("progress");
      if (p.total) { bar.max = 100; bar.value = Math.min(100, 100 * (p.done || 0) / p.total); }
      wrap.querySelector(".progress-text").textContent = (p.total ? num(p.done) + " / " + num(p.total) : num(p.done)) + " " + (p.unit || "");
      var eta = wrap.querySelector(".eta");
      if (eta) eta.textContent = TERMINAL.indexOf(view.status) < 0 && typeof p.eta_s === "number" ? "ETA " + duration(p.eta_s) : "";
    }
    [["job-started", view.started_at], ["job-finished", view.finished_at]].forEach(function (pair) {
      var el = document.getElementById(pair[0]);
      if (el && pair[1] && el.textContent.trim() === "–") el.textContent = fmtTime(pair[1]);
    });
    var msg = document.getElementById("job-message");
    if (msg && p && p.message) msg.textContent = p.message;
    var waiting = document.getElementById("job-waiting");
    if (waiting) { waiting.textContent = view.waiting_reason || ""; waiting.hidden = !view.waiting_reason; }
    updateCurves(view);
  }

  document.addEventListener("htmx:sseOpen", function (e) {
    var source = e.detail.source;
    if (e.target.id !== "job-live" || wired.has(source)) return;
    wired.add(source);
    STATUSES.forEach(function (name) {
      source.addEventListener(name, function (ev) { onJobEvent(JSON.parse(ev.data)); });
    });
  });

  function initToggles(root) {
    root.querySelectorAll("input[data-toggles]").forEach(function (box) {
      var body = document.getElementById(box.dataset.toggles);
      var sync = function () { body.hidden = !box.checked; };
      box.addEventListener("change", sync);
      sync();
    });
  }

  // Attribution pages: the values and table toggles apply at once (the URL keeps them, and so do the pager's
  // links); another colour scale is drawn by the server, so that choice reloads the page.
  function keepParams(form) {
    var params = new URLSearchParams(window.location.search);
    var values = form.querySelector("[data-attr-toggle]");
    var table = form.querySelector("[data-attr-view][value=table]");
    if (values && values.checked) params.set("values", "1"); else params.delete("values");
    if (table && table.checked) params.set("view", "table"); else params.delete("view");
    window.history.replaceState(null, "", window.location.pathname + (params.toString() ? "?" + params : ""));
    document.querySelectorAll(".attr .pager a").forEach(function (a) {
      var url = new URL(a.href, window.location.href);
      ["values", "view"].forEach(function (k) {
        if (params.has(k)) url.searchParams.set(k, params.get(k)); else url.searchParams.delete(k);
      });
      a.href = url.pathname + url.search;
    });
  }

  function initAttr(root) {
    root.querySelectorAll("form.attr-controls").forEach(function (form) {
      if (wired.has(form)) return;
      wired.add(form);
      var section = form.closest(".attr");
      form.classList.add("js");
      form.querySelectorAll("[data-attr-toggle]").forEach(function (box) {
        box.addEventListener("change", function () {
          section.classList.toggle(box.dataset.attrToggle, box.checked);
          keepParams(form);
        });
      });
      form.querySelectorAll("[data-attr-view]").forEach(function (radio) {
        radio.addEventListener("change", function () {
          section.classList.toggle("view-table", radio.value === "table" && radio.checked);
          keepParams(form);
        });
      });
      form.querySelectorAll("[data-attr-scale]").forEach(function (radio) {
        radio.addEventListener("change", function () { form.submit(); });
      });
    });
  }

  // Sortable tables: a heading's button sorts the rows by that column's data-value (numbers, or text with
  // data-kind="text"; data-abs sorts by size); a second press reverses the order.
  function initSortable(root) {
    root.querySelectorAll("table[data-sortable]").forEach(function (table) {
      if (wired.has(table)) return;
      wired.add(table);
      var heads = Array.prototype.slice.call(table.querySelectorAll("thead th"));
      heads.forEach(function (th, col) {
        var button = th.querySelector("button.sort");
        if (!button) return;
        button.addEventListener("click", function () {
          var text = button.dataset.kind === "text";
          var dir = th.getAttribute("aria-sort") === "descending" ? "ascending" : "descending";
          if (text && th.getAttribute("aria-sort") === "none") dir = "ascending";
          heads.forEach(function (h) { if (h.hasAttribute("aria-sort")) h.setAttribute("aria-sort", "none"); });
          th.setAttribute("aria-sort", dir);
          var body = table.tBodies[0];
          var rows = Array.prototype.slice.call(body.rows);
          var key = function (row) {
            var v = row.cells[col].dataset.value;
            if (text) return v;
            var n = parseFloat(v);
            return button.dataset.abs ? Math.abs(n) : n;
          };
          rows.sort(function (a, b) {
            var x = key(a), y = key(b);
            var c = text ? String(x).localeCompare(String(y)) : x - y;
            return dir === "ascending" ? c : -c;
          });
          rows.forEach(function (r) { body.appendChild(r); });
        });
      });
    });
  }

  window.addEventListener("resize", function () {
    document.querySelectorAll("figure.chart").forEach(function (fig) {
      var plot = plots.get(fig);
      if (plot) plot.setSize({ width: plotWidth(fig.querySelector(".plot")), height: fig.dataset.overlay ? 240 : 220 });
    });
  });

  htmx.onLoad(function (root) {
    initCharts(root);
    initToggles(root);
    initAttr(root);
    initSortable(root);
  });
})();

/* jobs list: a job that appears live replaces the "no jobs" line */
document.addEventListener("htmx:sseMessage", function (e) {
  if (e.target && e.target.id === "job-rows") {
    var none = document.getElementById("no-jobs");
    if (none) none.hidden = true;
  }
});

/* forms: rows of samples or triples, added and removed in place (a row's fields post in order) */
(function () {
  "use strict";
  var counter = 1000;

  function renumber(widget) {
    widget.querySelectorAll("[data-rows] > [data-row]").forEach(function (row, i) {
      row.querySelectorAll("[data-row-number]").forEach(function (el) { el.textContent = String(i + 1); });
    });
  }

  document.addEventListener("click", function (e) {
    var add = e.target.closest("[data-add-row]");
    var remove = e.target.closest("[data-remove-row]");
    if (!add && !remove) return;
    var widget = e.target.closest("[data-rows-widget]");
    if (!widget) return;
    var rows = widget.querySelector("[data-rows]");
    if (add) {
      counter += 1;
      var tpl = widget.querySelector("template[data-row-template]");
      var holder = document.createElement("div");
      holder.innerHTML = tpl.innerHTML.split("__N__").join(String(counter));
      var row = holder.firstElementChild;
      rows.appendChild(row);
      renumber(widget);
      var first = row.querySelector("input, textarea, select");
      if (first) first.focus();
    } else {
      var item = remove.closest("[data-row]");
      if (rows.querySelectorAll(":scope > [data-row]").length > 1) {
        item.remove();
      } else {
        item.querySelectorAll("input, textarea").forEach(function (el) { el.value = ""; });
        item.querySelectorAll("select").forEach(function (el) { el.selectedIndex = 0; });
      }
      renumber(widget);
      var next = widget.querySelector("[data-add-row]");
      if (next) next.focus();
    }
  });
})();
