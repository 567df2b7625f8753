"""A company admin manages users and API keys in the console (SPEC §13), in a real headless
Chromium against the real gateway: every action typed and clicked as a person would, the API read
back afterwards, the keys made on the page used for real calls (a revoked or expired key refused
on its next call, a rotated one working until its grace ends), and company B out of reach from
the page and from edited requests.

Environment: CAPGATE_URL, SCREENSHOTS, ADMIN_KEY, MEMBER_ID, COMPANY_A, COMPANY_B, B_USER_ID,
B_KEY_ID, B_KEY, OPERATOR_TOKEN.
"""

import os
import time

from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.keys import Keys

from console_support import Page, api, browser, call, check

ADMIN, OPERATOR = os.environ["ADMIN_KEY"], os.environ["OPERATOR_TOKEN"]
A, B = os.environ["COMPANY_A"], os.environ["COMPANY_B"]
MEMBER, B_USER, B_KEY_ID, B_KEY = os.environ["MEMBER_ID"], os.environ["B_USER_ID"], os.environ["B_KEY_ID"], os.environ["B_KEY"]


def keys_of(company=A):
    return {k["id"]: k for k in api(f"/admin/v1/companies/{company}/api-keys", ADMIN if company == A else OPERATOR)[1]["data"]}


def users_of(company=A):
    return {u["id"]: u for u in api(f"/admin/v1/companies/{company}/users", ADMIN if company == A else OPERATOR)[1]["data"]}


def new_key(page, before):
    """The key the dialog shows once, and its record in the API."""
    shown = page.find("#new-key").get_attribute("value")
    made = [k for i, k in keys_of().items() if i not in before]
    check(len(made) == 1, f"{len(made)} keys made")
    check(shown.startswith(made[0]["prefix"]), f"the key shown {shown[:12]}… is not {made[0]['prefix']}")
    return shown, made[0]


def close_key(page):
    page.find("#editor .once button.secondary").click()
    page.until(lambda: not page.dialog_open(), "the key dialog to close")
    # The dialog's "close" event (which empties it) is a task queued after close() returns, so a
    # read in between still finds the key: wait for it to go, and fail if it stays.
    page.until(lambda: not page.all("#new-key"), "the shown key to leave the page (it stays)")


page = Page(browser())
try:
    _, usage = api(f"/admin/v1/companies/{A}/usage", ADMIN)
    _, me = api("/admin/v1/me", ADMIN)
    page.sign_in(ADMIN)
    page.until(lambda: "Up to date" in page.text("#status"), "the usage view")
    # Names, not ids, in the header.
    me_email = next(u["email"] for u in usage["users"] if u["id"] == me["user_id"])
    check(page.text("#who") == f"Signed in as {me_email}, admin of {usage['company']['name']}", "header: " + page.text("#who"))
    check(A not in page.text("header"), "the company's id is in the header")

    # ---- users: a bad cap is refused beside its field and changes nothing; then added.
    page.tab("Users and keys")
    check(len(page.all("#people-users tr[data-user]")) == len(users_of()), "users shown differ from the API's")
    page.shoot("admin-users-keys")
    count = len(users_of())
    page.click("#add-user")
    page.type("email", "new.person@acme.test")
    page.pick("role", "Admin")
    page.type("monthly_cap", "lots")
    page.submit()
    status, refusal = api(f"/admin/v1/companies/{A}/users", ADMIN, "POST",
                          {"email": "new.person@acme.test", "role": "admin", "monthly_cap": "lots"})
    check(status == 400 and page.errors() == {"monthly_cap": refusal["error"]["message"]}, f"cap error: {page.errors()}")
    check(page.find("#f-monthly_cap").get_attribute("aria-invalid") == "true", "the bad field is not marked")
    check(len(users_of()) == count, "a refused user was created")
    page.shoot("admin-user-error")
    page.type("monthly_cap", "7")
    page.submit()
    check(not page.dialog_open(), f"the dialog stayed open: {page.errors()}")
    made = [u for u in users_of().values() if u["email"] == "new.person@acme.test"]
    check(len(made) == 1 and made[0]["role"] == "admin" and made[0]["monthly_cap"] == 7, f"created: {made}")
    person = made[0]["id"]
    check("new.person@acme.test" in page.row("#people-users", "data-user", person).text, "the new user's row")

    # ---- change role, cap and budget; disable; enable again.
    page.row("#people-users", "data-user", person).find_element("css selector", "button").click()
    page.pick("role", "Member")
    page.type("monthly_cap", "")
    page.type("monthly_budget", "2.5")
    page.tick("#f-disabled")
    page.submit()
    user = users_of()[person]
    check((user["role"], user["monthly_cap"], user["monthly_budget"], user["disabled"]) == ("member", None, "2.5", True), f"edited: {user}")
    check("disabled" in page.row("#people-users", "data-user", person).text, "the row does not say disabled")

    # ---- a key for the member, bound to a feature, shown once, used, then revoked.
    before = keys_of()
    page.row("#people-users", "data-user", MEMBER).find_element("css selector", "button.secondary").click()
    page.type("name", "build server")
    page.tick("#f-features-analysis")
    page.shoot("admin-key-create")
    page.submit()
    key, record = new_key(page, before)
    check((record["name"], record["user_id"], record["features"], record["expires_at"]) == ("build server", MEMBER, ["analysis"], None),
          f"key record: {record}")
    page.click("#copy-key")
    page.until(lambda: page.text("#copy-status") != "", "the copy button's answer")
    page.shoot("admin-key-shown-once")
    close_key(page)
    check(call(key)[0] == 200, "the new key does not work")

    # ---- rotate it with a grace of 3 seconds: both work, then only the new one.
    before = keys_of()
    row = page.row("#people-keys", "data-key", record["id"])
    row.find_element("css selector", "button.secondary").click()
    page.type("grace_seconds", "3")
    page.pick("grace_seconds-unit", "seconds")
    page.submit()
    rotated, fresh = new_key(page, before)
    close_key(page)
    check(fresh["name"] == "build server" and fresh["features"] == ["analysis"] and fresh["user_id"] == MEMBER, f"rotated: {fresh}")
    check(call(key)[0] == 200 and call(rotated)[0] == 200, "during the grace both keys work")
    time.sleep(4)
    status, message = call(key)
    check(status == 401 and "expired" in (message or ""), f"after the grace the old key: {status} {message}")
    check(call(rotated)[0] == 200, "the rotated key stopped")

    # ---- revoke the new key: refused on its next call.
    page.tab("Usage")
    page.tab("Users and keys")
    page.row("#people-keys", "data-key", fresh["id"]).find_element("css selector", "button.danger").click()
    page.submit()
    check(keys_of()[fresh["id"]]["revoked_at"] is not None, "not revoked in the API")
    status, message = call(rotated)
    check(status == 401, f"a revoked key: {status} {message}")
    check("revoked" in page.row("#people-keys", "data-key", fresh["id"]).text, "the row does not say revoked")

    # ---- a key that expires 3 seconds after it is made: works, then refused.
    before = keys_of()
    page.click("#add-key")
    page.pick("user_id", next(u["email"] for u in usage["users"] if u["id"] == MEMBER))
    page.type("name", "short-lived")
    page.type("expires_at", "3")
    page.pick("expires_at-unit", "seconds")
    page.submit()
    short, record = new_key(page, before)
    close_key(page)
    check(record["expires_at"] is not None, f"no expiry: {record}")
    check(call(short)[0] == 200, "the short-lived key does not work before it expires")
    time.sleep(4)
    status, message = call(short)
    check(status == 401 and "expired" in (message or ""), f"an expired key: {status} {message}")

    # ---- company B is out of reach: from the page and by editing its requests.
    b_users, b_keys = users_of(B), keys_of(B)
    page.driver.execute_script("state.companyID = arguments[0]; openPeople()", B)
    page.until(lambda: "own company" in page.text("#status"), "the refusal of B")
    check(not any(u["email"] in page.text("main") for u in b_users.values() if u["email"]), "B's users on the page")
    for method, path, body in (
        ("GET", f"/admin/v1/companies/{B}/users", None), ("GET", f"/admin/v1/companies/{B}/api-keys", None),
        ("GET", f"/admin/v1/companies/{B}/audit", None), ("POST", f"/admin/v1/companies/{B}/users", {"email": "x@b.test"}),
        ("PATCH", f"/admin/v1/companies/{B}/users/{B_USER}", {"disabled": True}),
        ("POST", f"/admin/v1/companies/{B}/api-keys", {"user_id": B_USER}),
        ("DELETE", f"/admin/v1/companies/{B}/api-keys/{B_KEY_ID}", None),
        ("POST", f"/admin/v1/companies/{B}/api-keys/{B_KEY_ID}/rotate", {"grace_seconds": 0}),
    ):
        status, text = page.fetch(method, path, body)
        check(status == 403 and B_USER not in text and "x@b.test" not in text, f"{method} {path}: {status} {text}")
    # B's ids in A's paths: not found, nothing of B said.
    for method, path, body in (
        ("PATCH", f"/admin/v1/companies/{A}/users/{B_USER}", {"disabled": True}),
        ("POST", f"/admin/v1/companies/{A}/api-keys", {"user_id": B_USER}),
        ("DELETE", f"/admin/v1/companies/{A}/api-keys/{B_KEY_ID}", None),
        ("POST", f"/admin/v1/companies/{A}/api-keys/{B_KEY_ID}/rotate", {"grace_seconds": 0}),
    ):
        status, text = page.fetch(method, path, body)
        check(status == 404, f"{method} {path}: {status} {text}")
    check(users_of(B) == b_users and keys_of(B) == b_keys, "B changed")
    check(call(B_KEY)[0] == 200, "B's key stopped working")

    # ---- the audit log: every change above, newest first, filtered by action.
    page.tab("Usage")
    page.tab("Audit log")
    _, audit = api(f"/admin/v1/companies/{A}/audit", ADMIN)
    rows = page.all("#audit-rows tr[data-audit]")
    check([r.get_attribute("data-audit") for r in rows] == [str(e["id"]) for e in audit["data"]], "audit rows differ from the API's")
    actions = {e["action"] for e in audit["data"]}
    check({"user.create", "user.update", "api_key.create", "api_key.rotate", "api_key.revoke"} <= actions, f"actions: {actions}")
    check(me_email in rows[0].text, "the actor is not named: " + rows[0].text)
    page.shoot("admin-audit")
    page.find("#audit-action").send_keys("api_key.revoke", Keys.ENTER)
    page.until(lambda: {r.get_attribute("data-action") for r in page.all("#audit-rows tr[data-audit]")} == {"api_key.revoke"}, "the filter")
    page.find("#audit-action").send_keys(Keys.CONTROL, "a")
    page.find("#audit-action").send_keys(Keys.DELETE)
    page.find("#audit-action").send_keys("no action!", Keys.ENTER)
    _, bad = api(f"/admin/v1/companies/{A}/audit?action=no%20action!", ADMIN)
    page.until(lambda: page.text("#audit-error") == bad["error"]["message"], "the filter's error beside it")

    # ---- the plan: what it allows, the upgrade offer as the API gives it, the place of top-ups.
    page.tab("Plan")
    upgrade = usage["usage"]["upgrade"]
    check(upgrade is not None and upgrade["plan"] in page.text("#upgrade-offer"), f"upgrade: {page.text('#upgrade-offer')} vs {upgrade}")
    check(page.text("[data-field=plan-name]") == usage["usage"]["plan"]["name"], "plan name")
    check(page.text("[data-field=plan-user-cap]") == f"{api('/admin/v1/plans/low', OPERATOR)[1]['monthly_user_cap']:,}",
          "per-user cap: " + page.text("[data-field=plan-user-cap]"))
    grants = usage.get("grants") or []
    check(grants, "the fixture's top-up pack is missing from the usage read")
    row = page.find(f"#top-ups tr[data-grant='{grants[0]['id']}']")
    check(grants[0]["product_id"] in row.text and f"{grants[0]['remaining']['units']:,}" in row.text, "top-up row: " + row.text)
    page.shoot("admin-plan")

    # ---- the keyboard alone: Tab reaches "Add a user", Enter opens the form with visible focus, Escape closes it.
    page.tab("Users and keys")
    page.driver.execute_script("document.getElementById('home').focus()")
    for _ in range(30):
        ActionChains(page.driver).send_keys(Keys.TAB).perform()
        if page.driver.switch_to.active_element.get_attribute("id") == "add-user":
            break
    check(page.driver.switch_to.active_element.get_attribute("id") == "add-user", "Tab does not reach 'Add a user'")
    outline = page.driver.execute_script("return getComputedStyle(document.activeElement).outlineStyle")
    check(outline == "solid", f"no visible focus: outline {outline}")
    ActionChains(page.driver).send_keys(Keys.ENTER).perform()
    page.until(lambda: page.dialog_open(), "the dialog by keyboard")
    check(page.driver.switch_to.active_element.get_attribute("id") == "f-email", "focus is not in the form")
    ActionChains(page.driver).send_keys(Keys.ESCAPE).perform()
    page.until(lambda: not page.dialog_open(), "Escape to close the dialog")
    page.finish()
    print("console admin ok", len(page.requested), "requests")
finally:
    page.driver.quit()
