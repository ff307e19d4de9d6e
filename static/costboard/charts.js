/* Draws the Plotly figures a page embeds (built in Python, see costboard/charts.py).
 * Each `[data-chart="name"]` element gets figure `name` from the JSON script `#figures`
 * (or `data-source`). Colours come from the page's CSS, so the dark theme applies; charts are
 * drawn again after an htmx swap and when the colour scheme changes. */
(function () {
  "use strict";
  var COLORWAY = ["#3157d5", "#e07b39", "#2f9e6e", "#c9452f", "#8b5cf6", "#d4a017",
                  "#0ea5b7", "#db2777", "#6b7280", "#65a30d"];

  function cssVar(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  }

  function themed(layout) {
    var fg = cssVar("--fg"), line = cssVar("--line");
    var out = Object.assign({}, layout, {
      paper_bgcolor: "rgba(0,0,0,0)",
      plot_bgcolor: "rgba(0,0,0,0)",
      colorway: COLORWAY,
      font: Object.assign({ color: fg, family: "system-ui, sans-serif", size: 12 }, layout.font || {}),
    });
    // automargin: tick labels and axis titles get the room they need, never overlapping
    ["xaxis", "yaxis"].forEach(function (axis) {
      out[axis] = Object.assign({ gridcolor: line, zerolinecolor: line, linecolor: line,
                                  automargin: true }, layout[axis] || {});
    });
    return out;
  }

  function render(root) {
    var cache = {};
    (root.querySelectorAll ? root : document).querySelectorAll("[data-chart]").forEach(function (el) {
      var sourceId = el.dataset.source || "figures";
      if (!(sourceId in cache)) {
        var source = document.getElementById(sourceId);
        cache[sourceId] = source ? JSON.parse(source.textContent) : {};
      }
      var figure = cache[sourceId][el.dataset.chart];
      if (!figure) { return; }
      Plotly.react(el, figure.data, themed(figure.layout || {}),
                   { responsive: true, displaylogo: false });
    });
  }

  // plotly.js loads async (templates/costboard/_charts.html): draw when both it and the page
  // are there, whichever comes last
  function whenPlotly(draw) {
    if (window.Plotly) { draw(); return; }
    var script = document.getElementById("plotly-js");
    if (script) { script.addEventListener("load", function () { draw(); }, { once: true }); }
  }

  function start() { whenPlotly(function () { render(document); }); }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
  document.addEventListener("htmx:afterSettle", function (event) {
    whenPlotly(function () { render(event.target); });
  });
  if (window.matchMedia) {
    window.matchMedia("(prefers-color-scheme: dark)")
      .addEventListener("change", function () { whenPlotly(function () { render(document); }); });
  }
})();
