// The usage console: wiring of the page's fixed controls, then the first view. Loaded last.
"use strict";

document.addEventListener("DOMContentLoaded", () => {
  $("sign-in-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const value = $("credential").value.trim();
    $("credential").value = "";
    if (!value) return;
    sessionStorage.setItem(KEY, value);
    $("sign-in-error").textContent = "";
    start();
  });
  $("sign-out").addEventListener("click", () => signOut());
  $("retry").addEventListener("click", () => start());
  $("back").addEventListener("click", () => openOperator());
  $("home").addEventListener("click", (event) => { event.preventDefault(); start(); });
  $("search").addEventListener("input", renderCompanies);
  $("csv").addEventListener("click", downloadCSV);
  $("add-user").addEventListener("click", addUser);
  $("add-key").addEventListener("click", () => createKey(null));
  $("new-company").addEventListener("click", newCompany);
  $("audit-filter").addEventListener("submit", (event) => {
    event.preventDefault();
    auditState.action = $("audit-action").value.trim();
    loadAudit(false);
  });
  $("audit-more").addEventListener("click", () => loadAudit(true));
  // A closed dialog keeps nothing: a key shown once is gone from the page.
  $("editor").addEventListener("close", () => $("editor-body").replaceChildren());
  sortBy("companies", "companySort", renderCompanies);
  sortBy("users", "userSort", renderUsers);
  operatorNav();
  start();
});
