"""The web console (``stratamq console``) in a real browser against a real broker: every page
loads clean, and what a user does through its forms reaches the broker and its clients."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
from console_browser import browser, post, problems, start_console
from test_broker_harness import BrokerProcess, config, create_topic, message
from waiting import wait_until

from stratamq.client.admin import AdminClient, AdminError
from stratamq.client.messaging import MessagingClient


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(tmp_path_factory.mktemp("console") / "store").start()
    yield b
    b.terminate()


@pytest.fixture(scope="module")
def console(broker):
    c = start_console(broker.endpoint)
    yield c
    assert c.stop() == 0
    assert not [line for line in c.log if "Traceback" in line], "".join(c.log)


@pytest.fixture(scope="module")
def driver():
    d = browser()
    yield d
    d.quit()


def _open(driver, url: str, shots=None, name: str = "") -> None:
    driver.get(url)
    if shots is not None:
        driver.save_screenshot(str(shots / f"{name}.png"))
    assert problems(driver) == [], url


def _submit(driver, form_id: str, **fields: str) -> None:
    from selenium.webdriver.common.by import By

    form = driver.find_element(By.ID, form_id)
    for name, value in fields.items():
        box = form.find_element(By.NAME, name)
        if box.get_attribute("type") in ("checkbox", "radio"):
            form.find_element(By.CSS_SELECTOR, f"[name={name}][value='{value}']").click()
        else:
            box.clear()
            box.send_keys(value)
    # A click only starts the post: wait until the old page is gone and the answer loaded,
    # else the next lookup can still read the page the form was on. The old page carries a
    # mark that the new one lacks; asking an element of the old page whether it is stale
    # instead fails in newer chromedrivers with "Node ... does not belong to the document".
    driver.execute_script("window.__stratamqOldPage = true;")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, 30).until(lambda d: d.execute_script(
        "return window.__stratamqOldPage !== true && document.readyState === 'complete'"))


def _text(driver, css: str) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, css).text


def _cli_lines(broker, *args: str) -> list[dict]:
    done = broker.cli(*args)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def _send(broker, topic: str, body: bytes, key: str) -> str:
    from rocketmq import Producer

    producer = Producer(config(broker.endpoint), (topic,))
    producer.startup()
    try:
        return producer.send(message(topic, body, keys=(key,))).message_id
    finally:
        producer.shutdown()


def _consume(broker, group: str, topic: str, want: int, *, ack: bool = True) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    with MessagingClient(broker.endpoint) as client:
        while len(got) < want and time.monotonic() < deadline:
            for m in client.receive(group, topic, invisible_ms=1000, wait_ms=1000):
                got.append(bytes(m.body))
                if ack:
                    client.ack(group, topic, m)
    return got


def test_every_page_loads_with_no_error_and_a_screenshot(broker, console, driver, tmp_path):
    from selenium.webdriver.common.by import By

    create_topic(broker, "Pages", 2)
    _send(broker, "Pages", b'{"order": 1, "items": ["a", "b"]}', "page-key")
    assert _consume(broker, "PagesGroup", "Pages", 1) == [b'{"order": 1, "items": ["a", "b"]}']
    from rocketmq import FilterExpression, SimpleConsumer

    consumer = SimpleConsumer(config(broker.endpoint), "PagesGroup",
                              {"Pages": FilterExpression("*")}, await_duration=1)
    consumer.startup()  # a connected client, shown on its group's page
    try:
        _open(driver, console.url + "/groups/PagesGroup")
        assert "s ago" in _text(driver, "#clients")  # not "no connected clients"
    finally:
        consumer.shutdown()
    for name, path in [("overview", "/"), ("topics", "/topics"), ("topic", "/topics/Pages"),
                       ("groups", "/groups"), ("group", "/groups/PagesGroup"),
                       ("messages", "/messages?topic=Pages&queue=0&offset=0"),
                       ("dlq", "/dlq?group=PagesGroup"), ("charts", "/charts")]:
        _open(driver, console.url + path, tmp_path, name)
    _open(driver, console.url + "/")
    assert driver.find_elements(By.ID, "cluster") == []  # not in controller mode
    _open(driver, console.url + "/topics?q=pag")  # the list's filter
    assert [a.text for a in driver.find_elements(By.CSS_SELECTOR, "#topics a")] == ["Pages"]
    driver.get(console.url + "/favicon.ico")
    assert problems(driver) == []
    assert sorted(p.name for p in tmp_path.glob("*.png")) == sorted(
        f"{n}.png" for n in ("overview", "topics", "topic", "groups", "group", "messages",
                             "dlq", "charts"))


def test_topic_created_through_the_form_is_listed_and_deleted_only_when_confirmed(
        broker, console, driver):
    _open(driver, console.url + "/topics")
    # The browser itself refuses a name RocketMQ would refuse, before anything is posted.
    assert driver.execute_script(
        "const box = document.getElementById('new-topic');"
        "return ['bad name!', 'ok_name-%|1'].map(v => { box.value = v;"
        " return box.checkValidity(); });") == [False, True]
    _submit(driver, "create-topic", topic="FromForm", queues="3")
    assert "topic FromForm created" in _text(driver, "#note")
    listed = {t["topic"]: t for t in _cli_lines(broker, "topic", "list")}
    assert listed["FromForm"]["queues"] == 3
    _submit(driver, "update-topic", write_queues="2")
    assert "updated" in _text(driver, "#note")
    assert {t["topic"]: t for t in _cli_lines(broker, "topic", "list")}["FromForm"][
        "write_queues"] == 2
    _submit(driver, "delete-topic", confirm="NotThatOne")
    assert "type the topic's name" in _text(driver, "#error")
    assert "FromForm" in {t["topic"] for t in _cli_lines(broker, "topic", "list")}
    problems(driver)  # the refusal's 400 is the point here
    _open(driver, console.url + "/topics/FromForm")
    _submit(driver, "delete-topic", confirm="FromForm")
    assert "deleted" in _text(driver, "#note")
    assert "FromForm" not in {t["topic"] for t in _cli_lines(broker, "topic", "list")}


def _has_query(broker) -> bool:
    with AdminClient(broker.endpoint) as admin:
        try:
            admin.call("QueryMessage", topic="Pages", key="none")
        except AdminError as exc:
            return exc.code != "UNIMPLEMENTED"
    return True


def test_a_message_sent_by_the_official_client_is_found_and_its_body_shown(
        broker, console, driver):
    from selenium.webdriver.common.by import By

    create_topic(broker, "Found", 1)
    msg_id = _send(broker, "Found", b'{"hello": "console"}', "order-77")
    _open(driver, console.url + "/messages?topic=Found&queue=0&offset=0")
    assert _text(driver, ".msg-id") == msg_id
    assert json.loads(_text(driver, "pre.body-json")) == {"hello": "console"}
    driver.find_element(By.CSS_SELECTOR, "[data-view=hex]").click()  # the page's own script
    assert _text(driver, "pre.body-hex").startswith("7b 22 68 65")
    assert not driver.find_element(By.CSS_SELECTOR, "pre.body-json").is_displayed()
    if not _has_query(broker):
        pytest.skip("the broker has no QueryMessage yet (the usability branch adds it)")
    for search in ("key=order-77", f"msg_id={msg_id}"):
        _open(driver, f"{console.url}/messages?topic=Found&{search}")
        assert _text(driver, ".msg-id") == msg_id, search
        assert json.loads(_text(driver, "pre.body-json")) == {"hello": "console"}


def test_a_message_sent_from_the_console_reaches_a_consumer(broker, console, driver):
    create_topic(broker, "TestSend", 1)
    _open(driver, console.url + "/messages")
    _submit(driver, "send", topic="TestSend", body="typed in the console", keys="k1 k2")
    assert "sent to TestSend" in _text(driver, "#note")
    assert problems(driver) == []
    assert _consume(broker, "TestSendGroup", "TestSend", 1) == [b"typed in the console"]


def test_a_dead_letter_resent_from_the_console_reaches_the_consumer(broker, console, driver):
    create_topic(broker, "Doomed", 1)
    _cli_lines(broker, "group", "create", "--group", "DoomedGroup", "--retry-max-times", "0")
    _send(broker, "Doomed", b"second chance", "dlq-key")
    assert _consume(broker, "DoomedGroup", "Doomed", 1, ack=False) == [b"second chance"]

    def dead() -> bool:  # a receive after the invisible time moves it to %DLQ%DoomedGroup
        with MessagingClient(broker.endpoint) as client:
            assert client.receive("DoomedGroup", "Doomed", wait_ms=200) == []
        status = broker.cli("topic", "status", "--topic", "%DLQ%DoomedGroup")
        return status.returncode == 0 and json.loads(status.stdout)["messages"] == 1

    wait_until(dead, 60, "the message in the DLQ")
    _open(driver, console.url + "/groups/DoomedGroup")
    assert _text(driver, "#dead-letters") == "1"
    assert _text(driver, "#retry-messages") == "0"
    _open(driver, console.url + "/groups?q=DoomedGroup")  # the list counts them too
    assert (_text(driver, "#groups td.retry"), _text(driver, "#groups td.dlq")) == ("0", "1")
    _open(driver, console.url + "/dlq?group=DoomedGroup")
    assert _text(driver, "#dlq-count").startswith("1 dead letter")
    _submit(driver, "resend", pick="0:0")
    assert "resent 1 dead letters" in _text(driver, "#note")
    assert _consume(broker, "DoomedGroup", "Doomed", 1) == [b"second chance"]


def test_a_group_reset_through_the_console_rewinds_its_consumer(broker, console, driver):
    create_topic(broker, "Rewind", 1)
    for i in range(3):
        _send(broker, "Rewind", f"r{i}".encode(), f"rk{i}")
    assert sorted(_consume(broker, "RewindGroup", "Rewind", 3)) == [b"r0", b"r1", b"r2"]
    _open(driver, console.url + "/groups/RewindGroup")
    assert _text(driver, "#total-lag") == "0"
    # Without the confirmation the browser does not post the form, and the console refuses
    # a post without it all the same.
    status, body = post(console.url + "/groups/RewindGroup/reset",
                        {"topic": "Rewind", "to": "earliest"})
    assert status == 400 and "tick the confirmation" in body
    _open(driver, console.url + "/groups/RewindGroup")
    assert _text(driver, "#total-lag") == "0"
    _submit(driver, "reset-group", topic="Rewind", to="earliest", confirm="1")
    assert "reset to earliest: 0:0" in _text(driver, "#note")
    assert _text(driver, "#total-lag") == "3"
    assert sorted(_consume(broker, "RewindGroup", "Rewind", 3)) == [b"r0", b"r1", b"r2"]


def test_read_only_refuses_every_change_and_forms_need_the_csrf_token(broker, console, driver):
    from selenium.webdriver.common.by import By

    status, body = post(console.url + "/topics/create", {"topic": "NoToken"}, csrf=False)
    assert status == 403 and "CSRF" in body
    reader = start_console(broker.endpoint, "--read-only")
    try:
        _open(driver, reader.url + "/topics")
        assert _text(driver, "#read-only") == "read-only"
        assert driver.find_elements(By.ID, "create-topic") == []
        status, body = post(reader.url + "/topics/create", {"topic": "ReadOnlyTopic"})
        assert status == 403 and "--read-only" in body
    finally:
        assert reader.stop() == 0
    assert "ReadOnlyTopic" not in {t["topic"] for t in _cli_lines(broker, "topic", "list")}
    assert "NoToken" not in {t["topic"] for t in _cli_lines(broker, "topic", "list")}


def test_with_acl_on_wrong_credentials_are_refused(tmp_path, driver):
    acl = BrokerProcess(tmp_path / "store", conf_text=(
        "aclEnable=true\naclAccessKey=root\naclSecretKey=rootsecret\n")).start()
    wrong = right = None
    try:
        wrong = start_console(acl.endpoint, "--access-key", "root", "--secret-key", "nope")
        driver.get(wrong.url + "/topics")
        assert "UNAUTHENTICATED" in _text(driver, "#error") or "PERMISSION_DENIED" in _text(
            driver, "#error")
        problems(driver)
        right = start_console(acl.endpoint, "--access-key", "root", "--secret-key",
                              "rootsecret")
        _open(driver, right.url + "/")
        assert "DefaultCluster" in _text(driver, "#status")
    finally:
        for c in (wrong, right):
            if c is not None:
                c.stop()
        acl.terminate()


def test_console_listen_port_serves_the_console_inside_the_broker(tmp_path):
    from broker_proc import free_port

    port = free_port()
    b = BrokerProcess(tmp_path / "store", conf_text=f"consoleListenPort={port}\n").start()
    try:
        def up() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as page:
                    return b"Broker" in page.read()
            except OSError:
                return False

        wait_until(up, 30, "the console inside the broker")
    finally:
        assert b.terminate() == 0


def test_charts_sample_the_brokers_traffic_and_lag(broker):
    from stratamq.client.connection import BrokerEndpoint
    from stratamq.console.broker_api import ConsoleBroker
    from stratamq.console.charts import Sampler, svg_chart

    create_topic(broker, "Charted", 1)
    client = ConsoleBroker(BrokerEndpoint(broker.endpoint))
    try:
        client.send("Charted", b"first")
        assert _consume(broker, "ChartedGroup", "Charted", 1) == [b"first"]
        sampler = Sampler(client, interval_s=1)
        sampler.sample()
        for i in range(5):
            client.send("Charted", f"c{i}".encode())
        sampler.sample()
    finally:
        client.close()
    assert sampler.last_error is None
    charts = {title: points for title, _unit, points in sampler.series()}
    (_, rate_in), = charts["Messages in"]
    assert rate_in > 0
    assert charts["Bytes in"][0][1] > 0
    lag = charts["Consumer lag (all groups)"]
    assert lag[-1][1] - lag[0][1] == 5  # the five sent since ChartedGroup consumed
    rate_in, rate_out = sampler.topic_rates()["Charted"]  # the Topics page's columns
    assert rate_in > 0 and rate_out == 0
    assert "<polyline" in svg_chart(charts["Consumer lag (all groups)"], "messages")


def test_topics_list_the_bytes_they_hold(broker, console, driver):
    from selenium.webdriver.common.by import By

    create_topic(broker, "Sized", 2)
    with MessagingClient(broker.endpoint) as client:
        for i in range(20):
            client.send("Sized", bytes([65 + i % 26]) * 1000)
    [sized] = [t for t in _cli_lines(broker, "topic", "list") if t["topic"] == "Sized"]
    # Each record is its body plus RocketMQ's header and properties (a few hundred bytes).
    assert sized["messages"] == 20 and 20 * 1000 < sized["bytes"] < 20 * 1500
    _open(driver, console.url + "/topics?q=Sized")
    [cell] = driver.find_elements(By.CSS_SELECTOR, "#topics td.bytes")
    assert cell.text == f"{sized['bytes'] / 1024:.1f} KiB"


def test_a_tls_broker_is_reached_with_the_tls_options(tmp_path, driver):
    import subprocess
    import sys

    from broker_proc import self_signed_cert, start_broker
    from selenium.webdriver.common.by import By

    cert, key = self_signed_cert(tmp_path)
    tls = start_broker(tmp_path, {"tlsEnable": "true", "tls.server.certPath": str(cert),
                                  "tls.server.keyPath": str(key)}, topics=[("Tls", 1, "NORMAL")])
    plain = secure = None
    try:
        plain = start_console(tls.endpoint)
        driver.get(plain.url + "/topics")
        assert "no broker reachable" in _text(driver, "#error")
        problems(driver)  # the refusal's 502 is the point here
        secure = start_console(tls.endpoint, "--tls-ca-file", str(cert))
        _open(driver, secure.url + "/topics?q=Tls")
        assert [a.text for a in driver.find_elements(By.CSS_SELECTOR, "#topics a")] == ["Tls"]
        _open(driver, secure.url + "/messages")
        _submit(driver, "send", topic="Tls", body="sent over TLS")
        assert "sent to Tls" in _text(driver, "#note")
        _open(driver, secure.url + "/messages?topic=Tls&queue=0&offset=0")
        assert _text(driver, "pre.body-text") == "sent over TLS"
        # The admin commands take the same options.
        listed = subprocess.run([sys.executable, "-m", "stratamq.cli", "topic", "list",
                                 "--endpoint", tls.endpoint, "--tls-ca-file", str(cert)],
                                capture_output=True, text=True, timeout=60)
        assert listed.returncode == 0, listed.stderr
        assert "Tls" in {json.loads(line)["topic"] for line in listed.stdout.splitlines()}
    finally:
        for c in (plain, secure):
            if c is not None:
                c.stop()
        tls.stop()


def test_overview_shows_the_cluster_in_controller_mode(tmp_path, driver):
    from selenium.webdriver.common.by import By
    from test_cluster_failover import Member, _start

    from stratamq.benchmarks.etcd_members import EtcdCluster

    etcd = EtcdCluster(tmp_path, size=1)
    members = [Member(tmp_path, etcd.endpoints, i) for i in (1, 2)]
    c = None
    try:
        master, slave = _start(members)
        epoch = master.cluster()["epoch"]
        c = start_console(slave.endpoint)  # any broker of the cluster shows all of it
        _open(driver, c.url + "/", tmp_path, "cluster")
        rows = {r.get_attribute("data-broker"): r for r in
                driver.find_elements(By.CSS_SELECTOR, "#cluster tbody tr")}
        assert sorted(rows) == sorted(str(m.broker_id) for m in members)

        def cell(m: Member, css: str) -> str:
            return rows[str(m.broker_id)].find_element(By.CSS_SELECTOR, css).text

        assert (cell(master, "td.role"), cell(slave, "td.role")) == ("MASTER", "SLAVE")
        assert cell(master, "td.epoch") == cell(slave, "td.epoch") == str(epoch)
        assert cell(master, "td.lag") == "0" and cell(slave, "td.lag").isdigit()
    finally:
        if c is not None:
            c.stop()
        for m in members:
            if m.proc is not None and m.proc.poll() is None:
                m.terminate()
        etcd.stop()


def test_kept_alive_connections_send_without_nagle_delay(broker):
    """A browser fetches pages over one kept-alive connection; each response is two writes
    (headers, body), so without TCP_NODELAY the second waited for the browser's delayed ACK
    of the first (~40 ms a page)."""
    import http.client
    import socket

    from stratamq.client.connection import BrokerEndpoint
    from stratamq.console.server import ConsoleServer, ConsoleThread

    console = ConsoleThread(ConsoleServer(BrokerEndpoint(broker.endpoint), "127.0.0.1:0",
                                          sample_interval_s=3600)).start()
    conn = http.client.HTTPConnection(console.server.host, console.server.port, timeout=30)
    try:
        for _ in range(2):
            conn.request("GET", "/favicon.ico")
            reply = conn.getresponse()
            assert reply.status == 200 and reply.read()
        [served] = console.server.server.server_state.connections
        sock = served.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        conn.close()
        console.stop()
