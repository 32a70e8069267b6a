// The leaderboard page: reads window.LEADERBOARD (data.js, written by `suite leaderboard`) and renders
// one board per machine class (a selector), a page per entry (#/entry/<id>), the reported results
// (#/reported), the changelog (#/changes) and how to submit (#/submit).
//
// Safety rule: every string that comes from a result bundle reaches the page through text nodes
// (textContent, createTextNode, new Option). Nothing here uses innerHTML, insertAdjacentHTML or
// document.write, so markup in a run, model or host name is shown as text and cannot run.
(function () {
  "use strict";

  var DATA = window.LEADERBOARD;
  var SVG_NS = "http://www.w3.org/2000/svg";
  // Seaborn's colour-blind palette, and a dash pattern per seed so lines differ without colour too.
  var SEED_COLORS = ["#0173b2", "#de8f05", "#029e73", "#d55e00", "#cc78bc", "#ca9161", "#fbafe4", "#949494"];
  var SEED_DASHES = [null, "7 4", "2 3", "9 3 2 3", "4 2", "12 4", "1 2", "6 2 2 2"];
  var SECTIONS = [
    ["ranked", "Ranked"],
    ["unranked", "Listed, not ranked"],
    ["controls", "Controls (diagnostics, never ranked as recipes)"],
    ["stale", "No longer reproduce with today's code (ranked apart)"]
  ];
  var state = { cls: null };

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
                                      "stroke-opacity": s.opacity || 1, "stroke-dasharray": s.dash || null, class: "series" }, [svg("title", { text: s.label })]));
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

  // ---- cells ---------------------------------------------------------------------------------
  function metric(e, key) { return (e.metrics[key] || {}).iqm; }

  // A value with its interval and the number of runs behind it; one run is shown as one value.
  function statCell(e, key) {
    var m = e.metrics[key] || {};
    var kids = [el("span", { class: "v", text: fmtMetric(key, m.iqm) })];
    if (isNum(m.lo) && isNum(m.hi) && m.n > 1) {
      kids.push(el("span", { class: "ci", text: "[" + fmtMetric(key, m.lo) + ", " + fmtMetric(key, m.hi) + "] n=" + m.n }));
    } else if (m.n === 1) {
      kids.push(el("span", { class: "ci", text: "one run" }));
    }
    return kids;
  }

  function poiCell(e) {
    var i = e.improvement || {};
    if (!isNum(i.p)) return el("span", { class: "ci", title: i.why || "", text: "\u2013" });
    var seeds = " n=" + i.n_x + " vs " + i.n_y;
    // A zero-width bootstrap interval is what separated samples give, not certainty: say so.
    var ci = i.degenerate ? "no interval (every resample alike)" : "[" + i.lo.toFixed(2) + ", " + i.hi.toFixed(2) + "]";
    var kids = [el("span", { class: "v", text: i.p.toFixed(2) }), el("span", { class: "ci", text: ci + seeds })];
    if (isNum(i.perm_p)) {
      kids.push(el("span", { class: "ci exact", title: "one-sided exact permutation test of final accuracy; its smallest possible p with these seeds is " +
        i.perm_min_p.toFixed(3) + "; Fisher's exact test on pass counts p = " + i.fisher_p.toFixed(2), text: "exact p=" + i.perm_p.toFixed(2) }));
    }
    return kids;
  }

  function verdictBadge(e) {
    var cls = e.passes === e.seeds ? "all" : (e.passes > 0 ? "some" : "none");
    return el("span", { class: "badge " + cls, title: "per seed: " + e.verdicts.join(", "),
                        text: e.passes + "/" + e.seeds + " pass" });
  }

  function statusBadge(e) {
    var s = e.reproduction.status;
    var text = { pinned: "reproduces", stale: "no longer reproduces", unchecked: "not checked" }[s] || s;
    return el("span", { class: "badge status " + s, title: e.reproduction.why, text: text });
  }

  function recipeCell(e) {
    var link = el("a", { href: "#/entry/" + encodeURIComponent(e.id), class: "entry-link", text: e.algorithm });
    // A name verl and TRL use for other settings says so next to the name (suite/rl/algo_table.py elsewhere()).
    var m = e.algorithm_meaning, note = m && m.elsewhere;
    if (!note || note.indexOf("NOT ") !== 0) return link;
    return el("span", {}, [link, " ", el("span", { class: "badge namewarn", title: note,
      text: "not " + note.slice(4).split(" (")[0] })]);
  }

  var COLS = {
    rank: ["#", true, function (e) {
      if (e.rank === null) return "\u2013";
      return el("span", { title: e.tied > 1 ? "tied with " + (e.tied - 1) + " other entr" + (e.tied > 2 ? "ies" : "y") + ": not separated by an exact test" : "",
                          text: (e.tied > 1 ? "=" : "") + e.rank });
    }],
    recipe: ["Algorithm", false, recipeCell],
    precision: ["Precision flow", false, function (e) { return el("span", { class: "prec", text: e.precision }); }],
    final: ["Final acc (IQM) [95% CI] n", true, function (e) { return statCell(e, "accuracy/final"); }],
    poi: ["P(> fp16) [95% CI] exact p", true, poiCell],
    verdict: ["Verdict", true, verdictBadge],
    k3: ["Step-0 k3 KL", true, function (e) { return statCell(e, "mismatch/step0/kl_k3"); }],
    status: ["Reproduction", false, statusBadge],
    why: ["Why not ranked", false, function (e) { return el("span", { class: "why", text: e.why || "" }); }],
    framework: ["Loop", false, function (e) { return el("span", { class: "fw", text: e.framework }); }]
  };
  var LAYOUT = {
    ranked: ["rank", "recipe", "precision", "final", "poi", "verdict", "k3", "status", "framework"],
    unranked: ["recipe", "precision", "final", "verdict", "k3", "status", "why", "framework"],
    controls: ["recipe", "precision", "final", "verdict", "k3", "status", "why", "framework"],
    stale: ["rank", "recipe", "precision", "final", "verdict", "k3", "why"]
  };

  function table(name, entries) {
    var keys = LAYOUT[name];
    var head = el("tr", {}, keys.map(function (k) {
      return el("th", { scope: "col", class: COLS[k][1] ? "num" : "", "data-key": k, text: COLS[k][0] });
    }));
    var body = el("tbody", {}, entries.map(function (e) {
      return el("tr", { "data-id": e.id }, keys.map(function (k) {
        return el("td", { class: (COLS[k][1] ? "num " : "") + (k === "why" ? "wrap-cell" : "") }, COLS[k][2](e));
      }));
    }));
    return el("div", { class: "table-scroll" }, [el("table", { class: "board", "data-section": name }, [el("thead", {}, [head]), body])]);
  }

  // ---- what a board measures -----------------------------------------------------------------
  function fmtInt3(n) { return isNum(n) ? String(n).replace(/\B(?=(\d{3})+(?!\d))/g, ",") : "?"; }

  function measures(b, cls) {
    var s = b.setting;
    var rows = [
      ["Task", s.task + (s.task_version ? " v" + s.task_version : "") + (s.task_description ? ": " + s.task_description : "")],
      ["Policy", s.policy + (isNum(s.params) ? ", " + fmtInt3(s.params) + " parameters" : "")],
      ["Training", fmtInt3(s.steps) + " RL steps of " + s.prompts_per_step + " prompts \u00D7 " + s.samples_per_prompt +
        " samples, " + s.updates_per_step + " updates per step, lr " + s.lr + ", at most " + s.max_new_tokens + " new tokens" +
        (isNum(s.prompts) ? "; " + s.prompts + " perfectible prompts" : "") + (s.regime && s.regime !== "base" ? "; regime " + s.regime : "")],
      ["Verdict rule", s.verdict_rule],
      ["Machine class", cls.label]
    ];
    var dl = el("dl", { class: "measures" });
    rows.forEach(function (r) { dl.appendChild(el("dt", { text: r[0] })); dl.appendChild(el("dd", { text: r[1] })); });
    var differs = el("ul", { class: "differs" }, s.differs.map(function (d) {
      return el("li", {}, [el("code", { text: d.field }), " " + d.here + " here; published: " + d.published]);
    }));
    return el("div", { class: "what" }, [
      el("h2", { text: "What this board measures" }), dl,
      el("p", { class: "not-published" }, [el("strong", { text: "Not the published sanity test. " }),
        "arXiv 2510.26788 trains DeepSeek-R1-Distill-Qwen-1.5B on 1,460 MATH problems; this board is a scaled-down stand-in on this machine class. It differs in:"]),
      differs
    ]);
  }

  function boardSection(b, cls) {
    var kids = [measures(b, cls)];
    SECTIONS.forEach(function (pair) {
      var list = b[pair[0]];
      if (!list.length) return;
      kids.push(el("h3", { text: pair[1] + " (" + list.length + ")" }));
      if (pair[0] === "ranked") {
        kids.push(el("p", { class: "muted small", text: DATA.ranking + " P(> fp16): probability that a seed of this entry ends above a seed of the fp16 entry of the same algorithm." }));
      }
      if (pair[0] === "unranked" && b.fill_sweep) {
        kids.push(el("p", { class: "muted small", text: "To rank them, fill this class to " + DATA.min_seeds + " seeds (then `suite reference runs/" + "sanity-seeds --grid sanity-seeds` and rebuild):" }));
        kids.push(el("pre", { class: "cmd fill" }, [el("code", { text: b.fill_sweep })]));
      }
      kids.push(table(pair[0], list));
    });
    if ((b.literature || []).length) {
      // Generated from the ranks: where this board's order agrees with, ties or reverses the published one.
      var fields = b.setting.differs.map(function (d) { return d.field + " (" + d.here + " here, " + d.published + " published)"; });
      kids.splice(1, 0, el("div", { class: "literature" }, [el("h3", { text: "Beside the literature" }),
        el("p", { class: "muted small", text: "Each line compares a pair of flows by their own exact test. This board differs from the published setting in " +
          (fields.length ? fields.join(", ") : "nothing recorded") + ": a disagreement may come from any of these." }),
        el("ul", {}, b.literature.map(function (l) {
          return el("li", { class: "lit " + l.verdict }, [el("span", { class: "badge lit-" + l.verdict, text: l.verdict }), " " + l.text]);
        }))]));
    }
    if (!b.ranked.length) {
      kids.splice(1, 0, el("p", { class: "notice no-rank", text: "Nothing is ranked on this board: no recipe here has " + DATA.min_seeds +
        " seeds that reproduce with today's code. The entries are listed with the reason." }));
    }
    return el("section", { class: "board-section", "data-board": b.id }, kids);
  }

  // ---- index view ----------------------------------------------------------------------------
  function classById(id) { return DATA.classes.filter(function (c) { return c.id === id; })[0]; }

  function classSelector() {
    var select = el("select", { id: "class-select", name: "class" });
    DATA.classes.forEach(function (c) {
      select.appendChild(new Option(c.id + " \u2014 " + c.pinned + " of " + c.entries + " entries reproduce, " + c.ranked + " ranked", c.id));
    });
    select.value = state.cls;
    select.addEventListener("change", function () { window.location.hash = "#/class/" + encodeURIComponent(select.value); });
    return el("label", { class: "class-pick" }, [el("span", { text: "Machine class " }), select]);
  }

  function renderIndex() {
    var root = document.getElementById("index-view");
    root.textContent = "";
    if (!DATA.classes.length) { root.appendChild(el("p", { class: "notice", text: "No accepted runs." })); return; }
    var cls = classById(state.cls) || DATA.classes[0];
    state.cls = cls.id;
    root.appendChild(el("div", { class: "picker" }, [classSelector(),
      el("span", { class: "muted", text: " The same config gives other numbers on another class (CPU ISA, GEMM backend, torch, GPU), so each class has its own board." })]));
    root.appendChild(el("div", { id: "class-view", "data-class": cls.id }, cls.boards.map(function (b) { return boardSection(b, cls); })));
    if (DATA.rejected.length) {
      var list = el("ul", { class: "rejected-list" });
      DATA.rejected.forEach(function (r) {
        list.appendChild(el("li", {}, [el("code", { text: r.source }), ": ", el("span", { class: "reason", text: r.reason })]));
      });
      root.appendChild(el("details", { id: "rejected", class: "rejected" }, [
        el("summary", { text: "Rejected bundles (" + DATA.rejected.length + "): failed validation, not in any board" }), list]));
    }
  }

  // ---- entry page --------------------------------------------------------------------------------
  function allEntries() {
    var out = [];
    DATA.classes.forEach(function (c) { c.boards.forEach(function (b) {
      SECTIONS.forEach(function (p) { b[p[0]].forEach(function (e) { out.push({ e: e, b: b, c: c }); }); });
    }); });
    return out;
  }

  function fact(label, value) { return el("div", { class: "fact" }, [el("div", { class: "label", text: label }), el("div", { class: "value" }, value)]); }

  function legend(runs) {
    return el("div", { class: "legend" }, runs.map(function (r, i) {
      var k = i % SEED_COLORS.length;
      return el("span", { class: "key" }, [svg("svg", { width: 26, height: 8 }, [svg("line", { x1: 1, x2: 25, y1: 4, y2: 4,
        stroke: SEED_COLORS[k], "stroke-width": 2.2, "stroke-dasharray": SEED_DASHES[k] })]), "seed " + r.seed]);
    }));
  }

  function renderDetail(id) {
    var root = document.getElementById("detail-view");
    root.textContent = "";
    var hit = allEntries().filter(function (x) { return x.e.id === id; })[0];
    root.appendChild(el("p", {}, [el("a", { href: "#/class/" + encodeURIComponent(hit ? hit.c.id : ""), class: "back", text: "\u2190 board" })]));
    if (!hit) { root.appendChild(el("p", { class: "notice", text: "No entry " + id + " in this leaderboard." })); return; }
    var e = hit.e, runs = e.runs, threshold = runs[0].summary.threshold;
    state.cls = hit.c.id;
    root.appendChild(el("h2", { class: "detail-title" }, [el("span", { text: e.algorithm }), " \u00B7 ",
      el("span", { class: "prec", text: e.precision }), " \u00B7 ", el("span", { text: e.model }), " \u00B7 ",
      el("span", { class: "fw", text: e.framework })]));
    root.appendChild(el("p", { class: "muted" }, ["task ", el("code", { text: e.task }), ", machine class ", el("code", { text: hit.c.id }),
      ", entry ", el("code", { text: e.id })]));
    if (e.algorithm_meaning) {
      root.appendChild(el("p", { class: "algo-words" }, [el("strong", { text: "Algorithm " + e.algorithm + ": " }), e.algorithm_meaning.words]));
    }
    var place = e.rank !== null ? "ranked #" + (e.tied > 1 ? e.rank + ", tied with " + (e.tied - 1) + " other" + (e.tied > 2 ? "s" : "") : e.rank) + (e.reproduction.status === "stale" ? " among the entries that no longer reproduce" : "") : "not ranked: " + e.why;
    root.appendChild(el("p", { class: "placing" }, [el("strong", { text: "Standing: " }), place, " ", statusBadge(e)]));
    root.appendChild(el("p", { class: "muted small", text: "Reproduction: " + e.reproduction.why }));
    root.appendChild(el("div", { class: "facts" }, [
      fact("Verdict", verdictBadge(e)),
      fact("Final accuracy (IQM)", statCell(e, "accuracy/final")),
      fact("P(> fp16)", poiCell(e)),
      fact("Peak accuracy", statCell(e, "accuracy/peak")),
      fact("Steps to pass", fmtInt(e.first_pass.median) + " (" + e.first_pass.reached + "/" + e.seeds + " seeds)"),
      fact("Step-0 k3 KL", statCell(e, "mismatch/step0/kl_k3")),
      fact("Final k3 KL", statCell(e, "mismatch/final/kl_k3")),
      fact("Wall time / run", fmtTime(metric(e, "time/total_s")))
    ]));
    if (e.fill_command) {
      root.appendChild(el("p", { class: "cmd-label", text: "To rank it, add the missing seeds (then rebuild the board):" }));
      root.appendChild(el("pre", { class: "cmd fill" }, [el("code", { text: e.fill_command })]));
    }
    // Raw per-step accuracy is a batch mean: the 5-step moving average (the verdict's) is drawn bold.
    var acc = [], kl = [];
    runs.forEach(function (r, i) {
      var k = i % SEED_COLORS.length, color = SEED_COLORS[k], dash = SEED_DASHES[k];
      acc.push({ label: "seed " + r.seed + " per step", color: color, width: 1, opacity: 0.25, points: zip(r.curves.step, r.curves.reward) });
      acc.push({ label: "seed " + r.seed + " (5-step average)", color: color, dash: dash, width: 2.2, points: zip(r.curves.step, movingAverage(r.curves.reward, 5)) });
      kl.push({ label: "seed " + r.seed, color: color, dash: dash, width: 1.6, points: zip(r.curves.step, r.curves.kl_k3) });
    });
    root.appendChild(el("div", { class: "charts" }, [
      el("figure", {}, [el("figcaption", { text: "Training accuracy per step (bold: 5-step moving average, the verdict's)" }),
        lineChart({ title: "training accuracy", series: acc, xLabel: "RL step", yLabel: "accuracy", yMin: 0, yMax: 1, hline: threshold }), legend(runs)]),
      el("figure", {}, [el("figcaption", { text: "Sampler\u2013trainer mismatch: k3 KL per step (log scale)" }),
        lineChart({ title: "k3 KL mismatch", series: kl, xLabel: "RL step", yLabel: "k3 KL", log: true }), legend(runs)])
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
    root.appendChild(el("h3", { text: "Config, environment and how to reproduce" }));
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
    (r.twins || []).forEach(function (t) { rows.push(["Reproduced by", t.source + " (commit " + String(t.git_sha).slice(0, 12) + ", metrics.jsonl byte-identical)"]); });
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

  // ---- reported, changelog, submit -------------------------------------------------------------------
  function renderReported(root) {
    root.appendChild(el("h2", { text: "Reported elsewhere (" + DATA.reported.length + ")" }));
    root.appendChild(el("p", { class: "notice", text: "Published numbers and framework CI thresholds, quoted as written in their sources. " +
      "Reported, unverified: none was rerun by this suite, their models and tasks differ from the boards', and they are never mixed into the rankings." }));
    var head = el("tr", {}, ["Source", "Where", "As written", "What it is", "Kind", "Status", "Compare with"].map(function (h) { return el("th", { text: h }); }));
    var body = el("tbody", {}, DATA.reported.map(function (r) {
      return el("tr", { "data-id": r.id }, [
        el("td", { class: "wrap-cell" }, [el("a", { href: r.url, rel: "noopener", text: r.source })]),
        el("td", { class: "wrap-cell", text: r.where }),
        el("td", { class: "wrap-cell" }, [el("code", { class: "quote", text: r.quote })]),
        el("td", { class: "wrap-cell", text: r.measures + "; " + r.precision }),
        el("td", { text: r.kind }),
        el("td", {}, [el("span", { class: "badge status unchecked", text: r.status })]),
        el("td", { class: "wrap-cell", text: r.compare })]);
    }));
    root.appendChild(el("div", { class: "table-scroll" }, [el("table", { class: "board reported" }, [el("thead", {}, [head]), body])]));
  }

  function renderChanges(root) {
    root.appendChild(el("h2", { text: "Changelog" }));
    DATA.changelog.forEach(function (c) {
      root.appendChild(el("h3", { text: "Version " + c.version + " \u2014 " + c.date }));
      root.appendChild(el("ul", {}, c.changes.map(function (t) { return el("li", { text: t }); })));
    });
  }

  function renderSubmit(root) {
    root.appendChild(el("h2", { text: "How to submit" }));
    root.appendChild(el("p", { text: "Run the suite on your machine, then check your run directories with the board's own validators and package them:" }));
    root.appendChild(el("pre", { class: "cmd" }, [el("code", { text: "suite submit RUN_DIR... --name YOUR_NAME --out submissions/YOUR_NAME" })]));
    root.appendChild(el("p", { text: "It refuses, with the reason, any bundle the board would reject (edited summaries or logs, a config that does not recompose, missing provenance), and writes nothing then. " +
      "Open a pull request adding the folder: CI validates it again (suite submit --check) and rebuilds the site; after the merge the site is published. " +
      "Your entry is ranked once it has " + DATA.min_seeds + " seeds on its machine class." }));
  }

  // ---- routing ----------------------------------------------------------------------------------
  function route() {
    var h = window.location.hash;
    var views = { index: document.getElementById("index-view"), detail: document.getElementById("detail-view"),
                  page: document.getElementById("page-view") };
    var show = "index", m;
    if ((m = /^#\/entry\/(.+)$/.exec(h))) { renderDetail(decodeURIComponent(m[1])); show = "detail"; }
    else if (/^#\/(reported|changes|submit)$/.test(h)) {
      views.page.textContent = "";
      ({ "#/reported": renderReported, "#/changes": renderChanges, "#/submit": renderSubmit })[h](views.page);
      show = "page";
    } else {
      // #/class/<id> picks a class; the bare page shows the first (the most reproducible) one.
      m = /^#\/class\/(.+)$/.exec(h);
      state.cls = m ? decodeURIComponent(m[1]) : (DATA.classes.length ? DATA.classes[0].id : null);
      renderIndex();
    }
    Object.keys(views).forEach(function (k) { views[k].hidden = k !== show; });
    document.querySelectorAll("nav.tabs a").forEach(function (a) {
      a.classList.toggle("active", a.getAttribute("data-view") === (show === "page" ? h.slice(2) : "boards"));
    });
    if (show !== "index") window.scrollTo(0, 0);
  }

  function init() {
    if (!DATA) {
      document.getElementById("index-view").appendChild(el("p", { class: "notice", text: "data.js is missing: rebuild with `suite leaderboard`." }));
      return;
    }
    document.getElementById("meta").textContent = "Version " + DATA.version + ", " + DATA.date + " \u00B7 " + DATA.accepted +
      " runs accepted, " + DATA.rejected.length + " rejected \u00B7 built from " + DATA.sources.join(", ");
    state.cls = DATA.classes.length ? DATA.classes[0].id : null;
    window.addEventListener("hashchange", route);
    route();
  }

  init();
})();
