// The leaderboard page: reads window.LEADERBOARD (data.js, written by `suite leaderboard`)
// and renders the tables and the per-entry detail view (hash route #/entry/<id>).
//
// Safety rule: every string that comes from a result bundle reaches the page through
// text nodes (textContent, createTextNode, new Option). Nothing here uses innerHTML,
// insertAdjacentHTML or document.write, so markup in a run, model or host name is shown
// as text and cannot run.
(function () {
  "use strict";

  var DATA = window.LEADERBOARD;
  var SVG_NS = "http://www.w3.org/2000/svg";
  var SEED_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"];
  var state = { sort: {}, filters: { precision: "", algorithm: "", model: "", framework: "", hardware: "" } };

  // ---- small DOM helpers (text only) ---------------------------------------------------
  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    setAttrs(node, attrs);
    append(node, children);
    return node;
  }

  function svg(tag, attrs, children) {
    var node = document.createElementNS(SVG_NS, tag);
    setAttrs(node, attrs);
    append(node, children);
    return node;
  }

  function setAttrs(node, attrs) {
    Object.keys(attrs || {}).forEach(function (k) {
      if (attrs[k] === null || attrs[k] === undefined || attrs[k] === false) return;
      if (k === "text") node.textContent = String(attrs[k]);
      else node.setAttribute(k, String(attrs[k]));
    });
  }

  function append(node, children) {
    (Array.isArray(children) ? children : [children]).forEach(function (c) {
      if (c === null || c === undefined) return;
      node.appendChild(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
    });
  }

  // ---- number formatting ------------------------------------------------------------------
  // Non-finite values arrive as the strings "NaN" / "Infinity" (strict JSON has no NaN).
  function isNum(x) { return typeof x === "number" && isFinite(x); }
  function fmtAcc(x) { return isNum(x) ? x.toFixed(3) : (typeof x === "string" ? x : "\u2013"); }
  function fmtSci(x) { return isNum(x) ? (x === 0 ? "0" : x.toExponential(2)) : (typeof x === "string" ? x : "\u2013"); }
  function fmtInt(x) { return isNum(x) ? String(Math.round(x)) : "\u2013"; }
  function fmtTime(s) {
    if (!isNum(s)) return "\u2013";
    if (s < 120) return s.toFixed(0) + " s";
    if (s < 7200) return (s / 60).toFixed(1) + " min";
    return (s / 3600).toFixed(1) + " h";
  }
  function fmtMetric(key, x) {
    if (key.indexOf("mismatch/") === 0) return fmtSci(x);
    if (key.indexOf("time/") === 0) return fmtTime(x);
    if (key.indexOf("transfer/") === 0) return isNum(x) ? (x > 0 ? "+" : "") + x.toFixed(1) : fmtAcc(x);
    return fmtAcc(x);
  }

  // ---- columns -------------------------------------------------------------------------------
  function metric(e, key) { return (e.metrics[key] || {}).iqm; }

  function statCell(e, key) {
    var m = e.metrics[key] || {};
    var kids = [el("span", { class: "v", text: fmtMetric(key, m.iqm) })];
    if (isNum(m.lo) && isNum(m.hi) && m.n > 1) {
      kids.push(el("span", { class: "ci", text: "[" + fmtMetric(key, m.lo) + ", " + fmtMetric(key, m.hi) + "]" }));
    }
    return kids;
  }

  function verdictBadge(e) {
    var cls = e.passes === e.seeds ? "all" : (e.passes > 0 ? "some" : "none");
    return el("span", { class: "badge " + cls, title: "per seed: " + e.verdicts.join(", "),
                        text: e.passes + "/" + e.seeds + " pass" });
  }

  function columnsFor(task) {
    var cols = [
      { key: "rank", label: "#", num: true, value: function (e) { return e.rank; },
        cell: function (e) { return String(e.rank); } },
      { key: "algorithm", label: "Algorithm", value: function (e) { return e.algorithm; },
        cell: function (e) {
          return [el("a", { href: "#/entry/" + encodeURIComponent(e.id), class: "entry-link", text: e.algorithm }),
                  e.variant ? el("div", { class: "variant", text: e.variant }) : null];
        } },
      { key: "precision", label: "Precision flow", value: function (e) { return e.precision; },
        cell: function (e) { return el("span", { class: "prec", text: e.precision }); } },
      { key: "model", label: "Model", cls: "wrap-cell", value: function (e) { return e.model; },
        cell: function (e) { return e.model; } },
      { key: "framework", label: "Framework", title: "the RL loop that trained it and its version (docs/bundle.md)",
        value: function (e) { return e.framework; }, cell: function (e) { return el("span", { class: "fw", text: e.framework }); } },
      { key: "verdict", label: "Verdict", num: true, title: "runs that pass / seeds",
        value: function (e) { return e.passes / e.seeds; }, cell: verdictBadge },
      { key: "peak", label: "Peak acc", num: true, title: "peak training accuracy: IQM over seeds [95% bootstrap CI]",
        value: function (e) { return metric(e, "accuracy/peak"); },
        cell: function (e) { return statCell(e, "accuracy/peak"); } },
      { key: "final", label: "Final acc", num: true, title: "final training accuracy: IQM over seeds [95% bootstrap CI]",
        value: function (e) { return metric(e, "accuracy/final"); },
        cell: function (e) { return statCell(e, "accuracy/final"); } },
      { key: "steps", label: "Steps to pass", num: true,
        title: "first step whose 5-step moving accuracy exceeds the threshold: median over the seeds that got there",
        value: function (e) { return e.first_pass.median; },
        cell: function (e) {
          return [el("span", { class: "v", text: fmtInt(e.first_pass.median) }),
                  e.first_pass.reached < e.seeds ? el("span", { class: "ci", text: e.first_pass.reached + "/" + e.seeds + " seeds" }) : null];
        } },
      { key: "k3_0", label: "Step-0 k3 KL", num: true, title: "sampler vs trainer k3 KL before the first update (IQM over seeds)",
        value: function (e) { return metric(e, "mismatch/step0/kl_k3"); },
        cell: function (e) { return fmtSci(metric(e, "mismatch/step0/kl_k3")); } },
      { key: "dp_0", label: "Step-0 |\u0394p|", num: true, title: "mean |p_trainer - p_sampler| before the first update (IQM over seeds)",
        value: function (e) { return metric(e, "mismatch/step0/prob_diff/mean"); },
        cell: function (e) { return fmtSci(metric(e, "mismatch/step0/prob_diff/mean")); } },
      { key: "k3_f", label: "Final k3 KL", num: true, title: "k3 KL over the final window (IQM over seeds)",
        value: function (e) { return metric(e, "mismatch/final/kl_k3"); },
        cell: function (e) { return fmtSci(metric(e, "mismatch/final/kl_k3")); } },
      { key: "dp_f", label: "Final |\u0394p|", num: true, title: "mean |p_trainer - p_sampler| over the final window (IQM over seeds)",
        value: function (e) { return metric(e, "mismatch/final/prob_diff/mean"); },
        cell: function (e) { return fmtSci(metric(e, "mismatch/final/prob_diff/mean")); } }
    ];
    // Held-out accuracy and transfer index: only the columns some entry of this task has.
    var extra = {};
    task.entries.forEach(function (e) {
      Object.keys(e.metrics).forEach(function (k) {
        if ((k.indexOf("eval/") === 0 || k.indexOf("transfer/") === 0) && e.metrics[k].n > 0) extra[k] = true;
      });
    });
    // A transfer index whose math gain was <= 0 is flagged by `suite transfer`, not a number: say so.
    task.entries.forEach(function (e) {
      if (e.runs.some(function (r) { return (r.transfer_flags || []).length; })) {
        extra["transfer/ti_other"] = extra["transfer/ti_non"] = true;
      }
    });
    Object.keys(extra).sort().forEach(function (k) {
      var ti = k.indexOf("transfer/ti_") === 0;
      cols.push({ key: k, label: k, num: true,
                  title: ti ? k + ": Transferability Index (arXiv 2507.00432, v2 without sigma) of the final checkpoint vs its base, lm-eval; IQM over seeds; docs/transfer.md"
                            : k + " (IQM over seeds that report it)",
                  value: function (e) { return metric(e, k); },
                  cell: function (e) {
                    var flags = [];
                    e.runs.forEach(function (r) { (r.transfer_flags || []).forEach(function (f) { flags.push(f); }); });
                    if (ti && !isNum(metric(e, k)) && flags.length) {
                      return el("span", { class: "v", title: flags.join(", "), text: "flagged" });
                    }
                    return statCell(e, k);
                  } });
    });
    cols.push(
      { key: "time", label: "Wall time", num: true, title: "training wall time per run (IQM over seeds)",
        value: function (e) { return metric(e, "time/total_s"); },
        cell: function (e) { return fmtTime(metric(e, "time/total_s")); } },
      { key: "hardware", label: "Hardware", cls: "wrap-cell hw", value: function (e) { return e.hardware.join(", "); },
        cell: function (e) { return e.hardware.join(", "); } },
      { key: "seeds", label: "Seeds", num: true, value: function (e) { return e.seeds; },
        cell: function (e) { return String(e.seeds); } }
    );
    return cols;
  }

  // Missing values (null, NaN strings) sort last in either direction.
  function compare(a, b, dir) {
    var am = a === null || a === undefined || (typeof a === "number" && !isFinite(a)) || a === "NaN";
    var bm = b === null || b === undefined || (typeof b === "number" && !isFinite(b)) || b === "NaN";
    if (am || bm) return am === bm ? 0 : (am ? 1 : -1);
    var c = typeof a === "string" ? a.localeCompare(b) : a - b;
    return dir === "asc" ? c : -c;
  }

  // ---- index view ----------------------------------------------------------------------------
  function allEntries() {
    var out = [];
    DATA.tasks.forEach(function (t) { t.entries.forEach(function (e) { out.push(e); }); });
    return out;
  }

  function matches(e) {
    var f = state.filters;
    return (!f.precision || e.precision === f.precision) && (!f.algorithm || e.algorithm === f.algorithm) &&
           (!f.model || e.model === f.model) && (!f.framework || e.framework === f.framework) &&
           (!f.hardware || e.hardware.indexOf(f.hardware) >= 0);
  }

  function filterBar() {
    var bar = el("div", { class: "filters", role: "search" });
    var entries = allEntries();
    [["precision", "Precision"], ["algorithm", "Algorithm"], ["model", "Model"], ["framework", "Framework"], ["hardware", "Hardware"]]
      .forEach(function (pair) {
        var name = pair[0];
        var values = {};
        entries.forEach(function (e) {
          (name === "hardware" ? e.hardware : [e[name]]).forEach(function (v) { values[v] = true; });
        });
        var select = el("select", { id: "filter-" + name, name: name });
        select.appendChild(new Option("all", ""));
        Object.keys(values).sort().forEach(function (v) { select.appendChild(new Option(v, v)); });
        select.value = state.filters[name];
        select.addEventListener("change", function () { state.filters[name] = select.value; renderTables(); });
        bar.appendChild(el("label", {}, [el("span", { text: pair[1] }), select]));
      });
    return bar;
  }

  function renderIndex() {
    var root = document.getElementById("index-view");
    root.textContent = "";
    root.appendChild(el("details", { class: "about" }, [
      el("summary", { text: "How to read this table" }),
      el("p", {}, ["One row per (algorithm, precision flow, model, framework); its seeds are aggregated. ",
                   "Accuracy is training accuracy on the perfectible prompts: IQM over seeds with a " + DATA.ci + " in brackets. ",
                   "Mismatch compares the sampler's and the trainer's probabilities of the sampled tokens; lower is better. ",
                   "Click a column header to sort, an algorithm to open the entry's curves and provenance."]),
      el("p", {}, [el("strong", { text: "Default ranking: " }), DATA.ranking]),
      el("p", {}, [el("strong", { text: "Verdict rule: " }), DATA.verdict_rule])
    ]));
    root.appendChild(filterBar());
    root.appendChild(el("div", { id: "tables" }));
    if (DATA.rejected.length) {
      var list = el("ul", { class: "rejected-list" });
      DATA.rejected.forEach(function (r) {
        list.appendChild(el("li", {}, [el("code", { text: r.source }), ": ", el("span", { class: "reason", text: r.reason })]));
      });
      root.appendChild(el("section", { id: "rejected", class: "rejected" }, [
        el("h2", { text: "Rejected submissions (" + DATA.rejected.length + ")" }),
        el("p", { class: "muted", text: "These bundles failed validation and are not in the tables above." }),
        list
      ]));
    }
    renderTables();
  }

  function renderTables() {
    var holder = document.getElementById("tables");
    holder.textContent = "";
    if (!DATA.tasks.length) holder.appendChild(el("p", { class: "notice", text: "No accepted runs." }));
    DATA.tasks.forEach(function (task) {
      task.entries.forEach(function (e, i) { e.rank = i + 1; });
      var cols = columnsFor(task);
      var sort = state.sort[task.task] || { key: "rank", dir: "asc" };
      var col = cols.filter(function (c) { return c.key === sort.key; })[0] || cols[0];
      var rows = task.entries.filter(matches).slice().sort(function (a, b) {
        return compare(col.value(a), col.value(b), sort.dir) || a.rank - b.rank;
      });

      var headRow = el("tr");
      cols.forEach(function (c) {
        var active = c.key === sort.key;
        var th = el("th", { scope: "col", class: (c.num ? "num " : "") + (active ? "sorted" : ""), title: c.title,
                            "data-key": c.key, "aria-sort": active ? (sort.dir === "asc" ? "ascending" : "descending") : "none" });
        var button = el("button", { type: "button" }, [c.label, el("span", { class: "arrow",
                        text: active ? (sort.dir === "asc" ? " \u25B2" : " \u25BC") : "" })]);
        button.addEventListener("click", function () {
          state.sort[task.task] = { key: c.key, dir: active && sort.dir === "asc" ? "desc" : "asc" };
          renderTables();
        });
        th.appendChild(button);
        headRow.appendChild(th);
      });
      var body = el("tbody");
      rows.forEach(function (e) {
        var tr = el("tr", { "data-id": e.id });
        cols.forEach(function (c) { tr.appendChild(el("td", { class: (c.num ? "num " : "") + (c.cls || "") }, c.cell(e))); });
        body.appendChild(tr);
      });
      if (!rows.length) {
        body.appendChild(el("tr", {}, [el("td", { colspan: cols.length, class: "empty", text: "No entry matches the filters." })]));
      }
      holder.appendChild(el("section", { class: "task" }, [
        el("h2", {}, ["Task ", el("code", { text: task.task })]),
        el("div", { class: "table-scroll" }, [el("table", { class: "board", "data-task": task.task },
                                                 [el("thead", {}, [headRow]), body])])
      ]));
    });
  }

  // ---- charts (inline SVG) -----------------------------------------------------------------
  // Ticks at 1, 2 or 5 times a power of ten, about `count` of them over [lo, hi].
  function niceTicks(lo, hi, count) {
    var raw = (hi - lo || 1) / count;
    var mag = Math.pow(10, Math.floor(Math.log10(raw)));
    var step = [1, 2, 5, 10].map(function (m) { return m * mag; }).filter(function (s) { return s >= raw; })[0];
    var ticks = [];
    for (var v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) ticks.push(+v.toFixed(10));
    return ticks;
  }

  // series: [{label, color, points: [[x, y], ...], width, opacity}]; y null/non-finite breaks the line.
  function lineChart(opts) {
    var W = 640, H = 270, L = 62, R = 16, T = 14, B = 40;
    var xs = [], ys = [];
    opts.series.forEach(function (s) {
      s.points.forEach(function (p) {
        if (isNum(p[1]) && (!opts.log || p[1] > 0)) { xs.push(p[0]); ys.push(opts.log ? Math.log10(p[1]) : p[1]); }
      });
    });
    var chart = svg("svg", { viewBox: "0 0 " + W + " " + H, class: "chart", role: "img", "aria-label": opts.title });
    if (!xs.length) {
      // A log axis cannot draw zeros; say so when every value is exactly 0 (the exact flow).
      var zeros = opts.series.some(function (s) { return s.points.some(function (p) { return p[1] === 0; }); });
      var msg = zeros ? "exactly 0 at every step (not drawable on a log scale)" : "no data";
      chart.appendChild(svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "axis-label", text: msg }));
      return chart;
    }
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
    var y0 = opts.yMin !== undefined ? opts.yMin : Math.min.apply(null, ys);
    var y1 = opts.yMax !== undefined ? opts.yMax : Math.max.apply(null, ys);
    if (opts.log) { y0 = Math.floor(y0); y1 = Math.ceil(y1); }
    if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
    if (x1 === x0) { x1 = x0 + 1; }
    function sx(x) { return L + (x - x0) / (x1 - x0) * (W - L - R); }
    function sy(y) { return T + (1 - (y - y0) / (y1 - y0)) * (H - T - B); }

    var grid = svg("g", { class: "grid" });
    var yt = opts.log ? [] : niceTicks(y0, y1, 5);
    if (opts.log) {
      var stride = Math.max(1, Math.ceil((y1 - y0) / 6));
      for (var e = y0; e <= y1; e += stride) yt.push(e);
    }
    yt.forEach(function (v) {
      grid.appendChild(svg("line", { x1: L, x2: W - R, y1: sy(v), y2: sy(v) }));
      grid.appendChild(svg("text", { x: L - 6, y: sy(v) + 4, "text-anchor": "end", class: "tick",
                                     text: opts.log ? "1e" + v : (Math.abs(v) < 10 ? v.toFixed(2) : String(v)) }));
    });
    niceTicks(x0, x1, 6).forEach(function (v) {
      grid.appendChild(svg("line", { x1: sx(v), x2: sx(v), y1: T, y2: H - B, class: "vgrid" }));
      grid.appendChild(svg("text", { x: sx(v), y: H - B + 16, "text-anchor": "middle", class: "tick", text: String(v) }));
    });
    chart.appendChild(grid);
    chart.appendChild(svg("rect", { x: L, y: T, width: W - L - R, height: H - T - B, class: "frame" }));
    chart.appendChild(svg("text", { x: L + (W - L - R) / 2, y: H - 6, "text-anchor": "middle", class: "axis-label", text: opts.xLabel }));
    chart.appendChild(svg("text", { x: 14, y: T + (H - T - B) / 2, "text-anchor": "middle", class: "axis-label",
                                    transform: "rotate(-90 14 " + (T + (H - T - B) / 2) + ")", text: opts.yLabel }));
    if (opts.hline !== undefined) {
      chart.appendChild(svg("line", { x1: L, x2: W - R, y1: sy(opts.hline), y2: sy(opts.hline), class: "threshold" }));
      // Label at the left end: training curves start low, so that corner is free.
      chart.appendChild(svg("text", { x: L + 6, y: sy(opts.hline) - 5, "text-anchor": "start", class: "tick",
                                      text: "threshold " + opts.hline }));
    }
    opts.series.forEach(function (s) {
      var d = "", pen = false;
      s.points.forEach(function (p) {
        var ok = isNum(p[1]) && (!opts.log || p[1] > 0);
        if (!ok) { pen = false; return; }
        var y = opts.log ? Math.log10(p[1]) : p[1];
        d += (pen ? "L" : "M") + sx(p[0]).toFixed(1) + " " + sy(y).toFixed(1);
        pen = true;
      });
      chart.appendChild(svg("path", { d: d, fill: "none", stroke: s.color, "stroke-width": s.width || 1.8,
                                      "stroke-opacity": s.opacity || 1, class: "series" }, [svg("title", { text: s.label })]));
    });
    return chart;
  }

  function movingAverage(values, w) {
    var out = [];
    for (var i = 0; i < values.length; i++) {
      if (i + 1 < w) { out.push(null); continue; }
      var sum = 0, ok = true;
      for (var j = i - w + 1; j <= i; j++) { if (!isNum(values[j])) ok = false; sum += values[j]; }
      out.push(ok ? sum / w : null);
    }
    return out;
  }

  function zip(xs, ys) { return xs.map(function (x, i) { return [x, ys[i]]; }); }

  function legend(runs) {
    return el("div", { class: "legend" }, runs.map(function (r, i) {
      return el("span", { class: "key" }, [el("span", { class: "swatch c" + (i % SEED_COLORS.length) }), "seed " + r.seed]);
    }));
  }

  // ---- detail view --------------------------------------------------------------------------
  function fact(label, value) { return el("div", { class: "fact" }, [el("div", { class: "label", text: label }), el("div", { class: "value" }, value)]); }

  function renderDetail(id) {
    var root = document.getElementById("detail-view");
    root.textContent = "";
    var e = allEntries().filter(function (x) { return x.id === id; })[0];
    root.appendChild(el("p", {}, [el("a", { href: "#", class: "back", text: "\u2190 all entries" })]));
    if (!e) { root.appendChild(el("p", { class: "notice", text: "No entry " + id + " in this leaderboard." })); return; }
    var runs = e.runs;
    var threshold = runs[0].summary.threshold;

    root.appendChild(el("h2", { class: "detail-title" }, [el("span", { text: e.algorithm }), " \u00B7 ",
      el("span", { class: "prec", text: e.precision }), " \u00B7 ", el("span", { text: e.model }), " \u00B7 ",
      el("span", { class: "fw", text: e.framework })]));
    root.appendChild(el("p", { class: "muted" }, ["task ", el("code", { text: e.task }), ", tier ", el("code", { text: String(e.tier) }),
      e.variant ? ", " + e.variant : "", ", entry ", el("code", { text: e.id })]));
    root.appendChild(el("div", { class: "facts" }, [
      fact("Verdict", verdictBadge(e)),
      fact("Peak accuracy", statCell(e, "accuracy/peak")),
      fact("Final accuracy", statCell(e, "accuracy/final")),
      fact("Steps to pass", fmtInt(e.first_pass.median) + " (" + e.first_pass.reached + "/" + e.seeds + " seeds)"),
      fact("Step-0 k3 KL", fmtSci(metric(e, "mismatch/step0/kl_k3"))),
      fact("Step-0 |\u0394p|", fmtSci(metric(e, "mismatch/step0/prob_diff/mean"))),
      fact("Final k3 KL", fmtSci(metric(e, "mismatch/final/kl_k3"))),
      fact("Final |\u0394p|", fmtSci(metric(e, "mismatch/final/prob_diff/mean"))),
      fact("Wall time / run", fmtTime(metric(e, "time/total_s")))
    ].concat(Object.keys(e.metrics).sort().filter(function (k) {
      return (k.indexOf("eval/") === 0 || k.indexOf("transfer/") === 0) && e.metrics[k].n > 0;
    }).map(function (k) { return fact(k, statCell(e, k)); }))));

    // Curves: raw per-step accuracy is a 128-sample batch mean, so the 5-step moving average
    // (the one the verdict uses) is drawn bold and the raw values faint.
    var acc = [], kl = [];
    runs.forEach(function (r, i) {
      var color = SEED_COLORS[i % SEED_COLORS.length];
      acc.push({ label: "seed " + r.seed + " per step", color: color, width: 1, opacity: 0.22, points: zip(r.curves.step, r.curves.reward) });
      acc.push({ label: "seed " + r.seed + " (5-step average)", color: color, points: zip(r.curves.step, movingAverage(r.curves.reward, 5)) });
      kl.push({ label: "seed " + r.seed, color: color, width: 1.4, points: zip(r.curves.step, r.curves.kl_k3) });
    });
    root.appendChild(el("div", { class: "charts" }, [
      el("figure", {}, [el("figcaption", { text: "Training accuracy per step (bold: 5-step moving average)" }),
        lineChart({ title: "training accuracy", series: acc, xLabel: "RL step", yLabel: "accuracy", yMin: 0, yMax: 1, hline: threshold }),
        legend(runs)]),
      el("figure", {}, [el("figcaption", { text: "Sampler\u2013trainer mismatch: k3 KL per step (log scale)" }),
        lineChart({ title: "k3 KL mismatch", series: kl, xLabel: "RL step", yLabel: "k3 KL", log: true }),
        legend(runs)])
    ]));

    var head = ["Seed", "Run", "Verdict", "Peak acc", "Final acc", "First pass", "Step-0 k3 KL", "Final k3 KL", "Wall time"];
    var body = el("tbody", {}, runs.map(function (r) {
      var s = r.summary;
      return el("tr", {}, [el("td", { class: "num", text: r.seed }), el("td", { text: r.run }),
        el("td", {}, [el("span", { class: "badge " + (s.verdict === "pass" ? "all" : "none"), text: s.verdict })]),
        el("td", { class: "num", text: fmtAcc(s["accuracy/peak"]) }), el("td", { class: "num", text: fmtAcc(s["accuracy/final"]) }),
        el("td", { class: "num", text: fmtInt(s["accuracy/first_pass_step"]) }),
        el("td", { class: "num", text: fmtSci(s["mismatch/step0/kl_k3"]) }), el("td", { class: "num", text: fmtSci(s["mismatch/final/kl_k3"]) }),
        el("td", { class: "num", text: fmtTime(s["time/total_s"]) })]);
    }));
    root.appendChild(el("h3", { text: "Seeds" }));
    root.appendChild(el("div", { class: "table-scroll" }, [el("table", { class: "board seeds" }, [
      el("thead", {}, [el("tr", {}, head.map(function (h, i) { return el("th", { class: i === 1 || i === 2 ? "" : "num", text: h }); }))]), body])]));

    root.appendChild(el("h3", { text: "Provenance and how to reproduce" }));
    runs.forEach(function (r) { root.appendChild(provenanceCard(r)); });
  }

  function provenanceCard(r) {
    var p = r.provenance;
    var packages = Object.keys(p.packages || {}).sort().filter(function (k) { return p.packages[k]; })
      .map(function (k) { return k + " " + p.packages[k]; }).join(", ");
    var rows = [
      ["Source", r.source],
      ["Framework", r.framework],
      ["Numbers backed by", p.backing || "the suite's own loop: the command below reruns it"],
      ["Config hash", p.config_hash],
      ["Git commit", p.git_sha + (p.git_dirty ? "  (dirty: uncommitted changes when it ran)" : "  (clean)")],
      ["Hardware", r.hardware + (p.gpus && p.gpus.length ? "" : (p.torch_threads ? ", " + p.torch_threads + " torch thread(s)" : ""))],
      ["GEMMs", p.gemm_backend ? "trainer " + p.gemm_backend.trainer + ", sampler " + p.gemm_backend.sampler : "\u2013"],
      ["Dtypes", "trainer " + (p.trainer_compute_dtype || "\u2013") + ", sampler " + (p.sampler_dtype || "\u2013")],
      ["Python", (p.python || "\u2013") + " on " + (p.platform || "\u2013")],
      ["Packages", packages || "\u2013"],
      ["Task version / data", "v" + p.task_version + ", dataset sha256 " + (p.dataset_sha256 || "\u2013")]
    ];
    var dl = el("dl", { class: "prov" });
    rows.forEach(function (row) { dl.appendChild(el("dt", { text: row[0] })); dl.appendChild(el("dd", { text: row[1] })); });
    return el("div", { class: "card" }, [
      el("h4", {}, ["Seed " + r.seed + " \u2014 ", el("code", { text: r.run })]),
      dl,
      el("p", { class: "cmd-label", text: p.command_checked === false
        ? "Started with (an outside loop: this command is as recorded, not recomposed; its numbers are checked against the evidence above):"
        : "Reproduce (at commit " + String(p.git_sha).slice(0, 12) + "; this command recomposes to config hash " + p.config_hash + ", checked when the site was built):" }),
      el("pre", { class: "cmd" }, [el("code", { text: p.command })]),
      addedNote(p.fields_added_since),
      el("details", {}, [el("summary", { text: "Full resolved config" }), el("pre", { class: "config", text: JSON.stringify(r.config, null, 2) })])
    ]);
  }

  function addedNote(added) {
    var keys = Object.keys(added || {}).sort();
    if (!keys.length) return null;
    return el("p", { class: "cmd-label", text: "Config fields added to the suite since this run, which the command leaves at their defaults: " +
      keys.map(function (k) { return k + "=" + JSON.stringify(added[k]); }).join(", ") });
  }

  // ---- routing ----------------------------------------------------------------------------------
  function route() {
    var m = /^#\/entry\/(.+)$/.exec(window.location.hash);
    var index = document.getElementById("index-view"), detail = document.getElementById("detail-view");
    if (m) {
      renderDetail(decodeURIComponent(m[1]));
      index.hidden = true; detail.hidden = false;
      window.scrollTo(0, 0);
    } else {
      index.hidden = false; detail.hidden = true;
    }
  }

  function init() {
    if (!DATA) {
      document.getElementById("index-view").appendChild(el("p", { class: "notice", text: "data.js is missing: rebuild with `suite leaderboard`." }));
      return;
    }
    var meta = document.getElementById("meta");
    meta.textContent = DATA.accepted + " runs accepted, " + DATA.rejected.length + " rejected; built from " + DATA.sources.join(", ");
    renderIndex();
    window.addEventListener("hashchange", route);
    route();
  }

  init();
})();
