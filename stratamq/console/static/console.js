// StrataMQ console: the little the pages do in the browser (no framework, no build step).
// A message's body is shown as text, pretty JSON or hex: the buttons switch between them.
"use strict";
document.addEventListener("click", function (event) {
  var button = event.target.closest(".view-button");
  if (!button) { return; }
  var box = button.closest(".body-views");
  box.querySelectorAll(".view-button").forEach(function (b) {
    b.classList.toggle("active", b === button);
  });
  box.querySelectorAll("pre.body").forEach(function (pre) {
    pre.hidden = !pre.classList.contains("body-" + button.dataset.view);
  });
});
