/* Every page's small behaviours, kept out of the HTML (the Content-Security-Policy allows no
 * inline script or on*= handler): a <select data-submit-on-change> submits its form when
 * changed (the project switcher). */
(function () {
  "use strict";
  document.addEventListener("change", function (event) {
    var field = event.target;
    if (field.matches && field.matches("select[data-submit-on-change]") && field.form) {
      field.form.submit();
    }
  });
})();
