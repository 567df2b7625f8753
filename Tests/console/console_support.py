"""What the console's management checks share: a headless Chromium driven by Selenium, the JSON
API read with a credential, and the person's gestures (type, pick, click, read the result).

Environment: CAPGATE_URL, SCREENSHOTS (a folder).
"""

import json
import os
import time
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import Select, WebDriverWait

BASE = os.environ["CAPGATE_URL"]
SHOTS = os.environ["SCREENSHOTS"]
os.makedirs(SHOTS, exist_ok=True)


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def api(path, credential, method="GET", body=None):
    """The API's answer for `credential`: (status, JSON body)."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"authorization": "Bearer " + credential, "accept": "application/json"}
    if data is not None:
        headers["content-type"] = "application/json"
    request = urllib.request.Request(BASE + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read().decode() or "null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read().decode() or "null")


def call(key):
    """A Messages API call through the gateway with an API key: (status, error message or None)."""
    body = {"model": "claude-test", "max_tokens": 16, "messages": [{"role": "user", "content": "Hello"}]}
    request = urllib.request.Request(BASE + "/v1/messages", data=json.dumps(body).encode(), method="POST",
                                     headers={"x-api-key": key, "anthropic-version": "2023-06-01", "content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()
            return response.status, None
    except urllib.error.HTTPError as error:
        answer = json.loads(error.read().decode() or "{}")
        return error.code, (answer.get("error") or {}).get("message")


def browser(prefs=None):
    """Headless Chromium with the network and console logs kept; `prefs`: Chromium preferences
    (the usage check's download folder)."""
    options = webdriver.ChromeOptions()
    options.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1280,1000",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-default-apps", "--disable-extensions"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    if prefs:
        options.add_experimental_option("prefs", prefs)
    return webdriver.Chrome(service=Service(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")), options=options)


class Page:
    """The console in one browser, with the gestures a person makes."""

    def __init__(self, driver):
        self.driver = driver
        self.wait = WebDriverWait(driver, 15, ignored_exceptions=[StaleElementReferenceException])
        self.requested = []

    def find(self, selector):
        return self.driver.find_element(By.CSS_SELECTOR, selector)

    def all(self, selector):
        return self.driver.find_elements(By.CSS_SELECTOR, selector)

    def text(self, selector):
        return self.find(selector).text

    def until(self, condition, what):
        try:
            return self.wait.until(lambda d: condition())
        except Exception as error:
            raise AssertionError(f"waited for {what}; status {self.text('#status')!r}") from error

    def sign_in(self, credential):
        self.driver.get(BASE + "/console")
        field = self.wait.until(EC.visibility_of_element_located((By.ID, "credential")))
        field.send_keys(credential)
        self.find("#sign-in-form button[type=submit]").click()

    def click(self, selector):
        element = self.find(selector)
        self.driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", element)
        element.click()

    def tab(self, label):
        """Opens a view by its tab or navigation button, and waits for it to load."""
        buttons = [b for b in self.all("#company-tabs button, #nav button") if b.text == label and b.is_displayed()]
        check(buttons, f"no tab {label!r}")
        buttons[0].click()
        self.until(lambda: buttons[0].get_attribute("aria-current") == "page" and "Loading" not in self.text("#status"), label)

    def dialog_open(self):
        return self.driver.execute_script("return document.getElementById('editor').open")

    def field(self, name):
        """A field of the open dialog, once it is there (some forms read the API before they open)."""
        self.until(lambda: self.all("#editor[open] #f-" + name), "the field " + name)
        return self.find("#f-" + name)

    def type(self, name, value):
        field = self.field(name)
        field.send_keys(Keys.CONTROL, "a")
        field.send_keys(Keys.DELETE)
        if value:
            field.send_keys(value)

    def pick(self, name, label):
        Select(self.field(name)).select_by_visible_text(label)

    def tick(self, selector, on=True):
        box = self.find(selector)
        if box.is_selected() != on:
            box.click()

    def submit(self):
        """Submits the dialog's form; waits until it closes or shows an error."""
        self.find("#editor form button[type=submit]").click()
        self.until(lambda: not self.dialog_open() or self.errors() or self.all("#new-key"), "the form's answer")

    def errors(self):
        """The errors the dialog shows now: {field name or 'form': message}."""
        shown = {}
        for box in self.all("#editor .field"):
            message = box.find_element(By.CSS_SELECTOR, ".error").text
            if message:
                shown[box.get_attribute("data-name")] = message
        for p in self.all("#editor .form-error"):
            if p.text:
                shown["form"] = p.text
        return shown

    def row(self, table, attribute, value):
        return self.find(f"{table} tr[{attribute}='{value}']")

    def shoot(self, name):
        """Screenshots of the page as it is now at 1280 and 375 px; nothing wider than a phone's screen."""
        self.driver.execute_script("window.scrollTo(0, 0)")
        self.driver.save_screenshot(os.path.join(SHOTS, name + "-1280.png"))
        self.driver.set_window_size(375, 900)
        time.sleep(0.3)
        width = self.driver.execute_script("return document.documentElement.scrollWidth")
        check(width <= 380, f"{name}: the page is {width}px wide at phone width")
        self.driver.save_screenshot(os.path.join(SHOTS, name + "-375.png"))
        self.driver.set_window_size(1280, 1000)
        time.sleep(0.2)

    def fetch(self, method, path, body=None):
        """A request the page's own credential makes, as someone editing the page's requests would."""
        return self.driver.execute_async_script(
            """const [method, path, body, done] = arguments;
               const headers = {authorization: "Bearer " + sessionStorage.getItem("capgate.credential"), "content-type": "application/json"};
               fetch(path, {method, headers, body: body === null ? undefined : JSON.stringify(body)})
                 .then(async (r) => done([r.status, await r.text()])).catch((e) => done([0, String(e)]));""",
            method, path, body)

    def finish(self):
        """No request left for another host; no browser error but the refusals the checks asked for."""
        for entry in self.driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            if message["method"] == "Network.requestWillBeSent":
                self.requested.append(message["params"]["request"]["url"])
        foreign = [u for u in self.requested if not (u.startswith(BASE + "/") or u.startswith("blob:") or u.startswith("data:"))]
        check(not foreign, f"requests off the gateway: {foreign}")
        expected = ("400", "401", "403", "404", "409")
        severe = [e for e in self.driver.get_log("browser") if e["level"] == "SEVERE" and not any(x in e["message"] for x in expected)]
        check(not severe, f"browser errors: {severe}")
