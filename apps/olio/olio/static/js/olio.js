// Olio's small AJAX: attend/unattend without leaving the event page, and a check of the
// user name while registering. Pages work without it (plain form posts).
"use strict";

function post(url, body) {
  return fetch(url, {
    method: "POST",
    credentials: "same-origin",
    headers: { "X-Requested-With": "XMLHttpRequest" },
    body: body,
  }).then(function (response) {
    return response.json().then(function (data) { return { ok: response.ok, data: data }; });
  });
}

function setUpAttendance() {
  var attend = document.getElementById("attend");
  var unattend = document.getElementById("unattend");
  var count = document.getElementById("attendee-count");
  if (!attend || !unattend || !count) return;
  [attend, unattend].forEach(function (form) {
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      post(form.action).then(function (result) {
        if (!result.ok) { window.location = result.data.login || form.action; return; }
        count.textContent = result.data.count + " attending";
        count.dataset.count = result.data.count;
        attend.classList.toggle("hidden", result.data.attending);
        unattend.classList.toggle("hidden", !result.data.attending);
      });
    });
  });
}

function setUpNameCheck() {
  var input = document.getElementById("username");
  var out = document.getElementById("name-check");
  if (!input || !out) return;
  var timer = null;
  var asked = 0;
  function check() {
    var mine = ++asked;
    var body = new FormData();
    body.append("username", input.value);
    post(out.dataset.url, body).then(function (result) {
      if (mine !== asked) return; // a later check is on its way: show only the newest answer
      out.textContent = result.data.message;
      out.className = "hint " + (result.data.available ? "free" : "taken");
    });
  }
  // While typing (after a pause of 300 ms), and when the field is left.
  input.addEventListener("input", function () {
    clearTimeout(timer);
    timer = setTimeout(check, 300);
  });
  input.addEventListener("change", function () {
    clearTimeout(timer);
    check();
  });
}

document.addEventListener("DOMContentLoaded", function () {
  setUpAttendance();
  setUpNameCheck();
});
