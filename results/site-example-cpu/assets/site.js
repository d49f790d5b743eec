// attnbench publish: draws the case page's graph for the metric chosen (the buttons, or #metric in the address).
(function () {
  "use strict";
  var figures = JSON.parse(document.getElementById("figures").textContent);
  var graph = document.getElementById("graph");
  var buttons = Array.prototype.slice.call(document.querySelectorAll("button[data-metric]"));
  var config = { responsive: true, displaylogo: false, scrollZoom: false };
  function show(metric) {
    var figure = figures[metric];
    if (!figure) { return; }
    Plotly.react(graph, figure.data, figure.layout, config).then(function () {
      graph.setAttribute("data-metric", metric);
      graph.setAttribute("data-ready", "true");
    });
    buttons.forEach(function (b) { b.setAttribute("aria-pressed", String(b.dataset.metric === metric)); });
    Array.prototype.forEach.call(document.querySelectorAll("[data-steps]"), function (t) {
      t.hidden = t.dataset.steps !== metric;
    });
  }
  buttons.forEach(function (b) {
    b.addEventListener("click", function () {
      window.history.replaceState(null, "", "#" + b.dataset.metric);
      show(b.dataset.metric);
    });
  });
  var wanted = window.location.hash.slice(1);
  show(figures[wanted] ? wanted : Object.keys(figures)[0]);
})();
