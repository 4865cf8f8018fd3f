/* The study page (rlscale/views/page.py renders it): the runs over the study's axes (parallel coordinates, grouped
   by an axis, filtered by status and by ranges dragged on the axes), each run's evaluations with the sigmoid drawn
   from its fitted parameters, the runs table, the frontier; on the dashboard, refreshed with what changed.
   Names reach the page only as text: textContent in the table, legend and controls, fillText on the canvases; the
   sections this script swaps in were escaped by the server. */
(function () {
  "use strict";
  var PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf"];
  // viridis, for groups of more than 10 values (in their order)
  var RAMP = ["#440154", "#482878", "#3e4989", "#31688e", "#26828e", "#1f9e89", "#35b779", "#6ece58", "#b5de2b",
    "#fde725"];
  var HEIGHT = 380, PC_HEIGHT = 320, BAND_RUNS = 40, GRID = 48;
  var TABLE_ROWS = 100;  // rows the table shows until asked for all: hundreds of rows cost a long layout
  var STATUSES = ["running", "paused", "pending", "done", "stopped", "failed"];
  var COLUMNS = [["run", "run"], ["status", "status"], ["note", "holds / note"], ["step", "step"],
    ["compute", "GPU-hours"], ["reward", "last reward"], ["A", "A [95%]"], ["B", "B"], ["C_mid", "C_mid"],
    ["R0", "R0"], ["r2", "r2"], ["n_points", "points"], ["fit", "fit"], ["at_budget", "reward at budget"]];
  var state = {meta: null, rows: {}, order: [], frontier: null, group: null, hidden: {}, brushes: {}, sort: null,
    allRows: false};
  var charts = {}, drag = null, rendered = false;
  var dpr = window.devicePixelRatio || 1;

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) { node.className = cls; }
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    return node;
  }

  function fmt(v, digits, fixed) {
    if (v === null || v === undefined || (typeof v === "number" && !isFinite(v))) { return "-"; }
    if (typeof v !== "number") { return String(v); }
    return fixed ? v.toFixed(digits) : String(Number(v.toPrecision(digits)));
  }

  function sigmoid(c, f, A) { return f.R0 + (A - f.R0) / (1 + Math.pow(f.C_mid / c, f.B)); }

  function fitted(row) {
    return [row.A, row.B, row.C_mid, row.R0].every(function (v) { return typeof v === "number"; });
  }

  // ---- the runs, their groups and filters

  function runs() {
    return state.order.map(function (id) { return state.rows[String(id)]; }).filter(Boolean);
  }

  function value(row, axis) { return axis.fitted ? row[axis.key] : (row.axes || {})[axis.key]; }

  function groupValue(row) {
    if (state.group === "status" || state.group === "run") { return row[state.group]; }
    var v = (row.axes || {})[state.group];
    return v === undefined ? null : v;
  }

  function order(values) {
    return values.sort(function (a, b) {
      var na = typeof a === "number", nb = typeof b === "number";
      if (na && nb) { return a - b; }
      if (na !== nb) { return na ? -1 : 1; }
      return String(a).localeCompare(String(b));
    });
  }

  function groupColors(all) {
    var seen = {}, values = [];
    all.forEach(function (row) {
      var v = groupValue(row), key = String(v);
      if (!(key in seen)) { seen[key] = true; values.push(v); }
    });
    order(values);
    var colors = {};
    values.forEach(function (v, i) {
      colors[String(v)] = values.length <= PALETTE.length ? PALETTE[i]
        : RAMP[Math.round(i * (RAMP.length - 1) / (values.length - 1))];
    });
    return {values: values, colors: colors};
  }

  function colorOf(row, groups) {
    return state.group === "run" ? PALETTE[row.color % PALETTE.length] : groups.colors[String(groupValue(row))];
  }

  // where a value sits along an axis, 0 (bottom) to 1 (top); null when the run has none
  function place(axis, v) {
    if (v === null || v === undefined) { return null; }
    if (axis.kind === "ordinal") {
      var i = axis.values.indexOf(v);
      if (i < 0) { i = axis.values.map(String).indexOf(String(v)); }
      if (i < 0) { return null; }
      return axis.values.length === 1 ? 0.5 : i / (axis.values.length - 1);
    }
    if (typeof v !== "number") { return null; }
    var p = axis.kind === "log"
      ? (v > 0 ? Math.log(v / axis.lo) / Math.log(axis.hi / axis.lo) : null)
      : (v - axis.lo) / (axis.hi - axis.lo || 1);
    return p === null ? null : Math.min(1, Math.max(0, p));
  }

  function shown(row) {
    if (state.hidden[row.status]) { return false; }
    var axes = state.meta.axes;
    for (var i = 0; i < axes.length; i++) {
      var range = state.brushes[axes[i].key];
      if (!range) { continue; }
      var p = place(axes[i], value(row, axes[i]));
      if (p === null || p < range[0] - 1e-9 || p > range[1] + 1e-9) { return false; }
    }
    return true;
  }

  // ---- controls: group by, statuses, ranges

  function controls(all) {
    var box = document.getElementById("controls");
    if (!box) { return; }
    box.textContent = "";
    var label = el("label", null, "group by ");
    var select = el("select");
    select.id = "group-by";
    var options = state.meta.axes.filter(function (a) { return !a.fitted; }).map(function (a) { return a.key; });
    options.concat(["status", "run"]).forEach(function (key) {
      var option = el("option", null, key.replace(/_/g, " "));
      option.value = key;
      option.selected = key === state.group;
      select.appendChild(option);
    });
    select.addEventListener("change", function () { state.group = select.value; drawAll(); });
    label.appendChild(select);
    box.appendChild(label);
    var counts = {};
    all.forEach(function (row) { counts[row.status] = (counts[row.status] || 0) + 1; });
    STATUSES.concat(Object.keys(counts).filter(function (s) { return STATUSES.indexOf(s) < 0; }))
      .forEach(function (status) {
        if (!counts[status]) { return; }
        var item = el("label", "status-filter");
        var box2 = el("input");
        box2.type = "checkbox";
        box2.checked = !state.hidden[status];
        box2.dataset.status = status;
        box2.addEventListener("change", function () { state.hidden[status] = !box2.checked; drawAll(); });
        item.appendChild(box2);
        item.appendChild(document.createTextNode(" " + status + " (" + counts[status] + ")"));
        box.appendChild(item);
      });
    if (Object.keys(state.brushes).length) {
      var clear = el("button", null, "clear ranges");
      clear.type = "button";
      clear.addEventListener("click", function () { state.brushes = {}; drawAll(); });
      box.appendChild(clear);
    }
  }

  // ---- parallel coordinates (canvas)

  function canvasIn(box, name, width, height) {
    var canvas = charts[name];
    if (!canvas || canvas.parentNode !== box) {
      box.textContent = "";
      canvas = charts[name] = el("canvas");
      box.appendChild(canvas);
    }
    canvas.width = Math.round(width * dpr);
    canvas.height = Math.round(height * dpr);
    canvas.style.width = width + "px";
    canvas.style.height = height + "px";
    var ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, width, height);
    return ctx;
  }

  function parallel(all, groups) {
    var box = document.getElementById("chart-parallel");
    if (!box) { return; }
    var axes = state.meta.axes;
    if (!all.length || axes.length < 2) { box.textContent = all.length ? "" : "No runs yet."; return; }
    var width = Math.max(320, box.clientWidth || 900), height = PC_HEIGHT;
    var ctx = canvasIn(box, "parallel", width, height);
    var left = 50, right = 50, top = 34, bottom = 24;  // a test drags on the first axis, 50 px in
    var step = (width - left - right) / (axes.length - 1);
    var geom = {xs: axes.map(function (_, i) { return left + i * step; }), top: top, bottom: height - bottom};
    var y = function (p) { return geom.bottom - p * (geom.bottom - top); };
    charts.parallelGeom = geom;
    var lines = all.map(function (row) {
      return {row: row, on: shown(row), ys: axes.map(function (axis) {
        var p = place(axis, value(row, axis)); return p === null ? null : y(p);
      })};
    });
    charts.parallelLines = lines;
    var on = lines.filter(function (l) { return l.on; }).length;
    function path(line) {
      ctx.beginPath();
      var open = false;
      line.ys.forEach(function (yy, i) {
        if (yy === null) { open = false; return; }
        if (open) { ctx.lineTo(geom.xs[i], yy); } else { ctx.moveTo(geom.xs[i], yy); open = true; }
      });
      ctx.stroke();
    }
    ctx.lineWidth = 1;
    ctx.strokeStyle = "rgba(160,160,160,0.25)";
    lines.forEach(function (line) { if (!line.on) { path(line); } });
    ctx.globalAlpha = on > 150 ? 0.35 : on > 40 ? 0.55 : 0.85;
    ctx.lineWidth = on > 40 ? 1 : 1.6;
    lines.forEach(function (line) { if (line.on) { ctx.strokeStyle = colorOf(line.row, groups); path(line); } });
    ctx.globalAlpha = 1;
    ctx.font = "12px system-ui, sans-serif";
    ctx.textAlign = "center";
    axes.forEach(function (axis, i) {
      var x = geom.xs[i];
      ctx.strokeStyle = "#555";
      ctx.lineWidth = 1;
      ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, geom.bottom); ctx.stroke();
      ctx.fillStyle = "#222";
      // the outer axes' names run inwards, so that they stay on the canvas
      ctx.textAlign = i === 0 ? "left" : i === axes.length - 1 ? "right" : "center";
      var name = axis.label;  // shortened to its share of the width, so that neighbours' names do not overlap
      while (name.length > 4 && ctx.measureText(name).width > step - 10) { name = name.slice(0, -2) + "…"; }
      ctx.fillText(name, i === 0 ? Math.max(2, x - 12) : i === axes.length - 1 ? Math.min(width - 2, x + 12) : x, 14);
      ctx.fillStyle = "#555";
      ctx.textAlign = i === axes.length - 1 ? "right" : "left";
      ticks(axis).forEach(function (t) { ctx.fillText(t[1], x + (i === axes.length - 1 ? -4 : 4), y(t[0]) + 4); });
      ctx.textAlign = "center";
      var range = state.brushes[axis.key];
      if (range) {
        ctx.fillStyle = "rgba(59,110,165,0.25)";
        ctx.fillRect(x - 7, y(range[1]), 14, y(range[0]) - y(range[1]));
      }
    });
  }

  function ticks(axis) {
    if (axis.kind === "ordinal") {
      var n = axis.values.length, every = Math.max(1, Math.ceil(n / 8));
      return axis.values.map(function (v, i) { return [n === 1 ? 0.5 : i / (n - 1), fmt(v, 3)]; })
        .filter(function (_, i) { return i % every === 0 || i === n - 1; });
    }
    var out = [];
    for (var k = 0; k <= 4; k++) {
      var p = k / 4;
      var v = axis.kind === "log" ? axis.lo * Math.pow(axis.hi / axis.lo, p) : axis.lo + p * (axis.hi - axis.lo);
      out.push([p, fmt(v, 3)]);
    }
    return out;
  }

  function parallelEvents() {
    var box = document.getElementById("chart-parallel");
    if (!box || box.dataset.events) { return; }
    box.dataset.events = "1";
    var hover = document.getElementById("parallel-hover") || box.parentNode.insertBefore(el("p", "caption"),
      box.nextSibling);
    hover.id = "parallel-hover";
    function at(e) {
      var r = box.getBoundingClientRect();
      return {x: e.clientX - r.left, y: e.clientY - r.top};
    }
    function toP(yy) {
      var g = charts.parallelGeom;
      return Math.min(1, Math.max(0, (g.bottom - yy) / (g.bottom - g.top)));
    }
    box.addEventListener("mousedown", function (e) {
      var g = charts.parallelGeom, m = at(e);
      if (!g) { return; }
      for (var i = 0; i < g.xs.length; i++) {
        if (Math.abs(m.x - g.xs[i]) < 14) { drag = {axis: state.meta.axes[i].key, from: toP(m.y), to: toP(m.y)}; e.preventDefault(); return; }
      }
    });
    box.addEventListener("mousemove", function (e) {
      var m = at(e);
      if (drag) {
        drag.to = toP(m.y);
        state.brushes[drag.axis] = [Math.min(drag.from, drag.to), Math.max(drag.from, drag.to)];
        parallel(runs(), groupColors(runs()));
        return;
      }
      hover.textContent = nearest(m);
    });
    window.addEventListener("mouseup", function () {
      if (!drag) { return; }
      if (Math.abs(drag.to - drag.from) < 0.01) { delete state.brushes[drag.axis]; }
      drag = null;
      drawAll();
    });
  }

  // the run whose line passes nearest the pointer, in words (for the caption under the chart)
  function nearest(m) {
    var g = charts.parallelGeom, lines = charts.parallelLines;
    if (!g || !lines) { return ""; }
    var i = 0;
    while (i < g.xs.length - 2 && m.x > g.xs[i + 1]) { i++; }
    var t = Math.min(1, Math.max(0, (m.x - g.xs[i]) / (g.xs[i + 1] - g.xs[i]))), best = null, gap = 8;
    lines.forEach(function (line) {
      var a = line.ys[i], b = line.ys[i + 1];
      if (!line.on || a === null || b === null) { return; }
      var d = Math.abs(a + t * (b - a) - m.y);
      if (d < gap) { gap = d; best = line.row; }
    });
    if (!best) { return ""; }
    var parts = state.meta.axes.map(function (axis) { return axis.label + " " + fmt(value(best, axis), 3); });
    return best.run + " (" + best.status + "): " + parts.join(", ");
  }

  // ---- reward vs compute: points and sigmoids drawn on a uPlot chart's canvas

  function curves(all, groups) {
    var box = document.getElementById("chart-curves");
    if (!box) { return; }
    if (charts.curves) { charts.curves.destroy(); delete charts.curves; }
    var rows = all.filter(shown), extend = state.meta.extend || 2;
    var points = 0, evaluations = 0, xs = [], ys = [];
    rows.forEach(function (row) {
      points += row.c.length;
      evaluations += row.n;
      xs = xs.concat(row.c);
      ys = ys.concat(row.r);
      if (fitted(row) && row.c_max) {
        xs.push(row.c_max * extend);
        ys.push(sigmoid(row.c_max * extend, row, row.A));
      }
    });
    box.dataset.points = String(points);  // what is drawn, for a reader (and a test) to wait on
    box.dataset.evaluations = String(evaluations);
    box.textContent = "";
    if (!points) { box.textContent = rows.length ? "No evaluations yet." : "No run is shown."; return; }
    var xlo = Math.min.apply(null, xs.filter(function (x) { return x > 0; })), xhi = Math.max.apply(null, xs);
    var ylo = Math.min.apply(null, ys), yhi = Math.max.apply(null, ys), pad = (yhi - ylo) * 0.06 || 0.05;
    var bands = rows.length <= BAND_RUNS;
    function paint(u) {
      var ctx = u.ctx, px = function (x) { return u.valToPos(x, "x", true); };
      var py = function (v) { return u.valToPos(v, "y", true); };
      ctx.save();
      ctx.beginPath();
      ctx.rect(u.bbox.left, u.bbox.top, u.bbox.width, u.bbox.height);
      ctx.clip();
      var many = rows.length > 40;
      rows.forEach(function (row) {
        var color = colorOf(row, groups);
        if (fitted(row)) {
          var from = Math.max(row.c_min || xlo, xlo), until = row.c_max || from, end = until * extend;
          var grid = [];
          for (var k = 0; k < GRID; k++) { grid.push(from * Math.pow(end / from, k / (GRID - 1))); }
          if (bands && typeof row.A_lo === "number" && typeof row.A_hi === "number") {
            ctx.fillStyle = color;
            ctx.globalAlpha = 0.12;
            ctx.beginPath();
            grid.forEach(function (c, k) { var x = px(c), v = py(sigmoid(c, row, row.A_hi)); if (k) { ctx.lineTo(x, v); } else { ctx.moveTo(x, v); } });
            grid.slice().reverse().forEach(function (c) { ctx.lineTo(px(c), py(sigmoid(c, row, row.A_lo))); });
            ctx.closePath();
            ctx.fill();
          }
          ctx.globalAlpha = many ? 0.5 : 0.9;
          ctx.strokeStyle = color;
          ctx.lineWidth = (many ? 1 : 1.6) * dpr;
          [[true, grid.filter(function (c) { return c <= until * 1.000001; })],
            [false, grid.filter(function (c) { return c >= until * 0.999999; })]].forEach(function (part) {
            var cs = part[1];
            if (!part[0] && cs.length && cs[0] > until) { cs.unshift(until); }
            if (cs.length < 2) { return; }
            ctx.setLineDash(part[0] ? [] : [6 * dpr, 4 * dpr]);
            ctx.beginPath();
            cs.forEach(function (c, k) { var x = px(c), v = py(sigmoid(c, row, row.A)); if (k) { ctx.lineTo(x, v); } else { ctx.moveTo(x, v); } });
            ctx.stroke();
          });
          ctx.setLineDash([]);
        }
        ctx.globalAlpha = many ? 0.6 : 0.9;
        ctx.fillStyle = color;
        var r = (many ? 1.6 : 2.5) * dpr;
        for (var i = 0; i < row.c.length; i++) {
          if (row.r[i] === null) { continue; }
          ctx.beginPath();
          ctx.arc(px(row.c[i]), py(row.r[i]), r, 0, 2 * Math.PI);
          ctx.fill();
        }
      });
      ctx.restore();
    }
    var opts = {
      width: Math.max(320, box.clientWidth || 900), height: HEIGHT, legend: {show: false}, cursor: {show: false},
      series: [{}, {stroke: "transparent", points: {show: false}}],
      scales: {x: {time: false, distr: 3, range: [xlo, xhi]}, y: {range: [ylo - pad, yhi + pad]}},
      axes: [{label: state.meta.unit}, {label: state.meta.reward}],
      hooks: {draw: [paint]}
    };
    charts.curves = new uPlot(opts, [[xlo, xhi], [null, null]], box);
  }

  function legend(all, groups) {
    var box = document.getElementById("legend");
    if (!box) { return; }
    box.textContent = "";
    if (state.group === "run") { return; }
    box.appendChild(el("span", "legend-title", state.group.replace(/_/g, " ") + ":"));
    groups.values.slice(0, 24).forEach(function (v) {
      var item = el("span", "legend-item");
      var swatch = el("span", "swatch");
      swatch.style.background = groups.colors[String(v)];
      item.appendChild(swatch);
      item.appendChild(document.createTextNode(fmt(v, 4)));
      box.appendChild(item);
    });
    if (groups.values.length > 24) { box.appendChild(el("span", "legend-item", "… " + groups.values.length + " values")); }
  }

  // ---- the runs table

  function cell(row, key) {
    if (key === "A") { return fmt(row.A, 3, true) + " [" + fmt(row.A_lo, 3, true) + ", " + fmt(row.A_hi, 3, true) + "]"; }
    if (key === "fit") {
      if (row.identified) { return "identified"; }
      return row.reason ? "not identified: " + row.reason : (fitted(row) ? "not identified" : "");
    }
    if (key === "compute") {
      var text = fmt(row.compute, 4);
      if (typeof row.planned === "number" && row.planned > 0 && typeof row.compute === "number") {
        text += " of " + fmt(row.planned, 4) + " (" + Math.round(100 * row.compute / row.planned) + "%)";
      }
      return text;
    }
    var fixed = {B: 2, reward: 3, R0: 3, r2: 3, at_budget: 3};
    if (key in fixed) { return fmt(row[key], fixed[key], true); }
    if (key === "C_mid") { return fmt(row[key], 3); }
    var v = row[key];
    return v === null || v === undefined ? "" : String(v);
  }

  function table(all, groups) {
    var section = document.getElementById("runs");
    if (!section) { return; }
    var rows = all.filter(shown);
    if (state.sort) {
      var key = state.sort[0], sign = state.sort[1];
      rows = rows.slice().sort(function (a, b) {
        var x = a[key], y = b[key];
        if (x === null || x === undefined) { return 1; }
        if (y === null || y === undefined) { return -1; }
        return sign * (typeof x === "number" ? x - y : String(x).localeCompare(String(y)));
      });
    }
    var columns = COLUMNS.filter(function (c) {
      return c[0] === "run" || c[0] === "A" || c[0] === "fit" || all.some(function (row) {
        return row[c[0]] !== null && row[c[0]] !== undefined && row[c[0]] !== "";
      });
    });
    var head = section.querySelector("thead"), body = section.querySelector("tbody");
    var tr = el("tr");
    columns.forEach(function (c) {
      var th = el("th", null, c[1] + (state.sort && state.sort[0] === c[0] ? (state.sort[1] > 0 ? " ▲" : " ▼") : ""));
      th.addEventListener("click", function () {
        state.sort = state.sort && state.sort[0] === c[0] ? (state.sort[1] > 0 ? [c[0], -1] : null) : [c[0], 1];
        table(runs(), groupColors(runs()));
      });
      tr.appendChild(th);
    });
    head.textContent = "";
    head.appendChild(tr);
    var fragment = document.createDocumentFragment();
    var listed = state.allRows ? rows : rows.slice(0, TABLE_ROWS);
    listed.forEach(function (row) {
      var line = el("tr", "status-" + row.status + (row.identified ? "" : " unidentified"));
      columns.forEach(function (c) {
        var td = el("td", ["run", "note", "fit"].indexOf(c[0]) >= 0 ? null : "num");
        if (c[0] === "run") {
          var swatch = el("span", "swatch");
          swatch.style.background = colorOf(row, groups);
          td.appendChild(swatch);
          td.appendChild(document.createTextNode(row.run));
        } else {
          var text = cell(row, c[0]);
          // a long reason stays one line in a table of hundreds of runs: whole on hover
          td.textContent = text.length > 70 ? text.slice(0, 69) + "…" : text;
          if (text.length > 70) { td.title = text; }
        }
        line.appendChild(td);
      });
      fragment.appendChild(line);
    });
    body.textContent = "";
    body.appendChild(fragment);
    var count = document.getElementById("runs-shown");
    if (count) {
      count.textContent = rows.length === all.length ? all.length + " runs"
        : rows.length + " of " + all.length + " runs (the status and range filters above)";
      if (listed.length < rows.length) {
        count.appendChild(document.createTextNode("; the first " + listed.length + " listed "));
        var more = el("button", null, "list all " + rows.length);
        more.type = "button";
        more.addEventListener("click", function () { state.allRows = true; table(runs(), groupColors(runs())); });
        count.appendChild(more);
      }
    }
  }

  // ---- the frontier and the optimal-n law (uPlot)

  function frontier(d) {
    var box = document.getElementById("chart-frontier");
    if (!box) { return; }
    if (charts.frontier) { charts.frontier.destroy(); delete charts.frontier; }
    box.textContent = "";
    if (!d) { box.dataset.points = "0"; return; }
    var steps = uPlot.paths.stepped({align: 1});
    var line = function (color, extra) {
      return Object.assign({stroke: color, width: 2, spanGaps: true, points: {show: false}}, extra);
    };
    var opts = {
      width: Math.max(320, box.clientWidth || 900), height: HEIGHT, legend: {show: false},
      series: [{}, line("#7f7f7f", {label: "frontier n*", paths: steps}), line("#1f77b4", {label: "law"}),
        line("#1f77b4", {label: "law (extrapolated)", dash: [6, 4]})],
      scales: {x: {time: false, distr: 3}, y: {distr: 3, log: 2}},
      axes: [{label: d.unit}, {label: "rollouts per prompt n*"}]
    };
    charts.frontier = new uPlot(opts, [d.grid, d.frontier, d.law, d.beyond], box);
    box.dataset.points = String(d.grid.length);
  }

  function drawAll() {
    if (!state.meta) { return; }
    var keys = state.meta.axes.filter(function (a) { return !a.fitted; }).map(function (a) { return a.key; });
    if (!state.group || (keys.indexOf(state.group) < 0 && ["status", "run"].indexOf(state.group) < 0)) {
      state.group = state.meta.group;
    }
    var all = runs(), groups = groupColors(all);
    controls(all);
    parallel(all, groups);
    parallelEvents();
    curves(all, groups);
    legend(all, groups);
    frontier(state.frontier);
    table(all, groups);  // last: the charts read their boxes' widths before hundreds of rows need a layout
    if (!rendered) {
      rendered = true;
      // ms from navigation to the first frame painted with all of it (after the frame: layout and paint included)
      requestAnimationFrame(function () {
        setTimeout(function () { document.body.dataset.rendered = String(Math.round(performance.now())); }, 0);
      });
    }
  }

  function take(d) {
    if (d.full) { state.rows = {}; }
    if (d.meta) { state.meta = d.meta; }
    if (d.order) { state.order = d.order; }
    if (d.runs) { Object.keys(d.runs).forEach(function (id) { state.rows[id] = d.runs[id]; }); }
    if ("frontier" in d) { state.frontier = d.frontier; }
    var kept = {};
    state.order.forEach(function (id) { if (state.rows[String(id)]) { kept[String(id)] = state.rows[String(id)]; } });
    state.rows = kept;
  }

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
            Object.keys(d.sections || {}).forEach(function (id) {
              var node = document.getElementById(id);
              if (node) { node.innerHTML = d.sections[id]; }  // HTML the server escaped (rlscale/views/page.py)
            });
            take(d);
            drawAll();
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
    var data = document.getElementById("page-data");
    if (data) {
      var d = JSON.parse(data.textContent);
      d.full = true;
      take(d);
      drawAll();
    }
    window.addEventListener("resize", drawAll);
    if (document.body.dataset.live) { live(document.body.dataset.live, document.body.dataset.stamp || ""); }
  }

  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", start); } else { start(); }
})();
