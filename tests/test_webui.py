"""The chat page at / in a real headless browser (Debian's chromium through Selenium): it loads,
sends a message (and one with an attached image, to a server with --mmproj), and shows the
streamed reply, which is the API's own reply at temperature 0."""
from __future__ import annotations

import os
import shutil

import pytest

pytest.importorskip("fastapi", reason="the server extra is not installed")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[test]')")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
if not (CHROMIUM and DRIVER):
    pytest.skip("no chromium and chromedriver here (.ci/run installs Debian's chromium and chromium-driver)",
                allow_module_level=True)

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from test_server import KEY, Server  # noqa: E402

SCREENSHOT = os.environ.get("TORCHGGML_WEBUI_SCREENSHOT")  # a path: the page's picture after the reply


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1100,700"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=DRIVER), options=options)
    yield driver
    driver.quit()


def set_fields(browser, **values):
    for field, value in values.items():
        element = browser.find_element(By.ID, field)
        browser.execute_script("arguments[0].value = arguments[1]; arguments[0].onchange()", element, value)


def wait_for_reply(browser) -> str:
    WebDriverWait(browser, 120).until(lambda b: len(b.find_elements(By.CSS_SELECTOR, ".message.assistant")) == 1
                                      and b.find_element(By.ID, "send").is_enabled())
    assert browser.find_elements(By.CSS_SELECTOR, ".message.assistant .error") == []
    return browser.find_element(By.CSS_SELECTOR, ".message.assistant .content").text


def test_the_page_sends_a_message_and_shows_the_streamed_reply(browser):
    server = Server("--parallel", "2", "--api-key", KEY)
    try:
        expected = server.client().chat.completions.create(
            model=server.model_id, messages=[{"role": "user", "content": "Tell me about graphs"}],
            max_tokens=12, temperature=0).choices[0].message.content
        browser.get(server.url + "/")
        assert browser.title == "torchggml chat"
        set_fields(browser, temperature="0", max_tokens="12", api_key=KEY)
        browser.find_element(By.ID, "input").send_keys("Tell me about graphs")
        browser.find_element(By.ID, "send").click()
        reply = wait_for_reply(browser)
        assert reply.strip() == expected.strip() and reply.strip()
        titles = [li.text for li in browser.find_elements(By.CSS_SELECTOR, "#conversations li")]
        assert titles == ["Tell me about graphs"]
        if SCREENSHOT:
            browser.save_screenshot(SCREENSHOT)
    finally:
        server.stop()


def test_the_page_sends_an_attached_image(browser, tmp_path):
    """A picture picked in the composer goes as an image_url part (a data URL): the reply is the
    API's own for the same message, and the picture shows in the conversation."""
    pytest.importorskip("PIL", reason="the vision extra (Pillow) is not installed")
    import base64
    from test_server_media import png_bytes
    from torchggml.gguf.writer.tiny_mmproj import write_tiny_mmproj, write_tiny_text_model
    picture = tmp_path / "picture.png"
    picture.write_bytes(png_bytes())
    server = Server(write_tiny_text_model(tmp_path / "text.gguf"), "--mmproj",
                    write_tiny_mmproj(tmp_path / "mmproj.gguf", "gemma3"), "--api-key", KEY)
    try:
        url = "data:image/png;base64," + base64.b64encode(png_bytes()).decode()
        expected = server.client().chat.completions.create(model=server.model_id, messages=[{"role": "user", "content": [
            {"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": url}}]}],
            max_tokens=8, temperature=0).choices[0].message.content
        browser.get(server.url + "/")
        browser.execute_script("localStorage.clear()")
        browser.get(server.url + "/")
        set_fields(browser, temperature="0", max_tokens="8", api_key=KEY)
        browser.find_element(By.ID, "attach").send_keys(str(picture))
        WebDriverWait(browser, 30).until(lambda b: b.find_elements(By.CSS_SELECTOR, "#attachments img"))
        browser.find_element(By.ID, "input").send_keys("What is this?")
        browser.find_element(By.ID, "send").click()
        reply = wait_for_reply(browser)
        visible = lambda text: "".join(ch for ch in text if ch.isprintable()).strip()  # noqa: E731 (as the page shows it)
        assert visible(reply) == visible(expected)
        assert browser.find_elements(By.CSS_SELECTOR, ".message.user img")  # the picture in the conversation
        if SCREENSHOT:
            browser.save_screenshot(SCREENSHOT.replace(".png", "-image.png"))
    finally:
        server.stop()
