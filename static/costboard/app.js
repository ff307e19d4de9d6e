/* Every page's small behaviours, kept out of the HTML (the Content-Security-Policy allows no
 * inline script or on*= handler): a <select data-submit-on-change> submits its form when
 * changed (the project switcher). The switcher of a page that stays the same page sends the
 * filters of the URL as it is now (htmx swaps push new ones after the page loaded), less the
 * page number, which is of the other project's list; "All projects" sends no project. */
(function () {
  "use strict";
  function switchProject(form, select) {
    var params = new URLSearchParams(form.hasAttribute("data-keeps-filters") ? window.location.search : "");
    params.delete("project");
    params.delete("page");
    if (select.value) {
      params.append("project", select.value);
    }
    var query = params.toString();
    window.location.assign(form.getAttribute("action") + (query ? "?" + query : ""));
  }
  document.addEventListener("change", function (event) {
    var field = event.target;
    if (field.matches && field.matches("select[data-submit-on-change]") && field.form) {
      if (field.form.classList.contains("switcher")) {
        switchProject(field.form, field);
      } else {
        field.form.submit();
      }
    }
  });
})();
