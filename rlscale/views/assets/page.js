/* The study page's charts (uPlot), and on the dashboard its live refresh (rlscale/views/page.py renders the page).
   Names reach the page only as text: uPlot draws labels with textContent, and the sections this script swaps
   in were escaped by the server. */
(function () {
  "use strict";
  var PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf"];
  var HEIGHT = 380;
  var charts = {};

  function rgba(hex, alpha) {
    var n = parseInt(hex.slice(1), 16);
    return "rgba(" + (n >> 16) + "," + ((n >> 8) & 255) + "," + (n & 255) + "," + alpha + ")";
  }

  // uPlot wants one x array for every series: the sorted union, each series null where it has no value
  function union(lists) {
    var seen = new Set(), xs = [];
    lists.forEach(function (list) { list.forEach(function (x) { if (!seen.has(x)) { seen.add(x); xs.push(x); } }); });
    return xs.sort(function (a, b) { return a - b; });
  }

  function column(pos, size, xs, ys) {
    var out = new Array(size).fill(null);
    for (var i = 0; i < xs.length; i++) { if (ys[i] !== null) { out[pos.get(xs[i])] = ys[i]; } }
    return out;
  }

  function line(color, extra) {
    var s = {stroke: color, width: 1.6, spanGaps: true, points: {show: false}};
    return Object.assign(s, extra || {});
  }

  function curvesChart(d) {
    var xs = union([d.grid].concat(d.runs.map(function (r) { return r.c; })));
    var pos = new Map(xs.map(function (x, i) { return [x, i]; }));
    var data = [xs], series = [{}], bands = [], points = 0;
    d.runs.forEach(function (run) {
      var color = PALETTE[run.color % PALETTE.length];
      points += run.c.length;
      data.push(column(pos, xs.length, run.c, run.r));
      series.push({label: run.run, stroke: color, paths: function () { return null; },
        points: {show: true, size: 5, width: 1, stroke: color, fill: color}});
      if (!run.fit) { return; }
      var f = run.fit, g = d.grid;
      // solid over the run's own compute, dashed past it (one grid step overlaps so the two meet)
      var inside = f.mean.map(function (v, i) { return g[i] <= f.until || (i > 0 && g[i - 1] < f.until) ? v : null; });
      var past = f.mean.map(function (v, i) { return g[i] >= f.until || (i + 1 < g.length && g[i + 1] > f.until) ? v : null; });
      data.push(column(pos, xs.length, g, inside)); series.push(line(color, {label: run.run + " (fit)"}));
      data.push(column(pos, xs.length, g, past)); series.push(line(color, {label: run.run + " (extrapolated)", dash: [6, 4]}));
      data.push(column(pos, xs.length, g, f.hi)); series.push(line("transparent", {label: run.run + " (band)", width: 0}));
      data.push(column(pos, xs.length, g, f.lo)); series.push(line("transparent", {label: run.run + " (band)", width: 0}));
      bands.push({series: [data.length - 2, data.length - 1], fill: rgba(color, 0.15)});
    });
    return {points: points, data: data, opts: {
      series: series, bands: bands, legend: {show: false},
      scales: {x: {time: false, distr: 3}},
      axes: [{label: d.unit}, {label: d.reward}]}};
  }

  function frontierChart(d) {
    var steps = uPlot.paths.stepped({align: 1});
    var series = [{},
      {label: "frontier n*", stroke: "#7f7f7f", width: 2, paths: steps, spanGaps: true, points: {show: false}},
      line("#1f77b4", {label: "law", width: 2}),
      line("#1f77b4", {label: "law (extrapolated)", width: 2, dash: [6, 4]})];
    return {points: d.grid.length, data: [d.grid, d.frontier, d.law, d.beyond], opts: {
      series: series, legend: {show: false},
      scales: {x: {time: false, distr: 3}, y: {distr: 3, log: 2}},
      axes: [{label: d.unit}, {label: "rollouts per prompt n*"}]}};
  }

  var BUILDERS = {curves: curvesChart, frontier: frontierChart};

  function draw(name, d) {
    var box = document.getElementById("chart-" + name);
    if (!box) { return; }
    if (charts[name]) { charts[name].destroy(); delete charts[name]; }
    if (!d) { box.dataset.points = "0"; return; }
    var chart = BUILDERS[name](d);
    box.textContent = "";
    if (chart.data[0].length === 0) {
      box.textContent = "No evaluations yet.";
    } else {
      var opts = Object.assign({width: Math.max(320, box.clientWidth || 900), height: HEIGHT}, chart.opts);
      charts[name] = new uPlot(opts, chart.data, box);
    }
    box.dataset.points = String(chart.points);  // what is drawn, for a reader (and a test) to wait on
  }

  function drawAll(all) { Object.keys(BUILDERS).forEach(function (name) { draw(name, all[name]); }); }

  function live(url, stamp) {
    var status = document.getElementById("live-status");
    var changed = new Date();
    function show(text) { if (status) { status.textContent = text; } }
    function refresh() {
      fetch(url + "?since=" + encodeURIComponent(stamp), {headers: {Accept: "application/json"}, credentials: "same-origin"})
        .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.json(); })
        .then(function (d) {
          if (d.error) { show("live; the store did not answer: " + d.error); return; }
          if (d.changed) {
            stamp = d.stamp;
            changed = new Date();
            Object.keys(d.sections).forEach(function (id) {
              var el = document.getElementById(id);
              if (el) { el.innerHTML = d.sections[id]; }  // HTML the server escaped (rlscale/views/page.py)
            });
            drawAll(d.charts);
            document.body.dataset.stamp = stamp;
          }
          show("live: last change " + changed.toLocaleTimeString() + ", checked " + new Date().toLocaleTimeString());
        })
        .catch(function (e) { show("live; not updated: " + e.message); })
        .finally(function () { setTimeout(refresh, 1000); });
    }
    show("live");
    setTimeout(refresh, 1000);
  }

  function start() {
    var el = document.getElementById("page-charts");
    if (el) { drawAll(JSON.parse(el.textContent)); }
    window.addEventListener("resize", function () {
      Object.keys(charts).forEach(function (name) {
        var box = document.getElementById("chart-" + name);
        charts[name].setSize({width: Math.max(320, box.clientWidth), height: HEIGHT});
      });
    });
    if (document.body.dataset.live) { live(document.body.dataset.live, document.body.dataset.stamp || ""); }
  }

  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", start); } else { start(); }
})();
