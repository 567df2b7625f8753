"""The operator manages the catalog and the companies in the console (SPEC §13), in a real
headless Chromium against the real gateway: each form filled as a person would, a bad value
first (the API's own message must appear beside that field, and nothing change), then a good
one, read back from the API.

Environment: CAPGATE_URL, SCREENSHOTS, OPERATOR_TOKEN, COMPANY_A.
"""

import os

from console_support import Page, api, browser, check

OPERATOR, A = os.environ["OPERATOR_TOKEN"], os.environ["COMPANY_A"]


def op(path, method="GET", body=None):
    return api(path, OPERATOR, method, body)


def refused_beside(page, field, path, method, body):
    """The dialog shows, beside `field` only, the message the API gives for the same body."""
    status, answer = op(path, method, body)
    check(status == 400, f"the API took {body}: {status} {answer}")
    check(page.errors() == {field: answer["error"]["message"]}, f"{field}: {page.errors()} vs {answer['error']['message']!r}")
    check(page.find("#f-" + field).get_attribute("aria-invalid") == "true", f"{field} is not marked invalid")


page = Page(browser())
try:
    page.driver.get(os.environ["CAPGATE_URL"] + "/console")
    page.until(lambda: page.find("#credential").is_displayed(), "the sign-in form")
    page.shoot("sign-in")
    page.sign_in(OPERATOR)
    page.until(lambda: page.all("#companies tr[data-company]") and "compan" in page.text("#status"), "the companies")
    check(page.text("#who") == "Signed in as the operator", "header: " + page.text("#who"))
    page.shoot("operator-companies")

    # ---- a new company: a bad time zone is refused beside its field; then created on a plan.
    before = len(op("/admin/v1/companies?limit=500")[1]["data"])
    page.click("#new-company")
    page.type("name", "Zeta Works")
    page.pick("plan", "Low (low)")
    page.type("time_zone", "Mars/Olympus")
    page.submit()
    refused_beside(page, "time_zone", "/admin/v1/companies", "POST", {"name": "Zeta Works", "plan": "low", "time_zone": "Mars/Olympus"})
    check(len(op("/admin/v1/companies?limit=500")[1]["data"]) == before, "a refused company was created")
    page.shoot("operator-company-error")
    page.type("time_zone", "Europe/Berlin")
    page.submit()
    page.until(lambda: page.text("#company-title") == "Zeta Works" and "Created" in page.text("#status"), "the new company's view")
    zeta = next(c for c in op("/admin/v1/companies?limit=500")[1]["data"] if c["name"] == "Zeta Works")
    _, company = op(f"/admin/v1/companies/{zeta['id']}")
    check((company["plan"], company["time_zone"], company["auto_renew"]) == ("low", "Europe/Berlin", True), f"company: {company}")

    # ---- assign another plan, and edit the company.
    page.tab("Plan")
    page.click("#assign-plan")
    page.pick("plan", "Medium (medium)")
    page.tick("#f-auto_renew", False)
    page.submit()
    _, company = op(f"/admin/v1/companies/{zeta['id']}")
    check((company["plan"], company["auto_renew"]) == ("medium", False), f"assigned: {company}")
    page.until(lambda: "ends, does not renew" in page.text("#plan-body"), "the plan view to say so")
    page.shoot("operator-company-plan")
    page.click("#edit-company")
    page.type("webhook_url", "ftp://example.test/hook")
    page.submit()
    refused_beside(page, "webhook_url", f"/admin/v1/companies/{zeta['id']}", "PATCH", {"webhook_url": "ftp://example.test/hook"})
    page.type("webhook_url", "https://hooks.example.test/capgate")
    page.submit()
    check(op(f"/admin/v1/companies/{zeta['id']}")[1]["webhook_url"] == "https://hooks.example.test/capgate", "webhook not saved")

    # ---- plans: a bad id, a bad cap, then a plan; edited.
    page.tab("Plans")
    page.click("#catalog-new")
    page.type("id", "Pro Plan")
    page.type("name", "Pro")
    page.submit()
    refused_beside(page, "id", "/admin/v1/plans", "POST", {"id": "Pro Plan", "name": "Pro"})
    page.type("id", "pro")
    page.type("monthly_company_cap", "-5")
    page.submit()
    refused_beside(page, "monthly_company_cap", "/admin/v1/plans", "POST", {"id": "pro", "name": "Pro", "monthly_company_cap": -5})
    check(op("/admin/v1/plans/pro")[0] == 404, "a refused plan was created")
    page.type("monthly_company_cap", "5000")
    page.type("monthly_user_budget", "12.5")
    page.type("sort_order", "3")
    page.submit()
    _, plan = op("/admin/v1/plans/pro")
    check((plan["monthly_company_cap"], plan["monthly_user_cap"], plan["monthly_user_budget"], plan["sort_order"]) == (5000, None, "12.5", 3),
          f"plan: {plan}")
    page.row("#catalog-body", "data-id", "pro").find_element("css selector", "button").click()
    page.type("monthly_user_cap", "50")
    # Rate windows (SPEC §14): a bad value first, its API message beside the field, then good ones.
    page.type("user_rpm", "-1")
    page.submit()
    refused_beside(page, "user_rpm", "/admin/v1/plans/pro", "PUT", {"user_rpm": -1})
    page.type("user_rpm", "30")
    page.type("user_concurrency", "3")
    page.submit()
    _, plan = op("/admin/v1/plans/pro")
    check((plan["monthly_user_cap"], plan["user_rpm"], plan["user_concurrency"], plan["company_tpm"]) == (50, 30, 3, None),
          f"plan edit not saved: {plan}")
    page.shoot("operator-plans")

    # ---- a feature, then an entitlement of it in the plan.
    page.tab("Features")
    page.click("#catalog-new")
    page.type("id", "chat")
    page.type("name", "Chat")
    page.submit()
    check(op("/admin/v1/features/chat")[1]["name"] == "Chat", "feature not created")
    page.shoot("operator-features")
    page.tab("Plans")
    page.row("#catalog-body", "data-id", "pro").find_element("css selector", "button.secondary").click()
    page.until(lambda: "Entitlements of Pro" in page.text("#catalog-title"), "the plan's entitlements")
    page.click("#entitlement-new")
    page.pick("feature_id", "Chat")
    page.type("daily_limit", "ten")
    page.submit()
    refused_beside(page, "daily_limit", "/admin/v1/plans/pro/entitlements/chat", "PUT", {"daily_limit": "ten"})
    page.type("daily_limit", "10")
    page.type("message", "Chat is limited to 10 a day on Pro.")
    page.submit()
    _, ents = op("/admin/v1/plans/pro/entitlements")
    check([(e["feature_id"], e["daily_limit"], e["message"]) for e in ents["data"]] == [("chat", 10, "Chat is limited to 10 a day on Pro.")],
          f"entitlements: {ents}")
    page.until(lambda: page.all("#catalog-body tr[data-id='chat']"), "the entitlement's row")
    page.shoot("operator-entitlements")

    # ---- routes: a path outside the prefix refused beside it; a route; deleted.
    page.tab("Routes")
    page.click("#catalog-new")
    page.type("path", "v1/chat")
    page.submit()
    refused_beside(page, "path", "/admin/v1/routes", "POST", {"method": "*", "path": "v1/chat", "units": 1, "items_field": None,
                                                              "feature": None, "feature_header": False, "allowed": True})
    page.type("id", "chat-route")
    page.type("method", "POST")
    page.type("path", "/v1/chat*")
    page.type("units", "2")
    page.pick("feature", "Chat")
    page.submit()
    _, route = op("/admin/v1/routes/chat-route")
    check((route["method"], route["path"], route["units"], route["feature"]) == ("POST", "/v1/chat*", 2, "chat"), f"route: {route}")
    page.shoot("operator-routes")
    page.row("#catalog-body", "data-id", "chat-route").find_element("css selector", "button.danger").click()
    page.submit()
    check(op("/admin/v1/routes/chat-route")[0] == 404, "the route was not deleted")

    # ---- the price book: a bad rate refused beside it, the book unchanged; then a row added.
    page.tab("Price book")
    _, book = op("/admin/v1/prices")
    page.click("#catalog-new")
    page.type("model", "claude-console-test")
    page.type("effective_from", "2026-01-01T00:00:00Z")
    for rate, value in (("input", "3"), ("output", "lots"), ("cache_write_5m", "3.75"), ("cache_write_1h", "6"), ("cache_read", "0.3")):
        page.type(rate, value)
    page.submit()
    check(set(page.errors()) == {"output"} and "output" in page.errors()["output"], f"price errors: {page.errors()}")
    check(op("/admin/v1/prices")[1] == book, "a refused book changed the prices")
    page.shoot("operator-price-error")
    page.type("output", "15")
    page.submit()
    rows = [r for r in op("/admin/v1/prices")[1]["prices"] if r["model"] == "claude-console-test"]
    check(len(rows) == 1 and rows[0]["input"] == "3" and rows[0]["output"] == "15" and rows[0]["long_prompt"] is None, f"price: {rows}")
    check(len(op("/admin/v1/prices")[1]["prices"]) == len(book["prices"]) + 1, "rows were lost")
    page.shoot("operator-prices")

    # ---- the App Store's unmatched notifications, and the whole audit log naming what was done.
    page.tab("App Store")
    _, unmatched = op("/admin/v1/billing/apple/unmatched")
    check(len(page.all("#catalog-body tr[data-id]")) == len(unmatched["data"]), "unmatched rows differ")
    page.shoot("operator-app-store")
    page.tab("Audit log")
    _, audit = op("/admin/v1/audit")
    shown = [r.get_attribute("data-audit") for r in page.all("#audit-rows tr[data-audit]")]
    check(shown == [str(e["id"]) for e in audit["data"]], "audit rows differ")
    actions = {e["action"] for e in audit["data"]}
    check({"company.create", "plan.create", "plan.update", "feature.create", "route.delete"} <= actions, f"actions: {actions}")
    page.shoot("operator-audit")
    page.finish()
    print("console operator ok", len(page.requested), "requests")
finally:
    page.driver.quit()
