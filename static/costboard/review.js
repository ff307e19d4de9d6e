/* The memory review queue's keys and small helpers (no framework; htmx does the requests).
 *   j / k   focus the next / previous candidate (scrolled into view, with a focus ring)
 *   a e r   approve, edit, reject the focused candidate (by clicking its button)
 *   Escape  in an edit form: cancel it
 * Keys are ignored while typing in a field or with a modifier held. Also: the "Select all"
 * checkbox, the live "n/150" counter of an edit form's content, and focus kept on the queue
 * after a row is swapped. Listeners sit on the document, so swapped-in rows need no setup. */
(function () {
  "use strict";
  var CANDIDATE = ".candidate";
  var nextFocus = null; // the candidate to focus once the current one's swap has settled
  var fallbackFocus = null; // ...or this one, when that row is gone (decided)

  function candidates() {
    return Array.prototype.slice.call(document.querySelectorAll(CANDIDATE));
  }

  function current() {
    var active = document.activeElement;
    return active && active.closest ? active.closest(CANDIDATE) : null;
  }

  function focusCandidate(el) {
    if (!el) return;
    el.focus({ preventScroll: true });
    el.scrollIntoView({ block: "nearest" });
  }

  function move(step) {
    var all = candidates();
    if (!all.length) return;
    var index = all.indexOf(current());
    if (index < 0) {
      focusCandidate(step > 0 ? all[0] : all[all.length - 1]);
      return;
    }
    focusCandidate(all[Math.min(all.length - 1, Math.max(0, index + step))]);
  }

  function neighbour(el) {
    var all = candidates();
    var index = all.indexOf(el);
    return all[index + 1] || all[index - 1] || null;
  }

  function act(name) {
    var row = current();
    if (!row) return false;
    var button = row.querySelector('[data-action="' + name + '"]');
    if (!button) return false;
    if (name !== "edit") nextFocus = neighbour(row);
    button.click();
    return true;
  }

  function typing(target) {
    if (!target || !target.closest) return false;
    return !!target.closest("input, textarea, select, [contenteditable=''], [contenteditable=true]");
  }

  var KEYS = { j: function () { move(1); return true; },
               k: function () { move(-1); return true; },
               a: function () { return act("approve"); },
               e: function () { return act("edit"); },
               r: function () { return act("reject"); } };

  document.addEventListener("keydown", function (event) {
    if (event.key === "Escape") {
      var form = event.target.closest && event.target.closest("form.memory-edit");
      var cancel = form && form.querySelector('[data-action="cancel"]');
      if (cancel) {
        event.preventDefault();
        cancel.click();
      }
      return;
    }
    if (event.ctrlKey || event.metaKey || event.altKey || event.isComposing) return;
    if (typing(event.target)) return;
    var handler = KEYS[event.key];
    if (handler && handler()) event.preventDefault();
  });

  // --- the counter: what the server will count (spaces collapsed), in characters
  function count(textarea) {
    var output = document.querySelector('[data-counter-of="' + textarea.id + '"]');
    if (!output) return;
    var max = parseInt(textarea.getAttribute("data-max"), 10) || 150;
    var text = textarea.value.trim().split(/\s+/).join(" ");
    var length = Array.from(text).length;
    output.textContent = length + "/" + max;
    output.classList.toggle("over", length > max);
  }

  document.addEventListener("input", function (event) {
    var target = event.target;
    if (target.matches && target.matches("textarea[data-counter]")) count(target);
  });

  // --- Select all
  function boxes() {
    return Array.prototype.slice.call(document.querySelectorAll("input[data-select]"));
  }

  function selectionChanged() {
    var all = boxes();
    var checked = all.filter(function (box) { return box.checked; }).length;
    var master = document.querySelector("[data-select-all]");
    if (master) {
      master.checked = all.length > 0 && checked === all.length;
      master.indeterminate = checked > 0 && checked < all.length;
    }
    var label = document.querySelector("[data-selected-count]");
    if (label) label.textContent = checked ? checked + " selected" : "none selected";
  }

  document.addEventListener("change", function (event) {
    var target = event.target;
    if (!target.matches) return;
    if (target.matches("[data-select-all]")) {
      boxes().forEach(function (box) { box.checked = target.checked; });
      selectionChanged();
    } else if (target.matches("input[data-select]")) {
      selectionChanged();
    }
  });

  // --- after a swap: keep the keyboard on the queue
  document.addEventListener("htmx:beforeSwap", function (event) {
    var target = event.detail.target;
    if (!nextFocus && target && target.matches && target.matches(CANDIDATE) &&
        target.contains(document.activeElement)) {
      nextFocus = target; // an edit opened or cancelled, or a refusal: stay on this row
      fallbackFocus = neighbour(target); // saved (and so decided): on to the next one
    }
  });

  document.addEventListener("htmx:afterSettle", function (event) {
    var swapped = event.target; // each element the swap put in the page
    if (!(swapped instanceof Element) || swapped.id === "memory-counts") return;
    var editing = swapped.querySelector("form.memory-edit");
    if (editing) {
      var field = editing.querySelector("[autofocus]") || editing.querySelector("textarea");
      if (field && document.activeElement !== field) field.focus();
      if (field && field.tagName === "TEXTAREA") {
        field.setSelectionRange(field.value.length, field.value.length);
      }
      nextFocus = fallbackFocus = null;
    } else if (nextFocus) {
      var again = nextFocus.id ? document.getElementById(nextFocus.id) : null;
      if (again && again.matches(CANDIDATE)) {
        focusCandidate(again);
      } else if (fallbackFocus && fallbackFocus.isConnected) {
        focusCandidate(fallbackFocus);
      }
      nextFocus = fallbackFocus = null;
    }
    selectionChanged();
  });
})();
