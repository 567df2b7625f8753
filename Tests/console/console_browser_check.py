"""The usage console (SPEC §10) in a real headless Chromium, driven by Selenium, against the real
gateway and database the Swift test started. Every number the page shows is compared with the
JSON API's answer for the same credential, never with a constant.

Environment: CAPGATE_URL, ADMIN_KEY, MEMBER_KEY, OPERATOR_TOKEN, COMPANY_A, COMPANY_B,
SCREENSHOTS (a folder), DOWNLOADS (a folder).
"""

import csv
import io
import json
import os
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime, timedelta

from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

from console_support import browser, check

BASE = os.environ["CAPGATE_URL"]
ADMIN, MEMBER, OPERATOR = os.environ["ADMIN_KEY"], os.environ["MEMBER_KEY"], os.environ["OPERATOR_TOKEN"]
A, B = os.environ["COMPANY_A"], os.environ["COMPANY_B"]
SHOTS, DOWNLOADS = os.environ["SCREENSHOTS"], os.environ["DOWNLOADS"]
os.makedirs(SHOTS, exist_ok=True)
os.makedirs(DOWNLOADS, exist_ok=True)


def api(path, credential, accept="application/json"):
    request = urllib.request.Request(BASE + path, headers={"authorization": "Bearer " + credential, "accept": accept})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read().decode()
            return response.status, (body if accept == "text/csv" else json.loads(body))
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read().decode())


def fmt(n):
    return "—" if n is None else f"{n:,}"


def usd(amount):
    """A decimal string of US dollars as the page shows it: every digit, at least cents."""
    whole, _, fraction = amount.partition(".")
    return "$" + whole + "." + fraction.ljust(2, "0")


driver = browser({"download.default_directory": DOWNLOADS, "download.prompt_for_download": False})
wait = WebDriverWait(driver, 15)
requested = []


def drain_network():
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            requested.append(message["params"]["request"]["url"])


def text(selector):
    return driver.find_element(By.CSS_SELECTOR, selector).text


def sign_in(credential):
    field = wait.until(EC.visibility_of_element_located((By.ID, "credential")))
    field.clear()
    field.send_keys(credential)
    driver.find_element(By.CSS_SELECTOR, "#sign-in-form button[type=submit]").click()


def shoot(name):
    driver.save_screenshot(os.path.join(SHOTS, name + ".png"))


def at_phone_width(name):
    """The page as it is now, at 375 px: nothing wider than the screen; a screenshot named `name`."""
    driver.execute_script("window.scrollTo(0, 0)")
    driver.set_window_size(375, 900)
    time.sleep(0.3)
    overflow = driver.execute_script("return document.documentElement.scrollWidth")
    check(overflow <= 380, f"{name}: the page is {overflow}px wide at phone width")
    shoot(name)
    driver.set_window_size(1280, 1000)


try:
    driver.get(BASE + "/console")
    check("CapGate" in driver.title, "the console page did not load: " + driver.title)

    # A member's key is refused with the API's own message, and forgotten.
    status, refusal = api(f"/admin/v1/companies/{A}/usage", MEMBER)
    check(status == 403, f"the API let a member read the company: {status}")
    sign_in(MEMBER)
    wait.until(lambda d: text("#sign-in-error") != "")
    check(text("#sign-in-error") == refusal["error"]["message"], "member refusal: " + text("#sign-in-error"))
    check(driver.execute_script("return sessionStorage.getItem('capgate.credential')") is None, "a refused key was kept")

    # The admin of A sees A's numbers, as the API gives them.
    sign_in(ADMIN)
    wait.until(EC.visibility_of_element_located((By.ID, "company")))
    wait.until(lambda d: "Up to date" in text("#status"))
    _, usage = api(f"/admin/v1/companies/{A}/usage", ADMIN)
    shoot("admin-desktop")
    check(text("#company-title") == usage["company"]["name"], "title: " + text("#company-title"))
    check(text("[data-field=used]") == fmt(usage["usage"]["company"]["used"]), "used: " + text("[data-field=used]"))
    check(text("[data-field=limit]") == fmt(usage["usage"]["company"]["limit"]), "cap: " + text("[data-field=limit]"))
    check(text("[data-field=plan]") == usage["usage"]["plan"]["name"], "plan: " + text("[data-field=plan]"))
    rows = driver.find_elements(By.CSS_SELECTOR, "#users tbody tr[data-user]")
    check(len(rows) == len(usage["users"]), f"users: {len(rows)} rows for {len(usage['users'])}")
    for user in usage["users"]:
        row = driver.find_element(By.CSS_SELECTOR, f"#users tr[data-user='{user['id']}']")
        check(fmt(user["used"]) + " / " in row.text, f"user {user['email']}: {row.text}")

    # The chart spans every day of the period (days to come empty); one bar per day with data,
    # each the day's units.
    _, daily = api(f"/admin/v1/companies/{A}/usage/daily", ADMIN)
    with_data = {d["date"]: d["units"] for d in daily if d["units"] > 0}
    check(len(with_data) >= 2, f"the test data should span several days: {daily}")
    bars = driver.find_elements(By.CSS_SELECTOR, "#daily svg g.bar")
    drawn = {b.get_attribute("data-label"): int(b.get_attribute("data-total")) for b in bars}
    period = usage["usage"]["period"]
    # Every calendar day (UTC, the company's zone) the period touches, its last second included.
    last = datetime.fromisoformat(period["end"]) - timedelta(seconds=1)
    span = (last.date() - datetime.fromisoformat(period["start"]).date()).days + 1
    check(len(bars) == span and span >= 28, f"{len(bars)} bars for a period of {span} days")
    check(min(drawn) == period["start"][:10] and daily[0]["date"] == period["start"][:10], f"the chart starts {min(drawn)}")
    widths = {float(r.get_attribute("width")) for r in driver.find_elements(By.CSS_SELECTOR, "#daily svg rect")}
    check(max(widths) <= 40, f"bars {max(widths)} wide")
    check({d: n for d, n in drawn.items() if n > 0} == with_data, f"bars {drawn} vs API {with_data}")
    check(all(len(b.find_elements(By.TAG_NAME, "rect")) > 0 for b in bars if int(b.get_attribute("data-total")) > 0),
          "a day with data has no rectangle")

    # The plan's features with their windows, and each user's use of them, as the API gives them.
    features = usage["usage"]["features"]
    check(len(features) == 1 and features[0]["id"] == "analysis", f"fixture: {features}")
    row = driver.find_element(By.CSS_SELECTOR, "#features tr[data-feature='analysis']")
    cells = [td.text for td in row.find_elements(By.TAG_NAME, "td")]
    day_window, period_window = features[0]["day"], features[0]["period"]
    check(cells[1].startswith(f"{fmt(day_window['used'])} / {fmt(day_window['limit'])}"), f"feature today: {cells}")
    check(cells[2].startswith(f"{fmt(period_window['used'])} / unlimited"), f"feature period: {cells}")
    for user in usage["users"]:
        mine = next(f for f in user["features"] if f["id"] == "analysis")
        row = driver.find_element(By.CSS_SELECTOR, f"#users tr[data-user='{user['id']}']")
        check(f"Analysis: {fmt(mine['user_period']['used'])}" in row.text, f"user features: {row.text} vs {mine}")

    # Spend against budget (SPEC §11): the company's and each user's, as the API gives them.
    def dollars(amount):
        return "unlimited" if amount is None else usd(amount)

    spend = usage["cost"]["company"]
    check(spend["limit"] is not None and spend["used"] != "0" and spend["held"] != "0", f"fixture: {spend}")
    for field in ("used", "held", "limit", "remaining"):
        shown = text(f"[data-field=cost-{field}]")
        check(shown == dollars(spend[field]), f"cost {field}: {shown!r} vs {spend[field]!r}")
    check(any(u["cost"]["limit"] != spend["limit"] for u in usage["users"]), "fixture: no user with a budget of its own")
    for user in usage["users"]:
        cell = driver.find_element(By.CSS_SELECTOR, f"#users tr[data-user='{user['id']}'] td.spend").text
        want = usd(user["cost"]["used"]) + " / " + dollars(user["cost"]["limit"])
        check(cell.startswith(want), f"user spend: {cell!r} vs {want!r}")

    # Cost per model this period, as /usage/models gives it, most costly first.
    _, per_model = api(f"/admin/v1/companies/{A}/usage/models", ADMIN)
    check(len(per_model["models"]) == 2, f"fixture: {per_model}")
    rows = driver.find_elements(By.CSS_SELECTOR, "#models tbody tr[data-model]")
    check([r.get_attribute("data-model") for r in rows] == [m["model"] or "" for m in per_model["models"]],
          f"model rows: {[r.text for r in rows]}")
    for row, m in zip(rows, per_model["models"]):
        cells = [td.text for td in row.find_elements(By.TAG_NAME, "td")]
        want = [m["model"] or "(no model)", fmt(m["calls"]), fmt(m["input_tokens"]), fmt(m["output_tokens"]),
                fmt(m["cache_write_tokens"]), fmt(m["cache_read_tokens"]), usd(m["cost_usd"]), usd(m["held_usd"])]
        check(cells == want, f"model row {cells} vs {want}")
    driver.execute_script("document.getElementById('users').scrollIntoView()")
    shoot("admin-cost")

    # Notifications (the 80 % of the cap was crossed by the test's calls).
    _, notes = api(f"/admin/v1/companies/{A}/notifications", ADMIN)
    check(len(driver.find_elements(By.CSS_SELECTOR, "#notifications li")) == len(notes["data"]), "notifications differ")

    # The latest calls and the CSV download.
    _, csv_text = api(f"/admin/v1/companies/{A}/events?from={usage['usage']['period']['start']}", ADMIN, "text/csv")
    driver.find_element(By.ID, "csv").click()
    deadline = time.time() + 15
    files = []
    while time.time() < deadline:
        files = [f for f in os.listdir(DOWNLOADS) if f.endswith(".csv")]
        if files:
            break
        time.sleep(0.2)
    check(files, "no CSV was downloaded")
    with open(os.path.join(DOWNLOADS, files[0]), encoding="utf-8") as f:
        downloaded = f.read()
    check(list(csv.reader(io.StringIO(downloaded))) == list(csv.reader(io.StringIO(csv_text))), "the CSV differs from the API's")
    check(len(driver.find_elements(By.CSS_SELECTOR, "#events tbody tr")) == min(20, len(downloaded.strip().splitlines()) - 1),
          "latest calls table")
    # The latest calls are the newest, newest first.
    _, latest = api(f"/admin/v1/companies/{A}/events?order=desc&limit=20&from={usage['usage']['period']['start']}", ADMIN)
    shown = [r.find_elements(By.TAG_NAME, "td")[0].text for r in driver.find_elements(By.CSS_SELECTOR, "#events tbody tr")]
    check(shown == [e["time"].replace("T", " ")[:19] for e in latest["data"]], f"latest calls: {shown[:3]}…")
    _, oldest_first = api(f"/admin/v1/companies/{A}/events?limit=1000&from={usage['usage']['period']['start']}", ADMIN)
    check([e["id"] for e in latest["data"]] == [e["id"] for e in oldest_first["data"]][-20:][::-1],
          "order=desc is not the last page of order=asc, reversed")

    # The key is nowhere but sessionStorage.
    check(ADMIN not in driver.current_url and ADMIN not in driver.page_source, "the key is in the URL or the page")
    check(driver.execute_script("return document.cookie") == "", "a cookie was set")
    at_phone_width("admin-phone")

    # The admin of A cannot open B: the page shows the API's refusal and stays on A.
    driver.execute_script("openCompany(arguments[0], false)", B)
    wait.until(lambda d: "own company" in text("#status"))
    check(text("#company-title") == usage["company"]["name"], "B's data replaced A's")

    # Keyboard: from the home link at the top of the page, Tab reaches the sign-out button and
    # Enter on it signs out.
    sign_out = driver.find_element(By.ID, "sign-out")
    driver.execute_script("window.scrollTo(0, 0); document.getElementById('home').focus()")
    ActionChains(driver).send_keys(Keys.TAB).perform()
    check(driver.switch_to.active_element == sign_out, "Tab from the home link does not reach sign-out")
    ActionChains(driver).send_keys(Keys.ENTER).perform()
    wait.until(EC.visibility_of_element_located((By.ID, "sign-in")))
    check(driver.execute_script("return sessionStorage.getItem('capgate.credential')") is None, "sign-out kept the key")

    # The operator: every company, sortable, searchable, each opening its view.
    sign_in(OPERATOR)
    wait.until(EC.visibility_of_element_located((By.ID, "operator")))
    _, companies = api("/admin/v1/companies", OPERATOR)
    rows = driver.find_elements(By.CSS_SELECTOR, "#companies tbody tr[data-company]")
    check(len(rows) == len(companies["data"]), f"{len(rows)} companies shown, {len(companies['data'])} in the API")
    check(text("#status") == f"{len(rows)} companies.", "status: " + text("#status"))
    check(driver.execute_script("return plural(1, 'company', 'companies')") == "1 company", "one company")

    def shown_order():
        return [r.get_attribute("data-company") for r in driver.find_elements(By.CSS_SELECTOR, "#companies tbody tr[data-company]")]

    by_name = [c["id"] for c in sorted(companies["data"], key=lambda c: c["name"])]
    driver.find_element(By.CSS_SELECTOR, "#companies th button[data-sort=name]").click()
    check(shown_order() == by_name, "name sort")
    driver.find_element(By.CSS_SELECTOR, "#companies th button[data-sort=name]").click()
    check(shown_order() == list(reversed(by_name)), "name sort, descending")
    driver.find_element(By.CSS_SELECTOR, "#companies th button[data-sort=used]").click()
    used = [next(c["used"] for c in companies["data"] if c["id"] == i) for i in shown_order()]
    check(used == sorted(used, reverse=True), f"used sort: {used}")
    name_a = usage["company"]["name"]
    driver.find_element(By.ID, "search").send_keys(name_a)
    check(shown_order() == [A], f"search: {shown_order()}")
    shoot("operator-desktop")
    at_phone_width("operator-phone")
    driver.find_element(By.CSS_SELECTOR, f"#companies tr[data-company='{A}'] button").click()
    wait.until(lambda d: "Up to date" in text("#status") and text("#company-title") == name_a)

    # The states a person meets: no plan, cap reached.
    for company, words in ((os.environ["COMPANY_NO_PLAN"], "no plan"), (os.environ["COMPANY_FULL"], "cap is reached")):
        driver.find_element(By.ID, "back").click()
        wait.until(EC.visibility_of_element_located((By.ID, "operator")))
        search = driver.find_element(By.ID, "search")
        search.send_keys(Keys.CONTROL, "a")
        search.send_keys(Keys.DELETE)
        driver.find_element(By.CSS_SELECTOR, f"#companies tr[data-company='{company}'] button").click()
        wait.until(lambda d: "Up to date" in text("#status") or words in text("#banner"))
        check(words in text("#banner"), f"{company}: banner {text('#banner')!r}")
    shoot("company-cap-reached")

    # Unlimited and nothing used yet: no cap to meet, no banner, the empty period said in words.
    driver.find_element(By.ID, "back").click()
    wait.until(EC.visibility_of_element_located((By.ID, "operator")))
    driver.find_element(By.CSS_SELECTOR, f"#companies tr[data-company='{os.environ['COMPANY_UNLIMITED']}'] button").click()
    wait.until(lambda d: "Up to date" in text("#status") and text("#company-title") == "Epsilon Unlimited")
    _, unlimited = api(f"/admin/v1/companies/{os.environ['COMPANY_UNLIMITED']}/usage", OPERATOR)
    check(unlimited["usage"]["company"]["limit"] is None and unlimited["usage"]["company"]["used"] == 0, f"fixture: {unlimited}")
    check(text("[data-field=limit]") == "unlimited" and text("[data-field=remaining]") == "unlimited",
          f"unlimited: {text('[data-field=limit]')!r} {text('[data-field=remaining]')!r}")
    check(text("[data-field=used]") == "0", "used: " + text("[data-field=used]"))
    check(not driver.find_element(By.ID, "banner").is_displayed(), "a banner on an unlimited plan: " + text("#banner"))
    check("No calls yet" in text("#events"), "empty period: " + text("#events"))
    check(text("[data-field=cost-limit]") == "unlimited" and text("[data-field=cost-remaining]") == "unlimited",
          f"unlimited budget: {text('[data-field=cost-limit]')!r} {text('[data-field=cost-remaining]')!r}")
    check(text("[data-field=cost-used]") == "$0.00", "spend: " + text("[data-field=cost-used]"))
    check("No calls yet" in text("#models"), "empty period, models: " + text("#models"))
    shoot("company-unlimited-empty")

    # The gateway unreachable: the page says so and keeps the credential; once it is back, "Try
    # again" opens the same view.
    driver.set_network_conditions(offline=True, latency=0, download_throughput=1 << 20, upload_throughput=1 << 20)
    driver.find_element(By.ID, "home").click()
    wait.until(EC.visibility_of_element_located((By.ID, "offline")))
    check("cannot be reached" in text("#offline-text"), "offline text: " + text("#offline-text"))
    check(driver.execute_script("return sessionStorage.getItem('capgate.credential')") == OPERATOR, "an outage signed the operator out")
    shoot("gateway-unreachable")
    driver.delete_network_conditions()
    driver.find_element(By.ID, "retry").click()
    wait.until(EC.visibility_of_element_located((By.ID, "operator")))

    # Basic accessibility: every input has a label, every button a name, the document a language.
    unlabeled = driver.execute_script(
        "return [...document.querySelectorAll('input')].filter(i => !i.labels || !i.labels.length).map(i => i.id)")
    check(not unlabeled, f"inputs without a label: {unlabeled}")
    nameless = driver.execute_script(
        "return [...document.querySelectorAll('button')].filter(b => !b.textContent.trim() && !b.getAttribute('aria-label')).length")
    check(nameless == 0, f"{nameless} buttons without a name")
    check(driver.execute_script("return document.documentElement.lang") == "en", "no document language")

    # No request left for any other host.
    drain_network()
    foreign = [u for u in requested if not (u.startswith(BASE + "/") or u.startswith("blob:") or u.startswith("data:"))]
    check(not foreign, f"requests off the gateway: {foreign}")
    check(any("/usage/daily" in u for u in requested), "the network log is empty")
    expected = ("403", "401", "ERR_INTERNET_DISCONNECTED")
    severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE" and not any(x in e["message"] for x in expected)]
    check(not severe, f"browser errors: {severe}")
    print("console ok", len(requested), "requests")
finally:
    driver.quit()
