/* explainq dashboard: live job updates from the public event stream, uPlot curves, small form helpers. */
(function () {
  "use strict";
  var COLOURS = ["#e66101", "#2166ac", "#5e3c99", "#1b9e77"];
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

  function drawCharts(container, rows) {
    container.querySelectorAll("figure.chart").forEach(function (fig) {
      var spec = JSON.parse(fig.dataset.chart);
      var target = fig.querySelector(".plot");
      var data = chartData(rows, spec);
      var plot = plots.get(fig);
      if (plot) {
        plot.setData(data);
      } else {
        plot = new uPlot({
          width: Math.max(target.clientWidth, 240), height: 220,
          scales: { x: { time: false } },
          axes: [{ label: "epoch", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000] }, {}],
          series: [{ label: "epoch" }].concat(spec.series.map(function (s, i) {
            return { label: s[1], stroke: COLOURS[i % COLOURS.length], width: 2, spanGaps: true,
                     points: { show: true, size: 5 } };
          })),
        }, data, target);
        plots.set(fig, plot);
      }
      fig.dataset.points = String(rows.length);
    });
  }

  function initCharts(root) {
    root.querySelectorAll(".charts").forEach(function (c) {
      c._rows = JSON.parse(c.dataset.rows || "[]");
      drawCharts(c, c._rows);
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
    if (c.dataset.source === "history") {
      if (!Array.isArray(m.history)) return;
      c._rows = m.history;
      var live = document.getElementById("live-metrics");
      if (live && m.epoch) live.textContent = "epoch " + m.epoch + ", batch " + m.batch + ", running loss " + num(m.running_train_loss) + ", lr " + num(m.lr);
    } else {
      if (typeof m.epoch !== "number") return;
      var rows = (c._rows || []).filter(function (r) { return r.epoch !== m.epoch; });
      rows.push(flatRow(m, "", {}));
      rows.sort(function (a, b) { return a.epoch - b.epoch; });
      c._rows = rows;
    }
    drawCharts(c, c._rows);
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
      if (plot) plot.setSize({ width: Math.max(fig.querySelector(".plot").clientWidth, 240), height: 220 });
    });
  });

  htmx.onLoad(function (root) {
    initCharts(root);
    initToggles(root);
    initAttr(root);
    initSortable(root);
  });
})();
