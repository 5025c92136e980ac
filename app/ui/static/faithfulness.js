/* explainq dashboard: the faithfulness curves of an attribution job (deletion / insertion per word ranking). */
(function () {
  "use strict";
  var COLOURS = ["#e66101", "#7f7f7f", "#2166ac"];
  var plots = new WeakMap();

  function draw(fig) {
    if (plots.has(fig)) return;
    var spec = JSON.parse(fig.dataset.faith || "{}");
    var target = fig.querySelector(".plot");
    if (!spec.x || !spec.series || !target) return;
    var data = [spec.x].concat(spec.series.map(function (s) {
      return s[1].map(function (v) { return typeof v === "number" ? v : null; });
    }));
    var plot = new uPlot({
      width: Math.max(target.clientWidth, 240), height: 220,
      scales: { x: { time: false, range: [0, 1] } },
      axes: [{ label: "fraction of words " + (fig.dataset.curve === "insertion" ? "added" : "removed") },
             { label: "score" }],
      series: [{ label: "fraction" }].concat(spec.series.map(function (s, i) {
        // IG drawn widest and first, so that a ranking that coincides with it stays visible on top
        return { label: s[0], stroke: COLOURS[i % COLOURS.length], width: i === 0 ? 3.5 : 1.5, spanGaps: true,
                 dash: s[0] === "random order" ? [6, 4] : undefined, points: { show: false } };
      })),
    }, data, target);
    plots.set(fig, plot);
    fig.dataset.points = String(spec.x.length);
  }

  window.addEventListener("resize", function () {
    document.querySelectorAll("figure.faith-chart").forEach(function (fig) {
      var plot = plots.get(fig);
      if (plot) plot.setSize({ width: Math.max(fig.querySelector(".plot").clientWidth, 240), height: 220 });
    });
  });

  htmx.onLoad(function (root) {
    root.querySelectorAll("figure.faith-chart").forEach(draw);
  });
})();
